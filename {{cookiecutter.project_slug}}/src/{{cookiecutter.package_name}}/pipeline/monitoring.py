"""Per-batch progress: a readable line on stderr and a JSON record in the log.

stderr keeps stdout free for results (`audit --json`, `describe --json`).
"""

from __future__ import annotations

import json
import logging
import sys

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger(__name__)

# A batch (or, in the audit, the newest records) with at least this share quarantined is
# flagged: typically a producer that changed a field's type or format, while gold stops growing.
QUARANTINE_ALERT_SHARE = 0.5


def report_quarantine(stream: str, batch_id: int, records: int, quarantined: int, reasons: dict[str, int]) -> None:
    """Say how much of a batch went to quarantine; a WARNING naming the reasons at QUARANTINE_ALERT_SHARE or more.

    Example::

        report_quarantine("silver", 7, records=500, quarantined=500, reasons={"amount is not a number": 500})
    """
    if records < 0 or not 0 <= quarantined <= records:
        raise ValueError(f"quarantined must be between 0 and records, got {quarantined} of {records}")
    share = quarantined / records if records else 0.0
    alert = quarantined > 0 and share >= QUARANTINE_ALERT_SHARE
    print(
        f"[{stream}] batch {batch_id}: {quarantined} of {records} records quarantined ({round(100 * share)}%)"
        + (f"; check the producer: {reasons}" if alert else ""),
        file=sys.stderr,
        flush=True,
    )
    record = {
        "event": "quarantine",
        "stream": stream,
        "batch_id": batch_id,
        "records": records,
        "quarantined": quarantined,
        "share": round(share, 4),
        "reasons": reasons,
    }
    (log.warning if alert else log.info)(json.dumps(record))


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
