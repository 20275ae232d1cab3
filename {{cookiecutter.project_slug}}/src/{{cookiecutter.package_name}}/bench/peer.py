"""The peer: this project against the same pipeline in Spark Declarative Pipelines (SDP), on the same topic.

A team building Kafka -> Delta medallion tables on open-source Spark has a built-in alternative, the
`spark-pipelines` command of ``pyspark[pipelines]``. ``sdp_flows.py`` is the same pipeline written in it
(bronze and silver streaming tables, gold a materialized view). Both systems drain the benchmark's
topic from empty storage, taking turns (never at the same time), as a team would run them: the
project's own `run --layer all --available-now` in a new process (``recovery.drain_process``), and
`spark-pipelines run` in a new process (``SdpPeer.run``). Three workloads, one after the other on the
same tables: the catch-up (the benchmark's backlog), an increment (``sizes.peer_increment`` more
records on that history) and a one-record batch. After each, both golds must hold the same rows
(``_same_gold``), or the phase fails: a faster wrong answer is no answer.

Each process is observed through its log only, each line stamped when it appears. The project: the
time to its first stream start (start-up) and each layer's span (``recovery.ChildLog``). SDP: the time
to its first flow start, and each flow's span from its start to its end (``FlowLog``). SDP's gold is a
materialized view, recomputed from all of silver at every run: it is truncated first and empty until
rewritten, and how long is read from its Delta log (``gold_empty_seconds``).

Running Kafka -> Delta in SDP 4.2.0 takes these (each a fact of that version):

* The CLI starts a local Spark Connect server in a second JVM and forwards its command-line ``--conf``
  to it in groups of ten, of which pyspark 4.2.0 keeps only the last group. Static settings (the jars,
  Delta's extension and catalog, the warehouse) therefore go in a ``spark-defaults.conf`` under a
  ``SPARK_CONF_DIR`` of the peer's own (``write_spark_defaults``). ``spark.master`` must not be there:
  it breaks the command (the server is local, on every core: ``local[*]``).
* A static setting in the spec's ``configuration`` fails every flow with CANNOT_MODIFY_CONFIG: only
  session settings go there (``pipeline_spec``).
* The default in-memory catalog forgets the tables between runs, so a second run fails with
  DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION: a Hive catalog on an embedded Derby database keeps them.
* ``@dp.table(format="delta")`` fails re-runs with DELTA_CANNOT_CHANGE_PROVIDER:
  ``spark.sql.sources.default=delta`` makes every table Delta instead.
* A watermark or dedup on ``readStream.table("bronze")`` fails on a fresh pipeline with
  TABLE_OR_VIEW_NOT_FOUND (SPARK-57489): the dedup is in the flow that reads Kafka.

One more, which the peer has to work around as a team would: on a pipeline's first run SDP starts
the flows reading bronze (silver and quarantine) when bronze has completed, but on every later run it
starts them with bronze, and each one's availableNow run ends at the bronze version it found at its
start. What bronze commits after that stays in bronze until the next run: one run of the one-record
workload left the record out of silver and gold, and one of an increment a record out of
quarantine. So ``SdpPeer.drain`` runs `spark-pipelines run` again while bronze holds commits that
silver's or quarantine's checkpoint has not read (``unread``), at most ``MAX_RUNS`` times, then fails
naming them. Every run's time is SDP's time for the workload (``combine_runs``), and how many runs each
workload took is reported (``peer_sdp_<workload>_runs``).

The peer lives with the benchmark, in the project's ``peer`` extra, which `make bench` installs;
production code never imports it. Without the extra the phase is skipped, and its figures are
not in the report (``sdp.installed``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from urllib.parse import urlparse

from ..pipeline.config import Config
from ..pipeline.datasets.events import EVENTS
from ..pipeline.delta.tables import BRONZE, GOLD, LAYERS, QUARANTINE, SILVER, Lakehouse
from ..pipeline.kafka.clients import bootstrap_servers
from ..pipeline.session.spark import snapshot_partitions
from . import sdp
from .harness import Bench, on_cpus, own_cpus, say
from .load import produce_backlog, produce_one_transaction
from .recovery import drain_process
from .report import load_average

FLOWS_FILE = Path(__file__).with_name("sdp_flows.py")
SPEC_FILE = "pipeline.json"
DEFAULTS_FILE = "spark-defaults.conf"
# Settings a spark-defaults.conf of the peer must never hold: the command breaks with a master set there.
FORBIDDEN_DEFAULTS = ("spark.master",)
# "2026-05-09 07:31:02: Flow spark_catalog.default.bronze is RUNNING." (the CLI prints SDP's events so).
FLOW_EVENT = re.compile(r"Flow [`'\"]?(?P<flow>[\w.`]+?)[`'\"]? (?:is|has) (?P<state>[A-Z_]+)")
# A flow's states: queued and idle are before it starts; these end it.
WAITING_STATES = frozenset({"QUEUED", "IDLE"})
END_STATES = frozenset({"COMPLETED", "FAILED", "STOPPED", "SKIPPED", "EXCLUDED"})
# Jars of the benchmark's session that the peer does not need (the S3 lakehouse's, the JDBC baseline's):
# the project's drains do not load them either, and each jar is copied at every start.
NOT_FOR_THE_PEER = ("hadoop-aws", "awssdk", "software.amazon", "wildfly", "reactive-streams", "postgresql")
# The peer's gold: its flow's name in sdp_flows.py, and its table's (the project's gold is GOLD).
PEER_GOLD = "gold"
POLL_S = 0.05
# `spark-pipelines run`s a workload may take before silver must have read all of bronze (``SdpPeer.drain``).
MAX_RUNS = 3
WORKLOADS = ("catch_up", "increment", "one_record")
# The peer's flows: the three layers and silver's quarantine (sdp_flows.py).
PEER_QUARANTINE = "quarantine"
PEER_FLOWS = (*LAYERS, PEER_QUARANTINE)
# The flows that stream from bronze, each with a checkpoint of what it has read of it.
BRONZE_READERS = ("silver", PEER_QUARANTINE)
# Spark's default driver memory, which the project's drains run with: SDP's server is given the same, outright.
DRIVER_MEMORY = "1g"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


class Dedup(StrEnum):
    """SDP bronze's dedup on the Kafka coordinates (``peer.bronze_dedup`` in sdp_flows.py)."""

    # None: Delta's streaming sink already skips a replayed batch, so a dedup buys SDP nothing.
    NONE = "none"
    # On RocksDB's state store, as a competent user runs a stateful operator.
    ROCKSDB = "rocksdb"


@dataclass(frozen=True)
class Setup:
    """One way the pairs run: SDP bronze's dedup, and whether SDP reads a backlog in the project's batch
    size (``capped``) or in one batch. The project always runs as configured (its batch size)."""

    name: str
    dedup: Dedup
    capped: bool


# The headline first: SDP as a competent user runs a catch-up, uncapped and without the dedup.
SETUPS = (
    Setup("fair", Dedup.NONE, capped=False),
    Setup("rocksdb", Dedup.ROCKSDB, capped=False),
    Setup("capped", Dedup.NONE, capped=True),
)


# --------------------------------------------------------------------------- the peer's files


def spark_defaults(jars: list[str], home: Path | str, driver_memory: str = DRIVER_MEMORY) -> dict[str, str]:
    """The static settings of the peer's Spark Connect server, for its ``spark-defaults.conf``.

    Delta's extension and catalog, a Hive catalog on an embedded Derby database and a warehouse, both
    under ``home`` (so a second run finds the tables of the first), Delta as the default format, and
    the driver's memory (the project's drains run with Spark's default, ``DRIVER_MEMORY``).

    Example::

        spark_defaults(["/root/.ivy2.5.2/jars/io.delta_delta-spark_4.2_2.13-4.4.0.jar"], "/tmp/peer")
    """
    if not isinstance(jars, list) or not jars or not all(isinstance(jar, str) and jar for jar in jars):
        raise ValueError(f"jars must be a non-empty list of jar paths, not {jars!r}")
    if not str(home):
        raise ValueError("home must name a directory")
    if not isinstance(driver_memory, str) or not re.fullmatch(r"\d+[kmgt]", driver_memory):
        raise ValueError(f"driver_memory must be a JVM size such as 1g, not {driver_memory!r}")
    home = Path(home).absolute()
    return {
        "spark.jars": ",".join(jars),
        "spark.driver.memory": driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        # The in-memory catalog forgets the tables between runs: the second run would fail.
        "spark.sql.catalogImplementation": "hive",
        "spark.hadoop.javax.jdo.option.ConnectionURL": (
            f"jdbc:derby:;databaseName={home / 'metastore_db'};create=true"
        ),
        "spark.sql.warehouse.dir": str(home / "warehouse"),
        # Not @dp.table(format="delta"): that fails every re-run with DELTA_CANNOT_CHANGE_PROVIDER.
        "spark.sql.sources.default": "delta",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }


def write_spark_defaults(conf_dir: Path | str, settings: dict[str, str]) -> Path:
    """``settings`` as ``conf_dir/spark-defaults.conf`` (one ``key value`` line each); returns its path.

    Example::

        write_spark_defaults(home / "conf", spark_defaults(jars, home))  # then SPARK_CONF_DIR=home/conf
    """
    if not isinstance(settings, dict) or not settings:
        raise ValueError(f"settings must be a non-empty dict of Spark settings, not {settings!r}")
    forbidden = [key for key in settings if key in FORBIDDEN_DEFAULTS]
    if forbidden:
        raise ValueError(f"{', '.join(forbidden)} breaks `spark-pipelines run` when set in spark-defaults.conf")
    for key, value in settings.items():
        if not isinstance(key, str) or not key or any(c.isspace() for c in key):
            raise ValueError(f"a Spark setting's name has no spaces: {key!r}")
        if not isinstance(value, str) or "\n" in value:
            raise ValueError(f"setting {key}: the value must be a string on one line, not {value!r}")
    path = Path(conf_dir) / DEFAULTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key} {value}\n" for key, value in settings.items()))
    return path


def pipeline_configuration(
    config: Config, dedup: Dedup = Dedup.NONE, capped: bool = False, dedup_watermark: str = "10 minutes"
) -> dict[str, str]:
    """The spec's ``configuration``: what ``sdp_flows.py`` reads (``peer.*``) and session settings only.

    Every plain Spark, Delta and Kafka setting the project's drains run with is SDP's too: the shuffle
    partitions, Delta's snapshot partitions, the Kafka source's fetch wait, the session's time zone.
    ``capped``: bronze reads a backlog in batches of ``config``'s size, as the project does; otherwise
    in one. ``dedup``: bronze's dedup on the Kafka coordinates, and its state store.

    Example::

        pipeline_configuration(bench.phase_config(root, topic))["peer.topic"]  # the phase's topic
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a pipeline Config, not {type(config).__name__}")
    if len(config.kafka.topics) != 1:
        raise ValueError(f"the peer reads one topic, not {config.kafka.topics}")
    if not isinstance(dedup, Dedup):
        raise TypeError(f"dedup must be a Dedup, not {dedup!r}")
    if not isinstance(capped, bool):
        raise TypeError(f"capped must be a bool, not {capped!r}")
    configuration = {
        "peer.bootstrap_servers": bootstrap_servers(config),
        "peer.topic": config.kafka.topics[0],
        "peer.max_offsets_per_trigger": str(config.kafka.max_offsets_per_trigger or 0) if capped else "0",
        "peer.fetch_max_wait_ms": str(config.kafka.fetch_max_wait_ms),
        "peer.window": config.gold_window,
        "peer.bronze_dedup": dedup.value,
        "peer.dedup_watermark": dedup_watermark,
        # Session settings only: a static one here fails every flow with CANNOT_MODIFY_CONFIG.
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(config.shuffle_partitions),
        "spark.databricks.delta.snapshotPartitions": str(snapshot_partitions(config.shuffle_partitions)),
    }
    if dedup is Dedup.ROCKSDB:
        configuration["spark.sql.streaming.stateStore.providerClass"] = ROCKSDB_PROVIDER
    return configuration


def pipeline_spec(name: str, storage: Path | str, libraries: list[str], configuration: dict[str, str]) -> dict:
    """A `spark-pipelines` spec: ``libraries`` are paths relative to the spec's directory (the CLI globs there).

    Example::

        pipeline_spec("bench-peer", home / "storage", ["sdp_flows.py"], pipeline_configuration(config))
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a pipeline needs a name")
    if not str(storage):
        raise ValueError("storage must name a directory")
    if not libraries or not all(isinstance(library, str) and library for library in libraries):
        raise ValueError(f"libraries must be a non-empty list of paths, not {libraries!r}")
    absolute = [library for library in libraries if Path(library).is_absolute()]
    if absolute:
        # pathlib's glob, which the CLI uses, refuses an absolute pattern.
        raise ValueError(f"libraries are relative to the spec's directory, not {absolute}")
    if not all(isinstance(key, str) and isinstance(value, str) for key, value in configuration.items()):
        raise ValueError("configuration maps strings to strings (the CLI refuses anything else)")
    return {
        "name": name,
        # SDP refuses a storage root without a scheme (PIPELINE_STORAGE_ROOT_INVALID).
        "storage": str(storage) if "://" in str(storage) else Path(storage).absolute().as_uri(),
        "libraries": [{"glob": {"include": library}} for library in libraries],
        "configuration": dict(configuration),
    }


def write_spec(path: Path | str, spec: dict) -> Path:
    """``spec`` as JSON (which the CLI's YAML loader reads) at ``path``; returns the path."""
    if not isinstance(spec, dict) or not {"name", "storage"} <= spec.keys():
        raise ValueError(f"a pipeline spec needs a name and a storage, got {spec!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=2) + "\n")
    return path


def peer_jars(spark) -> list[str]:
    """The jar files of Delta and the Kafka connector, as the benchmark's session resolved them.

    The session's own list (spark-submit's, with the files its packages resolved to) less the jars of
    what the peer never uses: the S3 lakehouse's and the JDBC baseline's (``NOT_FOR_THE_PEER``).

    Example::

        peer_jars(bench.spark)  # ["/root/.ivy2.5.2/jars/io.delta_delta-spark_4.2_2.13-4.4.0.jar", ...]
    """
    from ..pipeline.session.spark import JARS, java_class

    package = Path(__file__).resolve().parents[1]
    listed = java_class(spark, "java.lang.System").getProperty(JARS) or ""
    listed += "," + (spark.sparkContext.getConf().get(JARS) or "")
    jars: list[str] = []
    for jar in filter(None, listed.split(",")):
        path = urlparse(jar).path if jar.startswith("file:") else jar
        name = Path(path).name
        # The project's own jar (the S3 log store) is in its package: the peer writes nothing to S3.
        if any(part in name for part in NOT_FOR_THE_PEER) or Path(path).resolve().is_relative_to(package):
            continue
        if Path(path).is_file() and path not in jars:
            jars.append(path)
    if not any("delta-spark" in Path(jar).name for jar in jars) or not any("sql-kafka" in jar for jar in jars):
        raise RuntimeError(f"the benchmark's session holds no Delta or Kafka connector jar for the peer: {listed}")
    return jars


# --------------------------------------------------------------------------- the peer's log and tables


class FlowLog:
    """Follows `spark-pipelines run`'s output: every line, stamped with time.monotonic() when it appeared."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.lines: list[tuple[float, str]] = []

    def poll(self) -> None:
        try:
            with self.path.open("rb") as log:
                log.seek(self._offset)
                data = log.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        now = time.monotonic()
        *lines, self._partial = (self._partial + data).split(b"\n")
        self.lines.extend((now, raw.decode(errors="replace")) for raw in lines)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-lines:])


def flow_name(name: str) -> str:
    """A flow's short name: ``spark_catalog.default.bronze`` and ```bronze``` are ``bronze``."""
    return name.replace("`", "").rpartition(".")[2]


def flow_times(lines: list[tuple[float, str]], launched: float) -> dict:
    """Each flow's states and span, from stamped log lines (``FlowLog.lines``) of a run launched at ``launched``.

    ``flow_states``: every state each flow reported, in order; ``flow_spans``: [start, end] in seconds from
    the launch, from its first state past QUEUED to its end state; ``flow_seconds``: their lengths;
    ``startup_seconds``: launch to the first flow's start; ``end_seconds``: launch to the last flow's end.

    Example::

        flow_times([(10.5, "2026-05-09 07:31:02: Flow spark_catalog.default.bronze is RUNNING."), ...], 0.0)
    """
    if not isinstance(launched, (int, float)):
        raise TypeError(f"launched must be a time.monotonic() value, not {launched!r}")
    states: dict[str, list[str]] = {}
    started: dict[str, float] = {}
    ended: dict[str, float] = {}
    for at, line in lines:
        match = FLOW_EVENT.search(line)
        if not match:
            continue
        flow, state = flow_name(match["flow"]), match["state"]
        states.setdefault(flow, []).append(state)
        if state not in WAITING_STATES and state not in END_STATES:
            started.setdefault(flow, at)
        if state in END_STATES:
            # A flow that ends without a start state in between (a fast one) started when it ended.
            started.setdefault(flow, at)
            ended[flow] = at
    spans = {flow: [started[flow] - launched, ended.get(flow, started[flow]) - launched] for flow in started}
    return {
        "flow_states": states,
        "flow_spans": spans,
        "flow_seconds": {flow: end - start for flow, (start, end) in spans.items()},
        "startup_seconds": min((start for start, _ in spans.values()), default=None),
        "end_seconds": max((end for _, end in spans.values()), default=None),
    }


def delta_commits(table: Path | str) -> list[dict]:
    """Every commit of the Delta table at ``table`` (a local path), in order: version, timestamp (ms),
    operation, rows written (``numOutputRows``, when the commit says), the table's id (a commit that
    sets its metadata), and the data files it added (``data_added``: those added as new data) and removed."""
    log_dir = Path(table) / "_delta_log"
    commits = []
    for path in sorted(log_dir.glob("*.json")):
        if not path.stem.isdigit():
            continue
        commit = {
            "version": int(path.stem),
            "timestamp": None,
            "operation": None,
            "rows": None,
            "table_id": None,
            "added": [],
            "data_added": [],
            "removed": [],
        }
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                commit["timestamp"] = action["commitInfo"].get("timestamp")
                commit["operation"] = action["commitInfo"].get("operation")
                rows = (action["commitInfo"].get("operationMetrics") or {}).get("numOutputRows")
                commit["rows"] = int(rows) if rows is not None else None
            elif "metaData" in action:
                commit["table_id"] = action["metaData"].get("id")
            elif "add" in action:
                commit["added"].append(action["add"]["path"])
                # What a streaming reader of the table reads: files added as new data (not OPTIMIZE's rewrites).
                if action["add"].get("dataChange", True):
                    commit["data_added"].append(action["add"]["path"])
            elif "remove" in action:
                commit["removed"].append(action["remove"]["path"])
        commits.append(commit)
    return sorted(commits, key=lambda commit: commit["version"])


def empty_spans(table: Path | str, after_version: int = -1) -> list[dict]:
    """When the table was emptied and refilled: each commit after ``after_version`` that removed its last
    file, the commit that next added one, and the seconds between their timestamps.

    A table empty since its creation is not counted: only data taken away and put back. A span still
    open at the table's last commit has no end and no seconds.

    Example::

        empty_spans(warehouse / "gold")  # [{"emptied": 3, "by": "TRUNCATE", "filled": 4, "seconds": 21.2}]
    """
    if not isinstance(after_version, int):
        raise TypeError(f"after_version must be a table version, not {after_version!r}")
    live: set[str] = set()
    spans: list[dict] = []
    open_span: dict | None = None
    for commit in delta_commits(table):
        had = bool(live)
        live -= set(commit["removed"])
        live |= set(commit["added"])
        if had and not live and commit["version"] > after_version:
            open_span = {"emptied": commit["version"], "by": commit["operation"], "at": commit["timestamp"]}
        elif open_span is not None and live:
            seconds = (commit["timestamp"] - open_span.pop("at")) / 1000
            spans.append(
                {**open_span, "filled": commit["version"], "by_filling": commit["operation"], "seconds": seconds}
            )
            open_span = None
    if open_span is not None:
        open_span.pop("at")
        spans.append({**open_span, "filled": None, "by_filling": None, "seconds": None})
    return spans


def gold_empty_seconds(table: Path | str, after_version: int = -1) -> float:
    """How long the table was empty after ``after_version``: the sum of its closed ``empty_spans`` (0 if none)."""
    return sum(span["seconds"] for span in empty_spans(table, after_version) if span["seconds"] is not None)


def table_version(table: Path | str) -> int:
    """The table's newest version from its log, or -1 before its first commit."""
    return max((commit["version"] for commit in delta_commits(table)), default=-1)


def stream_offset(checkpoint: Path | str) -> dict | None:
    """The source offset a streaming query's checkpoint has committed last, or None before its first batch.

    ``offsets/<n>`` is written when batch n is planned and ``commits/<n>`` when it has been written:
    the offset of the newest batch with both is what the stream has read. A checkpoint's offset file
    is a version line, the batch's metadata, then one line per source: the query must read one source.

    Example::

        stream_offset(home / "storage/_checkpoints/spark_catalog/default/silver/silver/0")
        # {"sourceVersion": 1, "reservoirId": "f85b…", "reservoirVersion": 9, "index": -1, ...}
    """
    checkpoint = Path(checkpoint)
    committed = sorted(
        (int(path.name) for path in (checkpoint / "commits").glob("*") if path.name.isdigit()), reverse=True
    )
    for batch in committed:
        offset = checkpoint / "offsets" / str(batch)
        if not offset.is_file():
            continue
        sources = [line for line in offset.read_text().splitlines()[2:] if line.strip()]
        if len(sources) != 1:
            raise ValueError(f"{offset}: a stream of one source has one offset line, not {len(sources)}")
        return json.loads(sources[0])
    return None


def read_through(offset: dict | None) -> int:
    """The newest table version of which a Delta streaming source has read every file (-1: none).

    A Delta source offset names the version it is in (``reservoirVersion``) and how far into it
    (``index``): -1 is before its first file, so every earlier version is read (Delta writes a version
    read to its end as the next version at -1). Any other index is inside a version split across
    batches, so that version is not all read; a point inside the initial snapshot
    (``isStartingVersion``) reads as nothing read. Never more read than there is: a doubt costs a run.

    Example::

        read_through({"reservoirVersion": 9, "index": -1, "isStartingVersion": False})  # 8
    """
    if offset is None:
        return -1
    if not isinstance(offset, dict) or not isinstance(offset.get("reservoirVersion"), int):
        raise ValueError(f"not a Delta source offset: {offset!r}")
    if offset.get("isStartingVersion"):
        # Still reading the table as it was at that version: none of it is known to be read.
        return -1
    return offset["reservoirVersion"] - 1


def unread(table: Path | str, checkpoint: Path | str) -> list[dict]:
    """The commits of the Delta table at ``table`` that add data its reader's stream (``checkpoint``) has
    not read yet, each ``{"version", "rows", "files"}``: empty when the reader is caught up.

    Exact and cheap, both logs read as files and no Spark: a commit is unread when it adds data files
    after the version the reader's last committed offset has read through (``read_through``). A commit
    without new data (a table property, an empty streaming batch, OPTIMIZE's rewrites) is not waited for.

    Example::

        unread(peer.table("bronze"), peer.checkpoint("silver"))  # [{"version": 9, "rows": 1, "files": 1}]
    """
    commits = delta_commits(table)
    offset = stream_offset(checkpoint)
    if offset is not None:
        ids = [commit["table_id"] for commit in commits if commit["table_id"]]
        if ids and offset.get("reservoirId") != ids[-1]:
            raise ValueError(f"{checkpoint} reads table {offset.get('reservoirId')}, not {table} (table {ids[-1]})")
    through = read_through(offset)
    return [
        {"version": commit["version"], "rows": commit["rows"], "files": len(commit["data_added"])}
        for commit in commits
        if commit["version"] > through and commit["data_added"]
    ]


# --------------------------------------------------------------------------- the peer


class SdpPeer:
    """The SDP pipeline of ``sdp_flows.py`` on one topic, its tables and checkpoints under ``home``.

    Example::

        peer = SdpPeer(work / "sdp", peer_jars(bench.spark), pipeline_configuration(config))
        run = peer.run(timeout_s=1800)  # {"wall_s": ..., "startup_s": ..., "layer_seconds": {...}, ...}
    """

    def __init__(
        self,
        home: Path | str,
        jars: list[str],
        configuration: dict[str, str],
        name: str = "bench-peer",
        cpus: str | None = None,
    ):
        if not str(home):
            raise ValueError("home must name a directory")
        self.home = Path(home).absolute()
        self.defaults = spark_defaults(jars, self.home)
        self.spec = pipeline_spec(name, self.home / "storage", [FLOWS_FILE.name], configuration)
        # The CPUs `spark-pipelines run` runs on (``harness.on_cpus``): the project's drains run on the same.
        self.cpus = cpus
        self.runs = 0

    @property
    def conf_dir(self) -> Path:
        return self.home / "conf"

    @property
    def spec_path(self) -> Path:
        return self.home / SPEC_FILE

    def table(self, name: str) -> Path:
        """A table's directory: a managed table of the default database, in the warehouse."""
        return Path(self.defaults["spark.sql.warehouse.dir"]) / name

    def checkpoint(self, flow: str) -> Path:
        """A streaming flow's checkpoint: SDP keeps it under the storage root, as
        ``_checkpoints/<catalog>/<database>/<table>/<flow>/<n>``, the newest n the one in use."""
        found = [
            path
            for path in (self.home / "storage" / "_checkpoints").glob(f"*/*/{flow}/{flow}/*")
            if path.is_dir() and path.name.isdigit()
        ]
        tables = {path.parent.parent for path in found}
        if len(tables) != 1:
            raise RuntimeError(f"the peer's storage holds {len(tables)} checkpoints of flow {flow}, not one: {found}")
        return max(found, key=lambda path: int(path.name))

    def prepare(self) -> None:
        """The conf directory, the spec and a copy of the flows beside it: the CLI globs from the spec's directory."""
        self.home.mkdir(parents=True, exist_ok=True)
        write_spark_defaults(self.conf_dir, self.defaults)
        write_spec(self.spec_path, self.spec)
        shutil.copyfile(FLOWS_FILE, self.home / FLOWS_FILE.name)

    def environment(self) -> dict[str, str]:
        inherited = {key: value for key, value in os.environ.items() if key not in ("PYSPARK_SUBMIT_ARGS",)}
        return {
            **inherited,
            "SPARK_CONF_DIR": str(self.conf_dir),
            # The CLI runs the flows with PYSPARK_PYTHON (python3 on the PATH otherwise): this environment's,
            # where the project is installed.
            "PYSPARK_PYTHON": sys.executable,
            # Its lines as they are printed, so each is stamped when it happened.
            "PYTHONUNBUFFERED": "1",
        }

    def run(self, timeout_s: float) -> dict:
        """One `spark-pipelines run` to its end; fails with the log's tail unless every flow completed."""
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if not self.spec_path.is_file():
            self.prepare()
        self.runs += 1
        gold_before = table_version(self.table(PEER_GOLD))
        log_path = self.home / f"run-{self.runs}.log"
        with log_path.open("wb") as log:
            launched = time.monotonic()
            launched_at = time.time()
            # Derby writes derby.log into the working directory: the peer's home.
            process = subprocess.Popen(
                on_cpus([str(sdp.command()), "run", "--spec", str(self.spec_path)], self.cpus),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.home,
                start_new_session=True,
            )
        flows = FlowLog(log_path)
        try:
            while process.poll() is None:
                flows.poll()
                if time.monotonic() > launched + timeout_s:
                    raise RuntimeError(
                        f"`spark-pipelines run` did not finish within {timeout_s:.0f} s:\n{flows.tail()}"
                    )
                time.sleep(POLL_S)
            exited = time.monotonic()
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        flows.poll()
        times = flow_times(flows.lines, launched)
        final = {flow: states[-1] for flow, states in times["flow_states"].items()}
        if process.returncode != 0 or set(final) != set(PEER_FLOWS) or set(final.values()) != {"COMPLETED"}:
            raise RuntimeError(
                f"`spark-pipelines run` failed (exit {process.returncode}, flows {final}); log {log_path}:\n"
                f"{flows.tail()}"
            )
        return {
            "launched": launched,
            "launched_at": launched_at,
            "wall_s": times["end_seconds"],
            "exit_s": exited - launched,
            "startup_s": times["startup_seconds"],
            "layer_seconds": {layer: times["flow_seconds"][layer] for layer in LAYERS},
            "flow_spans": times["flow_spans"],
            "flow_states": times["flow_states"],
            "gold_empty_s": gold_empty_seconds(self.table(PEER_GOLD), gold_before),
            "gold_empty_spans": empty_spans(self.table(PEER_GOLD), gold_before),
            "log": str(log_path),
        }

    def drain(self, timeout_s: float, max_runs: int = MAX_RUNS) -> dict:
        """`spark-pipelines run` until silver and quarantine have read all of bronze: what a team must do
        with SDP 4.2.0.

        On a pipeline's first run SDP starts the flows reading bronze when bronze has completed; on every
        later run it starts them with bronze, and each one's availableNow run ends at the bronze version
        it found at its start, so what bronze writes after that waits for the next run. After each run,
        bronze's commits that a reader's checkpoint has not read (``unread``, for each of
        ``BRONZE_READERS``: both logs, exact and cheap) ask for another, up to ``max_runs``; then the
        phase fails naming what was left behind. The runs' figures are combined (``combine_runs``): all
        of them are SDP's time for the work.

        Why not simply re-run while the last run's bronze wrote rows: that asks for a run too many
        whenever the readers did read them all (every first run, and a re-run whose readers happened to
        start late), and SDP would be charged for a run it did not need. A checkpoint says what its flow
        has read, bronze's log what there is: exact, from files, without Spark.
        """
        if not isinstance(max_runs, int) or max_runs < 1:
            raise ValueError(f"max_runs must be a positive number of runs, not {max_runs!r}")
        runs: list[dict] = []
        while True:
            run = self.run(timeout_s)
            behind = {flow: unread(self.table("bronze"), self.checkpoint(flow)) for flow in BRONZE_READERS}
            run["unread"] = {flow: commits for flow, commits in behind.items() if commits}
            runs.append(run)
            if not run["unread"]:
                return combine_runs(runs)
            left = {flow: [commit["version"] for commit in commits] for flow, commits in run["unread"].items()}
            if len(runs) >= max_runs:
                raise RuntimeError(
                    f"SDP's flows are still behind bronze after {len(runs)} `spark-pipelines run`: bronze "
                    f"version(s) never read, by flow: {left}; logs {[each['log'] for each in runs]}"
                )
            say(f"peer: bronze version(s) not read yet, by flow, {left} after run {len(runs)}: running again")


def combine_runs(runs: list[dict]) -> dict:
    """The runs a workload took (``SdpPeer.run``'s, in order) as one: SDP's time for that work.

    ``wall_s``: the first launch to the last run's last flow end, every run's start-up and every wait
    for a run's process to exit before the next included; ``startup_s``: the first run's start-up;
    ``layer_seconds``: each flow's spans added up; ``gold_empty_s``: the longest any run's refresh left
    gold empty; ``runs``: how many; ``each_run``: each run's own figures.

    Example::

        combine_runs([peer.run(900), peer.run(900)])["wall_s"]
    """
    if not runs:
        raise ValueError("no runs to combine")
    first, last = runs[0], runs[-1]
    return {
        "wall_s": last["launched"] + last["wall_s"] - first["launched"],
        "exit_s": last["launched"] + last["exit_s"] - first["launched"],
        "startup_s": first["startup_s"],
        "layer_seconds": {layer: sum(run["layer_seconds"][layer] for run in runs) for layer in LAYERS},
        "gold_empty_s": max(run["gold_empty_s"] for run in runs),
        "launched_at": first.get("launched_at"),
        "runs": len(runs),
        "each_run": [
            {key: value for key, value in run.items() if key not in ("launched", "launched_at")} for run in runs
        ],
    }


# --------------------------------------------------------------------------- the comparison


def layer_times(tables: dict[str, Path], launched_at: float, before: dict[str, int], startup_s: float) -> dict:
    """When each layer's table had its last commit of a workload, from the Delta log of each, measured
    the same way for both systems: ``done_s``, seconds from the launch (``launched_at``, wall clock) to
    the table's newest commit after version ``before[layer]``; ``layer_seconds``, each layer's share:
    bronze from the end of start-up (``startup_s``) to its last commit, every later layer from the
    previous layer's last commit to its own (0 when it ended first: a layer run beside the one before).

    Example::

        layer_times({"bronze": root / "bronze", ...}, drain["launched_at"], {"bronze": -1, ...}, 9.5)
    """
    if set(tables) != set(LAYERS) or set(before) != set(LAYERS):
        raise ValueError(f"tables and before name the layers {LAYERS}, not {sorted(tables)} and {sorted(before)}")
    done: dict[str, float] = {}
    for layer in LAYERS:
        stamps = [
            commit["timestamp"]
            for commit in delta_commits(tables[layer])
            if commit["version"] > before[layer] and commit["timestamp"]
        ]
        if not stamps:
            raise RuntimeError(f"{layer}: no commit after version {before[layer]} in {tables[layer]}")
        done[layer] = max(stamps) / 1000 - launched_at
    shares: dict[str, float] = {}
    previous = startup_s
    for layer in LAYERS:
        shares[layer] = max(done[layer] - previous, 0.0)
        previous = max(previous, done[layer])
    return {"done_s": done, "layer_seconds": shares}


def versions(tables: dict[str, Path]) -> dict[str, int]:
    """Each table's newest version (-1 before its first commit), from its Delta log."""
    return {layer: table_version(path) for layer, path in tables.items()}


def project_run(drain: dict, tables: dict[str, Path], before: dict[str, int]) -> dict:
    """The figures of a project drain (``recovery.drain_process``) in the shape of the peer's: the whole
    process's time (``wall_s``), its start-up, and each layer's from the tables' Delta logs."""
    return {
        "wall_s": drain["exit_s"],
        "startup_s": drain["start_s"],
        **layer_times(tables, drain["launched_at"], before, drain["start_s"]),
        "stream_spans": drain["layer_spans"],
        "batches": drain.get("batches", {}),
        "log": drain["log"],
    }


def peer_run(drain: dict, tables: dict[str, Path], before: dict[str, int]) -> dict:
    """The figures of ``SdpPeer.drain`` measured as ``project_run`` measures the project's."""
    return {
        **drain,
        "wall_s": drain["exit_s"],
        "flow_seconds": drain["layer_seconds"],
        **layer_times(tables, drain["launched_at"], before, drain["startup_s"]),
    }


def _same_tables(bench: Bench, project: Lakehouse, peer: SdpPeer, workload: str) -> dict[str, int]:
    """Both golds hold the same rows (the peer's cast to the project's types) and both quarantines the same
    Kafka records; returns their numbers. Fails loudly otherwise, naming a few rows each holds alone:
    the ratios compare the same work only."""
    from pyspark.sql import functions as F

    columns = [*EVENTS.gold_key, *EVENTS.gold_values]
    own = bench.spark.read.format("delta").load(project.table(GOLD)).select(*columns)
    types = {field.name: field.dataType for field in own.schema.fields}
    theirs = (
        bench.spark.read.format("delta")
        .load(str(peer.table(PEER_GOLD)))
        .select(*[F.col(c).cast(types[c]).alias(c) for c in columns])
    )
    coordinates = ["topic", "partition", "offset", "reason"]
    own_quarantine = bench.spark.read.format("delta").load(project.table(QUARANTINE)).select(*coordinates)
    their_quarantine = bench.spark.read.format("delta").load(str(peer.table(PEER_QUARANTINE))).select(*coordinates)
    for what, mine, other in (("golds", own, theirs), ("quarantines", own_quarantine, their_quarantine)):
        only_project, only_peer = mine.exceptAll(other), other.exceptAll(mine)
        missing, extra = only_project.count(), only_peer.count()
        if missing or extra:
            raise RuntimeError(
                f"peer, {workload}: the two {what} differ: {missing} rows only in the project's "
                f"(e.g. {only_project.limit(3).collect()}), {extra} only in SDP's (e.g. {only_peer.limit(3).collect()})"
            )
    return {"gold_rows": own.count(), "quarantined": own_quarantine.count()}


def ratio(peer: float, project: float) -> float:
    """SDP's time over the project's: above 1, the project is faster."""
    return peer / project if project > 0 else float("inf")


def measure(bench: Bench) -> None:
    """The project and SDP in pairs, each pair from fresh storage on a topic of its own holding the same
    records: the catch-up, an increment and one record, the two taking turns (never at the same time),
    on the same CPUs. ``sizes.peer_pairs`` pairs of the fair setup, ``sizes.peer_variant_pairs`` of each
    other (``SETUPS``). Each run's log is kept (``keep_evidence``).
    """
    absent = sdp.missing()
    if absent:
        say(f"peer: skipped, no `{sdp.EXTRA}` extra here (missing {', '.join(absent)}); `make bench` installs it")
        return
    sizes = bench.sizes
    jars = peer_jars(bench.spark)
    cpus = own_cpus()
    records = {"catch_up": sizes.peer_records, "increment": sizes.peer_increment, "one_record": 1}
    setups: dict[str, list[dict]] = {}
    for setup in SETUPS:
        count = sizes.peer_pairs if setup.name == SETUPS[0].name else sizes.peer_variant_pairs
        setups[setup.name] = [_pair(bench, setup, index, jars, cpus) for index in range(count)]
    _report(bench, setups, records)


def _pair(bench: Bench, setup: Setup, index: int, jars: list[str], cpus: str) -> dict:
    """One pair of ``setup``: both systems from fresh storage, every workload; the project first in even pairs."""
    sizes = bench.sizes
    root = bench.work / "peer" / f"{setup.name}-{index}"
    # A topic of its own with the same records (the same seeds): the benchmark's is fed by other phases.
    topic = bench.create_topic(f"bench-peer-{uuid.uuid4().hex[:8]}")
    config = bench.phase_config(root / "project", topic)
    say(f"peer, {setup.name} {index + 1}: producing {sizes.peer_records:,} sample records in transactions")
    produce_backlog(config, topic, sizes.peer_records, seed=29)
    project = Lakehouse(config.lakehouse_root)
    own_tables = {layer: Path(project.table(name)) for layer, name in zip(LAYERS, (BRONZE, SILVER, GOLD), strict=True)}
    peer = SdpPeer(root / "sdp", jars, pipeline_configuration(config, setup.dedup, setup.capped), cpus=cpus)
    peer.prepare()
    peer_tables = {layer: peer.table(layer) for layer in LAYERS}
    workloads: dict[str, dict] = {}
    for turn, workload in enumerate(WORKLOADS):
        if workload == "increment":
            produce_backlog(config, topic, sizes.peer_increment, seed=31)
        elif workload == "one_record":
            produce_one_transaction(config, topic, 1, seed=37)
        # Each goes first in turn, across workloads and pairs: neither always finds the other's pages in the cache.
        order = ("project", "sdp") if (index + turn) % 2 == 0 else ("sdp", "project")
        result: dict = {"first": order[0]}
        for system in order:
            say(f"peer, {setup.name} {index + 1}: {workload.replace('_', '-')}, {system}")
            # What else was running: the machine's load averages as the run starts.
            load = load_average()
            if system == "project":
                before = versions(own_tables)
                result[system] = project_run(drain_process(bench, config, cpus=cpus), own_tables, before)
            else:
                before = versions(peer_tables)
                result[system] = peer_run(peer.drain(sizes.timeout_s), peer_tables, before)
            result[system]["load_before"] = load
        result.update(_same_tables(bench, project, peer, workload))
        workloads[workload] = result
    keep_evidence(bench, f"{setup.name}-{index + 1}", workloads)
    return {"setup": setup.name, "pair": index + 1, "topic": topic, "cpus": cpus, "workloads": workloads}


def keep_evidence(bench: Bench, pair: str, workloads: dict[str, dict]) -> None:
    """Each run's log, copied under the bench's evidence directory as ``peer/<pair>/<workload>-<system>[-<n>].log``,
    where bench.json is written: the figures and what they came from stay together."""
    if bench.evidence_dir is None:
        return
    target = Path(bench.evidence_dir) / "peer" / pair
    target.mkdir(parents=True, exist_ok=True)
    for workload, result in workloads.items():
        shutil.copyfile(result["project"]["log"], target / f"{workload}-project.log")
        result["project"]["log"] = str(target / f"{workload}-project.log")
        for number, run in enumerate(result["sdp"]["each_run"], start=1):
            kept = target / f"{workload}-sdp-{number}.log"
            shutil.copyfile(run["log"], kept)
            run["log"] = str(kept)


def spread(values: list[float]) -> dict[str, float]:
    """The median of ``values`` and their range.

    Example::

        spread([1.1, 0.9, 1.0])  # {"median": 1.0, "low": 0.9, "high": 1.1}
    """
    if not values:
        raise ValueError("no values")
    return {"median": statistics.median(values), "low": min(values), "high": max(values)}


def figure_of(workload: str, key: str, layer: str | None = None) -> Callable[[dict, str], float]:
    """How to read one figure of a pair: ``key`` (of ``layer``, for a per-layer figure) of the run of
    ``workload`` by a system ("project" or "sdp").

    Example::

        figure_of("catch_up", "layer_seconds", "silver")(pair, "sdp")  # 28.6
    """
    if workload not in WORKLOADS:
        raise ValueError(f"workload is one of {WORKLOADS}, not {workload!r}")

    def figure(pair: dict, system: str) -> float:
        run = pair["workloads"][workload][system]
        return run[key][layer] if layer is not None else run[key]

    return figure


def _add_ratio(bench: Bench, key: str, name: str, pairs: list[dict], figure: Callable[[dict, str], float]) -> None:
    """SDP's figure over the project's, pair by pair: their median, and in its name their range."""
    found = spread([ratio(figure(pair, "sdp"), figure(pair, "project")) for pair in pairs])
    shown = f" (median of {len(pairs)}, {found['low']:.2f} to {found['high']:.2f})" if len(pairs) > 1 else ""
    bench.add(key, f"{name}{shown}", found["median"], "ratio")


def _add_both(
    bench: Bench, stem: str, what: str, pairs: list[dict], figure: Callable[[dict, str], float], ratio_key: str | None
) -> None:
    """Each system's median figure (``peer_<system>_<stem>_s``) and, with ``ratio_key``, their ratio."""
    for system, who in (("project", "this project"), ("sdp", "SDP")):
        median = statistics.median(figure(pair, system) for pair in pairs)
        bench.add(f"peer_{system}_{stem}_s", f"peer: {what}, {who}", median, "s")
    if ratio_key is not None:
        _add_ratio(bench, ratio_key, f"peer: SDP / this project, {what}", pairs, figure)


def _report(bench: Bench, setups: dict[str, list[dict]], records: dict[str, int]) -> None:
    fair = setups[SETUPS[0].name]
    catch_up = f"catch-up of {records['catch_up']:,}"
    more = f"{records['increment']:,} more"
    _add_both(bench, "startup", "start-up (catch-up)", fair, figure_of("catch_up", "startup_s"), "peer_startup_ratio")
    for layer in LAYERS:
        figure = figure_of("catch_up", "layer_seconds", layer)
        _add_both(bench, layer, f"{catch_up}, {layer}", fair, figure, f"peer_{layer}_ratio")
    _add_both(bench, "total", f"{catch_up}, in all", fair, figure_of("catch_up", "wall_s"), "peer_total_ratio")
    _add_both(bench, "increment", f"{more}, in all", fair, figure_of("increment", "wall_s"), "peer_increment_ratio")
    gold = figure_of("increment", "layer_seconds", "gold")
    # This project's gold adds the increment; SDP's recomputes from all of silver.
    _add_both(bench, "increment_gold", f"{more}, gold", fair, gold, "peer_increment_gold_ratio")
    one = figure_of("one_record", "wall_s")
    _add_both(bench, "one_record", "one record, in all", fair, one, "peer_one_record_ratio")
    # Its gold refreshes at every run with new data: the longest wait a reader of gold saw empty.
    empty = max(
        pair["workloads"][workload]["sdp"]["gold_empty_s"] for pair in fair for workload in ("increment", "one_record")
    )
    bench.add("peer_sdp_gold_empty_s", "peer: SDP's gold empty during a refresh (longest)", empty, "s")
    # How many `spark-pipelines run`s each took to get every record to gold (SdpPeer.drain): a fact, no target.
    for workload in WORKLOADS:
        bench.add(
            f"peer_sdp_{workload}_runs",
            f"peer: {workload.replace('_', '-')}, SDP's runs until its flows read all of bronze (most)",
            max(pair["workloads"][workload]["sdp"]["runs"] for pair in fair),
            "runs",
        )
    bench.add("peer_pairs", "peer: pairs of the fair setup, each from fresh storage", len(fair), "pairs")
    # The other setups: SDP's bronze dedup on RocksDB, and both reading the catch-up in the project's batches.
    for setup in SETUPS[1:]:
        pairs = setups[setup.name]
        if not pairs:
            continue
        for layer in LAYERS:
            _add_ratio(
                bench,
                f"peer_{setup.name}_{layer}_ratio",
                f"peer, {setup.name}: SDP / this project, {layer} (catch-up)",
                pairs,
                figure_of("catch_up", "layer_seconds", layer),
            )
        _add_ratio(
            bench,
            f"peer_{setup.name}_total_ratio",
            f"peer, {setup.name}: SDP / this project, in all (catch-up)",
            pairs,
            figure_of("catch_up", "wall_s"),
        )
    bench.details["peer"] = {"records": records, "setups": setups}
