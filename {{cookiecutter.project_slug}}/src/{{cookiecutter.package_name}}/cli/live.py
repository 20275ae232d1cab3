"""A live line on the terminal while a person waits for a long command: what it does, how far it is.

`run --available-now` (a backfill), `checkpoints reset` (a rebuild) and `audit` can take minutes, and
between their printed lines nothing moves. On a terminal, ``LiveLine`` keeps one line at the bottom
of stderr up to date every half second: what the command is doing, the last batch of the stream that
runs (records read so far, Kafka records still behind), the tasks of the Spark stages running, and the
time so far. The command's own lines go through ``LiveLine.write``, above it. When stderr is not a
terminal (a log file, a scheduler, a pipe) it draws nothing: the per-batch lines and the JSON log are
what a machine reads.

tqdm draws the line (one status line, redrawn in place and cleared at the end); the Spark figures
come from the context's status tracker, which a command can poll without touching its jobs.
"""

from __future__ import annotations

import sys
import threading
from typing import TextIO

from tqdm import tqdm


class LiveLine:
    """One line of progress on a terminal's stderr for the duration of a ``with`` block.

    Example::

        with LiveLine(spark, "rebuilding gold from silver") as live:
            rebuild(...)
            live.write("gold rebuilt")  # a line of its own, above the live line
    """

    def __init__(self, spark, what: str, file: TextIO | None = None, interval_s: float = 0.5):
        if not what:
            raise ValueError("what must say what the command is doing")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self._spark = spark
        self._what = what
        self._file = file if file is not None else sys.stderr
        self._interval_s = interval_s
        self._stream = ""
        self._read: dict[str, int] = {}  # records each stream has read in this command
        self._stop = threading.Event()
        self._bar: tqdm | None = None
        self._thread: threading.Thread | None = None

    @property
    def shown(self) -> bool:
        """Whether the line is drawn (stderr is a terminal)."""
        return self._bar is not None

    def __enter__(self) -> LiveLine:
        if self._file.isatty():
            self._bar = tqdm(
                desc=self._what, file=self._file, bar_format="{desc} · {elapsed}", leave=False, dynamic_ncols=True
            )
            self._draw()
            self._thread = threading.Thread(target=self._poll, name="live-line", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def batch(self, report: dict) -> None:
        """Take a stream's batch report (``monitoring.ProgressReporter``'s ``batch_progress`` record).

        Example::

            live.batch({"stream": "bronze", "batch_id": 3, "input_rows": 100000, "kafka_lag": "200000"})
        """
        stream = report.get("stream") or "stream"
        self._read[stream] = self._read.get(stream, 0) + (report.get("input_rows") or 0)
        behind = report.get("kafka_lag")
        text = f"{stream}: batch {report.get('batch_id')} done, {self._read[stream]:,} records read"
        if behind is not None:
            text += f", {int(behind):,} behind in Kafka"
        self._stream = text
        self._draw()

    def write(self, line: str) -> None:
        """Print ``line`` on stderr above the live line (or plainly, when there is none)."""
        if self._bar is not None:
            self._bar.write(line, file=self._file)
        else:
            print(line, file=self._file, flush=True)

    def _poll(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._draw()

    def _draw(self) -> None:
        bar = self._bar
        if bar is None:
            return
        parts = [self._what, self._stream, self._tasks()]
        bar.set_description_str(" · ".join(part for part in parts if part), refresh=True)

    def _tasks(self) -> str:
        """Tasks done of the Spark stages running now, e.g. "Spark tasks 3/8"; "" between stages."""
        try:
            tracker = self._spark.sparkContext.statusTracker()
            stages = [tracker.getStageInfo(stage) for stage in tracker.getActiveStageIds()]
        except Exception:  # noqa: BLE001 - a session stopping: the line says less, the command goes on
            return ""
        stages = [stage for stage in stages if stage is not None]
        if not stages:
            return ""
        done = sum(stage.numCompletedTasks for stage in stages)
        total = sum(stage.numTasks for stage in stages)
        return f"Spark tasks {done}/{total}"
