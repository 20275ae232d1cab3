"""The command line, end to end on the real broker, Spark and Delta."""

import json
import signal
import subprocess
import sys
import time
from importlib import resources

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.pipeline.delta.tables import GOLD, Lakehouse


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

    assert set(described["streams"]) == {"bronze", "silver", "gold"}
    checkpoint_dirs = [stream["checkpoint"] for stream in described["streams"].values()]
    assert len(set(checkpoint_dirs)) == 3
    assert all(path.startswith(str(tmp_path / "lake" / "checkpoints")) for path in checkpoint_dirs)
    assert set(described["tables"]) == {"bronze_events", "silver_events", "quarantine_events", "gold_event_windows"}
    assert described["streams"]["silver"]["source"] == described["tables"]["bronze_events"]


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[kafka]\nbootstrap_servers = 1\n")

    assert main(["--config", str(bad), "describe"]) == 2
    assert "kafka.bootstrap_servers: expected str" in capsys.readouterr().err


def test_kafka_local_status_exits_1_when_no_broker_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KAFKA_LOCAL_HOME", str(tmp_path))
    assert main(["kafka-local", "status"]) == 1
    assert "not running" in capsys.readouterr().out


def test_produce_run_audit_and_checkpoints_from_the_command_line(spark, pipeline_env, capsys):
    assert main(["produce-sample", "--count", "80", "--malformed-ratio", "0.2", "--seed", "3"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    progress = capsys.readouterr().err
    assert "[bronze] batch 0: 80 rows" in progress

    assert main(["audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "clean"
    assert report["counts"]["silver_rows"] + report["counts"]["quarantine_rows"] == 80

    assert main(["checkpoints", "list"]) == 0
    listing = capsys.readouterr().out
    assert all(f"{stream:<7} ok" in listing for stream in ("bronze", "silver", "gold"))

    assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
    assert main(["run", "--layer", "gold", "--available-now"]) == 0
    assert main(["audit"]) == 0
    assert "audit verdict: clean" in capsys.readouterr().out


def test_gold_table_of_another_contract_is_refused_with_exit_3_naming_the_way_out(spark, pipeline_env, capsys):
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
    with log.open("w") as log_file:  # a file: an unread pipe that fills up blocks the pipeline
        pipeline = subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", "--config", str(fast), "run", "--layer", "all"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: gold_events() == 60, 180, "the first 60 events in gold")
        assert main(["produce-sample", "--count", "40", "--seed", "22"]) == 0
        wait_for(lambda: gold_events() == 100, 120, "40 more events in gold")
    finally:
        pipeline.send_signal(signal.SIGTERM)
        pipeline.wait(timeout=180)
    output = log.read_text()
    assert pipeline.returncode == 0, output[-5000:]
    assert "Kafka lag" in output

    assert main(["audit"]) == 0
