"""Smoke test of `bench`: the quick benchmark, shrunk to a few thousand records, on the real stack.

It starts its own broker (bootstrap "local"), runs every phase with the project's streams and
checks that bench.json holds every metric with a positive value. Figures are never asserted:
targets are reported, not enforced.
"""

import dataclasses
import importlib.util
import json
import math

import pytest

from {{ cookiecutter.package_name }}.bench import METRIC_KEYS, PLOT_FILE, QUICK_SIZES, RESULTS_FILE, run_bench
from {{ cookiecutter.package_name }}.pipeline.config import load_config

TINY = dataclasses.replace(
    QUICK_SIZES,
    records=2_000,
    max_offsets_per_trigger=1_000,
    warmup_records=0,
    silver_batch=500,
    silver_small_table=1_000,
    silver_big_table=5_000,
    silver_table_commits=2,
    merge_repeats=1,
    overhead_repeats=1,
    latency_rate=100,
    latency_seconds=4.0,
    latency_trigger="1 second",
    marker_every_s=0.5,
    timeout_s=600.0,
)


@pytest.mark.kafka
def test_quick_benchmark_writes_every_metric(tmp_path):
    config = load_config("local", environ={"LAKEHOUSE_ROOT": str(tmp_path / "unused-lakehouse")})
    output = tmp_path / "bench"

    results = run_bench(config, quick=True, output_dir=output, sizes=TINY)

    written = json.loads((output / RESULTS_FILE).read_text())
    assert written["metrics"] == json.loads(json.dumps(results["metrics"]))
    assert {"mode", "machine", "sizes", "metrics", "details"} <= written.keys()
    for key in ("cores", "memory_gb", "cpu_model", "spark", "delta", "java"):
        assert written["machine"][key], key
    assert written["machine"]["spark"].startswith("4.0")

    metrics = {metric["key"]: metric for metric in written["metrics"]}
    assert list(metrics) == list(METRIC_KEYS)
    for key, metric in metrics.items():
        assert {"name", "value", "unit", "target", "met"} <= metric.keys(), key
        assert math.isfinite(metric["value"]) and metric["value"] > 0, (key, metric["value"])
        if metric["target"] is None:
            assert metric["met"] is None, key
        else:
            assert metric["met"] in (True, False), key
    targets = {key for key, metric in metrics.items() if metric["target"] is not None}
    assert targets == {
        "bronze_vs_source",
        "silver_merge_scaling",
        "bronze_fixed_overhead",
        "silver_fixed_overhead",
        "gold_fixed_overhead",
        "exactly_once_cost",
        "recovery_cost",
    }

    details = written["details"]
    assert details["recovery"]["killed_run"]["killed"]
    assert details["latency"]["markers"] >= 2
    merges = details["silver_scaling"]["merges"]
    assert all(run["operation"] == "MERGE" for runs in merges.values() for run in runs)
    assert all(run["operation_metrics"]["numTargetRowsInserted"] == TINY.silver_batch for run in merges["big"])

    plot = output / PLOT_FILE
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0
    else:
        assert not plot.exists()
