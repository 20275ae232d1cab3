"""The bench environment: a private broker, S3 server and topics, a SparkSession, per-phase configs, the real streams.

Every measurement module takes a started :class:`Bench` and records its figures with ``Bench.add``.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
import uuid
from pathlib import Path

from ..pipeline.config import LOCAL_BOOTSTRAP, SASL_KEYS, TLS_KEYS, Config, duration_seconds
from ..pipeline.dataset import Dataset
from ..pipeline.datasets.events import DATASET as EVENTS_DATASET
from ..pipeline.delta.tables import LAYERS, Lakehouse, ensure_tables
from ..pipeline.delta.writes import Delivery
from .report import Metric
from .sizes import Sizes

# What ``s3.prepare`` sets in this process's environment for the JVM; put back as they were by ``Bench.stop``.
CREDENTIAL_VARIABLES = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
# Per-bucket S3A settings (``fs.s3a.bucket.<bucket>.<key>``) of the bench's bucket in a session the bench did not start.
S3A_BUCKET_PREFIX = "fs.s3a.bucket."
# SIGTERM to SIGKILL of the private S3 server: its data goes with the work directory, so the ~15 s
# of SeaweedFS's orderly exit buys nothing.
S3_STOP_TIMEOUT_S = 0.5
# PostgreSQL's JDBC driver, for Spark's JDBC writer: the PostgreSQL egress's baseline (bench/egress.py).
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.14"

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


def baseline_packages() -> list[str]:
    """Maven packages of what the egress phase compares with, which a session must load from its start:
    Spark's JDBC writer needs PostgreSQL's driver (bench/egress.py)."""
    from ..devtools.chaos import POSTGRES_EGRESS
    from ..pipeline.egress import installed_names

    return [POSTGRES_JDBC] if POSTGRES_EGRESS in installed_names() else []


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def seconds(duration: str) -> float:
    return float(duration_seconds(duration, "bench trigger"))


def own_cpus() -> str:
    """The CPUs this process may run on, as ``taskset -c`` takes them ("0,1").

    Example::

        own_cpus()  # "0,1"
    """
    return ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))


def on_cpus(command: list[str], cpus: str | None) -> list[str]:
    """``command`` run on the CPUs ``cpus`` names (``taskset -c``); as it is when ``cpus`` is None.

    Two systems compared side by side each run so, on the same CPUs: neither gets a core the other lacks.

    Example::

        subprocess.Popen(on_cpus(["spark-pipelines", "run"], own_cpus()))
    """
    if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
        raise ValueError(f"command must be a non-empty list of strings, not {command!r}")
    if cpus is None:
        return list(command)
    if not isinstance(cpus, str) or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", cpus):
        raise ValueError(f'cpus must be a CPU list as taskset -c takes it ("0,1", "0-3"), not {cpus!r}')
    return ["taskset", "-c", cpus, *command]


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


def build_table(
    bench: Bench,
    root: Path,
    table: str,
    first: int,
    end: int,
    commits: int,
    rows_between,
    dataset: Dataset = EVENTS_DATASET,
) -> str:
    """Create ``dataset``'s lakehouse tables under ``root`` (the pipeline's own layout) and fill ``table`` with
    ``rows_between(lo, hi)`` for ``first <= lo < hi <= end`` in ``commits`` appends, in order; returns its path."""
    if not first < end or commits <= 0:
        raise ValueError(f"build_table needs first < end and commits > 0, got {first}, {end}, {commits}")
    if not isinstance(dataset, Dataset) or table not in dataset.tables:
        raise ValueError(f"build_table needs a Dataset that has table {table!r}, got {dataset!r}")
    lakehouse = Lakehouse(str(root))
    ensure_tables(bench.spark, lakehouse, dataset)
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
    """One benchmark run's broker, S3 server, Spark, topics and results; ``start`` before use, ``stop`` after."""

    def __init__(self, config: Config, sizes: Sizes, work: Path):
        if not isinstance(config, Config) or not isinstance(sizes, Sizes):
            raise TypeError("Bench needs a pipeline Config and bench Sizes")
        self.base_config = config
        self.sizes = sizes
        self.work = Path(work)
        self.broker = None
        self.s3_server = None
        self.registry = None  # the phases' schema registry: started by the first that needs one (``registry_url``)
        self.registry_address = ""
        self.s3_root: str | None = None  # s3a://bucket/bench: the storage phase's S3 lakehouses go under it
        self.s3_bucket_settings: list[str] = []  # their names, set in a session the bench did not start
        self.saved_environ: dict[str, str | None] = {}
        self.spark = None
        self.own_spark = False
        self.kafka = None
        self.topics: list[str] = []
        self.metrics: dict[str, Metric] = {}
        self.details: dict = {}
        # Where a phase keeps what its figures came from (logs), beside bench.json; None: nowhere.
        self.evidence_dir: Path | None = None

    def start(self) -> None:
        from pyspark.sql import SparkSession

        from ..devtools.kafka_local import LocalKafka
        from ..devtools.s3_local import LocalS3
        from ..pipeline.session.spark import build_spark

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
        # One server after the other: each picks free ports, then binds them, and a server starting
        # meanwhile (SeaweedFS opens many connections) may take one of them first.
        say("starting a private S3 server (SeaweedFS)")
        self.s3_server = LocalS3(self.work / "s3")
        s3_endpoint = self.s3_server.start()
        batch = self.sizes.max_offsets_per_trigger or kafka.max_offsets_per_trigger
        self.kafka = kafka.model_copy(update={"starting_offsets": "earliest", "max_offsets_per_trigger": batch})
        self.own_spark = SparkSession.getActiveSession() is None
        # Before Spark: the JVM inherits the server's credentials from this process's environment.
        packages, s3_conf = self._s3_lakehouse(s3_endpoint)
        say("starting Spark")
        self.spark = build_spark(
            "bench",
            master=self.base_config.spark_master,
            shuffle_partitions=self.base_config.shuffle_partitions,
            ui_enabled=False,
            # Only this driver's own settings: the pipeline runs with the project's configuration.
            extra_conf={**s3_conf, "spark.sql.streaming.numRecentProgressUpdates": "1000"},
            extra_packages=[*packages, *baseline_packages()],
        )
        if self.own_spark:
            self.spark.sparkContext.setLogLevel("ERROR")
        else:
            self._s3_in_running_session()

    def _s3_lakehouse(self, endpoint: str) -> tuple[list[str], dict[str, str]]:
        """``s3_root`` on the private S3 server at ``endpoint``, the server's credentials in this process's
        environment (``s3.prepare``, which probes the root too); returns the Maven packages and Spark settings
        the session needs from its start for it (S3A, the conditional-write log store, the endpoint).

        A session already running in this process (a test suite's) cannot take them any more: the bench's
        lakehouse then goes to a bucket of its own, set up by ``_s3_in_running_session``.
        """
        from ..devtools.s3_local import BUCKET, REGION
        from ..pipeline.session import s3

        bucket = BUCKET
        if not self.own_spark:
            bucket = f"bench-{uuid.uuid4().hex[:12]}"
            credentials = s3.read_credentials_file(self.s3_server.credentials_file)
            status, _, body = s3.s3_request("PUT", f"{endpoint}/{bucket}", credentials, region=REGION)
            if status != 200:
                raise RuntimeError(f"the bench's S3 server refused bucket {bucket}: HTTP {status} {body[:300]!r}")
        section = self.base_config.s3.model_copy(
            update={
                "endpoint": endpoint,
                "region": REGION,
                "path_style_access": True,
                "credentials_file": str(self.s3_server.credentials_file),
            }
        )
        self.s3_root = f"{s3.SCHEME}{bucket}/bench"
        config = self.base_config.model_copy(update={"lakehouse_root": self.s3_root, "s3": section})
        self.saved_environ = {name: os.environ.get(name) for name in CREDENTIAL_VARIABLES}
        s3.prepare(config)
        return s3.session_options(config) if self.own_spark else ([], {})

    def _s3_in_running_session(self) -> None:
        """Point the bench's bucket at its server in a session started before the bench.

        Its JVM kept the environment of its start (no credentials of this server) and may hold S3A settings
        and a cached filesystem of another server for bucket `lakehouse`: so per-bucket settings of a bucket
        of the bench's own, credentials included, in the session's Hadoop configuration (never in Spark's
        configuration, which Spark writes to event logs). S3A and the log store must be there from its start.
        """
        from ..devtools.s3_local import REGION
        from ..pipeline.session import s3

        conf = self.spark.sparkContext.getConf()
        # As packages, or as the jar files an earlier start resolved them to (pipeline/session/spark.py).
        jars = f"{conf.get('spark.jars.packages') or ''},{conf.get('spark.jars') or ''}"
        if "hadoop-aws" not in jars or conf.get("spark.delta.logStore.s3a.impl") != s3.LOG_STORE_CLASS:
            raise RuntimeError(
                "the running SparkSession was started without S3A and the S3 log store: start it with "
                "pipeline.session.s3.connector_options (as tests/conftest.py does), or let the bench start its own"
            )
        bucket, _ = s3.bucket_and_prefix(self.s3_root)
        access_key, secret_key = s3.read_credentials_file(self.s3_server.credentials_file)
        settings = {
            "endpoint": self.s3_server.endpoint,
            "endpoint.region": REGION,
            "path.style.access": "true",
            "access.key": access_key,
            "secret.key": secret_key,
        }
        hadoop = self.spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in settings.items():
            name = f"{S3A_BUCKET_PREFIX}{bucket}.{key}"
            hadoop.set(name, value)
            self.s3_bucket_settings.append(name)

    def registry_url(self) -> str:
        """The URL of the bench's private schema registry, started at the first call: the phases that write
        Avro through a registry share it, each under subjects of its own."""
        from ..devtools.registry_local import LocalRegistry

        if not self.registry_address:  # not started, or its start failed: started (again)
            say("starting a private schema registry")
            self.registry = LocalRegistry(self.work / "registry")
            self.registry_address = self.registry.start()
        return self.registry_address

    def stop(self, keep: bool) -> None:
        if self.spark is not None:
            stop_all(self.spark.streams.active)
            if self.own_spark:
                self.spark.stop()
        if self.registry is not None:
            self.registry.stop()
        for name, value in self.saved_environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if keep:
            if self.s3_server is not None:
                say(f"kept the S3 server at {self.s3_server.endpoint} (credentials: {self.s3_server.credentials_file})")
            return
        if self.spark is not None and not self.own_spark:
            hadoop = self.spark.sparkContext._jsc.hadoopConfiguration()
            for name in self.s3_bucket_settings:
                hadoop.unset(name)
        if self.s3_server is not None:
            self.s3_server.stop(timeout=S3_STOP_TIMEOUT_S)
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

    def phase_config(self, root: Path | str, topic: str, trigger: str | None = None) -> Config:
        """The pipeline config of one phase: its own lakehouse ``root`` (a directory, or an ``s3a://`` URI under
        ``s3_root``), one ``topic``, the bench's broker."""
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

    def add(self, key: str, name: str, value: float, unit: str) -> None:
        """Record a figure of this run; its target, if any, is the metric's own (``report.TARGETS``)."""
        self.metrics[key] = Metric(key, name, float(value), unit)

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
