"""Idempotent Delta writes for foreachBatch: a replayed micro-batch is a no-op.

Delta records (appId, version) pairs in its transaction log. A write tagged with
a pair it has already committed is skipped, so re-running batch N after a crash
between the Delta commit and Spark's commit-log entry changes nothing. The
stream's id (bound to its checkpoint, see checkpoints.py) is the appId and the
micro-batch id is the version. Guarded writes must be deterministic: the same
input batch must produce the same rows, or a retried batch could differ.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime
from enum import Enum
from functools import reduce

from delta.exceptions import ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from .contract import EVENTS, WINDOW_END, WINDOW_START, Contract

log = logging.getLogger(__name__)

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"

# A compaction (OPTIMIZE) that commits while a MERGE runs removes files the MERGE read,
# and Delta refuses the MERGE's commit. Nothing was committed, so the same tagged write
# is simply run again: exactly-once holds whatever the number of attempts.
COMPACTION_CONFLICTS = (ConcurrentAppendException, ConcurrentDeleteReadException, ConcurrentDeleteDeleteException)
CONFLICT_ATTEMPTS = 5


class Delivery(Enum):
    """What a stream's sinks do with a replayed batch."""

    # Every commit is tagged (stream id, batch id): a replay writes nothing.
    EXACTLY_ONCE = "exactly-once"
    # Untagged commits: a replay writes again. Only the benchmark's baseline uses it,
    # to measure what the tags cost with everything else the same.
    AT_LEAST_ONCE = "at-least-once"


@contextmanager
def delta_transaction(session: SparkSession, app_id: str | None, batch_id: int) -> Iterator[None]:
    """Tag every Delta DML run in this block (MERGE, UPDATE, DELETE) with (app_id, batch_id).

    Use the micro-batch DataFrame's own session (batch.sparkSession): each
    streaming query runs in a cloned session, so streams running side by side
    never see each other's tags. ``app_id`` None tags nothing (at-least-once).
    """
    if app_id is None:
        yield
        return
    session.conf.set(TXN_APP_ID, app_id)
    session.conf.set(TXN_VERSION, str(batch_id))
    try:
        yield
    finally:
        session.conf.unset(TXN_APP_ID)
        session.conf.unset(TXN_VERSION)


# Delta 4.4 answers "has (app id, batch id) been committed?" from the snapshot's full state,
# a reconstruction of three Spark jobs that is most of a small batch's time, and the MERGEs
# need the same state to list files. Computing it right after a commit, while the stream
# waits for its next trigger, moves that work off the next batch's path: the next
# transaction finds the same snapshot with its state ready. Nothing else changes: the
# check itself, and the commit's conflict detection, are Delta's as before.
_warm_up = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-state-warm-up")
_warm_ups: dict[str, Future] = {}
_warm_ups_lock = threading.Lock()


def warm_up_state(session: SparkSession, path: str) -> Future:
    """Compute the newest snapshot state of the table at ``path`` in the background.

    A warm-up still queued for the table is reused: it will see the newest commit.

    Example::

        append_idempotent(rows, path, app_id, batch_id)  # warms the table up itself
        warm_up_state(spark, path).result()
    """
    if not path:
        raise ValueError("path must name a Delta table")
    with _warm_ups_lock:
        queued = _warm_ups.get(path)
        if queued is not None and not queued.running() and not queued.done():
            return queued
        future = _warm_up.submit(_compute_state, session, path)
        _warm_ups[path] = future
        return future


def _compute_state(session: SparkSession, path: str) -> None:
    try:
        # DESCRIBE DETAIL reads the file count and size: the snapshot's computed state.
        DeltaTable.forPath(session, path).detail().collect()
    except Exception as error:  # noqa: BLE001 - only an optimisation; the next batch computes it itself
        log.debug("state warm-up of %s failed: %s", path, error)


def append_idempotent(rows: DataFrame, path: str, app_id: str | None, batch_id: int) -> None:
    """Append a micro-batch once: Delta skips the write if (app_id, batch_id) is already committed.

    ``app_id`` None appends untagged (at-least-once).
    """
    writer = rows.write.format("delta").mode("append")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", batch_id)
    writer.save(path)
    warm_up_state(rows.sparkSession, path)


def retry_conflicts(write: Callable[[], None], what: str, attempts: int = CONFLICT_ATTEMPTS) -> None:
    """Run a tagged Delta write, again if a concurrent compaction made Delta refuse its commit.

    Example::

        retry_conflicts(lambda: add_to_windows(rows, path, app_id, 7), "gold batch 7")
    """
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            write()
            return
        except COMPACTION_CONFLICTS as error:
            if attempt == attempts:
                raise
            log.warning(
                "%s: a concurrent commit conflicted (%s); attempt %d of %d",
                what,
                type(error).__name__,
                attempt + 1,
                attempts,
            )


def kafka_key_ranges(rows: DataFrame, *aggregates: Column) -> list[Row]:
    """(topic, topic_id, partition, first_offset, last_offset, records, *aggregates) of a batch, per partition."""
    return (
        rows.groupBy("topic", "topic_id", "partition")
        .agg(
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
            F.count(F.lit(1)).alias("records"),
            *aggregates,
        )
        .collect()
    )


def _target_range_predicate(ranges: list[Row]) -> Column:
    # Only target columns and literals: Delta uses it to skip every file whose
    # offset statistics fall outside the batch, so the MERGE cost follows the
    # batch size, not the table size.
    return reduce(
        lambda left, right: left | right,
        [
            (F.col("t.topic") == F.lit(r.topic))
            & (F.col("t.topic_id") == F.lit(r.topic_id))
            & (F.col("t.partition") == F.lit(r.partition))
            & F.col("t.offset").between(F.lit(r.first_offset), F.lit(r.last_offset))
            for r in ranges
        ],
    )


def insert_new_kafka_records(rows: DataFrame, path: str, ranges: list[Row], app_id: str | None, batch_id: int) -> None:
    """Insert the rows whose (topic, topic_id, partition, offset) the table does not hold yet."""
    if not ranges:
        return
    condition = (
        (F.col("t.topic") == F.col("s.topic"))
        & (F.col("t.topic_id") == F.col("s.topic_id"))
        & (F.col("t.partition") == F.col("s.partition"))
        & (F.col("t.offset") == F.col("s.offset"))
        & _target_range_predicate(ranges)
    )
    session = rows.sparkSession

    def merge() -> None:
        with delta_transaction(session, app_id, batch_id):
            (
                DeltaTable.forPath(session, path)
                .alias("t")
                .merge(rows.alias("s"), condition)
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_conflicts(merge, f"{path} batch {batch_id}")
    warm_up_state(session, path)


def _same_gold_row(contract: Contract) -> Column:
    # An optional dimension can be null, and null = null is not true: <=> matches it.
    nullable = {name for name in contract.dimensions if not contract.field(name).required}
    return reduce(
        lambda left, right: left & right,
        [
            F.col(f"t.{name}").eqNullSafe(F.col(f"s.{name}"))
            if name in nullable
            else F.col(f"t.{name}") == F.col(f"s.{name}")
            for name in contract.gold_key
        ],
    )


# A batch of scattered event times touches windows far apart; past this many ranges the
# closest ones are joined (a wider range reads a few more files, but every range is one
# more OR in the MERGE condition, planned and evaluated for each row).
MAX_WINDOW_RANGES = 16


def window_ranges(
    starts: list[datetime], ends: list[datetime], max_ranges: int = MAX_WINDOW_RANGES
) -> list[tuple[datetime, datetime]]:
    """Touched windows (start, end pairs) as at most ``max_ranges`` (first start, last start) ranges.

    Adjacent windows fold into one range; beyond ``max_ranges``, the ranges with the
    smallest gaps between them are joined.
    """
    if len(starts) != len(ends):
        raise ValueError(f"starts and ends must pair up, got {len(starts)} and {len(ends)}")
    if max_ranges < 1:
        raise ValueError(f"max_ranges must be at least 1, got {max_ranges}")
    runs: list[list[datetime]] = []
    for start, end in sorted(set(zip(starts, ends, strict=True))):
        if runs and runs[-1][2] == start:
            runs[-1][1:] = [start, end]
        else:
            runs.append([start, start, end])
    if len(runs) > max_ranges:
        gaps = sorted(range(1, len(runs)), key=lambda i: runs[i][0] - runs[i - 1][2], reverse=True)
        splits = sorted(gaps[: max_ranges - 1])
        bounds = zip([0, *splits], [*splits, len(runs)], strict=True)
        runs = [[runs[first][0], runs[last - 1][1], runs[last - 1][2]] for first, last in bounds]
    return [(first, last) for first, last, _ in runs]


def _touched_windows(aggregates: DataFrame) -> Column | None:
    # Target columns and literals only, so Delta skips every gold file outside the
    # batch's windows: a late event adds its own small range, not everything since.
    rows = aggregates.select(WINDOW_START, WINDOW_END).distinct().collect()
    if not rows:
        return None
    runs = window_ranges([r[WINDOW_START] for r in rows], [r[WINDOW_END] for r in rows])
    return reduce(
        lambda left, right: left | right,
        [F.col(f"t.{WINDOW_START}").between(F.lit(first), F.lit(last)) for first, last in runs],
    )


def add_to_windows(
    aggregates: DataFrame, path: str, app_id: str | None, batch_id: int, contract: Contract = EVENTS
) -> None:
    """Add a batch's per-window counts and sums to the gold table.

    Rows match on the contract's gold key (window and dimensions); event_count
    and every measure sum are added. Addition is not idempotent by itself; the
    transaction tag is what makes a replayed batch count nothing twice. Only the
    gold files that hold the batch's windows are read. ``aggregates`` should be
    cached: its windows are collected before the MERGE.
    """
    session = aggregates.sparkSession
    touched = _touched_windows(aggregates)
    if touched is None:
        return
    condition = _same_gold_row(contract) & touched

    def merge() -> None:
        with delta_transaction(session, app_id, batch_id):
            (
                DeltaTable.forPath(session, path)
                .alias("t")
                .merge(aggregates.alias("s"), condition)
                .whenMatchedUpdate(set={name: F.col(f"t.{name}") + F.col(f"s.{name}") for name in contract.gold_values})
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_conflicts(merge, f"{path} batch {batch_id}")
    warm_up_state(session, path)
