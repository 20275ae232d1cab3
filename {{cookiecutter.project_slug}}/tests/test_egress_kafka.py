"""The Kafka egress on a real broker, real Spark and Delta: gold leaves the lakehouse exactly once.

The oracle is independent of the egress: confluent_kafka consumers read the output topic
(read_committed, and read_uncommitted to see what aborted transactions left in the log),
fold it by key as a compacted topic or a consumer does, and compare with gold as Spark
reads it. The marker is read as the committed offset of the consumer group named after
the stream id, with a plain Consumer.
"""

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from delta.tables import DeltaTable

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.cli.streams import _run_until_stopped
from {{ cookiecutter.package_name }}.devtools.kafka_local import partitions_with_leaders
from {{ cookiecutter.package_name }}.devtools.sample import produce, sample_records
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import GOLD, GOLD_SCHEMA, Lakehouse
from {{ cookiecutter.package_name }}.pipeline.egress import Target, target_stream
from {{ cookiecutter.package_name }}.pipeline.egress.kafka import (
    COORDINATOR_BUSY,
    EgressError,
    KafkaEgress,
    KafkaEgressSettings,
    ProducerLost,
    audit_errors,
    read_back,
    settings,
)
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config, describe_topic
from {{ cookiecutter.package_name }}.pipeline.recovery.checkpoints import REWRITE_TOLERANCE_MS, CheckpointError
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import AFTER_PRE_COMMIT, AFTER_SINK_COMMIT, CRASH_POINT_VAR
from {{ cookiecutter.package_name }}.pipeline.streams import start_stream

EGRESS = "kafka_egress"
LAYERS = ("bronze", "silver", "gold")
EVENT_START = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
KEY_FIELDS = {"window_start", "window_end", "event_type"}


class Record(NamedTuple):
    key: str | None
    value: str | None
    partition: int
    offset: int
    stream_id: str | None  # the lakehouse-stream-id header: which changelog the record belongs to


# --- the oracle -------------------------------------------------------------------------------


def output_topic(bootstrap: str) -> str:
    """A fresh compacted output topic with two partitions, as production provisions it."""
    name = f"gold-changes-{uuid.uuid4().hex[:8]}"
    new = NewTopic(name, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the topic is created
    admin.create_topics([new])[name].result(timeout=30)
    return name


# What a broker answers for a moment after it restarted, before its partitions have their leader again.
NO_LEADER_YET = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def watermarks(consumer: Consumer, partition: TopicPartition, timeout_s: float = 60.0) -> tuple[int, int]:
    """The partition's (low, high) watermarks, asked again while the broker has no leader for it yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=30, cached=False)
        except KafkaException as error:
            if error.args[0].code() not in NO_LEADER_YET or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def fold(bootstrap: str, topic: str, isolation: str, decode=bytes.decode) -> tuple[list[Record], dict[str, str]]:
    """Every record of ``topic`` as ``isolation`` sees it, and the topic folded by key (tombstones delete);
    ``decode`` reads a value's bytes (default: as text)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"oracle-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            # The end as this isolation level sees it: read_committed stops at the last stable offset.
            "enable.partition.eof": True,
        }
    )
    records: list[Record] = []
    try:
        partitions = partitions_with_leaders(consumer, topic)
        ends = {}
        for partition in partitions:
            ends[partition] = watermarks(consumer, TopicPartition(topic, partition))
        pending = {partition for partition, (low, high) in ends.items() if high > low}
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in sorted(pending)])
        deadline = time.monotonic() + 60
        while pending:
            assert time.monotonic() < deadline, f"{topic}: not read to its end offsets {ends} within 60 s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    # read_committed reaches "EOF" at the last stable offset, which stays below the end
                    # until the broker has written the last transaction's markers: done only once past them.
                    [position] = consumer.position([TopicPartition(topic, message.partition())])
                    if position.offset >= ends[message.partition()][1]:
                        pending.discard(message.partition())
                    continue
                raise KafkaException(message.error())
            key, value = message.key(), message.value()
            headers = dict(message.headers() or [])
            records.append(
                Record(
                    None if key is None else key.decode(),
                    None if value is None else decode(value),
                    message.partition(),
                    message.offset(),
                    headers["lakehouse-stream-id"].decode() if "lakehouse-stream-id" in headers else None,
                )
            )
            if message.offset() + 1 >= ends[message.partition()][1]:
                pending.discard(message.partition())
    finally:
        consumer.close()
    records.sort(key=lambda record: (record.partition, record.offset))
    state: dict[str, str] = {}
    partition_of: dict[str, int] = {}
    for record in records:
        assert record.key is not None, f"a record without a key: {record}"
        # One key, one partition: offset order within it is the order of the key's changes.
        assert partition_of.setdefault(record.key, record.partition) == record.partition, record
        if record.value is None:
            state.pop(record.key, None)
        else:
            state[record.key] = record.value
    return records, state


def instant(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    assert moment.tzinfo is not None, f"a timestamp without its offset: {text!r}"
    return moment.astimezone(UTC)


def gold_key(key_json: str) -> tuple:
    key = json.loads(key_json)
    assert set(key) == KEY_FIELDS, key
    return instant(key["window_start"]), instant(key["window_end"]), key["event_type"]


def value_of(value_json: str) -> dict:
    return json.loads(value_json, parse_float=Decimal)


def topic_rows(state: dict[str, str]) -> dict[tuple, tuple]:
    """The folded topic as {(window_start, window_end, event_type): (event_count, amount_sum)}."""
    rows = {}
    for key_json, value_json in state.items():
        key, value = gold_key(key_json), value_of(value_json)
        # The value repeats the key's fields: it must name the same row.
        assert (instant(value["window_start"]), instant(value["window_end"]), value["event_type"]) == key, value
        assert isinstance(value["event_count"], int), value
        assert isinstance(value["amount_sum"], (int, Decimal)), value
        rows[key] = (value["event_count"], Decimal(value["amount_sum"]))
    return rows


def topic_versions(state: dict[str, str]) -> dict[tuple, int]:
    return {gold_key(key): value_of(value)["gold_version"] for key, value in state.items()}


def gold_rows(spark, path: str) -> dict[tuple, tuple]:
    """Gold as Spark reads it, windows as UTC instants."""

    def utc(micros: int) -> datetime:
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)

    columns = ("unix_micros(window_start) AS ws", "unix_micros(window_end) AS we", "event_type", "event_count")
    rows = spark.read.format("delta").load(path).selectExpr(*columns, "amount_sum").collect()
    return {(utc(row.ws), utc(row.we), row.event_type): (row.event_count, row.amount_sum) for row in rows}


def assert_each_version_once(records: list[Record]) -> None:
    """Each (key, gold_version) at most once in each stream id's changelog: no batch was published twice
    (a reset's new stream id publishes gold's rows again, as a changelog of its own)."""
    seen = Counter(
        (r.stream_id, gold_key(r.key), value_of(r.value)["gold_version"]) for r in records if r.value is not None
    )
    doubled = {pair: count for pair, count in seen.items() if count > 1}
    assert not doubled, f"published more than once: {doubled}"


def marker(bootstrap: str, topic: str, stream_id: str) -> int | None:
    """The offset committed on partition 0 by the stream's consumer group: the next batch id; None when none."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"lakehouse-egress-{stream_id}", "enable.auto.commit": False}
    )
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                [found] = consumer.committed([TopicPartition(topic, 0)], timeout=30)
                break
            except KafkaException as error:
                # A broker just restarted answers "not coordinator" (or "loading") until it has loaded
                # the group's coordinator: asked again, as the egress asks, not a finding.
                transient = error.args[0].code() in COORDINATOR_BUSY or error.args[0].retriable()
                if not transient or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        consumer.close()
    assert found.error is None, found.error
    return found.offset if found.offset >= 0 else None


# --- the pipeline under test ------------------------------------------------------------------


def recreate_topic(admin: AdminClient, topic: str) -> None:
    """Create ``topic`` again, compacted, once the broker has finished deleting it; returns once the broker's
    metadata has it (the controller creates it first: on a busy machine a client asking at once is told
    it does not exist)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            again = NewTopic(topic, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
            admin.create_topics([again])[topic].result(timeout=30)
            break
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while True:
        found = admin.list_topics(topic, timeout=30).topics.get(topic)
        if found is not None and found.error is None and len(found.partitions) == 2:
            return
        assert time.monotonic() < deadline, f"the broker's metadata does not have {topic} again within 60 s"
        time.sleep(0.2)


def with_egress(config, topic: str):
    return config.model_copy(update={"egress": {EGRESS: KafkaEgressSettings(topic=topic)}})


def produce_sample(config, count: int, seed: int) -> None:
    records = sample_records(count, seed, start=EVENT_START, prefix=f"k{seed}")
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=100)


def run(spark, config, *layers: str) -> None:
    for layer in layers:
        start_stream(spark, config, layer, available_now=True).awaitTermination()


def gold_path(config) -> str:
    return Lakehouse(config.lakehouse_root).table(GOLD)


def checkpoint(config, stream: str = EGRESS) -> Path:
    return Path(Lakehouse(config.lakehouse_root).checkpoint(stream))


def stream_id(config) -> str:
    return json.loads((checkpoint(config) / "metadata").read_text().splitlines()[0])["id"]


def batches(config, log: str) -> list[int]:
    return sorted(int(path.name) for path in (checkpoint(config) / log).glob("[0-9]*"))


def assert_topic_is_gold(spark, config, topic: str) -> list[Record]:
    """read_committed, folded, equals gold; each gold version published once per stream id, and every
    record names the stream id that published it; returns the committed records."""
    records, state = fold(config.kafka.bootstrap_servers, topic, "read_committed")
    gold = gold_rows(spark, gold_path(config))
    assert topic_rows(state) == gold
    assert_each_version_once(records)
    assert all(record.stream_id for record in records), [record for record in records if not record.stream_id]
    return records


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def pipeline_vars(config, topic: str) -> dict[str, str]:
    """The environment of the command line for this test's broker, lakehouse and output topic."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_EGRESS": "egress_kafka",
        "EGRESS_KAFKA_TOPIC": topic,
    }


def cli_env(config, topic: str, **extra: str) -> dict:
    return {**os.environ, **pipeline_vars(config, topic), **extra}


def in_process_cli(monkeypatch, config, topic: str):
    """The command line's main() in this process (its Spark session is the tests'), on this test's setup."""
    for name, value in pipeline_vars(config, topic).items():
        monkeypatch.setenv(name, value)
    return main


def wait_until(condition, timeout_s: float = 120.0) -> bool:
    """Ask ``condition`` every half second until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def tiny_gold(spark, path: str, rows: int = 3) -> None:
    """A gold table with its change data feed: version 0 created, version 1 ``rows`` windows."""
    DeltaTable.createIfNotExists(spark).location(path).addColumns(GOLD_SCHEMA).property(
        "delta.enableChangeDataFeed", "true"
    ).execute()
    data = [
        (
            EVENT_START + timedelta(minutes=i),
            EVENT_START + timedelta(minutes=i + 1),
            "purchase",
            i + 1,
            Decimal(f"{i * 10 + 1}.25"),
        )
        for i in range(rows)
    ]
    spark.createDataFrame(data, GOLD_SCHEMA).write.format("delta").mode("append").save(path)


def change_feed(spark, path: str, starting_version: int):
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", starting_version)
        .load(path)
    )


# --- end to end -------------------------------------------------------------------------------


def test_topic_folds_to_gold_and_a_rerun_publishes_only_the_changed_rows(spark, config, kafka_bootstrap):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    produce_sample(config, 300, seed=11)

    run(spark, config, *LAYERS, EGRESS)

    first = assert_topic_is_gold(spark, config, out)
    assert first and all(record.value is not None for record in first)
    sid = stream_id(config)
    assert marker(kafka_bootstrap, out, sid) == batches(config, "commits")[-1] + 1
    _, state = fold(kafka_bootstrap, out, "read_committed")
    gold_before, versions_before = topic_rows(state), topic_versions(state)

    # Same event-time range: most windows get more events, so gold updates them.
    produce_sample(config, 150, seed=12)
    run(spark, config, *LAYERS, EGRESS)

    second = assert_topic_is_gold(spark, config, out)
    assert set(first) <= set(second)
    assert marker(kafka_bootstrap, out, sid) == batches(config, "commits")[-1] + 1
    _, state = fold(kafka_bootstrap, out, "read_committed")
    gold_after, versions_after = topic_rows(state), topic_versions(state)
    changed = {key for key in gold_after if gold_before.get(key) != gold_after[key]}
    assert changed
    for key in gold_after:
        if key in changed and key in versions_before:
            assert versions_after[key] > versions_before[key], key
        elif key not in changed:
            assert versions_after[key] == versions_before[key], key
    # The rerun published each changed row once and nothing else.
    assert len(second) - len(first) == len(changed)


def test_an_avro_changelog_reads_as_gold_with_confluents_deserializer_and_a_refusing_subject_has_a_way_out(
    spark, config, kafka_bootstrap, schema_registry, monkeypatch
):
    out = output_topic(kafka_bootstrap)
    registry = config.schema_registry.model_copy(update={"url": schema_registry})
    egress = KafkaEgressSettings(topic=out, value_format="avro")
    config = config.model_copy(update={"egress": {EGRESS: egress}, "schema_registry": registry})
    produce_sample(config, 300, seed=21)

    run(spark, config, *LAYERS, EGRESS)

    # Read as any consumer of the topic reads it: confluent-kafka's AvroDeserializer, through the registry.
    client = SchemaRegistryClient({"url": schema_registry})
    deserializer = AvroDeserializer(client)
    context = SerializationContext(out, MessageField.VALUE)
    records, state = fold(kafka_bootstrap, out, "read_committed", lambda raw: (raw, deserializer(raw, context)))
    registered = client.get_latest_version(f"{out}-value").schema_id
    assert records and {int.from_bytes(raw[1:5], "big") for raw, _ in (r.value for r in records)} == {registered}
    rows = {}
    for key_json, (_, value) in state.items():
        key = gold_key(key_json)
        assert (value["window_start"], value["window_end"], value["event_type"]) == key, value
        rows[key] = (value["event_count"], value["amount_sum"])
    assert rows == gold_rows(spark, gold_path(config))
    assert all(isinstance(value["amount_sum"], Decimal) for _, value in state.values())
    # The pipeline's own reading of the topic (show, the audit) agrees, and finds no version published twice.
    columns = ("unix_micros(window_start) AS ws", "unix_micros(window_end) AS we", "event_type", "event_count")
    read = read_back(spark, config).selectExpr(*columns, "amount_sum").collect()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    at = {(epoch + timedelta(microseconds=r.ws), epoch + timedelta(microseconds=r.we), r.event_type) for r in read}
    assert at == set(rows) and sorted((r.event_count, r.amount_sum) for r in read) == sorted(rows.values())
    assert audit_errors(spark, config) == {"kafka_egress_records_repeating_a_gold_version": 0}

    # A subject whose compatibility rule refuses the gold's published columns: the start stops, naming it.
    refusing = output_topic(kafka_bootstrap)
    subject = f"{refusing}-value"
    other = {"type": "record", "name": "gold_event_windows", "fields": [{"name": "window_start", "type": "string"}]}
    client.register_schema(subject, Schema(json.dumps(other), "AVRO"))
    client.set_compatibility(subject, "FULL")
    refused = config.model_copy(update={"egress": {EGRESS: KafkaEgressSettings(topic=refusing, value_format="avro")}})
    with pytest.raises(ConfigError, match=rf"^egress_kafka\.value_format: avro: subject {subject} \(FULL compat"):
        start_stream(spark, refused, EGRESS, available_now=True)
    # No registry named: refused at the same place, naming the setting to set.
    unnamed = refused.model_copy(update={"schema_registry": config.schema_registry.model_copy(update={"url": ""})})
    with pytest.raises(ConfigError, match=r"^egress_kafka\.value_format: avro names its schemas in a registry"):
        start_stream(spark, unnamed, EGRESS, available_now=True)

    # The way out the refusal names, from the command line: a new topic, then a reset of the egress. Its new
    # stream publishes the whole gold there, under the new topic's subject, read back by the deserializer.
    moved = output_topic(kafka_bootstrap)
    cli_main = in_process_cli(monkeypatch, config, moved)
    monkeypatch.setenv("EGRESS_KAFKA_VALUE_FORMAT", "avro")
    monkeypatch.setenv("SCHEMA_REGISTRY_URL", schema_registry)
    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    moved_context = SerializationContext(moved, MessageField.VALUE)
    moved_records, moved_state = fold(
        kafka_bootstrap, moved, "read_committed", lambda raw: (raw, deserializer(raw, moved_context))
    )
    moved_id = client.get_latest_version(f"{moved}-value").schema_id
    assert {int.from_bytes(raw[1:5], "big") for raw, _ in (record.value for record in moved_records)} == {moved_id}
    moved_rows = {gold_key(key): (value["event_count"], value["amount_sum"]) for key, (_, value) in moved_state.items()}
    assert moved_rows == rows == gold_rows(spark, gold_path(config))
    moved_config = config.model_copy(update={"egress": {EGRESS: KafkaEgressSettings(topic=moved, value_format="avro")}})
    assert audit_errors(spark, moved_config) == {"kafka_egress_records_repeating_a_gold_version": 0}


def test_gold_rebuilt_by_a_reset_is_republished_whole_without_a_tombstone_for_a_kept_row(
    spark, config, kafka_bootstrap, monkeypatch
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    produce_sample(config, 200, seed=21)
    run(spark, config, *LAYERS, EGRESS)
    before = assert_topic_is_gold(spark, config, out)
    rows_before = gold_rows(spark, gold_path(config))

    # The reset rebuilds gold aside and swaps it in: one commit deletes every row and inserts it again.
    assert cli_main(["checkpoints", "reset", "gold", "--yes"]) == 0
    assert gold_rows(spark, gold_path(config)) == rows_before
    run(spark, config, EGRESS)

    rebuilt = assert_topic_is_gold(spark, config, out)
    republished = [record for record in rebuilt if record not in set(before)]
    # The insert of a row wins over its delete in the same version: no tombstone, the row again.
    assert all(record.value is not None for record in republished)
    assert sorted(record.key for record in republished) == sorted({record.key for record in before})

    # Gold's new stream goes on after the silver it was rebuilt from; the egress follows.
    produce_sample(config, 60, seed=22)
    run(spark, config, *LAYERS, EGRESS)
    assert_topic_is_gold(spark, config, out)
    assert gold_rows(spark, gold_path(config)) != rows_before


# --- crash points, through the command line ---------------------------------------------------


def test_a_gold_version_of_more_than_a_thousand_files_is_published_in_one_batch(
    spark, config, kafka_bootstrap, gold_in_files
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    # More files than Delta's source admits per batch by default (1,000): the snapshot a new
    # stream id starts from, then a rebuild's overwrite (every file removed, every row added again).
    gold_in_files(spark, gold_path(config), windows=1002, files=1002)
    run(spark, config, EGRESS)
    assert batches(config, "commits") == [0]
    assert_topic_is_gold(spark, config, out)

    gold_in_files(spark, gold_path(config), windows=952, files=952, mode="overwrite", bump=1)
    run(spark, config, EGRESS)

    # One batch: in two, a row's delete and its new insert would be folded apart, and a tombstone
    # published for a row gold still holds.
    assert batches(config, "commits") == [0, 1]
    records = assert_topic_is_gold(spark, config, out)
    assert [record.value for record in records].count(None) == 50  # the 50 windows the rebuild dropped


@pytest.mark.faults
def test_crash_points_in_the_egress_neither_lose_nor_double_a_batch(spark, config, kafka_bootstrap):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    produce_sample(config, 200, seed=31)

    # 1. Killed between produce+flush and the commit: the records are in the log, invisible.
    crash_at = f"{EGRESS}:{AFTER_PRE_COMMIT}:0"
    crashed = cli("run", "--layer", "all", "--available-now", env=cli_env(config, out, **{CRASH_POINT_VAR: crash_at}))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert f"crash point {crash_at}" in crashed.stderr
    gold = gold_rows(spark, gold_path(config))
    assert gold
    uncommitted, uncommitted_state = fold(kafka_bootstrap, out, "read_uncommitted")
    assert topic_rows(uncommitted_state) == gold
    assert len(uncommitted) == len(gold)
    committed, _ = fold(kafka_bootstrap, out, "read_committed")
    assert committed == []
    sid = stream_id(config)
    assert marker(kafka_bootstrap, out, sid) is None
    assert batches(config, "offsets") == [0] and batches(config, "commits") == []

    # 2. The restart fences the dead producer (its transaction is aborted) and publishes batch 0
    #    again; this time killed after the Kafka commit, before Spark's commit log. The layers
    #    above have nothing new from here on: only the egress is run.
    crash_at = f"{EGRESS}:{AFTER_SINK_COMMIT}:0"
    crashed = cli("run", "--layer", EGRESS, "--available-now", env=cli_env(config, out, **{CRASH_POINT_VAR: crash_at}))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert f"crash point {crash_at}" in crashed.stderr
    committed = assert_topic_is_gold(spark, config, out)
    assert len(committed) == len(gold)
    aborted = {(record.partition, record.offset) for record in uncommitted}
    assert not aborted & {(record.partition, record.offset) for record in committed}
    everything, _ = fold(kafka_bootstrap, out, "read_uncommitted")
    assert len(everything) == len(uncommitted) + len(committed)
    assert marker(kafka_bootstrap, out, sid) == 1
    assert batches(config, "offsets") == [0] and batches(config, "commits") == []

    # 3. A clean run replays batch 0: the marker shows it committed, nothing is published.
    recovered = cli("run", "--layer", EGRESS, "--available-now", env=cli_env(config, out))
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert assert_topic_is_gold(spark, config, out) == committed
    assert marker(kafka_bootstrap, out, sid) == 1
    assert batches(config, "commits") == [0]
    assert stream_id(config) == sid


# --- the egress object: fencing and an unknown commit outcome ----------------------------------


def test_a_second_egress_of_the_same_stream_fences_the_first_and_aborts_its_transaction(
    spark, config, kafka_bootstrap, tmp_path
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())

    first = KafkaEgress(config, settings(config), sid)
    second = None
    try:
        first.producer.begin_transaction()
        for number in range(3):
            first.producer.produce(out, key=f"open-{number}".encode(), value=b"never visible")
        first.producer.flush(30)
        assert len(fold(kafka_bootstrap, out, "read_uncommitted")[0]) == 3

        second = KafkaEgress(config, settings(config), sid)

        # The open transaction was aborted when the second one started: read_committed sees nothing.
        assert fold(kafka_bootstrap, out, "read_committed")[0] == []
        with pytest.raises(KafkaException) as commit:
            first.producer.commit_transaction(30)
        error = commit.value.args[0]
        assert error.fatal() and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
        with pytest.raises(KafkaException) as publish:
            first.publish(change_feed(spark, gold, 0), batch_id=0)
        assert publish.value.args[0].fatal(), publish.value

        assert second.publish(change_feed(spark, gold, 0), batch_id=0) == 3
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert topic_rows(state) == gold_rows(spark, gold)
        assert len(records) == 3 and all(not record.key.startswith("open-") for record in records)
        assert marker(kafka_bootstrap, out, sid) == 1
    finally:
        with contextlib.suppress(KafkaException):  # a fenced producer fails its flush too
            first.close()
        if second is not None:
            second.close()


def test_a_reset_fences_the_old_stream_so_a_transaction_it_left_open_never_becomes_visible(
    spark, config, kafka_bootstrap, monkeypatch
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    tiny_gold(spark, gold_path(config), rows=3)
    run(spark, config, EGRESS)
    old_id = stream_id(config)
    # A process of the old stream that stood still past its lease inside a batch: records produced
    # in its open transaction, the commit not yet sent.
    frozen = KafkaEgress(config, settings(config), old_id)
    try:
        frozen.producer.begin_transaction()
        for number in range(3):
            frozen.producer.produce(out, key=f"stale-{number}".encode(), value=b"from the old stream")
        frozen.producer.flush(30)

        assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0

        # It wakes and commits: fenced by the reset, nothing of it becomes visible.
        with pytest.raises(KafkaException) as commit:
            frozen.producer.commit_transaction(30)
        error = commit.value.args[0]
        assert error.fatal() and error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), error
    finally:
        with contextlib.suppress(KafkaException):
            frozen.close()
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    records = assert_topic_is_gold(spark, config, out)
    assert not any(record.key.startswith("stale-") for record in records)


class BrokerFrozenDuringFirstCommit:
    """The egress's real producer, with the real broker stopped (SIGSTOP) while its first commit is in flight.

    The commit request reaches the broker's socket but is answered only once the broker is
    continued, after the call's own timeout: an outcome the producer cannot know, every time
    (a short timeout alone races a fast local broker). The broker is continued when that call
    returns, not after a fixed time: on a busy machine a timer could fire before the call began.
    """

    def __init__(self, producer, broker_pid: int):
        self._producer = producer
        self._pid = broker_pid
        self.commits = 0

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def commit_transaction(self, timeout_s: float):
        self.commits += 1
        if self.commits > 1:
            return self._producer.commit_transaction(timeout_s)
        os.kill(self._pid, signal.SIGSTOP)
        try:
            return self._producer.commit_transaction(timeout_s)
        finally:
            # Whatever the call raised: the session's broker is never left stopped.
            os.kill(self._pid, signal.SIGCONT)


def test_a_commit_that_times_out_is_resolved_through_the_marker(
    spark, config, kafka_broker, kafka_bootstrap, tmp_path, caplog
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())
    egress = KafkaEgress(config, settings(config), sid, commit_timeout_s=0.2)
    frozen = BrokerFrozenDuringFirstCommit(egress.producer, kafka_broker.status()["pid"])
    egress.producer = frozen
    logger = "{{ cookiecutter.package_name }}.pipeline.egress.kafka"
    try:
        with caplog.at_level(logging.WARNING, logger=logger):
            assert egress.publish(change_feed(spark, gold, 0), batch_id=0) == 3
        timed_out = [r.getMessage() for r in caplog.records if "timed out" in r.getMessage()]
        assert timed_out, "a commit sent to a stopped broker did not time out"
        assert any("marker shows it committed" in message for message in timed_out), timed_out
        # One call timed out, one completed it once the marker was read: never a third try.
        assert frozen.commits == 2
        assert marker(kafka_bootstrap, out, sid) == 1
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert len(records) == 3 and topic_rows(state) == gold_rows(spark, gold)

        # The same producer goes on with the next batch after an outcome resolved through the marker.
        DeltaTable.forPath(spark, gold).update("event_count = 1", {"event_count": "event_count + 10"})
        assert egress.publish(change_feed(spark, gold, 2), batch_id=1) == 1
        assert marker(kafka_bootstrap, out, sid) == 2
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert len(records) == 4 and topic_rows(state) == gold_rows(spark, gold)
        assert_each_version_once(records)
        # A replay of a batch the marker shows publishes nothing.
        assert egress.publish(change_feed(spark, gold, 2), batch_id=1) == 0
        assert len(fold(kafka_bootstrap, out, "read_committed")[0]) == 4
    finally:
        egress.close()


class FirstBatch(NamedTuple):
    """An egress on a fresh output topic that published gold's first version (3 rows) as batch 0, and
    gold's next change (one window's count + 10), for batch 1."""

    out: str
    config: object
    gold: str
    sid: str
    egress: KafkaEgress
    changes: object


def after_a_first_batch(spark, config, kafka_bootstrap, tmp_path) -> FirstBatch:
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())
    egress = KafkaEgress(config, settings(config), sid)
    try:
        assert egress.publish(change_feed(spark, gold, 0), batch_id=0) == 3
        DeltaTable.forPath(spark, gold).update("event_count = 1", {"event_count": "event_count + 10"})
    except BaseException:
        egress.close(timeout_s=0)
        raise
    return FirstBatch(out, config, gold, sid, egress, change_feed(spark, gold, 2))


def test_a_batch_right_after_a_broker_restart_fails_unpublished_and_the_next_start_publishes_it_once(
    spark, config, kafka_broker, kafka_bootstrap, tmp_path
):
    out, config, gold, sid, egress, changes = after_a_first_batch(spark, config, kafka_bootstrap, tmp_path)
    restarted = None
    try:
        # The broker restarts between two batches: the producer's cached coordinator is gone (librdkafka's
        # send_offsets_to_transaction waited on it for good). The next batch fails, and publishes nothing.
        kafka_broker.stop(timeout=10)
        kafka_broker.start()
        with pytest.raises(ProducerLost, match="lost a broker connection"):
            egress.publish(changes, batch_id=1)
        assert len(fold(kafka_bootstrap, out, "read_uncommitted")[0]) == 3
        assert marker(kafka_bootstrap, out, sid) == 1

        # The stream's next start: a new producer (the fence), then the marker, then the batch, once.
        restarted = KafkaEgress(config, settings(config), sid)
        assert restarted.publish(changes, batch_id=1) == 1
        assert marker(kafka_bootstrap, out, sid) == 2
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert len(records) == 4 and topic_rows(state) == gold_rows(spark, gold)
    finally:
        egress.close(timeout_s=0)
        if restarted is not None:
            restarted.close()


def test_a_process_that_stood_still_inside_a_batch_and_lost_its_connection_fences_no_one_and_publishes_nothing(
    spark, config, kafka_broker, kafka_bootstrap, tmp_path, monkeypatch
):
    out, config, gold, sid, frozen, changes = after_a_first_batch(spark, config, kafka_bootstrap, tmp_path)
    successor = None
    try:

        def stand_still(marker_read):
            # Batch 1 has checked its lease and read the marker (at batch 0). The process stands still
            # here past its lease; meanwhile its broker connection drops (a broker restart) and another
            # process takes the stream over: its producer fences this one, and it publishes batch 1.
            nonlocal successor
            kafka_broker.stop(timeout=10)
            kafka_broker.start()
            successor = KafkaEgress(config, settings(config), sid)
            assert successor.publish(changes, batch_id=1) == 1
            return KafkaEgress.check_topic(frozen, marker_read)

        monkeypatch.setattr(frozen, "check_topic", stand_still)
        # It wakes: a producer made now would fence the successor and commit batch 1 again, on the
        # strength of the marker read before. The batch fails instead, and publishes nothing.
        with pytest.raises(ProducerLost):
            frozen.publish(changes, batch_id=1)

        # Judged from the topic alone: batch 1 once, and the topic folds to gold.
        assert marker(kafka_bootstrap, out, sid) == 2
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert len(records) == 4 and topic_rows(state) == gold_rows(spark, gold)
        assert_each_version_once(records)
        # No producer was initialised inside the batch: the successor was not fenced and goes on.
        DeltaTable.forPath(spark, gold).update("event_count = 2", {"event_count": "event_count + 10"})
        assert successor.publish(change_feed(spark, gold, 3), batch_id=2) == 1
        assert marker(kafka_bootstrap, out, sid) == 3
        # The stood-still stream's next start replays its batch 1: the marker shows it, nothing is published.
        rerun = KafkaEgress(config, settings(config), sid)
        try:
            assert rerun.publish(changes, batch_id=1) == 0
        finally:
            rerun.close()
        records, state = fold(kafka_bootstrap, out, "read_committed")
        assert len(records) == 5 and topic_rows(state) == gold_rows(spark, gold)
        assert_each_version_once(records)
    finally:
        frozen.close(timeout_s=0)
        if successor is not None:
            with contextlib.suppress(KafkaException):  # fenced by the rerun
                successor.close()


def test_a_continuous_run_starts_the_egress_again_after_a_broker_restart_and_publishes_each_batch_once(
    spark, config, kafka_broker, kafka_bootstrap, capsys
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out).model_copy(update={"trigger_interval": "1 second"})
    tiny_gold(spark, gold_path(config), rows=3)
    stop, ended = threading.Event(), {}

    def run_until_stopped() -> None:
        ended["code"] = _run_until_stopped(spark, config, (EGRESS,), stop)

    runner = threading.Thread(target=run_until_stopped, daemon=True)
    runner.start()
    try:
        assert wait_until(lambda: batches(config, "commits") and marker(kafka_bootstrap, out, stream_id(config)))
        kafka_broker.stop(timeout=10)
        kafka_broker.start()
        DeltaTable.forPath(spark, gold_path(config)).update("event_count = 1", {"event_count": "event_count + 10"})
        # The egress's next batch fails (its producer lost the broker), and the run starts the stream
        # again: a new producer, the marker, the batch published once. The run goes on meanwhile.
        assert wait_until(lambda: marker(kafka_bootstrap, out, stream_id(config)) == 2, timeout_s=240)
        assert runner.is_alive()
    finally:
        stop.set()
        runner.join(timeout=300)
    assert ended == {"code": 0}
    assert f"stream {EGRESS} failed" in capsys.readouterr().err
    records = assert_topic_is_gold(spark, config, out)
    assert len(records) == 4


def test_an_empty_batch_moves_the_marker_and_a_lost_marker_is_refused_before_anything_is_published(
    spark, config, kafka_bootstrap, tmp_path
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())
    egress = KafkaEgress(config, settings(config), sid)
    try:
        assert egress.publish(change_feed(spark, gold, 0), batch_id=0) == 3
        # A batch without a change (gold committed a version of no rows) still moves the marker:
        # the marker says which batch the topic holds, whatever the batch carried.
        assert egress.publish(change_feed(spark, gold, 0).limit(0), batch_id=1) == 0
        assert marker(kafka_bootstrap, out, sid) == 2

        # The marker's consumer group deleted (as an expired one is): batch 2 would be published on
        # a topic that cannot show it holds batch 1. Refused, naming the way out; nothing published.
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_consumer_groups([f"lakehouse-egress-{sid}"])[f"lakehouse-egress-{sid}"].result(timeout=30)
        DeltaTable.forPath(spark, gold).update("event_count = 1", {"event_count": "event_count + 10"})
        lost = rf"topic {out} has no marker for stream {sid} .* batch 2 needs the marker at batch 1.*reset kafka_egress"
        with pytest.raises(CheckpointError, match=lost):
            egress.publish(change_feed(spark, gold, 2), batch_id=2)
        assert len(fold(kafka_bootstrap, out, "read_uncommitted")[0]) == 3
    finally:
        egress.close()


def test_an_output_topic_deleted_under_a_stream_is_refused_naming_the_key_of_its_gold(config, kafka_bootstrap):
    # The first dataset's first gold's topic is `topic`; any other gold's is its entry of `golds`.
    last = DATASETS[-1]
    other = Target(target_stream(EGRESS, last, last.golds[-1]), last, last.golds[-1], output_topic(kafka_bootstrap))
    first = output_topic(kafka_bootstrap)
    config = with_egress(config, first)
    named = {first: "egress_kafka.topic"}
    if other.stream != EGRESS:
        named[other.destination] = f'egress_kafka.golds."{last.name}.{last.golds[-1].name}"'
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for topic, key in named.items():
        egress = KafkaEgress(config, settings(config), str(uuid.uuid4()), None if topic == first else other)
        try:
            admin.delete_topics([topic])[topic].result(timeout=30)
            assert wait_until(lambda topic=topic: describe_topic(config, topic) is None, timeout_s=60)
            with pytest.raises(ConfigError, match=rf"^{re.escape(key)}: topic '{topic}' does not exist$"):
                egress.check_topic(TopicPartition(topic, 0))
        finally:
            egress.close(timeout_s=0)


def test_an_output_topic_created_again_is_refused_and_a_new_stream_publishes_gold_to_it_whole(
    spark, config, kafka_bootstrap, tmp_path
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())
    egress = KafkaEgress(config, settings(config), sid)
    try:
        assert egress.publish(change_feed(spark, gold, 0), batch_id=0) == 3
        published_to = egress._marker(30)
        # The topic deleted and made again under its name: empty, with another id.
        old_id = describe_topic(config, out)[0]
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([out])[out].result(timeout=30)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            new = NewTopic(out, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
            try:
                admin.create_topics([new])[out].result(timeout=30)
                break
            except KafkaException:  # the deletion is still under way
                time.sleep(1)
        # Created is not yet described everywhere: wait until the broker answers with the new id.
        while (described := describe_topic(config, out)) is None or described[0] == old_id:
            assert time.monotonic() < deadline, f"{out} was not described as a new topic within 60 s"
            time.sleep(0.5)
        DeltaTable.forPath(spark, gold).update("event_count = 1", {"event_count": "event_count + 10"})

        # Kafka may drop the marker with the old topic (then: the marker lost); a marker that outlived it
        # names the topic it was committed with. Either way nothing of batch 1 is published.
        with pytest.raises(CheckpointError, match=f"reset {EGRESS}"):
            egress.publish(change_feed(spark, gold, 2), batch_id=1)
        recreated = rf"topic {out} has id .*, but stream {sid} published to the topic of"
        with pytest.raises(CheckpointError, match=recreated):
            egress.check_topic(published_to)
        assert fold(kafka_bootstrap, out, "read_uncommitted")[0] == []
    finally:
        egress.close()

    # The way out, a new stream id (what the reset starts), publishes gold's rows to the new topic whole.
    fresh = KafkaEgress(config, settings(config), str(uuid.uuid4()))
    try:
        assert fresh.publish(change_feed(spark, gold, 0), batch_id=0) == 3
    finally:
        fresh.close()
    assert topic_rows(fold(kafka_bootstrap, out, "read_committed")[1]) == gold_rows(spark, gold)


def test_partitions_added_to_the_output_topic_are_refused_until_a_new_topic_and_a_reset(
    spark, config, kafka_bootstrap, monkeypatch, capsys
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    tiny_gold(spark, gold_path(config), rows=4)
    run(spark, config, EGRESS)
    before = assert_topic_is_gold(spark, config, out)

    # A third partition: a key's next change could land away from its earlier ones.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_partitions([NewPartitions(out, 3)])[out].result(timeout=30)
    DeltaTable.forPath(spark, gold_path(config)).update("event_count = 1", {"event_count": "event_count + 10"})
    capsys.readouterr()
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"topic {out} has 3 partitions, stream {stream_id(config)} published to it with 2" in refusal
    assert "EGRESS_KAFKA_TOPIC" in refusal and f"checkpoints reset {EGRESS}" in refusal
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    # The way out: a new topic, then a reset; gold is published to it whole.
    fresh = output_topic(kafka_bootstrap)
    monkeypatch.setenv("EGRESS_KAFKA_TOPIC", fresh)
    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    assert_topic_is_gold(spark, with_egress(config, fresh), fresh)


def test_a_transaction_open_longer_than_its_timeout_is_refused_naming_the_setting(
    spark, config, kafka_bootstrap, tmp_path, monkeypatch
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold = str(tmp_path / "gold")
    tiny_gold(spark, gold)
    sid = str(uuid.uuid4())
    # The driver stops 6 s inside the transaction (a GC pause, a frozen VM); Kafka aborts a
    # transaction open past 1 s. A replay would be aborted the same way: refused, not retried.
    monkeypatch.setenv(CRASH_POINT_VAR, f"{EGRESS}:{AFTER_PRE_COMMIT}:0:pause=6")
    slow = KafkaEgress(config, KafkaEgressSettings(topic=out, transaction_timeout_ms=1000), sid)
    try:
        with pytest.raises(EgressError, match=r"^egress_kafka\.transaction_timeout_ms: the transaction of batch 0"):
            slow.publish(change_feed(spark, gold, 0), batch_id=0)
    finally:
        with contextlib.suppress(KafkaException):
            slow.close()
    assert fold(kafka_bootstrap, out, "read_committed")[0] == []
    assert marker(kafka_bootstrap, out, sid) is None

    # With a timeout the batch fits in, the same stream id publishes it whole, once.
    monkeypatch.delenv(CRASH_POINT_VAR)
    egress = KafkaEgress(config, settings(config), sid)
    try:
        assert egress.publish(change_feed(spark, gold, 0), batch_id=0) == 3
    finally:
        egress.close()
    records, state = fold(kafka_bootstrap, out, "read_committed")
    assert len(records) == 3 and topic_rows(state) == gold_rows(spark, gold)


# --- the start refusal ------------------------------------------------------------------------


def test_a_checkpoint_behind_the_topic_refuses_to_start_until_the_egress_is_reset(
    spark, config, kafka_bootstrap, monkeypatch, capsys
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    # Any gold with its change feed will do: the egress follows the table, not the layers above.
    tiny_gold(spark, gold_path(config), rows=4)
    run(spark, config, EGRESS)
    before = assert_topic_is_gold(spark, config, out)
    old_id = stream_id(config)
    assert marker(kafka_bootstrap, out, old_id) == 1

    # The checkpoint loses its progress but keeps its id: Spark would plan batch 0 again.
    shutil.rmtree(checkpoint(config) / "offsets")
    shutil.rmtree(checkpoint(config) / "commits")
    capsys.readouterr()
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert "refusing to start" in refusal
    assert f"checkpoints reset {EGRESS}" in refusal
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    # A row gold no longer has: the new changelog must delete it for consumers.
    DeltaTable.forPath(spark, gold_path(config)).delete("event_count = 1")
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0

    # A new stream id: gold's current rows published again, and a tombstone for the deleted one.
    records = assert_topic_is_gold(spark, config, out)
    new_id = stream_id(config)
    assert new_id != old_id
    assert marker(kafka_bootstrap, out, new_id) == batches(config, "commits")[-1] + 1
    published = [record for record in records if record not in set(before)]
    assert len(published) == 4
    assert [record.value for record in published].count(None) == 1
    # Each changelog under its own stream id: a consumer tells the new one from a repeat.
    assert {record.stream_id for record in before} == {old_id}
    assert {record.stream_id for record in published} == {new_id}

    # The output topic deleted and made again: its marker went with it. Refused until a reset, which
    # publishes gold whole to the new topic.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([out])[out].result(timeout=30)
    recreate_topic(admin, out)
    capsys.readouterr()
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    assert f"topic {out} has no marker for stream {new_id}" in capsys.readouterr().err
    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    assert_topic_is_gold(spark, config, out)


def test_an_egress_behind_changes_that_vacuum_removed_is_refused_until_a_reset_which_is_exact(
    spark, config, kafka_bootstrap, monkeypatch, capsys
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    tiny_gold(spark, gold_path(config), rows=4)
    run(spark, config, EGRESS)
    # Gold moves on while the egress is stopped, then VACUUM removes what its change feed is read from.
    gold = DeltaTable.forPath(spark, gold_path(config))
    gold.update("event_count = 2", {"event_count": "20"})
    gold.delete("event_count = 1")
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        gold.vacuum(0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    before = fold(kafka_bootstrap, out, "read_committed")[0]
    capsys.readouterr()

    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"{EGRESS}: it publishes gold's changes from version 2 on" in refusal
    assert "VACUUM or the log's cleanup removed it" in refusal and f"checkpoints reset {EGRESS}" in refusal
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    # The way out: a new stream id publishes gold whole; the deleted row gets its tombstone.
    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    assert_topic_is_gold(spark, config, out)


def test_gold_put_back_behind_the_egress_is_refused_even_once_written_again_until_a_reset_which_is_exact(
    spark, config, kafka_bootstrap, monkeypatch, capsys, tmp_path
):
    # Spark's Delta source fails on a version the table no longer reaches ("non-existent version"); the
    # start refuses first and names the egress's reset. Written again up to that version, gold would let
    # the egress go on after changes it never read: refused all the same.
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    tiny_gold(spark, gold_path(config), rows=4)
    older = tmp_path / "gold-backup"
    shutil.copytree(gold_path(config), older)
    gold = DeltaTable.forPath(spark, gold_path(config))
    gold.update("event_count = 2", {"event_count": "20"})
    gold.delete("event_count = 1")
    run(spark, config, EGRESS)
    shutil.rmtree(gold_path(config))
    shutil.copytree(older, gold_path(config))
    before = fold(kafka_bootstrap, out, "read_committed")[0]
    capsys.readouterr()

    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"{EGRESS}: the stream has read {GOLD} at {gold_path(config)} up to version 3" in refusal
    assert "the table is at version 1: gold was put back from an older copy or replaced" in refusal
    assert f"checkpoints reset {EGRESS}" in refusal
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    # Another history up to version 3, made later than the clocks of two drivers can differ.
    time.sleep(REWRITE_TOLERANCE_MS / 1000)
    gold = DeltaTable.forPath(spark, gold_path(config))
    gold.update("event_count = 3", {"event_count": "30"})
    gold.delete("event_count = 4")
    assert gold.history(1).first()["version"] == 3
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert "up to version 3, but its version 3 was committed at" in refusal
    assert "after the stream read it" in refusal and f"checkpoints reset {EGRESS}" in refusal
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    # The way out: a new stream id publishes gold as it is; the rows the copy brought back are published again.
    assert cli_main(["checkpoints", "reset", EGRESS, "--yes"]) == 0
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    assert_topic_is_gold(spark, config, out)


def test_gold_compacted_between_batches_publishes_nothing_and_the_topic_stays_gold(
    spark, config, kafka_bootstrap, gold_in_files
):
    out = output_topic(kafka_bootstrap)
    config = with_egress(config, out)
    gold_in_files(spark, gold_path(config), windows=12, files=6)
    run(spark, config, EGRESS)
    before = fold(kafka_bootstrap, out, "read_committed")[0]

    # A team's OPTIMIZE: a gold version that rewrites every file and changes no row.
    gold = DeltaTable.forPath(spark, gold_path(config))
    gold.optimize().executeCompaction()
    assert gold.history(1).first().operation == "OPTIMIZE"
    run(spark, config, EGRESS)
    assert fold(kafka_bootstrap, out, "read_committed")[0] == before

    gold.update("event_count = 3", {"event_count": "30"})
    run(spark, config, EGRESS)
    assert_topic_is_gold(spark, config, out)


def test_an_output_topic_that_deletes_by_age_is_refused_at_start_until_it_is_compacted(
    spark, config, kafka_bootstrap, cleanup_policy, monkeypatch, capsys
):
    out = f"gold-changes-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(out, num_partitions=2, replication_factor=1)])[out].result(timeout=30)
    config = with_egress(config, out)
    cli_main = in_process_cli(monkeypatch, config, out)
    tiny_gold(spark, gold_path(config))

    # The broker's default policy, then compaction with deletion by age: both lose keys' newest values.
    for policy in ("delete", "compact,delete"):
        cleanup_policy(config, out, policy)
        capsys.readouterr()
        assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 2
        refusal = capsys.readouterr().err
        assert f"config error: egress_kafka.topic: topic '{out}' has cleanup.policy={policy}" in refusal
        assert f"--entity-name {out} --add-config cleanup.policy=compact" in refusal
        assert "egress_kafka.require_compacted_topic = false" in refusal
        assert fold(kafka_bootstrap, out, "read_uncommitted")[0] == []
        assert not Path(Lakehouse(config.lakehouse_root).checkpoint(EGRESS)).exists()

    # The way out the refusal names: the topic compacted, and gold is published whole.
    cleanup_policy(config, out, "compact")
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0
    assert_topic_is_gold(spark, config, out)

    # Or the check turned off, for a topic no consumer folds from its start.
    cleanup_policy(config, out, "delete")
    monkeypatch.setenv("EGRESS_KAFKA_REQUIRE_COMPACTED_TOPIC", "false")
    assert cli_main(["run", "--layer", EGRESS, "--available-now"]) == 0


def test_an_egress_asked_for_while_it_is_off_is_refused_naming_the_switch(config, pipeline_env, monkeypatch, capsys):
    monkeypatch.setenv("PIPELINE_EGRESS", "none")

    assert main(["run", "--layer", EGRESS, "--available-now"]) == 2
    assert main(["show", EGRESS]) == 2

    err = capsys.readouterr().err
    assert err.count(f"config error: {EGRESS}: is off: its config section is missing or PIPELINE_EGRESS") == 2
    assert not Path(config.lakehouse_root).exists()
