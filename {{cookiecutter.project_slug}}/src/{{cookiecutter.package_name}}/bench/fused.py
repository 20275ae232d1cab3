"""The fused mode (``pipeline/fused.py``) on the exactly-once lakehouse: what one stream writing the four
tables in each batch gains over a stream per layer.

After the layered latency runs, the lakehouse is handed over to the fused stream (``switch_mode``, the
command's own way) and measured as the layered streams were: one-record and steady batches through the
running stream, against the same Kafka floor (``fixed_overhead``), and Kafka -> gold latency at the
fastest trigger (``latency``). Then it is handed back, so a later phase finds the lakehouse layered.
"""

from __future__ import annotations

import statistics

from ..pipeline.config import Mode
from ..pipeline.delta.tables import FUSED
from ..pipeline.streams import switch_mode
from . import latency
from .fixed_overhead import run_steps, step_batches
from .harness import Bench, median_durations, percentile, say


def measure(bench: Bench, topic: str) -> None:
    """Continues the exactly-once lakehouse after the layered latency runs; needs the Kafka floor measured."""
    sizes = bench.sizes
    layered = bench.phase_config(bench.work / "eo", topic)
    say("fused: the lakehouse handed over to the fused stream (checkpoints switch fused)")
    handed = switch_mode(bench.spark, layered, Mode.FUSED)
    try:
        steady = sizes.steady_batch or bench.kafka.max_offsets_per_trigger
        config = bench.phase_config(bench.work / "eo", topic, trigger=sizes.overhead_trigger)
        config = config.model_copy(update={"mode": Mode.FUSED})
        steps = [steady] * sizes.overhead_repeats + [1] * sizes.overhead_repeats
        per_step = run_steps(bench, config, topic, steps, seed=3000, label="fused overhead")
        one = median_durations(step_batches(per_step, 1, FUSED.name))
        full = median_durations(step_batches(per_step, steady, FUSED.name))
        floor = bench.details["fixed_overhead"]["floors"]["kafka"]["median_ms"]
        bench.add("fused_one_record_batch_ms", "fused: one-record batch, four tables", one["triggerExecution"], "ms")
        bench.add(
            "fused_steady_batch_ms", f"fused: {steady:,}-record batch, four tables", full["triggerExecution"], "ms"
        )
        bench.add(
            "fused_vs_floor",
            "fused: one-record batch / Kafka source into noop",
            one["triggerExecution"] / floor,
            "ratio",
        )
        fast = latency.run(bench, topic, sizes.latency_fast_trigger, "fused", Mode.FUSED)
    finally:
        say("fused: the lakehouse handed back to the layered streams (checkpoints switch layered)")
        handed_back = switch_mode(bench.spark, layered, Mode.LAYERED)
    gold = fast["latencies_s"]["gold"]
    at = f"at {fast['trigger']}"
    bench.add("latency_fused_gold_p50_s", f"fused: Kafka -> gold latency p50, {at}", statistics.median(gold), "s")
    bench.add(
        "latency_fused_gold_p95_s",
        f"fused: Kafka -> gold latency p95, {at}",
        percentile(gold, 0.95),
        "s",
    )
    bench.add(
        "latency_fused_gold_trend",
        f"fused: Kafka -> gold latency, last third / first third, {at} ({fast['rate']:,} records/s offered)",
        fast["gold_trend"],
        "ratio",
    )
    bench.details["fused"] = {
        "switch": handed,
        "switch_back": handed_back,
        "one_record_ms": one,
        "steady_ms": full,
        "latency": fast,
    }
