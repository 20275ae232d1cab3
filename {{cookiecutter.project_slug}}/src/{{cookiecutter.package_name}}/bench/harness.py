"""The bench environment: a private broker and topics, a SparkSession, per-phase configs, the real streams.

Every measurement module takes a started :class:`Bench` and records its figures with ``Bench.add``.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

from ..pipeline.config import LOCAL_BOOTSTRAP, SASL_KEYS, TLS_KEYS, Config, duration_seconds
from ..pipeline.delta.tables import LAYERS, Lakehouse, ensure_tables
from ..pipeline.delta.writes import Delivery
from .report import Metric, Target
from .sizes import Sizes

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


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def seconds(duration: str) -> float:
    return float(duration_seconds(duration, "bench trigger"))


# --------------------------------------------------------------------------- progress


def progress_of(query) -> list[dict]:
    """Every progress the query still holds, as plain dicts."""
    return [json.loads(p.json) for p in query.recentProgress]


def input_rows(progress: dict) -> int:
    return progress.get("numInputRows", 0)


def batches(progress: list[dict]) -> list[dict]:
    return [p for p in progress if input_rows(p) > 0]


def rows_and_ms(progress: list[dict]) -> tuple[int, int]:
    ran = batches(progress)
    return sum(p["numInputRows"] for p in ran), sum(p["durationMs"].get("triggerExecution", 0) for p in ran)


def rate(rows: int, ms: float) -> float:
    return rows / (ms / 1000.0) if ms > 0 else 0.0


def median_durations(ran: list[dict]) -> dict[str, float]:
    return {
        key: statistics.median(p["durationMs"].get(key, 0) for p in ran)
        for key in DURATION_KEYS
        if ran and any(key in p["durationMs"] for p in ran)
    }


def percentile(values: list[float], fraction: float) -> float:
    if not values or not 0.0 <= fraction <= 1.0:
        raise ValueError(f"percentile needs values and a fraction in [0, 1], got {len(values)} values, {fraction}")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def summary(run: dict) -> dict:
    """A run's batches in a few figures; ``run`` holds "progress" and may hold "rows" and "wall_s"."""
    ran = batches(run["progress"])
    reported, ms = rows_and_ms(run["progress"])
    rows = run.get("rows", reported)
    result = {
        "batches": len(ran),
        "rows": rows,
        "reported_input_rows": reported,
        "batch_ms": ms,
        "rows_per_s": rate(rows, ms),
        "median_batch_ms": median_durations(ran),
    }
    if "wall_s" in run:
        result["wall_s"] = run["wall_s"]
        # Stream start: ensure_tables, checkpoint checks, query start, source initialisation.
        result["outside_batches_s"] = run["wall_s"] - ms / 1000
    return result


def build_table(bench: Bench, root: Path, table: str, first: int, end: int, commits: int, rows_between) -> str:
    """Create the lakehouse tables under ``root`` (the pipeline's own layout) and fill ``table`` with
    ``rows_between(lo, hi)`` for ``first <= lo < hi <= end`` in ``commits`` appends, in order; returns its path."""
    if not first < end or commits <= 0:
        raise ValueError(f"build_table needs first < end and commits > 0, got {first}, {end}, {commits}")
    lakehouse = Lakehouse(str(root))
    ensure_tables(bench.spark, lakehouse)
    path = lakehouse.table(table)
    per_commit = math.ceil((end - first) / commits)
    for low in range(first, end, per_commit):
        rows_between(low, min(end, low + per_commit)).write.format("delta").mode("append").save(path)
    return path


def last_commit(bench: Bench, path: str) -> dict:
    """The operation of the table's newest commit and Delta's numeric metrics of it."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(bench.spark, path).history(1).first()
    metrics = {key: int(value) for key, value in (history["operationMetrics"] or {}).items() if value.isdigit()}
    return {"operation": history["operation"], "operation_metrics": metrics}


def await_query(query, timeout_s: float) -> None:
    if not query.awaitTermination(timeout_s):
        query.stop()
        raise RuntimeError(f"stream {query.name} did not finish within {timeout_s:.0f} s")
    if query.exception() is not None:
        raise RuntimeError(f"stream {query.name} failed: {query.exception()}")


def stop_all(queries) -> None:
    for query in queries:
        if query.isActive:
            query.stop()


def check_running(queries: dict) -> None:
    for name, query in queries.items():
        if query.exception() is not None:
            raise RuntimeError(f"stream {name} failed: {query.exception()}")


class ProgressLog:
    """Accumulates the batches of running queries across polls (recentProgress is a bounded buffer)."""

    def __init__(self, queries: dict):
        self.queries = queries
        self.batches: dict[str, dict[tuple, dict]] = {name: {} for name in queries}

    def poll(self) -> None:
        check_running(self.queries)
        for name, query in self.queries.items():
            for p in batches(progress_of(query)):
                self.batches[name][(p["runId"], p["batchId"])] = p


# --------------------------------------------------------------------------- environment


class Bench:
    """One benchmark run's broker, Spark, topics and results; ``start`` before use, ``stop`` after."""

    def __init__(self, config: Config, sizes: Sizes, work: Path):
        if not isinstance(config, Config) or not isinstance(sizes, Sizes):
            raise TypeError("Bench needs a pipeline Config and bench Sizes")
        self.base_config = config
        self.sizes = sizes
        self.work = Path(work)
        self.broker = None
        self.spark = None
        self.own_spark = False
        self.kafka = None
        self.topics: list[str] = []
        self.metrics: dict[str, Metric] = {}
        self.details: dict = {}

    def start(self) -> None:
        from pyspark.sql import SparkSession

        from ..devtools.kafka_local import LocalKafka
        from ..pipeline.spark import build_spark

        kafka = self.base_config.kafka
        if kafka.bootstrap_servers == LOCAL_BOOTSTRAP:
            say("starting a private Kafka broker")
            self.broker = LocalKafka(self.work / "kafka")
            # A plaintext broker: no TLS or SASL setting of the configured cluster applies to it.
            plaintext = {key: None for key in (*SASL_KEYS, *TLS_KEYS, "sasl_password", "ssl_key_password")}
            kafka = kafka.model_copy(
                update={
                    **plaintext,
                    "bootstrap_servers": self.broker.start(),
                    "security_protocol": "PLAINTEXT",
                    "ssl_endpoint_identification": True,
                }
            )
        batch = self.sizes.max_offsets_per_trigger or kafka.max_offsets_per_trigger
        self.kafka = kafka.model_copy(update={"starting_offsets": "earliest", "max_offsets_per_trigger": batch})
        say("starting Spark")
        self.own_spark = SparkSession.getActiveSession() is None
        self.spark = build_spark(
            "bench",
            master=self.base_config.spark_master,
            shuffle_partitions=self.base_config.shuffle_partitions,
            ui_enabled=False,
            # Only this driver's own settings: the pipeline runs with the project's configuration.
            extra_conf={"spark.sql.streaming.numRecentProgressUpdates": "1000"},
        )
        if self.own_spark:
            self.spark.sparkContext.setLogLevel("ERROR")

    def stop(self, keep: bool) -> None:
        if self.spark is not None:
            stop_all(self.spark.streams.active)
            if self.own_spark:
                self.spark.stop()
        if keep:
            return
        if self.broker is not None:
            self.broker.stop()
        elif self.topics:
            self._delete_topics()

    def _delete_topics(self) -> None:
        from confluent_kafka.admin import AdminClient

        from ..pipeline.kafka.clients import client_config

        try:
            admin = AdminClient(client_config(self.phase_config(self.work, self.topics[0])))
            for future in admin.delete_topics(self.topics).values():
                future.result(timeout=30)
        except Exception as error:  # noqa: BLE001 - cleanup is best effort
            say(f"could not delete the benchmark topics {self.topics}: {error}")

    def phase_config(self, root: Path, topic: str, trigger: str | None = None) -> Config:
        """The pipeline config of one phase: its own lakehouse ``root``, one ``topic``, the bench's broker."""
        if self.kafka is None:
            raise RuntimeError("Bench.start() first")
        if not topic:
            raise ValueError("phase_config needs a topic")
        if trigger is not None:
            seconds(trigger)
        return self.base_config.model_copy(
            update={
                "lakehouse_root": str(root),
                "kafka": self.kafka.model_copy(update={"topics": (topic,)}),
                "trigger_interval": trigger or self.base_config.trigger_interval,
                # The three layers are measured; the egress streams are not (nor gold's change feed for them).
                "egress_sections": {},
                "egress": {},
            }
        )

    def create_topic(self, name: str) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        from ..pipeline.kafka.clients import client_config

        admin = AdminClient(client_config(self.phase_config(self.work, name)))
        admin.create_topics([NewTopic(name, num_partitions=self.sizes.partitions)])[name].result(timeout=30)
        self.topics.append(name)
        return name

    def add(self, key: str, name: str, value: float, unit: str, target: Target | None = None) -> None:
        self.metrics[key] = Metric(key, name, float(value), unit, target)

    def run_layers(self, config: Config, delivery: Delivery = Delivery.EXACTLY_ONCE) -> dict[str, dict]:
        """The pipeline's streams, availableNow, layer after layer: wall time and batch progress of each."""
        from ..pipeline.streams import start_stream

        if not isinstance(delivery, Delivery):
            raise TypeError(f"delivery must be a Delivery, not {delivery!r}")
        runs = {}
        for layer in LAYERS:
            started = time.perf_counter()
            query = start_stream(self.spark, config, layer, available_now=True, delivery=delivery)
            await_query(query, self.sizes.timeout_s)
            runs[layer] = {"wall_s": time.perf_counter() - started, "progress": progress_of(query)}
        # Rows each layer read, from the tables: numInputRows of a foreachBatch stream counts
        # every scan of the batch, so it can overstate them.
        rows = self.table_rows(config)
        read = {"bronze": rows["bronze"], "silver": rows["bronze"], "gold": rows["silver"]}
        for layer, run in runs.items():
            run["rows"] = read[layer]
        return runs

    def table_rows(self, config: Config) -> dict[str, int]:
        """Rows in bronze, silver and quarantine, and the events gold has counted."""
        from pyspark.sql import functions as F

        from ..pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse

        lakehouse = Lakehouse(config.lakehouse_root)

        def read(name: str):
            return self.spark.read.format("delta").load(lakehouse.table(name))

        return {
            "bronze": read(BRONZE).count(),
            "silver": read(SILVER).count(),
            "quarantine": read(QUARANTINE).count(),
            "gold_events": read(GOLD).agg(F.sum("event_count")).first()[0] or 0,
        }
