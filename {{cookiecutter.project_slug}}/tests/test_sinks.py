"""The Delta sinks on real tables: what a MERGE reads, and what a concurrent compaction does to it."""

import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType

from {{ cookiecutter.package_name }}.pipeline.delta import writes
from {{ cookiecutter.package_name }}.pipeline.delta.tables import (
    GOLD,
    GOLD_SCHEMA,
    QUARANTINE,
    QUARANTINE_SCHEMA,
    Lakehouse,
    ensure_tables,
)
from {{ cookiecutter.package_name }}.pipeline.fused import rows_new_to_silver
from {{ cookiecutter.package_name }}.pipeline.gold import add_to_windows, window_ranges
from {{ cookiecutter.package_name }}.pipeline.silver import insert_new_kafka_records, kafka_key_ranges

T0 = datetime(2026, 1, 1, 12, 0)
MINUTE = timedelta(minutes=1)


def gold_row(minute: int, event_type: str, count: int) -> tuple:
    start = T0 + minute * MINUTE
    return (start, start + MINUTE, event_type, count, Decimal(count))


def quarantine_row(topic: str, partition: int, offset: int, topic_id: str = "id-1") -> tuple:
    return (topic, topic_id, partition, offset, T0, None, b"x", [], "not valid JSON", T0)


def data_files(table: str) -> list[Path]:
    return sorted(Path(table).rglob("*.parquet"))


def file_holding(spark, table: str, condition) -> Path:
    rows = spark.read.format("delta").load(table).where(condition).select(F.input_file_name().alias("name"))
    names = {row.name for row in rows.collect()}
    assert len(names) == 1, names
    return Path(names.pop().removeprefix("file:"))


@pytest.fixture
def lakehouse(spark, tmp_path) -> Lakehouse:
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    ensure_tables(spark, lakehouse)
    return lakehouse


def test_window_ranges_fold_adjacent_windows_and_keep_a_late_one_apart():
    windows = [T0 + m * MINUTE for m in (5, 3, 4, 4, 60)]
    assert window_ranges(windows, [start + MINUTE for start in windows]) == [
        (T0 + 3 * MINUTE, T0 + 5 * MINUTE),
        (T0 + 60 * MINUTE, T0 + 60 * MINUTE),
    ]


def test_window_ranges_join_the_closest_ranges_beyond_the_limit():
    windows = [T0 + m * MINUTE for m in (0, 2, 10, 11, 30, 31, 33)]
    assert window_ranges(windows, [start + MINUTE for start in windows], max_ranges=2) == [
        (T0, T0 + 11 * MINUTE),
        (T0 + 30 * MINUTE, T0 + 33 * MINUTE),
    ]


def test_window_ranges_refuses_unpaired_starts_and_ends():
    with pytest.raises(ValueError, match="pair up"):
        window_ranges([T0], [])


def test_gold_merge_reads_only_the_files_of_the_windows_the_batch_touches(spark, lakehouse):
    gold = lakehouse.table(GOLD)
    # One file per hour of history, as a stream writes it: each MERGE adds its own files.
    for hour in range(4):
        rows = [gold_row(hour * 60 + m, "view", 1) for m in range(3)]
        spark.createDataFrame(rows, GOLD_SCHEMA).coalesce(1).write.format("delta").mode("append").save(gold)
    # Were any other hour's file read, the MERGE would fail on the missing file.
    for hour in (0, 1, 2):
        file_holding(spark, gold, F.col("window_start") == T0 + hour * 60 * MINUTE).unlink()

    batch = spark.createDataFrame([gold_row(180, "view", 2), gold_row(181, "click", 1)], GOLD_SCHEMA).cache()
    add_to_windows(batch, gold, "gold-stream", 0)

    result = {
        (row.window_start, row.event_type): row.event_count
        for row in spark.read.format("delta").load(gold).where(F.col("window_start") >= T0 + 180 * MINUTE).collect()
    }
    assert result == {
        (T0 + 180 * MINUTE, "view"): 3,
        (T0 + 181 * MINUTE, "view"): 1,
        (T0 + 181 * MINUTE, "click"): 1,
        (T0 + 182 * MINUTE, "view"): 1,
    }


def test_a_batch_of_new_windows_is_appended_and_one_touching_a_held_window_is_merged_once(spark, lakehouse):
    gold = lakehouse.table(GOLD)

    def add(rows: list[tuple], batch_id: int) -> None:
        add_to_windows(spark.createDataFrame(rows, GOLD_SCHEMA), gold, "gold-stream", batch_id)

    add([gold_row(0, "view", 1), gold_row(1, "view", 1)], 0)
    add([gold_row(0, "view", 1), gold_row(1, "view", 1)], 0)  # a replay: the tag makes it a no-op
    add([gold_row(5, "view", 4)], 1)  # no file holds minute 5: appended
    add([gold_row(1, "view", 2), gold_row(7, "click", 1)], 2)  # minute 1 held: merged
    add([gold_row(1, "view", 2), gold_row(7, "click", 1)], 2)  # a replayed MERGE: a no-op too

    history = DeltaTable.forPath(spark, gold).history().orderBy("version").collect()
    assert [row.operation for row in history][-3:] == ["WRITE", "WRITE", "MERGE"]
    assert history[-1].operationMetrics["numTargetRowsUpdated"] == "1"
    rows = spark.read.format("delta").load(gold).select("window_start", "event_type", "event_count").collect()
    assert sorted(tuple(row) for row in rows) == [
        (T0, "view", 1),
        (T0 + MINUTE, "view", 3),
        (T0 + 5 * MINUTE, "view", 4),
        (T0 + 7 * MINUTE, "click", 1),
    ]


def test_a_window_in_the_hour_the_drivers_clock_repeats_is_added_to_not_inserted_twice(spark, lakehouse, monkeypatch):
    # On 2026-10-25 a Paris clock shows 02:30 twice: at 00:30 and at 01:30 UTC. The window's start
    # must reach the MERGE's condition as the instant it is, whatever the driver's time zone.
    gold = lakehouse.table(GOLD)
    start = datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    row = (start, start + MINUTE, "view", 1, Decimal(1))
    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        for batch_id in (0, 1):
            add_to_windows(spark.createDataFrame([row], GOLD_SCHEMA), gold, "gold-stream", batch_id)
        written = spark.read.format("delta").load(gold).select(F.unix_micros("window_start"), "event_count")
        rows = [tuple(found) for found in written.collect()]
    finally:
        monkeypatch.undo()  # the TZ the process had
        time.tzset()

    assert rows == [(int(start.timestamp()) * 1_000_000, 2)]


@pytest.mark.parametrize(
    "start",
    [datetime(2, 1, 1, tzinfo=UTC), datetime(1500, 6, 1, 10, tzinfo=UTC), datetime(9998, 12, 31, 23, 59, tzinfo=UTC)],
    ids=["year-2", "before-1582", "year-9998"],
)
def test_a_window_at_an_end_of_the_calendar_is_added_to_not_inserted_twice(spark, lakehouse, start):
    # Before 1582 a datetime literal reaches Spark rebased from the Julian calendar, days away
    # from the window gold holds: the file question and the MERGE must see the window itself.
    gold = lakehouse.table(GOLD)
    row = (start, start + MINUTE, "view", 1, Decimal(1))
    for batch_id in (0, 1):
        add_to_windows(spark.createDataFrame([row], GOLD_SCHEMA), gold, "gold-stream", batch_id)
    written = spark.read.format("delta").load(gold).select(F.unix_micros("window_start"), "event_count")

    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert [tuple(found) for found in written.collect()] == [((start - epoch) // timedelta(microseconds=1), 2)]
    assert DeltaTable.forPath(spark, gold).history(1).first().operation == "MERGE"


def test_dedup_reads_only_the_batch_partitions_files_whatever_the_skew_and_topics(spark, lakehouse):
    quarantine = lakehouse.table(QUARANTINE)
    # Partition 0 is a million offsets ahead of partition 1; topic b has its own files;
    # a batch writes one file per Kafka partition, so none spans two partitions' offsets.
    history = [
        [quarantine_row("a", 0, 1_000_000 + i) for i in range(3)] + [quarantine_row("a", 1, 100 + i) for i in range(3)],
        [quarantine_row("b", 0, 50 + i) for i in range(3)],
    ]
    for rows in history:
        insert_new_kafka_records(
            spark.createDataFrame(rows, QUARANTINE_SCHEMA),
            quarantine,
            kafka_key_ranges(spark.createDataFrame(rows, QUARANTINE_SCHEMA)),
            None,
            0,
        )
    for topic, partition in (("a", 0), ("b", 0)):
        file_holding(spark, quarantine, (F.col("topic") == topic) & (F.col("partition") == partition)).unlink()

    # Partition 1 of topic a, overlapping what it holds: the replayed offsets 101 and 102
    # are found and skipped, 103 and 104 are new.
    batch = spark.createDataFrame([quarantine_row("a", 1, 101 + i) for i in range(4)], QUARANTINE_SCHEMA)
    insert_new_kafka_records(batch, quarantine, kafka_key_ranges(batch), "silver-stream", 0)

    partition_1 = spark.read.format("delta").load(quarantine).where((F.col("topic") == "a") & (F.col("partition") == 1))
    offsets = sorted(row.offset for row in partition_1.collect())
    assert offsets == [100, 101, 102, 103, 104]


def test_new_records_are_appended_and_a_batch_overlapping_the_table_is_merged_each_record_once(spark, lakehouse):
    quarantine = lakehouse.table(QUARANTINE)

    def insert(offsets, batch_id: int, partition: int = 0) -> None:
        batch = spark.createDataFrame([quarantine_row("a", partition, o) for o in offsets], QUARANTINE_SCHEMA)
        insert_new_kafka_records(batch, quarantine, kafka_key_ranges(batch), "silver-stream", batch_id)

    insert(range(0, 5), 0)
    insert(range(5, 10), 1)
    insert(range(5, 10), 1)  # a replay: the tag makes it a no-op
    insert(range(0, 3), 2, partition=1)  # other offsets of the batch's partition are no overlap
    insert(range(8, 12), 3)  # 8 and 9 held: a MERGE inserts 10 and 11 alone
    insert(range(10, 12), 4)  # all held: the MERGE inserts nothing

    history = DeltaTable.forPath(spark, quarantine).history().orderBy("version").collect()
    assert [row.operation for row in history][-5:] == ["WRITE", "WRITE", "WRITE", "MERGE", "MERGE"]
    assert history[-2].operationMetrics["numTargetRowsInserted"] == "2"
    assert history[-1].operationMetrics["numTargetRowsInserted"] == "0"
    rows = spark.read.format("delta").load(quarantine).select("partition", "offset").collect()
    assert sorted(tuple(row) for row in rows) == [(0, o) for o in range(12)] + [(1, o) for o in range(3)]


def test_a_recreated_topics_records_at_offsets_already_held_are_inserted_and_a_replay_of_them_is_not(spark, lakehouse):
    quarantine = lakehouse.table(QUARANTINE)

    def insert(rows: list[tuple], batch_id: int) -> None:
        batch = spark.createDataFrame(rows, QUARANTINE_SCHEMA)
        insert_new_kafka_records(batch, quarantine, kafka_key_ranges(batch), None, batch_id)

    insert([quarantine_row("a", 0, offset) for offset in range(5)], 0)
    # Deleted and created again: offsets start at 0 under a new topic id, in the same batch as old ones.
    recreated = [quarantine_row("a", 0, offset, topic_id="id-2") for offset in range(3)]
    insert([quarantine_row("a", 0, 4), *recreated], 1)
    insert(recreated, 2)

    rows = spark.read.format("delta").load(quarantine).select("topic_id", "offset").collect()
    assert sorted(tuple(row) for row in rows) == [("id-1", o) for o in range(5)] + [("id-2", o) for o in range(3)]


def test_the_rows_a_fused_batch_adds_to_silver_are_the_same_before_its_commit_and_in_its_replay(spark, lakehouse):
    # Any table keyed on the Kafka coordinates serves: quarantine's rows are the shortest to write.
    table = lakehouse.table(QUARANTINE)

    def batch(offsets):
        return spark.createDataFrame([quarantine_row("a", 0, offset) for offset in offsets], QUARANTINE_SCHEMA)

    def offsets(rows) -> list[int]:
        return sorted(row.offset for row in rows.collect())

    first = batch(range(0, 5))
    assert rows_new_to_silver(first, table, kafka_key_ranges(first), "fused-stream", 0) is first  # no file: all new
    writes.append_idempotent(first, table, "fused-stream", 0)
    overlapping = batch(range(3, 8))
    ranges = kafka_key_ranges(overlapping)
    added = rows_new_to_silver(overlapping, table, ranges, "fused-stream", 1)
    assert offsets(added) == [5, 6, 7]
    writes.append_idempotent(added, table, "fused-stream", 1)

    # Replayed after its commit, and after a compaction committed since: the rows that commit added.
    assert offsets(rows_new_to_silver(overlapping, table, ranges, "fused-stream", 1)) == [5, 6, 7]
    DeltaTable.forPath(spark, table).optimize().executeCompaction()
    assert offsets(rows_new_to_silver(overlapping, table, ranges, "fused-stream", 1)) == [5, 6, 7]
    assert offsets(spark.read.format("delta").load(table)) == list(range(8))


def test_a_compaction_committed_during_a_merge_makes_it_retry_and_still_insert_once(spark, lakehouse, caplog, tmp_path):
    quarantine = lakehouse.table(QUARANTINE)
    for start in range(0, 40, 10):
        rows = spark.createDataFrame([quarantine_row("a", 0, start + i) for i in range(10)], QUARANTINE_SCHEMA)
        insert_new_kafka_records(rows, quarantine, kafka_key_ranges(rows), None, 0)
    assert len(data_files(quarantine)) == 4

    # The batch overlaps every file, and computing it takes long enough for a compaction
    # of those files to commit first: Delta then refuses the MERGE's commit.
    # The UDF runs in a Python worker process: it signals through a file.
    started = tmp_path / "merge-started"

    @F.udf(BooleanType())
    def slowly(offset):
        if offset == 35:
            started.touch()
            time.sleep(4)
        return True

    batch = spark.createDataFrame([quarantine_row("a", 0, i) for i in range(35, 45)], QUARANTINE_SCHEMA).cache()
    ranges = kafka_key_ranges(batch)
    slow_batch = batch.where(slowly("offset"))
    failure = []

    def compact():
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            DeltaTable.forPath(spark, quarantine).optimize().executeCompaction()
        except Exception as error:  # noqa: BLE001 - reported below
            failure.append(error)

    compactor = threading.Thread(target=compact)
    compactor.start()
    with caplog.at_level(logging.WARNING):
        insert_new_kafka_records(slow_batch, quarantine, ranges, "silver-stream", 3)
    compactor.join(60)

    assert not failure
    operations = [row.operation for row in DeltaTable.forPath(spark, quarantine).history().orderBy("version").collect()]
    assert operations[-2:] == ["OPTIMIZE", "MERGE"]
    assert "conflicted" in caplog.text
    offsets = [row.offset for row in spark.read.format("delta").load(quarantine).orderBy("offset").collect()]
    assert offsets == list(range(45))


def test_state_warm_ups_left_when_a_run_ends_are_cancelled_not_waited_for(spark, lakehouse, monkeypatch):
    # The warm-up after an availableNow run's last batch serves no batch: a process ending the run
    # would wait for it at exit. Here the running warm-up is a Spark job that would take 8 s.
    class SlowState:
        def __init__(self, path):
            self.path = path

        def detail(self):
            return spark.range(1).repartition(1).rdd.map(lambda row: time.sleep(8) or row).toDF()

    monkeypatch.setattr(writes.DeltaTable, "forPath", lambda session, path: SlowState(path))
    running = writes.warm_up_state(spark, lakehouse.table(GOLD))
    queued = writes.warm_up_state(spark, lakehouse.table(QUARANTINE))
    while not running.running():
        time.sleep(0.05)
    time.sleep(1.0)  # its job started

    began = time.monotonic()
    writes.cancel_warm_ups(spark)
    assert queued.cancelled()
    running.result(timeout=8)  # the job was cancelled: the warm-up ends without its state
    assert time.monotonic() - began < 4
    with pytest.raises(TypeError):
        writes.cancel_warm_ups("spark")
