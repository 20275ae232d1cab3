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

Gold's rows are sums per window: they depend on ``pipeline.gold_window``. The
window gold was built with is a table property (``lakehouse.gold.window``); a
stream started with another window is refused, since it would add windows of a
second size to the same table.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from . import checkpoints, files
from .config import duration_seconds
from .contract import EVENTS, Contract
from .crash_points import BETWEEN_SINK_COMMITS, reach
from .sink_progress import IDENTITY_PROPERTY, REBUILDING_PROPERTY
from .tables import (
    GOLD,
    PARTITION_COLUMNS,
    QUARANTINE,
    SILVER,
    STREAMS,
    Lakehouse,
    Stream,
    check_schema,
    latest_snapshot,
    read_properties,
    schema_differences,
    set_properties,
    snapshot_schema,
    table_properties,
    table_schemas,
    unset_property,
)
from .transforms import first_per_kafka_record, parse_events, quarantined_records, valid_events, window_aggregates

WINDOW_PROPERTY = "lakehouse.gold.window"
START_PROPERTY = "lakehouse.%s.start"
# The gold stream's name (its checkpoint, its identity property); GOLD is its table's.
STREAM = "gold"
# The streams a reset rebuilds aside, in the order they must be rebuilt.
REBUILT = ("silver", "gold")


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: ``rows`` per table, from ``source`` at ``source_version`` (None: no source yet)."""

    stream: str
    rows: dict[str, int]
    source: str
    source_version: int | None
    stream_id: str


def window_refusal(spark: SparkSession, lakehouse: Lakehouse, gold_window: str) -> str | None:
    """Why gold's stream cannot start with ``gold_window`` (the table holds windows of another size); None if it can.

    Example::

        window_refusal(spark, Lakehouse("/data/lake"), "15 minutes")  # "gold: the table ... holds windows of ..."
    """
    configured = duration_seconds(gold_window, "pipeline.gold_window")
    path = lakehouse.table(GOLD)
    if latest_snapshot(spark, path).version() < 0:
        return None
    recorded = read_properties(spark, path).get(WINDOW_PROPERTY)
    if recorded is None or duration_seconds(recorded, WINDOW_PROPERTY) == configured:
        return None
    return (
        f"gold: the table {path} holds windows of {recorded!r}, but pipeline.gold_window is "
        f"{gold_window!r}: going on would add windows of a second size to the same table. Way out: "
        f"{checkpoints.reset_command(STREAM)}: gold is rebuilt from silver at {gold_window!r} beside the "
        f"table and replaces its rows in one commit; bronze and silver are left as they are. Or set "
        f"pipeline.gold_window back to {recorded!r}."
    )


def check_window(spark: SparkSession, lakehouse: Lakehouse, gold_window: str) -> None:
    """Refuse a gold stream whose window differs from the one gold was built with; record it on a new gold.

    Example::

        check_window(spark, Lakehouse("/data/lake"), config.gold_window)  # or CheckpointError
    """
    refusal = window_refusal(spark, lakehouse, gold_window)
    if refusal is not None:
        raise checkpoints.CheckpointError(refusal)
    path = lakehouse.table(GOLD)
    if WINDOW_PROPERTY not in read_properties(spark, path):
        # A gold from before the window was recorded: it was built with the window in use.
        set_properties(spark, path, {WINDOW_PROPERTY: gold_window})


def starting_version(spark: SparkSession, lakehouse: Lakehouse, stream: str, stream_id: str) -> int | None:
    """The source version ``stream``'s stream ``stream_id`` starts at, when a rebuild made it; None otherwise.

    Example::

        starting_version(spark, Lakehouse("/data/lake"), "gold", prepared.stream_id)  # 42
    """
    if stream not in REBUILT:
        raise ValueError(f"stream must be one of {', '.join(REBUILT)}, not {stream!r}")
    if not stream_id:
        raise ValueError("stream_id must be the stream's id")
    start = read_properties(spark, lakehouse.table(STREAMS[stream].sinks[0])).get(START_PROPERTY % stream)
    if start is None:
        return None
    recorded = json.loads(start)
    return recorded["source_version"] if recorded["stream_id"] == stream_id else None


def reset(
    spark: SparkSession,
    lakehouse: Lakehouse,
    streams: list[Stream],
    gold_window: str,
    contract: Contract = EVENTS,
) -> list[Rebuilt]:
    """Forget the checkpoints of ``streams``; rebuild aside the ones that are rebuilt, each in one commit per table.

    Silver is rebuilt only with gold (a reset of silver or above): an overwrite of silver would stop a gold
    stream that goes on reading it. Alone (``--only``), silver's new stream re-reads bronze keeping each
    record once instead (see ``rebuilt_by_reset``).

    Example::

        reset(spark, Lakehouse("/data/lake"), with_downstream("silver"), config.gold_window)
    """
    duration_seconds(gold_window, "pipeline.gold_window")
    checkpoints.reset(spark, lakehouse, streams)
    return [rebuild(spark, lakehouse, stream, gold_window, contract) for stream in rebuilt_by_reset(streams)]


def rebuilt_by_reset(streams: list[Stream]) -> list[str]:
    """Which of ``streams`` a reset of them all rebuilds aside, in order.

    Example::

        rebuilt_by_reset(with_downstream("silver"))  # ["silver", "gold"]; [STREAMS["silver"]] alone: []
    """
    names = {stream.name for stream in streams}
    return [name for name in REBUILT if name in names and (name == STREAM or STREAM in names)]


def rebuild(
    spark: SparkSession, lakehouse: Lakehouse, stream: str, gold_window: str, contract: Contract = EVENTS
) -> Rebuilt:
    """Replace the tables of ``stream`` (silver or gold) by its source transformed at one version (see ``_swap_in``).

    The stream's checkpoint must be gone (``checkpoints.reset``): the rebuild makes the new one.

    Example::

        rebuild(spark, Lakehouse("/data/lake"), "gold", "1 minute").rows  # {"gold_event_windows": 1440}
    """
    if stream not in REBUILT:
        raise ValueError(f"stream must be one of {', '.join(REBUILT)}, not {stream!r}")
    duration_seconds(gold_window, "pipeline.gold_window")
    sinks, source = STREAMS[stream].sinks, STREAMS[stream].source
    checkpoint = lakehouse.checkpoint(stream)
    if checkpoints.read_stream_id(spark, checkpoint, stream) is not None:
        raise checkpoints.CheckpointError(f"{stream}: rebuild needs {stream}'s checkpoint reset first")
    schemas = table_schemas(contract)
    source_path = lakehouse.table(source)
    snapshot = latest_snapshot(spark, source_path)
    source_version = snapshot.version() if snapshot.version() >= 0 else None
    if source_version is not None:
        # Silver of another contract cannot be aggregated by this one: it is rebuilt first.
        check_schema(source, source_path, schemas[source], snapshot_schema(snapshot))
    stream_id = str(uuid.uuid4())
    marker = {REBUILDING_PROPERTY % stream: stream_id}
    for name in sinks:
        # Silver and quarantine are append-only: the overwrite is the one commit allowed to replace them.
        set_properties(spark, lakehouse.table(name), {**marker, "delta.appendOnly": "false"})
    source_rows = (
        None
        if source_version is None
        else spark.read.format("delta").option("versionAsOf", source_version).load(source_path)
    )
    rows, cached = _rebuilt_rows(stream, source_rows, gold_window, contract)
    try:
        written = {}
        for name in sinks:
            if written:
                reach(stream, BETWEEN_SINK_COMMITS, -1 if source_version is None else source_version)
            written[name] = _swap_in(spark, lakehouse, name, schemas[name], rows.get(name), contract)
    finally:
        if cached is not None:
            cached.unpersist()
    start = {"stream_id": stream_id, "source_version": 0 if source_version is None else source_version + 1}
    for position, name in enumerate(sinks):
        path = lakehouse.table(name)
        properties = {**table_properties(name, contract), IDENTITY_PROPERTY % stream: stream_id}
        if position == 0:
            properties[START_PROPERTY % stream] = json.dumps(start)
        if stream == STREAM:
            properties[WINDOW_PROPERTY] = gold_window
        set_properties(spark, path, properties)
        unset_property(spark, path, REBUILDING_PROPERTY % stream)
    checkpoints.create_stream_id(spark, checkpoint, stream_id)
    return Rebuilt(stream, written, source, source_version, stream_id)


def _rebuilt_rows(
    stream: str, source: DataFrame | None, gold_window: str, contract: Contract
) -> tuple[dict[str, DataFrame], DataFrame | None]:
    """Each table's new rows, and what was cached to compute them (None: nothing)."""
    if source is None:
        return {}, None
    if stream == STREAM:
        return {GOLD: window_aggregates(source, gold_window, contract)}, None
    # Parsed once for both tables.
    parsed = parse_events(first_per_kafka_record(source), contract).persist()
    return {SILVER: valid_events(parsed, contract), QUARANTINE: quarantined_records(parsed)}, parsed


def _swap_in(
    spark: SparkSession, lakehouse: Lakehouse, name: str, schema: StructType, rows: DataFrame | None, contract: Contract
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
        replaced = replaced.partitionedBy(*PARTITION_COLUMNS.get(name, ()))
        # The stream ids, the rebuild's mark and the change feed stay; the statistics follow the new columns;
        # appendOnly comes back with the properties a rebuild sets last.
        created = {key: value for key, value in table_properties(name, contract).items() if key != "delta.appendOnly"}
        for key, value in {**read_properties(spark, path), **created}.items():
            replaced = replaced.property(key, value)
        replaced.execute()
        built.write.format("delta").mode("append").save(path)
    else:
        built.write.format("delta").mode("overwrite").save(path)
    count = built.count()
    files.delete(spark, aside, recursive=True)
    return count
