"""One checkpoint per stream, bound to the tables the stream writes.

A stream's id is the query id Spark keeps in ``<checkpoint>/metadata``. The
project writes that file itself before the first start, records the id on each
sink table (table property ``lakehouse.stream.<stream>.id``) and uses it as the
``txnAppId`` of the stream's Delta writes. On every start the two are compared:

* checkpoint and table agree          -> resume.
* no checkpoint, sink table empty     -> fresh start.
* no checkpoint, sink table has rows  -> the checkpoint was lost: bronze resumes
  from the Kafka offsets already in bronze, silver re-reads bronze and its key
  dedup keeps every record once, gold refuses until `checkpoints reset gold`.
* checkpoint and table disagree, or a checkpoint with batches but a sink table
  that has no record of it -> refuse: the checkpoint was swapped or the table
  replaced, and resuming would skip or double records.
* an empty or truncated ``metadata`` file -> refuse, naming the file.

Then progress is compared. Each sink table records, in Delta's set
transactions, the last batch id it committed for the stream id (the txn). The
checkpoint has its last planned batch (offset log) and last committed batch
(commit log). Consistent: txn = last committed; txn = last planned (Delta
committed, the commit log not yet: Spark replays the batch and Delta skips
it); no txn and no batches; and, for sinks a batch may leave alone (silver's
two tables skip a batch with nothing for them, gold an empty batch), any txn
below that. Refused, with the way out:

* txn > last planned: the checkpoint is older than the table (restored from a
  copy, or ``offsets/`` and ``commits/`` deleted). Spark would re-plan batch ids
  the table has already recorded, with other boundaries, and Delta would skip
  them: records lost in bronze and silver, windows skipped or doubled in gold.
* txn < last committed on a sink written by every batch (bronze): the table is
  older than the checkpoint (an older copy put back).
* a RESTORE in the table's history that took it back past commits of the
  stream. RESTORE brings files back but not set transactions, so the txn alone
  cannot see it: the txn before the RESTORE is compared with the txn of the
  version it restored to. Only history since the stream's last tagged commit
  (less a clock margin) is read, so this stays cheap on a long history; a
  RESTORE older than that, run while the stream kept writing, is not seen.
* ``delta.setTransactionRetentionDuration`` set on a sink: Delta would forget the
  txns and a late replay would be written twice.

Last, a stream that reads a Delta table's appends (silver reads bronze, gold
silver) is compared with that table. Its offset log holds where it stands in the
table: the table's id and a version. Refused, with the way out:

* the table no longer reaches the version the stream has read, or is another
  table, or reaches it again in another history (put back from an older copy, or
  replaced): the stream would go on in a history other than the one it read
  (Spark stops on a version that is gone; one that was written again would skip
  or repeat rows). A version written again is told by the time its commit records:
  later than the time the stream planned the batch that read it (the offset log's
  batch timestamp). Both are in the files' content, which a copy keeps;
* a commit after the stream's position removes rows (RESTORE, DELETE, an
  overwrite): Spark would stop there, and what the stream took from those rows
  stays in its tables.

An egress reads gold's change feed, in which removed rows are changes to publish;
its own start checks the first case (egress/changes.py).

Checkpoint files are reached through Hadoop's FileSystem so the same code works
for local paths, HDFS and object stores. One process per stream is enforced by
a lease beside the checkpoint (lease.py).
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from pyspark.sql import SparkSession

from ..delta import files
from ..delta.tables import (
    Lakehouse,
    Layer,
    RemovingCommit,
    Stream,
    commit_time_ms,
    first_removing_commit,
    latest_snapshot,
    read_properties,
    set_properties,
    table_exists,
    unset_property,
    writer_of,
)
from ..delta.writes import FENCED_BATCH, fence_app_id
from ..refusals import Refusal
from .sink_progress import (
    IDENTITY_PROPERTY,
    TXN_RETENTION_PROPERTY,
    SinkProgress,
    last_tagged_batch,
    read_sink_progress,
    recorded_sink_versions,
)

# Spark writes each offset- and commit-log file as ".<batch>.<uuid>.tmp" beside the log, then renames
# it into place (CheckpointFileManager.createAtomic); the local file system adds a ".crc" to each.
UNFINISHED_WRITE = re.compile(r"^\..+\.tmp(\.crc)?$")
LOGS = ("offsets", "commits")

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A stream cannot start safely from the checkpoint and tables it found."""


class Status(Enum):
    """How a stream's checkpoint and its sink tables relate; only the first three may start as they are."""

    NEW = "new"
    OK = "ok"
    # Delta committed the last planned batch, Spark's commit log not yet: Spark
    # replays it and Delta skips it (the txn is there).
    REPLAY_PENDING = "ok (replays batch)"
    LOST = "lost (sink has rows)"
    MISMATCH = "mismatch"
    TABLE_AHEAD = "table ahead"
    TABLE_BEHIND = "table behind"
    TABLE_RESTORED = "table restored"
    TXN_RETENTION_SET = "txn retention set"
    REBUILD_CUT_SHORT = "rebuild cut short"
    SOURCE_BEHIND = "source behind"
    SOURCE_REWRITTEN = "source rewritten"


# A source version committed this much after the batch that read it was planned was written again.
# The two times come from two drivers' clocks (the source's writer, the reader), which on one
# cluster agree within milliseconds; putting a table back and writing it up to that version again
# takes longer than this.
REWRITE_TOLERANCE_MS = 5_000


@dataclass(frozen=True)
class SourcePosition:
    """Where a stream stands in the Delta table it reads: an offset of Delta's source, as the offset log holds it.

    ``index`` is the last file of ``version`` the stream has read (-1: none of it yet); ``starting`` says
    the stream is still reading the table's snapshot at ``version`` (a new stream's first batches).
    """

    table_id: str | None  # None: not known (where a rebuild's new stream starts, before its first batch)
    version: int
    index: int
    starting: bool
    planned_at_ms: int | None = None  # when the batch ending here was planned, by the reader's clock

    @property
    def first_unread_commit(self) -> int:
        """The first version whose commit the stream reads next as a change (a snapshot is read whole)."""
        return self.version + 1 if self.starting else self.version

    @property
    def newest_read(self) -> int:
        """The newest version the stream has read (some of): the table must still reach it."""
        return self.version if self.starting or self.index >= 0 else self.version - 1


@dataclass(frozen=True)
class SourceState:
    """The Delta table a stream reads, as it is now, and where the stream stands in it."""

    table: str
    path: str
    resumes_from: SourcePosition  # where the next batch starts (the last planned batch is replayed from here)
    reaches: SourcePosition  # where the last planned batch ends (or, before a rebuild's first batch, its start)
    gone: str | None  # what shows the table no longer has the history read up to ``reaches`` (history_gone)
    removing: RemovingCommit | None  # the first commit from ``resumes_from`` on that removes rows, if looked for


@dataclass(frozen=True)
class StreamState:
    stream: str
    checkpoint: str
    stream_id: str | None
    last_planned: int | None  # newest offset-log entry: the batch Spark runs or replays next
    last_committed: int | None  # newest commit-log entry
    sinks: dict[str, SinkProgress]
    recorded_versions: dict[str, int]  # each sink table's version after the last committed batch
    # For a stream that reads a Delta table's appends and has a position in it (a planned batch, a rebuild's start)
    source: SourceState | None = None
    # Sinks written by every batch of the stream, even an empty one (bronze appends an empty batch too:
    # Delta commits it with its txn). Their txn must reach the last committed batch; the other sinks
    # skip batches with nothing for them, so a txn behind the checkpoint is normal there and proves nothing.
    every_batch: frozenset[str] = frozenset()

    @property
    def last_batch(self) -> int | None:
        return self.last_committed

    @property
    def tables(self) -> dict[str, str]:
        return {name: sink.path for name, sink in self.sinks.items()}

    @property
    def recorded_ids(self) -> dict[str, str | None]:
        return {name: sink.recorded_id for name, sink in self.sinks.items()}

    @property
    def table_versions(self) -> dict[str, int | None]:
        return {name: sink.version for name, sink in self.sinks.items()}

    @property
    def has_rows(self) -> dict[str, bool]:
        return {name: bool(sink.has_rows) for name, sink in self.sinks.items()}

    @property
    def status(self) -> Status:
        return self._diagnosis()[0]

    def refusal(self) -> str | None:
        """Why the stream must not start as it is, with the way out; None when it may."""
        return self._diagnosis()[1]

    def _diagnosis(self) -> tuple[Status, str | None]:
        stream, checkpoint = self.stream, self.checkpoint
        progress = f"last planned batch {self.last_planned}, last committed batch {self.last_committed}"
        for sink in self.sinks.values():
            if sink.rebuilding is not None:
                return Status.REBUILD_CUT_SHORT, Refusal.REBUILD_CUT_SHORT.message(
                    stream, tables=", ".join(self.sinks), table=sink.table, path=sink.path, rebuild=sink.rebuilding
                )
        if self.stream_id is None:
            return (Status.LOST if any(self.has_rows.values()) else Status.NEW), None
        recorded = self.recorded_ids
        if any(value not in (None, self.stream_id) for value in recorded.values()) or (
            self.last_committed is not None and any(value is None for value in recorded.values())
        ):
            return Status.MISMATCH, Refusal.MISMATCH.message(
                stream,
                checkpoint=checkpoint,
                stream_id=self.stream_id,
                last_batch=self.last_committed,
                recorded=recorded,
            )
        for sink in self.sinks.values():
            if sink.txn_retention is not None:
                return Status.TXN_RETENTION_SET, Refusal.TXN_RETENTION_SET.message(
                    stream, table=sink.table, path=sink.path, property=TXN_RETENTION_PROPERTY, value=sink.txn_retention
                )
        for sink in self.sinks.values():
            if sink.undone_by is not None:
                undo = sink.undone_by
                return Status.TABLE_RESTORED, Refusal.TABLE_RESTORED.message(
                    stream,
                    table=sink.table,
                    path=sink.path,
                    at_version=undo.at_version,
                    to_version=undo.to_version,
                    first=0 if undo.after is None else undo.after + 1,
                    last=undo.before,
                    stream_id=self.stream_id,
                    checkpoint=checkpoint,
                    progress=progress,
                )
        for sink in self.sinks.values():
            if sink.txn_batch is not None and (self.last_planned is None or sink.txn_batch > self.last_planned):
                return Status.TABLE_AHEAD, Refusal.TABLE_AHEAD.message(
                    stream,
                    table=sink.table,
                    path=sink.path,
                    batch=sink.txn_batch,
                    stream_id=self.stream_id,
                    checkpoint=checkpoint,
                    progress=progress,
                )
        for sink in self.sinks.values():
            recorded = self.recorded_versions.get(sink.table)
            if recorded is not None and (sink.version is None or sink.version < recorded):
                return Status.TABLE_BEHIND, Refusal.VERSION_BEHIND.message(
                    stream,
                    table=sink.table,
                    path=sink.path,
                    version=sink.version,
                    recorded=recorded,
                    batch=self.last_committed,
                    checkpoint=checkpoint,
                )
            if sink.table not in self.every_batch or self.last_committed is None:
                continue
            if sink.txn_batch is None or sink.txn_batch < self.last_committed:
                return Status.TABLE_BEHIND, Refusal.BATCHES_MISSING.message(
                    stream,
                    table=sink.table,
                    path=sink.path,
                    batch=sink.txn_batch,
                    stream_id=self.stream_id,
                    checkpoint=checkpoint,
                    progress=progress,
                )
        source_refused = self._source_diagnosis()
        if source_refused is not None:
            return source_refused
        planned_written = any(sink.txn_batch == self.last_planned for sink in self.sinks.values())
        if self.last_planned is not None and self.last_planned != self.last_committed and planned_written:
            return Status.REPLAY_PENDING, None
        return (Status.OK if self.last_planned is not None or self.last_committed is not None else Status.NEW), None

    def _source_diagnosis(self) -> tuple[Status, str] | None:
        source = self.source
        if source is None:
            return None
        # The way out rebuilds the source table from the layer below it, and the stream from the source.
        if source.gone is not None:
            return Status.SOURCE_BEHIND, Refusal.SOURCE_BEHIND.message(
                self.stream,
                stream=writer_of(source.table).name,
                source=source.table,
                path=source.path,
                read=source.reaches.newest_read,
                found=source.gone,
            )
        if source.removing is not None:
            return Status.SOURCE_REWRITTEN, Refusal.SOURCE_REWRITTEN.message(
                self.stream,
                stream=writer_of(source.table).name,
                source=source.table,
                path=source.path,
                version=source.removing.version,
                operation=source.removing.operation,
                read=source.resumes_from.first_unread_commit - 1,
            )
        return None


def inspect(spark: SparkSession, lakehouse: Lakehouse, stream: Stream) -> StreamState:
    """Where the stream's checkpoint and each of its sink tables stand, without changing either.

    Example::

        state = inspect(spark, Lakehouse("/data/lake"), STREAMS["silver"])
        print(state.status.value, state.last_committed, state.refusal())
    """
    checkpoint = lakehouse.checkpoint(stream.name)
    stream_id = read_stream_id(spark, checkpoint, stream.name)
    sinks = {
        name: read_sink_progress(spark, name, lakehouse.table(name), stream.name, stream_id) for name in stream.sinks
    }
    last_committed = last_committed_batch(spark, checkpoint)
    last_planned = last_planned_batch(spark, checkpoint)
    return StreamState(
        stream=stream.name,
        checkpoint=checkpoint,
        stream_id=stream_id,
        last_planned=last_planned,
        last_committed=last_committed,
        sinks=sinks,
        recorded_versions=recorded_sink_versions(spark, checkpoint, last_committed),
        source=(
            None
            if stream_id is None or stream.layer not in (Layer.SILVER, Layer.GOLD)
            else _source_state(spark, lakehouse, stream, sinks, last_planned, last_committed)
        ),
        # Bronze, in its own stream or the fused one: the stream's first sink.
        every_batch=frozenset(stream.sinks[:1]) if stream.layer in (Layer.BRONZE, Layer.FUSED) else frozenset(),
    )


def history_gone(spark: SparkSession, path: str, snapshot, read: SourcePosition) -> str | None:
    """What shows that the table at ``path`` (now at ``snapshot``) no longer has the history a stream read
    from it up to ``read``: put back from an older copy (even one written up to that version again), or
    replaced. None when it has.

    Example::

        history_gone(spark, "/data/lake/tables/gold", latest_snapshot(spark, "/data/lake/tables/gold"),
                     SourcePosition("62604cb2-...", 30, -1, False))  # "the table is at version 20"
    """
    if not path:
        raise ValueError("path must be the source table's directory")
    if not isinstance(read, SourcePosition):
        raise TypeError(f"read must be a SourcePosition, not {type(read).__name__}")
    version = snapshot.version()
    if version < 0:
        return "there is no table"
    table_id = snapshot.metadata().id()
    if read.table_id is not None and table_id != read.table_id:
        return f"the table there is another one (id {table_id}, where the stream read id {read.table_id})"
    if version < read.newest_read:
        return f"the table is at version {version}"
    if read.planned_at_ms is None or read.newest_read < 0:
        return None  # a rebuild's start (no batch planned yet), or nothing read
    committed = commit_time_ms(spark, path, read.newest_read)
    if committed is not None and committed > read.planned_at_ms + REWRITE_TOLERANCE_MS:
        return (
            f"its version {read.newest_read} was committed at {_utc(committed)}, after the stream read it "
            f"in a batch planned at {_utc(read.planned_at_ms)}"
        )
    return None


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds")


def _source_state(
    spark: SparkSession,
    lakehouse: Lakehouse,
    stream: Stream,
    sinks: dict[str, SinkProgress],
    last_planned: int | None,
    last_committed: int | None,
) -> SourceState | None:
    checkpoint = lakehouse.checkpoint(stream.name)
    reaches = None if last_planned is None else source_position(spark, checkpoint, last_planned)
    start = next((sink.rebuild_start for sink in sinks.values() if sink.rebuild_start is not None), None)
    if reaches is None and start is not None:
        # A rebuild's new stream before its first batch: the rebuild read the source up to start - 1.
        reaches = SourcePosition(table_id=None, version=start, index=-1, starting=False)
    if reaches is None:
        return None  # nothing planned yet (or an offset log Spark already cleaned): nothing read
    # Before its first committed batch, the stream replays batch 0 from where it began: reaches' snapshot.
    resumes = (None if last_committed is None else source_position(spark, checkpoint, last_committed)) or reaches
    path = lakehouse.table(stream.source)
    snapshot = latest_snapshot(spark, path)
    gone = history_gone(spark, path, snapshot, reaches)
    removing = (
        None
        if gone is not None
        else first_removing_commit(spark, path, resumes.first_unread_commit, snapshot.version())
    )
    return SourceState(stream.source, path, resumes, reaches, gone, removing)


def source_position(spark: SparkSession, checkpoint: str, batch: int) -> SourcePosition | None:
    """Where batch ``batch`` of a stream reading a Delta table ends in that table; None once the offset log
    no longer holds the batch.

    Example::

        source_position(spark, "/data/lake/checkpoints/gold", 41)  # SourcePosition("62604cb2-...", 63, -1, False)
    """
    entry = _offset_log_entry(spark, checkpoint, batch)
    if entry is None:
        return None
    metadata, offsets = entry
    offset = json.loads(offsets)
    planned_at = metadata.get("batchTimestampMs")
    return SourcePosition(
        table_id=offset["reservoirId"],
        version=int(offset["reservoirVersion"]),
        index=int(offset["index"]),
        starting=bool(offset.get("isStartingVersion")),
        planned_at_ms=None if planned_at is None else int(planned_at),
    )


@dataclass(frozen=True)
class Prepared:
    # The txnAppId of the stream's sink commits; None only for an at-least-once run.
    stream_id: str | None
    lost_checkpoint: bool


def prepare(spark: SparkSession, lakehouse: Lakehouse, stream: Stream) -> Prepared:
    """Check the stream's checkpoint against its tables and bind them before a start.

    Raises CheckpointError, naming what was found and the command that gets out
    of it, when resuming could skip or double records.

    Example::

        prepared = prepare(spark, Lakehouse("/data/lake"), STREAMS["bronze"])
        prepared.stream_id  # the txnAppId of bronze's Delta commits
    """
    state = inspect(spark, lakehouse, stream)
    refusal = state.refusal()
    if refusal is not None:
        raise CheckpointError(refusal)
    lost = state.status is Status.LOST
    if lost and stream.rebuilt_from_source:
        raise CheckpointError(
            Refusal.CHECKPOINT_LOST.message(stream.name, checkpoint=state.checkpoint, tables=", ".join(stream.sinks))
        )
    stream_id = state.stream_id or create_stream_id(spark, state.checkpoint)
    for name, path in state.tables.items():
        if state.recorded_ids[name] != stream_id:
            set_properties(spark, path, {IDENTITY_PROPERTY % stream.name: stream_id})
    remove_unfinished_writes(spark, state.checkpoint)
    return Prepared(stream_id=stream_id, lost_checkpoint=lost)


def remove_unfinished_writes(spark: SparkSession, checkpoint: str) -> list[str]:
    """Delete the temporary files a killed process left in the offset and commit logs; returns their paths.

    Spark never reads them, but before a stream's first batch it requires an empty offset log:
    a process killed while writing ``offsets/0`` left a checkpoint every later start refused
    (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY). Called under the stream's lease, before its
    query starts: no live writer of this checkpoint can own them.

    Example::

        remove_unfinished_writes(spark, "/data/lake/checkpoints/bronze")  # [".../offsets/.0.3f2a....tmp"]
    """
    if not checkpoint:
        raise ValueError("checkpoint must be a stream's checkpoint directory")
    removed = []
    for directory in LOGS:
        for name in files.list_names(spark, f"{checkpoint}/{directory}"):
            if UNFINISHED_WRITE.match(name):
                path = f"{checkpoint}/{directory}/{name}"
                files.delete(spark, path)
                removed.append(path)
    if removed:
        log.warning("removed what a killed process left half-written in the checkpoint: %s", ", ".join(removed))
    return removed


def reset(spark: SparkSession, lakehouse: Lakehouse, streams: list[Stream]) -> None:
    """Forget the checkpoints of ``streams``; the tables keep their rows for ``rebuild.rebuild``.

    Until gold is rebuilt, gold has rows and no checkpoint, which every start
    refuses: a reset cut short never lets a stream count anything twice.

    Before a checkpoint goes, its stream id is fenced on each of the stream's tables
    (``fence_app_id``): whatever a process still running under that id would commit is
    skipped or fails, so only the new stream writes from here on.
    """
    for stream in streams:
        checkpoint = lakehouse.checkpoint(stream.name)
        fence(spark, lakehouse, [stream])
        files.delete(spark, checkpoint, recursive=True)
        if not stream.rebuilt_from_source:
            continue
        for name in stream.sinks:
            path = lakehouse.table(name)
            if table_exists(spark, path):
                unset_property(spark, path, IDENTITY_PROPERTY % stream.name)


def fence(spark: SparkSession, lakehouse: Lakehouse, streams: list[Stream]) -> None:
    """Fence the stream ids of ``streams`` on each of their tables (``fence_app_id``); their checkpoints stay.

    From the fence on, nothing a process of those ids still writes lands: a write that began before it
    fails at commit, one that begins after it is skipped. What their tables hold then is final, so a
    check made after the fence (the switch of modes) cannot be overtaken by a late commit. The ids in
    the checkpoints' metadata are fenced, and those the tables recorded (metadata that cannot be read);
    an id fenced already is not fenced again. A stream whose id is fenced refuses to start (its tables
    read as ahead of its checkpoint) until its checkpoint is reset.

    Example::

        fence(spark, Lakehouse("/data/lake"), [STREAMS["silver"], STREAMS["gold"]])
    """
    for stream in streams:
        if not isinstance(stream, Stream):
            raise TypeError(f"streams must hold Stream values, not {type(stream).__name__}")
    for stream in streams:
        # Unreadable metadata: the ids the tables recorded still get fenced.
        ended = {read_stream_id_if_readable(spark, lakehouse.checkpoint(stream.name), stream.name)}
        for name in stream.sinks:
            path = lakehouse.table(name)
            if not table_exists(spark, path):
                continue
            snapshot = latest_snapshot(spark, path)
            for stream_id in ended | {read_properties(spark, path).get(IDENTITY_PROPERTY % stream.name)}:
                if stream_id and last_tagged_batch(snapshot, stream_id) != FENCED_BATCH:
                    fence_app_id(spark, path, stream_id)


def read_stream_id(spark: SparkSession, checkpoint: str, stream: str | None = None) -> str | None:
    """The stream id in ``<checkpoint>/metadata``; None when there is none; CheckpointError when unreadable.

    Example::

        read_stream_id(spark, "/data/lake/checkpoints/bronze", "bronze")  # "6f1c...", or None
    """
    path = f"{checkpoint}/metadata"
    try:
        text = files.read_text(spark, path)
    except Exception as error:  # e.g. a checksum error: the file and its .crc disagree after a cut write
        text = f"unreadable: {str(error).splitlines()[0][:200]}"
    if text is None:
        return None
    try:
        stream_id = json.loads(text.splitlines()[0])["id"] if text.strip() else None
        if not isinstance(stream_id, str) or not stream_id:
            stream_id = None
    except (ValueError, KeyError, TypeError, IndexError):
        stream_id = None
    if stream_id is None:
        name = stream or checkpoint.rstrip("/").rsplit("/", 1)[-1]
        found = "empty" if not text.strip() else f"not a stream id: {text[:80]!r}"
        raise CheckpointError(Refusal.METADATA_UNREADABLE.message(name, path=path, what=found))
    return stream_id


def read_stream_id_if_readable(spark: SparkSession, checkpoint: str, stream: str | None = None) -> str | None:
    """``read_stream_id``, with None for metadata that cannot be read (what a reset has to work with)."""
    try:
        return read_stream_id(spark, checkpoint, stream)
    except CheckpointError:
        return None


def create_stream_id(spark: SparkSession, checkpoint: str, stream_id: str | None = None) -> str:
    # Spark reads the query id from this file when it exists (StreamMetadata), so
    # writing it first lets the tables be bound before any batch runs.
    stream_id = stream_id or str(uuid.uuid4())
    files.write_text(spark, f"{checkpoint}/metadata", json.dumps({"id": stream_id}))
    return stream_id


def last_committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The newest batch in the checkpoint's commit log; None before the first.

    Example::

        last_committed_batch(spark, "/data/lake/checkpoints/gold")  # 41
    """
    batches = [int(name) for name in files.list_names(spark, f"{checkpoint}/commits") if name.isdigit()]
    return max(batches, default=None)


def last_planned_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The newest batch in the checkpoint's offset log (planned, perhaps not committed); None before the first.

    Example::

        last_planned_batch(spark, "/data/lake/checkpoints/gold")  # 42 while batch 42 runs
    """
    return max(planned_batches(spark, checkpoint), default=None)


def planned_batches(spark: SparkSession, checkpoint: str) -> list[int]:
    """The batches the offset log still holds (Spark keeps the newest minBatchesToRetain)."""
    return [int(name) for name in files.list_names(spark, f"{checkpoint}/offsets") if name.isdigit()]


def committed_offsets(spark: SparkSession, checkpoint: str) -> str | None:
    """The source offsets (JSON) of the newest committed batch, as Spark logged them."""
    batch = last_committed_batch(spark, checkpoint)
    return None if batch is None else batch_offsets(spark, checkpoint, batch)


def batch_offsets(spark: SparkSession, checkpoint: str, batch: int) -> str | None:
    """The source offsets (JSON) batch ``batch`` ends at, from the offset log; None once it is gone.

    Example::

        batch_offsets(spark, "/data/lake/checkpoints/bronze", 41)  # '{"events":{"0":5120}}'
    """
    entry = _offset_log_entry(spark, checkpoint, batch)
    return None if entry is None else entry[1]


def _offset_log_entry(spark: SparkSession, checkpoint: str, batch: int) -> tuple[dict, str] | None:
    """Batch ``batch``'s entry in the offset log: its metadata (batch timestamp, watermark, confs) and its
    first source's offsets (JSON); None once it is gone."""
    if not isinstance(batch, int) or batch < 0:
        raise ValueError(f"batch must be a batch id (an int >= 0), got {batch!r}")
    text = files.read_text(spark, f"{checkpoint}/offsets/{batch}")
    if not text:
        return None
    # Offset log: a version line, a batch metadata line, then one line per source.
    lines = text.splitlines()
    return json.loads(lines[1]), lines[2]
