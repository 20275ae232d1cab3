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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..contract import EVENTS, Contract
from ..delta.tables import GOLD, Lakehouse
from . import GOLD_VERSION

DELETED = "deleted"
CHANGE_TYPE, COMMIT_VERSION = "_change_type", "_commit_version"
# A MERGE's update writes the row before it (preimage) and after it (postimage) in the
# same version; only the postimage is the window's state.
STATE_CHANGES = ("insert", "update_postimage", "delete")
# Files admitted per batch: no gold version is large enough to be split (see the module).
WHOLE_VERSIONS = str(2**31 - 1)


def gold_changes(spark: SparkSession, lakehouse: Lakehouse) -> DataFrame:
    """Gold's change data feed as a stream: on a new checkpoint, gold's current rows first, then each change.

    Example::

        gold_changes(spark, Lakehouse("/data/lake")).writeStream.foreachBatch(publish)
    """
    if not isinstance(lakehouse, Lakehouse):
        raise TypeError(f"lakehouse must be a Lakehouse, not {type(lakehouse).__name__}")
    return (
        spark.readStream.format("delta")
        .option("readChangeFeed", "true")
        .option("maxFilesPerTrigger", WHOLE_VERSIONS)
        .load(lakehouse.table(GOLD))
    )


def latest_per_window(changes: DataFrame, contract: Contract = EVENTS) -> DataFrame:
    """The newest change of each gold row in ``changes``: gold's columns, ``gold_version`` and ``deleted``.

    Example::

        latest_per_window(batch).where("NOT deleted")  # the windows to upsert
    """
    missing = {CHANGE_TYPE, COMMIT_VERSION} - set(changes.columns)
    if missing:
        raise ValueError(f"changes must be rows of Delta's change data feed; missing {sorted(missing)}")
    state = F.struct(
        *contract.gold_values,
        F.col(COMMIT_VERSION).alias(GOLD_VERSION),
        (F.col(CHANGE_TYPE) == "delete").alias(DELETED),
    )
    return (
        changes.where(F.col(CHANGE_TYPE).isin(*STATE_CHANGES))
        .groupBy(*contract.gold_key)
        # A rebuild of gold replaces its rows in one commit: a delete and an insert of the same
        # row in one version, of which the insert is the row's state.
        .agg(F.max_by(state, F.struct(COMMIT_VERSION, F.col(CHANGE_TYPE) != "delete")).alias("state"))
        .select(*contract.gold_key, "state.*")
    )
