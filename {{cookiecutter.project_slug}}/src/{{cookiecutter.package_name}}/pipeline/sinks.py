"""Idempotent Delta writes for foreachBatch: a replayed micro-batch is a no-op.

Delta records (appId, version) pairs in its transaction log. A write tagged with
a pair it has already committed is skipped, so re-running batch N after a crash
between the Delta commit and Spark's commit-log entry changes nothing. The
stream's id (bound to its checkpoint, see checkpoints.py) is the appId and the
micro-batch id is the version. Guarded writes must be deterministic: the same
input batch must produce the same rows, or a retried batch could differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from .contract import EVENTS, Contract

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


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


def append_idempotent(rows: DataFrame, path: str, app_id: str | None, batch_id: int) -> None:
    """Append a micro-batch once: Delta skips the write if (app_id, batch_id) is already committed.

    ``app_id`` None appends untagged (at-least-once).
    """
    writer = rows.write.format("delta").mode("append")
    if app_id is not None:
        writer = writer.option("txnAppId", app_id).option("txnVersion", batch_id)
    writer.save(path)


def kafka_key_ranges(rows: DataFrame, *aggregates: Column) -> list[Row]:
    """(topic, partition, first_offset, last_offset, records, *aggregates) of a batch: one row per partition."""
    return (
        rows.groupBy("topic", "partition")
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
            & (F.col("t.partition") == F.lit(r.partition))
            & F.col("t.offset").between(F.lit(r.first_offset), F.lit(r.last_offset))
            for r in ranges
        ],
    )


def insert_new_kafka_records(rows: DataFrame, path: str, ranges: list[Row], app_id: str | None, batch_id: int) -> None:
    """Insert the rows whose (topic, partition, offset) the table does not hold yet."""
    if not ranges:
        return
    condition = (
        (F.col("t.topic") == F.col("s.topic"))
        & (F.col("t.partition") == F.col("s.partition"))
        & (F.col("t.offset") == F.col("s.offset"))
        & _target_range_predicate(ranges)
    )
    session = rows.sparkSession
    with delta_transaction(session, app_id, batch_id):
        (
            DeltaTable.forPath(session, path)
            .alias("t")
            .merge(rows.alias("s"), condition)
            .whenNotMatchedInsertAll()
            .execute()
        )


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


def add_to_windows(
    aggregates: DataFrame, path: str, app_id: str | None, batch_id: int, contract: Contract = EVENTS
) -> None:
    """Add a batch's per-window counts and sums to the gold table.

    Rows match on the contract's gold key (window and dimensions); event_count
    and every measure sum are added. Addition is not idempotent by itself; the
    transaction tag is what makes a replayed batch count nothing twice.
    """
    session = aggregates.sparkSession
    with delta_transaction(session, app_id, batch_id):
        (
            DeltaTable.forPath(session, path)
            .alias("t")
            .merge(aggregates.alias("s"), _same_gold_row(contract))
            .whenMatchedUpdate(set={name: F.col(f"t.{name}") + F.col(f"s.{name}") for name in contract.gold_values})
            .whenNotMatchedInsertAll()
            .execute()
        )
