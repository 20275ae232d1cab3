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

Checkpoint files are reached through Hadoop's FileSystem so the same code works
for local paths, HDFS and object stores.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from .tables import Lakehouse, Stream, table_exists, table_has_rows

IDENTITY_PROPERTY = "lakehouse.stream.%s.id"


class CheckpointError(RuntimeError):
    """A stream cannot start safely from the checkpoint and tables it found."""


@dataclass(frozen=True)
class StreamState:
    stream: str
    checkpoint: str
    stream_id: str | None
    last_batch: int | None
    tables: dict[str, str]
    recorded_ids: dict[str, str | None]
    table_versions: dict[str, int | None]
    has_rows: dict[str, bool]

    @property
    def status(self) -> str:
        if self.stream_id is None:
            return "lost (sink has rows)" if any(self.has_rows.values()) else "new"
        if any(recorded not in (None, self.stream_id) for recorded in self.recorded_ids.values()):
            return "mismatch"
        if self.last_batch is not None and any(recorded is None for recorded in self.recorded_ids.values()):
            return "mismatch"
        return "ok"


def inspect(spark: SparkSession, lakehouse: Lakehouse, stream: Stream) -> StreamState:
    checkpoint = lakehouse.checkpoint(stream.name)
    tables = {name: lakehouse.table(name) for name in stream.sinks}
    recorded, versions, rows = {}, {}, {}
    for name, path in tables.items():
        if table_exists(spark, path):
            delta = DeltaTable.forPath(spark, path)
            recorded[name] = delta.detail().first()["properties"].get(IDENTITY_PROPERTY % stream.name)
            versions[name] = delta.history(1).first()["version"]
            rows[name] = table_has_rows(spark, path)
        else:
            recorded[name], versions[name], rows[name] = None, None, False
    return StreamState(
        stream=stream.name,
        checkpoint=checkpoint,
        stream_id=read_stream_id(spark, checkpoint),
        last_batch=last_committed_batch(spark, checkpoint),
        tables=tables,
        recorded_ids=recorded,
        table_versions=versions,
        has_rows=rows,
    )


@dataclass(frozen=True)
class Prepared:
    # The txnAppId of the stream's sink commits; None only for an at-least-once run.
    stream_id: str | None
    lost_checkpoint: bool


def prepare(spark: SparkSession, lakehouse: Lakehouse, stream: Stream) -> Prepared:
    """Check the stream's checkpoint against its tables and bind them before a start."""
    state = inspect(spark, lakehouse, stream)
    lost = state.status.startswith("lost")
    if state.status == "mismatch":
        raise CheckpointError(
            f"{stream.name}: checkpoint {state.checkpoint} (stream id {state.stream_id}, last batch "
            f"{state.last_batch}) does not match the tables it writes (recorded ids "
            f"{state.recorded_ids}): the checkpoint was swapped or a table replaced, and resuming "
            f"would skip or repeat records. Run `checkpoints reset {stream.name}` to rebuild consistently."
        )
    if lost and stream.rebuilt_from_source:
        raise CheckpointError(
            f"{stream.name}: checkpoint {state.checkpoint} is missing while {', '.join(stream.sinks)} "
            f"already holds aggregates; starting over would count them twice. Run "
            f"`checkpoints reset {stream.name}` to rebuild it from {stream.source}."
        )
    stream_id = state.stream_id or create_stream_id(spark, state.checkpoint)
    for name, path in state.tables.items():
        if state.recorded_ids[name] != stream_id:
            _set_property(spark, path, IDENTITY_PROPERTY % stream.name, stream_id)
    return Prepared(stream_id=stream_id, lost_checkpoint=lost)


def reset(spark: SparkSession, lakehouse: Lakehouse, streams: list[Stream]) -> None:
    """Forget the checkpoints of ``streams``; aggregate sinks (gold) are emptied to be rebuilt.

    The checkpoint goes first: a crash in between leaves gold with rows and no
    checkpoint, which the next start refuses, rather than an empty gold with a
    checkpoint that would skip everything already counted.
    """
    for stream in streams:
        _delete(spark, lakehouse.checkpoint(stream.name))
        if not stream.rebuilt_from_source:
            continue
        for name in stream.sinks:
            path = lakehouse.table(name)
            if table_exists(spark, path):
                DeltaTable.forPath(spark, path).delete()
                _unset_property(spark, path, IDENTITY_PROPERTY % stream.name)


def read_stream_id(spark: SparkSession, checkpoint: str) -> str | None:
    text = _read_text(spark, f"{checkpoint}/metadata")
    return None if text is None else json.loads(text.splitlines()[0])["id"]


def create_stream_id(spark: SparkSession, checkpoint: str) -> str:
    # Spark reads the query id from this file when it exists (StreamMetadata), so
    # writing it first lets the tables be bound before any batch runs.
    stream_id = str(uuid.uuid4())
    _write_text(spark, f"{checkpoint}/metadata", json.dumps({"id": stream_id}))
    return stream_id


def last_committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    batches = [int(name) for name in _list_names(spark, f"{checkpoint}/commits") if name.isdigit()]
    return max(batches, default=None)


def committed_offsets(spark: SparkSession, checkpoint: str) -> str | None:
    """The source offsets (JSON) of the newest committed batch, as Spark logged them."""
    batch = last_committed_batch(spark, checkpoint)
    if batch is None:
        return None
    text = _read_text(spark, f"{checkpoint}/offsets/{batch}")
    # Offset log: a version line, a batch metadata line, then one line per source.
    return text.splitlines()[2] if text else None


def _set_property(spark: SparkSession, path: str, key: str, value: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{key}' = '{value}')")


def _unset_property(spark: SparkSession, path: str, key: str) -> None:
    spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES IF EXISTS ('{key}')")


def _fs(spark: SparkSession, path: str):
    jvm_path = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jvm_path.getFileSystem(spark._jsc.hadoopConfiguration()), jvm_path


def _read_text(spark: SparkSession, path: str) -> str | None:
    fs, jvm_path = _fs(spark, path)
    if not fs.exists(jvm_path):
        return None
    stream = fs.open(jvm_path)
    try:
        return spark._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    fs, jvm_path = _fs(spark, path)
    stream = fs.create(jvm_path, False)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    finally:
        stream.close()


def _list_names(spark: SparkSession, path: str) -> list[str]:
    fs, jvm_path = _fs(spark, path)
    if not fs.exists(jvm_path):
        return []
    return [status.getPath().getName() for status in fs.listStatus(jvm_path)]


def _delete(spark: SparkSession, path: str) -> None:
    fs, jvm_path = _fs(spark, path)
    fs.delete(jvm_path, True)
