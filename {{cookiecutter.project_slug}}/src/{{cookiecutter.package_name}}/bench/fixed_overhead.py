"""Fixed cost per batch, per layer, in running streams: a one-record batch against a steady-state
batch, and against the framework floor. ``run_steps`` (a transaction at a time through the running
streams of any lakehouse) is the storage phase's way to its one-record batches too.

The floor of a layer is its stream's source, as the layer reads it, into Spark's `noop` sink with the
same trigger, fed one record at a time: the Kafka source with bronze's options and record shaping for
bronze, a Delta source on a bronze table for silver and on a silver table for gold. The floor runs on
its own topic and lakehouse (tables made by ``ensure_tables``, rows appended directly), after the
pipeline's streams have stopped, one stream at a time, so nothing else competes with it.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime

from ..pipeline.bronze import bronze_records
from ..pipeline.config import Config
from ..pipeline.datasets import DATASETS
from ..pipeline.delta.tables import BRONZE, BRONZE_SCHEMA, LAYERS, SILVER, Lakehouse, ensure_tables
from ..pipeline.kafka.clients import spark_source_options
from ..pipeline.streams import start_stream, stream_names
from .harness import Bench, ProgressLog, check_running, input_rows, median_durations, say, stop_all
from .load import produce_one_transaction
from .silver_scaling import BENCH_TOPIC_ID, silver_rows

# Which floor each layer's one-record batch is compared with: the source it reads.
FLOOR_OF = {"bronze": "kafka", "silver": "bronze_table", "gold": "silver_table"}
FLOOR_NAMES = {
    "kafka": "Kafka source -> noop",
    "bronze_table": "bronze table (Delta source) -> noop",
    "silver_table": "silver table (Delta source) -> noop",
}


def wait_settled(
    bench: Bench, config: Config, queries: dict, bronze_rows: int, ran: Callable[[], bool] | None = None
) -> dict[str, int]:
    """Until bronze holds ``bronze_rows`` and silver, quarantine and gold have caught up with it.

    Tables are only read while no stream runs a batch, and once ``ran()`` holds (when given: a cheap
    sign that the last layer has run), so the checks do not slow the batches: on S3 a check is a
    listing and a read of four tables' logs, a batch's worth of requests.
    """
    if bronze_rows < 0:
        raise ValueError(f"bronze_rows must not be negative, got {bronze_rows}")
    deadline = time.monotonic() + bench.sizes.timeout_s
    while True:
        check_running(queries)
        idle = not any(query.status["isTriggerActive"] for query in queries.values())
        if idle and (ran is None or ran()):
            rows = bench.table_rows(config)
            if (
                rows["bronze"] >= bronze_rows
                and rows["silver"] + rows["quarantine"] >= rows["bronze"]
                and rows["gold_events"] >= rows["silver"]
            ):
                return rows
        if time.monotonic() > deadline:
            raise RuntimeError(f"the streams did not catch up with {bronze_rows} bronze rows in time")
        time.sleep(0.25)


def run_steps(
    bench: Bench,
    config: Config,
    topic: str,
    counts: list[int],
    seed: int,
    label: str,
    bronze_rows: int | None = None,
) -> list[tuple[int, dict]]:
    """Each of ``counts`` as one transaction through the pipeline's streams running on ``config``'s lakehouse
    (one that drained ``topic`` already: ``bronze_rows`` rows, read from the table when None), one at a time,
    the next once the last has settled in every layer; returns, per step, its record count and the batches
    each stream ran for it (the three layers', or the fused stream's in ``config``'s fused mode).

    Any lakehouse, local or on S3, with any trigger: the fixed-overhead and storage phases share it.
    """
    if not counts or any(count <= 0 for count in counts):
        raise ValueError(f"run_steps needs positive record counts, got {counts}")
    if bronze_rows is not None and bronze_rows < 0:
        raise ValueError(f"bronze_rows must not be negative, got {bronze_rows}")
    expected = bench.table_rows(config)["bronze"] if bronze_rows is None else bronze_rows
    layers = stream_names(config, DATASETS[0])  # the first dataset; a phase's config runs no egress
    queries = {layer: start_stream(bench.spark, config, layer, available_now=False) for layer in layers}
    log = ProgressLog(queries)
    per_step = []
    try:
        for step, count in enumerate(counts):
            say(f"{label}: a {count:,}-record batch through the running streams ({step + 1}/{len(counts)})")
            log.poll()
            before = {layer: set(log.batches[layer]) for layer in layers}
            produce_one_transaction(config, topic, count, seed=seed + step)
            expected += count

            def every_layer_ran(before=before) -> bool:
                log.poll()
                return all(set(log.batches[layer]) - before[layer] for layer in layers)

            wait_settled(bench, config, queries, expected, ran=every_layer_ran)
            log.poll()
            new = {layer: [p for k, p in log.batches[layer].items() if k not in before[layer]] for layer in layers}
            per_step.append((count, new))
    finally:
        stop_all(queries.values())
    return per_step


def step_batches(per_step: list[tuple[int, dict]], count: int, layer: str) -> list[dict]:
    """The layer's batch of each step of ``count`` records, the one that carried it: the largest (a
    steady step can leave a few records, behind the transaction markers, for a second small batch)."""
    carried = [max(new[layer], key=input_rows) for step_count, new in per_step if step_count == count and new[layer]]
    if not carried:
        raise RuntimeError(f"{layer}: no batch seen for the {count:,}-record steps: {per_step}")
    return carried


def measure(bench: Bench, topic: str) -> None:
    """Continues the drained exactly-once lakehouse of the throughput phase with running streams."""
    sizes = bench.sizes
    steady = sizes.steady_batch or bench.kafka.max_offsets_per_trigger
    config = bench.phase_config(bench.work / "eo", topic, trigger=sizes.overhead_trigger)
    steps = [steady] * sizes.overhead_repeats + [1] * sizes.overhead_repeats
    per_step = run_steps(bench, config, topic, steps, seed=1000, label="fixed overhead")
    results = {}
    for layer in LAYERS:
        full, single = step_batches(per_step, steady, layer), step_batches(per_step, 1, layer)
        one, full_ms = median_durations(single), median_durations(full)
        results[layer] = {
            "steady_ms": full_ms,
            "one_record_ms": one,
            "steady_reported_input_rows": [p["numInputRows"] for p in full],
            "batches_per_step": [len(new[layer]) for _, new in per_step],
        }
        bench.add(f"{layer}_one_record_batch_ms", f"{layer}: one-record batch", one["triggerExecution"], "ms")
        bench.add(f"{layer}_steady_batch_ms", f"{layer}: {steady:,}-record batch", full_ms["triggerExecution"], "ms")
        bench.add(
            f"{layer}_fixed_overhead",
            f"{layer}: one-record / steady batch",
            one["triggerExecution"] / full_ms["triggerExecution"],
            "ratio",
        )
    floors = measure_floors(bench)
    for name, floor in floors.items():
        bench.add(f"floor_{name}_ms", f"floor, one record: {FLOOR_NAMES[name]}", floor["median_ms"], "ms")
    for layer in LAYERS:
        floor = floors[FLOOR_OF[layer]]["median_ms"]
        one = results[layer]["one_record_ms"]["triggerExecution"]
        results[layer]["floor"] = FLOOR_OF[layer]
        bench.add(f"{layer}_vs_floor", f"{layer}: one-record batch / its floor", one / floor, "ratio")
    bench.details["fixed_overhead"] = {
        "trigger": sizes.overhead_trigger,
        "steady_batch": steady,
        "layers": results,
        "floors": floors,
    }


def measure_floors(bench: Bench) -> dict[str, dict]:
    """Each layer's source into `noop`, running with the fixed-overhead trigger, fed one-record batches."""
    sizes = bench.sizes
    topic = bench.create_topic(f"bench-floor-{uuid.uuid4().hex[:8]}")
    config = bench.phase_config(bench.work / "floor", topic, trigger=sizes.overhead_trigger)
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(bench.spark, lakehouse)
    spark = bench.spark
    sources = {
        "kafka": lambda: bronze_records(
            spark.readStream.format("kafka").options(**spark_source_options(config)).load()
        ),
        "bronze_table": lambda: spark.readStream.format("delta").load(lakehouse.table(BRONZE)),
        "silver_table": lambda: spark.readStream.format("delta").load(lakehouse.table(SILVER)),
    }
    feeds = {
        "kafka": lambda step: produce_one_transaction(config, topic, 1, seed=5000 + step),
        "bronze_table": lambda step: (
            _bronze_row(bench, topic, step).write.format("delta").mode("append").save(lakehouse.table(BRONZE))
        ),
        "silver_table": lambda step: (
            silver_rows(bench, topic, step, step + 1, 1)
            .write.format("delta")
            .mode("append")
            .save(lakehouse.table(SILVER))
        ),
    }
    queries = {}
    try:
        for name, source in sources.items():
            queries[name] = (
                source()
                .writeStream.format("noop")
                .option("checkpointLocation", f"{config.lakehouse_root}/checkpoints/floor-{name}")
                .queryName(f"bench_floor_{name}")
                .trigger(processingTime=sizes.overhead_trigger)
                .start()
            )
        _wait(bench, queries, lambda: all(query.lastProgress is not None for query in queries.values()), "start")
        log = ProgressLog(queries)
        for step in range(sizes.overhead_repeats):
            for name, feed in feeds.items():
                step_of = f"{step + 1}/{sizes.overhead_repeats}"
                say(f"fixed overhead: floor, one record through {FLOOR_NAMES[name]} ({step_of})")
                log.poll()
                seen = len(log.batches[name])
                feed(step)

                def arrived(name=name, seen=seen) -> bool:
                    log.poll()
                    return len(log.batches[name]) > seen

                _wait(bench, queries, arrived, name)
    finally:
        stop_all(queries.values())
    floors = {}
    for name in sources:
        ran = list(log.batches[name].values())
        floors[name] = {
            "median_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in ran),
            "median_batch_ms": median_durations(ran),
            "input_rows": [p["numInputRows"] for p in ran],
        }
    return floors


def _wait(bench: Bench, queries: dict, done, what: str) -> None:
    deadline = time.monotonic() + bench.sizes.timeout_s
    while not done():
        check_running(queries)
        if time.monotonic() > deadline:
            raise RuntimeError(f"fixed overhead: the floor streams did not finish {what} in time")
        time.sleep(0.1)


def _bronze_row(bench: Bench, topic: str, step: int):
    """One bronze row, as bronze holds a record of ``topic`` at offset ``step``."""
    now = datetime.now(UTC)
    value = json.dumps({"event_id": f"bench-floor-{step}", "event_time": now.isoformat()}).encode()
    row = (b"bench-floor", value, None, topic, BENCH_TOPIC_ID, 0, step, now, 0, now)
    return bench.spark.createDataFrame([row], BRONZE_SCHEMA)
