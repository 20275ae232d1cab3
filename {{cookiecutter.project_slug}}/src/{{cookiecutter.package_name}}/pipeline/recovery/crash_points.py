"""Deterministic crash points, for proving exactly-once under faults.

Off unless PIPELINE_CRASH_POINT is set to ``<stream>:<point>:<batch id>``, e.g.
``silver:after_sink_commit:0``. At that point the driver kills itself with
SIGKILL: no cleanup, no commit-log entry, as an OOM kill or a lost node would.
With a fourth part, ``pause=<seconds>`` (``kafka_egress:after_pre_commit:0:pause=5``),
the batch stops there that long instead and then goes on, as a slow batch would: the
rest of the process (the lease's heartbeat) keeps running. With ``freeze``
(``gold:before_sink_commit:1:freeze``), the whole process stops itself with SIGSTOP,
every thread at once, as a long GC pause, a frozen VM or a storage stall would,
until something sends it SIGCONT: nothing it holds is given up in between.

Points, inside a stream's micro-batch:
* before_sink_commit  the offsets are logged, nothing of the batch is written;
* mid_batch           the batch's Spark job is running (tasks reading and writing
                      data files), its Delta commit not yet made;
* after_sink_commit   every sink table has committed the batch, Spark has not yet
                      written its commit-log entry: the classic duplicate window.

and, inside a sink's own write (reached through ``reach``):
* after_bronze_commit, after_silver_commit, after_quarantine_commit
                      the fused stream (fused.py) has committed the batch to that table;
                      its other tables' commits run beside it and may or may not be made;
                      in a quarantine replay (quarantine_replay.py, stream ``<dataset>_replay``,
                      the "batch id" is the replay's number), after_silver_commit: the records
                      that pass are in silver, quarantine still holds them; after_quarantine_commit:
                      quarantine no longer holds them, the replay has not reported;
* between_sink_commits  silver has committed the batch, quarantine has not (silver's
                      two tables are two Delta commits); in a reset's rebuild
                      (rebuild.py, the "batch id" is the source version it reads),
                      silver has been swapped in, quarantine not;
* after_staging       executors have staged the batch's rows in the database, the
                      driver's transaction has not begun (PostgreSQL, large batches);
* after_pre_commit    the pre-commit is done, the commit is not: records produced in
                      an open Kafka transaction, or rows applied in an open database
                      transaction.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pyspark.sql import SparkSession

CRASH_POINT_VAR = "PIPELINE_CRASH_POINT"
BEFORE_SINK_COMMIT = "before_sink_commit"
MID_BATCH = "mid_batch"
AFTER_SINK_COMMIT = "after_sink_commit"
POINTS = (BEFORE_SINK_COMMIT, MID_BATCH, AFTER_SINK_COMMIT)
AFTER_STAGING = "after_staging"
AFTER_PRE_COMMIT = "after_pre_commit"
EGRESS_POINTS = (AFTER_STAGING, AFTER_PRE_COMMIT)
BETWEEN_SINK_COMMITS = "between_sink_commits"
AFTER_SILVER_COMMIT = "after_silver_commit"
AFTER_QUARANTINE_COMMIT = "after_quarantine_commit"
FUSED_POINTS = ("after_bronze_commit", AFTER_SILVER_COMMIT, AFTER_QUARANTINE_COMMIT)
INNER_POINTS = (BETWEEN_SINK_COMMITS, *FUSED_POINTS, *EGRESS_POINTS)


FREEZE = ":freeze"


def _armed(stream: str, point: str, batch_id: int) -> bool:
    where, _, _ = os.environ.get(CRASH_POINT_VAR, "").removesuffix(FREEZE).partition(":pause=")
    return where == f"{stream}:{point}:{batch_id}"


def _pause_seconds() -> float | None:
    """The pause of the armed point, None when it kills; ValueError names a pause that is not a number."""
    _, marked, seconds = os.environ.get(CRASH_POINT_VAR, "").partition(":pause=")
    if not marked:
        return None
    try:
        return float(seconds)
    except ValueError:
        raise ValueError(f"{CRASH_POINT_VAR}: pause={seconds!r} is not a number of seconds") from None


def _crash(stream: str, point: str, batch_id: int) -> None:
    if os.environ.get(CRASH_POINT_VAR, "").endswith(FREEZE):
        print(f"crash point {stream}:{point}:{batch_id}: freezing the driver (SIGSTOP)", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        print(f"crash point {stream}:{point}:{batch_id}: the driver goes on (SIGCONT)", file=sys.stderr, flush=True)
        return
    pause = _pause_seconds()
    if pause is not None:
        print(f"crash point {stream}:{point}:{batch_id}: pausing the driver {pause:g} s", file=sys.stderr, flush=True)
        time.sleep(pause)
        return
    print(f"crash point {stream}:{point}:{batch_id}: killing the driver", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def _crash_once_a_job_runs(session: SparkSession, stream: str, batch_id: int) -> None:
    tracker = session.sparkContext.statusTracker()
    while not tracker.getActiveJobsIds():
        time.sleep(0.005)
    _crash(stream, MID_BATCH, batch_id)


@contextmanager
def crash_points(session: SparkSession, stream: str, batch_id: int) -> Iterator[None]:
    """Wrap a micro-batch's writes; does nothing unless a crash point is armed."""
    if _armed(stream, BEFORE_SINK_COMMIT, batch_id):
        _crash(stream, BEFORE_SINK_COMMIT, batch_id)
    if _armed(stream, MID_BATCH, batch_id):
        threading.Thread(target=_crash_once_a_job_runs, args=(session, stream, batch_id), daemon=True).start()
    yield
    if _armed(stream, AFTER_SINK_COMMIT, batch_id):
        _crash(stream, AFTER_SINK_COMMIT, batch_id)


def reach(stream: str, point: str, batch_id: int) -> None:
    """A crash point inside a sink's own write; kills the driver only when armed for it.

    Example::

        reach("kafka_egress", AFTER_PRE_COMMIT, batch_id)  # between produce and commit
    """
    if point not in INNER_POINTS:
        raise ValueError(f"point must be one of {', '.join(INNER_POINTS)}, not {point!r}")
    if _armed(stream, point, batch_id):
        _crash(stream, point, batch_id)
