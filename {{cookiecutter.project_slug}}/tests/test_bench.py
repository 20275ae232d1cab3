"""Smoke test of `bench`: the quick benchmark, shrunk to a few thousand records, on the real stack.

It starts its own broker (bootstrap "local"), runs every phase with the project's streams and
checks that bench.json holds every metric with a positive value. Figures are never asserted:
targets are reported, not enforced.
"""

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import pyspark
import pytest

from {{ cookiecutter.package_name }}.bench import (
    FIGURES_FILE,
    METRIC_KEYS,
    PLOT_FILE,
    QUICK_SIZES,
    RESULTS_FILE,
    run_bench,
    sdp,
)
from {{ cookiecutter.package_name }}.bench.datasets_cost import cost_datasets, dataset_config
from {{ cookiecutter.package_name }}.bench.harness import on_cpus, own_cpus
from {{ cookiecutter.package_name }}.bench.latency import KEPT_UP, latency_trend
from {{ cookiecutter.package_name }}.bench.peer import (
    FLOWS_FILE,
    ROCKSDB_PROVIDER,
    Dedup,
    combine_runs,
    empty_spans,
    flow_times,
    gold_empty_seconds,
    layer_times,
    pipeline_configuration,
    pipeline_spec,
    read_through,
    spark_defaults,
    spread,
    unread,
    write_spark_defaults,
    write_spec,
)
from {{ cookiecutter.package_name }}.bench.recovery import ChildLog, kill_point
from {{ cookiecutter.package_name }}.bench.report import (
    LATENCY_GOALS,
    PEER_METRIC_KEYS,
    TARGETS,
    Goal,
    Metric,
    figures_markdown,
    format_goals,
    goal_outcomes,
    previous_figures,
)
from {{ cookiecutter.package_name }}.bench.run import only_phases
from {{ cookiecutter.package_name }}.bench.sizes import DATASET_COUNTS
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS, config_of
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
    peer_records=2_000,
    peer_increment=500,
    peer_pairs=1,
    peer_variant_pairs=1,
    distinct_values_per_key=2,
    datasets_records=500,
    format_records=500,
    format_repeats=1,
    # One dataset and two: each stream start costs seconds, and four add nothing the smoke run checks.
    dataset_counts=(1, 2),
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
    # Beside it, the figures as docs/benchmarks.md shows them, made from what bench.json holds.
    assert (output / FIGURES_FILE).read_text() == figures_markdown(written)
    assert {"mode", "machine", "sizes", "metrics", "details"} <= written.keys()
    for key in ("cores", "memory_gb", "cpu_model", "spark", "delta", "java"):
        assert written["machine"][key], key
    assert written["machine"]["spark"] == pyspark.__version__

    metrics = {metric["key"]: metric for metric in written["metrics"]}
    # The datasets' cost runs the counts the sizes name: a count not run has no figures.
    not_run = [f"datasets_{count}_" for count in DATASET_COUNTS if count not in TINY.dataset_counts]
    assert list(metrics) == [key for key in METRIC_KEYS if not key.startswith(tuple(not_run))]
    for key, metric in metrics.items():
        assert {"name", "value", "unit", "target", "met"} <= metric.keys(), key
        assert math.isfinite(metric["value"]) and metric["value"] > 0, (key, metric["value"])
        if metric["target"] is None:
            assert metric["met"] is None, key
        else:
            assert metric["met"] in (True, False), key
    targets = {key for key, metric in metrics.items() if metric["target"] is not None}
    # The peer's, when its extra is installed (`make bench` installs it; the suite's install may not).
    peer_targets = {f"peer_{name}_ratio" for name in ("startup", "bronze", "silver", "gold", "total", "increment_gold")}
    assert targets - peer_targets == {
        "bronze_vs_source",
        "bronze_vs_delta_sink",
        "bronze_vs_floor",
        "silver_vs_floor",
        "gold_vs_floor",
        "latency_gold_p95_triggers",
        "exactly_once_cost",
        "recovery_cost",
        "silver_append_scaling",
        "silver_merge_scaling",
        "silver_skewed_merge_scaling",
        "gold_merge_scaling",
        "distinct_merge_scaling",
        "format_avro_vs_json",
        "format_avro_vs_plain",
        "fused_vs_floor",
        "latency_fused_gold_p95_s",
        "latency_fast_gold_p95_s",
        "latency_gold_trend",
        "latency_fast_gold_trend",
        "latency_fused_gold_trend",
    }
    assert targets & peer_targets == (peer_targets if sdp.installed() else set())

    # The latency work's table: each of its figures measured, with the figure before and the target.
    assert [goal["name"] for goal in written["goals"]] == [goal.name for goal in LATENCY_GOALS]
    for goal in written["goals"]:
        assert goal["now"] == [metrics[key]["value"] for key in goal["keys"]], goal
        assert goal["met"] in (True, False)

    details = written["details"]
    # The formats phase parsed its records each way, through the bench's registry.
    formats = details["formats"]
    assert formats["records"] == TINY.format_records and formats["schema_id"] > 0
    assert {way: len(runs) for way, runs in formats["seconds"].items()} == {
        way: TINY.format_repeats for way in ("json", "avro", "plain_avro", "json_ten_expectations")
    }
    recovery = details["recovery"]
    assert recovery["killed_run"]["killed"]
    assert recovery["table_rows"]["killed_and_restarted"] == recovery["table_rows"]["undisturbed"]
    assert set(details["exactly_once"]["at_least_once"]) == {"bronze", "silver", "gold"}
    assert details["latency"]["markers"] >= 2
    # The fused mode measured on the same lakehouse, handed over and back by the switch itself.
    assert "silver holds bronze" in details["fused"]["switch"], details["fused"]
    assert "silver starts at bronze version" in details["fused"]["switch_back"], details["fused"]
    assert details["fused"]["latency"]["markers"] >= 2
    # Silver's sink both ways: a batch of new records appended, one overlapping the table merged.
    for scaling in (details["silver_scaling"], details["silver_scaling_skewed"]):
        for run in (run for runs in scaling["appends"].values() for run in runs):
            assert run["operation"] == "WRITE"
            assert run["operation_metrics"]["numOutputRows"] == scaling["batch_rows"]
        for run in (run for runs in scaling["merges"].values() for run in runs):
            assert run["operation"] == "MERGE"
            assert run["operation_metrics"]["numTargetRowsInserted"] == scaling["batch_rows"]
    skewed = details["silver_scaling_skewed"]
    assert skewed["tables"]["big"]["rows"] >= TINY.silver_big_table
    runs = [run for way in ("appends", "merges") for by_size in skewed[way].values() for run in by_size]
    assert all(run["batch_partitions"] == 5 for run in runs)  # both topics, the partition added later too
    gold = details["gold_scaling"]
    assert gold["tables"]["big"]["windows"] == TINY.gold_big_windows
    for run in (run for runs in gold["merges"].values() for run in runs):
        assert run["operation"] == "MERGE"
        # Half of the batch's windows are in the table already, half are new.
        assert run["operation_metrics"]["numTargetRowsUpdated"] == gold["batch_rows"] // 2
        assert run["operation_metrics"]["numTargetRowsInserted"] == gold["batch_rows"] // 2
    # The distinct count's sink both ways: its new values inserted into its table of values, gold merged.
    distinct = details["distinct_scaling"]
    assert distinct["tables"]["big"]["values"]["rows"] == TINY.gold_big_windows * distinct["keys_per_window"] * 2
    for run in (run for runs in distinct["merges"].values() for run in runs):
        assert run["gold"]["operation"] == "MERGE" and run["values"]["operation"] == "MERGE"
        assert run["gold"]["operation_metrics"]["numTargetRowsUpdated"] == distinct["batch_rows"] // 2
        assert run["gold"]["operation_metrics"]["numTargetRowsInserted"] == distinct["batch_rows"] // 2
        # The new windows' values all, and one of the two values of each key of a window held already.
        held, new = distinct["batch_rows"] // 2, distinct["batch_rows"] - distinct["batch_rows"] // 2
        assert run["values"]["operation_metrics"]["numTargetRowsInserted"] == new * 2 + held
    # 1 and 2 datasets' streams in one driver, each dataset with a topic and tables of its own.
    cost = details["datasets_cost"]["runs"]
    assert [len(cost[count]["datasets"]) for count in ("1", "2")] == [1, 2] and sorted(cost) == ["1", "2"]
    assert len(set(cost["2"]["datasets"])) == 2 and cost["2"]["datasets"][:1] == cost["1"]["datasets"]
    assert all(len(run["one_record"]) == TINY.overhead_repeats for run in cost.values())
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
    if sdp.installed():
        # Every setup's pairs; after every workload of each, both golds and both quarantines were compared
        # (the phase fails when they differ).
        setups = details["peer"]["setups"]
        assert {name: len(pairs) for name, pairs in setups.items()} == {
            "fair": TINY.peer_pairs,
            "rocksdb": TINY.peer_variant_pairs,
            "capped": TINY.peer_variant_pairs,
        }
        for pair in (pair for pairs in setups.values() for pair in pairs):
            runs = pair["workloads"]
            assert set(runs) == {"catch_up", "increment", "one_record"}
            assert all(run["gold_rows"] > 0 and run["quarantined"] > 0 for run in runs.values())
            for run in runs.values():
                for system in ("project", "sdp"):
                    assert run[system]["layer_seconds"].keys() == {"bronze", "silver", "gold"}
                    # Each layer's last commit after the one before it, the whole process after all of them.
                    done = run[system]["done_s"]
                    assert 0 < done["bronze"] <= done["gold"] < run[system]["wall_s"], (system, run[system])
                # SDP ran again while silver or quarantine had not read all of bronze (SdpPeer.drain), at most
                # three times.
                assert 1 <= run["sdp"]["runs"] <= 3 and not run["sdp"]["each_run"][-1]["unread"]
                # Every run's log is kept beside bench.json.
                logs = [run["project"]["log"], *(each["log"] for each in run["sdp"]["each_run"])]
                assert all(Path(log).is_file() and Path(log).is_relative_to(output / "evidence") for log in logs)

    plot = output / PLOT_FILE
    if importlib.util.find_spec("matplotlib") is not None:
        assert plot.stat().st_size > 0
    else:
        assert not plot.exists()


def test_a_runs_figures_in_markdown_list_every_metric_with_its_target_and_fit_a_screen():
    machine = {
        "cores": 2,
        "memory_gb": 23.5,
        "cpu_model": "AMD EPYC 7B13",
        "java": "17.0.15",
        "python": "3.11.7",
        "spark": "4.2.0",
        "delta": "4.4.0",
        "kafka_local_broker": "4.4.0",
        "spark_master": "local[2]",
        "load_average_start": [0.4, 0.3, 0.2],
    }
    metrics = [
        {
            "key": "bronze",
            "name": "Kafka -> bronze Delta",
            "value": 69312.4,
            "unit": "records/s",
            "target": None,
            "met": None,
        },
        {
            "key": "bronze_vs_source",
            "name": "bronze / source ceiling",
            "value": 0.1894,
            "unit": "ratio",
            "target": ">= 0.5",
            "met": False,
        },
        {
            "key": "fused_one_ms",
            "name": "fused one-record batch",
            "value": 2580.2,
            "unit": "ms",
            "target": None,
            "met": None,
        },
        {"key": "latency_p95_s", "name": "latency p95", "value": 18.54, "unit": "s", "target": "<= 20", "met": True},
    ]
    results = {
        "mode": "default",
        "duration_s": 1539.2,
        "started_at": "2026-11-29T10:00:00Z",
        "machine": machine,
        "metrics": metrics,
    }

    text = figures_markdown(results)

    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[1:] == [
        "| Kafka -> bronze Delta | 69,312 records/s |  |  |",
        "| bronze / source ceiling | 0.19 | >= 0.5 | no |",
        "| fused one-record batch | 2,580 ms |  |  |",
        "| latency p95 | 18.54 s | <= 20 | yes |",
    ]
    assert "A default run (1,539 s), started 2026-11-29T10:00:00Z: 2 cores, 23.5 GB" in " ".join(text.split())
    assert "0.4/0.3/0.2 at the start, ? at the end" in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 120
    with pytest.raises(ValueError, match="bench run's results"):
        figures_markdown({"metrics": []})


def test_a_goal_is_met_only_when_every_figure_of_it_meets_its_target_and_is_left_out_when_unmeasured():
    goal = Goal(("silver_vs_floor", "gold_vs_floor"), "one-record batch")
    silver = Metric("silver_vs_floor", "silver", 2.5, "ratio")

    assert goal.outcome([silver]) is None
    assert goal.outcome([silver, Metric("gold_vs_floor", "gold", 3.5, "ratio")])["met"] is False
    met = goal.outcome([silver, Metric("gold_vs_floor", "gold", 2.9, "ratio")], {"silver_vs_floor": 17.8})
    assert met == {
        "name": "one-record batch",
        "keys": ["silver_vs_floor", "gold_vs_floor"],
        "previous": [17.8, None],
        "now": [2.5, 2.9],
        "target": "<= 3",
        "met": True,
    }
    # A figure the previous run lacks (or no previous run) is shown as such.
    assert "one-record batch" in format_goals([met]) and "17.80, -" in format_goals([met])
    with pytest.raises(ValueError, match="unknown metric keys"):
        Goal(("silver_latency",), "x")
    with pytest.raises(ValueError, match="have no target"):
        Goal(("bronze_rps",), "x")


def test_a_run_is_compared_with_the_run_its_directory_held_before_and_with_no_shipped_figures(tmp_path):
    assert previous_figures(tmp_path) == {}
    (tmp_path / "bench.json").write_text(json.dumps({"metrics": [{"key": "exactly_once_cost", "value": 1.2}]}))

    now = [Metric("exactly_once_cost", "exactly-once / at-least-once", 1.05, "ratio")]
    [outcome] = goal_outcomes(now, previous_figures(tmp_path))
    assert outcome["previous"] == [1.2] and outcome["now"] == [1.05] and outcome["met"] is True
    assert goal_outcomes(now) == [{**outcome, "previous": [None]}]


def test_every_target_is_a_metrics_and_every_goal_names_its_figures_targets():
    assert set(TARGETS) <= {*METRIC_KEYS, *PEER_METRIC_KEYS}
    for goal in LATENCY_GOALS:
        assert all(key in TARGETS for key in goal.keys)
    assert Metric("exactly_once_cost", "x", 1.0, "ratio").target is TARGETS["exactly_once_cost"]
    assert Metric("bronze_rps", "x", 1.0, "records/s").target is None


def test_a_pipeline_that_keeps_up_has_a_flat_latency_trend_and_one_falling_behind_a_rising_one():
    produced = {f"m{i}": 7.5 * i for i in range(9)}  # a 60 s run
    # Keeping up: every marker 5 s after it was produced, give or take half a second.
    steady = {marker: at + 5.0 + (0.5 if int(marker[1:]) % 2 else 0.0) for marker, at in produced.items()}
    assert latency_trend(produced, steady) == pytest.approx(1.0, abs=0.1)
    assert KEPT_UP.met(latency_trend(produced, steady))
    # Processing a tenth less than offered: each second of the run adds a tenth of a second.
    behind = {marker: at + 5.0 + 0.1 * at for marker, at in produced.items()}
    assert latency_trend(produced, behind) > 1.5
    assert not KEPT_UP.met(latency_trend(produced, behind))


def test_a_latency_trend_leaves_out_unseen_markers_and_needs_two():
    produced = {"a": 0.0, "b": 1.0, "c": 2.0}
    assert latency_trend(produced, {"a": 2.0, "c": 6.0}) == 2.0
    with pytest.raises(ValueError, match="at least two markers"):
        latency_trend(produced, {"a": 2.0})


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


def test_the_datasets_cost_runs_the_projects_datasets_then_copies_each_reading_its_own_topic():
    datasets = cost_datasets(4)

    assert datasets[: len(DATASETS)] == DATASETS[:4]
    assert len({each.name for each in datasets}) == 4
    project_tables = {table for each in DATASETS for table in each.tables}
    assert all(project_tables.isdisjoint(each.tables) for each in datasets[len(DATASETS) :])
    config = load_config("local", environ={"KAFKA_TOPICS": "first"})
    for number, each in enumerate(datasets):
        topic = "first" if number == 0 else f"topic-{number}"
        assert config_of(dataset_config(config, each, topic), each, environ={}).kafka.topics == (topic,)
    with pytest.raises(ValueError):
        cost_datasets(0)


def test_bench_only_names_standalone_phases_in_run_order():
    assert only_phases({}) is None
    assert only_phases({"BENCH_ONLY": "datasets_cost, distinct_scaling"}) == ["distinct_scaling", "datasets_cost"]
    with pytest.raises(ValueError, match="not a standalone phase"):
        only_phases({"BENCH_ONLY": "latency"})


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="distinct_values_per_key"):
        dataclasses.replace(QUICK_SIZES, distinct_values_per_key=1)
    for counts in ((), (2, 4), (1, 3), (1, 4, 2)):
        with pytest.raises(ValueError, match="dataset_counts"):
            dataclasses.replace(QUICK_SIZES, dataset_counts=counts)
    with pytest.raises(ValueError, match="kill_fraction"):
        dataclasses.replace(QUICK_SIZES, kill_fraction=1.5)
    with pytest.raises(ValueError, match="records"):
        dataclasses.replace(QUICK_SIZES, records=0)


# --------------------------------------------------------------------------- the peer (no JVM)

JARS = ["/ivy/jars/io.delta_delta-spark_4.2_2.13-4.4.0.jar", "/ivy/jars/spark-sql-kafka-0-10_2.13-4.2.0.jar"]


def test_peer_spark_defaults_hold_the_static_settings_and_no_master(tmp_path):
    path = write_spark_defaults(tmp_path / "conf", spark_defaults(JARS, tmp_path))

    lines = dict(line.split(" ", 1) for line in path.read_text().splitlines())
    assert path == tmp_path / "conf" / "spark-defaults.conf"
    assert "spark.master" not in lines
    assert lines["spark.jars"] == ",".join(JARS)
    assert lines["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert lines["spark.sql.catalog.spark_catalog"] == "org.apache.spark.sql.delta.catalog.DeltaCatalog"
    assert lines["spark.sql.catalogImplementation"] == "hive"
    assert lines["spark.sql.sources.default"] == "delta"
    assert lines["spark.sql.warehouse.dir"] == str(tmp_path / "warehouse")
    assert lines["spark.hadoop.javax.jdo.option.ConnectionURL"] == (
        f"jdbc:derby:;databaseName={tmp_path / 'metastore_db'};create=true"
    )
    # The project's drains run with Spark's default driver memory: SDP's server is given it outright.
    assert lines["spark.driver.memory"] == "1g"
    with pytest.raises(ValueError, match="driver_memory"):
        spark_defaults(JARS, tmp_path, driver_memory="a lot")


def test_peer_spark_defaults_refuse_a_master_and_what_the_file_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="spark.master"):
        write_spark_defaults(tmp_path, {**spark_defaults(JARS, tmp_path), "spark.master": "local[2]"})
    with pytest.raises(ValueError, match="one line"):
        write_spark_defaults(tmp_path, {"spark.app.name": "two\nlines"})
    with pytest.raises(ValueError, match="jars"):
        spark_defaults([], tmp_path)


def test_peer_spec_names_the_flows_beside_it_and_only_session_settings(tmp_path):
    config = load_config("local", environ={"KAFKA_BOOTSTRAP_SERVERS": "broker:9092", "KAFKA_TOPICS": "bench-peer"})
    configuration = pipeline_configuration(config)
    spec = pipeline_spec("bench-peer", tmp_path / "storage", [FLOWS_FILE.name], configuration)
    written = json.loads(write_spec(tmp_path / "pipeline.json", spec).read_text())

    assert written == spec
    assert written["storage"] == (tmp_path / "storage").as_uri()  # SDP wants a scheme
    assert written["libraries"] == [{"glob": {"include": "sdp_flows.py"}}]
    assert configuration["peer.topic"] == "bench-peer"
    assert configuration["peer.bootstrap_servers"] == "broker:9092"
    assert configuration["peer.window"] == config.gold_window
    assert configuration["spark.sql.session.timeZone"] == "UTC"
    # A static setting there fails every flow with CANNOT_MODIFY_CONFIG.
    assert not {"spark.jars", "spark.sql.extensions", "spark.sql.warehouse.dir"} & configuration.keys()
    # The settings the project's drains run with are SDP's too; by default a backlog in one batch, no dedup.
    assert configuration["spark.sql.shuffle.partitions"] == str(config.shuffle_partitions)
    assert configuration["spark.databricks.delta.snapshotPartitions"] == str(max(config.shuffle_partitions, 2))
    assert configuration["peer.fetch_max_wait_ms"] == str(config.kafka.fetch_max_wait_ms)
    assert configuration["peer.max_offsets_per_trigger"] == "0"
    assert configuration["peer.bronze_dedup"] == "none"
    assert "spark.sql.streaming.stateStore.providerClass" not in configuration
    capped = pipeline_configuration(config, Dedup.ROCKSDB, capped=True)
    assert capped["peer.max_offsets_per_trigger"] == str(config.kafka.max_offsets_per_trigger)
    assert capped["peer.bronze_dedup"] == "rocksdb"
    assert capped["spark.sql.streaming.stateStore.providerClass"] == ROCKSDB_PROVIDER
    with pytest.raises(TypeError, match="Dedup"):
        pipeline_configuration(config, "rocksdb")
    with pytest.raises(ValueError, match="relative"):
        pipeline_spec("bench-peer", tmp_path, [str(FLOWS_FILE)], configuration)


def test_peer_flow_times_come_from_the_lines_as_they_appeared():
    lines = [
        (100.0, "2026-05-09 07:31:00: Starting run..."),
        (112.0, "2026-05-09 07:31:12: Flow spark_catalog.default.bronze is QUEUED."),
        (112.0, "2026-05-09 07:31:12: Flow spark_catalog.default.silver is QUEUED."),
        (112.5, "2026-05-09 07:31:12: Flow spark_catalog.default.bronze is STARTING."),
        (113.0, "2026-05-09 07:31:13: Flow spark_catalog.default.bronze is RUNNING."),
        (120.0, "2026-05-09 07:31:20: Flow spark_catalog.default.bronze has COMPLETED."),
        (120.5, "2026-05-09 07:31:20: Flow spark_catalog.default.silver is STARTING."),
        (126.0, "2026-05-09 07:31:26: Flow spark_catalog.default.silver has COMPLETED."),
        (126.2, "2026-05-09 07:31:26: Flow spark_catalog.default.gold is PLANNING."),
        (129.0, "2026-05-09 07:31:29: Flow spark_catalog.default.gold has COMPLETED."),
        (129.5, "2026-05-09 07:31:29: Run is COMPLETED."),
    ]

    times = flow_times(lines, launched=100.0)

    assert times["flow_states"]["bronze"] == ["QUEUED", "STARTING", "RUNNING", "COMPLETED"]
    assert times["flow_spans"] == {
        "bronze": [12.5, 20.0],
        "silver": [20.5, 26.0],
        "gold": [pytest.approx(26.2), 29.0],
    }
    assert times["flow_seconds"]["gold"] == pytest.approx(2.8)
    assert times["startup_seconds"] == 12.5
    assert times["end_seconds"] == 29.0


def write_delta_log(table: Path, commits: list[tuple[int, str, list[str], list[str]]]) -> None:
    """A hand-written _delta_log: (timestamp ms, operation, files added, files removed) per version."""
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for version, (timestamp, operation, added, removed) in enumerate(commits):
        actions = [{"commitInfo": {"timestamp": timestamp, "operation": operation}}]
        actions += [{"add": {"path": path, "dataChange": True}} for path in added]
        actions += [{"remove": {"path": path, "dataChange": True}} for path in removed]
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(action) for action in actions) + "\n")


def test_peer_gold_empty_seconds_run_from_the_commit_that_emptied_it_to_the_one_that_filled_it(tmp_path):
    gold = tmp_path / "gold"
    write_delta_log(
        gold,
        [
            (1_000, "CREATE TABLE", [], []),  # empty from its creation: not counted
            (5_000, "WRITE", ["a.parquet", "b.parquet"], []),
            (9_000, "TRUNCATE", [], ["a.parquet", "b.parquet"]),
            (30_500, "WRITE", ["c.parquet"], []),
            (40_000, "TRUNCATE", [], ["c.parquet"]),
            (41_250, "WRITE", ["d.parquet"], []),
        ],
    )

    spans = empty_spans(gold)

    assert [(span["emptied"], span["by"], span["filled"], span["seconds"]) for span in spans] == [
        (2, "TRUNCATE", 3, 21.5),
        (4, "TRUNCATE", 5, 1.25),
    ]
    assert gold_empty_seconds(gold) == pytest.approx(22.75)
    assert gold_empty_seconds(gold, after_version=3) == pytest.approx(1.25)  # the last run's only


def test_peer_layers_are_timed_from_each_tables_last_commit_after_the_launch(tmp_path):
    # Launched at 100 s (wall clock), start-up 10 s; a table's commits before the workload do not count.
    tables = {layer: tmp_path / layer for layer in ("bronze", "silver", "gold")}
    write_delta_log(
        tables["bronze"], [(50_000, "WRITE", ["old"], []), (130_000, "WRITE", ["a"], []), (140_000, "WRITE", ["b"], [])]
    )
    write_delta_log(tables["silver"], [(150_000, "WRITE", ["a"], [])])
    # Gold's last commit before silver's: it ran beside silver, and its share is none.
    write_delta_log(tables["gold"], [(60_000, "WRITE", ["old"], []), (145_000, "MERGE", ["a"], [])])

    times = layer_times(tables, 100.0, {"bronze": 0, "silver": -1, "gold": 0}, 10.0)

    assert times["done_s"] == {"bronze": 40.0, "silver": 50.0, "gold": 45.0}
    assert times["layer_seconds"] == {"bronze": 30.0, "silver": 10.0, "gold": 0.0}
    with pytest.raises(RuntimeError, match="silver: no commit after version 0"):
        layer_times(tables, 100.0, {"bronze": 0, "silver": 0, "gold": 0}, 10.0)
    with pytest.raises(ValueError, match="layers"):
        layer_times({"bronze": tables["bronze"]}, 100.0, {"bronze": 0}, 10.0)


def test_peer_pairs_are_reported_as_their_median_and_range():
    assert spread([1.1, 0.9, 1.0, 1.3, 0.95]) == {"median": 1.0, "low": 0.9, "high": 1.3}
    assert spread([2.0]) == {"median": 2.0, "low": 2.0, "high": 2.0}
    with pytest.raises(ValueError):
        spread([])


def test_both_systems_run_on_the_cpus_this_process_runs_on():
    cpus = own_cpus()
    assert on_cpus(["spark-pipelines", "run"], cpus) == ["taskset", "-c", cpus, "spark-pipelines", "run"]
    assert on_cpus(["run"], None) == ["run"]
    assert on_cpus(["run"], "0-3,6") == ["taskset", "-c", "0-3,6", "run"]
    for wrong in ("0;reboot", "", "all"):
        with pytest.raises(ValueError, match="cpus"):
            on_cpus(["run"], wrong)


def test_peer_gold_still_empty_at_its_last_commit_has_an_open_span(tmp_path):
    gold = tmp_path / "gold"
    write_delta_log(gold, [(1_000, "WRITE", ["a.parquet"], []), (2_000, "TRUNCATE", [], ["a.parquet"])])

    assert empty_spans(gold) == [{"emptied": 1, "by": "TRUNCATE", "filled": None, "by_filling": None, "seconds": None}]
    assert gold_empty_seconds(gold) == 0


BRONZE_ID = "f85ba97b-9b12-449e-b94f-6a9e90872ca2"


def write_bronze_log(table: Path, commits: list[tuple[str, int | None, int, bool]]) -> None:
    """A hand-written _delta_log of bronze: (operation, rows written, files added, as new data) per version."""
    log = table / "_delta_log"
    log.mkdir(parents=True)
    for version, (operation, rows, files, data_change) in enumerate(commits):
        info = {"timestamp": 1_000 * version, "operation": operation}
        if rows is not None:
            info["operationMetrics"] = {"numOutputRows": str(rows)}
        actions = [{"commitInfo": info}]
        if version == 0:
            actions.append({"metaData": {"id": BRONZE_ID}})
        actions += [{"add": {"path": f"v{version}-{n}.parquet", "dataChange": data_change}} for n in range(files)]
        (log / f"{version:020d}.json").write_text("\n".join(json.dumps(action) for action in actions) + "\n")


def write_checkpoint(checkpoint: Path, offsets: list[tuple[int, int]], committed: int, table_id: str = BRONZE_ID):
    """A streaming checkpoint reading one Delta table: an offset (version, index) per batch, the first
    ``committed`` of them written (a commit file each)."""
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch, (version, index) in enumerate(offsets):
        source = {"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version, "index": index}
        source["isStartingVersion"] = False
        lines = ["v1", json.dumps({"batchWatermarkMs": 0}), json.dumps(source)]
        (checkpoint / "offsets" / str(batch)).write_text("\n".join(lines) + "\n")
        if batch < committed:
            (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')


# The one-record workload as SDP 4.2.0 left it: its bronze wrote version 6 after silver had read through 5.
RERUN = [
    ("CREATE TABLE", None, 0, True),
    ("STREAMING UPDATE", 998, 2, True),
    ("STREAMING UPDATE", 7, 1, True),
    ("SET TBLPROPERTIES", None, 0, True),
    ("STREAMING UPDATE", 500, 1, True),
    ("SET TBLPROPERTIES", None, 0, True),
    ("STREAMING UPDATE", 1, 1, True),
]


def test_peer_silver_is_behind_by_the_bronze_commits_with_data_past_its_last_committed_offset(tmp_path):
    write_bronze_log(tmp_path / "bronze", RERUN)
    # Batch 2, planned up to version 6 but never committed, read nothing.
    write_checkpoint(tmp_path / "silver", [(3, -1), (6, -1), (7, -1)], committed=2)

    assert unread(tmp_path / "bronze", tmp_path / "silver") == [{"version": 6, "rows": 1, "files": 1}]


def test_peer_silver_is_caught_up_past_commits_without_new_data(tmp_path):
    # After bronze's last data: a table property, an empty streaming batch, a compaction (no new data).
    commits = [*RERUN, ("STREAMING UPDATE", 0, 0, True), ("OPTIMIZE", None, 1, False)]
    write_bronze_log(tmp_path / "bronze", commits)
    write_checkpoint(tmp_path / "silver", [(3, -1), (7, -1)], committed=2)

    assert unread(tmp_path / "bronze", tmp_path / "silver") == []


def test_peer_silver_before_its_first_batch_has_read_nothing(tmp_path):
    write_bronze_log(tmp_path / "bronze", RERUN[:3])
    write_checkpoint(tmp_path / "silver", [(3, -1)], committed=0)

    assert [commit["version"] for commit in unread(tmp_path / "bronze", tmp_path / "silver")] == [1, 2]


def test_peer_silver_reading_another_table_is_refused(tmp_path):
    write_bronze_log(tmp_path / "bronze", RERUN)
    write_checkpoint(tmp_path / "silver", [(7, -1)], committed=1, table_id="another-table")

    with pytest.raises(ValueError, match="another-table"):
        unread(tmp_path / "bronze", tmp_path / "silver")


def test_peer_a_version_part_read_counts_as_unread():
    assert read_through(None) == -1
    assert read_through({"reservoirVersion": 9, "index": -1, "isStartingVersion": False}) == 8
    # Inside version 9 (a commit split across batches): 9 may hold more, so it is not counted as read.
    assert read_through({"reservoirVersion": 9, "index": 3, "isStartingVersion": False}) == 8
    # Inside the table's first snapshot: nothing is known to be read.
    assert read_through({"reservoirVersion": 9, "index": 3, "isStartingVersion": True}) == -1
    with pytest.raises(ValueError):
        read_through({"index": -1})


def test_peer_runs_of_one_workload_are_timed_from_the_first_launch_to_the_last_gold():
    def run(launched, wall, exit_, startup, layers, empty):
        return {
            "launched": launched,
            "wall_s": wall,
            "exit_s": exit_,
            "startup_s": startup,
            "layer_seconds": dict(zip(("bronze", "silver", "gold"), layers, strict=True)),
            "gold_empty_s": empty,
            "log": f"run-{launched}.log",
        }

    first = run(100.0, 40.0, 44.0, 30.0, (5.0, 4.0, 3.0), 2.5)
    second = run(144.5, 38.0, 41.0, 29.0, (1.0, 2.0, 3.0), 3.0)

    both = combine_runs([first, second])

    # The first run's exit and the check before the second are SDP's time too.
    assert both["wall_s"] == pytest.approx(82.5)
    assert both["exit_s"] == pytest.approx(85.5)
    assert both["startup_s"] == 30.0
    assert both["layer_seconds"] == {"bronze": 6.0, "silver": 6.0, "gold": 6.0}
    assert both["gold_empty_s"] == 3.0
    assert both["runs"] == 2
    assert [each["log"] for each in both["each_run"]] == ["run-100.0.log", "run-144.5.log"]
    assert combine_runs([first])["wall_s"] == 40.0
    with pytest.raises(ValueError):
        combine_runs([])
