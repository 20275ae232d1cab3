"""Silver dedup scaling: one silver MERGE batch into a small and into a big silver table.

The tables are written directly (no Kafka, no streams) in the layout the silver stream leaves:
one file per batch, offsets increasing. The MERGE is the silver sink's own.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from ..devtools.sample import EVENT_TYPES
from ..pipeline.sinks import insert_new_kafka_records, kafka_key_ranges
from ..pipeline.tables import AMOUNT_TYPE, SILVER, SILVER_SCHEMA, Lakehouse, ensure_tables
from .harness import Bench, say
from .report import Target


def silver_rows(bench: Bench, topic: str, first: int, end: int, files: int):
    """Silver rows for Kafka records first..end-1: id -> (partition id % P, offset id div P), so a
    contiguous id range (one file) holds a contiguous offset range in every partition, like a batch."""
    from pyspark.sql import functions as F

    if not 0 <= first < end or files <= 0:
        raise ValueError(f"silver_rows needs 0 <= first < end and files > 0, got {first}, {end}, {files}")
    partitions = bench.sizes.partitions
    base = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    event_time = (F.lit(base) + F.col("id") / F.lit(100.0)).cast("timestamp")
    columns = {
        "event_id": F.format_string("bench-%012d", F.col("id")),
        "event_time": event_time,
        "user_id": F.format_string("user-%03d", F.col("id") % 50),
        "event_type": F.element_at(
            F.array(*[F.lit(t) for t in EVENT_TYPES]), (F.col("id") % len(EVENT_TYPES) + 1).cast("int")
        ),
        "amount": ((F.col("id") % 100_000) / 100).cast(AMOUNT_TYPE),
        "topic": F.lit(topic),
        "partition": (F.col("id") % partitions).cast("int"),
        "offset": F.expr(f"id div {partitions}").cast("long"),
        "kafka_timestamp": event_time,
        "ingest_time": event_time,
    }
    frame = bench.spark.range(first, end, 1, files)
    return frame.select(*[columns[field.name].alias(field.name) for field in SILVER_SCHEMA.fields])


def build_silver(bench: Bench, root: Path, topic: str, rows: int, commits: int) -> str:
    """A silver table of ``rows`` rows written in ``commits`` appends; returns its path."""
    if rows <= 0 or commits <= 0:
        raise ValueError(f"build_silver needs positive rows and commits, got {rows}, {commits}")
    lakehouse = Lakehouse(str(root))
    ensure_tables(bench.spark, lakehouse)
    path = lakehouse.table(SILVER)
    per_commit = math.ceil(rows / commits)
    for first in range(0, rows, per_commit):
        end = min(rows, first + per_commit)
        files = math.ceil((end - first) / bench.sizes.silver_batch)
        silver_rows(bench, topic, first, end, files).write.format("delta").mode("append").save(path)
    return path


def time_merge(bench: Bench, path: str, topic: str, first: int, rows: int, app_id: str, batch_id: int) -> dict:
    """One silver-sink MERGE of ``rows`` new records starting at id ``first``: its time and Delta's metrics."""
    from delta.tables import DeltaTable

    if rows <= 0 or first < 0 or batch_id < 0 or not app_id:
        raise ValueError(
            f"time_merge needs rows > 0, first >= 0, batch_id >= 0 and an app id, "
            f"got {rows}, {first}, {batch_id}, {app_id!r}"
        )
    batch = silver_rows(bench, topic, first, first + rows, 1).persist()
    try:
        batch.count()  # materialised first: the timing is the MERGE's, not the batch's generation
        ranges = kafka_key_ranges(batch)
        files = _files_in_ranges(bench, path, ranges)
        started = time.perf_counter()
        insert_new_kafka_records(batch, path, ranges, app_id, batch_id)
        seconds = time.perf_counter() - started
    finally:
        batch.unpersist()
    history = DeltaTable.forPath(bench.spark, path).history(1).first()
    metrics = {key: int(value) for key, value in (history["operationMetrics"] or {}).items() if value.isdigit()}
    return {"seconds": seconds, "operation": history["operation"], "operation_metrics": metrics, **files}


def _files_in_ranges(bench: Bench, path: str, ranges) -> dict[str, int]:
    """Target files before the MERGE, and those whose offset statistics overlap the batch's ranges:
    the files data skipping must keep. (Delta 4.0's history does not report its own skipping counts.)"""
    from pyspark.sql import functions as F

    stats = (
        bench.spark.read.json(f"{path}/_delta_log/*.json")
        .where(F.col("add").isNotNull())
        .select(
            *[
                F.get_json_object("add.stats", f"$.{bound}.{column}").cast("long").alias(f"{bound}_{column}")
                for bound in ("minValues", "maxValues")
                for column in ("partition", "offset")
            ]
        )
    )
    overlap = F.lit(False)
    for r in ranges:
        overlap = overlap | (
            (F.col("minValues_partition") <= r.partition)
            & (F.col("maxValues_partition") >= r.partition)
            & (F.col("minValues_offset") <= r.last_offset)
            & (F.col("maxValues_offset") >= r.first_offset)
        )
    counts = stats.agg(F.count(F.lit(1)).alias("files"), F.sum(overlap.cast("int")).alias("kept")).first()
    return {"target_files": counts.files, "target_files_overlapping_batch": counts.kept or 0}


def measure(bench: Bench, topic: str) -> None:
    from delta.tables import DeltaTable

    sizes = bench.sizes
    tables = {}
    for label, rows in (("small", sizes.silver_small_table), ("big", sizes.silver_big_table)):
        say(f"silver scaling: building a {rows:,}-row silver table")
        started = time.perf_counter()
        commits = max(1, min(sizes.silver_table_commits, math.ceil(rows / sizes.silver_batch)))
        path = build_silver(bench, bench.work / f"silver-{label}", topic, rows, commits)
        tables[label] = {"path": path, "rows": rows, "next": rows, "build_s": time.perf_counter() - started}
    runs: dict[str, list[dict]] = {"small": [], "big": []}
    for repeat in range(sizes.merge_repeats):
        for label in ("small", "big"):  # interleaved, so drift on a shared machine hits both alike
            table = tables[label]
            step = f"{repeat + 1}/{sizes.merge_repeats}"
            say(f"silver scaling: MERGE {sizes.silver_batch:,} rows into the {label} table ({step})")
            run = time_merge(bench, table["path"], topic, table["next"], sizes.silver_batch, f"bench-{label}", repeat)
            table["next"] += sizes.silver_batch
            runs[label].append(run)
    small = statistics.median(run["seconds"] for run in runs["small"])
    big = statistics.median(run["seconds"] for run in runs["big"])
    batch = f"silver MERGE {sizes.silver_batch:,} rows into"
    bench.add("silver_merge_small_s", f"{batch} {sizes.silver_small_table:,}", small, "s")
    bench.add("silver_merge_big_s", f"{batch} {sizes.silver_big_table:,}", big, "s")
    bench.add("silver_merge_scaling", "big-table MERGE / small-table MERGE", big / small, "ratio", Target("<=", 1.5))
    for table in tables.values():
        detail = DeltaTable.forPath(bench.spark, table["path"]).detail().first()
        table["files"] = detail["numFiles"]
        table["bytes"] = detail["sizeInBytes"]
    bench.details["silver_scaling"] = {
        "batch_rows": sizes.silver_batch,
        "tables": {label: {k: v for k, v in table.items() if k != "path"} for label, table in tables.items()},
        "merges": runs,
    }
