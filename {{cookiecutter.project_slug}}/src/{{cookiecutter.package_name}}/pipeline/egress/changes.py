"""Gold's changes, as every egress reads them: Delta's change data feed, folded per window.

A micro-batch of the feed can span several gold versions and hold a window more than
once (an insert, then updates). An egress needs the window's state after the batch:
the newest change per gold key, with the gold version that made it and whether it
was a delete (a rebuild of gold can drop windows).

A batch always holds whole gold versions. Delta's source admits at most
``maxFilesPerTrigger`` files per batch (1,000 by default) and splits a version of
more files, such as a rebuild's overwrite of a gold with many files, or the snapshot
a new stream id starts from; only versions with change-data files are kept whole.
A split version would put a row's delete in one batch and its new insert in the
next: the first would publish a delete for a row gold still holds. So the limit is
lifted: a backlog of many versions makes one large batch instead.
"""

from __future__ import annotations

from urllib.parse import unquote

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..dataset import Gold
from ..delta import files
from ..delta.tables import GOLD, WHOLE_VERSIONS, Lakehouse, change_feed_files, gold_schema, latest_snapshot
from ..recovery.checkpoints import (
    CheckpointError,
    history_gone,
    last_committed_batch,
    last_planned_batch,
    source_position,
)
from ..refusals import Refusal
from . import GOLD_VERSION, Target, first_gold

DELETED = "deleted"
CHANGE_TYPE, COMMIT_VERSION = "_change_type", "_commit_version"
# A MERGE's update writes the row before it (preimage) and after it (postimage) in the
# same version; only the postimage is the window's state.
STATE_CHANGES = ("insert", "update_postimage", "delete")


def gold_changes(spark: SparkSession, lakehouse: Lakehouse, gold: str = GOLD) -> DataFrame:
    """The change data feed of gold table ``gold`` as a stream: on a new checkpoint, its current rows first,
    then each change.

    Example::

        gold_changes(spark, Lakehouse("/data/lake")).writeStream.foreachBatch(publish)
    """
    if not isinstance(lakehouse, Lakehouse):
        raise TypeError(f"lakehouse must be a Lakehouse, not {type(lakehouse).__name__}")
    if not isinstance(gold, str) or not gold:
        raise ValueError(f"gold must name a gold table, not {gold!r}")
    return (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("maxFilesPerTrigger", WHOLE_VERSIONS)
        .load(lakehouse.table(gold))
    )


def check_changes_readable(spark: SparkSession, lakehouse: Lakehouse, stream: str, published: str = GOLD) -> None:
    """Refuse (CheckpointError) to start egress ``stream`` when the changes of the gold it publishes (the table
    ``published``) it has yet to publish are gone.

    Gone in two ways. Gold put back from an older copy (or replaced) no longer reaches the version
    the egress has read, or reaches it again in another history: Spark would stop on the version that
    is gone, or go on after changes it never read, and the changes the copy undid would never be
    published. VACUUM removes the change-data and data files of old gold
    versions, and the log's cleanup their log entries: an egress that stood still longer than those
    retentions would fail on them halfway through a batch. So gold must reach the version the last
    planned batch ends at, and from the version after the last committed batch to gold's latest,
    each version's log entry and the files its changes are read from must still be there.

    Example::

        check_changes_readable(spark, Lakehouse("/data/lake"), "kafka_egress")
    """
    if not stream:
        raise ValueError("stream must name the egress stream, e.g. 'kafka_egress'")
    checkpoint = lakehouse.checkpoint(stream)
    gold = lakehouse.table(published)
    snapshot = latest_snapshot(spark, gold)
    planned = last_planned_batch(spark, checkpoint)
    reaches = None if planned is None else source_position(spark, checkpoint, planned)
    if reaches is None:
        return  # a new stream id starts from gold's current snapshot
    gone = history_gone(spark, gold, snapshot, reaches)
    if gone is not None:
        raise CheckpointError(
            Refusal.EGRESS_SOURCE_BEHIND.message(
                stream, source=published, path=gold, read=reaches.newest_read, found=gone
            )
        )
    committed = last_committed_batch(spark, checkpoint)
    position = None if committed is None else source_position(spark, checkpoint, committed)
    if position is None:
        return  # batch 0 is replayed from the snapshot it started at
    first = position.first_unread_commit
    for version in range(first, snapshot.version() + 1):
        missing = _missing_change_file(spark, gold, version)
        if missing is not None:
            raise CheckpointError(
                Refusal.EGRESS_CHANGES_REMOVED.message(
                    stream, version=first, missing=missing, missing_version=version, gold=gold
                )
            )


def _missing_change_file(spark: SparkSession, gold: str, version: int) -> str | None:
    """The first file gold's change feed of ``version`` is read from that is gone (its log entry, or a data file)."""
    paths = change_feed_files(spark, gold, version)
    if paths is None:
        return f"_delta_log/{version:020d}.json"
    for relative in map(unquote, paths):  # the log holds them URL-encoded
        if not files.exists(spark, f"{gold}/{relative}"):
            return relative
    return None


def latest_per_window(changes: DataFrame, gold: Gold | None = None) -> DataFrame:
    """The newest change of each row of ``gold`` (default: the first dataset's first gold) in ``changes``: its
    key and aggregates (a sketch merged into an approximate distinct count stays behind), ``gold_version``
    and ``deleted``.

    Example::

        latest_per_window(batch).where("NOT deleted")  # the windows to upsert
    """
    gold = first_gold(gold)
    missing = {CHANGE_TYPE, COMMIT_VERSION} - set(changes.columns)
    if missing:
        raise ValueError(f"changes must be rows of Delta's change data feed; missing {sorted(missing)}")
    state = F.struct(
        *gold.values,
        F.col(COMMIT_VERSION).alias(GOLD_VERSION),
        (F.col(CHANGE_TYPE) == "delete").alias(DELETED),
    )
    return (
        changes.where(F.col(CHANGE_TYPE).isin(*STATE_CHANGES))
        .groupBy(*gold.key)
        # A rebuild of gold replaces its rows in one commit: a delete and an insert of the same
        # row in one version, of which the insert is the row's state.
        .agg(F.max_by(state, F.struct(COMMIT_VERSION, F.col(CHANGE_TYPE) != "delete")).alias("state"))
        .select(*gold.key, "state.*")
    )


def published_schema(target: Target) -> StructType:
    """What a published row holds: the gold's key and aggregates (a sketch is not published), and gold_version.

    Example::

        published_schema(target).fieldNames()  # ['window_start', ..., 'amount_sum', 'gold_version']
    """
    if not isinstance(target, Target):
        raise TypeError(f"target must be an egress Target, not {type(target).__name__}")
    schema = gold_schema(target.dataset.contract, target.gold)
    fields = [field for field in schema.fields if field.name in target.gold.columns]
    return StructType(fields).add(GOLD_VERSION, "long", False)
