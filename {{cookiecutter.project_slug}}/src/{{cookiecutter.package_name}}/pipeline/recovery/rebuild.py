"""Silver and gold rebuilt from the layer above, aside, and swapped in without an empty moment.

A reset of silver (``checkpoints reset silver`` and ``reset bronze``) rebuilds
silver and quarantine from bronze; a reset of gold (and of every stream above
it) rebuilds gold from silver. Each is read at one version V, transformed under
the current event contract and written over its table in one commit, the schema
included: readers see the old table until that commit and the whole new one
after it, and a changed contract (new fields, other dimensions) reaches every
row. The stream's new checkpoint then starts at V + 1: the table property
``lakehouse.<stream>.start`` holds V + 1 with the new stream's id, and only that
stream uses it (Delta applies ``startingVersion`` to a new checkpoint only).

Crash-safe order: the rebuild is marked on the stream's tables first
(``lakehouse.stream.<stream>.rebuilding``), then the overwrites, then the
properties, then the new checkpoint. A rebuild cut short leaves the mark (or,
for gold, rows without a checkpoint), which every start refuses until the reset
is run again: silver and quarantine rebuilt one without the other never meet a
stream.

What the new rows are is each layer's own: ``silver.rebuilt_rows`` and ``gold.rebuilt_rows``
(``streams.reset`` wires a reset to them). Gold's window is checked in ``gold.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from ..dataset import Dataset
from ..delta import files
from ..delta.tables import (
    WHOLE_VERSIONS,
    Lakehouse,
    Layer,
    Stream,
    check_schema,
    latest_snapshot,
    partition_columns,
    read_properties,
    schema_differences,
    set_properties,
    snapshot_schema,
    table_properties,
    table_schemas,
    unset_property,
)
from . import checkpoints
from .crash_points import BETWEEN_SINK_COMMITS, reach
from .sink_progress import IDENTITY_PROPERTY, REBUILDING_PROPERTY, START_PROPERTY, recorded_start

# What a layer gives a rebuild: each table's new rows from the source's, and what it cached to
# compute them (unpersisted once every table is written), or None.
RowsBuilder = Callable[[DataFrame], tuple[dict[str, DataFrame], DataFrame | None]]

# The layers whose streams a reset rebuilds aside, in the order they must be rebuilt.
REBUILT = (Layer.SILVER, Layer.GOLD)


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: ``rows`` per table, from ``source`` at ``source_version`` (None: no source yet)."""

    stream: str
    rows: dict[str, int]
    source: str
    source_version: int | None
    stream_id: str


def _check_rebuilt(stream: Stream) -> None:
    if not isinstance(stream, Stream) or stream.layer not in REBUILT or stream.dataset is None:
        raise ValueError(f"stream must be a dataset's silver or gold stream, not {stream!r}")


def starting_version(spark: SparkSession, lakehouse: Lakehouse, stream: Stream, stream_id: str) -> int | None:
    """The source version ``stream`` (a silver or gold stream) with id ``stream_id`` starts at, when a rebuild
    made it; None otherwise.

    Example::

        starting_version(spark, Lakehouse("/data/lake"), STREAMS["gold"], prepared.stream_id)  # 42
    """
    _check_rebuilt(stream)
    if not stream_id:
        raise ValueError("stream_id must be the stream's id")
    properties = read_properties(spark, lakehouse.table(stream.sinks[0]))
    return recorded_start(properties.get(START_PROPERTY % stream.name), stream_id)


def rebuilt_by_reset(streams: list[Stream]) -> list[Stream]:
    """Which of ``streams`` a reset of them all rebuilds aside, in order: every gold stream, and a silver
    stream when every gold of its dataset is reset with it (an overwrite of silver would stop a gold
    stream that goes on reading it).

    Example::

        rebuilt_by_reset(with_downstream("silver"))  # [silver, gold]; [STREAMS["silver"]] alone: []
    """
    names = {stream.name for stream in streams}
    rebuilt = [
        stream
        for stream in streams
        if stream.layer is Layer.GOLD
        or (stream.layer is Layer.SILVER and stream.downstream and names.issuperset(stream.downstream))
    ]
    return sorted(rebuilt, key=lambda stream: REBUILT.index(stream.layer))


def rebuild(
    spark: SparkSession,
    lakehouse: Lakehouse,
    stream: Stream,
    build: RowsBuilder,
    properties: dict[str, str] | None = None,
) -> Rebuilt:
    """Replace the tables of ``stream`` (a silver or gold stream) by ``build`` of its source at one version
    (see ``_swap_in``).

    ``build`` turns the source's rows into each table's new rows (the layer's ``rebuilt_rows``);
    ``properties`` are set on every rebuilt table with the stream's new id. The stream's checkpoint
    must be gone (``checkpoints.reset``): the rebuild makes the new one.

    Example::

        rebuild(spark, lake, STREAMS["gold"], lambda silver: gold.rebuilt_rows(silver, "1 minute")).rows
        # {"gold_event_windows": 1440}
    """
    _check_rebuilt(stream)
    if not callable(build):
        raise TypeError("build must turn the source's rows into each table's rows")
    dataset, sinks, source, writer = stream.dataset, stream.sinks, stream.source, stream.name
    checkpoint = lakehouse.checkpoint(writer)
    if checkpoints.read_stream_id(spark, checkpoint, writer) is not None:
        raise checkpoints.CheckpointError(f"{writer}: rebuild needs {writer}'s checkpoint reset first")
    schemas = table_schemas(dataset)
    source_path = lakehouse.table(source)
    snapshot = latest_snapshot(spark, source_path)
    source_version = snapshot.version() if snapshot.version() >= 0 else None
    if source_version is not None:
        # Silver of another contract cannot be aggregated by this one: it is rebuilt first.
        check_schema(source, source_path, schemas[source], snapshot_schema(snapshot))
    stream_id = str(uuid.uuid4())
    marker = {REBUILDING_PROPERTY % writer: stream_id}
    for name in sinks:
        # Silver and quarantine are append-only: the overwrite is the one commit allowed to replace them.
        set_properties(spark, lakehouse.table(name), {**marker, "delta.appendOnly": "false"})
    source_rows = (
        None
        if source_version is None
        else spark.read.format("delta").option("versionAsOf", source_version).load(source_path)
    )
    rows, cached = ({}, None) if source_rows is None else build(source_rows)
    try:
        written = {}
        for name in sinks:
            if written:
                reach(writer, BETWEEN_SINK_COMMITS, -1 if source_version is None else source_version)
            written[name] = _swap_in(spark, lakehouse, name, schemas[name], rows.get(name), dataset)
    finally:
        if cached is not None:
            cached.unpersist()
    start = {"stream_id": stream_id, "source_version": 0 if source_version is None else source_version + 1}
    for position, name in enumerate(sinks):
        path = lakehouse.table(name)
        table = {**table_properties(name, dataset), IDENTITY_PROPERTY % writer: stream_id}
        if position == 0:
            table[START_PROPERTY % writer] = json.dumps(start)
        set_properties(spark, path, {**table, **(properties or {})})
        unset_property(spark, path, REBUILDING_PROPERTY % writer)
    checkpoints.create_stream_id(spark, checkpoint, stream_id)
    return Rebuilt(writer, written, source, source_version, stream_id)


def _swap_in(
    spark: SparkSession, lakehouse: Lakehouse, name: str, schema: StructType, rows: DataFrame | None, dataset: Dataset
) -> int:
    """Write ``rows`` aside under ``schema``, then over the table; the rows written.

    One commit when the table already has ``schema``. A changed schema (another contract) takes two: Delta
    keeps NOT NULL columns only on a table it creates or replaces with an explicit schema (a DataFrame
    written with overwriteSchema gets every column nullable), so the table is replaced empty with the new
    schema, then the rows are appended.
    """
    aside, path = lakehouse.aside(name), lakehouse.table(name)
    files.delete(spark, aside, recursive=True)  # what a rebuild cut short left
    # Built aside in a table of the exact schema: its NOT NULL columns are checked while writing.
    DeltaTable.create(spark).location(aside).addColumns(schema).execute()
    if rows is not None:
        rows.select(*schema.fieldNames()).write.format("delta").mode("append").save(aside)
    built = spark.read.format("delta").load(aside)
    if schema_differences(schema, snapshot_schema(latest_snapshot(spark, path))):
        replaced = DeltaTable.replace(spark).location(path).addColumns(schema)
        replaced = replaced.partitionedBy(*partition_columns(name, dataset))
        # The stream ids, the rebuild's mark and the change feed stay; the statistics follow the new columns;
        # appendOnly comes back with the properties a rebuild sets last.
        created = {key: value for key, value in table_properties(name, dataset).items() if key != "delta.appendOnly"}
        for key, value in {**read_properties(spark, path), **created}.items():
            replaced = replaced.property(key, value)
        replaced.execute()
        built.write.format("delta").mode("append").save(path)
    else:
        built.write.format("delta").mode("overwrite").save(path)
    count = built.count()
    files.delete(spark, aside, recursive=True)
    return count


def source_stream(spark: SparkSession, lakehouse: Lakehouse, stream: Stream, stream_id: str | None) -> DataFrame:
    """The Delta stream of the table ``stream`` (a silver or gold stream) reads; after a rebuild, from the
    version after the one it read.

    Example::

        source_stream(spark, Lakehouse("/data/lake"), STREAMS["gold"], prepared.stream_id)  # silver's change stream
    """
    _check_rebuilt(stream)
    source = spark.readStream.format("delta")
    if stream.layer is Layer.GOLD:
        # Gold holds whole silver versions after every batch, as the audit checks it (see WHOLE_VERSIONS).
        source = source.option("maxFilesPerTrigger", WHOLE_VERSIONS)
    # Set by a rebuild for its new stream only: the source up to there is in the stream's tables already.
    start = None if stream_id is None else starting_version(spark, lakehouse, stream, stream_id)
    if start is not None:
        source = source.option("startingVersion", start)
    return source.load(lakehouse.table(stream.source))
