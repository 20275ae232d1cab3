"""What the pipeline says while it runs: a line per batch on stderr, a JSON record in the log, Prometheus metrics.

stderr keeps stdout free for results (`audit --json`, `describe --json`). The metrics are
served in the Prometheus text format when ``metrics.port`` is set (``serve_metrics``, called by
`run` before Spark starts); they are kept in the process either way, so the JSON log and the
metrics never disagree. Names start with ``lakehouse_``; every stream-level series carries a
``stream`` label (bronze, silver, gold, kafka_egress, postgres_egress):

* ``lakehouse_batch_duration_seconds`` (histogram): a micro-batch's wall time, as Spark reports it;
* ``lakehouse_input_records_total``, ``lakehouse_records_per_second``, ``lakehouse_last_batch``: what
  each batch read, how fast, and the last batch id committed (Spark reports a batch once its
  commit is written);
* ``lakehouse_kafka_lag_records`` (``topic``, ``partition``): records in Kafka after the batch's end;
* ``lakehouse_delta_version_lag`` (``table``): versions of the table a stream reads that it has
  not read yet (silver behind bronze, gold behind silver, an egress behind gold);
* ``lakehouse_quarantine_share``, ``lakehouse_quarantined_records_total`` (``reason``): silver's
  malformed records, by the rule they failed (``contract.quarantine_label``: ``<type>`` in place of
  the JSON type found, so the label takes one value per rule and field);
* ``lakehouse_egress_batches_total`` (``outcome``), ``lakehouse_egress_records_total``: each egress
  batch committed to its sink, or found already committed there (a replay);
* ``lakehouse_lease_info`` (``holder``): the process that holds each stream's lease.

Example, with ``metrics.port = 9108``::

    curl -s localhost:9108/metrics | grep lakehouse_kafka_lag_records
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from enum import Enum

from prometheus_client import Counter, Gauge, Histogram, Info, start_http_server
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from .contract import quarantine_label

log = logging.getLogger(__name__)

# A batch (or, in the audit, the newest records) with at least this share quarantined is
# flagged: typically a producer that changed a field's type or format, while gold stops growing.
QUARANTINE_ALERT_SHARE = 0.5

# Spark micro-batches take from a fraction of a second to minutes (a backfill, a rebuild).
BATCH_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)

BATCH_DURATION = Histogram(
    "lakehouse_batch_duration_seconds", "Wall time of a micro-batch", ["stream"], buckets=BATCH_SECONDS_BUCKETS
)
INPUT_RECORDS = Counter("lakehouse_input_records", "Records read by the stream's micro-batches", ["stream"])
RECORDS_PER_SECOND = Gauge("lakehouse_records_per_second", "Records processed per second in the last batch", ["stream"])
LAST_BATCH = Gauge("lakehouse_last_batch", "Id of the stream's last committed micro-batch", ["stream"])
KAFKA_LAG = Gauge(
    "lakehouse_kafka_lag_records",
    "Records in the Kafka partition after the end of the stream's last batch",
    ["stream", "topic", "partition"],
)
DELTA_VERSION_LAG = Gauge(
    "lakehouse_delta_version_lag",
    "Versions of the Delta table the stream reads that it has not fully read",
    ["stream", "table"],
)
QUARANTINE_SHARE = Gauge("lakehouse_quarantine_share", "Share of the last batch's records quarantined", ["stream"])
QUARANTINED_RECORDS = Counter(
    "lakehouse_quarantined_records",
    "Records sent to quarantine, by reason (the rule, <type> for the JSON type)",
    ["stream", "reason"],
)
# A quarantining expectation's failures are quarantine reasons (lakehouse_quarantined_records).
EXPECTATION_FAILURES = Counter(
    "lakehouse_expectation_failures",
    "Records that failed an expectation that warns or fails, by its name",
    ["stream", "expectation"],
)
EGRESS_BATCHES = Counter("lakehouse_egress_batches", "Egress batches, by outcome", ["stream", "outcome"])
EGRESS_RECORDS = Counter("lakehouse_egress_records", "Records an egress committed to its sink", ["stream"])
LEASE = Info("lakehouse_lease", "The process holding the stream's lease", ["stream"])


class EgressOutcome(Enum):
    COMMITTED = "committed"  # the batch's records and marker committed in one transaction
    ALREADY_COMMITTED = "already_committed"  # a replay: the sink's marker shows the batch, nothing written


def serve_metrics(address: str, port: int) -> None:
    """Serve this process's metrics on ``address``:``port`` (``/metrics``); OSError names ``metrics.port``.

    Example::

        serve_metrics("127.0.0.1", 9108)  # then: curl localhost:9108/metrics
    """
    if not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"port must be a TCP port (1-65535), not {port!r}")
    if not address:
        raise ValueError("address must be an interface address, e.g. '127.0.0.1' or '0.0.0.0'")
    try:
        start_http_server(port, addr=address)
    except OSError as error:
        raise OSError(
            f"metrics.port: cannot serve metrics on {address}:{port} ({error.strerror or error}); "
            "choose a free port (METRICS_PORT) or 0 to turn the metrics off"
        ) from error
    print(f"metrics: http://{address}:{port}/metrics", file=sys.stderr, flush=True)


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
    QUARANTINE_SHARE.labels(stream).set(share)
    # Labelled by rule (the JSON type found left out), a bounded set; the table keeps the full reason.
    for reason, count in reasons.items():
        QUARANTINED_RECORDS.labels(stream, quarantine_label(reason)).inc(count)
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


def report_expectations(stream: str, batch_id: int, failures: dict[str, int]) -> None:
    """Count the records of a batch that failed each expectation that warns or fails (a bounded set of
    labels: the dataset's expectation names); a WARNING naming those with failures.

    Example::

        report_expectations("orders_silver", 7, {"known_shop": 2, "total_below_limit": 0})
    """
    if any(not isinstance(count, int) or count < 0 for count in failures.values()):
        raise ValueError(f"failures must count records, got {failures}")
    for name, count in failures.items():
        EXPECTATION_FAILURES.labels(stream, name).inc(count)
    failed = {name: count for name, count in failures.items() if count}
    if failed:
        print(f"[{stream}] batch {batch_id}: expectations not met: {failed}", file=sys.stderr, flush=True)
        log.warning(json.dumps({"event": "expectations", "stream": stream, "batch_id": batch_id, "failed": failed}))


def report_egress_batch(stream: str, batch_id: int, outcome: EgressOutcome, records: int, sink: str) -> None:
    """Log and count one egress batch: committed to ``sink`` with ``records`` records, or a replay.

    Example::

        report_egress_batch("kafka_egress", 7, EgressOutcome.COMMITTED, records=120, sink="topic gold-changes")
    """
    if not isinstance(outcome, EgressOutcome):
        raise TypeError(f"outcome must be an EgressOutcome, not {outcome!r}")
    if records < 0:
        raise ValueError(f"records must not be negative, got {records}")
    EGRESS_BATCHES.labels(stream, outcome.value).inc()
    EGRESS_RECORDS.labels(stream).inc(records)
    done = f"{records} records committed to {sink}" if outcome is EgressOutcome.COMMITTED else f"already in {sink}"
    log.info("%s: batch %d: %s", stream, batch_id, done)


def report_lease(stream: str, holder: str) -> None:
    """Record which process now holds ``stream``'s lease (``lakehouse_lease_info``)."""
    LEASE.labels(stream).info({"holder": holder})


def kafka_lag(progress) -> str | None:
    """Records the Kafka source is behind the latest offsets, if this stream reads Kafka."""
    for source in progress.sources:
        behind = source.metrics.get("maxOffsetsBehindLatest")
        if behind is not None:
            return behind
    return None


def kafka_partition_lag(source) -> dict[tuple[str, str], int]:
    """Records after a Kafka source's end offset, by (topic, partition), from a batch's source progress.

    Spark reports both offsets as JSON ({"topic": {"0": 42}}); a source that is not Kafka gives {}.
    """
    end, latest = _offsets(source.endOffset), _offsets(source.latestOffset)
    lag = {}
    for topic, partitions in latest.items():
        if not isinstance(partitions, dict):
            return {}  # not a Kafka offset
        for partition, offset in partitions.items():
            done = end.get(topic, {}).get(partition)
            if isinstance(offset, int) and isinstance(done, int):
                lag[(topic, partition)] = max(0, offset - done)
    return lag


DELTA_SOURCE = re.compile(r"^DeltaSource\[(?P<path>.+)\]$")


def delta_source_version(source) -> tuple[str, int] | None:
    """(table path, last version fully read) of a Delta source's progress; None for another source.

    A Delta offset names the next version to read (index -1) or the version being read (index >= 0),
    so either way everything before ``reservoirVersion`` is done.
    """
    match = DELTA_SOURCE.match(source.description or "")
    offset = _offsets(source.endOffset)
    if match is None or "reservoirVersion" not in offset:
        return None
    return match.group("path"), int(offset["reservoirVersion"]) - 1


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _offsets(text: str | None) -> dict:
    try:
        found = json.loads(text) if text else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


class ProgressReporter(StreamingQueryListener):
    """Reports each stream's batches: a line on stderr, a JSON log record and the metrics.

    With ``spark``, it also measures how many versions of its Delta source each stream has not
    read (one listing of that table's log per batch), for ``lakehouse_delta_version_lag``.
    ``echo`` prints its lines (stderr by default; a command's live line prints them above itself),
    and ``on_batch`` is handed each batch's record, the one the JSON log gets.
    """

    def __init__(
        self,
        spark: SparkSession | None = None,
        echo: Callable[[str], None] | None = None,
        on_batch: Callable[[dict], None] | None = None,
    ) -> None:
        super().__init__()
        self._spark = spark
        self._echo = echo or _to_stderr
        self._on_batch = on_batch

    def onQueryStarted(self, event) -> None:
        self._echo(f"[{event.name}] started (id {event.id})")

    def onQueryProgress(self, event) -> None:
        progress = event.progress
        lag = kafka_lag(progress)
        rate = progress.processedRowsPerSecond or 0.0
        self._echo(
            f"[{progress.name}] batch {progress.batchId}: {progress.numInputRows} rows, "
            f"{rate:,.0f} rows/s" + ("" if lag is None else f", Kafka lag {lag}")
        )
        version_lag = self._observe(progress)
        record = {
            "event": "batch_progress",
            "stream": progress.name,
            "batch_id": progress.batchId,
            "input_rows": progress.numInputRows,
            "rows_per_second": rate,
            "kafka_lag": lag,
            "delta_version_lag": version_lag,
            "duration_ms": progress.durationMs,
        }
        log.info(json.dumps(record))
        if self._on_batch is not None:
            self._on_batch(record)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        outcome = f"failed: {event.exception}" if event.exception else "stopped"
        self._echo(f"[stream {event.id}] {outcome}")

    def _observe(self, progress) -> dict[str, int]:
        stream = progress.name or str(progress.id)
        BATCH_DURATION.labels(stream).observe(progress.durationMs.get("triggerExecution", 0) / 1000)
        INPUT_RECORDS.labels(stream).inc(progress.numInputRows)
        RECORDS_PER_SECOND.labels(stream).set(progress.processedRowsPerSecond or 0.0)
        LAST_BATCH.labels(stream).set(progress.batchId)
        version_lag = {}
        for source in progress.sources:
            for (topic, partition), behind in kafka_partition_lag(source).items():
                KAFKA_LAG.labels(stream, topic, partition).set(behind)
            read = delta_source_version(source)
            if read is not None and self._spark is not None:
                path, version = read
                table = path.rstrip("/").rsplit("/", 1)[-1]
                latest = self._latest_version(path)
                if latest is not None:
                    version_lag[table] = max(0, latest - version)
                    DELTA_VERSION_LAG.labels(stream, table).set(version_lag[table])
        return version_lag

    def _latest_version(self, path: str) -> int | None:
        from .delta.tables import latest_snapshot

        try:
            return latest_snapshot(self._spark, path).version()
        except Exception:  # a report must never fail the stream: storage gone, session stopping
            log.debug("no latest version of %s for the version lag", path, exc_info=True)
            return None
