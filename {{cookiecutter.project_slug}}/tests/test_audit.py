"""The audit on a running pipeline, on a compacted topic and over a bounded range.

Each scenario is judged against Kafka read by a plain consumer (``kafka_oracle``)
and against what the test produced, never against the pipeline's own code.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.cli.audit import parse_bound
from {{ cookiecutter.package_name }}.devtools.sample import produce, sample_records
from {{ cookiecutter.package_name }}.pipeline.audit.cut import (
    Bound,
    Consumed,
    change_feed_consumed,
    delta_consumed,
    touched_windows,
)
from {{ cookiecutter.package_name }}.pipeline.audit.findings import Finding, keys
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import AuditReport, reconcile, reconcile_egress, run_audit
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE, GOLD_SCHEMA, SILVER, Lakehouse, change_feed_files
from {{ cookiecutter.package_name }}.pipeline.egress import GOLD_VERSION, installed_names, installed_streams, target_egress
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now


def delta_offset(version: int, index: int, starting: bool = False) -> str:
    offset = {"sourceVersion": 1, "reservoirId": "t", "reservoirVersion": version, "index": index}
    return json.dumps({**offset, "isStartingVersion": starting})


def test_the_findings_of_a_project_are_its_own_and_those_of_each_egress_it_runs():
    without = keys([])
{%- if cookiecutter.egress in ["both", "kafka"] %}
    with_kafka = keys(["kafka_egress"])

    assert with_kafka.keys() - without.keys() == {
        "kafka_egress_not_audited_its_last_batch_ended_inside_a_gold_version",
        "kafka_egress_rows_not_matching_gold",
        "kafka_egress_records_repeating_a_gold_version",
    }
{%- endif %}
    # An egress stream of another gold has the same findings, under its own name.
    for stream in set(installed_streams()) - set(installed_names()):
        own = keys([stream]).keys() - without.keys()
        first = target_egress(stream)
        assert {key.replace(stream, first, 1) for key in own} == keys([first]).keys() - without.keys()
        assert all(key.startswith(f"{stream}_") for key in own), own
    assert not any("egress" in key for key in without)
    assert without["newest_records_mostly_quarantined"] and not without["bronze_duplicates"]
    with pytest.raises(ValueError, match="not egress streams of this project"):
        keys(["teleport_egress"])
    with pytest.raises(ValueError, match="not a finding of each egress"):
        Finding.BRONZE_DUPLICATES.of("kafka_egress")
    with pytest.raises(ValueError, match="not an egress's stream name"):
        Finding.EGRESS_ROWS_NOT_MATCHING_GOLD.of("kafka")


def test_a_delta_offset_tells_the_versions_read_whole_and_whether_one_was_read_in_part():
    assert delta_consumed(None) == Consumed(-1, True)
    assert delta_consumed(delta_offset(8, -1)) == Consumed(7, True)
    assert delta_consumed(delta_offset(8, 3)) == Consumed(7, False)
    # Inside the initial snapshot: nothing is read whole until the stream moves past it.
    assert delta_consumed(delta_offset(5, 12, starting=True)) == Consumed(-1, False)


def test_a_bounded_audit_cuts_the_windows_of_its_records_exactly_before_1582_and_in_year_2(spark):
    # A datetime literal reaches Spark rebased from the Julian calendar: days off before 1582.
    times = [datetime(2, 1, 1, 0, 0, 30, tzinfo=UTC), datetime(1500, 6, 1, 10, 0, 30, tzinfo=UTC)]
    silver = spark.createDataFrame([(t,) for t in times], "event_time timestamp")
    minutes = [t.replace(second=0) + offset for t in times for offset in (timedelta(minutes=-1), timedelta(0))]
    gold = spark.createDataFrame([(start,) for start in minutes], "window_start timestamp")

    windows = touched_windows(silver, "1 minute", EVENTS, whole=False)

    kept = windows(gold, "window_start").select(F.unix_micros("window_start").alias("start")).collect()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    # The span runs from the first record's window to the last one's: every minute but the one before it.
    assert sorted(row.start for row in kept) == [(m - epoch) // timedelta(microseconds=1) for m in minutes[1:]]


def test_a_change_feed_offset_at_the_last_change_file_of_a_version_reads_that_version_whole(spark, tmp_path):
    """The egresses read gold's change feed, which ends a batch at the index of the last file it read
    (an update's change-data files) instead of moving on to the next version as Delta's plain source does."""
    path = str(tmp_path / "table")
    rows = spark.createDataFrame([(1, 10), (2, 20), (3, 30)], "id INT, total INT").repartition(3)
    rows.write.format("delta").option("delta.enableChangeDataFeed", "true").save(path)  # version 0: three files
    changed = spark.createDataFrame([(2, 21)], "id INT, total INT").alias("c")
    # Version 1: an update, with a change-data file.
    DeltaTable.forPath(spark, path).alias("t").merge(changed, "t.id = c.id").whenMatchedUpdateAll().execute()

    def last_offset(checkpoint: Path, **options: str) -> str:
        changes = spark.readStream.format("delta").option("readChangeFeed", "true").options(**options).load(path)
        changes.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).trigger(
            availableNow=True
        ).start().awaitTermination()
        newest = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda offsets: int(offsets.name))
        return newest.read_text().splitlines()[-1]

    def count(version: int) -> int:
        return len(change_feed_files(spark, path, version))

    updated = last_offset(tmp_path / "from-version-1", startingVersion="1")
    assert json.loads(updated)["reservoirVersion"] == 1 and json.loads(updated)["index"] >= 0
    assert delta_consumed(updated) == Consumed(0, False)  # as a plain Delta source's offset would read
    assert change_feed_consumed(updated, count) == Consumed(1, True)
    # The initial snapshot, read whole, moves on to the next version as the plain source does.
    assert change_feed_consumed(last_offset(tmp_path / "from-the-snapshot"), count) == Consumed(1, True)
    # A batch that stopped before the last of version 0's three files read it in part.
    assert count(0) == 3
    inside = json.dumps({**json.loads(updated), "reservoirVersion": 0, "index": 1})
    assert change_feed_consumed(inside, count) == Consumed(-1, False)


def test_the_audit_bound_takes_batches_an_iso_time_or_a_duration_and_names_the_flag_when_wrong():
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC).timestamp()
    assert parse_bound(None, None) == Bound()
    assert parse_bound(5, None) == Bound(last_batches=5)
    assert parse_bound(None, "2 hours", now_s=now) == Bound(since_ms=int((now - 7200) * 1000))
    assert parse_bound(None, "2026-11-23T11:00:00+01:00", now_s=now) == Bound(since_ms=int((now - 7200) * 1000))
    for flags, message in [
        ((0, None), "--last-batches: 0"),
        ((None, "yesterday"), "--since: 'yesterday' is neither"),
        ((None, "2026-11-23T11:00:00"), "has no UTC offset"),
        ((None, "2027-01-01T00:00:00+00:00"), "in the future"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_bound(*flags, now_s=now)
    with pytest.raises(ValueError, match="not both"):
        Bound(last_batches=1, since_ms=0)


def test_an_egress_is_checked_row_for_row_against_gold_leaving_out_what_is_in_flight(spark):
    def windows(*rows: tuple) -> DataFrame:  # (minute, event type, count, sum) of a one-minute window
        start = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
        planted = [
            (start + timedelta(minutes=m), start + timedelta(minutes=m + 1), kind, count, Decimal(total))
            for m, kind, count, total in rows
        ]
        return spark.createDataFrame(planted, GOLD_SCHEMA)

    # Gold as of version 4, the last the egress had consumed; gold has dropped minute 5 since.
    gold_then = windows(
        (1, "purchase", 2, "10.00"), (2, "view", 1, "0.00"), (3, "click", 4, "0.00"), (5, "view", 1, "0.00")
    )
    gold_now = gold_then.where(F.minute("window_start") != 5)
    # The sink: minute 1 as gold has it, minute 2 with another count, minute 3 missing, minute 4 written
    # from a later gold version (in flight), minute 5 already deleted (in flight).
    mirror = windows((1, "purchase", 2, "10.00"), (2, "view", 3, "0.00"), (4, "view", 1, "0.00")).withColumn(
        GOLD_VERSION, F.when(F.minute("window_start") == 4, 5).otherwise(3).cast("long")
    )

    report = AuditReport()
    reconcile_egress(report, "postgres_egress", mirror, gold_then, EVENTS, through=4, gold_now=gold_now)

    assert report.counts == {"postgres_egress_rows": 3, "postgres_egress_rows_in_flight": 1}
    assert report.errors == {"postgres_egress_rows_not_matching_gold": 2}  # minutes 2 and 3


def produce_events(config, count: int, seed: int, topic: str | None = None) -> list:
    records = list(sample_records(count, seed, 0.0, prefix=f"a{seed}"))
    produce(client_config(config), topic or config.kafka.topics[0], records, transaction_size=20)
    return records


def event_ids(records) -> set[str]:
    return {json.loads(value)["event_id"] for _, value in records}


def test_every_coordinate_check_counts_what_was_planted_and_nothing_else(spark):
    def keys(*records: tuple[str, int]) -> DataFrame:  # (topic id, offset) in partition 0 of topic "t"
        rows = [("t", topic_id, 0, offset) for topic_id, offset in records]
        return spark.createDataFrame(rows, "topic string, topic_id string, partition int, offset long")

    kafka = keys(*(("new", offset) for offset in range(10)))
    # Offset 9 never reached bronze, 3 came twice, 20 is not in Kafka; offset 0 of the topic's
    # earlier incarnation ("old") is not in Kafka either, legitimately.
    bronze = keys(*(("new", offset) for offset in (*range(9), 3, 20)), ("old", 0))
    # Silver holds 2 twice and 30, which bronze never had; 5 is in silver and quarantine, 6 twice in quarantine.
    silver = keys(*(("new", offset) for offset in (*range(6), 2, 30)))
    quarantine = keys(("new", 5), ("new", 6), ("new", 6))

    report = reconcile(kafka, bronze, silver, quarantine, None, "1 minute")

    assert report.counts == {
        "kafka_committed_records": 10,
        "bronze_rows": 12,
        "silver_rows": 8,
        "quarantine_rows": 3,
        # Of the 8 records silver or quarantine holds, 5 and 6 are quarantined: 25 %, not 3 of 11 rows.
        "newest_records_quarantined_percent": 25,
        "bronze_records_compacted_away_in_kafka": 0,
    }
    assert report.errors == {
        "kafka_records_missing_in_bronze": 1,  # 9
        "bronze_duplicates": 1,
        "bronze_records_not_committed_in_kafka": 1,  # 20
        "bronze_records_missing_in_silver_and_quarantine": 4,  # 7, 8, 20 and the old incarnation's 0
        "silver_duplicates": 1,
        "quarantine_duplicates": 1,
        "records_in_both_silver_and_quarantine": 1,
        "silver_or_quarantine_records_not_in_bronze": 1,  # 30
    }
    assert report.warnings == {"newest_records_mostly_quarantined": 0}

    # Silver read only the first six bronze records: 6, 7 and 8 are in flight, 20 was never consumed.
    consumed = keys(*(("new", offset) for offset in range(6)))
    in_flight = reconcile(kafka, bronze, silver, quarantine, None, "1 minute", bronze_read=consumed)
    assert in_flight.errors["bronze_records_missing_in_silver_and_quarantine"] == 0
    # Kafka's log starts at 1 (retention deleted 0) and compaction removed 1 and 2: bronze's 0 stays
    # legitimately, while 1 and 2 are in Kafka's range and not there (the topic is not known compacted).
    compacted = kafka.where("offset >= 3")
    gaps = reconcile(compacted, bronze, silver, quarantine, None, "1 minute", kafka_log_start={("t", 0): 1})
    assert gaps.errors["bronze_records_not_committed_in_kafka"] == 3  # 1, 2 and 20
    assert gaps.errors["kafka_records_missing_in_bronze"] == 1
    # A log start names the partition, not the incarnation: when a recreated topic's log starts at 0,
    # the earlier incarnation's 0 stays out of Kafka's range and is not counted as missing.
    recreated = reconcile(kafka, bronze, silver, quarantine, None, "1 minute", kafka_log_start={("t", 0): 0})
    assert recreated.errors["bronze_records_not_committed_in_kafka"] == 1  # 20


@pytest.mark.slow
def test_an_audit_of_a_running_pipeline_checks_what_each_stream_consumed_and_leaves_the_rest_in_flight(
    spark, pipeline_env, tmp_path, kafka_oracle
):
    config = pipeline_env
    packaged = resources.files("{{ cookiecutter.package_name }}").joinpath("conf", "local.toml").read_text()
    paced = tmp_path / "paced.toml"
    paced.write_text(packaged.replace('trigger_interval = "10 seconds"', 'trigger_interval = "3 seconds"'))
    silver_path = Lakehouse(config.lakehouse_root).table(SILVER)
    produced = produce_events(config, 60, seed=1)
    log = tmp_path / "pipeline.log"
    with log.open("w") as log_file:  # a file: an unread pipe that fills up blocks the pipeline
        pipeline = subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", "--config", str(paced), "run", "--layer", "all"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    producing = threading.Event()
    more: list = []

    def keep_producing() -> None:
        seed = 100
        while producing.is_set():
            more.extend(produce_events(config, 20, seed))
            seed += 1
            time.sleep(1)

    try:
        deadline = time.monotonic() + 240
        # Until the pipeline process has created silver and put the first 60 records in it.
        while not (
            DeltaTable.isDeltaTable(spark, silver_path) and DeltaTable.forPath(spark, silver_path).toDF().count() >= 60
        ):
            assert pipeline.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, "the first 60 records never reached silver"
            time.sleep(2)
        producing.set()
        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        time.sleep(3)
        # Committed in Kafka before the audit begins, the last ones a moment before: bronze, on its
        # trigger of 3 s, has not read them all.
        committed_before = produced + more + produce_events(config, 20, seed=99)
        report = run_audit(spark, config)
        producing.clear()
        producer.join(timeout=60)
    finally:
        producing.clear()
        pipeline.send_signal(signal.SIGTERM)
        pipeline.wait(timeout=180)
    assert pipeline.returncode == 0, log.read_text()[-5000:]

    total = len(produced) + len(more) + 20
    assert report.clean, report.as_dict()
    counts = report.counts
    # Not a vacuous cut: at least the first 60 records were checked through every layer.
    assert counts["kafka_committed_records"] >= 60 and counts["silver_rows"] >= 60, report.as_dict()
    assert report.cut["silver_read_bronze_through_version"] >= 0
    # Records committed before the audit began were left out of it: in flight, and not counted as missing.
    assert counts["kafka_committed_records"] < len(committed_before), (counts, len(committed_before))

    run_available_now(spark, config)
    final = run_audit(spark, config)
    assert final.clean, final.as_dict()
    assert final.counts["kafka_committed_records"] == total == len(kafka_oracle(config, list(config.kafka.topics)))
    silver_ids = [row.event_id for row in spark.read.format("delta").load(silver_path).select("event_id").collect()]
    assert sorted(silver_ids) == sorted(event_ids(produced + more) | event_ids(committed_before))


def create_compacted_topic(config, name: str) -> None:
    settings = {
        "cleanup.policy": "compact",
        # Roll a segment a second after it opens and clean it at once: compaction within the test.
        "segment.ms": "1000",
        "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "0",
    }
    admin = AdminClient(client_config(config))
    admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1, config=settings)])[name].result(30)


@pytest.mark.slow
def test_records_a_compacted_topic_removed_are_accounted_for_and_a_record_kafka_never_had_is_not(
    spark, config, kafka_oracle, cleanup_policy
):
    compacted = f"{config.kafka.topics[0]}-compacted"
    create_compacted_topic(config, compacted)
    # A changelog by design, so named in the config: bronze refuses a compacted topic it was not told of.
    kafka = config.kafka.model_copy(update={"topics": (compacted,), "compacted_topics": (compacted,)})
    config = config.model_copy(update={"kafka": kafka})
    # Three versions of each of ten keys: compaction keeps the newest of each.
    versions = [
        (f"user-{n}".encode(), value)
        for round_ in range(3)
        for n, (_, value) in enumerate(sample_records(10, 40 + round_, 0.0, prefix=f"k{round_}"))
    ]
    produce(client_config(config), compacted, versions, transaction_size=10)
    run_available_now(spark, config)
    assert run_audit(spark, config).clean
    # Offsets with no record: each transaction's commit marker.
    markers = sorted(set(range(len(versions) + 3)) - {offset for _, _, offset in kafka_oracle(config, [compacted])})

    # Appends after the segment's second roll it and let the cleaner reach the old records (their
    # keys are new each time, so they are never compacted themselves).
    deadline, rolls = time.monotonic() + 120, 0
    while len(kafka_oracle(config, [compacted])) >= len(versions) + rolls and time.monotonic() < deadline:
        time.sleep(2)
        produce(client_config(config), compacted, [(f"roll-{rolls}".encode(), versions[0][1])], transaction_size=1)
        rolls += 1
    run_available_now(spark, config)
    for _ in range(3):  # the cleaner may pass again while the audit reads: judge against a stable Kafka
        held = kafka_oracle(config, [compacted])
        report = run_audit(spark, config)
        if kafka_oracle(config, [compacted]) == held:
            break
    removed = [offset for offset in range(markers[-1]) if offset not in markers and (compacted, 0, offset) not in held]
    assert removed, "the log cleaner removed nothing in 120 s"
    assert report.clean, report.as_dict()
    assert report.counts["bronze_records_compacted_away_in_kafka"] == len(removed)
    # What the cleaner removed before bronze read it no one can count: said, as the topic's meaning.
    assert report.warnings["compacted_topics_whose_superseded_records_bronze_may_never_have_read"] == 1

    # A record where Kafka never had one (a marker's offset), under a key with no later record.
    bronze_path = Lakehouse(config.lakehouse_root).table(BRONZE)
    bronze = spark.read.format("delta").load(bronze_path)
    ghost = bronze.where(F.col("offset") == removed[0]).select(
        *[F.lit(markers[0]).cast("long").alias(c) if c == "offset" else F.col(c) for c in bronze.columns]
    )
    ghost.withColumn("key", F.lit(b"user-never")).write.format("delta").mode("append").save(bronze_path)
    report = run_audit(spark, config)
    assert report.errors["bronze_records_not_committed_in_kafka"] == 1
    assert report.counts["bronze_records_compacted_away_in_kafka"] == len(removed)

    # The same topic not named in kafka.compacted_topics: a check the audit cannot make fails the verdict.
    undeclared = config.model_copy(update={"kafka": config.kafka.model_copy(update={"compacted_topics": ()})})
    assert run_audit(spark, undeclared).errors["compacted_topics_not_in_kafka_compacted_topics"] == 1
    # Its policy set back (the other way out of bronze's refusal): bronze recorded the topic as compacted,
    # so what the cleaner removed is still accounted for, and still said.
    cleanup_policy(config, compacted, "delete")
    report = run_audit(spark, undeclared)
    assert "compacted_topics_not_in_kafka_compacted_topics" not in report.errors, report.as_dict()
    assert report.errors["bronze_records_not_committed_in_kafka"] == 1  # the record Kafka never had, only
    assert report.counts["bronze_records_compacted_away_in_kafka"] == len(removed)
    assert report.warnings["compacted_topics_whose_superseded_records_bronze_may_never_have_read"] == 1


@pytest.mark.slow
def test_a_bounded_audit_reads_only_its_range_and_finds_a_loss_there_but_not_outside(spark, pipeline_env, capsys):
    config = pipeline_env
    first = produce_events(config, 100, seed=2)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    between = datetime.now(UTC)
    time.sleep(1.5)
    second = produce_events(config, 40, seed=3)
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    def audit(*flags: str) -> tuple[int, dict]:
        capsys.readouterr()
        code = main(["audit", "--json", *flags])
        return code, json.loads(capsys.readouterr().out)["datasets"]["events"]

    code, whole = audit()
    assert code == 0 and whole["counts"]["kafka_committed_records"] == 140
    code, last = audit("--last-batches", "1")
    assert code == 0 and last["counts"]["kafka_committed_records"] == 40, last
    assert last["counts"]["silver_rows"] == 40 and last["counts"]["bronze_rows"] == 40
    code, since = audit("--since", between.isoformat())
    assert code == 0 and since["counts"]["kafka_committed_records"] == 40, since

    # Lose one record of the first batch from silver.
    silver_path = Lakehouse(config.lakehouse_root).table(SILVER)
    spark.sql(f"ALTER TABLE delta.`{silver_path}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    lost = json.loads(first[0][1])["event_id"]
    DeltaTable.forPath(spark, silver_path).delete(F.col("event_id") == lost)
    code, last = audit("--last-batches", "1")
    assert code == 0, last  # outside the range
    code, whole = audit()
    assert code == 1 and whole["errors"]["bronze_records_missing_in_silver_and_quarantine"] == 1
    code, two = audit("--last-batches", "2")
    assert code == 1 and two["errors"]["bronze_records_missing_in_silver_and_quarantine"] == 1
    assert event_ids(second) <= {
        row.event_id for row in spark.read.format("delta").load(silver_path).select("event_id").collect()
    }

    # The offset log no longer holds the batch a bound needs: refused, naming how far back it can go.
    Path(Lakehouse(config.lakehouse_root).checkpoint("bronze"), "offsets", "0").unlink()
    capsys.readouterr()
    assert main(["audit", "--last-batches", "1"]) == 2
    assert "bronze's offset log keeps batches 1 to 1" in capsys.readouterr().err


@pytest.mark.slow
def test_an_audit_checks_from_where_bronze_began_and_fails_when_it_cannot_check_gold(
    spark, pipeline_env, capsys, monkeypatch
):
    config = pipeline_env
    monkeypatch.setenv("KAFKA_STARTING_OFFSETS", "latest")
    produce_events(config, 30, seed=4)
    # Nothing after "latest" yet: the stream starts, keeps where it began in its checkpoint, and stops.
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    after = produce_events(config, 20, seed=5)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    silver = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(SILVER)).select("event_id")
    assert {row.event_id for row in silver.collect()} == event_ids(after)

    # The 30 records before the start were never bronze's to read: not missing, not audited.
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["datasets"]["events"]
    assert report["counts"]["kafka_committed_records"] == 20, report

    # Gold's last batch as Delta logs one that ended inside a silver version (a version split over
    # batches): gold then holds part of that version, and the audit cannot compare it with silver.
    offsets = Path(Lakehouse(config.lakehouse_root).checkpoint("gold"), "offsets")
    last = offsets / str(max(int(name.name) for name in offsets.iterdir() if name.name.isdigit()))
    version_line, batch_line, source = last.read_text().splitlines()
    inside = {**json.loads(source), "index": 0, "isStartingVersion": False}
    last.write_text("\n".join([version_line, batch_line, json.dumps(inside)]))
    (offsets / f".{last.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the file as Spark wrote it

    assert main(["audit", "--json"]) == 1
    printed = json.loads(capsys.readouterr().out)
    report = printed["datasets"]["events"]
    assert printed["verdict"] == report["verdict"] == "FAILED"
    found = {name: count for name, count in report["errors"].items() if count}
    assert found == {"gold_not_audited_its_last_batch_ended_inside_a_silver_version": 1}
