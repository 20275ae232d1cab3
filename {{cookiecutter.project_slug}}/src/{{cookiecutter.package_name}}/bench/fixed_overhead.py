"""Fixed cost per batch: a one-record batch against a steady-state batch, per layer, in running streams."""

from __future__ import annotations

import time

from ..pipeline.config import Config
from ..pipeline.streams import start_stream
from ..pipeline.tables import LAYERS
from .harness import Bench, ProgressLog, check_running, input_rows, median_durations, say, stop_all
from .load import produce_one_transaction
from .report import Target


def wait_settled(bench: Bench, config: Config, queries: dict, bronze_rows: int) -> dict[str, int]:
    """Until bronze holds ``bronze_rows`` and silver, quarantine and gold have caught up with it.

    Tables are only read while no stream runs a batch, so the checks do not slow the batches.
    """
    if bronze_rows < 0:
        raise ValueError(f"bronze_rows must not be negative, got {bronze_rows}")
    deadline = time.monotonic() + bench.sizes.timeout_s
    while True:
        check_running(queries)
        if not any(query.status["isTriggerActive"] for query in queries.values()):
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


def measure(bench: Bench, topic: str) -> None:
    """Continues the drained exactly-once lakehouse of the throughput phase with running streams."""
    sizes = bench.sizes
    steady = sizes.steady_batch or bench.kafka.max_offsets_per_trigger
    config = bench.phase_config(bench.work / "eo", topic, trigger=sizes.overhead_trigger)
    expected = bench.table_rows(config)["bronze"]
    queries = {layer: start_stream(bench.spark, config, layer, available_now=False) for layer in LAYERS}
    log = ProgressLog(queries)
    steps = [steady] * sizes.overhead_repeats + [1] * sizes.overhead_repeats
    per_step = []
    try:
        for step, count in enumerate(steps):
            say(f"fixed overhead: a {count:,}-record batch through the running streams ({step + 1}/{len(steps)})")
            log.poll()
            before = {layer: set(log.batches[layer]) for layer in LAYERS}
            produce_one_transaction(config, topic, count, seed=1000 + step)
            expected += count
            wait_settled(bench, config, queries, expected)
            log.poll()
            new = {layer: [p for k, p in log.batches[layer].items() if k not in before[layer]] for layer in LAYERS}
            per_step.append((count, new))
    finally:
        stop_all(queries.values())
    results = {}
    for layer in LAYERS:
        # The batch of a step that carried it: the largest (a steady step can leave a
        # few records, behind the transaction markers, for a second small batch).
        full = [max(new[layer], key=input_rows) for count, new in per_step if count == steady and new[layer]]
        single = [max(new[layer], key=input_rows) for count, new in per_step if count == 1 and new[layer]]
        if not full or not single:
            raise RuntimeError(f"{layer}: no batch seen for some fixed-overhead step: {per_step}")
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
            Target("<=", 0.1),
        )
    bench.details["fixed_overhead"] = {"trigger": sizes.overhead_trigger, "steady_batch": steady, "layers": results}
