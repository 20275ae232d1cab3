"""Latency: Kafka timestamp of a marker record -> the commit that makes it visible in silver and in gold.

Records are produced at a steady rate into the running streams; every few transactions end with
a marker of its own event_type. A marker's visibility time is the commit timestamp of the first
table version that holds it, read back from the Delta history after the run.

Two runs on the same lakehouse: at the default trigger (the target) and at the fastest setting
(one run when the two are the same). Each states its offered rate and checks that the pipeline kept
up with it: a pipeline that cannot falls further behind as the run goes on, so its later markers
wait longer than its first (``latency_trend``).
"""

from __future__ import annotations

import statistics
import threading
import time
from urllib.parse import unquote

from ..devtools.sample import produce
from ..pipeline.config import Mode
from ..pipeline.datasets import DATASETS
from ..pipeline.delta.tables import GOLD, SILVER, Lakehouse
from ..pipeline.kafka.clients import client_config
from ..pipeline.streams import start_stream, stream_names
from .harness import Bench, check_running, percentile, progress_of, say, seconds, stop_all, summary
from .load import MARKER_PREFIX, paced_records
from .report import KEPT_UP

# A transaction every 100 ms.
TRANSACTIONS_PER_S = 10


def latency_trend(produced_at: dict[str, float], seen_at: dict[str, float]) -> float:
    """The median latency of the last third of the markers (in the order produced) over the first third's.

    About 1 when the pipeline keeps up with the offered rate; growing with the run's length when it
    does not. Markers never seen are left out.

    Example::

        latency_trend({"a": 0.0, "b": 1.0, "c": 2.0}, {"a": 2.0, "b": 3.0, "c": 6.0})  # 4.0 / 2.0 = 2.0
    """
    latencies = [
        seen_at[marker] - at
        for marker, at in sorted(produced_at.items(), key=lambda item: item[1])
        if marker in seen_at
    ]
    if len(latencies) < 2:
        raise ValueError(f"a latency trend needs at least two markers seen, got {len(latencies)}")
    third = max(1, len(latencies) // 3)
    return statistics.median(latencies[-third:]) / statistics.median(latencies[:third])


def first_visible(bench: Bench, path: str, first_version: int, prefix: str = MARKER_PREFIX) -> dict[str, float]:
    """Marker event_type -> commit time (epoch s) of the first table version from ``first_version`` that holds it.

    A row first becomes visible in the commit that adds the file holding it (later commits may copy it
    into other files, or mark it deleted, never make it visible earlier); so one scan of the files the
    commits from ``first_version`` added answers for every version, where reading each version would
    cost a snapshot and a job each.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    if first_version < 0:
        raise ValueError(f"first_version must not be negative, got {first_version}")
    committed_at = {
        row.version: row.ts
        for row in DeltaTable.forPath(bench.spark, path)
        .history()
        .where(F.col("version") >= first_version)
        .select("version", F.col("timestamp").cast("double").alias("ts"))
        .collect()
    }
    if not committed_at:
        return {}
    added = (
        bench.spark.read.text(f"{path}/_delta_log/*.json")
        .select(
            F.regexp_extract(F.input_file_name(), r"(\d+)\.json$", 1).cast("long").alias("version"),
            F.get_json_object("value", "$.add.path").alias("file"),
        )
        .where(F.col("file").isNotNull() & (F.col("version") >= first_version))
        .collect()
    )
    version_of = {_file_path(path, row.file): row.version for row in added}
    if not version_of:
        return {}
    rows = (
        bench.spark.read.option("basePath", _file_path(path, ""))
        .parquet(*version_of)
        .where(F.col("event_type").startswith(prefix))
        .select("event_type", F.input_file_name().alias("file"))
        .collect()
    )
    first: dict[str, int] = {}
    for row in rows:
        version = version_of[_file_path(path, row.file)]
        first[row.event_type] = min(version, first.get(row.event_type, version))
    return {marker: committed_at[version] for marker, version in first.items()}


def _file_path(table: str, file: str) -> str:
    """A data file's path, the same whether the log (URL-encoded, relative to the table) or Spark's
    input_file_name() (a file: URI) names it. The bench's lakehouses are local directories."""
    file = unquote(file)
    if file.startswith("file:"):
        file = "/" + file[len("file:") :].lstrip("/")
    elif not file.startswith("/"):
        file = f"{table.rstrip('/')}/{file}" if file else table.rstrip("/")
    return file


def _produce_paced(
    config, topic: str, sizes, transaction_size: int, marker_every: int, stop, failure: list, run: str
) -> None:
    try:
        records = paced_records(sizes.latency_rate, sizes.latency_seconds, transaction_size, marker_every, stop, run)
        produce(client_config(config), topic, records, transaction_size=transaction_size)
    except BaseException as error:  # noqa: BLE001 - reported by the main thread
        failure.append(error)


def _wait_for_markers(
    bench: Bench, queries: dict, gold_path: str, expected: int, timeout_s: float, prefix: str
) -> None:
    from pyspark.sql import functions as F

    deadline = time.monotonic() + timeout_s
    while True:
        check_running(queries)
        seen = bench.spark.read.format("delta").load(gold_path).where(F.col("event_type").startswith(prefix))
        count = seen.count()
        if count >= expected:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {count} of {expected} markers reached gold")
        time.sleep(2.0)


def run(bench: Bench, topic: str, trigger: str, name: str, mode: Mode = Mode.LAYERED) -> dict:
    """One latency run at ``trigger``: the running streams of ``mode`` on the exactly-once lakehouse, paced
    records with the markers of run ``name``; returns the latencies and the streams' batches."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    sizes = bench.sizes
    trigger_s = seconds(trigger)
    prefix = f"{MARKER_PREFIX}{name}-"
    config = bench.phase_config(bench.work / "eo", topic, trigger=trigger).model_copy(update={"mode": mode})
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
        f"latency ({name}): {sizes.latency_rate:,} records/s for {sizes.latency_seconds:g} s, trigger {trigger}, "
        f"{expected_markers} markers"
    )
    queries = {
        layer: start_stream(bench.spark, config, layer, available_now=False)
        for layer in stream_names(config, DATASETS[0])
    }
    stop = threading.Event()
    failure: list[BaseException] = []
    producer = threading.Thread(
        target=_produce_paced,
        args=(config, topic, sizes, transaction_size, marker_every, stop, failure, f"{name}-"),
        name="bench-producer",
        daemon=True,
    )
    try:
        producer.start()
        producer.join(sizes.latency_seconds + sizes.timeout_s)
        if failure:
            raise RuntimeError(f"the paced producer failed: {failure[0]}")
        # Generous: the last marker waits up to one trigger per layer, plus the batches themselves.
        _wait_for_markers(bench, queries, paths["gold"], expected_markers, 10 * trigger_s + 300, prefix)
    finally:
        stop.set()
        stop_all(queries.values())
    live_progress = {layer: progress_of(query) for layer, query in queries.items()}

    produced_at = {
        row.event_type: row.ts
        for row in bench.spark.read.format("delta")
        .load(paths["silver"])
        .where(F.col("event_id").startswith(prefix))
        .select("event_type", F.col("kafka_timestamp").cast("double").alias("ts"))
        .collect()
    }
    visible = {layer: first_visible(bench, path, first_version[layer], prefix) for layer, path in paths.items()}
    latencies = {
        layer: sorted(seen_at[marker] - produced_at[marker] for marker in produced_at if marker in seen_at)
        for layer, seen_at in visible.items()
    }
    trend = latency_trend(produced_at, visible["gold"])
    say(
        f"latency ({name}): offered {sizes.latency_rate:,} records/s; the last third of the markers took "
        f"{trend:.2f} times as long as the first ({'kept up' if KEPT_UP.met(trend) else 'fell behind'})"
    )
    return {
        "trigger": trigger,
        "trigger_s": trigger_s,
        "rate": sizes.latency_rate,
        "gold_trend": trend,
        "seconds": sizes.latency_seconds,
        "markers": len(produced_at),
        "latencies_s": latencies,
        "batches": {layer: summary({"progress": p}) for layer, p in live_progress.items()},
    }


def measure(bench: Bench, topic: str) -> None:
    """Continues the drained exactly-once lakehouse of the throughput phase with running streams."""
    sizes = bench.sizes
    default = run(bench, topic, sizes.latency_trigger or bench.base_config.trigger_interval, "default")
    if seconds(sizes.latency_fast_trigger) == default["trigger_s"]:
        # Sizes whose default trigger is already the fastest (the test suite's): one run stands for both.
        say(f"latency (fast): the default run was at {sizes.latency_fast_trigger} already; its figures stand")
        fast = default
    else:
        fast = run(bench, topic, sizes.latency_fast_trigger, "fast")
    gold = default["latencies_s"]["gold"]
    gold_p50, gold_p95 = statistics.median(gold), percentile(gold, 0.95)
    trigger_s = default["trigger_s"]
    bench.add(
        "latency_silver_p50_s", "Kafka -> silver latency p50", statistics.median(default["latencies_s"]["silver"]), "s"
    )
    bench.add("latency_gold_p50_s", "Kafka -> gold latency p50", gold_p50, "s")
    bench.add("latency_gold_p95_s", "Kafka -> gold latency p95", gold_p95, "s")
    bench.add("latency_gold_p50_triggers", "gold latency p50 / trigger interval", gold_p50 / trigger_s, "x")
    bench.add("latency_gold_p95_triggers", "gold latency p95 / trigger interval", gold_p95 / trigger_s, "x")
    rate = f"{sizes.latency_rate:,} records/s offered"
    bench.add(
        "latency_gold_trend",
        f"Kafka -> gold latency, last third / first third ({rate})",
        default["gold_trend"],
        "ratio",
    )
    fast_gold = fast["latencies_s"]["gold"]
    fast_p50, fast_p95 = statistics.median(fast_gold), percentile(fast_gold, 0.95)
    at = f"at {fast['trigger']}"
    bench.add("latency_fast_gold_p50_s", f"Kafka -> gold latency p50, {at}", fast_p50, "s")
    bench.add("latency_fast_gold_p95_s", f"Kafka -> gold latency p95, {at}", fast_p95, "s")
    bench.add(
        "latency_fast_gold_p95_triggers",
        f"gold latency p95 / trigger interval, {at}",
        fast_p95 / fast["trigger_s"],
        "x",
    )
    bench.add(
        "latency_fast_gold_trend",
        f"Kafka -> gold latency, last third / first third, {at} ({rate})",
        fast["gold_trend"],
        "ratio",
    )
    bench.details["latency"] = default
    bench.details["latency_fast"] = fast
