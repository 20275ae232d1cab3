"""run_bench: every phase in order on one backlog, then the report.

Order matters: throughput drains the backlog into the exactly-once lakehouse that the
exactly-once comparison reuses and that fixed overhead and latency then keep feeding.
Silver, gold and distinct-count scaling, the formats (JSON against Avro), the fixed-overhead floors,
storage (local disk against the private S3 server) and the datasets' cost (1, 2 and 4 datasets in one
driver) build tables and topics of their own. The peer (this project against Spark Declarative
Pipelines, on a topic of its own) runs last: its processes, each with JVMs of its own, and their caches
weigh on no figure after it.

For development only, ``BENCH_ONLY`` (a comma-separated list of ``STANDALONE`` phases, e.g.
``BENCH_ONLY=distinct_scaling,datasets_cost``) runs the warm-up and those phases alone: a partial
bench.json, for working on a phase, never a run to publish.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from ..pipeline.config import Config
from . import (
    datasets_cost,
    distinct_scaling,
    egress,
    exactly_once,
    fixed_overhead,
    formats,
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

# The phases that need no earlier phase's lakehouse or backlog, by name: what BENCH_ONLY may name.
STANDALONE = {
    "gold_scaling": gold_scaling.measure,
    "distinct_scaling": distinct_scaling.measure,
    "formats": formats.measure,
    "egress": egress.measure,
    "storage": storage.measure,
    "datasets_cost": datasets_cost.measure,
    "peer": peer.measure,
}
ONLY_VAR = "BENCH_ONLY"
# Beside bench.json: the logs its figures came from (the peer's runs).
EVIDENCE_DIR = "evidence"


def only_phases(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """The phases ``BENCH_ONLY`` names, in run order; None when it is unset (every phase runs).

    Example::

        only_phases({"BENCH_ONLY": "datasets_cost"})  # ["datasets_cost"]
    """
    if environ is not None and not isinstance(environ, Mapping):
        raise TypeError(f"environ must be a mapping of variables, not {type(environ).__name__}")
    value = (os.environ if environ is None else environ).get(ONLY_VAR, "").strip()
    if not value:
        return None
    named = {name.strip() for name in value.split(",") if name.strip()}
    unknown = sorted(named - STANDALONE.keys())
    if unknown:
        raise ValueError(f"{ONLY_VAR}: {', '.join(unknown)}: not a standalone phase ({', '.join(STANDALONE)})")
    return [name for name in STANDALONE if name in named]


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
    only = only_phases()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    bench = Bench(config, sizes, work)
    # This run's evidence replaces the last run's, as its bench.json does.
    bench.evidence_dir = output_dir / EVIDENCE_DIR
    shutil.rmtree(bench.evidence_dir, ignore_errors=True)
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.monotonic()
    try:
        bench.start()
        machine = machine_info(bench.spark)
        say(f"machine: {machine['cores']} cores, {machine['memory_gb']} GB, {machine['cpu_model']}")
        warm_up(bench)
        if only is not None:
            say(f"{ONLY_VAR}: only {', '.join(only)}")
            for name in only:
                STANDALONE[name](bench)
        else:
            run_phases(bench, work)
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


def run_phases(bench: Bench, work: Path) -> None:
    """Every phase, in order, on one backlog."""
    sizes = bench.sizes
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
    distinct_scaling.measure(bench)
    formats.measure(bench)
    egress.measure(bench)
    fixed_overhead.measure(bench, topic)
    storage.measure(bench)
    latency.measure(bench, topic)
    fused.measure(bench, topic)
    datasets_cost.measure(bench)
    peer.measure(bench)
