"""run_bench: every phase in order on one backlog, then the report.

Order matters: throughput drains the backlog into the exactly-once lakehouse that the
exactly-once comparison reuses and that fixed overhead and latency then keep feeding.
Silver and gold scaling, the fixed-overhead floors and storage (local disk against the
private S3 server) build tables and topics of their own. The peer (this project against Spark
Declarative Pipelines, on a topic of its own) runs last: its processes, each with JVMs of its own,
and their caches weigh on no figure after it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from ..pipeline.config import Config
from . import (
    egress,
    exactly_once,
    fixed_overhead,
    fused,
    gold_scaling,
    latency,
    peer,
    recovery,
    silver_scaling,
    storage,
    throughput,
)
from .harness import Bench, say
from .load import produce_backlog
from .report import METRIC_KEYS, goal_outcomes, load_average, machine_info, previous_figures, publish
from .sizes import DEFAULT_SIZES, QUICK_SIZES, Sizes


def warm_up(bench: Bench) -> None:
    """A small pass through every code path, so the first measurement does not pay for the JIT."""
    records = bench.sizes.warmup_records
    if records <= 0:
        return
    say(f"warm-up: {records:,} records through every stream")
    work = bench.work / "warmup"
    topic = bench.create_topic(f"bench-warmup-{uuid.uuid4().hex[:8]}")
    config = bench.phase_config(work / "eo", topic)
    # S3's first access, mostly waiting on class loading and requests, beside the rest.
    with ThreadPoolExecutor(max_workers=1) as pool:
        s3_ready = pool.submit(storage.warm_up_s3, bench)
        produce_backlog(config, topic, records, seed=1)
        throughput.run_noop(bench, config, work / "noop")
        throughput.run_delta_sink(bench, config, work / "builtin-delta-sink")
        bench.run_layers(config)
        exactly_once.run_at_least_once(bench, work / "alo", topic)
        silver = silver_scaling.build_silver(bench, work / "silver", topic, records, 1)
        silver_scaling.time_insert(bench, silver, topic, records, max(1, records // 2), "warm", 0)
        silver_scaling.time_insert(bench, silver, topic, records + max(1, records // 2), 2, "warm", 1, held=1)
        s3_ready.result()


def run_bench(
    config: Config,
    quick: bool = False,
    output_dir: Path | str = "bench-results",
    keep: bool = False,
    sizes: Sizes | None = None,
) -> dict:
    """Run every measurement, print the table, write bench.json (+ bench.png); return the results.

    ``sizes`` replaces the default or quick sizes; ``keep`` keeps the work directory, broker, S3 server and topics.
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a pipeline Config, not {type(config).__name__}")
    if sizes is not None and not isinstance(sizes, Sizes):
        raise TypeError(f"sizes must be bench Sizes or None, not {type(sizes).__name__}")
    if not str(output_dir):
        raise ValueError("output_dir must name a directory")
    sizes = sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    bench = Bench(config, sizes, work)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    try:
        bench.start()
        machine = machine_info(bench.spark)
        say(f"machine: {machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}")
        warm_up(bench)
        topic = bench.create_topic(f"bench-{uuid.uuid4().hex[:8]}")
        say(f"producing {sizes.records:,} sample records in transactions")
        bench.details["produce_records_per_s"] = produce_backlog(
            bench.phase_config(work / "eo", topic), topic, sizes.records, seed=7
        )
        eo = throughput.measure(bench, topic)
        exactly_once.measure(bench, topic, eo)
        recovery.measure(bench, topic)
        silver_scaling.measure(bench, topic)
        gold_scaling.measure(bench)
        egress.measure(bench)
        fixed_overhead.measure(bench, topic)
        storage.measure(bench)
        latency.measure(bench, topic)
        fused.measure(bench, topic)
        peer.measure(bench)
        machine["load_average_end"] = load_average()
    finally:
        bench.stop(keep)
        if keep:
            say(f"kept the work directory {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    metrics = [bench.metrics[key] for key in METRIC_KEYS if key in bench.metrics]
    results = {
        "mode": "quick" if quick else ("custom" if sizes is not DEFAULT_SIZES else "default"),
        "started_at": started_at,
        "duration_s": time.monotonic() - started,
        "machine": machine,
        "sizes": dataclasses.asdict(sizes),
        "bronze_batch": bench.kafka.max_offsets_per_trigger,
        "metrics": [metric.as_dict() for metric in metrics],
        # Beside the run this directory held before, if any: the user's own machine, not a shipped table.
        "goals": goal_outcomes(metrics, previous_figures(output_dir)),
        "details": bench.details,
    }
    publish(results, metrics, output_dir)
    return results
