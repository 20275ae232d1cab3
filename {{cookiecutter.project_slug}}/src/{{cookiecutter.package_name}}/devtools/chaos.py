"""Chaos runner: kill the running pipeline at random moments, then prove nothing was lost or doubled.

While a transactional producer writes numbered records (most transactions
committed, every third aborted), and a second one the records of the project's
second dataset where it has one (its own topic, contract, business key and
golds; retries of a record among them), the pipeline (`run --layer all`) runs as a
separate process and is SIGKILLed at seeded random moments, then restarted.
Most kills land while batches run (a random moment after the run's first batch);
the rest while it starts (checkpoints, leases and tables being prepared).
Finally it drains with --available-now, and the runner checks the tables
against its own ledger of what it committed to Kafka, the second dataset's with
``oracle.judge_dataset``. The checks use none of the pipeline's code: Spark only
reads the Delta tables, the rest is plain Python.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from py4j.java_gateway import JavaClass

from ..pipeline.dataset import Dataset
from .kafka_local import partitions_with_leaders
from .oracle import BROKEN_PREFIX, judge_dataset, judge_published
from .sample import EVENT_TYPES, ValueWriter, breakable, contract_records, dataset_writer, registry_client

EVENT_START = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
MALFORMED_EVERY = 17
MALFORMED_PREFIX = BROKEN_PREFIX
# The second dataset's records, per record of the first: its topic is read by the same streams' driver.
SECOND_DATASET_SHARE = 0.4
SECOND_RETRY_RATIO = 0.05
# The share of the second dataset's records that break its first quarantining expectation, where a
# producer can break one (``sample.breakable``).
SECOND_UNEXPECTED_RATIO = 0.03
ABORT_EVERY = 3
KAFKA_EGRESS, POSTGRES_EGRESS = "kafka_egress", "postgres_egress"
# The header of each record of the Kafka egress naming the stream id that published it (its output contract).
STREAM_ID_HEADER = "lakehouse-stream-id"


@dataclass
class Ledger:
    """What the runner wrote to Kafka: its oracle."""

    committed: dict[str, bytes] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    # Committed, then deleted from Kafka before bronze read them, and accepted as lost: expected nowhere.
    lost: set[str] = field(default_factory=set)
    # The second dataset's record values committed, in the order committed (a retry is a value again).
    second: list[bytes] = field(default_factory=list)
    second_aborted: int = 0

    def valid_events(self) -> list[dict]:
        events = []
        for value in self.committed.values():
            try:
                events.append(json.loads(value))
            except ValueError:
                continue
        return events


def numbered_record(run: str, number: int, rng: random.Random, days_late: int = 0) -> tuple[str, bytes]:
    """Record ``number`` of a run, as (its id, its value): every 17th malformed, the others events of one
    hour from EVENT_START, or ``days_late`` days before it (an event that arrives long after its window,
    which gold still counts). The id is in the value (``record_id``), and is the record's Kafka key unless
    the producer gives it another record's key."""
    key = f"{run}-{number:07d}"
    if number % MALFORMED_EVERY == 0:
        return key, MALFORMED_PREFIX + key.encode()
    start = EVENT_START - timedelta(days=days_late)
    event = {
        "event_id": key,
        "event_time": (start + timedelta(seconds=rng.randrange(3600))).isoformat(),
        "user_id": f"user-{rng.randrange(20)}",
        "event_type": rng.choice(EVENT_TYPES),
        "amount": float(Decimal(rng.randrange(1, 50_000)) / 100),
    }
    return key, json.dumps(event).encode()


def record_id(value: bytes | None) -> str:
    """The id a record of ``numbered_record`` carries in its value ("?" for a value it did not make).

    Example::

        record_id(b'{"event_id": "run-0000001", ...}')  # "run-0000001"
    """
    if value is None:
        return "?"
    if value.startswith(MALFORMED_PREFIX):
        return value[len(MALFORMED_PREFIX) :].decode(errors="replace")
    try:
        return str(json.loads(value)["event_id"])
    except (ValueError, KeyError, TypeError):
        return "?"


def send_transaction(producer: Producer, topic: str, records: list[tuple[bytes | None, bytes]], commit: bool) -> None:
    """One transaction of ``records`` ((key, value) each) to ``topic``: committed, or aborted once its records
    are in the log.

    Example::

        send_transaction(producer, "events", [(b"r-1", b'{"event_id": "r-1", ...}')], commit=False)
    """
    producer.begin_transaction()
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # the aborted records really reach the log, behind an abort marker
        producer.abort_transaction(30)


def produce_numbered(
    producer_config: dict,
    topic: str,
    run: str,
    records: int,
    seed: int,
    ledger: Ledger,
    duration_s: float,
    transaction_size: int = 25,
) -> None:
    """Produce ``records`` numbered records over about ``duration_s``; abort every third transaction."""
    rng = random.Random(seed)
    producer = Producer({**producer_config, "transactional.id": f"chaos-{run}", "linger.ms": 5})
    producer.init_transactions(30)
    transactions = (records + transaction_size - 1) // transaction_size
    pause = duration_s / max(transactions, 1)
    for index in range(transactions):
        batch = [
            numbered_record(run, number, rng)
            for number in range(index * transaction_size, min(records, (index + 1) * transaction_size))
        ]
        committed = index % ABORT_EVERY != ABORT_EVERY - 1
        send_transaction(producer, topic, [(key.encode(), value) for key, value in batch], committed)
        if committed:
            ledger.committed.update(batch)
        else:
            ledger.aborted.update(key for key, _ in batch)
        time.sleep(pause)


def dataset_values(dataset, run: str, seed: int, write: ValueWriter | None = None) -> Iterator[bytes]:
    """Record values of ``dataset``, endless: drawn from its contract (``sample.contract_records``, some of them
    retries of an earlier record, the same bytes again, some breaking an expectation on purpose), every 17th
    broken (``BROKEN_PREFIX`` and an id of the run: in no format). Their event times lie within ten minutes of
    EVENT_START. ``write`` writes each value (``sample.value_writer``; JSON by default)."""
    unexpected = SECOND_UNEXPECTED_RATIO if breakable(dataset) is not None else 0.0
    drawn = contract_records(
        dataset,
        2**62,
        seed,
        retry_ratio=SECOND_RETRY_RATIO,
        start=EVENT_START,
        prefix=run,
        unexpected_ratio=unexpected,
        write=write,
    )
    for number, (_, value) in enumerate(drawn, 1):
        broken = number % MALFORMED_EVERY == 0
        yield MALFORMED_PREFIX + f"{run}-{dataset.name}-{number:07d}".encode() if broken else value


def produce_dataset_records(
    producer_config: dict,
    topic: str,
    run: str,
    dataset,
    records: int,
    seed: int,
    ledger: Ledger,
    duration_s: float,
    transaction_size: int = 25,
    write: ValueWriter | None = None,
) -> None:
    """Produce ``records`` of ``dataset``'s records (``dataset_values``, each written by ``write``) over about
    ``duration_s``; abort every third transaction."""
    values = list(itertools.islice(dataset_values(dataset, run, seed, write), records))
    producer = Producer({**producer_config, "transactional.id": f"chaos-{run}-{dataset.name}", "linger.ms": 5})
    producer.init_transactions(30)
    transactions = (records + transaction_size - 1) // transaction_size
    pause = duration_s / max(transactions, 1)
    for index in range(transactions):
        batch = values[index * transaction_size : (index + 1) * transaction_size]
        committed = index % ABORT_EVERY != ABORT_EVERY - 1
        send_transaction(producer, topic, [(None, value) for value in batch], committed)
        if committed:
            ledger.second.extend(batch)
        else:
            ledger.second_aborted += len(batch)
        time.sleep(pause)


def verify(
    ledger: Ledger,
    bronze: list[tuple[str, int, int, str]],
    silver: list[tuple[str, int, int]],
    quarantine: list[tuple[str, int, int]],
    gold: list[tuple[int, str, int, Decimal]],
    window_seconds: int,
    egress: dict[str, list[tuple[int, str, int, Decimal]]] | None = None,
) -> dict[str, int]:
    """Anomalies by kind (all zero when exactly-once held).

    bronze rows: (topic, partition, offset, record id: ``record_id`` of the value,
    which a Kafka key that repeats another record's cannot be); silver and quarantine
    rows: (topic, partition, offset); gold rows, and the rows each egress's sink
    holds (``egress``, by stream): (window_start as epoch seconds, event_type,
    event_count, amount_sum).
    """
    name_at = {(t, p, o): name for t, p, o, name in bronze}
    bronze_copies = Counter(name for _, _, _, name in bronze)
    silver_copies = Counter(name_at.get(row, "?") for row in silver)
    quarantine_copies = Counter(name_at.get(row, "?") for row in quarantine)
    committed = set(ledger.committed)
    malformed = {key for key, value in ledger.committed.items() if not value.startswith(b'{"')}
    parsed = set(silver_copies) | set(quarantine_copies)

    expected_gold: dict[tuple[int, str], tuple[int, Decimal]] = {}
    for event in ledger.valid_events():
        epoch = int(datetime.fromisoformat(event["event_time"]).timestamp())
        window = (epoch - epoch % window_seconds, event["event_type"])
        count, amount = expected_gold.get(window, (0, Decimal("0")))
        expected_gold[window] = (count + 1, amount + Decimal(str(event["amount"])))
    actual_gold = {(start, kind): (n, total) for start, kind, n, total in gold}
    gold_keys = set(expected_gold) | set(actual_gold)

    def windows_wrong(rows: list[tuple[int, str, int, Decimal]]) -> int:
        actual = {(start, kind): (n, total) for start, kind, n, total in rows}
        return sum(1 for key in set(expected_gold) | set(actual) if expected_gold.get(key) != actual.get(key))

    return {
        "committed_missing_in_bronze": len(committed - set(bronze_copies)),
        "duplicates_in_bronze": sum(n - 1 for n in bronze_copies.values()),
        "aborted_visible": len(ledger.aborted & (set(bronze_copies) | parsed)),
        "unknown_records": len((set(bronze_copies) | parsed) - committed - ledger.aborted),
        "committed_missing_in_silver_and_quarantine": len(committed - parsed),
        "duplicates_in_silver_or_quarantine": sum(n - 1 for n in (silver_copies + quarantine_copies).values()),
        "in_the_wrong_table": len((set(silver_copies) & malformed) | (set(quarantine_copies) - malformed)),
        "gold_windows_wrong": sum(1 for key in gold_keys if expected_gold.get(key) != actual_gold.get(key)),
        **{f"{stream}_windows_wrong": windows_wrong(rows) for stream, rows in (egress or {}).items()},
    }


def storage_env(config) -> dict[str, str]:
    """The environment that points a pipeline process at ``config``'s S3 server ({} off S3).

    The resolved settings, not "local": the runner may have started a server of its own.
    """
    from ..pipeline.session.s3 import is_s3

    if not is_s3(config.lakehouse_root):
        return {}
    settings = config.s3
    env = {
        "S3_ENDPOINT": settings.endpoint,
        "S3_REGION": settings.region,
        "S3_PATH_STYLE_ACCESS": str(settings.path_style_access).lower(),
    }
    if settings.credentials_file:
        env["S3_CREDENTIALS_FILE"] = str(settings.credentials_file)
    return env


def registry_env(config) -> dict[str, str]:
    """The environment that points a pipeline process at ``config``'s schema registry ({} without one): the
    resolved settings, as ``storage_env`` gives the S3 server's; a secret by the file that holds it (one
    from a variable reaches the process in the variable it came in)."""
    settings = config.schema_registry
    if not settings.url:
        return {}
    env = {"SCHEMA_REGISTRY_URL": settings.url}
    named = {
        "SCHEMA_REGISTRY_SSL_CA_LOCATION": settings.ssl_ca_location,
        "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME": settings.basic_auth_username,
        "SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD_FILE": settings.basic_auth_password_file,
        "SCHEMA_REGISTRY_BEARER_TOKEN_FILE": settings.bearer_token_file,
    }
    env.update({variable: value for variable, value in named.items() if value})
    return env


def egress_env(config, run: str, admin: AdminClient, second: Dataset | None = None) -> dict[str, str]:
    """The environment that turns on each egress ``config`` has, each with a sink of this run only; with
    ``second``, each also publishes that dataset's first gold, to a sink of its own (``judge_published_gold``
    judges it)."""
    from ..pipeline.egress import settings_of

    sections, env, egress = [], {}, settings_of(config)
    if KAFKA_EGRESS in egress:
        topic = f"{run}-gold"
        topics = [topic, *([f"{run}-{second.name}-{second.golds[0].name}"] if second else [])]
        for name in topics:
            changelog = NewTopic(name, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
            admin.create_topics([changelog])[name].result(timeout=30)
        sections.append("egress_kafka")
        env["EGRESS_KAFKA_TOPIC"] = topic
        if second:
            env["EGRESS_KAFKA_GOLDS"] = f"{second.name}.{second.golds[0].name}={topics[1]}"
    if POSTGRES_EGRESS in egress:
        settings = egress[POSTGRES_EGRESS]
        sections.append("egress_postgres")
        table = run.replace("-", "_")
        env.update(
            EGRESS_POSTGRES_DSN=settings.dsn,
            EGRESS_POSTGRES_PASSWORD=settings.password.get_secret_value() if settings.password else "",
            EGRESS_POSTGRES_TABLE=table,
        )
        if second:
            env["EGRESS_POSTGRES_GOLDS"] = f"{second.name}.{second.golds[0].name}={table}_{second.name}"
    # The run drives the first dataset: a second one's topics get no records from it.
    return {"PIPELINE_EGRESS": ",".join(sections) or "none", "PIPELINE_DATASETS": "none", **env}


def judge_published_gold(config, env: dict[str, str], dataset: Dataset, committed: list[bytes]) -> dict[str, int]:
    """The first gold of ``dataset`` as each egress of ``env`` published it (``egress_env`` with it), judged by
    the oracle against ``committed``: ``<stream>_windows_wrong`` per egress stream, and for a topic the records
    repeating a gold version. The topic is read by a plain consumer, the table by a plain PostgreSQL client."""
    from ..pipeline.egress import settings_of, target_stream
    from ..pipeline.kafka.clients import client_config

    gold = dataset.golds[0]
    anomalies = {}
    if "EGRESS_KAFKA_GOLDS" in env:
        stream = target_stream(KAFKA_EGRESS, dataset, gold)
        records = read_topic(client_config(config), env["EGRESS_KAFKA_GOLDS"].split("=", 1)[1], "read_committed")
        folded: dict[bytes, bytes | None] = {}
        for _, _, key, value, _ in sorted(records, key=lambda record: (record[0], record[1])):
            folded[key] = value
        rows = [json.loads(value, parse_float=Decimal) for value in folded.values() if value is not None]
        anomalies[f"{stream}_windows_wrong"] = judge_published(
            dataset, committed, gold, rows, config.gold_window, registry_client(config, dataset)
        )
        anomalies[f"{stream}_records_repeating_a_gold_version"] = repeated_versions(records)
    if "EGRESS_POSTGRES_GOLDS" in env:
        import psycopg

        stream = target_stream(POSTGRES_EGRESS, dataset, gold)
        settings = settings_of(config)[POSTGRES_EGRESS]
        table = env["EGRESS_POSTGRES_GOLDS"].split("=", 1)[1]
        password = settings.password.get_secret_value() if settings.password else None
        with psycopg.connect(settings.dsn, password=password) as connection:
            cursor = connection.execute(f"SELECT {', '.join(gold.columns)} FROM {table}")
            rows = [dict(zip(gold.columns, row, strict=True)) for row in cursor.fetchall()]
        anomalies[f"{stream}_windows_wrong"] = judge_published(
            dataset, committed, gold, rows, config.gold_window, registry_client(config, dataset)
        )
    return anomalies


def read_topic(client: dict, topic: str, isolation: str) -> list[tuple[int, int, bytes, bytes | None, dict]]:
    """Every record of ``topic`` a consumer with ``isolation`` sees: (partition, offset, key, value, headers)."""
    consumer = Consumer(
        {
            **client,
            "group.id": f"chaos-oracle-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = partitions_with_leaders(consumer, topic)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records, ended, deadline = [], set(), time.monotonic() + 120
        while len(ended) < len(partitions):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} did not reach its end within 120 s")
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"reading {topic}: {message.error()}")
                ended.add(message.partition())
                continue
            headers = dict(message.headers() or [])
            records.append((message.partition(), message.offset(), message.key(), message.value(), headers))
        return records
    finally:
        consumer.close()


def folded_changelog(records: list[tuple[int, int, bytes, bytes | None, dict]]) -> list[tuple[int, str, int, Decimal]]:
    """The changelog folded by key in log order, a tombstone deleting: gold rows as (epoch, event_type, count, sum)."""
    state: dict[bytes, bytes | None] = {}
    for _, _, key, value, _ in sorted(records, key=lambda record: (record[0], record[1])):
        state[key] = value
    rows = []
    for key, value in state.items():
        if value is None:
            continue
        window, figures = json.loads(key), json.loads(value, parse_float=Decimal)
        start = int(datetime.fromisoformat(window["window_start"]).timestamp())
        rows.append((start, window["event_type"], figures["event_count"], Decimal(figures["amount_sum"])))
    return rows


def repeated_versions(records: list[tuple[int, int, bytes, bytes | None, dict]]) -> int:
    """Records that repeat a (gold row, gold version) their stream id already published: each must appear once
    in a changelog (a new stream id, after a reset, publishes gold's rows again as a new one)."""
    seen = Counter(
        (headers.get(STREAM_ID_HEADER), key, json.loads(value)["gold_version"])
        for _, _, key, value, headers in records
        if value is not None
    )
    return sum(n - 1 for n in seen.values())


def postgres_rows(settings, table: str) -> list[tuple[int, str, int, Decimal]]:
    import psycopg

    query = f"SELECT extract(epoch FROM window_start)::bigint, event_type, event_count, amount_sum FROM {table}"
    password = settings.password.get_secret_value() if settings.password else None
    with psycopg.connect(settings.dsn, password=password) as connection:
        return [tuple(row) for row in connection.execute(query).fetchall()]


def hadoop_filesystem(spark, path: str):
    """(Hadoop Path, its FileSystem) of any URI, with ``spark``'s credentials: the runners' own, not the
    pipeline's ``delta/files.py``, so that what they check is read without the pipeline's code."""
    # Named in full: py4j resolves `spark._jvm.org.apache...` a dot at a time, each miss a search of every jar.
    hadoop_path = JavaClass("org.apache.hadoop.fs.Path", spark._jvm._gateway_client)(path)
    return hadoop_path, hadoop_path.getFileSystem(spark._jsc.hadoopConfiguration())


def batch_ids(spark, directory: str) -> list[int]:
    """The batch ids of a checkpoint's ``offsets`` or ``commits`` directory (any Hadoop URI), sorted."""
    path, filesystem = hadoop_filesystem(spark, directory)
    if not filesystem.exists(path):
        return []
    names = [status.getPath().getName() for status in filesystem.listStatus(path)]
    return sorted(int(name) for name in names if name.isdigit())


def pending_batches(spark, checkpoint_root: str) -> int:
    """Batches with an offset-log entry but no commit-log entry: each is replayed on restart.

    ``checkpoint_root`` is any Hadoop URI (a local directory, ``s3a://...``): it is listed through
    ``spark``'s Hadoop filesystem, with that session's credentials.
    """
    root, filesystem = hadoop_filesystem(spark, checkpoint_root)
    if not filesystem.exists(root):
        return 0
    streams = [stream.getPath().toString() for stream in filesystem.listStatus(root) if stream.isDirectory()]
    return sum(has_pending_batch(spark, checkpoint) for checkpoint in streams)


def has_pending_batch(spark, checkpoint: str) -> bool:
    """Whether the stream's ``checkpoint`` (any Hadoop URI) logged a batch's offsets and not its commit: the
    batch its next start replays."""
    logged, committed = batch_ids(spark, f"{checkpoint}/offsets"), batch_ids(spark, f"{checkpoint}/commits")
    return bool(logged) and max(logged) > max(committed, default=-1)


# A kill's moment: while the run starts, or a random moment after its first batch (most kills).
STARTING, RUNNING = "starting", "running"
STARTING_SHARE = 0.25
# The monitoring listener's line for a finished batch of any stream.
BATCH_DONE = '"event": "batch_progress"'


@dataclass
class ChaosReport:
    kills: int
    records_committed: int
    records_aborted: int
    batches_replayed: int
    anomalies: dict[str, int]
    # Records of egress transactions that a kill left open and Kafka aborted: visible to
    # read_uncommitted consumers only.
    egress_aborted_records: int = 0
    kills_while_starting: int = 0
    # The second dataset's name and its records committed and aborted, where the project has one.
    second_dataset: str | None = None
    second_committed: int = 0
    second_aborted: int = 0

    @property
    def clean(self) -> bool:
        return not any(self.anomalies.values())

    def table(self) -> str:
        rows = [
            ("kills", self.kills),
            ("... while the pipeline started", self.kills_while_starting),
            ("... after its first batch", self.kills - self.kills_while_starting),
            ("records committed", self.records_committed),
            ("records aborted", self.records_aborted),
            *(
                [
                    (f"{self.second_dataset} records committed", self.second_committed),
                    (f"{self.second_dataset} records aborted", self.second_aborted),
                ]
                if self.second_dataset
                else []
            ),
            ("batches replayed", self.batches_replayed),
            ("egress records aborted (read_uncommitted only)", self.egress_aborted_records),
            *((f"anomaly: {kind}", count) for kind, count in self.anomalies.items()),
        ]
        lines = [f"{name:<50} {value:>8}" for name, value in rows]
        lines.append(f"{'verdict':<50} {'clean' if self.clean else 'ANOMALIES':>8}")
        return "\n".join(lines)


def pipeline_command(*args: str) -> list[str]:
    return [sys.executable, "-m", __package__.rpartition(".")[0], *args]


def run_chaos(
    config,
    kills: int,
    seed: int,
    records: int,
    logs: Path,
    starting_window_s: tuple[float, float] = (1.0, 8.0),
    running_window_s: tuple[float, float] = (0.0, 6.0),
    first_batch_timeout_s: float = 300.0,
) -> ChaosReport:
    """Kill and restart the pipeline ``kills`` times while producing, drain, and verify.

    ``config`` points at the broker and at a lakehouse of this run only, on a local disk or on S3
    (resolved: no "local" server left to look up); each pipeline run's output goes to a file in ``logs``.
    A kill while starting comes ``starting_window_s`` after the run was launched; any other comes
    ``running_window_s`` after the run's first finished batch, whatever its start-up took (more
    than 20 seconds on S3 under load), so that it lands inside a batch or between two.
    """
    from ..pipeline.datasets import DATASETS
    from ..pipeline.delta.tables import Lakehouse
    from ..pipeline.kafka.clients import bootstrap_servers, client_config
    from ..pipeline.session import s3
    from ..pipeline.session.spark import build_spark

    rng = random.Random(seed)
    run = f"chaos{seed}-{uuid.uuid4().hex[:6]}"
    topic = run
    second = DATASETS[1] if len(DATASETS) > 1 else None
    second_topic = f"{run}-{second.name}" if second else None
    admin = AdminClient(client_config(config))
    for name in filter(None, (topic, second_topic)):
        admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(timeout=30)
    # A crash point armed by the caller would stop every restart at the same place.
    inherited = {key: value for key, value in os.environ.items() if key != "PIPELINE_CRASH_POINT"}
    env = {
        **inherited,
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers(config),
        "KAFKA_TOPICS": topic,
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_TRIGGER_INTERVAL": "1 second",
        # Small batches: more batch boundaries for the kills to land on.
        "KAFKA_MAX_OFFSETS_PER_TRIGGER": "40",
        **egress_env(config, run, admin, second),
        **storage_env(config),
        **registry_env(config),
        **({"PIPELINE_DATASETS": second.name, f"DATASET_{second.name.upper()}_TOPICS": second_topic} if second else {}),
    }
    # This process's own session: it counts the batches each kill left pending, then reads the tables.
    s3.prepare(config)
    packages, conf = s3.session_options(config)
    spark = build_spark(
        "chaos-verify", config.spark_master, config.shuffle_partitions, extra_conf=conf, extra_packages=packages
    )
    ledger = Ledger()
    schedule = [
        (STARTING, rng.uniform(*starting_window_s))
        if rng.random() < STARTING_SHARE
        else (RUNNING, rng.uniform(*running_window_s))
        for _ in range(kills)
    ]
    # Spread over about the time the kills take: a restart and a first batch take 10 to 30 seconds.
    producer = threading.Thread(
        target=produce_numbered,
        args=(client_config(config), topic, run, records, seed, ledger, kills * 12.0),
        daemon=True,
    )
    producer.start()
    producers = [producer]
    if second:
        second_records = int(records * SECOND_DATASET_SHARE)
        producers.append(
            threading.Thread(
                target=produce_dataset_records,
                args=(client_config(config), second_topic, run, second, second_records, seed, ledger, kills * 12.0),
                kwargs={"write": dataset_writer(config, second, second_topic)},
                daemon=True,
            )
        )
        producers[-1].start()
    replayed = killed = killed_starting = 0
    logs.mkdir(parents=True, exist_ok=True)
    for number, (moment, delay) in enumerate(schedule, 1):
        log_path = logs / f"run-{number:03d}.log"
        with log_path.open("w") as log:
            pipeline = subprocess.Popen(
                pipeline_command("run", "--layer", "all"),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if moment == RUNNING:
            _wait_for_first_batch(pipeline, log_path, first_batch_timeout_s, number)
        time.sleep(delay)
        if pipeline.poll() is not None:
            # A pipeline that ended before its kill failed on its own: that is a finding, not a kill.
            raise RuntimeError(f"the pipeline exited with {pipeline.returncode} before kill {number}; see {log_path}")
        os.killpg(pipeline.pid, signal.SIGKILL)  # the driver and its JVM, with no warning
        if pipeline.wait() == -signal.SIGKILL:
            killed += 1
            killed_starting += moment == STARTING
        replayed += pending_batches(spark, f"{config.lakehouse_root}/checkpoints")
    for each in producers:
        each.join()
    # The drain takes the configured batch size: the small batches were for the kills to land between.
    drain_env = {key: value for key, value in env.items() if key != "KAFKA_MAX_OFFSETS_PER_TRIGGER"}
    drained = subprocess.run(
        pipeline_command("run", "--layer", "all", "--available-now"), env=drain_env, capture_output=True, text=True
    )
    if drained.returncode != 0:
        raise RuntimeError(f"the final drain failed:\n{drained.stderr[-5000:]}")

    anomalies, egress_aborted = judge(spark, config, ledger, env)
    report = ChaosReport(killed, len(ledger.committed), len(ledger.aborted), replayed, anomalies)
    report.egress_aborted_records = egress_aborted
    report.kills_while_starting = killed_starting
    if second:
        lakehouse = Lakehouse(config.lakehouse_root)
        found = judge_dataset(
            spark, lakehouse, second, ledger.second, config.gold_window, registry_client(config, second)
        )
        report.anomalies.update({f"{second.name}_{kind}": count for kind, count in found.items()})
        report.anomalies.update(judge_published_gold(config, env, second, ledger.second))
        report.second_dataset = second.name
        report.second_committed, report.second_aborted = len(ledger.second), ledger.second_aborted
    return report


def judge(spark, config, ledger: Ledger, env: dict[str, str]) -> tuple[dict[str, int], int]:
    """The tables, and each egress's sink, checked against ``ledger``: (anomalies by kind, egress records aborted).

    ``env`` is the pipeline processes' environment (it names each egress's sink of the run). Spark only
    reads the Delta tables; the sinks are read with plain Kafka and PostgreSQL clients.
    """
    from ..pipeline.config import duration_seconds
    from ..pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse
    from ..pipeline.egress import settings_of
    from ..pipeline.kafka.clients import client_config

    lakehouse = Lakehouse(config.lakehouse_root)

    def rows(name: str, *columns: str) -> list[tuple]:
        table = spark.read.format("delta").load(lakehouse.table(name))
        return [tuple(row) for row in table.selectExpr(*columns).collect()]

    egress: dict[str, list[tuple[int, str, int, Decimal]]] = {}
    egress_aborted = 0
    turned_on = settings_of(config)
    if KAFKA_EGRESS in turned_on:
        committed = read_topic(client_config(config), env["EGRESS_KAFKA_TOPIC"], "read_committed")
        everything = read_topic(client_config(config), env["EGRESS_KAFKA_TOPIC"], "read_uncommitted")
        egress[KAFKA_EGRESS] = folded_changelog(committed)
        egress_aborted = len(everything) - len(committed)
    if POSTGRES_EGRESS in turned_on:
        egress[POSTGRES_EGRESS] = postgres_rows(turned_on[POSTGRES_EGRESS], env["EGRESS_POSTGRES_TABLE"])
    anomalies = verify(
        ledger,
        [
            (t, p, o, record_id(None if value is None else bytes(value)))
            for t, p, o, value in rows(BRONZE, "topic", "partition", "offset", "value")
        ],
        rows(SILVER, "topic", "partition", "offset"),
        rows(QUARANTINE, "topic", "partition", "offset"),
        # Epoch seconds: collected timestamps would come back in the local time zone.
        rows(GOLD, "cast(window_start AS long)", "event_type", "event_count", "amount_sum"),
        duration_seconds(config.gold_window, "pipeline.gold_window"),
        egress,
    )
    if KAFKA_EGRESS in turned_on:
        anomalies[f"{KAFKA_EGRESS}_records_repeating_a_gold_version"] = repeated_versions(committed)
    return anomalies, egress_aborted


def wait_while_running(
    condition: Callable[[], bool], process: subprocess.Popen, timeout_s: float, every_s: float = 0.2
) -> bool:
    """Poll ``condition`` every ``every_s`` until it holds (True), or until ``process`` exits or
    ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True


def _wait_for_first_batch(pipeline: subprocess.Popen, log_path: Path, timeout_s: float, number: int) -> None:
    if wait_while_running(lambda: BATCH_DONE in log_path.read_text(errors="replace"), pipeline, timeout_s):
        return
    if pipeline.poll() is not None:
        raise RuntimeError(f"the pipeline exited with {pipeline.returncode} before kill {number}; see {log_path}")
    raise RuntimeError(f"run {number} finished no batch in {timeout_s:.0f} s; see {log_path}")
