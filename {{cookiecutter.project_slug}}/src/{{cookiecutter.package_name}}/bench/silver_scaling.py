"""Silver dedup scaling: silver's batches into a small and into a big silver table, in two layouts.

The tables are created by the pipeline (``ensure_tables``, so silver has the pipeline's own layout)
and filled directly (no Kafka, no streams) in appends of whole batches, one file per batch (per
table partition, when the layout partitions silver), offsets increasing. Each batch goes through
the silver sink's own ``insert_new_kafka_records``, both of its ways: a batch of new records (the
steady state: the table holds none of its offset ranges, so it is appended), then a batch that
also carries one record the table holds (a replay's or a rebuild's overlap: a MERGE inserts the
rest).

* even: one topic, records spread evenly over its partitions, every partition's offsets from 0;
* skewed: two topics; partition 0 of each holds offsets far beyond partition 1's (a long-lived
  partition whose early records have expired), records arrive unevenly, and the first topic gets
  a third partition halfway through the history. Every batch spans both topics.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

from ..devtools.sample import EVENT_TYPES
from ..pipeline.delta.tables import AMOUNT_TYPE, SILVER, SILVER_SCHEMA
from ..pipeline.silver import insert_new_kafka_records, kafka_key_ranges
from .harness import Bench, build_table, last_commit, say

KEYS = ("topic", "partition", "offset")
# The rows are made, not read from Kafka: one made-up topic id for every topic.
BENCH_TOPIC_ID = "bench-topic-id"

SKEWED_TOPICS = ("bench-skew-a", "bench-skew-b")
# (topic, partition, first offset) of every partition of the skewed layout.
SKEWED_PARTITIONS = (
    (0, 0, 5_000_000_000),
    (0, 1, 0),
    (0, 2, 0),  # added halfway through the history
    (1, 0, 3_000_000_000),
    (1, 1, 0),
)
# Which of SKEWED_PARTITIONS each tenth of a batch goes to, before and after the third partition exists.
SKEWED_SLOTS = ((0, 0, 0, 0, 1, 3, 3, 3, 3, 4), (0, 0, 0, 1, 2, 2, 3, 3, 3, 4))
# The silver sink's two ways, each measured: appends of new records, MERGEs of a batch overlapping the table.
WAYS = ("appends", "merges")


def _silver_columns(topic, partition, offset) -> dict:
    """Silver's columns for Kafka record number ``id``, at ``topic``, ``partition`` and ``offset``."""
    from pyspark.sql import functions as F

    base = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    event_time = (F.lit(base) + F.col("id") / F.lit(100.0)).cast("timestamp")
    return {
        "event_id": F.format_string("bench-%012d", F.col("id")),
        "event_time": event_time,
        "user_id": F.format_string("user-%03d", F.col("id") % 50),
        "event_type": F.element_at(
            F.array(*[F.lit(t) for t in EVENT_TYPES]), (F.col("id") % len(EVENT_TYPES) + 1).cast("int")
        ),
        "amount": ((F.col("id") % 100_000) / 100).cast(AMOUNT_TYPE),
        "topic": topic,
        "topic_id": F.lit(BENCH_TOPIC_ID),
        "partition": partition.cast("int"),
        "offset": offset.cast("long"),
        "kafka_timestamp": event_time,
        "ingest_time": event_time,
    }


def silver_rows(bench: Bench, topic: str, first: int, end: int, files: int):
    """Silver rows for Kafka records first..end-1: id -> (partition id % P, offset id div P), so a
    contiguous id range (one file) holds a contiguous offset range in every partition, like a batch."""
    from pyspark.sql import functions as F

    if not 0 <= first < end or files <= 0:
        raise ValueError(f"silver_rows needs 0 <= first < end and files > 0, got {first}, {end}, {files}")
    partitions = bench.sizes.partitions
    columns = _silver_columns(F.lit(topic), F.col("id") % partitions, F.expr(f"id div {partitions}"))
    frame = bench.spark.range(first, end, 1, files)
    return frame.select(*[columns[field.name].alias(field.name) for field in SILVER_SCHEMA.fields])


def build_silver(bench: Bench, root: Path, topic: str, rows: int, commits: int) -> str:
    """A silver table of ``rows`` rows written in ``commits`` appends; returns its path."""
    if rows <= 0 or commits <= 0:
        raise ValueError(f"build_silver needs positive rows and commits, got {rows}, {commits}")

    def rows_between(first: int, end: int):
        return silver_rows(bench, topic, first, end, math.ceil((end - first) / bench.sizes.silver_batch))

    return build_table(bench, root, SILVER, 0, rows, commits, rows_between)


def skewed_rows(bench: Bench, first_batch: int, end_batch: int, added: int, batch_rows: int):
    """Silver rows of batches first_batch..end_batch-1 of the skewed layout, one file per batch;
    the third partition of the first topic exists from batch ``added`` on."""
    from pyspark.sql import functions as F

    if not 0 <= first_batch < end_batch or added < 0 or batch_rows < 10 or batch_rows % 10:
        raise ValueError(
            f"skewed_rows needs 0 <= first < end batch, added >= 0 and batch_rows a multiple of 10, "
            f"got {first_batch}, {end_batch}, {added}, {batch_rows}"
        )

    def lookup(values, index):
        return F.element_at(F.array(*[F.lit(v) for v in values]), (index + 1).cast("int"))

    tenth = batch_rows // 10
    batch = F.expr(f"id div {batch_rows}")
    slot = F.col("id") % 10
    group = F.expr(f"(id % {batch_rows}) div 10")  # which tenth-row of the batch: each slot once per group
    after = batch >= F.lit(added)
    eras = [list(slots) for slots in SKEWED_SLOTS]
    partition_of = F.when(after, lookup(eras[1], slot)).otherwise(lookup(eras[0], slot))
    # Rank of the slot among its partition's slots, and how many slots the partition has, in each era.
    ranks = [[era[:position].count(era[position]) for position in range(10)] for era in eras]
    counts = [[era.count(index) for index in range(len(SKEWED_PARTITIONS))] for era in eras]
    rank = F.when(after, lookup(ranks[1], slot)).otherwise(lookup(ranks[0], slot))
    in_batch = F.when(after, lookup(counts[1], partition_of)).otherwise(lookup(counts[0], partition_of))
    before = F.least(batch, F.lit(added)) * lookup(counts[0], partition_of) + F.greatest(
        batch - F.lit(added), F.lit(0)
    ) * lookup(counts[1], partition_of)
    offset = lookup([p[2] for p in SKEWED_PARTITIONS], partition_of) + (before * tenth) + group * in_batch + rank
    topic = lookup([SKEWED_TOPICS[p[0]] for p in SKEWED_PARTITIONS], partition_of)
    columns = _silver_columns(topic, lookup([p[1] for p in SKEWED_PARTITIONS], partition_of), offset)
    frame = bench.spark.range(first_batch * batch_rows, end_batch * batch_rows, 1, end_batch - first_batch)
    return frame.select(*[columns[field.name].alias(field.name) for field in SILVER_SCHEMA.fields])


def build_skewed_silver(bench: Bench, root: Path, batches: int, batch_rows: int, commits: int) -> str:
    """A silver table of ``batches`` batches of the skewed layout in ``commits`` appends; returns its path."""
    if batches <= 0 or commits <= 0:
        raise ValueError(f"build_skewed_silver needs positive batches and commits, got {batches}, {commits}")

    def rows_between(first: int, end: int):
        return skewed_rows(bench, first, end, batches // 2, batch_rows)

    return build_table(bench, root, SILVER, 0, batches, commits, rows_between)


def time_insert(
    bench: Bench, path: str, topic: str, first: int, rows: int, app_id: str, batch_id: int, held: int = 0
) -> dict:
    """One silver-sink insert of ``rows`` new records from id ``first`` on, with the ``held`` records
    before them (already in the table, when the table ends at ``first``): its time and Delta's metrics."""
    if rows <= 0 or not 0 <= held <= first:
        raise ValueError(f"time_insert needs rows > 0 and 0 <= held <= first, got {rows}, {held}, {first}")
    return time_insert_of(bench, path, silver_rows(bench, topic, first - held, first + rows, 1), app_id, batch_id)


def time_insert_of(bench: Bench, path: str, batch, app_id: str, batch_id: int) -> dict:
    """One silver-sink insert of the silver rows ``batch``: its time and Delta's metrics."""

    if batch_id < 0 or not app_id:
        raise ValueError(f"time_insert needs batch_id >= 0 and an app id, got {batch_id}, {app_id!r}")
    batch = batch.persist()
    try:
        batch.count()  # materialised first: the timing is the sink's, not the batch's generation
        ranges = kafka_key_ranges(batch)
        files = _files_in_ranges(bench, path, ranges)
        started = time.perf_counter()
        insert_new_kafka_records(batch, path, ranges, app_id, batch_id)
        seconds = time.perf_counter() - started
    finally:
        batch.unpersist()
    return {
        "seconds": seconds,
        **last_commit(bench, path),
        "batch_partitions": len(ranges),
        **files,
    }


def _files_in_ranges(bench: Bench, path: str, ranges) -> dict[str, int]:
    """Target files before the MERGE, and those whose (topic, partition, offset) bounds overlap the
    batch's ranges: the files data skipping must keep. A column the table is partitioned by has its
    value in the file's partition values, the others their bounds in its statistics. (Delta's history
    does not report its own skipping counts.)"""
    from pyspark.sql import functions as F

    log = bench.spark.read.text(f"{path}/_delta_log/*.json")
    stats = F.get_json_object("value", "$.add.stats")

    def bound(kind: str, column: str):
        value = F.coalesce(
            F.get_json_object("value", f"$.add.partitionValues.{column}"),
            F.get_json_object(stats, f"$.{kind}.{column}"),
        )
        return value if column == "topic" else value.cast("long")

    files = log.where(F.get_json_object("value", "$.add.path").isNotNull()).select(
        *[bound(kind, column).alias(f"{kind}_{column}") for kind in ("minValues", "maxValues") for column in KEYS]
    )
    overlap = F.lit(False)
    for r in ranges:
        overlap = overlap | (
            (F.col("minValues_topic") <= r.topic)
            & (F.col("maxValues_topic") >= r.topic)
            & (F.col("minValues_partition") <= r.partition)
            & (F.col("maxValues_partition") >= r.partition)
            & (F.col("minValues_offset") <= r.last_offset)
            & (F.col("maxValues_offset") >= r.first_offset)
        )
    # A file without statistics cannot be skipped.
    kept = F.coalesce(overlap, F.lit(True))
    counts = files.agg(F.count(F.lit(1)).alias("files"), F.sum(kept.cast("int")).alias("kept")).first()
    return {"target_files": counts.files, "target_files_overlapping_batch": counts.kept or 0}


def skewed_batch_rows(bench: Bench) -> int:
    """The skewed layout's batch size: the silver batch, to a multiple of 10."""
    return max(10, bench.sizes.silver_batch // 10 * 10)


def measure(bench: Bench, topic: str) -> None:
    sizes = bench.sizes
    batch_rows = skewed_batch_rows(bench)
    tables: dict[str, dict[str, dict]] = {"even": {}, "skewed": {}}
    for label, rows in (("small", sizes.silver_small_table), ("big", sizes.silver_big_table)):
        batches = math.ceil(rows / sizes.silver_batch)
        commits = max(1, min(sizes.silver_table_commits, batches))
        say(f"silver scaling: building a {rows:,}-row silver table")
        started = time.perf_counter()
        path = build_silver(bench, bench.work / f"silver-{label}", topic, rows, commits)
        tables["even"][label] = {"path": path, "rows": rows, "next": rows, "build_s": time.perf_counter() - started}
        batches = math.ceil(rows / batch_rows)
        say(f"silver scaling: building a {batches * batch_rows:,}-row silver table, skewed partitions, two topics")
        started = time.perf_counter()
        path = build_skewed_silver(bench, bench.work / f"silver-skewed-{label}", batches, batch_rows, commits)
        tables["skewed"][label] = {
            "path": path,
            "rows": batches * batch_rows,
            "next_batch": batches,
            "partition_added_at_batch": batches // 2,
            "build_s": time.perf_counter() - started,
        }
    # layout -> way (appends, merges) -> table size -> runs
    runs = {layout: {way: {"small": [], "big": []} for way in WAYS} for layout in tables}
    for repeat in range(sizes.merge_repeats):
        step = f"{repeat + 1}/{sizes.merge_repeats}"
        for label in ("small", "big"):  # interleaved, so drift on a shared machine hits both alike
            table, app_id = tables["even"][label], f"bench-{label}"
            path, rows = table["path"], sizes.silver_batch
            say(f"silver scaling: {rows:,} new rows into the {label} table, then with one held ({step})")
            append = time_insert(bench, path, topic, table["next"], rows, app_id, 2 * repeat)
            runs["even"]["appends"][label].append(append)
            table["next"] += rows
            merge = time_insert(bench, path, topic, table["next"], rows, app_id, 2 * repeat + 1, held=1)
            runs["even"]["merges"][label].append(merge)
            table["next"] += rows
        for label in ("small", "big"):
            table, app_id = tables["skewed"][label], f"bench-skewed-{label}"
            say(f"silver scaling: {batch_rows:,} new rows, two topics, into the skewed {label} table ({step})")
            first, added = table["next_batch"], table["partition_added_at_batch"]
            new = skewed_rows(bench, first, first + 1, added, batch_rows)
            runs["skewed"]["appends"][label].append(time_insert_of(bench, table["path"], new, app_id, 2 * repeat))
            held = new.limit(1)
            new = skewed_rows(bench, first + 1, first + 2, added, batch_rows)
            batch = new.unionByName(held)
            runs["skewed"]["merges"][label].append(time_insert_of(bench, table["path"], batch, app_id, 2 * repeat + 1))
            table["next_batch"] += 2
    medians = {
        layout: {
            way: {label: statistics.median(run["seconds"] for run in by_label[label]) for label in by_label}
            for way, by_label in by_way.items()
        }
        for layout, by_way in runs.items()
    }
    even, skewed = medians["even"], medians["skewed"]
    new = f"silver append of {sizes.silver_batch:,} new rows into"
    bench.add("silver_append_small_s", f"{new} {sizes.silver_small_table:,}", even["appends"]["small"], "s")
    bench.add("silver_append_big_s", f"{new} {sizes.silver_big_table:,}", even["appends"]["big"], "s")
    bench.add(
        "silver_append_scaling",
        "big-table append / small-table append",
        even["appends"]["big"] / even["appends"]["small"],
        "ratio",
    )
    batch = f"silver MERGE of {sizes.silver_batch:,} new rows and one held into"
    bench.add("silver_merge_small_s", f"{batch} {sizes.silver_small_table:,}", even["merges"]["small"], "s")
    bench.add("silver_merge_big_s", f"{batch} {sizes.silver_big_table:,}", even["merges"]["big"], "s")
    bench.add(
        "silver_merge_scaling",
        "big-table MERGE / small-table MERGE",
        even["merges"]["big"] / even["merges"]["small"],
        "ratio",
    )
    bench.add(
        "silver_append_vs_merge",
        "append / MERGE of a batch, into the big table",
        even["appends"]["big"] / even["merges"]["big"],
        "ratio",
    )
    skewed_tables = tables["skewed"]
    batch = f"skewed, 2 topics: MERGE of {batch_rows:,} new rows and one held into"
    for label in ("small", "big"):
        rows = skewed_tables[label]["rows"]
        bench.add(f"silver_skewed_merge_{label}_s", f"{batch} {rows:,}", skewed["merges"][label], "s")
    bench.add(
        "silver_skewed_merge_scaling",
        "skewed, 2 topics: big-table / small-table MERGE",
        skewed["merges"]["big"] / skewed["merges"]["small"],
        "ratio",
    )
    bench.add(
        "silver_skewed_append_scaling",
        "skewed, 2 topics: big-table / small-table append",
        skewed["appends"]["big"] / skewed["appends"]["small"],
        "ratio",
    )
    _describe(bench, tables)
    bench.details["silver_scaling"] = {
        "batch_rows": sizes.silver_batch,
        "tables": {label: _public(table) for label, table in tables["even"].items()},
        **runs["even"],
    }
    bench.details["silver_scaling_skewed"] = {
        "batch_rows": batch_rows,
        "topics": list(SKEWED_TOPICS),
        "partitions": [{"topic": SKEWED_TOPICS[t], "partition": p, "first_offset": o} for t, p, o in SKEWED_PARTITIONS],
        "tables": {label: _public(table) for label, table in skewed_tables.items()},
        **runs["skewed"],
    }


def _describe(bench: Bench, tables: dict[str, dict[str, dict]]) -> None:
    from delta.tables import DeltaTable

    for by_label in tables.values():
        for table in by_label.values():
            detail = DeltaTable.forPath(bench.spark, table["path"]).detail().first()
            table["files"] = detail["numFiles"]
            table["bytes"] = detail["sizeInBytes"]
            table["partition_columns"] = list(detail["partitionColumns"])


def _public(table: dict) -> dict:
    return {key: value for key, value in table.items() if key != "path"}
