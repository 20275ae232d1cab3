"""Distinct-count gold MERGE scaling: the same small batch into a gold with an exact distinct count, over a
short and a long history.

The gold is the first of the project's golds that declares an exact distinct count (``AggregateKind.DISTINCT``;
the orders dataset's ``by_shop`` in a bake with it), or, in a project without one, a gold of the bench's own on
the first dataset's contract. Its stream writes two tables: the gold and, behind the count, the table of the
values each window and key has held (``gold_<dataset>_<gold>_<column>_values``). Both are created by the
pipeline (``ensure_tables``, the pipeline's own layout) and filled directly with Spark in time order, as
``gold_scaling`` fills its gold: a window holds four keys (dimension values), each key
``Sizes.distinct_values_per_key`` values. Both histories end at the same window, so the batch (half of its
windows the last ones of the table, half new; in the windows already held, half of each key's values new) is
the same for both. The MERGE is the gold sink's own, ``add_to_windows`` with the batch's values
(``distinct_values``' shape) and the table of values' path (``values_paths``): it inserts the values the table
lacks, counts them per key, and merges the counts into gold.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from ..pipeline.config import duration_seconds
from ..pipeline.contract import WINDOW_END, WINDOW_START
from ..pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from ..pipeline.datasets import DATASETS
from ..pipeline.delta.tables import (
    FIRST_BATCH,
    FIRST_STREAM,
    VALUE,
    Lakehouse,
    distinct_values_schema,
    gold_schema,
)
from ..pipeline.gold import add_to_windows, values_paths, window_of
from .harness import Bench, build_table, last_commit, say

# The first window after every table's history: the batches start around it.
END = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
# Rows per file of the built tables, as gold_scaling builds its gold.
ROWS_PER_FILE = 250_000
# Keys (dimension values) per window of a gold with dimensions; a gold without any has one.
KEYS_PER_WINDOW = 4
# The bench's own gold, in a project that declares no exact distinct count.
BENCH_DATASET = "bench_distinct"


def distinct_gold() -> tuple[Dataset, Gold, Aggregate]:
    """The dataset, gold and exact distinct count measured: the first the project declares, or else one of the
    bench's own on the first dataset's contract (its dimensions, the count and the distinct values of its
    first required string field that is no dimension).

    Example::

        dataset, gold, aggregate = distinct_gold()  # orders, by_shop, customer_distinct in a bake with orders
    """
    for dataset in DATASETS:
        for gold in dataset.golds:
            for aggregate in gold.aggregates:
                if aggregate.kind is AggregateKind.DISTINCT:
                    return dataset, gold, aggregate
    contract = DATASETS[0].contract
    counted = [
        field.name
        for field in contract.fields
        if field.required and field.name not in contract.dimensions and field.spark_type.typeName() == "string"
    ]
    if not counted:
        raise RuntimeError("distinct scaling: the first dataset's contract has no required string field to count")
    aggregate = Aggregate(AggregateKind.DISTINCT, counted[-1])
    gold = Gold("distinct", (Aggregate(AggregateKind.COUNT), aggregate), dimensions=contract.dimensions)
    return Dataset(BENCH_DATASET, contract, (gold,)), gold, aggregate


def keys_per_window(gold: Gold) -> int:
    """The keys (dimension values) a window of ``gold`` holds in the built tables.

    Example::

        keys_per_window(distinct_gold()[1])  # 4
    """
    if not isinstance(gold, Gold):
        raise TypeError(f"gold must be a Gold, not {type(gold).__name__}")
    return KEYS_PER_WINDOW if gold.dimensions else 1


class DistinctHistory:
    """Rows of the measured gold and of its table of values, window ``n`` starting ``n`` windows after END.

    Example::

        history = DistinctHistory(bench, 4)
        paths = history.build(bench.work / "distinct-small", 1_000, 1)  # {"gold": ..., "values": ...}
    """

    def __init__(self, bench: Bench, values_per_key: int):
        from pyspark.sql import functions as F

        if values_per_key < 2:
            raise ValueError(f"DistinctHistory needs at least 2 values per key, got {values_per_key}")
        self.bench = bench
        self.dataset, self.gold, self.aggregate = distinct_gold()
        self.values_per_key = values_per_key
        self.keys = keys_per_window(self.gold)
        self.width = int(duration_seconds(window_of(self.gold, bench.base_config.gold_window), "gold window"))
        # Each approximate distinct count's sketch: one valid HyperLogLog sketch of the key's values.
        sketch = bench.spark.range(values_per_key).select(
            F.hll_sketch_agg(F.concat(F.lit("value-"), F.col("id").cast("string"))).alias("sketch")
        )
        self.sketch = bytearray(sketch.first()["sketch"])

    def _key_columns(self, window, key) -> dict:
        from pyspark.sql import functions as F

        columns = {
            WINDOW_START: (F.lit(END) + window * F.lit(self.width)).cast("timestamp"),
            WINDOW_END: (F.lit(END) + (window + 1) * F.lit(self.width)).cast("timestamp"),
        }
        for name in self.gold.dimensions:
            columns[name] = F.concat(F.lit(f"{name}-"), key.cast("string"))
        return columns

    def gold_rows(self, first_window: int, end_window: int, files: int):
        """Gold rows of windows first_window..end_window-1, one per key, in time order."""
        from pyspark.sql import functions as F

        if first_window >= end_window or files <= 0:
            raise ValueError(f"gold_rows needs first < end and files > 0, got {first_window}, {end_window}, {files}")
        window = F.floor(F.col("id") / F.lit(self.keys))  # floor and pmod: ids before END are negative
        columns = self._key_columns(window, F.pmod("id", F.lit(self.keys)))
        for aggregate in self.gold.aggregates:
            if aggregate.kind is AggregateKind.COUNT:
                columns[aggregate.column] = F.pmod("id", F.lit(97)) + self.values_per_key
            elif aggregate.kind in (AggregateKind.DISTINCT, AggregateKind.APPROX_DISTINCT):
                columns[aggregate.column] = F.lit(self.values_per_key)
                if aggregate.sketch_column is not None:
                    columns[aggregate.sketch_column] = F.lit(self.sketch)
            elif self.dataset.contract.field(aggregate.field).spark_type.typeName() == "timestamp":
                columns[aggregate.column] = columns[WINDOW_START]
            else:
                columns[aggregate.column] = F.pmod("id", F.lit(100_000)) / 100
        schema = gold_schema(self.dataset.contract, self.gold)
        frame = self.bench.spark.range(first_window * self.keys, end_window * self.keys, 1, files)
        return frame.select(*[columns[field.name].cast(field.dataType).alias(field.name) for field in schema.fields])

    def value_rows(self, first_window: int, end_window: int, files: int, shift: int = 0, history: bool = True):
        """Rows of the table of values for windows first_window..end_window-1: each key's values ``shift`` to
        ``shift + values_per_key - 1``; with ``history``, as a rebuild marks them (no stream, batch -1), else
        as ``distinct_values`` gives a batch's (key and value only)."""
        from pyspark.sql import functions as F

        if first_window >= end_window or files <= 0 or shift < 0:
            raise ValueError(
                f"value_rows needs first < end, files > 0 and shift >= 0, got {first_window}, {end_window}, "
                f"{files}, {shift}"
            )
        per_window = self.keys * self.values_per_key
        window = F.floor(F.col("id") / F.lit(per_window))
        key = F.pmod(F.floor(F.col("id") / F.lit(self.values_per_key)), F.lit(self.keys))
        columns = self._key_columns(window, key)
        value = F.pmod("id", F.lit(self.values_per_key)) + F.lit(shift)
        columns[VALUE] = F.concat(F.lit("value-"), value.cast("string"))
        columns[FIRST_STREAM] = F.lit(None).cast("string")
        columns[FIRST_BATCH] = F.lit(-1)
        schema = distinct_values_schema(self.dataset.contract, self.gold, self.aggregate.column)
        fields = schema.fields if history else schema.fields[: len(self.gold.key) + 1]
        frame = self.bench.spark.range(first_window * per_window, end_window * per_window, 1, files)
        return frame.select(*[columns[field.name].cast(field.dataType).alias(field.name) for field in fields])

    def build(self, root: Path, windows: int, commits: int) -> dict[str, str]:
        """The gold and its table of values with ``windows`` windows ending just before END, each written in
        ``commits`` appends in time order; their paths, "gold" and "values"."""
        if windows <= 0 or commits <= 0:
            raise ValueError(f"build needs positive windows and commits, got {windows}, {commits}")

        def files(first: int, end: int, rows_per_window: int) -> int:
            return max(1, math.ceil((end - first) * rows_per_window / ROWS_PER_FILE))

        def gold_between(first: int, end: int):
            return self.gold_rows(first, end, files(first, end, self.keys))

        def values_between(first: int, end: int):
            return self.value_rows(first, end, files(first, end, self.keys * self.values_per_key))

        gold_table = self.dataset.gold_table(self.gold)
        values_table = self.dataset.values_table(self.gold, self.aggregate)
        return {
            "gold": build_table(self.bench, root, gold_table, -windows, 0, commits, gold_between, self.dataset),
            "values": build_table(self.bench, root, values_table, -windows, 0, commits, values_between, self.dataset),
        }


def time_merge(
    history: DistinctHistory, root: Path, first_window: int, windows: int, shift: int, app_id: str, batch_id: int
) -> dict:
    """One gold-sink MERGE, with its exact distinct count, of the aggregates and values of ``windows`` windows
    from ``first_window`` into the tables under ``root``: time, and Delta's metrics of both commits."""
    if windows <= 0 or batch_id < 0 or not app_id:
        raise ValueError(
            f"time_merge needs windows > 0, batch_id >= 0 and an app id, got {windows}, {batch_id}, {app_id!r}"
        )
    paths = values_paths(Lakehouse(str(root)), history.dataset, history.gold)
    gold_path = Lakehouse(str(root)).table(history.dataset.gold_table(history.gold))
    aggregates = history.gold_rows(first_window, first_window + windows, 1).persist()
    values = history.value_rows(first_window, first_window + windows, 1, shift, history=False).persist()
    try:
        aggregates.count()  # materialised first: the timing is the MERGE's, not the batch's generation
        values.count()
        distinct = {column: (values, path) for column, path in paths.items()}
        started = time.perf_counter()
        add_to_windows(aggregates, gold_path, app_id, batch_id, history.dataset.contract, None, history.gold, distinct)
        seconds = time.perf_counter() - started
    finally:
        aggregates.unpersist()
        values.unpersist()
    [values_path] = paths.values()
    return {
        "seconds": seconds,
        "gold": last_commit(history.bench, gold_path),
        "values": last_commit(history.bench, values_path),
    }


def measure(bench: Bench) -> None:
    from delta.tables import DeltaTable

    sizes = bench.sizes
    history = DistinctHistory(bench, sizes.distinct_values_per_key)
    tables = {}
    for label, windows in (("small", sizes.gold_small_windows), ("big", sizes.gold_big_windows)):
        say(
            f"distinct scaling: building {history.dataset.gold_table(history.gold)} and its values, {windows:,} windows"
        )
        started = time.perf_counter()
        rows = windows * history.keys * history.values_per_key
        commits = max(1, min(sizes.gold_table_commits, math.ceil(rows / ROWS_PER_FILE)))
        root = bench.work / f"distinct-{label}"
        paths = history.build(root, windows, commits)
        tables[label] = {"root": root, "paths": paths, "windows": windows, "build_s": time.perf_counter() - started}
    # As gold_scaling: the last half of each batch's windows are new, the first half held already (the
    # previous batch's new ones, or the history's last ones), and of those each key's values half new.
    batch = sizes.gold_batch_windows
    new = batch - batch // 2
    step = history.values_per_key // 2
    runs: dict[str, list[dict]] = {"small": [], "big": []}
    for repeat in range(sizes.merge_repeats):
        first = repeat * new - batch // 2
        for label in ("small", "big"):  # interleaved, so drift on a shared machine hits both alike
            say(
                f"distinct scaling: MERGE {batch} windows into the {tables[label]['windows']:,}-window tables "
                f"({repeat + 1}/{sizes.merge_repeats})"
            )
            runs[label].append(
                time_merge(
                    history, tables[label]["root"], first, batch, (repeat + 1) * step, f"bench-distinct-{label}", repeat
                )
            )
    small = statistics.median(run["seconds"] for run in runs["small"])
    big = statistics.median(run["seconds"] for run in runs["big"])
    name = f"distinct-count gold MERGE of {batch} windows into"
    bench.add("distinct_merge_small_s", f"{name} {sizes.gold_small_windows:,} windows", small, "s")
    bench.add("distinct_merge_big_s", f"{name} {sizes.gold_big_windows:,} windows", big, "s")
    bench.add(
        "distinct_merge_scaling", "distinct-count gold: big-table MERGE / small-table MERGE", big / small, "ratio"
    )
    described = {}
    for label, table in tables.items():
        described[label] = {"windows": table["windows"], "build_s": table["build_s"]}
        for kind, path in table["paths"].items():
            detail = DeltaTable.forPath(bench.spark, path).detail().first()
            per_window = history.keys * (history.values_per_key if kind == "values" else 1)
            described[label][kind] = {
                "files": detail["numFiles"],
                "bytes": detail["sizeInBytes"],
                "rows": table["windows"] * per_window,
            }
    bench.details["distinct_scaling"] = {
        "dataset": history.dataset.name,
        "gold": history.gold.name,
        "aggregate": history.aggregate.column,
        "window": window_of(history.gold, bench.base_config.gold_window),
        "keys_per_window": history.keys,
        "values_per_key": history.values_per_key,
        "batch_windows": batch,
        "batch_rows": batch * history.keys,
        "tables": described,
        "merges": runs,
    }
