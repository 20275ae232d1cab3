"""The fused stream's replays on the real broker, Spark and Delta: what it rebuilds a batch from."""

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pyspark.sql import functions as F
from test_faults import assert_compiled, compiled_env

from {{ cookiecutter.package_name }}.devtools.kafka_local import partitions_with_leaders
from {{ cookiecutter.package_name }}.devtools.sample import produce, sample_records
from {{ cookiecutter.package_name }}.pipeline import fused
from {{ cookiecutter.package_name }}.pipeline.config import Mode
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import CRASH_POINT_VAR, FUSED_POINTS
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now


def pipeline(config, **extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_MODE": "fused",
        **extra,
    }
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "run", "--available-now"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def delete_every_record(config, topic: str) -> None:
    """What retention does once the records are old enough: Kafka deletes all of them."""
    consumer = Consumer(client_config(config, **{"group.id": f"ends-{os.getpid()}"}))
    try:
        partitions = partitions_with_leaders(consumer, topic)
        ends = [
            TopicPartition(topic, p, consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1])
            for p in partitions
        ]
    finally:
        consumer.close()
    admin = AdminClient(client_config(config))  # kept alive until the deletion is done
    for future in admin.delete_records(ends).values():
        future.result(timeout=30)


def assert_every_record_once(spark, config, committed: dict, prefix: str) -> None:
    """Bronze, silver + quarantine and gold against what Kafka held, with none of the pipeline's code."""
    lakehouse = Lakehouse(config.lakehouse_root)

    def rows(name: str):
        return spark.read.format("delta").load(lakehouse.table(name))

    def coordinates(name: str) -> list[tuple]:
        return sorted(tuple(row) for row in rows(name).select("topic", "partition", "offset").collect())

    assert coordinates(BRONZE) == sorted(committed)
    assert sorted(coordinates(SILVER) + coordinates(QUARANTINE)) == sorted(committed)
    events = [json.loads(value) for value in committed.values() if value and value.startswith(prefix.encode())]
    valid = [event for event in events if isinstance(event.get("amount"), float) and "T" in event["event_time"]]
    assert len(coordinates(SILVER)) == len(valid) and 0 < len(valid) < len(committed)
    counted = rows(GOLD).groupBy("event_type").agg(F.sum("event_count").alias("n")).collect()
    assert {row.event_type: row.n for row in counted} == Counter(event["event_type"] for event in valid)


@pytest.mark.faults
def test_a_fused_batch_whose_kafka_records_go_after_bronze_committed_writes_every_table_from_bronze(
    spark, config, kafka_oracle, monkeypatch
):
    """With ``kafka.fail_on_data_loss = false`` Spark reads a range Kafka removed records from as the
    records left, without a word. Right after bronze's commit Kafka deletes the batch's records and
    every cached block goes, as when an executor is lost: the other tables still hold the whole batch."""
    records = list(sample_records(60, 43, 0.1, prefix="f43"))
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=20)
    committed = kafka_oracle(config, list(config.kafka.topics))
    kafka = config.kafka.model_copy(update={"fail_on_data_loss": False})
    lossy = config.model_copy(update={"mode": Mode.FUSED, "kafka": kafka})
    assert fused.reads_bronze_back(lossy) and not fused.reads_bronze_back(config)
    reached = fused.reach

    def then_kafka_loses_the_batch(stream: str, point: str, batch_id: int) -> None:
        reached(stream, point, batch_id)
        if point == FUSED_POINTS[0]:
            delete_every_record(config, config.kafka.topics[0])
            spark.catalog.clearCache()

    monkeypatch.setattr(fused, "reach", then_kafka_loses_the_batch)
    run_available_now(spark, lossy)

    assert_every_record_once(spark, config, committed, '{"event_id": "f43')


@pytest.mark.faults
@pytest.mark.storage
def test_a_compiled_fused_batch_replayed_after_bronze_committed_is_rebuilt_from_bronze_not_from_what_kafka_holds(
    spark, config, kafka_oracle, tmp_path
):
    records = list(sample_records(60, 41, 0.1, prefix="f41"))
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=20)
    committed = kafka_oracle(config, list(config.kafka.topics))
    # Both processes compile every query of every batch, however small, as production compiles a large
    # batch (pipeline/session/codegen.py); Spark's event logs tell what they did.
    event_logs = tmp_path / "event-logs"
    compiled = {"JAVA_TOOL_OPTIONS": compiled_env(dict(os.environ), event_logs)["JAVA_TOOL_OPTIONS"]}
    # Killed right after bronze's commit of batch 0: silver, quarantine and gold hold nothing of it.
    crash = f"fused:{FUSED_POINTS[0]}:0"
    crashed = pipeline(config, **compiled, **{CRASH_POINT_VAR: crash})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    # Meanwhile Kafka removes the batch's records; the stream is told to go on past lost records.
    delete_every_record(config, config.kafka.topics[0])

    recovered = pipeline(config, **compiled, KAFKA_FAIL_ON_DATA_LOSS="false")
    assert recovered.returncode == 0, recovered.stderr[-3000:]

    # Judged against what Kafka held before, with none of the pipeline's code.
    assert_every_record_once(spark, config, committed, '{"event_id": "f41')
    # Every batch the fused stream ran compiled, though each holds a few records.
    assert_compiled(event_logs, ["fused"])
