"""How far a sink table has got, for one stream: read from Delta's own log.

Each sink commit is tagged (stream id, batch id), and Delta keeps the newest
batch per stream id as a set transaction (txn) in the table's state. One log
replay (DeltaLog.update, the same snapshot every Delta read uses) gives the
table's version, its properties and its txns (from the version's checksum when
Delta wrote one), without scanning data. A
RESTORE does not roll txns back, so restores are found in the table history
(only back to the stream's last tagged commit, from the commit files) and judged by comparing the txn
just before the RESTORE with the txn of the version it restored to. A table
that a batch may leave alone (silver, quarantine, gold) has a txn that says
nothing when an older copy of it is put back; the versions its tables reached
are recorded beside the checkpoint after each batch instead.
See checkpoints.py for how this is compared with the checkpoint.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from pyspark.sql import SparkSession

from ..delta import files
from ..delta.tables import latest_snapshot, table_has_rows
from ..session.spark import java_class

IDENTITY_PROPERTY = "lakehouse.stream.%s.id"
# Set on a stream's tables while a reset rebuilds them (rebuild.py): a start that finds it refuses.
REBUILDING_PROPERTY = "lakehouse.stream.%s.rebuilding"
# Set by a rebuild on the first of the stream's tables: the source version its new stream starts at.
START_PROPERTY = "lakehouse.%s.start"
# Delta drops (appId, version) records older than this when it is set, and a
# replay older than that is written again: idempotence silently ends.
TXN_RETENTION_PROPERTY = "delta.setTransactionRetentionDuration"

# History is read back to the stream's last tagged commit, judged by the
# driver's clock; this much earlier covers a driver and a storage clock apart.
CLOCK_SKEW_MS = 5 * 60 * 1000
HISTORY_PAGE = 32
HISTORY_LIMIT = 4096
# Beside the checkpoint: after each batch, the version each sink table reached (last ten kept).
SINK_VERSIONS = "sink_versions"
SINK_VERSIONS_KEPT = 10


@dataclass(frozen=True)
class Restore:
    """A RESTORE that undid commits of the stream: txn ``before`` it, ``after`` it (None: none left)."""

    at_version: int
    to_version: int | None
    before: int
    after: int | None


@dataclass(frozen=True)
class SinkProgress:
    table: str
    path: str
    version: int | None  # the table's version; None: no table
    recorded_id: str | None  # the stream id bound to the table
    txn_batch: int | None  # the last batch of the checkpoint's stream id the table committed
    has_rows: bool | None  # only looked at when the checkpoint has no id
    txn_retention: str | None
    undone_by: Restore | None
    rebuilding: str | None = None  # the stream id of a rebuild that did not finish
    # The source version the stream starts at, when a rebuild made the stream (before its first batch,
    # the only record of where it stands in its source)
    rebuild_start: int | None = None


def read_sink_progress(spark: SparkSession, name: str, path: str, stream: str, stream_id: str | None) -> SinkProgress:
    """Where the sink table ``name`` at ``path`` stands for the stream: version, bound id, last batch, restores.

    Example::

        sink = read_sink_progress(spark, "gold_event_windows", "/data/lake/tables/gold_event_windows", "gold", id)
        sink.txn_batch  # the last batch of stream ``id`` that gold committed, or None
    """
    if not name or not path or not stream:
        raise ValueError("name, path and stream must be given")
    # Delta's own snapshot, one log replay per table: the version, the properties
    # and the set transactions (appId -> last version) in one read.
    snapshot = latest_snapshot(spark, path)
    delta_log = snapshot.deltaLog()
    if snapshot.version() < 0:
        return SinkProgress(name, path, None, None, None, False, None, None)
    properties = snapshot.metadata().configuration()
    txn, last_updated_ms = _txn(snapshot, stream_id)
    return SinkProgress(
        table=name,
        path=path,
        version=snapshot.version(),
        recorded_id=_option(properties.get(IDENTITY_PROPERTY % stream)),
        txn_batch=txn,
        has_rows=table_has_rows(spark, path) if stream_id is None else None,
        txn_retention=_option(properties.get(TXN_RETENTION_PROPERTY)),
        undone_by=(
            None
            if txn is None
            else _restore_undoing(spark, delta_log, path, snapshot.version(), stream_id, last_updated_ms)
        ),
        rebuilding=_option(properties.get(REBUILDING_PROPERTY % stream)),
        rebuild_start=recorded_start(_option(properties.get(START_PROPERTY % stream)), stream_id),
    )


def recorded_start(start: str | None, stream_id: str | None) -> int | None:
    """The source version stream ``stream_id`` starts at, from a rebuild's ``START_PROPERTY`` value ``start``;
    None without one, or when it names another stream id (an older rebuild's).

    Example::

        recorded_start(read_properties(spark, silver_path).get(START_PROPERTY % "silver"), stream_id)  # 42
    """
    if start is None or stream_id is None:
        return None
    recorded = json.loads(start)
    return recorded["source_version"] if recorded["stream_id"] == stream_id else None


def record_sink_versions(spark: SparkSession, checkpoint: str, batch_id: int, tables: dict[str, str]) -> None:
    """After a batch's last commit: the version each of ``tables`` ({name: path}) has reached.

    Example::

        record_sink_versions(batch.sparkSession, "/data/lake/checkpoints/gold", 41, {"gold_event_windows": path})
    """
    if not checkpoint or batch_id < 0 or not tables:
        raise ValueError("checkpoint, a batch id >= 0 and at least one table must be given")
    # The snapshot this process's own commit left: no listing. A compaction committing meanwhile
    # only makes the recorded version lower, which makes the check at start less strict, never wrong.
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    versions = {
        name: delta_log.forTable(spark._jsparkSession, path).unsafeVolatileSnapshot().version()
        for name, path in tables.items()
    }
    folder = f"{checkpoint}/{SINK_VERSIONS}"
    files.write_text(spark, f"{folder}/{batch_id}", json.dumps(versions), overwrite=True)
    if batch_id >= SINK_VERSIONS_KEPT:
        files.delete(spark, f"{folder}/{batch_id - SINK_VERSIONS_KEPT}")


def recorded_sink_versions(spark: SparkSession, checkpoint: str, batch_id: int | None) -> dict[str, int]:
    """{table: version} recorded after batch ``batch_id`` ({} when none was: no batch, or none kept)."""
    if batch_id is None:
        return {}
    text = files.read_text(spark, f"{checkpoint}/{SINK_VERSIONS}/{batch_id}")
    return json.loads(text) if text else {}


def last_tagged_batch(snapshot, app_id: str) -> int | None:
    """The last batch of stream ``app_id`` a table's ``snapshot`` (``latest_snapshot``) holds a commit of;
    None when it holds none. From the version's checksum when Delta wrote one: no Spark job.

    Example::

        last_tagged_batch(latest_snapshot(spark, lakehouse.table(SILVER)), stream_id)  # 41
    """
    if not app_id:
        raise ValueError("app_id must be a stream id")
    return _txn(snapshot, app_id)[0] if snapshot.version() >= 0 else None


def _option(value):
    return value.get() if value.isDefined() else None


def _txn(snapshot, app_id: str | None) -> tuple[int | None, int | None]:
    if app_id is None:
        return None, None
    transactions = _set_transactions(snapshot).iterator()
    while transactions.hasNext():
        txn = transactions.next()
        if txn.appId() == app_id:
            return txn.version(), _option(txn.lastUpdated())
    return None, None


def _set_transactions(snapshot):
    # The version's checksum (.crc) carries the txns when Delta wrote it: read from there, as
    # newer Delta releases do, instead of a Spark job over the whole state (1-2 s per table).
    # With a txn retention set, only Delta's computed state leaves the expired ones out.
    checksum = snapshot.checksumOpt()
    if checksum.isDefined() and snapshot.metadata().configuration().get(TXN_RETENTION_PROPERTY).isEmpty():
        recorded = checksum.get().setTransactions()
        if recorded.isDefined():
            return recorded.get()
    return snapshot.setTransactions()


def _restore_undoing(
    spark: SparkSession, delta_log, path: str, newest: int, app_id: str, last_updated_ms: int | None
) -> Restore | None:
    """The newest RESTORE that took the table back past commits tagged with ``app_id``, if any.

    RESTORE brings files and properties back but not the set transactions: the
    txn still says the batches are written while their rows are gone. Only the
    commits since the stream's last tagged commit are read (plus the clock
    margin): a RESTORE older than that is followed by commits of the stream.
    """
    history = _recent_commits(spark, path, newest, last_updated_ms)
    for commit in history:
        if commit.operation != "RESTORE":
            continue
        target = _restored_version(commit.params, history)
        before = _txn_at_version(spark, delta_log, commit.version - 1, app_id)
        after = None if target is None else _txn_at_version(spark, delta_log, target, app_id)
        if before is not None and before != after:
            return Restore(at_version=commit.version, to_version=target, before=before, after=after)
    return None


@dataclass(frozen=True)
class _Commit:
    version: int
    ms: int  # the committing driver's clock, as the txn's lastUpdated is
    operation: str | None
    params: dict


def _recent_commits(spark: SparkSession, path: str, newest: int, since_ms: int | None) -> list[_Commit]:
    """The commit infos of versions ``newest`` down to the first one older than ``since_ms`` (less
    the clock margin), newest first; without ``since_ms`` (a txn an older Delta wrote), the last page.

    Read straight from the commit files, in which each line is one action, the commit info among
    them: Delta's history command reads the same files but runs a Spark job for it, about a second
    per table at every start. A version whose file the log clean-up removed ends the history.
    """
    commits: list[_Commit] = []
    limit = HISTORY_PAGE if since_ms is None else HISTORY_LIMIT
    for version in range(newest, max(-1, newest - limit), -1):
        text = files.read_text(spark, f"{path}/_delta_log/{version:020d}.json")
        if text is None:
            break
        info = next((json.loads(line)["commitInfo"] for line in text.splitlines() if line.startswith(_INFO)), {})
        commit = _Commit(
            version, int(info.get("timestamp") or 0), info.get("operation"), info.get("operationParameters") or {}
        )
        commits.append(commit)
        if since_ms is not None and commit.ms < since_ms - CLOCK_SKEW_MS:
            break
    return commits


# Delta writes each action as a one-key object on its own line.
_INFO = '{"commitInfo"'


def _restored_version(params: dict, history: list) -> int | None:
    if params.get("version") not in (None, "", "null"):
        return int(params["version"])
    # RESTORE ... TO TIMESTAMP AS OF: the newest version committed by then.
    stamp = params.get("timestamp")
    if not stamp:
        return None
    try:
        wanted_ms = datetime.fromisoformat(stamp).timestamp() * 1000
    except ValueError:
        return None
    candidates = [commit.version for commit in history if commit.ms <= wanted_ms]
    return max(candidates, default=None)


def _txn_at_version(spark: SparkSession, delta_log, version: int, app_id: str) -> int | None:
    if version < 0:
        return None
    none = java_class(spark, "scala.Option").empty()
    txn, _ = _txn(delta_log.getSnapshotAt(version, none, none, False), app_id)
    return txn
