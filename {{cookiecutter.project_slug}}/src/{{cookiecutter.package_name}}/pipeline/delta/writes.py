"""Idempotent Delta writes for foreachBatch: a replayed micro-batch is a no-op.

The layers' own writes build on these: silver's insert of new Kafka records (silver.py) and
gold's addition to its windows (gold.py).

Delta records (appId, version) pairs in its transaction log. A write tagged with
a pair it has already committed is skipped, so re-running batch N after a crash
between the Delta commit and Spark's commit-log entry changes nothing. The
stream's id (bound to its checkpoint, see recovery/checkpoints.py) is the appId and the
micro-batch id is the version. Guarded writes must be deterministic: the same
input batch must produce the same rows, or a retried batch could differ.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from enum import Enum

from delta.exceptions import ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

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
# transaction finds the same snapshot with its state ready. Nothing else differs: the
# check itself, and the commit's conflict detection, are Delta's own. A run that ends
# (availableNow) has no next batch: its warm-ups are cancelled (cancel_warm_ups) rather than
# finished, which a process would otherwise wait for at exit.
_warm_up = ThreadPoolExecutor(max_workers=1, thread_name_prefix="delta-state-warm-up")
WARM_UP_JOB_TAG = "delta-state-warm-up"
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


def cancel_warm_ups(session: SparkSession) -> None:
    """Drop the state warm-ups queued and cancel the one running: no batch of this process needs them.

    Example::

        query.awaitTermination()  # an availableNow run, all its batches done
        cancel_warm_ups(spark)
    """
    if not isinstance(session, SparkSession):
        raise TypeError(f"session must be a SparkSession, not {type(session).__name__}")
    with _warm_ups_lock:
        for future in _warm_ups.values():
            future.cancel()
        _warm_ups.clear()
    session.sparkContext.cancelJobsWithTag(WARM_UP_JOB_TAG)


def _compute_state(session: SparkSession, path: str) -> None:
    try:
        # Tagged (this thread's jobs only), so that cancel_warm_ups stops a warm-up and no stream's job.
        session.sparkContext.addJobTag(WARM_UP_JOB_TAG)
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


# The batch id a fence records for a stream id that has ended: higher than any batch it can reach.
FENCED_BATCH = 2**63 - 1


def fence_app_id(spark: SparkSession, path: str, app_id: str) -> None:
    """Make Delta skip every later write to the table at ``path`` tagged with ``app_id``.

    One empty commit records (``app_id``, FENCED_BATCH): a write tagged (``app_id``, N) that starts
    after it is skipped as already done, and one that started before it fails at commit, because
    the fence changed the very transaction id it read. A reset fences the ids of the streams it
    ends, so a process that stood still past its lease cannot add a batch to a rebuilt table.

    Example::

        fence_app_id(spark, "/data/lake/tables/gold_event_windows", "6f1c...")
    """
    if not path or not app_id:
        raise ValueError("path must name a Delta table and app_id a stream id")
    schema = spark.read.format("delta").load(path).schema
    (
        spark.createDataFrame([], schema)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", app_id)
        .option("txnVersion", FENCED_BATCH)
        .save(path)
    )


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
