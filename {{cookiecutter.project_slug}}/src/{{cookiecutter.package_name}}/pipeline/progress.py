"""Per-batch progress: a readable line on stderr and a JSON record in the log.

stderr keeps stdout free for results (`audit --json`, `describe --json`).
"""

from __future__ import annotations

import json
import logging
import sys

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)


def kafka_lag(progress) -> str | None:
    """Records the Kafka source is behind the latest offsets, if this stream reads Kafka."""
    for source in progress.sources:
        behind = source.metrics.get("maxOffsetsBehindLatest")
        if behind is not None:
            return behind
    return None


class ProgressReporter(StreamingQueryListener):
    def onQueryStarted(self, event) -> None:
        print(f"[{event.name}] started (id {event.id})", file=sys.stderr, flush=True)

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        lag = kafka_lag(progress)
        rate = progress.processedRowsPerSecond or 0.0
        print(
            f"[{progress.name}] batch {progress.batchId}: {progress.numInputRows} rows, "
            f"{rate:,.0f} rows/s" + ("" if lag is None else f", Kafka lag {lag}"),
            file=sys.stderr,
            flush=True,
        )
        log.info(
            json.dumps(
                {
                    "event": "batch_progress",
                    "stream": progress.name,
                    "batch_id": progress.batchId,
                    "input_rows": progress.numInputRows,
                    "rows_per_second": rate,
                    "kafka_lag": lag,
                    "duration_ms": progress.durationMs,
                }
            )
        )

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        outcome = f"failed: {event.exception}" if event.exception else "stopped"
        print(f"[stream {event.id}] {outcome}", file=sys.stderr, flush=True)
