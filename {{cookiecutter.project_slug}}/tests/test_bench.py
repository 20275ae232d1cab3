"""Smoke test of `bench`: the quick benchmark, shrunk to a few thousand records, on the real stack.

It starts its own broker (bootstrap "local"), runs every phase with the project's streams and
checks that bench.json holds every metric with a positive value. Figures are never asserted:
targets are reported, not enforced.
"""

import dataclasses
import importlib.util
import json
import math

import pyspark
import pytest

from {{ cookiecutter.package_name }}.bench import METRIC_KEYS, PLOT_FILE, QUICK_SIZES, RESULTS_FILE, run_bench
from {{ cookiecutter.package_name }}.bench.recovery import ChildLog, kill_point
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.egress import installed_names

pytestmark = pytest.mark.bench

TINY = dataclasses.replace(
    QUICK_SIZES,
    records=2_000,
    egress_rows=2_000,
    max_offsets_per_trigger=1_000,
    warmup_records=0,
    silver_batch=500,
    silver_small_table=1_000,
    silver_big_table=5_000,
    silver_table_commits=2,
    gold_small_windows=20,
    gold_big_windows=2_000,
    gold_batch_windows=4,
    gold_table_commits=2,
    merge_repeats=1,
    overhead_repeats=1,
    storage_records=1_000,
    storage_turns=1,
    latency_rate=100,
    latency_seconds=4.0,
    latency_trigger="1 second",
    latency_fast_trigger="1 second",
    marker_every_s=0.5,
    timeout_s=600.0,
)


@pytest.mark.kafka
def test_quick_benchmark_writes_every_metric(tmp_path, monkeypatch):
    # As a default bake ships: the egresses its config turns on are on (the suite turns them off elsewhere).
    monkeypatch.delenv("PIPELINE_EGRESS", raising=False)
    config = load_config("local", environ={"LAKEHOUSE_ROOT": str(tmp_path / "unused-lakehouse")})
    output = tmp_path / "bench"

    results = run_bench(config, quick=True, output_dir=output, sizes=TINY)

    written = json.loads((output / RESULTS_FILE).read_text())
    assert written["metrics"] == json.loads(json.dumps(results["metrics"]))
    assert {"mode", "machine", "sizes", "metrics", "details"} <= written.keys()
    for key in ("cores", "memory_gb", "cpu_model", "spark", "delta", "java"):
        assert written["machine"][key], key
    assert written["machine"]["spark"] == pyspark.__version__

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
    # Every target of the table, and the first silver scaling target.
    assert targets == {
        "bronze_vs_source",
        "bronze_vs_delta_sink",
        "bronze_vs_floor",
        "silver_vs_floor",
        "gold_vs_floor",
        "latency_gold_p95_triggers",
        "exactly_once_cost",
        "recovery_cost",
        "silver_merge_scaling",
        "silver_skewed_merge_scaling",
        "gold_merge_scaling",
    }

    details = written["details"]
    recovery = details["recovery"]
    assert recovery["killed_run"]["killed"]
    assert recovery["table_rows"]["killed_and_restarted"] == recovery["table_rows"]["undisturbed"]
    assert set(details["exactly_once"]["at_least_once"]) == {"bronze", "silver", "gold"}
    assert details["latency"]["markers"] >= 2
    merges = details["silver_scaling"]["merges"]
    assert all(run["operation"] == "MERGE" for runs in merges.values() for run in runs)
    assert all(run["operation_metrics"]["numTargetRowsInserted"] == TINY.silver_batch for run in merges["big"])
    skewed = details["silver_scaling_skewed"]
    assert skewed["tables"]["big"]["rows"] >= TINY.silver_big_table
    for run in (run for runs in skewed["merges"].values() for run in runs):
        assert run["operation"] == "MERGE"
        assert run["operation_metrics"]["numTargetRowsInserted"] == skewed["batch_rows"]
        assert run["batch_partitions"] == 5  # both topics, the partition added later too
    gold = details["gold_scaling"]
    assert gold["tables"]["big"]["windows"] == TINY.gold_big_windows
    for run in (run for runs in gold["merges"].values() for run in runs):
        assert run["operation"] == "MERGE"
        # Half of the batch's windows are in the table already, half are new.
        assert run["operation_metrics"]["numTargetRowsUpdated"] == gold["batch_rows"] // 2
        assert run["operation_metrics"]["numTargetRowsInserted"] == gold["batch_rows"] // 2
    floors = details["fixed_overhead"]["floors"]
    assert set(floors) == {"kafka", "bronze_table", "silver_table"}
    assert all(rows == 1 for floor in floors.values() for rows in floor["input_rows"])
    storage = details["storage"]
    assert storage["lakehouses"]["s3"].startswith("s3a://") and not storage["lakehouses"]["local"].startswith("s3a:")
    # The same records in every layer, whichever storage the lakehouse is on.
    rows = {
        name: [{layer: run["rows"] for layer, run in drain.items()} for drain in drains]
        for name, drains in storage["drains"].items()
    }
    assert rows["s3"] == rows["local"]
    assert all(drain["bronze"] == TINY.storage_records for drain in rows["s3"])
    # Each egress and Spark's own writer published the same gold, in one batch and in one-row batches.
    egress = details["egress"]
    runners = {runner for name in installed_names() for runner in (name, f"{name}_baseline")}
    assert set(egress["bulk"]) == runners
    assert all(run["batches"] >= 1 for run in egress["bulk"].values())
    assert all(len(batch_ms) == TINY.overhead_repeats for batch_ms in egress["one_row_batch_ms"].values())
    assert details["latency_fast"]["trigger"] == TINY.latency_fast_trigger
    assert details["latency_fast"]["markers"] >= 2

    plot = output / PLOT_FILE
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0
    else:
        assert not plot.exists()


def test_child_log_times_each_stream_from_lines_written_in_pieces(tmp_path):
    path = tmp_path / "run.log"
    path.write_bytes(b"[bronze] started (id 0a1b-2c)\n[bronze] batch 0: 100 rows, 1,000 rows/s\n[bronze] bat")
    log = ChildLog(path)
    log.poll()
    with path.open("ab") as file:
        file.write(b"ch 1: 0 rows, 0 rows/s\nINFO [bronze] batch 9: 5 rows\n[stream 0a1b-2c] stopped\n")
        file.write(b"[silver] started (id 3d4e)\n")
    log.poll()

    assert list(log.events) == ["bronze started", "bronze ended", "silver started"]
    assert log.events["bronze started"] <= log.events["bronze ended"] <= log.events["silver started"]
    assert log.batches == {"bronze": 1}
    assert not log.failed


def test_kill_point_is_the_last_event_seen_at_that_fraction_of_the_drain():
    undisturbed = {"drain_s": 10.0, "layer_spans": {"bronze": [0.0, 4.0], "silver": [4.5, 8.0], "gold": [8.0, 10.0]}}

    assert kill_point(undisturbed, 0.25) == ("bronze started", 2.5)
    assert kill_point(undisturbed, 0.6) == ("silver started", 1.5)
    assert kill_point(undisturbed, 0.42) == pytest.approx(("bronze ended", 0.2))
    assert kill_point(undisturbed, 0.8)[0] == "gold started"
    with pytest.raises(ValueError):
        kill_point(undisturbed, 1.0)


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="kill_fraction"):
        dataclasses.replace(QUICK_SIZES, kill_fraction=1.5)
    with pytest.raises(ValueError, match="records"):
        dataclasses.replace(QUICK_SIZES, records=0)
