import os
import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from {{ cookiecutter.package_name }}.bench.harness import baseline_packages
from {{ cookiecutter.package_name }}.cli.dev import download_with_retries
from {{ cookiecutter.package_name }}.devtools.kafka_local import LocalKafka, partitions_with_leaders
from {{ cookiecutter.package_name }}.devtools.registry_local import LocalRegistry
from {{ cookiecutter.package_name }}.devtools.s3_local import BUCKET, LocalS3
from {{ cookiecutter.package_name }}.pipeline.config import Config, load_config
from {{ cookiecutter.package_name }}.pipeline.dataset import DATASET_NAME_PATTERN
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import GOLD_SCHEMA
from {{ cookiecutter.package_name }}.pipeline.egress import configure, installed_names
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery import lease
from {{ cookiecutter.package_name }}.pipeline.session import s3
from {{ cookiecutter.package_name }}.pipeline.session.spark import DRIVER_JAVA_OPTIONS, build_spark, java_class

STORAGES = ("local", "s3")


def pytest_configure(config):
    # The egresses run only in the tests that turn them on (PIPELINE_EGRESS names their sections):
    # the other tests, and the pipeline processes they start, run the three layers.
    os.environ.setdefault("PIPELINE_EGRESS", "none")
    # So do a second dataset's streams (PIPELINE_DATASETS names them): the other tests run the first's.
    os.environ.setdefault("PIPELINE_DATASETS", "none")
    # The JVMs the suite starts (the pipeline processes tests start, the brokers) are short-lived
    # and work on a few hundred records: the C2 compiler would spend more CPU than it ever saves,
    # and the suite runs two workers on two cores. C1 alone takes about a third less CPU. Each
    # worker's own Spark driver is the exception: it runs for the whole session (see `spark`).
    # Without tiers the JVM shrinks its code cache to 48 MB, which a Spark driver running for
    # minutes fills ("Out of space in CodeCache"): keep the tiered default of 240 MB.
    # For the same reason Spark evaluates expressions interpreted rather than compiling Java for
    # each one (spark.sql.codegen.factoryMode, read by every driver from its system properties;
    # Spark's own suites run both modes to the same results): a cold bronze, silver and gold run
    # takes about a fifth less CPU. In production each stream interprets its small batches and
    # compiles its large ones (pipeline/session/codegen.py); a driver started interpreted stays so.
    # JVMs print "Picked up JAVA_TOOL_OPTIONS" on stderr; no test reads a JVM's first line.
    os.environ.setdefault(
        "JAVA_TOOL_OPTIONS",
        "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -Dspark.sql.codegen.factoryMode=NO_CODEGEN",
    )


def pytest_addoption(parser):
    parser.addoption(
        "--storage",
        choices=STORAGES,
        default="{{ cookiecutter.storage }}",
        help="where the tests marked `storage` keep their lakehouse: under the test's tmp_path (local) or "
        "on the session's S3 server (s3); default: the bake's storage answer",
    )


# The tiers whose tests take minutes, longest first: `make test-all` deals them out before the rest.
LONG_TIERS = ("faults", "bench", "cluster", "slow")


def pytest_collection_modifyitems(items):
    # The broker marker follows from the fixtures a test uses, so it can never be forgotten.
    for item in items:
        if "kafka_broker" in item.fixturenames:
            item.add_marker(pytest.mark.kafka)
    # Workers take the next test as they finish one: with the long tests first, the last ones
    # are short, and no worker runs a long test alone at the end while the other has nothing.
    items.sort(key=_tier_rank)


def _tier_rank(item) -> int:
    return next((rank for rank, tier in enumerate(LONG_TIERS) if item.get_closest_marker(tier)), len(LONG_TIERS))


@pytest.fixture(scope="session")
def spark():
    # With S3A and the conditional-write log store, so that tests/test_s3.py reads and writes the S3
    # server's tables in this session too (it points s3a:// at that server once it runs: s3_spark).
    packages, conf = s3.connector_options()
    # One session serves a worker's whole share of the suite, hundreds of tests: Spark's status
    # store kept the last thousand queries, jobs and stages with their plans and task metrics, and
    # with Delta's cached snapshots that filled the default 1 GB heap (85 % live after a full GC,
    # a concurrent GC cycle every few seconds). Keep fewer, and give the heap room.
    conf = {
        **conf,
        "spark.driver.memory": "2g",
        "spark.sql.ui.retainedExecutions": "50",
        "spark.ui.retainedJobs": "100",
        "spark.ui.retainedStages": "100",
        "spark.ui.retainedTasks": "2000",
        # Unlike the suite's other JVMs, this driver runs for the whole session, most of the suite's
        # work, so the C2 compiler pays for itself: on one worker the first test runs 12 % slower (the
        # compiling) and the tests after it about 30 % faster. The code cache keeps its tiered size
        # from JAVA_TOOL_OPTIONS; a later -XX flag wins over an earlier one.
        DRIVER_JAVA_OPTIONS: "-XX:TieredStopAtLevel=4",
    }
    # The benchmark's egress phase runs in this session too (tests/test_bench.py): its baseline's JDBC driver.
    packages = [*packages, *baseline_packages()]
    # `make install` cached every jar; a jar Maven Central served empty is fetched again, as there.
    session = download_with_retries(
        "Spark's package jars",
        lambda: build_spark(
            "tests", master="local[2]", shuffle_partitions=2, ui_enabled=False, extra_packages=packages, extra_conf=conf
        ),
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def contend_with_a_stale_look(monkeypatch):
    """Make this process the other contender for a lease: its one look at the lease is the stale view
    it is given (what it saw just before the winner took it); every later look, the read-back, is the truth."""

    def contend(stale_view) -> None:
        looks = iter([stale_view])
        real_current = lease._current
        monkeypatch.setattr(
            lease, "_current", lambda spark, directory: next(looks, None) or real_current(spark, directory)
        )

    return contend


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3-compatible server (SeaweedFS) for the whole test session, with its bucket `lakehouse`."""
    server = LocalS3(tmp_path_factory.mktemp("s3"))
    server.start()
    yield server
    server.stop(timeout=1)


@pytest.fixture(scope="session")
def s3_spark(spark, s3_server):
    """The session's Spark with every s3a:// path on the test S3 server (the test's own credentials)."""
    access_key, secret_key = s3.read_credentials_file(s3_server.credentials_file)
    hadoop = spark._jsc.hadoopConfiguration()
    for key, value in {
        "fs.s3a.endpoint": s3_server.endpoint,
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
        "fs.s3a.access.key": access_key,
        "fs.s3a.secret.key": secret_key,
        # A create without overwrite skips S3A's own look first, as in a race where both looked
        # before either wrote: only a conditional upload still refuses (tests/test_s3.py, leases).
        "fs.s3a.performance.flags": "create",
    }.items():
        hadoop.set(key, value)
    return spark


@pytest.fixture
def s3_lakehouse(request, s3_server, s3_spark, monkeypatch) -> str:
    """A lakehouse root under a prefix of its own on the session's S3 server, which the environment
    names (``LAKEHOUSE_ROOT``, ``S3_ENDPOINT=local``) for every command the test runs, in this process
    or in a child. The credentials come from the server's file, never from AWS's variables."""
    test = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:60]
    root = f"s3a://{BUCKET}/{test}-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("LAKEHOUSE_ROOT", root)
    monkeypatch.setenv("S3_ENDPOINT", "local")
    monkeypatch.setenv("S3_LOCAL_HOME", str(s3_server.home))
    # Unset, and unset again afterwards: a command run in this process puts the server's credentials
    # into os.environ (s3.prepare), and they must not outlive the test.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return root


@pytest.fixture
def lakehouse_root(request, tmp_path) -> str:
    """This test's lakehouse: under its tmp_path, or, for a test marked `storage` in a suite run with
    ``--storage=s3``, on the session's S3 server (``s3_lakehouse``)."""
    if request.node.get_closest_marker("storage") and request.config.getoption("storage") == "s3":
        return request.getfixturevalue("s3_lakehouse")
    return str(tmp_path / "lakehouse")


class LakehouseFiles:
    """What an operator or a crash does to a lakehouse's files, on a local disk or on S3 alike
    (through the session's Hadoop filesystems): lose a directory, keep a copy, put a copy back."""

    def __init__(self, spark):
        self._spark = spark

    def _resolve(self, path):
        hadoop_path = java_class(self._spark, "org.apache.hadoop.fs.Path")(str(path))
        return hadoop_path.getFileSystem(self._spark._jsc.hadoopConfiguration()), hadoop_path

    def remove(self, path) -> None:
        filesystem, hadoop_path = self._resolve(path)
        assert filesystem.delete(hadoop_path, True), f"nothing to remove at {path}"

    def copy(self, source, target) -> None:
        """Copy what the directory ``source`` holds into the directory ``target``, across filesystems too.

        ``target`` must hold no file: on S3 a removed directory may stay listed, empty (SeaweedFS does).
        """
        (source_fs, source_path), (target_fs, target_path) = self._resolve(source), self._resolve(target)
        assert not (target_fs.exists(target_path) and target_fs.listFiles(target_path, True).hasNext()), target
        target_fs.mkdirs(target_path)
        hadoop_path = java_class(self._spark, "org.apache.hadoop.fs.Path")
        file_util = java_class(self._spark, "org.apache.hadoop.fs.FileUtil")
        for status in source_fs.listStatus(source_path):
            child = hadoop_path(target_path, status.getPath().getName())
            copied = file_util.copy(
                source_fs, status.getPath(), target_fs, child, False, self._spark._jsc.hadoopConfiguration()
            )
            assert copied, f"{status.getPath()} was not copied to {child}"

    def listing(self, root, depth: int) -> list[str]:
        """Every path under the directory ``root``, ``depth`` levels down, relative to it."""
        filesystem, hadoop_root = self._resolve(root)
        found, level = [], [(hadoop_root, "")]
        for _ in range(depth):
            below = []
            for directory, relative in level:
                for status in filesystem.listStatus(directory):
                    path = relative + status.getPath().getName()
                    found.append(path)
                    if status.isDirectory():
                        below.append((status.getPath(), path + "/"))
            level = below
        return found

    def newest_batch(self, directory) -> int:
        """The highest batch number in a checkpoint's ``offsets`` or ``commits`` directory."""
        filesystem, hadoop_path = self._resolve(directory)
        names = [status.getPath().getName() for status in filesystem.listStatus(hadoop_path)]
        return max(int(name) for name in names if name.isdigit())


@pytest.fixture
def lakehouse_files(spark) -> LakehouseFiles:
    return LakehouseFiles(spark)


CONFIGURATION_MD = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def lakehouse_streams() -> list[str]:
    """Every stream of this project that may hold a checkpoint: each dataset's layers and fused stream, the
    egresses."""
    return [*(name for each in DATASETS for name in (*each.streams, each.stream("fused"))), *installed_names()]


def layout_block() -> str:
    """The code block under "Layout under the root:" in configuration.md."""
    return CONFIGURATION_MD.read_text().split("Layout under the root:", 1)[1].split("```")[1]


def documented_layout() -> list[list[str]]:
    """The paths under a lakehouse root that configuration.md's layout names, each as the patterns of its
    parts: ``<stream>`` one of this project's streams, ``<table>`` one of its tables, ``<dataset>`` a dataset's
    name, ``<batch>`` a number."""
    block = layout_block()
    placeholders = {
        "<stream>": "|".join(map(re.escape, lakehouse_streams())),
        "<table>": "|".join(re.escape(table) for each in DATASETS for table in each.tables),
        "<dataset>": DATASET_NAME_PATTERN.pattern,
        "<batch>": r"\d+",
    }

    def pattern(part: str) -> str:
        pieces = re.split(r"(<[a-z]+>)", part)
        return "".join(f"(?:{placeholders[piece]})" if piece in placeholders else re.escape(piece) for piece in pieces)

    paths = [token for line in block.splitlines() for token in line.split() if re.match(r"[a-z_]+/", token)]
    return [[pattern(part) for part in path.strip("/").split("/")] for path in paths]


def undocumented_paths(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to a lakehouse root) that the layout neither names nor holds, nor leads to.

    Example::

        undocumented_paths(["tables/bronze_events/_delta_log", "stray"])  # ["stray"]
    """
    layout = documented_layout()

    def documented(path: str) -> bool:
        parts = path.split("/")
        return any(
            all(re.fullmatch(pattern, part) for pattern, part in zip(patterns, parts, strict=False))
            for patterns in layout
        )

    return [path for path in paths if not documented(path)]


@pytest.fixture
def undocumented_in_lakehouse(lakehouse_files):
    """``undocumented_paths`` of what a lakehouse root holds, three levels down (the layout's deepest)."""
    return lambda root: undocumented_paths(lakehouse_files.listing(root, 3))


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory) -> str:
    """The URL of a real schema registry (Apicurio, Confluent's API) for the whole test session."""
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    url = registry.start()
    yield url
    registry.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real single-node KRaft broker for the whole test session."""
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap_servers


def fresh_topic(bootstrap: str, prefix: str) -> str:
    """A new two-partition topic on the broker at ``bootstrap``, named ``<prefix>-<six random hex digits>``."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(timeout=30)
    return name


@pytest.fixture
def topic(kafka_bootstrap, request) -> str:
    """A fresh two-partition topic named after the test."""
    return fresh_topic(kafka_bootstrap, re.sub(r"[^a-zA-Z0-9-]", "-", request.node.name)[:80])


@pytest.fixture
def config(request, lakehouse_root, kafka_bootstrap, topic) -> Config:
    """The packaged local config pointed at the test broker, topic and a private lakehouse; and at the session's
    schema registry where the test asks for it (``schema_registry``: a test driving an Avro dataset), else at
    none (its commands run JSON datasets alone)."""
    registry = request.getfixturevalue("schema_registry") if "schema_registry" in request.fixturenames else ""
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "KAFKA_TOPICS": topic,
        "LAKEHOUSE_ROOT": lakehouse_root,
        "PIPELINE_EGRESS": os.environ["PIPELINE_EGRESS"],
        "SCHEMA_REGISTRY_URL": registry,
        # On S3: the server s3_lakehouse named.
        **{name: os.environ[name] for name in ("S3_ENDPOINT", "S3_LOCAL_HOME") if name in os.environ},
    }
    return configure(load_config("local", environ=environ), environ)


@pytest.fixture
def pipeline_env(monkeypatch, config):
    """The test's broker, topic and lakehouse in the environment, for the command line in-process or in a child."""
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", config.kafka.bootstrap_servers)
    monkeypatch.setenv("KAFKA_TOPICS", ",".join(config.kafka.topics))
    monkeypatch.setenv("LAKEHOUSE_ROOT", config.lakehouse_root)
    return config


def committed_records(config: Config, topics: list[str]) -> dict[tuple[str, int, int], bytes | None]:
    """{(topic, partition, offset): value} of every committed record Kafka holds, read by a plain
    read_committed consumer: the oracle shares no code with the pipeline or its audit."""
    consumer = Consumer(
        client_config(
            config,
            **{"group.id": f"oracle-{uuid.uuid4()}", "isolation.level": "read_committed", "enable.auto.commit": False},
        )
    )
    try:
        assignment, ends = [], []
        for topic in topics:
            for partition in partitions_with_leaders(consumer, topic):
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
                if high > low:
                    assignment.append(TopicPartition(topic, partition, low))
                    ends.append(high)
        consumer.assign(assignment)
        found: dict[tuple[str, int, int], bytes | None] = {}
        idle = 0
        # Done when every partition's position passed the end seen at the start; a transaction still
        # open holds the position back, and then only five idle seconds end the read.
        while idle < 10:
            message = consumer.poll(0.5)
            if message is None:
                positions = consumer.position([TopicPartition(tp.topic, tp.partition) for tp in assignment])
                if all(tp.offset >= end for tp, end in zip(positions, ends, strict=True)):
                    break
                idle += 1
            elif not message.error():
                found[(message.topic(), message.partition(), message.offset())] = message.value()
                idle = 0
        return found
    finally:
        consumer.close()


@pytest.fixture
def kafka_oracle():
    """``committed_records``, for the tests that judge the pipeline against Kafka itself."""
    return committed_records


def set_cleanup_policy(config: Config, topic: str, policy: str) -> None:
    """Set ``topic``'s cleanup.policy on the test broker, as ``kafka-configs.sh --alter`` does.

    Returns once the broker itself reports the new policy: in KRaft the controller acknowledges
    the change when it is in the metadata log, and the broker applies it a moment later, so a
    describe straight after the alter can still show the old value.
    """
    entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient(client_config(config))  # kept alive until the change is done
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    described = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + 30
    while True:
        found = admin.describe_configs([described])[described].result(30)["cleanup.policy"].value
        if found == policy:
            return
        assert time.monotonic() < deadline, f"{topic}: cleanup.policy still {found}"
        time.sleep(0.1)


@pytest.fixture
def cleanup_policy():
    """``set_cleanup_policy``, for the tests that make a topic compacted under the pipeline."""
    return set_cleanup_policy


def write_gold_in_files(spark, path: str, windows: int, files: int, mode: str = "append", bump: int = 0) -> None:
    """``windows`` gold rows (one a minute from 2024-05-01 09:00) written in ``files`` data files.

    Gold is never compacted and every MERGE adds files, so a real gold ends up with many; an
    overwrite (``mode``) stands for a rebuild that swaps gold in. ``bump`` adds to every count.
    The table is made with its change data feed on when it does not exist.
    """
    from delta.tables import DeltaTable

    # No file statistics: this gold is never queried by value, and they cost more than the rows.
    DeltaTable.createIfNotExists(spark).location(path).addColumns(GOLD_SCHEMA).property(
        "delta.enableChangeDataFeed", "true"
    ).property("delta.dataSkippingNumIndexedCols", "0").execute()
    start = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
    rows = [
        (start + timedelta(minutes=i), start + timedelta(minutes=i + 1), "purchase", i + 1 + bump, Decimal(f"{i}.25"))
        for i in range(windows)
    ]
    # Two tasks writing many files each: a task per file costs more than the files.
    per_file = -(-windows // files)
    written = spark.createDataFrame(rows, GOLD_SCHEMA).repartition(2).write.format("delta").mode(mode)
    written.option("maxRecordsPerFile", per_file).save(path)


@pytest.fixture
def gold_in_files():
    """``write_gold_in_files``, for the tests of an egress following a gold of many files."""
    return write_gold_in_files
