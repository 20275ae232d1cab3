"""Throughput: the source ceiling (Spark Kafka source into `noop`), Spark's built-in Delta sink, a plain
consumer, and each layer's rate."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from ..pipeline.bronze import bronze_records
from ..pipeline.config import Config
from ..pipeline.kafka.clients import client_config, spark_source_options
from .harness import Bench, await_query, progress_of, rate, rows_and_ms, say, summary


def run_noop(bench: Bench, config: Config, checkpoint: Path) -> dict:
    """Bronze's source and record shaping into the `noop` sink: everything bronze does but the Delta write."""
    if not str(checkpoint):
        raise ValueError("run_noop needs a checkpoint directory")
    return _run_source_into(bench, config, "noop", "bench_source_noop", Path(checkpoint), None)


def run_delta_sink(bench: Bench, config: Config, root: Path) -> dict:
    """What a user would write instead of bronze: the same source, record shaping and batch size into
    Spark's built-in Delta sink (``writeStream.format("delta")``), availableNow, table and checkpoint under ``root``."""
    if not str(root):
        raise ValueError("run_delta_sink needs a directory")
    root = Path(root)
    return _run_source_into(bench, config, "delta", "bench_builtin_delta_sink", root / "checkpoint", root / "table")


def _run_source_into(
    bench: Bench, config: Config, sink_format: str, name: str, checkpoint: Path, table: Path | None
) -> dict:
    kafka_rows = bench.spark.readStream.format("kafka").options(**spark_source_options(config)).load()
    started = time.perf_counter()
    writer = (
        bronze_records(kafka_rows)
        .writeStream.format(sink_format)
        .option("checkpointLocation", str(checkpoint))
        .queryName(name)
        .trigger(availableNow=True)
    )
    query = writer.start(str(table)) if table is not None else writer.start()
    await_query(query, bench.sizes.timeout_s)
    return {"wall_s": time.perf_counter() - started, "progress": progress_of(query)}


def consume_plain(bench: Bench, config: Config, topic: str, expected: int) -> dict:
    """Read the topic once with one confluent-kafka consumer, read_committed; at least ``expected`` records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    if expected <= 0:
        raise ValueError(f"expected must be positive, got {expected}")
    partitions = bench.sizes.partitions
    consumer = Consumer(
        client_config(
            config,
            **{
                "group.id": f"bench-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            },
        )
    )
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records = value_bytes = 0
    at_end: set[int] = set()
    deadline = time.monotonic() + bench.sizes.timeout_s
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=10_000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_end.add(message.partition())
                        continue
                    raise RuntimeError(f"consumer error: {error}")
                records += 1
                value_bytes += len(message.value() or b"")
    finally:
        consumer.close()
    elapsed = time.perf_counter() - started
    if records < expected:
        raise RuntimeError(f"the plain consumer read {records} records, {expected} were produced")
    return {"records": records, "value_bytes": value_bytes, "seconds": elapsed}


def measure(bench: Bench, topic: str) -> dict[str, dict]:
    """Source ceiling, plain consumer and the exactly-once pipeline over the backlog; returns the pipeline's runs."""
    records = bench.sizes.records
    config = bench.phase_config(bench.work / "eo", topic)
    say(f"throughput: plain consumer and Spark Kafka source -> noop over {records:,} records")
    plain = consume_plain(bench, config, topic, records)
    noops = [run_noop(bench, config, bench.work / "noop-checkpoint-1")]
    say("throughput: the real pipeline, bronze -> silver -> gold (availableNow)")
    eo = bench.run_layers(config)
    # Twice, around the pipeline run, and the faster one kept: a ceiling is what the
    # source can do, not what one run on a noisy machine did.
    say("throughput: the same source into Spark's built-in Delta sink (availableNow)")
    delta_sink = run_delta_sink(bench, config, bench.work / "builtin-delta-sink")
    say("throughput: the Spark Kafka source -> noop again")
    noops.append(run_noop(bench, config, bench.work / "noop-checkpoint-2"))
    noop = max(noops, key=lambda run: rate(*rows_and_ms(run["progress"])))

    rates = {"source": rate(*rows_and_ms(noop["progress"])), "delta_sink": rate(*rows_and_ms(delta_sink["progress"]))}
    for layer, run in eo.items():
        rates[layer] = rate(run["rows"], rows_and_ms(run["progress"])[1])
    plain_rps = plain["records"] / plain["seconds"]
    bench.add("kafka_consumer_rps", "plain confluent-kafka consumer, 1 process", plain_rps, "records/s")
    bench.add("spark_source_rps", "Spark Kafka source -> noop (source ceiling)", rates["source"], "records/s")
    bench.add("bronze_rps", "Kafka -> bronze Delta", rates["bronze"], "records/s")
    bench.add("bronze_vs_source", "bronze / source ceiling", rates["bronze"] / rates["source"], "ratio")
    bench.add("delta_sink_rps", "Kafka -> Delta, Spark's built-in sink", rates["delta_sink"], "records/s")
    bench.add(
        "bronze_vs_delta_sink",
        "bronze / built-in Delta sink",
        rates["bronze"] / rates["delta_sink"],
        "ratio",
    )
    bench.add("silver_rps", "bronze -> silver + quarantine", rates["silver"], "records/s")
    bench.add("gold_rps", "silver -> gold", rates["gold"], "records/s")
    bench.details["throughput"] = {
        "records": records,
        "plain_consumer": plain,
        "noop": summary(noop),
        "noop_runs_rows_per_s": [rate(*rows_and_ms(run["progress"])) for run in noops],
        "builtin_delta_sink": summary(delta_sink),
        "exactly_once": {layer: summary(run) for layer, run in eo.items()},
    }
    return eo
