"""Instants between Python, Spark and Delta: microseconds since the epoch, exact at every date.

A timestamp crosses between the driver and Spark in two places: a batch's window bounds are
collected, and predicates on them go back as literals. Both ways have a trap. A ``datetime``
collected from a TIMESTAMP column is the driver's local time (ambiguous in the hour a clock
repeats once a year), and a ``datetime`` passed to ``F.lit`` reaches the JVM as a
``java.sql.Timestamp``, which Spark rebases from the Julian calendar: before 1582-10-15 the
literal is days away from the proleptic Gregorian value the column holds. So an instant leaves
Spark as ``unix_micros`` and comes back as ``timestamp_micros`` of an integer, never as a
``datetime`` object on the wire.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pyspark.sql import Column
from pyspark.sql import functions as F

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def to_micros(instant: datetime) -> int:
    """Microseconds since the epoch of an aware ``instant``.

    Example::

        to_micros(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC))  # 1000000
    """
    if not isinstance(instant, datetime):
        raise TypeError(f"instant must be a datetime, not {type(instant).__name__}")
    if instant.tzinfo is None:
        raise ValueError(f"instant {instant.isoformat()} has no offset: a naive time names no instant")
    return (instant - EPOCH) // MICROSECOND


def from_micros(micros: int) -> datetime:
    """The UTC ``datetime`` of ``micros`` since the epoch (years 1 to 9999, Python's range).

    Example::

        from_micros(0)  # datetime(1970, 1, 1, tzinfo=UTC)
    """
    if not isinstance(micros, int) or isinstance(micros, bool):
        raise TypeError(f"micros must be an int, not {type(micros).__name__}")
    return EPOCH + timedelta(microseconds=micros)


def literal(instant: datetime) -> Column:
    """A TIMESTAMP literal of ``instant``, exact before 1582 too (no Julian rebase on the way).

    Spark folds it to a constant, so Delta's data skipping prunes on it as on any literal.

    Example::

        F.col("window_start").between(literal(first), literal(last))
    """
    return F.timestamp_micros(F.lit(to_micros(instant)))
