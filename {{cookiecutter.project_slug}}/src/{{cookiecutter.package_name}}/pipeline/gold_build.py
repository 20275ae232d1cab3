"""Gold's window, recorded on the table, and gold rebuilt from silver without an empty moment.

Gold's rows are sums per window: they depend on ``pipeline.gold_window``. The
window gold was built with is a table property (``lakehouse.gold.window``); a
stream started with another window is refused, since it would add windows of a
second size to the same table.

A reset of gold (``checkpoints reset gold``, and every reset upstream of it)
rebuilds gold aside: silver is read at one version V, aggregated at the
configured window, and written over gold in one commit, so readers see the old
gold until that commit and the whole new gold after it, never an empty or
partial table. Gold's new stream then starts at silver version V + 1: the
table property ``lakehouse.gold.start`` holds V + 1 with the new stream's id,
and only that stream uses it (Delta applies ``startingVersion`` to a new
checkpoint only).

Crash-safe order: the overwrite, then the properties, then the new checkpoint.
A crash before the checkpoint exists leaves gold with rows and no checkpoint,
which every start refuses until the reset is run again.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from . import checkpoints
from .config import duration_seconds
from .contract import EVENTS, Contract
from .sink_progress import IDENTITY_PROPERTY
from .tables import GOLD, SILVER, Lakehouse, Stream, read_properties, set_properties, table_exists
from .transforms import window_aggregates

WINDOW_PROPERTY = "lakehouse.gold.window"
START_PROPERTY = "lakehouse.gold.start"
# The stream's name (its checkpoint, its identity property); GOLD is its table's.
STREAM = "gold"


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild did: gold's rows, from silver at ``silver_version`` (None: no silver yet)."""

    rows: int
    silver_version: int | None
    stream_id: str


def window_refusal(spark: SparkSession, lakehouse: Lakehouse, gold_window: str) -> str | None:
    """Why gold's stream cannot start with ``gold_window`` (the table holds windows of another size); None if it can.

    Example::

        window_refusal(spark, Lakehouse("/data/lake"), "15 minutes")  # "gold: the table ... holds windows of ..."
    """
    configured = duration_seconds(gold_window, "pipeline.gold_window")
    path = lakehouse.table(GOLD)
    if not table_exists(spark, path):
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


def starting_version(spark: SparkSession, lakehouse: Lakehouse, stream_id: str) -> int | None:
    """The silver version gold's stream ``stream_id`` starts at, when a rebuild made it; None otherwise.

    Example::

        starting_version(spark, Lakehouse("/data/lake"), prepared.stream_id)  # 42
    """
    if not stream_id:
        raise ValueError("stream_id must be the gold stream's id")
    start = read_properties(spark, lakehouse.table(GOLD)).get(START_PROPERTY)
    if start is None:
        return None
    recorded = json.loads(start)
    return recorded["silver_version"] if recorded["stream_id"] == stream_id else None


def reset(
    spark: SparkSession,
    lakehouse: Lakehouse,
    streams: list[Stream],
    gold_window: str,
    contract: Contract = EVENTS,
) -> Rebuilt | None:
    """Forget the checkpoints of ``streams``; when gold is among them, rebuild it aside and swap it in.

    Example::

        reset(spark, Lakehouse("/data/lake"), with_downstream("silver"), config.gold_window)
    """
    duration_seconds(gold_window, "pipeline.gold_window")
    checkpoints.reset(spark, lakehouse, streams)
    if STREAM not in {stream.name for stream in streams}:
        return None
    return rebuild(spark, lakehouse, gold_window, contract)


def rebuild(spark: SparkSession, lakehouse: Lakehouse, gold_window: str, contract: Contract = EVENTS) -> Rebuilt:
    """Replace gold's rows, in one commit, by silver's aggregated at ``gold_window``; gold's new stream goes on after.

    Gold's checkpoint must be gone (``checkpoints.reset``): the rebuild makes the new one.

    Example::

        rebuild(spark, Lakehouse("/data/lake"), "1 minute").rows  # 1440
    """
    duration_seconds(gold_window, "pipeline.gold_window")
    gold_path, silver_path = lakehouse.table(GOLD), lakehouse.table(SILVER)
    checkpoint = lakehouse.checkpoint(STREAM)
    if checkpoints.read_stream_id(spark, checkpoint, STREAM) is not None:
        raise checkpoints.CheckpointError(f"gold: rebuild needs gold's checkpoint {checkpoint} reset first")
    silver_version = _latest_version(spark, silver_path) if table_exists(spark, silver_path) else None
    target = spark.read.format("delta").load(gold_path).schema
    if silver_version is None:
        rows = spark.createDataFrame([], target)
    else:
        silver = spark.read.format("delta").option("versionAsOf", silver_version).load(silver_path)
        aggregates = window_aggregates(silver, gold_window, contract)
        rows = aggregates.select(*[F.col(field.name).cast(field.dataType) for field in target.fields])
    # One commit: the old rows are removed and the new ones added together.
    rows.write.format("delta").mode("overwrite").save(gold_path)
    stream_id = str(uuid.uuid4())
    start = {"stream_id": stream_id, "silver_version": 0 if silver_version is None else silver_version + 1}
    set_properties(
        spark,
        gold_path,
        {WINDOW_PROPERTY: gold_window, START_PROPERTY: json.dumps(start), IDENTITY_PROPERTY % STREAM: stream_id},
    )
    checkpoints.create_stream_id(spark, checkpoint, stream_id)
    written = spark.read.format("delta").load(gold_path).count()
    return Rebuilt(rows=written, silver_version=silver_version, stream_id=stream_id)


def _latest_version(spark: SparkSession, path: str) -> int:
    return DeltaTable.forPath(spark, path).history(1).first()["version"]
