"""Benchmark of the pipeline on this machine, reported as ratios measured in one run.

    <console script> bench [--quick] [--output DIR]

Everything runs on a private Kafka topic (on a broker of its own in a temporary
directory, unless kafka.bootstrap_servers names a real cluster) and private
lakehouse roots, with the project's own streams, sinks and transforms:

1. source ceiling   the Spark Kafka source into the `noop` sink (same options as
                    bronze) and, for context, one plain confluent-kafka consumer;
2. bronze           Kafka -> bronze Delta records/s, and its ratio to (1);
3. silver dedup     one silver MERGE batch into a small and into a big silver table;
4. gold             silver -> gold records/s;
5. fixed overhead   a one-record batch against a steady-state batch, per layer;
6. latency          Kafka timestamp -> marker row visible in silver and gold;
7. exactly-once     the real pipeline against an at-least-once variant of it;
8. recovery         draining a backlog with a SIGKILL half-way against without.

Machines are noisy (and shared ones more so), so each figure is compared with
another measured in the same run; targets are reported, never enforced.
Results: a table on stdout, bench.json and bench.png (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pickle
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from ..devtools.chaos import pending_batches
from ..devtools.sample import EVENT_TYPES
from ..pipeline.config import LOCAL_BOOTSTRAP, SASL_PASSWORD_VAR, SASL_USERNAME_VAR, Config, load_config

# Per-batch phases Spark reports in StreamingQueryProgress.durationMs.
DURATION_KEYS = (
    "triggerExecution",
    "latestOffset",
    "queryPlanning",
    "getBatch",
    "addBatch",
    "walCommit",
    "commitOffsets",
)
MARKER_PREFIX = "bench-marker-"
CHILD_EVENT = "bench_event"
RESULTS_FILE = "bench.json"
PLOT_FILE = "bench.png"


@dataclass(frozen=True)
class Sizes:
    """How big each measurement is. ``None`` takes the value from the pipeline config."""

    records: int  # backlog behind phases 1, 2, 4, 7 and 8
    partitions: int  # of the benchmark topic
    max_offsets_per_trigger: int | None  # bronze batch size
    warmup_records: int  # one small pass through everything first, so the JIT is warm
    silver_batch: int  # rows of the MERGE batch in phase 3
    silver_small_table: int
    silver_big_table: int
    silver_table_commits: int  # appends used to build the big table
    merge_repeats: int
    steady_batch: int | None  # phase 5 steady-state batch (default: the bronze batch size)
    overhead_repeats: int
    overhead_trigger: str
    latency_rate: int  # records/s produced during phase 6
    latency_seconds: float
    latency_trigger: str | None  # default: pipeline.trigger_interval
    marker_every_s: float
    kill_fraction: float  # phase 8 kills the drain this far into the undisturbed drain time
    # Phase 8 in new processes (SIGKILL, cold JVM on restart) or in this one (query.stop(), warm JVM).
    recovery_in_process: bool = False
    timeout_s: float = 1800.0  # any single wait


DEFAULT_SIZES = Sizes(
    records=1_000_000,
    partitions=2,
    max_offsets_per_trigger=None,
    warmup_records=200_000,
    silver_batch=100_000,
    silver_small_table=100_000,
    silver_big_table=10_000_000,
    silver_table_commits=10,
    merge_repeats=3,
    steady_batch=None,
    overhead_repeats=3,
    overhead_trigger="1 second",
    latency_rate=2_000,
    latency_seconds=60.0,
    latency_trigger=None,
    marker_every_s=1.0,
    kill_fraction=0.5,
)
QUICK_SIZES = Sizes(
    records=60_000,
    partitions=2,
    max_offsets_per_trigger=20_000,
    warmup_records=20_000,
    silver_batch=10_000,
    silver_small_table=100_000,
    silver_big_table=1_000_000,
    silver_table_commits=2,
    merge_repeats=2,
    steady_batch=None,
    overhead_repeats=2,
    overhead_trigger="1 second",
    latency_rate=500,
    latency_seconds=15.0,
    latency_trigger="2 seconds",
    marker_every_s=0.5,
    kill_fraction=0.5,
    recovery_in_process=True,
)


@dataclass(frozen=True)
class Target:
    op: str  # ">=" or "<="
    value: float

    def met(self, value: float) -> bool:
        return value >= self.value if self.op == ">=" else value <= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}"


@dataclass
class Metric:
    key: str
    name: str
    value: float
    unit: str
    target: Target | None = None

    @property
    def met(self) -> bool | None:
        return None if self.target is None else self.target.met(self.value)

    def as_dict(self) -> dict:
        return {
            "key": self.key,
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "target": None if self.target is None else str(self.target),
            "met": self.met,
        }


# Every metric key bench.json holds, in table order.
METRIC_KEYS = (
    "kafka_consumer_rps",
    "spark_source_rps",
    "bronze_rps",
    "bronze_vs_source",
    "silver_rps",
    "gold_rps",
    "silver_merge_small_s",
    "silver_merge_big_s",
    "silver_merge_scaling",
    "bronze_one_record_batch_ms",
    "bronze_steady_batch_ms",
    "bronze_fixed_overhead",
    "silver_one_record_batch_ms",
    "silver_steady_batch_ms",
    "silver_fixed_overhead",
    "gold_one_record_batch_ms",
    "gold_steady_batch_ms",
    "gold_fixed_overhead",
    "latency_silver_p50_s",
    "latency_gold_p50_s",
    "latency_gold_p95_s",
    "latency_gold_p50_triggers",
    "latency_gold_p95_triggers",
    "exactly_once_s",
    "at_least_once_s",
    "exactly_once_cost",
    "exactly_once_cost_wall",
    "jvm_start_s",
    "drain_undisturbed_s",
    "drain_killed_s",
    "recovery_cost",
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the `bench` command."""
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes, for CI smoke runs")
    parser.add_argument("--output", default="bench-results", help="directory for bench.json and bench.png")
    parser.add_argument("--keep", action="store_true", help="keep the temporary broker, topics and tables")


def cmd_bench(config: Config, args: argparse.Namespace) -> int:
    """CLI entry: run, print, write. Exit 0 whatever the targets say: they are reported, not enforced."""
    run_bench(config, quick=args.quick, output_dir=Path(args.output), keep=getattr(args, "keep", False))
    return 0


# --------------------------------------------------------------------------- helpers


def _say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _seconds(duration: str) -> float:
    from ..pipeline.config import duration_seconds

    return float(duration_seconds(duration, "bench trigger"))


def _progress(query) -> list[dict]:
    """Every progress the query still holds, as plain dicts."""
    return [json.loads(p.json) for p in query.recentProgress]


def _input_rows(progress: dict) -> int:
    return progress.get("numInputRows", 0)


def _batches(progress: list[dict]) -> list[dict]:
    return [p for p in progress if p.get("numInputRows", 0) > 0]


def _rows_and_ms(progress: list[dict]) -> tuple[int, int]:
    batches = _batches(progress)
    return sum(p["numInputRows"] for p in batches), sum(p["durationMs"].get("triggerExecution", 0) for p in batches)


def _rate(rows: int, ms: float) -> float:
    return rows / (ms / 1000.0) if ms > 0 else 0.0


def _median_durations(batches: list[dict]) -> dict[str, float]:
    return {
        key: statistics.median(p["durationMs"].get(key, 0) for p in batches)
        for key in DURATION_KEYS
        if batches and any(key in p["durationMs"] for p in batches)
    }


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def _await(query, timeout_s: float) -> None:
    if not query.awaitTermination(timeout_s):
        query.stop()
        raise RuntimeError(f"stream {query.name} did not finish within {timeout_s:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(f"stream {query.name} failed: {query.exception()}")


def _stop_all(queries) -> None:
    for query in queries:
        if query.isActive:
            query.stop()


class _ProgressLog:
    """Accumulates the batches of running queries across polls (recentProgress is a bounded buffer)."""

    def __init__(self, queries: dict):
        self.queries = queries
        self.batches: dict[str, dict[tuple, dict]] = {name: {} for name in queries}

    def poll(self) -> None:
        for name, query in self.queries.items():
            if query.exception() is not None:
                raise RuntimeError(f"stream {name} failed: {query.exception()}")
            for p in _progress(query):
                if p.get("numInputRows", 0) > 0:
                    self.batches[name][(p["runId"], p["batchId"])] = p


# --------------------------------------------------------------------------- machine


def machine_info(spark) -> dict:
    import importlib.metadata

    import confluent_kafka

    from ..devtools.kafka_local import KAFKA_VERSION

    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    try:
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gb = float("nan")
    try:
        usable_cores = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cores = os.cpu_count()

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    try:
        java = spark.sparkContext._jvm.System.getProperty("java.version")
    except Exception:  # noqa: BLE001 - informational only
        java = None
    return {
        "cores": os.cpu_count(),
        "usable_cores": usable_cores,
        "memory_gb": round(memory_gb, 1),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "java": java,
        "spark": spark.version,
        "delta": version("delta-spark"),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "kafka_local_broker": KAFKA_VERSION,
        "spark_master": spark.sparkContext.master,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


# --------------------------------------------------------------------------- producing


def _produce_backlog(config: Config, topic: str, count: int, seed: int, malformed_ratio: float = 0.01) -> float:
    """``count`` sample records in the project's transactions of 1000; returns records/s."""
    from ..devtools.sample import produce, sample_records
    from ..pipeline.kafka_io import client_config

    started = time.perf_counter()
    producer = client_config(config, **{"queue.buffering.max.messages": 1_000_000})
    produce(producer, topic, sample_records(count, seed, malformed_ratio, prefix=f"bench{seed}"))
    return count / (time.perf_counter() - started)


def _produce_one_transaction(config: Config, topic: str, count: int, seed: int) -> None:
    from ..devtools.sample import produce, sample_records
    from ..pipeline.kafka_io import client_config

    producer = client_config(config, **{"queue.buffering.max.messages": max(count * 2, 100_000)})
    produce(producer, topic, sample_records(count, seed, prefix=f"bench{seed}"), transaction_size=count)


def _marker(index: int) -> tuple[bytes, bytes]:
    # Its own event_type: a gold row of its own, inserted by exactly one gold commit.
    event = {
        "event_id": f"{MARKER_PREFIX}{index:06d}",
        "event_time": datetime.now(UTC).isoformat(),
        "user_id": "bench-marker",
        "event_type": f"{MARKER_PREFIX}{index:06d}",
        "amount": 1.0,
    }
    return b"bench-marker", json.dumps(event).encode()


def _paced_records(rate: int, seconds: float, transaction_size: int, marker_every: int, stop: threading.Event):
    """Sample records at ``rate``/s; every ``marker_every``-th transaction ends with a marker."""
    from ..devtools.sample import sample_records

    total = int(rate * seconds)
    background = sample_records(total, seed=99, prefix="bench-live")
    started = time.monotonic()
    markers = 0
    for index in range(total):
        if stop.is_set():
            return
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        position = index + 1
        if position % transaction_size == 0 and (position // transaction_size) % marker_every == 0:
            next(background)
            yield _marker(markers)
            markers += 1
        else:
            yield next(background)


# --------------------------------------------------------------------------- environment


class _Bench:
    def __init__(self, config: Config, sizes: Sizes, work: Path):
        self.base_config = config
        self.sizes = sizes
        self.work = work
        self.broker = None
        self.spark = None
        self.own_spark = False
        self.topics: list[str] = []
        self.metrics: dict[str, Metric] = {}
        self.details: dict = {}
        self.kafka = None

    # ---- setup

    def start(self) -> None:
        from ..devtools.kafka_local import LocalKafka
        from ..pipeline.spark import build_spark

        kafka = self.base_config.kafka
        if kafka.bootstrap_servers == LOCAL_BOOTSTRAP:
            _say("starting a private Kafka broker")
            self.broker = LocalKafka(self.work / "kafka")
            bootstrap = self.broker.start()
            kafka = dataclasses.replace(kafka, bootstrap_servers=bootstrap, security_protocol="PLAINTEXT")
            kafka = dataclasses.replace(kafka, sasl_mechanism=None, sasl_username=None, sasl_password=None)
        batch = self.sizes.max_offsets_per_trigger or kafka.max_offsets_per_trigger
        self.kafka = dataclasses.replace(kafka, starting_offsets="earliest", max_offsets_per_trigger=batch)
        _say("starting Spark")
        from pyspark.sql import SparkSession

        self.own_spark = SparkSession.getActiveSession() is None
        self.spark = build_spark(
            "bench",
            master=self.base_config.spark_master,
            shuffle_partitions=self.base_config.shuffle_partitions,
            ui_enabled=False,
            # Only this driver's own settings: the pipeline runs with the project's configuration.
            extra_conf={
                "spark.sql.streaming.numRecentProgressUpdates": "1000",
                "spark.ui.showConsoleProgress": "false",
            },
        )
        if self.own_spark:
            self.spark.sparkContext.setLogLevel("ERROR")

    def stop(self, keep: bool) -> None:
        if self.spark is not None:
            _stop_all(self.spark.streams.active)
            if self.own_spark:
                self.spark.stop()
        if not keep and self.broker is None and self.topics:
            self._delete_topics()
        if self.broker is not None and not keep:
            self.broker.stop()

    def _delete_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        from ..pipeline.kafka_io import client_config

        try:
            admin = AdminClient(client_config(self.config(self.work, self.topics[0])))
            for future in admin.delete_topics(self.topics).values():
                future.result(timeout=30)
        except Exception as error:  # noqa: BLE001 - cleanup is best effort
            _say(f"could not delete the benchmark topics {self.topics}: {error}")

    def config(self, root: Path, topic: str, trigger: str | None = None) -> Config:
        return dataclasses.replace(
            self.base_config,
            lakehouse_root=str(root),
            kafka=dataclasses.replace(self.kafka, topics=(topic,)),
            trigger_interval=trigger or self.base_config.trigger_interval,
        )

    def create_topic(self, name: str) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        from ..pipeline.kafka_io import client_config

        admin = AdminClient(client_config(self.config(self.work, name)))
        admin.create_topics([NewTopic(name, num_partitions=self.sizes.partitions)])[name].result(timeout=30)
        self.topics.append(name)
        return name

    def add(self, key: str, name: str, value: float, unit: str, target: Target | None = None) -> None:
        self.metrics[key] = Metric(key, name, float(value), unit, target)

    # ---- pipeline runs

    def run_layers(self, config: Config, layers=("bronze", "silver", "gold")) -> dict[str, dict]:
        """The real streams, availableNow, layer after layer: wall time and batch progress of each."""
        from ..pipeline.streams import start_stream

        runs = {}
        for layer in layers:
            started = time.perf_counter()
            query = start_stream(self.spark, config, layer, available_now=True)
            _await(query, self.sizes.timeout_s)
            runs[layer] = {"wall_s": time.perf_counter() - started, "progress": _progress(query)}
        return self._with_input_rows(config, runs)

    def table_rows(self, config: Config) -> dict[str, int]:
        """Rows in bronze, silver and quarantine, and the events gold has counted."""
        from pyspark.sql import functions as F

        from ..pipeline.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse

        lakehouse = Lakehouse(config.lakehouse_root)

        def read(name: str):
            return self.spark.read.format("delta").load(lakehouse.table(name))

        return {
            "bronze": read(BRONZE).count(),
            "silver": read(SILVER).count(),
            "quarantine": read(QUARANTINE).count(),
            "gold_events": read(GOLD).agg(F.sum("event_count")).first()[0] or 0,
        }

    def _with_input_rows(self, config: Config, runs: dict[str, dict]) -> dict[str, dict]:
        # Rows each layer read, from the tables: numInputRows of a foreachBatch stream counts
        # every scan of the batch (gold's isEmpty() is one more), so it overstates them.
        rows = self.table_rows(config)
        inputs = {"bronze": rows["bronze"], "silver": rows["bronze"], "gold": rows["silver"]}
        for layer, run in runs.items():
            run["rows"] = inputs[layer]
        return runs

    def run_at_least_once(self, config: Config) -> dict[str, dict]:
        """The same transforms with plain appends: no key dedup, no transaction tags, no stream identity."""
        from delta.tables import DeltaTable

        from ..pipeline.kafka_io import spark_source_options
        from ..pipeline.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse, ensure_tables
        from ..pipeline.transforms import (
            bronze_records,
            parse_events,
            quarantined_records,
            valid_events,
            window_aggregates,
        )

        lakehouse = Lakehouse(config.lakehouse_root)
        ensure_tables(self.spark, lakehouse)
        paths = {name: lakehouse.table(name) for name in (BRONZE, SILVER, QUARANTINE, GOLD)}

        def bronze_batch(rows, batch_id):
            rows.write.format("delta").mode("append").save(paths[BRONZE])

        def silver_batch(rows, batch_id):
            parsed = parse_events(rows).persist()
            try:
                valid_events(parsed).write.format("delta").mode("append").save(paths[SILVER])
                quarantined_records(parsed).write.format("delta").mode("append").save(paths[QUARANTINE])
            finally:
                parsed.unpersist()

        def gold_batch(rows, batch_id):
            # Windows are still upserted (that is what the gold table is), without the tag.
            if rows.isEmpty():
                return
            aggregates = window_aggregates(rows, config.gold_window)
            (
                DeltaTable.forPath(rows.sparkSession, paths[GOLD])
                .alias("t")
                .merge(
                    aggregates.alias("s"),
                    "t.window_start = s.window_start AND t.window_end = s.window_end AND t.event_type = s.event_type",
                )
                .whenMatchedUpdate(
                    set=dict(event_count="t.event_count + s.event_count", amount_sum="t.amount_sum + s.amount_sum")
                )
                .whenNotMatchedInsertAll()
                .execute()
            )

        def delta_source(name):
            return self.spark.readStream.format("delta").load(paths[name])

        kafka_rows = self.spark.readStream.format("kafka").options(**spark_source_options(config)).load()
        plan = (
            ("bronze", bronze_records(kafka_rows), bronze_batch),
            ("silver", None, silver_batch),
            ("gold", None, gold_batch),
        )
        sources = {"silver": BRONZE, "gold": SILVER}
        runs = {}
        for layer, source, write in plan:
            started = time.perf_counter()
            frame = source if source is not None else delta_source(sources[layer])
            query = (
                frame.writeStream.foreachBatch(write)
                .option("checkpointLocation", f"{config.lakehouse_root}/alo-checkpoints/{layer}")
                .queryName(f"alo_{layer}")
                .trigger(availableNow=True)
                .start()
            )
            _await(query, self.sizes.timeout_s)
            runs[layer] = {"wall_s": time.perf_counter() - started, "progress": _progress(query)}
        return self._with_input_rows(config, runs)

    def run_noop(self, config: Config, checkpoint: Path) -> dict:
        from ..pipeline.kafka_io import spark_source_options
        from ..pipeline.transforms import bronze_records

        kafka_rows = self.spark.readStream.format("kafka").options(**spark_source_options(config)).load()
        started = time.perf_counter()
        query = (
            bronze_records(kafka_rows)
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .queryName("bench_source_noop")
            .trigger(availableNow=True)
            .start()
        )
        _await(query, self.sizes.timeout_s)
        return {"wall_s": time.perf_counter() - started, "progress": _progress(query)}

    def consume_plain(self, config: Config, topic: str, expected: int) -> dict:
        """Read the topic once with one confluent-kafka consumer, read_committed."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

        from ..pipeline.kafka_io import client_config

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
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(self.sizes.partitions)])
        records = value_bytes = 0
        at_end: set[int] = set()
        deadline = time.monotonic() + self.sizes.timeout_s
        try:
            while len(at_end) < self.sizes.partitions and time.monotonic() < deadline:
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

    # ---- phases

    def warm_up(self) -> None:
        """A small pass through every code path, so the first measurement does not pay for the JIT."""
        if self.sizes.warmup_records <= 0:
            return
        _say(f"warm-up: {self.sizes.warmup_records:,} records through every stream")
        topic = self.create_topic(f"bench-warmup-{uuid.uuid4().hex[:8]}")
        config = self.config(self.work / "warmup" / "eo", topic)
        _produce_backlog(config, topic, self.sizes.warmup_records, seed=1)
        self.run_noop(config, self.work / "warmup" / "noop")
        self.run_layers(config)
        self.run_at_least_once(self.config(self.work / "warmup" / "alo", topic))
        silver = self._build_silver(self.work / "warmup" / "silver", topic, self.sizes.warmup_records, 1)
        self._time_merge(silver, topic, self.sizes.warmup_records, max(1, self.sizes.warmup_records // 2), "warm", 0)

    def throughput(self, topic: str) -> dict[str, dict]:
        records = self.sizes.records
        config = self.config(self.work / "eo", topic)
        _say(f"phase 1: plain consumer and Spark Kafka source -> noop over {records:,} records")
        plain = self.consume_plain(config, topic, records)
        noops = [self.run_noop(config, self.work / "noop-checkpoint-1")]
        _say("phase 2+4: the real pipeline, bronze -> silver -> gold (availableNow)")
        eo = self.run_layers(config)
        _say("phase 1: the Spark Kafka source -> noop again; the faster run is the ceiling")
        noops.append(self.run_noop(config, self.work / "noop-checkpoint-2"))
        noop = max(noops, key=lambda run: _rate(*_rows_and_ms(run["progress"])))

        source_rows, source_ms = _rows_and_ms(noop["progress"])
        rates = {"source": _rate(source_rows, source_ms)}
        for layer in ("bronze", "silver", "gold"):
            rates[layer] = _rate(eo[layer]["rows"], _rows_and_ms(eo[layer]["progress"])[1])
        self.add(
            "kafka_consumer_rps",
            "plain confluent-kafka consumer, 1 process",
            plain["records"] / plain["seconds"],
            "records/s",
        )
        self.add("spark_source_rps", "Spark Kafka source -> noop (source ceiling)", rates["source"], "records/s")
        self.add("bronze_rps", "Kafka -> bronze Delta", rates["bronze"], "records/s")
        self.add(
            "bronze_vs_source", "bronze / source ceiling", rates["bronze"] / rates["source"], "ratio", Target(">=", 0.7)
        )
        self.add("silver_rps", "bronze -> silver + quarantine", rates["silver"], "records/s")
        self.add("gold_rps", "silver -> gold", rates["gold"], "records/s")
        self.details["throughput"] = {
            "records": records,
            "plain_consumer": plain,
            "noop": _summary(noop),
            "noop_runs_rows_per_s": [_rate(*_rows_and_ms(run["progress"])) for run in noops],
            "exactly_once": {layer: _summary(run) for layer, run in eo.items()},
        }
        return eo

    def exactly_once_cost(self, topic: str, eo: dict[str, dict]) -> None:
        _say("phase 7: the at-least-once variant over the same backlog")
        alo = self.run_at_least_once(self.config(self.work / "alo", topic))
        eo_ms = sum(_rows_and_ms(run["progress"])[1] for run in eo.values())
        alo_ms = sum(_rows_and_ms(run["progress"])[1] for run in alo.values())
        eo_wall = sum(run["wall_s"] for run in eo.values())
        alo_wall = sum(run["wall_s"] for run in alo.values())
        self.add("exactly_once_s", "exactly-once pipeline, batch time", eo_ms / 1000, "s")
        self.add("at_least_once_s", "at-least-once variant, batch time", alo_ms / 1000, "s")
        self.add(
            "exactly_once_cost", "exactly-once / at-least-once (batch time)", eo_ms / alo_ms, "ratio", Target("<=", 1.3)
        )
        self.add(
            "exactly_once_cost_wall", "exactly-once / at-least-once (wall, with starts)", eo_wall / alo_wall, "ratio"
        )
        self.details["exactly_once"] = {
            "exactly_once": {layer: _summary(run) for layer, run in eo.items()},
            "at_least_once": {layer: _summary(run) for layer, run in alo.items()},
            "exactly_once_wall_s": eo_wall,
            "at_least_once_wall_s": alo_wall,
        }

    # phase 3

    def _silver_rows(self, topic: str, first: int, end: int, files: int):
        """Silver rows for Kafka records first..end-1: id -> (partition id % P, offset id div P), so a
        contiguous id range (one file) holds a contiguous offset range in every partition, like a batch."""
        from pyspark.sql import functions as F

        from ..pipeline.tables import AMOUNT_TYPE, SILVER_SCHEMA

        partitions = self.sizes.partitions
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
        frame = self.spark.range(first, end, 1, max(1, files))
        return frame.select(*[columns[field.name].alias(field.name) for field in SILVER_SCHEMA.fields])

    def _build_silver(self, root: Path, topic: str, rows: int, commits: int) -> str:
        from ..pipeline.tables import SILVER, Lakehouse, ensure_tables

        lakehouse = Lakehouse(str(root))
        ensure_tables(self.spark, lakehouse)
        path = lakehouse.table(SILVER)
        per_commit = math.ceil(rows / commits)
        for first in range(0, rows, per_commit):
            end = min(rows, first + per_commit)
            # One file per silver batch worth of rows, in offset order.
            files = math.ceil((end - first) / self.sizes.silver_batch)
            self._silver_rows(topic, first, end, files).write.format("delta").mode("append").save(path)
        return path

    def _time_merge(self, path: str, topic: str, first: int, rows: int, app_id: str, batch_id: int) -> dict:
        from delta.tables import DeltaTable

        from ..pipeline.sinks import insert_new_kafka_records, kafka_key_ranges

        batch = self._silver_rows(topic, first, first + rows, 1).persist()
        try:
            batch.count()
            ranges = kafka_key_ranges(batch)
            files = self._files_in_ranges(path, ranges)
            started = time.perf_counter()
            insert_new_kafka_records(batch, path, ranges, app_id, batch_id)
            seconds = time.perf_counter() - started
        finally:
            batch.unpersist()
        history = DeltaTable.forPath(self.spark, path).history(1).first()
        metrics = {key: int(value) for key, value in (history["operationMetrics"] or {}).items() if value.isdigit()}
        return {"seconds": seconds, "operation": history["operation"], "operation_metrics": metrics, **files}

    def _files_in_ranges(self, path: str, ranges) -> dict[str, int]:
        """Target files before the MERGE, and those whose offset statistics overlap the batch's ranges:
        the files data skipping must keep. (Delta 4.0's history does not report its own skipping counts.)"""
        from pyspark.sql import functions as F

        stats = (
            self.spark.read.json(f"{path}/_delta_log/*.json")
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

    def silver_scaling(self, topic: str) -> None:
        from delta.tables import DeltaTable

        sizes = self.sizes
        tables = {}
        for label, rows in (("small", sizes.silver_small_table), ("big", sizes.silver_big_table)):
            _say(f"phase 3: building a {rows:,}-row silver table")
            started = time.perf_counter()
            commits = max(1, min(sizes.silver_table_commits, math.ceil(rows / sizes.silver_batch)))
            path = self._build_silver(self.work / f"silver-{label}", topic, rows, commits)
            tables[label] = {"path": path, "rows": rows, "next": rows, "build_s": time.perf_counter() - started}
        runs: dict[str, list[dict]] = {"small": [], "big": []}
        for repeat in range(sizes.merge_repeats):
            for label in ("small", "big"):  # interleaved, so drift on a shared machine hits both alike
                table = tables[label]
                step = f"{repeat + 1}/{sizes.merge_repeats}"
                _say(f"phase 3: MERGE {sizes.silver_batch:,} rows into the {label} table ({step})")
                run = self._time_merge(
                    table["path"], topic, table["next"], sizes.silver_batch, f"bench-{label}", repeat
                )
                table["next"] += sizes.silver_batch
                runs[label].append(run)
        small = statistics.median(run["seconds"] for run in runs["small"])
        big = statistics.median(run["seconds"] for run in runs["big"])
        self.add(
            "silver_merge_small_s",
            f"silver MERGE {sizes.silver_batch:,} rows into {sizes.silver_small_table:,}",
            small,
            "s",
        )
        self.add(
            "silver_merge_big_s", f"silver MERGE {sizes.silver_batch:,} rows into {sizes.silver_big_table:,}", big, "s"
        )
        self.add("silver_merge_scaling", "big-table MERGE / small-table MERGE", big / small, "ratio", Target("<=", 1.5))
        for table in tables.values():
            detail = DeltaTable.forPath(self.spark, table["path"]).detail().first()
            table["files"] = detail["numFiles"]
            table["bytes"] = detail["sizeInBytes"]
        self.details["silver_scaling"] = {
            "batch_rows": sizes.silver_batch,
            "tables": {label: {k: v for k, v in table.items() if k != "path"} for label, table in tables.items()},
            "merges": runs,
        }

    # phase 5

    def fixed_overhead(self, topic: str) -> None:
        from ..pipeline.streams import start_stream

        sizes = self.sizes
        steady = sizes.steady_batch or self.kafka.max_offsets_per_trigger
        config = self.config(self.work / "eo", topic, trigger=sizes.overhead_trigger)
        layers = ("bronze", "silver", "gold")
        expected = self.table_rows(config)["bronze"]
        queries = {layer: start_stream(self.spark, config, layer, available_now=False) for layer in layers}
        log = _ProgressLog(queries)
        steps = [steady] * sizes.overhead_repeats + [1] * sizes.overhead_repeats
        per_step = []
        try:
            for step, count in enumerate(steps):
                _say(f"phase 5: a {count:,}-record batch through the running streams ({step + 1}/{len(steps)})")
                log.poll()
                before = {layer: set(log.batches[layer]) for layer in layers}
                _produce_one_transaction(config, topic, count, seed=1000 + step)
                expected += count
                self.wait_settled(config, queries, expected)
                log.poll()
                new = {layer: [p for k, p in log.batches[layer].items() if k not in before[layer]] for layer in layers}
                per_step.append((count, new))
        finally:
            _stop_all(queries.values())
        results = {}
        for layer in layers:
            # The batch of a step that carried it: the largest (a steady step can leave a
            # few records, behind the transaction markers, for a second small batch).
            full = [max(new[layer], key=_input_rows) for count, new in per_step if count == steady and new[layer]]
            single = [max(new[layer], key=_input_rows) for count, new in per_step if count == 1 and new[layer]]
            if not full or not single:
                raise RuntimeError(f"{layer}: no batch seen for some phase-5 step: {per_step}")
            one, full_ms = _median_durations(single), _median_durations(full)
            results[layer] = {
                "steady_ms": full_ms,
                "one_record_ms": one,
                "steady_reported_input_rows": [p["numInputRows"] for p in full],
                "batches_per_step": [len(new[layer]) for _, new in per_step],
            }
            self.add(f"{layer}_one_record_batch_ms", f"{layer}: one-record batch", one["triggerExecution"], "ms")
            self.add(f"{layer}_steady_batch_ms", f"{layer}: {steady:,}-record batch", full_ms["triggerExecution"], "ms")
            self.add(
                f"{layer}_fixed_overhead",
                f"{layer}: one-record / steady batch",
                one["triggerExecution"] / full_ms["triggerExecution"],
                "ratio",
                Target("<=", 0.1),
            )
        self.details["fixed_overhead"] = {"trigger": sizes.overhead_trigger, "steady_batch": steady, "layers": results}

    def wait_settled(self, config: Config, queries: dict, bronze_rows: int) -> dict[str, int]:
        """Until bronze holds ``bronze_rows`` and silver, quarantine and gold have caught up with it.

        Tables are only read while no stream runs a batch, so the checks do not slow the batches.
        """
        deadline = time.monotonic() + self.sizes.timeout_s
        while True:
            for name, query in queries.items():
                if query.exception() is not None:
                    raise RuntimeError(f"stream {name} failed: {query.exception()}")
            if not any(query.status["isTriggerActive"] for query in queries.values()):
                rows = self.table_rows(config)
                if (
                    rows["bronze"] >= bronze_rows
                    and rows["silver"] + rows["quarantine"] >= rows["bronze"]
                    and rows["gold_events"] >= rows["silver"]
                ):
                    return rows
            if time.monotonic() > deadline:
                raise RuntimeError(f"the streams did not catch up with {bronze_rows} bronze rows in time")
            time.sleep(0.25)

    # phase 6

    def latency(self, topic: str) -> None:
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        from ..devtools.sample import produce
        from ..pipeline.kafka_io import client_config
        from ..pipeline.streams import start_stream
        from ..pipeline.tables import GOLD, SILVER, Lakehouse

        sizes = self.sizes
        trigger = sizes.latency_trigger or self.base_config.trigger_interval
        trigger_s = _seconds(trigger)
        config = self.config(self.work / "eo", topic, trigger=trigger)
        lakehouse = Lakehouse(config.lakehouse_root)
        paths = {"silver": lakehouse.table(SILVER), "gold": lakehouse.table(GOLD)}
        first_version = {
            layer: DeltaTable.forPath(self.spark, path).history(1).first()["version"] + 1
            for layer, path in paths.items()
        }
        transaction_size = max(1, sizes.latency_rate // 10)  # a transaction every 100 ms
        marker_every = max(1, round(sizes.marker_every_s * 10))
        expected_markers = int(sizes.latency_rate * sizes.latency_seconds) // (transaction_size * marker_every)
        if expected_markers < 2:
            raise RuntimeError("phase 6 needs at least two markers: raise latency_seconds or latency_rate")
        _say(
            f"phase 6: {sizes.latency_rate:,} records/s for {sizes.latency_seconds:g} s, trigger {trigger}, "
            f"{expected_markers} markers"
        )
        queries = {
            layer: start_stream(self.spark, config, layer, available_now=False)
            for layer in ("bronze", "silver", "gold")
        }
        stop = threading.Event()
        failure: list[BaseException] = []

        def producer() -> None:
            try:
                records = _paced_records(
                    sizes.latency_rate, sizes.latency_seconds, transaction_size, marker_every, stop
                )
                produce(client_config(config), topic, records, transaction_size=transaction_size)
            except BaseException as error:  # noqa: BLE001 - reported by the main thread
                failure.append(error)

        thread = threading.Thread(target=producer, name="bench-producer", daemon=True)
        try:
            thread.start()
            thread.join(sizes.latency_seconds + sizes.timeout_s)
            if failure:
                raise RuntimeError(f"the paced producer failed: {failure[0]}")
            deadline = time.monotonic() + 10 * trigger_s + 300
            gold = self.spark.read.format("delta")
            while True:
                for layer, query in queries.items():
                    if query.exception() is not None:
                        raise RuntimeError(f"stream {layer} failed: {query.exception()}")
                seen = gold.load(paths["gold"]).where(F.col("event_type").startswith(MARKER_PREFIX)).count()
                if seen >= expected_markers:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {seen} of {expected_markers} markers reached gold")
                time.sleep(2.0)
        finally:
            stop.set()
            _stop_all(queries.values())
        live_progress = {layer: _progress(query) for layer, query in queries.items()}

        produced_at = {
            row.event_type: row.ts
            for row in self.spark.read.format("delta")
            .load(paths["silver"])
            .where(F.col("event_id").startswith(MARKER_PREFIX))
            .select("event_type", F.col("kafka_timestamp").cast("double").alias("ts"))
            .collect()
        }
        visible = {layer: self._first_visible(path, first_version[layer]) for layer, path in paths.items()}
        latencies = {
            layer: sorted(seen_at[marker] - produced_at[marker] for marker in produced_at if marker in seen_at)
            for layer, seen_at in visible.items()
        }
        gold_latency = latencies["gold"]
        self.add("latency_silver_p50_s", "Kafka -> silver latency p50", statistics.median(latencies["silver"]), "s")
        self.add("latency_gold_p50_s", "Kafka -> gold latency p50", statistics.median(gold_latency), "s")
        self.add("latency_gold_p95_s", "Kafka -> gold latency p95", _percentile(gold_latency, 0.95), "s")
        self.add(
            "latency_gold_p50_triggers",
            "gold latency p50 / trigger interval",
            statistics.median(gold_latency) / trigger_s,
            "x",
        )
        self.add(
            "latency_gold_p95_triggers",
            "gold latency p95 / trigger interval",
            _percentile(gold_latency, 0.95) / trigger_s,
            "x",
        )
        self.details["latency"] = {
            "trigger": trigger,
            "rate": sizes.latency_rate,
            "seconds": sizes.latency_seconds,
            "markers": len(produced_at),
            "latencies_s": latencies,
            "batches": {layer: _summary({"progress": p}) for layer, p in live_progress.items()},
        }

    def _first_visible(self, path: str, first_version: int) -> dict[str, float]:
        """Marker event_type -> commit time (epoch s) of the first table version that holds it."""
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F

        history = (
            DeltaTable.forPath(self.spark, path)
            .history()
            .where(F.col("version") >= first_version)
            .select("version", F.col("timestamp").cast("double").alias("ts"))
            .orderBy("version")
            .collect()
        )
        seen: dict[str, float] = {}
        for commit in history:
            rows = (
                self.spark.read.format("delta")
                .option("versionAsOf", commit.version)
                .load(path)
                .where(F.col("event_type").startswith(MARKER_PREFIX))
                .select("event_type")
                .collect()
            )
            for row in rows:
                seen.setdefault(row.event_type, commit.ts)
        return seen

    # phase 8

    def recovery(self, topic: str) -> None:
        sizes = self.sizes
        drain = self._drain_in_process if sizes.recovery_in_process else self._drain_process
        where = "in this process" if sizes.recovery_in_process else "in a new process"
        _say(f"phase 8: draining {sizes.records:,} records {where}, undisturbed")
        undisturbed = drain(self.config(self.work / "recovery-undisturbed", topic))
        # Where the undisturbed drain was at kill_fraction of its time: that layer, that far into it.
        # Counted from the layer's start, the kill lands at the same point of the work even when the
        # killed run is faster or slower overall (a shared machine).
        moment = sizes.kill_fraction * undisturbed["drain_s"]
        layer, into = next(
            (name, moment - begin)
            for name, (begin, end) in undisturbed["layer_spans"].items()
            if begin <= moment < end or name == "gold"
        )
        attempts = []
        for attempt in range(3):
            killed_config = self.config(self.work / f"recovery-killed-{attempt}", topic)
            how = "stopped" if sizes.recovery_in_process else "SIGKILLed"
            _say(f"phase 8: the same drain, {how} {into:.1f} s into {layer}, then restarted")
            first = drain(killed_config, kill_at=(layer, into))
            attempts.append(first)
            if first["killed"]:
                break
            into /= 2  # it finished first: this run was faster than the undisturbed one
        else:
            raise RuntimeError("phase 8: every drain finished before the kill")
        pending = pending_batches(Path(killed_config.lakehouse_root) / "checkpoints")
        second = drain(killed_config)
        drained = first["drain_s"] + second["drain_s"]
        if sizes.recovery_in_process:
            _say("phase 8: timing a process + JVM + SparkSession start")
            starts = [self._drain_process(self.config(self.work / "jvm-start", topic), start_only=True)["start_s"]]
        else:
            starts = [undisturbed["start_s"], first["start_s"], second["start_s"]]
        self.add("jvm_start_s", "process + JVM + SparkSession start (median)", statistics.median(starts), "s")
        self.add("drain_undisturbed_s", "drain, undisturbed (without start)", undisturbed["drain_s"], "s")
        self.add("drain_killed_s", "drain killed + restarted (without starts)", drained, "s")
        self.add(
            "recovery_cost", "killed / undisturbed drain", drained / undisturbed["drain_s"], "ratio", Target("<=", 1.25)
        )
        self.details["recovery"] = {
            "mode": "in-process query.stop()" if sizes.recovery_in_process else "SIGKILL of a separate process",
            "records": sizes.records,
            "kill_point": {"layer": layer, "seconds_into_layer": into},
            "undisturbed": undisturbed,
            "killed_run": first,
            "attempts_finished_before_kill": len(attempts) - 1,
            "restarted_run": second,
            "batches_pending_after_kill": pending,
            "process_starts_s": starts,
        }

    def _drain_in_process(self, config: Config, kill_at: tuple[str, float] | None = None) -> dict:
        """Every layer availableNow in this driver; ``kill_at`` stops the running query part-way."""
        from ..pipeline.streams import start_stream
        from ..pipeline.tables import LAYERS

        began = time.time()
        deadline = None
        spans: dict[str, list[float]] = {}
        killed_in = None
        for layer in LAYERS:
            spans[layer] = [time.time() - began, 0.0]
            if kill_at is not None and kill_at[0] == layer:
                deadline = time.time() + kill_at[1]
            query = start_stream(self.spark, config, layer, available_now=True)
            if deadline is None:
                _await(query, self.sizes.timeout_s)
            elif not query.awaitTermination(max(0.0, deadline - time.time())):
                query.stop()  # mid-batch: its offsets are logged, its commit is not
                killed_in = layer
            elif query.exception() is not None:
                raise RuntimeError(f"stream {layer} failed: {query.exception()}")
            spans[layer][1] = time.time() - began
            if killed_in:
                break
        return {
            "start_s": 0.0,
            "drain_s": time.time() - began,
            "finished": killed_in is None,
            "killed": killed_in is not None,
            "killed_in": killed_in,
            "layer_spans": spans,
        }

    def _drain_process(
        self, config: Config, kill_at: tuple[str, float] | None = None, start_only: bool = False
    ) -> dict:
        """Every layer availableNow in a new Python + JVM, as `run --available-now` does.

        ``kill_at`` = (layer, seconds): SIGKILL the process group that long after the layer started.
        """
        spec = self.work / f"drain-{uuid.uuid4().hex[:8]}.pickle"
        stripped = dataclasses.replace(config.kafka, sasl_username=None, sasl_password=None)
        spec.write_bytes(pickle.dumps(dataclasses.replace(config, kafka=stripped)))
        spec.chmod(0o600)
        env = {key: value for key, value in os.environ.items() if key != "PIPELINE_CRASH_POINT"}
        log_path = spec.with_suffix(".log")
        events: list[dict] = []
        with open(log_path, "wb") as log:
            launched = time.time()
            process = subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.bench", "--child-drain", str(spec)]
                + (["--start-only"] if start_only else []),
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
            )
            reader = threading.Thread(target=_read_events, args=(process.stdout, events), daemon=True)
            reader.start()
            killed_at = None
            try:
                deadline = time.monotonic() + self.sizes.timeout_s
                while process.poll() is None and time.monotonic() < deadline:
                    if kill_at is not None:
                        layer, seconds = kill_at
                        began = next((e["t"] for e in list(events) if e.get("layer_start") == layer), None)
                        # Once that layer started, the kill comes at its time, whichever layer then runs.
                        if began is not None and time.time() >= began + seconds:
                            killed_at = time.time()
                            os.killpg(process.pid, signal.SIGKILL)  # the driver and its JVM, without warning
                            break
                    time.sleep(0.05)
            finally:
                if process.poll() is None and killed_at is None:
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                reader.join(10)
        by_name = {e["event"]: e for e in events}
        if "ready" not in by_name:
            raise RuntimeError(f"the drain process never became ready:\n{_tail(log_path)}")
        finished = "done" in by_name
        if killed_at is None and not finished:
            raise RuntimeError(f"the drain process failed (exit {process.returncode}):\n{_tail(log_path)}")
        ready = by_name["ready"]["t"]
        end = killed_at if killed_at is not None else by_name["done"]["t"]
        spans = {}
        for e in events:
            if e["event"] == "layer_start":
                spans[e["layer_start"]] = [e["t"] - ready, end - ready]
            elif e["event"] == "layer_done":
                spans[e["layer"]][1] = e["t"] - ready
        return {
            "start_s": ready - launched,
            "drain_s": end - ready,
            "finished": finished,
            "killed": killed_at is not None,
            "killed_in": None if killed_at is None else next(reversed(spans), None),
            "layer_spans": spans,
        }


def _read_events(stream, events: list[dict]) -> None:
    for line in stream:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.pop(CHILD_EVENT, False):
            events.append(event)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _summary(run: dict) -> dict:
    batches = _batches(run["progress"])
    reported, ms = _rows_and_ms(run["progress"])
    rows = run.get("rows", reported)
    summary = {
        "batches": len(batches),
        "rows": rows,
        "reported_input_rows": reported,
        "batch_ms": ms,
        "rows_per_s": _rate(rows, ms),
        "median_batch_ms": _median_durations(batches),
    }
    if "wall_s" in run:
        summary["wall_s"] = run["wall_s"]
        # Stream start: ensure_tables, checkpoint checks, query start, source initialisation.
        summary["outside_batches_s"] = run["wall_s"] - ms / 1000
    return summary


# --------------------------------------------------------------------------- child process


def _child_drain(spec: Path, start_only: bool = False) -> int:
    """Run every layer availableNow, reporting on stdout: the parent measures and may SIGKILL us."""

    def event(name: str, **fields) -> None:
        fields.update(event=name, t=time.time())
        fields[CHILD_EVENT] = True
        print(json.dumps(fields), flush=True)

    config: Config = pickle.loads(spec.read_bytes())
    if config.kafka.sasl_mechanism:
        secrets = dict(sasl_username=os.environ.get(SASL_USERNAME_VAR), sasl_password=os.environ.get(SASL_PASSWORD_VAR))
        config = dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, **secrets))
    from ..pipeline.spark import build_spark
    from ..pipeline.streams import start_stream
    from ..pipeline.tables import LAYERS

    spark = build_spark(
        "bench-drain",
        master=config.spark_master,
        shuffle_partitions=config.shuffle_partitions,
        ui_enabled=config.spark_ui_enabled,
    )
    spark.sparkContext.setLogLevel("ERROR")
    event("ready")
    if start_only:
        event("done")
        spark.stop()
        return 0
    for layer in LAYERS:
        event("layer_start", layer_start=layer)
        started = time.perf_counter()
        query = start_stream(spark, config, layer, available_now=True)
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"stream {layer} failed: {query.exception()}")
        event("layer_done", layer=layer, seconds=time.perf_counter() - started)
    event("done")
    spark.stop()
    return 0


# --------------------------------------------------------------------------- report


def format_table(metrics: list[Metric]) -> str:
    lines = [f"{'metric':<52} {'value':>14} {'unit':<10} {'target':<8} met", "-" * 92]
    for metric in metrics:
        if metric.unit == "records/s":
            value = f"{metric.value:,.0f}"
        elif metric.unit == "ms":
            value = f"{metric.value:,.0f}"
        else:
            value = f"{metric.value:,.3f}" if metric.value < 10 else f"{metric.value:,.1f}"
        met = "" if metric.met is None else ("yes" if metric.met else "NO")
        target = "" if metric.target is None else str(metric.target)
        lines.append(f"{metric.name:<52} {value:>14} {metric.unit:<10} {target:<8} {met}")
    return "\n".join(lines)


def write_plot(results: dict, path: Path) -> Path | None:
    """bench.png: throughput, ratios against their targets, latency per marker. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: skipping {path.name} (pip install matplotlib)")
        return None
    metrics = {m["key"]: m for m in results["metrics"]}
    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(18, 5.5))

    throughput = [
        ("plain consumer", "kafka_consumer_rps"),
        ("Spark source\n-> noop", "spark_source_rps"),
        ("bronze", "bronze_rps"),
        ("silver", "silver_rps"),
        ("gold", "gold_rps"),
    ]
    left.bar([label for label, _ in throughput], [metrics[key]["value"] for _, key in throughput], color="#4c72b0")
    left.set_title("throughput (records/s)")
    left.tick_params(axis="x", labelsize=8)

    ratios = [m for m in results["metrics"] if m["target"] is not None]
    colors = ["#55a868" if m["met"] else "#c44e52" for m in ratios]
    labels = [m["key"].replace("_", "\n", 1) for m in ratios]
    middle.bar(labels, [m["value"] for m in ratios], color=colors)
    for index, metric in enumerate(ratios):
        target = float(metric["target"].split()[1])
        middle.plot([index - 0.4, index + 0.4], [target, target], color="black", linewidth=2)
    middle.set_title("ratios (bar) against targets (black line); green = met")
    middle.tick_params(axis="x", labelsize=7, rotation=30)

    latency = results["details"].get("latency", {})
    for layer, values in latency.get("latencies_s", {}).items():
        right.plot(range(len(values)), values, marker=".", linestyle="", label=layer)
    trigger = latency.get("trigger")
    if trigger:
        seconds = _seconds(trigger)
        for multiple in (1, 2, 3):
            right.axhline(multiple * seconds, color="grey", linewidth=0.5, linestyle="--")
    right.set_title(f"Kafka -> visible latency per marker, sorted (trigger {trigger})")
    right.set_ylabel("s")
    right.legend()

    machine = results["machine"]
    figure.suptitle(
        f"{results['mode']} run on {machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}; "
        f"Spark {machine['spark']}, Delta {machine['delta']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# --------------------------------------------------------------------------- entry points


def run_bench(
    config: Config,
    quick: bool = False,
    output_dir: Path | str = "bench-results",
    sizes: Sizes | None = None,
    keep: bool = False,
    phases: tuple[str, ...] | None = None,
) -> dict:
    """Run every measurement, print the table, write bench.json (+ bench.png); return the results.

    ``sizes`` replaces the default or quick sizes; ``phases`` (a subset of PHASES) is for development.
    """
    sizes = sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)
    phases = tuple(phases or PHASES)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    bench = _Bench(config, sizes, work)
    started = time.monotonic()
    try:
        bench.start()
        machine = machine_info(bench.spark)
        _say(f"machine: {machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}")
        bench.warm_up()
        topic = bench.create_topic(f"bench-{uuid.uuid4().hex[:8]}")
        main_config = bench.config(work / "eo", topic)
        _say(f"producing {sizes.records:,} sample records in transactions")
        produce_rate = _produce_backlog(main_config, topic, sizes.records, seed=7)
        bench.details["produce_records_per_s"] = produce_rate
        eo = None
        if "throughput" in phases:
            eo = bench.throughput(topic)
        if "exactly_once" in phases and eo is not None:
            bench.exactly_once_cost(topic, eo)
        if "recovery" in phases:
            bench.recovery(topic)
        if "silver_scaling" in phases:
            bench.silver_scaling(topic)
        if eo is None and {"fixed_overhead", "latency"} & set(phases):
            bench.run_layers(main_config)  # phases 5 and 6 continue a drained pipeline
        if "fixed_overhead" in phases:
            bench.fixed_overhead(topic)
        if "latency" in phases:
            bench.latency(topic)
        machine["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    finally:
        bench.stop(keep)
        if keep:
            _say(f"kept the work directory {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    metrics = [bench.metrics[key] for key in METRIC_KEYS if key in bench.metrics]
    results = {
        "mode": "quick" if quick else ("custom" if sizes is not DEFAULT_SIZES else "default"),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "duration_s": time.monotonic() - started,
        "machine": machine,
        "sizes": dataclasses.asdict(sizes),
        "bronze_batch": bench.kafka.max_offsets_per_trigger,
        "metrics": [metric.as_dict() for metric in metrics],
        "details": bench.details,
    }
    print(_header(results))
    print(format_table(metrics))
    missed = [m.name for m in metrics if m.met is False]
    print(
        f"targets met: {sum(1 for m in metrics if m.met)} of {sum(1 for m in metrics if m.target)}"
        + (f"; missed: {'; '.join(missed)}" if missed else "")
    )
    (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2, default=str) + "\n")
    plot = write_plot(results, output_dir / PLOT_FILE)
    print(f"wrote {output_dir / RESULTS_FILE}" + (f" and {plot}" if plot else ""))
    return results


PHASES = ("throughput", "exactly_once", "recovery", "silver_scaling", "fixed_overhead", "latency")


def _header(results: dict) -> str:
    machine = results["machine"]
    sizes = results["sizes"]
    return (
        f"\nbenchmark ({results['mode']}, {results['duration_s']:.0f} s): {machine['cores']} cores "
        f"({machine['usable_cores']} usable), {machine['memory_gb']} GB, {machine['cpu_model']}\n"
        f"Spark {machine['spark']}, Delta {machine['delta']}, Java {machine['java']}, Python {machine['python']}, "
        f"master {machine['spark_master']}, load average {_load(machine.get('load_average_start'))} -> "
        f"{_load(machine.get('load_average_end'))}\n"
        f"backlog {sizes['records']:,} records on {sizes['partitions']} partitions, bronze batch "
        f"{results['bronze_batch']:,}; silver MERGE {sizes['silver_batch']:,} rows into "
        f"{sizes['silver_small_table']:,} vs {sizes['silver_big_table']:,} rows\n"
    )


def _load(values) -> str:
    return "?" if not values else "/".join(f"{v:.1f}" for v in values)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", help="config environment (default: $PIPELINE_ENV or 'local')")
    parser.add_argument("--config", help="config file replacing the packaged one ($PIPELINE_CONFIG)")
    parser.add_argument("--child-drain", help=argparse.SUPPRESS)
    parser.add_argument("--start-only", action="store_true", help=argparse.SUPPRESS)
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.child_drain:
        return _child_drain(Path(args.child_drain), args.start_only)
    return cmd_bench(load_config(args.env, args.config), args)


if __name__ == "__main__":
    sys.exit(main())
