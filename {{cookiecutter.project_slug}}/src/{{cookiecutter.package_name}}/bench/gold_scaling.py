"""Gold MERGE scaling: the same small batch of aggregates into a gold table with a short and a long history.

The tables are created by the pipeline (``ensure_tables``, so gold has the pipeline's own layout) and
filled directly with Spark, in time order: each append covers a contiguous range of windows and each
file a contiguous part of it, the way a gold table that has grown window after window is clustered.
A window holds one row per event type. Both tables end at the same window, so the batch (half of its
windows the last ones of the table, half new) is the same for both. The MERGE is the gold sink's own,
``add_to_windows``, called through its public signature.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from ..devtools.sample import EVENT_TYPES
from ..pipeline.config import duration_seconds
from ..pipeline.contract import EVENT_COUNT, WINDOW_END, WINDOW_START
from ..pipeline.datasets.events import EVENTS
from ..pipeline.delta.tables import GOLD, gold_schema
from ..pipeline.gold import add_to_windows
from .harness import Bench, build_table, last_commit, say

# The first window after every table's history: the batches start around it.
END = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
# Rows per file of the built tables, about what compaction leaves of a gold history.
ROWS_PER_FILE = 250_000


def window_seconds(bench: Bench) -> int:
    return int(duration_seconds(bench.base_config.gold_window, "pipeline.gold_window"))


def gold_rows(bench: Bench, first_window: int, end_window: int, files: int):
    """Gold rows of windows first_window..end_window-1 (window n starts n windows after END), one per
    event type, in time order: a contiguous id range (one file) holds a contiguous range of windows."""
    from pyspark.sql import functions as F

    if first_window >= end_window or files <= 0:
        raise ValueError(f"gold_rows needs first < end and files > 0, got {first_window}, {end_window}, {files}")
    width = window_seconds(bench)
    types = len(EVENT_TYPES)
    window = F.floor(F.col("id") / F.lit(types))  # floor and pmod: ids before END are negative
    schema = gold_schema(EVENTS)
    columns = {
        WINDOW_START: (F.lit(END) + window * F.lit(width)).cast("timestamp"),
        WINDOW_END: (F.lit(END) + (window + 1) * F.lit(width)).cast("timestamp"),
        "event_type": F.element_at(
            F.array(*[F.lit(t) for t in EVENT_TYPES]), (F.pmod("id", F.lit(types)) + 1).cast("int")
        ),
        EVENT_COUNT: F.pmod("id", F.lit(97)) + 1,
        EVENTS.measure_column("amount"): F.pmod("id", F.lit(100_000)) / 100,
    }
    missing = [field.name for field in schema.fields if field.name not in columns]
    if missing:
        raise RuntimeError(f"gold scaling builds the default contract's gold table; no values for {missing}")
    frame = bench.spark.range(first_window * types, end_window * types, 1, files)
    return frame.select(*[columns[field.name].cast(field.dataType).alias(field.name) for field in schema.fields])


def build_gold(bench: Bench, root: Path, windows: int, commits: int) -> str:
    """A gold table of ``windows`` windows ending just before END, written in ``commits`` appends in time order."""
    if windows <= 0 or commits <= 0:
        raise ValueError(f"build_gold needs positive windows and commits, got {windows}, {commits}")

    def rows_between(first: int, end: int):
        return gold_rows(bench, first, end, max(1, math.ceil((end - first) * len(EVENT_TYPES) / ROWS_PER_FILE)))

    return build_table(bench, root, GOLD, -windows, 0, commits, rows_between)


def time_merge(bench: Bench, path: str, first_window: int, windows: int, app_id: str, batch_id: int) -> dict:
    """One gold-sink MERGE of the aggregates of ``windows`` windows from ``first_window``: time and Delta's metrics."""

    if windows <= 0 or batch_id < 0 or not app_id:
        raise ValueError(
            f"time_merge needs windows > 0, batch_id >= 0 and an app id, got {windows}, {batch_id}, {app_id!r}"
        )
    batch = gold_rows(bench, first_window, first_window + windows, 1).persist()
    try:
        batch.count()  # materialised first: the timing is the MERGE's, not the batch's generation
        started = time.perf_counter()
        add_to_windows(batch, path, app_id, batch_id, EVENTS)
        seconds = time.perf_counter() - started
    finally:
        batch.unpersist()
    return {"seconds": seconds, **last_commit(bench, path)}


def measure(bench: Bench) -> None:
    from delta.tables import DeltaTable

    sizes = bench.sizes
    tables = {}
    for label, windows in (("small", sizes.gold_small_windows), ("big", sizes.gold_big_windows)):
        say(f"gold scaling: building a gold table of {windows:,} windows")
        started = time.perf_counter()
        commits = max(1, min(sizes.gold_table_commits, math.ceil(windows * len(EVENT_TYPES) / ROWS_PER_FILE)))
        path = build_gold(bench, bench.work / f"gold-{label}", windows, commits)
        tables[label] = {"path": path, "windows": windows, "build_s": time.perf_counter() - started}
    # Each batch: the last half of its windows are new, the first half already in the table
    # (the previous batch's new ones, or the history's last ones); the next batch moves on.
    batch = sizes.gold_batch_windows
    new = batch - batch // 2
    runs: dict[str, list[dict]] = {"small": [], "big": []}
    for repeat in range(sizes.merge_repeats):
        first = repeat * new - batch // 2
        for label in ("small", "big"):  # interleaved, so drift on a shared machine hits both alike
            step = f"{repeat + 1}/{sizes.merge_repeats}"
            say(f"gold scaling: MERGE {batch} windows into the {tables[label]['windows']:,}-window table ({step})")
            runs[label].append(time_merge(bench, tables[label]["path"], first, batch, f"bench-gold-{label}", repeat))
    small = statistics.median(run["seconds"] for run in runs["small"])
    big = statistics.median(run["seconds"] for run in runs["big"])
    name = f"gold MERGE of {batch} windows into"
    bench.add("gold_merge_small_s", f"{name} {sizes.gold_small_windows:,} windows", small, "s")
    bench.add("gold_merge_big_s", f"{name} {sizes.gold_big_windows:,} windows", big, "s")
    bench.add("gold_merge_scaling", "gold: big-table MERGE / small-table MERGE", big / small, "ratio")
    for table in tables.values():
        detail = DeltaTable.forPath(bench.spark, table["path"]).detail().first()
        table["files"] = detail["numFiles"]
        table["bytes"] = detail["sizeInBytes"]
        table["rows"] = table["windows"] * len(EVENT_TYPES)
    bench.details["gold_scaling"] = {
        "batch_windows": batch,
        "batch_rows": batch * len(EVENT_TYPES),
        "window": bench.base_config.gold_window,
        "tables": {label: {k: v for k, v in table.items() if k != "path"} for label, table in tables.items()},
        "merges": runs,
    }
