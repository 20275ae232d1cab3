"""The whole pipeline on the real local broker, real Delta tables and a real SparkSession."""

import json
import shutil
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.devtools.sample import CALENDAR_EDGES, calendar_edge_records, produce, sample_records
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse, with_downstream
from {{ cookiecutter.package_name }}.pipeline.gold import add_to_windows, window_aggregates
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery import checkpoints
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now

EVENT_START = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
TABLES = (BRONZE, SILVER, QUARANTINE, GOLD)


def produce_sample(config, count: int, seed: int, malformed_ratio: float = 0.0, abort: bool = False) -> list:
    records = list(sample_records(count, seed, malformed_ratio, start=EVENT_START, prefix=f"s{seed}"))
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=50, abort=abort)
    return records


def table(spark, config, name: str):
    return spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(name))


def versions(spark, config) -> dict[str, int]:
    lakehouse = Lakehouse(config.lakehouse_root)
    return {name: DeltaTable.forPath(spark, lakehouse.table(name)).history(1).first()["version"] for name in TABLES}


def checkpoint_dir(config, stream: str) -> Path:
    return Path(Lakehouse(config.lakehouse_root).checkpoint(stream))


def well_formed_events(records: list) -> list[dict]:
    """The produced events the contract accepts, judged in plain Python from what was produced."""
    events = []
    for _, value in records:
        try:
            event = json.loads(value)
        except (TypeError, ValueError):
            continue
        if not isinstance(event, dict) or not isinstance(event.get("amount"), (int, float)):
            continue
        if "T" not in str(event.get("event_time")) or Decimal(str(event["amount"])) != round(
            Decimal(str(event["amount"])), 2
        ):
            continue
        events.append(event)
    return events


def expected_gold(records: list) -> dict[str, tuple[int, Decimal]]:
    """Totals per event_type computed in plain Python from what was produced."""
    totals: dict[str, tuple[int, Decimal]] = {}
    for event in well_formed_events(records):
        count, amount = totals.get(event["event_type"], (0, Decimal("0")))
        totals[event["event_type"]] = (count + 1, amount + Decimal(str(event["amount"])))
    return totals


def coordinates(rows) -> list[tuple[str, int, int]]:
    """Each row's Kafka coordinates, one entry per row: a record held twice shows twice."""
    return [tuple(row) for row in rows.select("topic", "partition", "offset").collect()]


def gold_totals(spark, config) -> dict[str, tuple[int, Decimal]]:
    rows = (
        table(spark, config, GOLD)
        .groupBy("event_type")
        .agg(F.sum("event_count").alias("n"), F.sum("amount_sum").alias("amount"))
        .collect()
    )
    return {row.event_type: (row.n, row.amount) for row in rows}


def assert_audit_clean(spark, config) -> dict:
    report = run_audit(spark, config).as_dict()
    assert report["verdict"] == "clean", report
    return report


def test_available_now_stream_reads_committed_records_from_local_broker_into_delta(spark, config):
    committed = produce_sample(config, 40, seed=1)
    aborted = produce_sample(config, 25, seed=2, abort=True)

    run_available_now(spark, config, ("bronze",))

    bronze = table(spark, config, BRONZE)
    values = {bytes(row.value) for row in bronze.select("value").collect()}
    assert values == {value for _, value in committed}
    assert not values & {value for _, value in aborted}
    # Rows and distinct coordinates both: a record written twice shows in the rows alone.
    assert bronze.count() == bronze.select("topic", "partition", "offset").distinct().count() == 40
    assert {bytes(row.key) for row in bronze.select("key").collect()} == {key for key, _ in committed}
    # ingest_time is the batch time Spark logged before the batch ran, so a replay writes the same value.
    offset_log = (checkpoint_dir(config, "bronze") / "offsets" / "0").read_text().splitlines()
    batch_time_ms = json.loads(offset_log[1])["batchTimestampMs"]
    ingest_times = {row.ms for row in bronze.selectExpr("unix_millis(ingest_time) AS ms").distinct().collect()}
    assert ingest_times == {batch_time_ms}


def test_end_to_end_counts_every_record_once_and_a_rerun_takes_only_new_records(spark, config):
    first = produce_sample(config, 300, seed=3, malformed_ratio=0.1)
    produce_sample(config, 30, seed=4, abort=True)

    run_available_now(spark, config)

    malformed = sum(1 for _, value in first if value is None or not value.startswith(b'{"event_id": "s3'))
    assert malformed > 0
    assert table(spark, config, QUARANTINE).count() == malformed
    assert table(spark, config, SILVER).count() == 300 - malformed
    assert gold_totals(spark, config) == expected_gold(first)
    assert_audit_clean(spark, config)

    second = produce_sample(config, 120, seed=5)
    run_available_now(spark, config)

    assert table(spark, config, BRONZE).count() == 420
    assert table(spark, config, SILVER).count() == 420 - malformed
    assert gold_totals(spark, config) == expected_gold(first + second)
    assert_audit_clean(spark, config)


def test_replayed_batches_are_no_ops(spark, config):
    produce_sample(config, 200, seed=6, malformed_ratio=0.05)
    run_available_now(spark, config)
    before_versions = versions(spark, config)
    # Materialized now: after the replay, gold must hold exactly these rows.
    before_gold = spark.createDataFrame(table(spark, config, GOLD).collect(), table(spark, config, GOLD).schema)
    last_batches = {
        stream: checkpoints.last_committed_batch(spark, str(checkpoint_dir(config, stream)))
        for stream in ("bronze", "silver", "gold")
    }

    # As if each stream's process died after its sink's Delta commit but before Spark's commit-log
    # entry: every stream replays its last batch in the next run, and each table has its own
    # version, so a replay that wrote anything shows in that stream's table.
    for stream, last_batch in last_batches.items():
        commits = checkpoint_dir(config, stream) / "commits"
        (commits / str(last_batch)).unlink()
        (commits / f".{last_batch}.crc").unlink(missing_ok=True)
    run_available_now(spark, config)

    for stream, last_batch in last_batches.items():
        assert checkpoints.last_committed_batch(spark, str(checkpoint_dir(config, stream))) == last_batch
    assert versions(spark, config) == before_versions
    assert_df_equality(table(spark, config, GOLD), before_gold, ignore_row_order=True)
    assert_audit_clean(spark, config)


def test_a_table_whose_creation_was_killed_before_its_first_commit_is_created_at_the_next_start(spark, config):
    # What a driver killed inside its first CREATE TABLE leaves: the log directory without a commit,
    # at most the commit's half-written temporary file.
    log = Path(Lakehouse(config.lakehouse_root).table(BRONZE)) / "_delta_log"
    (log / "_staged_commits").mkdir(parents=True)
    (log / f".{0:020d}.json.5072f58a-fb2e-4085-b2ce-1b1e8ee3bef7.tmp").write_text('{"commitInfo":{')
    records = produce_sample(config, 30, seed=41)

    run_available_now(spark, config)

    assert table(spark, config, BRONZE).count() == len(records)
    assert_audit_clean(spark, config)


@pytest.mark.storage
def test_lost_bronze_checkpoint_resumes_after_the_offsets_already_in_bronze(
    spark, config, lakehouse_files, kafka_oracle
):
    records = produce_sample(config, 150, seed=7)
    run_available_now(spark, config)
    lakehouse_files.remove(Lakehouse(config.lakehouse_root).checkpoint("bronze"))
    records += produce_sample(config, 60, seed=8)

    run_available_now(spark, config)

    # Judged against Kafka and what was produced: each committed record once in bronze, each event once in gold.
    committed = kafka_oracle(config, list(config.kafka.topics))
    assert len(committed) == 210
    bronze = table(spark, config, BRONZE).select("topic", "partition", "offset", "value").collect()
    expected = sorted((*at, value) for at, value in committed.items())
    assert sorted((*row[:3], bytes(row.value)) for row in bronze) == expected
    assert gold_totals(spark, config) == expected_gold(records)
    report = assert_audit_clean(spark, config)
    assert report["errors"]["bronze_duplicates"] == 0


@pytest.mark.slow
@pytest.mark.storage
def test_lost_silver_checkpoint_keeps_each_record_once_through_key_dedup(spark, config, lakehouse_files, kafka_oracle):
    records = produce_sample(config, 150, seed=9, malformed_ratio=0.1)
    run_available_now(spark, config)
    counts = {name: table(spark, config, name).count() for name in (SILVER, QUARANTINE)}
    lakehouse_files.remove(Lakehouse(config.lakehouse_root).checkpoint("silver"))

    run_available_now(spark, config)

    assert {name: table(spark, config, name).count() for name in (SILVER, QUARANTINE)} == counts
    # Judged against Kafka and what was produced: each committed record once in silver or quarantine,
    # the malformed ones in quarantine, and gold as computed from the produced values.
    committed = kafka_oracle(config, list(config.kafka.topics))
    assert len(committed) == 150
    held = coordinates(table(spark, config, SILVER)) + coordinates(table(spark, config, QUARANTINE))
    assert sorted(held) == sorted(committed)
    silver_ids = [row.event_id for row in table(spark, config, SILVER).select("event_id").collect()]
    assert sorted(silver_ids) == sorted(event["event_id"] for event in well_formed_events(records))
    assert gold_totals(spark, config) == expected_gold(records)
    assert_audit_clean(spark, config)


@pytest.mark.slow
def test_lost_gold_checkpoint_refuses_to_start_until_reset_rebuilds_gold(spark, config):
    records = produce_sample(config, 150, seed=10)
    run_available_now(spark, config)
    shutil.rmtree(checkpoint_dir(config, "gold"))

    with pytest.raises(checkpoints.CheckpointError, match="checkpoints reset gold"):
        run_available_now(spark, config, ("gold",))
    assert gold_totals(spark, config) == expected_gold(records)

    [rebuilt] = reset(spark, Lakehouse(config.lakehouse_root), with_downstream("gold"), config.gold_window)
    # Rebuilt aside and swapped in: gold is whole right after the reset, before any stream runs.
    assert rebuilt.rows[GOLD] == table(spark, config, GOLD).count() > 0
    assert gold_totals(spark, config) == expected_gold(records)
    run_available_now(spark, config)
    assert gold_totals(spark, config) == expected_gold(records)

    records += produce_sample(config, 60, seed=31)
    run_available_now(spark, config)
    assert gold_totals(spark, config) == expected_gold(records)
    assert_audit_clean(spark, config)


def test_a_gold_commit_under_the_id_of_a_stream_that_was_reset_is_skipped(spark, config):
    """What a gold process that stood still past its lease would commit on waking after a reset:
    its next batch, tagged with its old stream id. The reset fenced that id on gold."""
    records = produce_sample(config, 40, seed=12)
    run_available_now(spark, config)
    lakehouse = Lakehouse(config.lakehouse_root)
    old_id = checkpoints.read_stream_id(spark, lakehouse.checkpoint("gold"), "gold")

    reset(spark, lakehouse, with_downstream("gold"), config.gold_window)
    late_batch = window_aggregates(table(spark, config, SILVER), config.gold_window)
    add_to_windows(late_batch, lakehouse.table(GOLD), old_id, 7)

    assert gold_totals(spark, config) == expected_gold(records)
    run_available_now(spark, config)
    assert gold_totals(spark, config) == expected_gold(records)


@pytest.mark.slow
def test_reset_bronze_resets_everything_downstream_without_double_counting(spark, config):
    records = produce_sample(config, 120, seed=11, malformed_ratio=0.1)
    run_available_now(spark, config)

    counts = {name: table(spark, config, name).count() for name in (SILVER, QUARANTINE)}
    rebuilt = reset(spark, Lakehouse(config.lakehouse_root), with_downstream("bronze"), config.gold_window)
    assert [each.stream for each in rebuilt] == ["silver", "gold"]
    assert not checkpoint_dir(config, "bronze").exists()
    # Silver and gold were rebuilt in the reset: each new checkpoint holds only the new stream's id, no batch.
    for stream in ("silver", "gold"):
        assert [path.name for path in checkpoint_dir(config, stream).iterdir() if path.name[0] != "."] == ["metadata"]
    assert {name: table(spark, config, name).count() for name in (SILVER, QUARANTINE)} == counts
    assert gold_totals(spark, config) == expected_gold(records)
    run_available_now(spark, config)

    assert table(spark, config, BRONZE).count() == 120
    assert gold_totals(spark, config) == expected_gold(records)
    assert_audit_clean(spark, config)


@pytest.mark.slow
def test_swapped_checkpoint_is_refused(spark, config, tmp_path):
    produce_sample(config, 50, seed=12)
    run_available_now(spark, config)
    other = config.model_copy(update={"lakehouse_root": str(tmp_path / "other")})
    run_available_now(spark, other)

    shutil.rmtree(checkpoint_dir(config, "silver"))
    shutil.copytree(checkpoint_dir(other, "silver"), checkpoint_dir(config, "silver"))

    with pytest.raises(checkpoints.CheckpointError, match="does not match"):
        run_available_now(spark, config, ("silver",))


@pytest.mark.slow
def test_audit_detects_a_planted_duplicate_and_a_planted_loss(spark, config):
    produce_sample(config, 100, seed=13, malformed_ratio=0.1)
    run_available_now(spark, config)
    assert_audit_clean(spark, config)
    silver_path = Lakehouse(config.lakehouse_root).table(SILVER)

    duplicate = table(spark, config, SILVER).orderBy("partition", "offset").limit(1)
    duplicate.write.format("delta").mode("append").save(silver_path)
    report = run_audit(spark, config)
    assert report.errors["silver_duplicates"] == 1
    # Gold is judged at the silver version it consumed, before the plant: the copy is not its fault.
    assert report.cut["gold_read_silver_through_version"] < report.cut["table_versions"][SILVER]
    assert report.errors["gold_windows_not_matching_silver"] == 0

    # Now lose that record altogether: both copies go (silver is append-only by table property).
    victim = table(spark, config, SILVER).orderBy("partition", "offset").first()
    spark.sql(f"ALTER TABLE delta.`{silver_path}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
    DeltaTable.forPath(spark, silver_path).delete(
        (F.col("partition") == victim.partition) & (F.col("offset") == victim.offset)
    )
    report = run_audit(spark, config)
    assert report.errors["silver_duplicates"] == 0
    assert report.errors["bronze_records_missing_in_silver_and_quarantine"] == 1
    assert not report.clean


@pytest.mark.slow
def test_a_producer_that_changes_a_field_type_is_flagged_per_batch_and_by_the_audit(spark, config, capsys):
    produce_sample(config, 20, seed=32)
    run_available_now(spark, config)
    # The producer starts sending amount as a string: every new record is quarantined, gold stops growing.
    changed = [
        (key, json.dumps({**json.loads(value), "amount": str(json.loads(value)["amount"])}).encode())
        for key, value in sample_records(40, 33, start=EVENT_START, prefix="s33")
    ]
    produce(client_config(config), config.kafka.topics[0], changed, transaction_size=50)
    capsys.readouterr()
    run_available_now(spark, config)

    err = capsys.readouterr().err
    # The warning names each rule once (the JSON type found left out); the table keeps the full reason.
    reasons = "{'field amount must be a number, got <type>': 40}"
    assert f"40 of 40 records quarantined (100%); check the producer: {reasons}" in err
    quarantined = table(spark, config, QUARANTINE).groupBy("reason").count().collect()
    assert [(row.reason, row["count"]) for row in quarantined] == [("field amount must be a number, got STRING", 40)]
    report = assert_audit_clean(spark, config)
    # 40 of the newest 60 records: flagged, and nothing lost (the audit stays clean).
    assert report["counts"]["newest_records_quarantined_percent"] == 67
    assert report["warnings"]["newest_records_mostly_quarantined"] == 67


@pytest.mark.slow
def test_audit_detects_records_rewritten_in_place_which_coordinates_cannot_show(spark, config):
    produce_sample(config, 40, seed=34, malformed_ratio=0.2)
    run_available_now(spark, config)
    assert_audit_clean(spark, config)
    lakehouse = Lakehouse(config.lakehouse_root)

    def rewrite(name: str, changes: dict) -> None:
        path = lakehouse.table(name)
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.appendOnly' = 'false')")
        first = table(spark, config, name).orderBy("partition", "offset").first()
        where = (F.col("partition") == first.partition) & (F.col("offset") == first.offset)
        DeltaTable.forPath(spark, path).update(where, changes)

    rewrite(SILVER, {"amount": F.col("amount") + 1})
    rewrite(QUARANTINE, {"reason": F.lit("edited")})
    rewrite(BRONZE, {"value": F.concat(F.col("value"), F.lit(b" "))})
    errors = run_audit(spark, config).errors

    assert errors["bronze_records_not_as_in_kafka"] == 1
    # The bronze edit only adds white space to the JSON: silver parses it the same.
    assert errors["silver_rows_not_as_parsed_from_bronze"] == 1
    # Quarantine keeps the raw value: its edited row, and the edited bronze record if that was malformed.
    assert errors["quarantine_rows_not_as_parsed_from_bronze"] in (1, 2)
    coordinates = ("kafka_records_missing_in_bronze", "silver_duplicates", "records_in_both_silver_and_quarantine")
    assert all(errors[name] == 0 for name in coordinates), errors


@pytest.mark.parametrize("mode", ["layered", "fused"])
def test_event_times_at_both_ends_of_the_calendar_go_to_quarantine_or_to_one_gold_row_each(
    spark, pipeline_env, monkeypatch, capsys, mode
):
    monkeypatch.setenv("PIPELINE_MODE", mode)
    for run in (1, 2):
        # The same event ids in both runs (an application's retry), and two ordinary events each.
        records = calendar_edge_records("edge") + list(sample_records(2, run, start=EVENT_START, prefix=f"c{run}"))
        produce(client_config(pipeline_env), pipeline_env.kafka.topics[0], records)
        assert main(["run", "--layer", "all", "--available-now"]) == 0, capsys.readouterr().err[-3000:]

    # Judged from the produced values alone: each in-range edge's minute once in gold, counted twice.
    epoch = datetime(1970, 1, 1, tzinfo=UTC)

    def minute_micros(text: str) -> int:
        instant = datetime.fromisoformat(text)
        return (instant.replace(second=0, microsecond=0) - epoch) // timedelta(microseconds=1)

    in_range = [text for text, accepted in CALENDAR_EDGES.items() if accepted]
    gold = table(spark, pipeline_env, GOLD).where("event_type = 'edge'")
    rows = gold.select(F.unix_micros("window_start").alias("start"), "event_count", "amount_sum").collect()
    assert sorted(tuple(row) for row in rows) == sorted((minute_micros(t), 2, Decimal("2.50")) for t in in_range)
    out_of_range = "field event_time is outside the supported range [1583-01-01T00:00:00Z, 9999-01-01T00:00:00Z)"
    reasons = [row.reason for row in table(spark, pipeline_env, QUARANTINE).collect()]
    assert reasons == [out_of_range] * 2 * (len(CALENDAR_EDGES) - len(in_range))
    assert table(spark, pipeline_env, GOLD).where("event_type <> 'edge'").agg(F.sum("event_count")).first()[0] == 4
    assert main(["audit"]) == 0, capsys.readouterr().out[-3000:]
    # Bounded to the last batch: the span of its windows, from 1583 to 9998, cut exactly.
    assert main(["audit", "--last-batches", "1"]) == 0, capsys.readouterr().out[-3000:]
