"""Latency: Kafka timestamp of a marker record -> the commit that makes it visible in silver and in gold.

Records are produced at a steady rate into the running streams; every few transactions end with
a marker of its own event_type. A marker's visibility time is the commit timestamp of the first
table version that holds it, read back from the Delta history after the run.
"""

from __future__ import annotations

import statistics
import threading
import time

from ..devtools.sample import produce
from ..pipeline.kafka_io import client_config
from ..pipeline.streams import start_stream
from ..pipeline.tables import GOLD, LAYERS, SILVER, Lakehouse
from .harness import Bench, check_running, percentile, progress_of, say, seconds, stop_all, summary
from .load import MARKER_PREFIX, paced_records

# A transaction every 100 ms.
TRANSACTIONS_PER_S = 10


def first_visible(bench: Bench, path: str, first_version: int) -> dict[str, float]:
    """Marker event_type -> commit time (epoch s) of the first table version from ``first_version`` that holds it."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if first_version < 0:
        raise ValueError(f"first_version must not be negative, got {first_version}")
    history = (
        DeltaTable.forPath(bench.spark, path)
        .history()
        .where(F.col("version") >= first_version)
        .select("version", F.col("timestamp").cast("double").alias("ts"))
        .orderBy("version")
        .collect()
    )
    seen: dict[str, float] = {}
    for commit in history:
        rows = (
            bench.spark.read.format("delta")
            .option("versionAsOf", commit.version)
            .load(path)
            .where(F.col("event_type").startswith(MARKER_PREFIX))
            .select("event_type")
            .collect()
        )
        for row in rows:
            seen.setdefault(row.event_type, commit.ts)
    return seen


def _produce_paced(config, topic: str, sizes, transaction_size: int, marker_every: int, stop, failure: list) -> None:
    try:
        records = paced_records(sizes.latency_rate, sizes.latency_seconds, transaction_size, marker_every, stop)
        produce(client_config(config), topic, records, transaction_size=transaction_size)
    except BaseException as error:  # noqa: BLE001 - reported by the main thread
        failure.append(error)


def _wait_for_markers(bench: Bench, queries: dict, gold_path: str, expected: int, timeout_s: float) -> None:
    from pyspark.sql import functions as F

    deadline = time.monotonic() + timeout_s
    while True:
        check_running(queries)
        seen = bench.spark.read.format("delta").load(gold_path).where(F.col("event_type").startswith(MARKER_PREFIX))
        count = seen.count()
        if count >= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count} of {expected} markers reached gold")
        time.sleep(2.0)


def measure(bench: Bench, topic: str) -> None:
    """Continues the drained exactly-once lakehouse of the throughput phase with running streams."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    sizes = bench.sizes
    trigger = sizes.latency_trigger or bench.base_config.trigger_interval
    trigger_s = seconds(trigger)
    config = bench.phase_config(bench.work / "eo", topic, trigger=trigger)
    lakehouse = Lakehouse(config.lakehouse_root)
    paths = {"silver": lakehouse.table(SILVER), "gold": lakehouse.table(GOLD)}
    first_version = {
        layer: DeltaTable.forPath(bench.spark, path).history(1).first()["version"] + 1 for layer, path in paths.items()
    }
    transaction_size = max(1, sizes.latency_rate // TRANSACTIONS_PER_S)
    marker_every = max(1, round(sizes.marker_every_s * TRANSACTIONS_PER_S))
    expected_markers = int(sizes.latency_rate * sizes.latency_seconds) // (transaction_size * marker_every)
    if expected_markers < 2:
        raise RuntimeError("latency needs at least two markers: raise latency_seconds or latency_rate")
    say(
        f"latency: {sizes.latency_rate:,} records/s for {sizes.latency_seconds:g} s, trigger {trigger}, "
        f"{expected_markers} markers"
    )
    queries = {layer: start_stream(bench.spark, config, layer, available_now=False) for layer in LAYERS}
    stop = threading.Event()
    failure: list[BaseException] = []
    producer = threading.Thread(
        target=_produce_paced,
        args=(config, topic, sizes, transaction_size, marker_every, stop, failure),
        name="bench-producer",
        daemon=True,
    )
    try:
        producer.start()
        producer.join(sizes.latency_seconds + sizes.timeout_s)
        if failure:
            raise RuntimeError(f"the paced producer failed: {failure[0]}")
        # Generous: the last marker waits up to one trigger per layer, plus the batches themselves.
        _wait_for_markers(bench, queries, paths["gold"], expected_markers, 10 * trigger_s + 300)
    finally:
        stop.set()
        stop_all(queries.values())
    live_progress = {layer: progress_of(query) for layer, query in queries.items()}

    produced_at = {
        row.event_type: row.ts
        for row in bench.spark.read.format("delta")
        .load(paths["silver"])
        .where(F.col("event_id").startswith(MARKER_PREFIX))
        .select("event_type", F.col("kafka_timestamp").cast("double").alias("ts"))
        .collect()
    }
    visible = {layer: first_visible(bench, path, first_version[layer]) for layer, path in paths.items()}
    latencies = {
        layer: sorted(seen_at[marker] - produced_at[marker] for marker in produced_at if marker in seen_at)
        for layer, seen_at in visible.items()
    }
    gold = latencies["gold"]
    gold_p50, gold_p95 = statistics.median(gold), percentile(gold, 0.95)
    bench.add("latency_silver_p50_s", "Kafka -> silver latency p50", statistics.median(latencies["silver"]), "s")
    bench.add("latency_gold_p50_s", "Kafka -> gold latency p50", gold_p50, "s")
    bench.add("latency_gold_p95_s", "Kafka -> gold latency p95", gold_p95, "s")
    bench.add("latency_gold_p50_triggers", "gold latency p50 / trigger interval", gold_p50 / trigger_s, "x")
    bench.add("latency_gold_p95_triggers", "gold latency p95 / trigger interval", gold_p95 / trigger_s, "x")
    bench.details["latency"] = {
        "trigger": trigger,
        "rate": sizes.latency_rate,
        "seconds": sizes.latency_seconds,
        "markers": len(produced_at),
        "latencies_s": latencies,
        "batches": {layer: summary({"progress": p}) for layer, p in live_progress.items()},
    }
