"""The command line, end to end on the real broker, Spark and Delta."""

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from decimal import Decimal
from importlib import resources

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import dev, main
from {{ cookiecutter.package_name }}.cli.dev import chaos_lakehouse, download_with_retries
from {{ cookiecutter.package_name }}.cli.live import LiveLine
from {{ cookiecutter.package_name }}.devtools.sample import MALFORMED_VALUES
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse


def test_describe_lists_each_stream_with_its_own_checkpoint(tmp_path):
    env = {"LAKEHOUSE_ROOT": str(tmp_path / "lake"), "PATH": ""}
    result = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "describe", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    described = json.loads(result.stdout)

    # Every dataset of the packaged config: the events, and any the bake declares beside them.
    assert list(described["datasets"]) == [each.name for each in DATASETS]
    streams = {name: each.name for each in DATASETS for name in each.streams}
    assert {name: stream["dataset"] for name, stream in described["streams"].items()} == streams
    assert {"bronze", "silver", "gold"} <= set(streams)
    checkpoint_dirs = [stream["checkpoint"] for stream in described["streams"].values()]
    assert len(set(checkpoint_dirs)) == len(streams)
    assert all(path.startswith(str(tmp_path / "lake" / "checkpoints")) for path in checkpoint_dirs)
    assert set(described["tables"]) == {table for each in DATASETS for table in each.tables}
    assert {"bronze_events", "silver_events", "quarantine_events", "gold_event_windows"} <= set(described["tables"])
    assert described["streams"]["silver"]["source"] == described["tables"]["bronze_events"]
    for each in DATASETS:
        assert described["datasets"][each.name]["golds"] == [gold.name for gold in each.golds]
        assert described["streams"][each.stream("bronze")]["source"].startswith("kafka:")


def test_describe_in_the_fused_mode_lists_one_stream_writing_the_four_tables(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("PIPELINE_MODE", "fused")

    assert main(["describe", "--json"]) == 0
    described = json.loads(capsys.readouterr().out)

    assert described["mode"] == "fused"
    assert list(described["streams"]) == ["fused"]
    assert list(described["streams"]["fused"]["sinks"]) == [BRONZE, SILVER, QUARANTINE, GOLD]
    monkeypatch.setenv("PIPELINE_MODE", "fast")
    assert main(["describe"]) == 2
    assert "pipeline.mode" in capsys.readouterr().err


@pytest.mark.parametrize(
    "configured, expected",
    [
        ("lakehouse", "{workdir}/lakehouse"),
        ("s3a://lake/clickstream", "s3a://lake/clickstream-chaos/run-1"),
        ("s3a://lake/team/clickstream/", "s3a://lake/team/clickstream-chaos/run-1"),
        ("s3a://lake", "s3a://lake/chaos/run-1"),
    ],
)
def test_a_chaos_run_gets_a_lakehouse_of_its_own_on_the_configured_storage(tmp_path, configured, expected):
    assert chaos_lakehouse(configured, tmp_path, "run-1") == expected.format(workdir=tmp_path)


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka]\nbootstrap_servers = 1\n")

    assert main(["--config", str(bad), "describe"]) == 2
    assert "kafka.bootstrap_servers: expected str" in capsys.readouterr().err


def test_setup_tries_a_failed_download_again_and_gives_up_after_the_last_attempt(monkeypatch, capsys):
    monkeypatch.setattr(dev, "DOWNLOAD_PAUSE_S", 0.0)
    outcomes = [RuntimeError("Ivy could not resolve Kafka 3.9.2 (exit 1):\n[FAILED] kafka-clients.jar"), ["a.jar"]]

    def flaky_download():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert download_with_retries("Kafka broker jars", flaky_download) == ["a.jar"]
    assert "Kafka broker jars: the download failed (Ivy could not resolve Kafka 3.9.2 (exit 1)); attempt 2 of 3" in (
        capsys.readouterr().err
    )

    calls = []

    def broken_download():
        calls.append(1)
        raise RuntimeError(f"still failing, call {len(calls)}")

    with pytest.raises(RuntimeError, match="still failing, call 3"):
        download_with_retries("Spark's package jars", broken_download)
    assert len(calls) == 3


def test_kafka_local_status_exits_1_when_no_broker_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KAFKA_LOCAL_HOME", str(tmp_path))
    assert main(["kafka-local", "status"]) == 1
    assert "not running" in capsys.readouterr().out


@pytest.mark.parametrize("flags", [["--count", "0"], ["--limit", "0"]])
def test_demo_refuses_a_count_or_limit_below_one_before_it_produces_anything(flags, capsys):
    assert main(["demo", *flags]) == 2
    assert "demo: --count and --limit must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["produce-sample", "demo"])
def test_a_malformed_ratio_outside_zero_to_one_exits_2_naming_the_flag(command, capsys):
    assert main([command, "--count", "10", "--malformed-ratio", "1.5"]) == 2
    assert f"{command}: --malformed-ratio must be between 0 and 1, not 1.5" in capsys.readouterr().err


def gold_of(values) -> dict[tuple[int, str], tuple[int, Decimal]]:
    """Gold computed in plain Python from the values Kafka holds, the sample's malformed ones left out:
    (minute's start in epoch seconds, event type) -> (events, amount)."""
    totals: dict[tuple[int, str], tuple[int, Decimal]] = {}
    for value in values:
        if value in MALFORMED_VALUES:
            continue
        event = json.loads(value)
        epoch = int(datetime.fromisoformat(event["event_time"]).timestamp())
        key = (epoch - epoch % 60, event["event_type"])
        count, amount = totals.get(key, (0, Decimal("0")))
        totals[key] = (count + 1, amount + Decimal(str(event["amount"])))
    return totals


def gold_windows(spark, config) -> dict[tuple[int, str], tuple[int, Decimal]]:
    gold = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(GOLD))
    rows = gold.select(F.col("window_start").cast("long"), "event_type", "event_count", "amount_sum").collect()
    return {(start, event_type): (count, amount) for start, event_type, count, amount in rows}


class Terminal(io.StringIO):
    """What a person's terminal looks like to a command: a file that is a TTY."""

    def isatty(self) -> bool:
        return True


@pytest.mark.storage
def test_produce_run_show_audit_and_checkpoints_from_the_command_line(
    spark, pipeline_env, capsys, kafka_oracle, monkeypatch
):
    assert main(["produce-sample", "--count", "80", "--malformed-ratio", "0.2", "--seed", "3"]) == 0
    # Run at a terminal: the batch lines, and under them the live line (cli/live.py).
    with monkeypatch.context() as terminal_only:
        terminal_only.setattr(sys, "stderr", Terminal())
        assert main(["run", "--layer", "all", "--available-now"]) == 0
        progress = sys.stderr.getvalue()
    assert "[bronze] batch 0: 80 rows" in progress
    assert "run --available-now: bronze, silver, gold" in progress
    assert "bronze: batch 0 done, 80 records read" in progress

    # Judged against Kafka itself: each committed record once in bronze, once in silver or quarantine.
    in_kafka = kafka_oracle(pipeline_env, list(pipeline_env.kafka.topics))
    committed = sorted(in_kafka)
    lakehouse = Lakehouse(pipeline_env.lakehouse_root)

    def coordinates(table: str) -> list[tuple]:
        rows = spark.read.format("delta").load(lakehouse.table(table)).select("topic", "partition", "offset")
        return [tuple(row) for row in rows.collect()]

    assert len(committed) == 80
    assert sorted(coordinates(BRONZE)) == committed
    assert sorted(coordinates(SILVER) + coordinates(QUARANTINE)) == committed

    assert main(["show", "silver", "quarantine", "--limit", "1"]) == 0
    shown = capsys.readouterr().out
    assert f"{SILVER}: {len(coordinates(SILVER))} rows" in shown
    assert f"{QUARANTINE}: {len(coordinates(QUARANTINE))} rows" in shown

    assert main(["audit", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    report = printed["datasets"]["events"]
    assert printed["verdict"] == report["verdict"] == "clean"
    assert report["counts"]["silver_rows"] + report["counts"]["quarantine_rows"] == 80
    assert sum(report["quarantine_by_reason"].values()) == report["counts"]["quarantine_rows"]

    # Judged again under the same contract, every quarantined record stays where it is, with its reason.
    quarantined = len(coordinates(QUARANTINE))
    assert main(["quarantine", "replay", "--since", "1 day"]) == 0
    assert (
        f"events: replay 0 judged {quarantined} quarantined record(s) again: 0 moved to {SILVER}, "
        f"{quarantined} stay in {QUARANTINE}"
    ) in capsys.readouterr().out
    assert len(coordinates(QUARANTINE)) == quarantined

    assert main(["checkpoints", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{stream:<7} ok" in listing for stream in ("bronze", "silver", "gold"))

    # A reset rebuilds gold from silver; the stream then goes on from there. Gold is judged against the
    # values Kafka holds, computed in plain Python: the audit recomputes gold with the pipeline's own code.
    assert gold_windows(spark, pipeline_env) == gold_of(in_kafka.values())
    assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
    assert gold_windows(spark, pipeline_env) == gold_of(in_kafka.values())
    assert main(["run", "--layer", "gold", "--available-now"]) == 0
    assert gold_windows(spark, pipeline_env) == gold_of(in_kafka.values())
    assert main(["audit"]) == 0
    assert "audit verdict: clean" in capsys.readouterr().out


def test_gold_table_of_another_contract_is_refused_with_exit_3_naming_the_way_out(
    spark, pipeline_env, capsys, kafka_oracle
):
    assert main(["produce-sample", "--count", "30", "--malformed-ratio", "0.2", "--seed", "4"]) == 0
    gold_path = Lakehouse(pipeline_env.lakehouse_root).table(GOLD)
    spark.createDataFrame([("x", 1)], "window_start string, event_count long").write.format("delta").save(gold_path)

    assert main(["run", "--layer", "gold", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert "refusing to start: gold_event_windows at" in refusal
    assert "checkpoints reset gold` (it asks first" in refusal
    # The way out named: gold is made again under the contract, and the pipeline and the audit go on.
    assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert main(["audit"]) == 0
    # Exact, judged against Kafka: every record once in bronze, gold as computed from their values.
    in_kafka = kafka_oracle(pipeline_env, list(pipeline_env.kafka.topics))
    bronze = spark.read.format("delta").load(Lakehouse(pipeline_env.lakehouse_root).table(BRONZE))
    assert len(in_kafka) == 30
    assert sorted(tuple(row) for row in bronze.select("topic", "partition", "offset").collect()) == sorted(in_kafka)
    assert gold_windows(spark, pipeline_env) == gold_of(in_kafka.values())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample the pipeline serves on ``port``, parsed by prometheus-client."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def sample(metrics, name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` whose labels match (each label value given as its start), if any."""
    for found, found_labels, value in metrics:
        if found == name and all(found_labels.get(key, "").startswith(text) for key, text in labels.items()):
            return value
    return None


def test_run_with_a_metrics_port_in_use_exits_2_naming_the_setting(pipeline_env, monkeypatch, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setenv("METRICS_PORT", str(taken.getsockname()[1]))
        assert main(["run", "--layer", "bronze", "--available-now"]) == 2
    error = capsys.readouterr().err
    assert "metrics.port: cannot serve metrics on 127.0.0.1" in error
    assert "METRICS_PORT" in error


def test_a_live_line_on_a_terminal_says_the_step_the_stream_and_spark_tasks_and_a_log_gets_none(spark):
    terminal = Terminal()
    with LiveLine(spark, "resetting gold: rebuilding tables", file=terminal, interval_s=0.05) as live:
        assert live.shown
        # Four tasks of half a second each on two cores: the line is redrawn while they run.
        spark.range(4, numPartitions=4).selectExpr("reflect('java.lang.Thread', 'sleep', 500L)").collect()
        live.batch({"stream": "bronze", "batch_id": 0, "input_rows": 60000, "kafka_lag": "240000"})
        live.batch({"stream": "bronze", "batch_id": 1, "input_rows": 40000, "kafka_lag": "200000"})
        live.write("[bronze] batch 1: 40000 rows")
    drawn = terminal.getvalue()
    assert "resetting gold: rebuilding tables" in drawn
    assert re.search(r"Spark tasks [0-3]/4", drawn), drawn
    assert "bronze: batch 1 done, 100,000 records read, 200,000 behind in Kafka" in drawn
    assert "[bronze] batch 1: 40000 rows\n" in drawn

    log = io.StringIO()
    with LiveLine(spark, "audit", file=log) as live:
        assert not live.shown
        spark.range(4, numPartitions=4).selectExpr("reflect('java.lang.Thread', 'sleep', 200L)").collect()
        live.write("[gold] batch 0: 12 rows")
    assert log.getvalue() == "[gold] batch 0: 12 rows\n"


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.mark.slow
def test_continuous_run_processes_new_records_and_stops_cleanly_on_sigterm(spark, pipeline_env, tmp_path):
    """All three streams at once in their own process, as in production."""
    packaged = resources.files("{{ cookiecutter.package_name }}").joinpath("conf", "local.toml").read_text()
    fast = tmp_path / "fast.toml"
    fast.write_text(packaged.replace('trigger_interval = "10 seconds"', 'trigger_interval = "1 second"'))
    gold_path = Lakehouse(pipeline_env.lakehouse_root).table(GOLD)

    def gold_events() -> int:
        try:
            return spark.read.format("delta").load(gold_path).agg(F.sum("event_count")).first()[0] or 0
        except AnalysisException:  # not created yet by the pipeline process
            return 0

    assert main(["produce-sample", "--count", "60", "--seed", "21"]) == 0
    log = tmp_path / "pipeline.log"
    port = free_port()
    with log.open("w") as log_file:  # a file: an unread pipe that fills up blocks the pipeline
        pipeline = subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", "--config", str(fast), "run", "--layer", "all"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "METRICS_PORT": str(port)},
        )
    try:
        wait_for(lambda: gold_events() == 60, 180, "the first 60 events in gold")
        assert main(["produce-sample", "--count", "40", "--seed", "22"]) == 0
        wait_for(lambda: gold_events() == 100, 120, "40 more events in gold")
        # Scraped while the pipeline runs, as Prometheus would.
        wait_for(lambda: sample(scrape(port), "lakehouse_input_records_total", stream="gold") is not None, 60, "gold")
        metrics = scrape(port)
    finally:
        pipeline.send_signal(signal.SIGTERM)
        pipeline.wait(timeout=180)
    output = log.read_text()
    assert pipeline.returncode == 0, output[-5000:]
    assert "Kafka lag" in output
    assert "INFO py4j" not in output  # one line per call into Python, each batch: not in the log

    assert sample(metrics, "lakehouse_input_records_total", stream="bronze") == 100
    for stream in ("bronze", "silver", "gold"):
        assert sample(metrics, "lakehouse_batch_duration_seconds_count", stream=stream) >= 1
        assert sample(metrics, "lakehouse_last_batch", stream=stream) >= 0
        assert sample(metrics, "lakehouse_lease_info", stream=stream, holder=f"pid {pipeline.pid} on host") == 1
    lag = {labels["partition"]: value for name, labels, value in metrics if name == "lakehouse_kafka_lag_records"}
    assert lag and set(lag.values()) == {0}, lag  # every record read: none behind the last batch
    assert sample(metrics, "lakehouse_delta_version_lag", stream="silver", table="bronze_events") is not None
    assert sample(metrics, "lakehouse_delta_version_lag", stream="gold", table="silver_events") is not None

    assert main(["audit"]) == 0
