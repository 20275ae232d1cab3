"""Exactly-once under faults: crash points at every layer, random kills, a restarted broker, a cluster.

Each is judged by the chaos runner's oracle (tests/test_chaos_oracle.py proves it can fail). All but
the cluster run on the suite's storage (``--storage``): a local disk or the S3 server.
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.errors import AnalysisException

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.cli.exit_codes import ExitCode
from {{ cookiecutter.package_name }}.cli.local_servers import private_servers
from {{ cookiecutter.package_name }}.devtools.chaos import (
    Ledger,
    egress_env,
    has_pending_batch,
    judge,
    pending_batches,
    produce_numbered,
    run_chaos,
    verify,
)
from {{ cookiecutter.package_name }}.devtools.kafka_local import LocalKafka
from {{ cookiecutter.package_name }}.devtools.nemesis import Nemesis, Schedule, compiled_java_options, run_nemesis
from {{ cookiecutter.package_name }}.devtools.spark_cluster import StandaloneCluster
from {{ cookiecutter.package_name }}.pipeline import streams as pipeline_streams
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.config import Mode, duration_seconds, load_config
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.delta import files
from {{ cookiecutter.package_name }}.pipeline.delta.tables import (
    BRONZE,
    GOLD,
    QUARANTINE,
    SILVER,
    STREAMS,
    Lakehouse,
    latest_snapshot,
)
from {{ cookiecutter.package_name }}.pipeline.delta.writes import append_idempotent
from {{ cookiecutter.package_name }}.pipeline.egress import configure, installed_names
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery import checkpoints, lease
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import (
    AFTER_SINK_COMMIT,
    BETWEEN_SINK_COMMITS,
    CRASH_POINT_VAR,
    FUSED_POINTS,
    POINTS,
)
from {{ cookiecutter.package_name }}.pipeline.session.codegen import FACTORY_MODE, INTERPRETED
from {{ cookiecutter.package_name }}.pipeline.streams import reset_fused, run_available_now, switch_mode

# A short schedule for the suite; `nemesis --actions 100` is the long run (see docs/runbook.md).
# This seed draws every kind of fault the test asserts with one freeze (a freeze costs three
# pipeline processes and a lease's expiry), one broker restart and one foreign writer, in 13
# actions: none of the first 2,000,000 seeds does in 12.
NEMESIS_ACTIONS, NEMESIS_SEED = 13, 878302
# A seed whose first four actions are three transactions and a partition added: cheap to play twice.
REPLAY_SEED = 1970
# The fused mode's schedule, in 9 actions: kills, a crash (its points include the ones between the
# fused stream's commits), a partition added, a foreign writer, a table rolled back after it, the
# checkpoint lost (whose refusal's way out, the fused stream's reset, is taken).
FUSED_ACTIONS, FUSED_SEED = 9, 77498

# --- deterministic crash points -------------------------------------------------------------


def pipeline(*args: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def pipeline_env(config, **extra: str) -> dict:
    return {
        **os.environ,
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "KAFKA_MAX_OFFSETS_PER_TRIGGER": "50",
        **extra,
    }


def committed_ledger(config, records: int, seed: int) -> Ledger:
    """``records`` numbered records produced at once (every 17th malformed), and the ledger of those committed."""
    ledger = Ledger()
    produce_numbered(client_config(config), config.kafka.topics[0], f"r{seed}", records, seed, ledger, duration_s=0)
    return ledger


def oracle(spark, config, ledger: Ledger) -> dict:
    lakehouse = Lakehouse(config.lakehouse_root)

    def rows(name: str, *columns: str) -> list[tuple]:
        return [tuple(r) for r in spark.read.format("delta").load(lakehouse.table(name)).selectExpr(*columns).collect()]

    return verify(
        ledger,
        [(t, p, o, bytes(k).decode()) for t, p, o, k in rows(BRONZE, "topic", "partition", "offset", "key")],
        rows(SILVER, "topic", "partition", "offset"),
        rows(QUARANTINE, "topic", "partition", "offset"),
        rows(GOLD, "cast(window_start AS long)", "event_type", "event_count", "amount_sum"),
        duration_seconds(config.gold_window, "pipeline.gold_window"),
    )


def compiled_env(env: dict, event_logs: Path) -> dict:
    """``env`` for a pipeline process that compiles every query, as production does its large batches.

    The suite's JVMs start interpreted (conftest.py), and a stream interprets its small batches anyway
    (pipeline/session/codegen.py): started compiled-only, a driver compiles a batch of a few records too, and
    fails rather than interpret. Spark's event log (in ``event_logs``) records the plans it ran.
    """
    return {**env, "JAVA_TOOL_OPTIONS": compiled_java_options(logged_java_options(env, event_logs))}


def logged_java_options(env: dict, event_logs: Path) -> str:
    """``env``'s ``JAVA_TOOL_OPTIONS`` with Spark's event log on, written to ``event_logs``."""
    event_logs.mkdir(parents=True, exist_ok=True)
    options = [env.get("JAVA_TOOL_OPTIONS", ""), "-Dspark.eventLog.enabled=true"]
    options += [f"-Dspark.eventLog.dir={event_logs.as_uri()}", "-Dspark.eventLog.compress=false"]
    return " ".join(options).strip()


def queries_by_evaluation(event_logs: Path) -> dict[str, Counter]:
    """Per stream (its batches' queries) or "other", the queries the event logs under ``event_logs`` ran,
    counted by "compiled" (a whole-stage code generation stage in a plan Spark ran) and by the
    ``spark.sql.codegen.factoryMode`` the query's session set (Spark records the settings a session
    changes): read from Spark's own records, not from what the pipeline says it did."""
    started, compiled = {}, set()
    for log in event_logs.rglob("*"):
        if not log.is_file() or log.name.startswith((".", "appstatus")):
            continue
        app = log.parent if log.parent.name.startswith("eventlog_v2_") else log  # a rolled log's files, or one
        for line in log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the last line of a log its process was killed while writing
                continue
            kind = event.get("Event", "")
            if kind.endswith(("SQLExecutionStart", "SQLAdaptiveExecutionUpdate")):
                key = (app, event["executionId"])
                if kind.endswith("Start"):
                    started[key] = event
                plans = [event["sparkPlanInfo"]]
                while plans:
                    plan = plans.pop()
                    compiled.update([key] if plan["nodeName"].startswith("WholeStageCodegen") else [])
                    plans.extend(plan.get("children", []))
    found: dict[str, Counter] = {}
    for key, event in started.items():
        description = (event.get("description") or "").strip().splitlines()
        in_batch = len(description) == 4 and description[-1].startswith("batch = ")
        # Delta names the jobs it runs for a query after the query: "Delta: <stream>".
        counts = found.setdefault(description[0].removeprefix("Delta: ") if in_batch else "other", Counter())
        counts["compiled" if key in compiled else "not compiled"] += 1
        counts[(event.get("modifiedConfigs") or {}).get(FACTORY_MODE, "as started")] += 1
    return found


def assert_compiled(event_logs: Path, streams: list[str]) -> dict[str, Counter]:
    """Each of ``streams`` compiled queries inside its batches, and none of its batches interpreted."""
    found = queries_by_evaluation(event_logs)
    for stream in streams:
        assert found.get(stream, Counter())["compiled"] > 0, (stream, found)
        assert found[stream][INTERPRETED] == 0, (stream, found)
    return found


def sinks_oracle(spark, config, ledger: Ledger, env: dict) -> dict:
    """The tables and each egress's sink (read back by plain Kafka and PostgreSQL clients) against ``ledger``."""
    anomalies, _ = judge(spark, config, ledger, env)
    return anomalies


# On a local disk: crashes against S3's commits are proven by the random kills and by the fused
# stream's crash points, both marked `storage`; this chain on S3 takes about twice as long.
@pytest.mark.faults
# Sixteen driver processes, the last four compiling every query (the audit among them): on a busy 2-core
# machine about 7 minutes, near the suite's 900 s a test.
@pytest.mark.timeout(1800)
def test_streams_crashed_at_each_batch_boundary_then_run_compiled_leave_tables_and_egresses_exact(
    spark, config, tmp_path
):
    """The chain of crashes, each run killed at the next point and replaying the batch the run before
    was killed in, through every stream: the layers and each egress the bake has, on with a sink of
    this test's own (a private PostgreSQL server). The runs after the chain compile their queries, as
    production does its large batches: the one that finishes what the last crash left, and a batch of
    every stream after gold is reset with the egresses on. Every sink must mirror the rebuilt gold
    exactly. The chain's own runs interpret, as the suite's other processes do: a crash point lies in a
    batch's commits, which are the same whichever way its queries are evaluated."""
    # Malformed records too (every 17th): silver's batch then commits to silver and to quarantine.
    ledger = committed_ledger(config, 120, seed=31)
    lakehouse = Lakehouse(config.lakehouse_root)
    environ = {"KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers}
    packaged = configure(load_config("local", environ=environ), environ)
    egresses = [name for name in installed_names() if name in packaged.egress]
    event_logs = tmp_path / "event-logs"
    with ExitStack() as servers:
        run_config = private_servers(config.model_copy(update={"egress": packaged.egress}), tmp_path, servers)
        admin = AdminClient(client_config(run_config))
        sinks = egress_env(run_config, f"chain-{uuid.uuid4().hex[:6]}", admin)
        interpreted = {**pipeline_env(config), **sinks}
        env = compiled_env(interpreted, event_logs)
        section_of = {name: f"egress_{name.removesuffix('_egress')}" for name in egresses}
        assert env["PIPELINE_EGRESS"] == (",".join(section_of.values()) or "none")

        # Every point of every stream is reached on batch 0, and a crash while recovering from a crash
        # is covered too. Silver's point between its two commits comes before after_sink_commit, so
        # that the replay which follows it is the one that writes quarantine. An egress's replay after
        # its sink committed must find its marker and publish nothing again.
        chain = [
            *(("bronze", point) for point in POINTS),
            *(("silver", point) for point in (*POINTS[:-1], BETWEEN_SINK_COMMITS, POINTS[-1])),
            *(("gold", point) for point in POINTS),
            *((egress, AFTER_SINK_COMMIT) for egress in egresses),
        ]
        unreplayed: set[str] = set()  # egresses killed inside a batch no run has replayed since
        for stream, point in chain:
            crash_at = f"{stream}:{point}:0"
            crash_env = {**interpreted, CRASH_POINT_VAR: crash_at}
            if stream in egresses:
                # The layers and this egress alone: another egress, which runs beside it, would finish the
                # batch in which its own point of the chain lies.
                crash_env["PIPELINE_EGRESS"] = section_of[stream]
            crashed = pipeline("run", "--layer", "all", "--available-now", env=crash_env)

            assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
            assert f"crash point {crash_at}" in crashed.stderr
            pending = {name for name in (*STREAMS, *egresses) if has_pending_batch(spark, lakehouse.checkpoint(name))}
            assert pending == {stream, *unreplayed}, crash_at
            unreplayed |= {stream} & set(egresses)
            if point == BETWEEN_SINK_COMMITS:
                # The window is real: silver holds the batch, quarantine nothing of it yet.
                assert spark.read.format("delta").load(lakehouse.table(SILVER)).count() > 0
                assert spark.read.format("delta").load(lakehouse.table(QUARANTINE)).count() == 0
        recovered = pipeline("run", "--layer", "all", "--available-now", env=env)
        assert recovered.returncode == 0, recovered.stderr[-3000:]
        assert not any(sinks_oracle(spark, run_config, ledger, env).values()), sinks_oracle(
            spark, run_config, ledger, env
        )

        # Gold rebuilt from silver and swapped in, with new records on the way: each egress follows
        # the swap through gold's change feed, and its sink must end exact again.
        produce_numbered(client_config(config), config.kafka.topics[0], "r32", 30, 32, ledger, duration_s=0)

        reset = pipeline("checkpoints", "reset", "gold", "--yes", env=env)
        assert reset.returncode == 0, reset.stderr[-3000:]
        rerun = pipeline("run", "--layer", "all", "--available-now", env=env)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        anomalies = sinks_oracle(spark, run_config, ledger, env)
        assert {f"{name}_windows_wrong" for name in egresses} <= set(anomalies), anomalies
        assert not any(anomalies.values()), anomalies
        # The audit's recomputation of silver and gold, compiled too, agrees.
        audit_logs = tmp_path / "audit-event-logs"
        audited = pipeline("audit", env=compiled_env(env, audit_logs))
        assert audited.returncode == 0, (audited.stdout + audited.stderr)[-3000:]

    # The proof that all of it ran compiled, from Spark's own event logs: every stream's batches
    # compiled queries (whole-stage code generation stages in the plans Spark ran), none interpreted.
    print(assert_compiled(event_logs, ["bronze", "silver", "gold", *egresses]))
    assert queries_by_evaluation(audit_logs)["other"]["compiled"] > 0


@pytest.mark.faults
@pytest.mark.storage
def test_the_fused_stream_killed_after_each_of_its_four_commits_loses_and_doubles_nothing(spark, config):
    ledger = committed_ledger(config, 120, seed=37)
    lakehouse = Lakehouse(config.lakehouse_root)

    def count(name: str) -> int:
        return spark.read.format("delta").load(lakehouse.table(name)).count()

    # One chain, each run replaying the batch the run before it was killed in: the replay after the
    # silver commit must add to gold exactly the rows that commit added (read back at its version).
    for point in (*FUSED_POINTS, AFTER_SINK_COMMIT):
        crash_at = f"fused:{point}:0"
        crashed = pipeline(
            "run", "--available-now", env=pipeline_env(config, PIPELINE_MODE="fused", **{CRASH_POINT_VAR: crash_at})
        )
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        assert f"crash point {crash_at}" in crashed.stderr
        assert pending_batches(spark, f"{config.lakehouse_root}/checkpoints") == 1, crash_at
        if point in FUSED_POINTS[1:]:
            # The window is real: silver (and then quarantine) hold the batch, gold nothing of it yet.
            assert count(SILVER) > 0 and count(GOLD) == 0, crash_at
    recovered = pipeline("run", "--available-now", env=pipeline_env(config, PIPELINE_MODE="fused"))
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert count(QUARANTINE) > 0
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)


@pytest.mark.faults
def test_switching_to_fused_and_back_hands_every_record_over_once_and_a_lost_fused_checkpoint_is_reset(
    spark, config, lakehouse_files
):
    ledger = Ledger()
    fused = config.model_copy(update={"mode": Mode.FUSED})

    def produce(run: str) -> None:
        produce_numbered(client_config(config), config.kafka.topics[0], run, 40, 7, ledger, 0.0)

    produce("layered-1")
    run_available_now(spark, config)
    produce("fused-1")
    with pytest.raises(checkpoints.CheckpointError, match="checkpoints switch fused"):
        run_available_now(spark, fused)
    # Bronze has read the second run, silver and gold not yet: the switch lets them finish first.
    run_available_now(spark, config, ("bronze",))
    assert "silver holds bronze" in switch_mode(spark, config, Mode.FUSED)
    produce("fused-2")
    run_available_now(spark, fused)
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)
    # The audit's cut in this mode: the fused stream's last batch, each table where it left it.
    assert run_audit(spark, fused).as_dict()["verdict"] == "clean"
    with pytest.raises(checkpoints.CheckpointError, match="checkpoints switch layered"):
        run_available_now(spark, config, ("silver",))

    # Lost, the fused checkpoint says nothing of its last batch: its start refuses, its reset rebuilds.
    lakehouse_files.remove(Lakehouse(config.lakehouse_root).checkpoint("fused"))
    produce("fused-3")
    with pytest.raises(checkpoints.CheckpointError, match="checkpoints reset fused"):
        run_available_now(spark, fused)
    reset_fused(spark, fused)
    run_available_now(spark, fused)
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)

    assert "silver starts at bronze version" in switch_mode(spark, config, Mode.LAYERED)
    produce("layered-2")
    run_available_now(spark, config)
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)


@pytest.mark.faults
def test_a_bronze_commit_landing_while_the_switch_to_fused_checks_never_leaves_records_out_of_silver(
    spark, config, monkeypatch
):
    """A bronze process that stood still past its lease after its last check wakes while `checkpoints switch
    fused` looks for rows silver and gold never read, and makes its one late commit: its batch's records,
    tagged with bronze's stream id. The fused stream reads Kafka after the offsets bronze holds, so a commit
    that lands after the look and before the fence holds records silver never gets. Fenced first, the late
    commit is skipped and the fused stream reads those records from Kafka: each reaches silver once."""
    ledger = committed_ledger(config, 30, seed=71)
    run_available_now(spark, config)
    lakehouse = Lakehouse(config.lakehouse_root)
    bronze_path = lakehouse.table(BRONZE)
    # The late batch's rows, as bronze writes them: read by a bronze stream of a lakehouse of its own.
    late_config = config.model_copy(update={"lakehouse_root": f"{config.lakehouse_root}-late"})
    produce_numbered(client_config(config), config.kafka.topics[0], "late", 20, 72, ledger, duration_s=0)
    run_available_now(spark, late_config, ("bronze",))
    bronze_id = checkpoints.read_stream_id(spark, lakehouse.checkpoint("bronze"), "bronze")
    next_batch = checkpoints.last_committed_batch(spark, lakehouse.checkpoint("bronze")) + 1
    landed: list[bool] = []
    first_unread_rows = pipeline_streams._first_unread_rows

    def late_commit_during_the_look(session, house, stream):
        found = first_unread_rows(session, house, stream)
        if not landed:
            held = session.read.format("delta").load(bronze_path).select("topic", "partition", "offset")
            late = (
                session.read.format("delta")
                .load(Lakehouse(late_config.lakehouse_root).table(BRONZE))
                .join(held, ["topic", "partition", "offset"], "left_anti")
            )
            assert late.count() == 20
            before = latest_snapshot(session, bronze_path).version()
            append_idempotent(late, bronze_path, bronze_id, next_batch)
            landed.append(latest_snapshot(session, bronze_path).version() > before)
        return found

    monkeypatch.setattr(pipeline_streams, "_first_unread_rows", late_commit_during_the_look)
    switch_mode(spark, config, Mode.FUSED)
    monkeypatch.undo()
    assert landed == [False], "the late bronze commit landed: the switch checked before it fenced"
    run_available_now(spark, config.model_copy(update={"mode": Mode.FUSED}))
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)


@pytest.mark.faults
def test_a_fused_start_while_a_layered_start_checks_the_mode_on_an_empty_lakehouse_is_refused(
    spark, config, monkeypatch
):
    """Two starts of different modes on an empty lakehouse: without the other mode's leases held while a
    start checks the mode and makes its checkpoint, both find no checkpoint of the other mode, both make
    their own, and the lakehouse is carried on by two modes reading Kafka from two positions."""
    ledger = committed_ledger(config, 20, seed=73)
    lakehouse = Lakehouse(config.lakehouse_root)
    prepare = checkpoints.prepare
    fused_runs: list[subprocess.CompletedProcess] = []

    def fused_start_while_bronze_checks(session, house, stream):
        if stream.name == "bronze" and not fused_runs:
            fused_runs.append(pipeline("run", "--available-now", env=pipeline_env(config, PIPELINE_MODE="fused")))
        return prepare(session, house, stream)

    monkeypatch.setattr(checkpoints, "prepare", fused_start_while_bronze_checks)
    run_available_now(spark, config, ("bronze",))
    monkeypatch.undo()
    refused = fused_runs[0]
    assert refused.returncode == ExitCode.REFUSED, refused.stderr[-3000:]
    # Refused by the fused stream's own lease, which the bronze start holds while it checks.
    assert f"fused: another process runs this stream: lease {lakehouse.checkpoint('fused')}.leases/" in refused.stderr
    assert f"held by pid {os.getpid()} on host" in refused.stderr, refused.stderr[-3000:]
    assert pipeline_streams.streams_holding_the_lakehouse(spark, lakehouse, Mode.FUSED) == []
    run_available_now(spark, config)
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(1)


def bronze_rows(spark, config) -> int:
    try:
        rows = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(BRONZE)).count()
    except AnalysisException:  # not created yet
        rows = 0
    print(f"bronze rows: {rows}", flush=True)
    return rows


def caught_up(spark, config, ledger: Ledger) -> bool:
    try:
        return not any(oracle(spark, config, ledger).values())
    except AnalysisException:  # a table not created yet
        return False


def start_pipeline(env: dict, log: Path) -> subprocess.Popen:
    # A file, not a pipe: nobody reads a pipe while the pipeline runs, and a full
    # pipe buffer (executor-loss stack traces fill 64 KB fast) blocks its logging.
    with log.open("w") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", "run", "--layer", "all"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def stop_pipeline(running: subprocess.Popen, log: Path) -> None:
    running.send_signal(signal.SIGTERM)
    running.wait(timeout=180)
    assert running.returncode == 0, log.read_text()[-5000:]


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: R, S, T (stopped), Z..."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.faults
@pytest.mark.storage
def test_a_gold_writer_frozen_past_its_lease_wakes_and_writes_nothing_more(spark, config, tmp_path):
    """A gold process stopped (SIGSTOP) inside a batch, before its MERGE, for longer than its lease;
    meanwhile another process runs gold (taking the lease over and writing that batch), then gold is
    reset (rebuilt from silver with a new stream id) and run again. Woken, the frozen process must not
    add its batch to gold: after the reset that would count the batch twice."""
    # The frozen process's lease only is short, so that it expires soon; this process's runs keep the
    # default, or a renewal late by three seconds on a busy machine would stop them.
    lease_env = {"PIPELINE_LEASE_TTL": "4 seconds"}
    in_process = {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
    }
    ledger = committed_ledger(config, 40, seed=41)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in in_process.items():
            patch.setenv(name, value)
        assert main(["run", "--layer", "all", "--available-now"]) == 0
        produce_numbered(client_config(config), config.kafka.topics[0], "r42", 20, 42, ledger, duration_s=0)
        for layer in ("bronze", "silver"):  # what gold's batch 1 will read
            assert main(["run", "--layer", layer, "--available-now"]) == 0

        log = tmp_path / "frozen.log"
        frozen_at = "gold:before_sink_commit:1:freeze"
        with log.open("w") as output:
            frozen = subprocess.Popen(
                [sys.executable, "-m", "{{ cookiecutter.package_name }}", "run", "--layer", "gold", "--available-now"],
                env=pipeline_env(config, **lease_env, **{CRASH_POINT_VAR: frozen_at}),
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(lambda: frozen.poll() is None and process_state(frozen.pid) == "T", 240, "the frozen gold batch")
            time.sleep(5)  # past the lease's time to live: the stream is free for another process
            assert main(["run", "--layer", "gold", "--available-now"]) == 0
            assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)
            assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
            assert main(["run", "--layer", "gold", "--available-now"]) == 0
            assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
            frozen.wait(timeout=180)
        output = log.read_text()
        assert f"crash point {frozen_at.removesuffix(':freeze')}: the driver goes on" in output, output[-5000:]
        assert "writes nothing more for gold" in output, output[-5000:]
        assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)
        # The stream goes on exactly from whatever the woken process left behind.
        produce_numbered(client_config(config), config.kafka.topics[0], "r43", 10, 43, ledger, duration_s=0)
        assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)


@pytest.mark.faults
@pytest.mark.storage
@pytest.mark.parametrize(
    ("command", "stopped"),
    [
        (["run", "--layer", "all", "--available-now"], "stopped: bronze: this process lost lease"),
        (["run", "--layer", "bronze"], "stream bronze failed: bronze: this process lost lease"),
    ],
    ids=["available-now", "continuous"],
)
def test_a_run_whose_lease_is_taken_away_stops_with_exit_1_and_its_way_out_is_exact(
    spark, config, monkeypatch, capsys, command, stopped
):
    """Bronze's lease file is deleted while a batch runs (as another process's takeover would replace
    it): the heartbeat finds it gone and stops the query, and the batch's last check refuses to let
    Spark log it as done. However the stream ends (a query stopped mid-job ends as if it had finished,
    which a loaded CI machine once showed), `run` must exit 1 naming the lost lease and the command,
    neither a traceback nor, with `--available-now`, 0 with silver and gold run as if bronze had read
    everything; and the command it names finishes the work exactly."""
    ledger = committed_ledger(config, 40, seed=56)
    lakehouse = Lakehouse(config.lakehouse_root)
    for name, value in {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        # Renewed every 2 s: the heartbeat finds the lease gone well within the batch's pause.
        "PIPELINE_LEASE_TTL": "12 seconds",
        CRASH_POINT_VAR: "bronze:after_sink_commit:0:pause=12",
    }.items():
        monkeypatch.setenv(name, value)

    def take_the_lease_away() -> None:
        wait_for(lambda: bronze_rows(spark, config) == 40, 120, "bronze's batch 0 committed")
        directory = lease.lease_directory(lakehouse, "bronze")
        for name in files.list_names(spark, directory):
            files.delete(spark, f"{directory}/{name}")

    taker = threading.Thread(target=take_the_lease_away, daemon=True)
    taker.start()
    code = main(command)
    taker.join(timeout=10)
    stderr = capsys.readouterr().err
    assert code == ExitCode.FAILED, stderr[-5000:]
    assert stopped in stderr, stderr[-5000:]
    assert "`run --layer bronze`" in stderr, stderr[-5000:]
    if "all" in command:
        assert spark.read.format("delta").load(lakehouse.table(SILVER)).count() == 0  # silver never started

    monkeypatch.delenv(CRASH_POINT_VAR)
    # A query stopped from another thread leaves the session's active queries a moment after it reports
    # itself inactive; a process that exits, as `run` does, never meets that.
    wait_for(lambda: not spark.streams.active, 30, "the stopped query to leave the session")
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    keys = [bytes(row.key).decode() for row in spark.read.format("delta").load(lakehouse.table(BRONZE)).collect()]
    assert sorted(keys) == sorted(ledger.committed)  # every committed record, once


# --- random kills ---------------------------------------------------------------------------


@pytest.mark.faults
@pytest.mark.storage
def test_chaos_run_with_five_random_kills_reports_zero_anomalies(spark, config, tmp_path, schema_registry):
    # Every egress this project has, on, each with a sink of the run only (a private PostgreSQL).
    environ = {"KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers}
    packaged = configure(load_config("local", environ=environ), environ)
    with ExitStack() as servers:
        run_config = private_servers(config.model_copy(update={"egress": packaged.egress}), tmp_path, servers)
        report = run_chaos(run_config, kills=5, seed=7, records=1000, logs=tmp_path / "pipeline-logs")

    print(report.table())
    # Kills that found the pipeline running and ended it by SIGKILL, counted by the runner: most of
    # them after a finished batch (the seed's schedule has three), some while it started (two).
    # `chaos --kills 5 --seed 7` runs the same schedule; `chaos --kills 100` is the long run.
    assert report.kills == 5
    assert 0 < report.kills_while_starting < report.kills / 2
    # At least one kill landed inside a batch, which the next run replayed.
    assert report.batches_replayed > 0
    assert report.records_committed > 0 and report.records_aborted > 0
    # Each egress's sink was checked against the ledger too.
    assert {f"{stream}_windows_wrong" for stream in installed_names()} <= set(report.anomalies)
    # The project's second dataset, where it has one, ran in the same driver, judged by its own oracle.
    if len(DATASETS) > 1:
        assert report.second_committed > 0 and report.second_aborted > 0
        assert f"{DATASETS[1].name}_gold" in report.anomalies
    assert report.clean, report.table()


# --- a nemesis: faults combined -----------------------------------------------------------


# On a local disk: on S3 the same schedule takes about twice as long (`nemesis` runs on either).
@pytest.mark.faults
def test_a_nemesis_schedule_of_combined_faults_ends_exact_and_the_audit_agrees(
    spark, config, tmp_path, undocumented_in_lakehouse, schema_registry
):
    # A broker of the test's own, so that the schedule can restart it.
    broker = LocalKafka(tmp_path / "own-broker")
    kafka = config.kafka.model_copy(update={"bootstrap_servers": broker.start()})
    with ExitStack() as servers:
        servers.callback(broker.stop, timeout=5)
        run_config = private_servers(config.model_copy(update={"kafka": kafka}), tmp_path, servers)
        report = run_nemesis(
            run_config,
            logs=tmp_path / "logs",
            actions=NEMESIS_ACTIONS,
            seed=NEMESIS_SEED,
            broker=broker,
            schedule_file=tmp_path / "schedule.json",
        )

    print(report.table())
    assert report.clean, report.table()
    # Whatever the faults and their ways out left in the lakehouse, docs/configuration.md names it.
    assert undocumented_in_lakehouse(run_config.lakehouse_root) == []
    # What it took is saved, to be played again: every action but the final drain.
    assert Schedule.load(tmp_path / "schedule.json").names() == [step.action for step in report.steps[:-1]]
    # The seed's schedule mixes the kinds of fault, and at least one refusal was predicted and met.
    kinds = {
        "freeze",
        "lose",
        "snapshot",
        "rollback",
        "foreign",
        "compact",
        "retention",
        "broker",
        "subscribe",
        "reconfigure",
    }
    assert kinds <= set(report.actions()), report.actions()
    # The broker restarted under a continuous run of every stream, which carried on through it.
    assert any(step.detail == "broker restarted while a run wrote: it carried on" for step in report.steps)
    assert sum(report.refusals.values()) >= 1, report.table()
    assert report.oracle_checks >= 1 and report.records_committed > 0 and report.records_aborted > 0
    # The project's second dataset, where it has one, ran beside the first, judged by its own oracle.
    if len(DATASETS) > 1:
        assert report.second_committed > 0, report.table()
    # Silver's and gold's sinks took both their ways under the faults: appends of new records (new
    # windows), MERGEs of overlaps (windows gold holds).
    assert report.silver_sink_commits["append"] >= 1 and report.silver_sink_commits["MERGE"] >= 1, report.table()
    assert report.gold_sink_commits["append"] >= 1 and report.gold_sink_commits["MERGE"] >= 1, report.table()


# Interpreted, as the suite's other processes: the fused stream's compiled batches are proven exact under
# a crash by tests/test_fused.py, and `nemesis --compiled` plays a schedule compiled.
@pytest.mark.faults
def test_a_nemesis_schedule_in_the_fused_mode_ends_exact_and_the_audit_agrees(
    spark, config, tmp_path, undocumented_in_lakehouse, schema_registry
):
    fused = config.model_copy(update={"mode": Mode.FUSED})
    with ExitStack() as servers:
        run_config = private_servers(fused, tmp_path, servers)
        schedule_file = tmp_path / "schedule.json"
        report = run_nemesis(
            run_config, logs=tmp_path / "logs", actions=FUSED_ACTIONS, seed=FUSED_SEED, schedule_file=schedule_file
        )

    print(report.table())
    assert report.clean, report.table()
    assert undocumented_in_lakehouse(run_config.lakehouse_root) == []
    # A replay of it plays fused whatever PIPELINE_MODE says where it is played.
    assert Schedule.load(schedule_file).mode is Mode.FUSED
    kinds = {"kill", "crash", "partition", "foreign", "rollback", "lose"}
    assert kinds <= set(report.actions()), report.actions()
    assert sum(report.refusals.values()) >= 1, report.table()
    # Every table was written by the fused stream alone: its silver commits are appends.
    assert report.silver_sink_commits["append"] >= 1, report.table()
    assert report.gold_sink_commits["append"] + report.gold_sink_commits["MERGE"] >= 1, report.table()


# A schedule recorded, then played again shortened: the replay is the run judged. The suite's seeds draw
# no crash of the second dataset, so its quarantine replay is played here too, before the one drain.
@pytest.mark.faults
def test_a_saved_schedule_plays_again_with_its_draws_and_a_killed_quarantine_replay_moves_nothing(
    spark, config, tmp_path, schema_registry
):
    recorded = run_nemesis(
        config.model_copy(update={"lakehouse_root": f"{config.lakehouse_root}/recorded"}),
        logs=tmp_path / "recorded-logs",
        actions=4,
        seed=REPLAY_SEED,
        schedule_file=tmp_path / "schedule.json",
        judged=False,
    )
    schedule = Schedule.load(tmp_path / "schedule.json")
    assert schedule.names() == ["produce", "produce", "produce", "partition"]
    assert [step.action for step in recorded.steps] == schedule.names()  # no drain: recorded, not judged

    # As a shrink tries it: the second transaction taken out, the others keep what they drew.
    shortened = schedule.without([schedule.actions[0], *schedule.actions[2:]])
    with ExitStack() as servers:
        replay_config = config.model_copy(update={"lakehouse_root": f"{config.lakehouse_root}/replayed"})
        run_config = private_servers(replay_config, tmp_path, servers)
        (tmp_path / "replayed-logs").mkdir()
        nemesis = Nemesis(run_config, shortened.seed, tmp_path / "replayed-logs")
        try:
            replayed = nemesis.play(replay=shortened, judged=False)
            if len(DATASETS) > 1:
                for _ in range(3):
                    nemesis.produce(committed=True, second=True)
                quarantine_replayed = nemesis.replay_quarantine()
            drained = nemesis.drain()
        finally:
            nemesis.producer.flush(10)
            del nemesis.producer

    # Each action did what it did the first time: the same count, fate, lateness and keys of each
    # transaction (its details say so), with a seed that is not drawn again.
    assert [step.detail for step in replayed.steps] == [recorded.steps[index].detail for index in (0, 2, 3)]
    assert replayed.steps[0].draws == recorded.steps[0].draws
    if len(DATASETS) > 1:
        # Killed at a crash point of the replay, then run whole: the records it judged all stay.
        pattern = r"_replay:after_\w+_commit:0 killed, then whole: \w+: replay 0 judged [1-9]"
        assert re.search(pattern, quarantine_replayed), quarantine_replayed
        assert " 0 moved to " in quarantine_replayed, quarantine_replayed
    assert drained == "oracle clean, audit clean", nemesis.report.table()
    assert nemesis.report.clean, nemesis.report.table()


# --- a standalone cluster, with an executor killed -------------------------------------------


@pytest.mark.cluster
def test_standalone_cluster_run_survives_an_executor_killed_mid_run(spark, config, tmp_path):
    cluster = StandaloneCluster(tmp_path / "spark-cluster")
    master = cluster.start()
    try:
        env = pipeline_env(
            config,
            SPARK_MASTER=master,
            SPARK_LOCAL_IP="127.0.0.1",
            PIPELINE_TRIGGER_INTERVAL="1 second",
            KAFKA_MAX_OFFSETS_PER_TRIGGER="50",
        )
        log = tmp_path / "pipeline.log"
        running = start_pipeline(env, log)
        try:
            first = committed_ledger(config, 300, seed=51)
            # Small batches every second: tasks are in flight most of the time.
            wait_for(lambda: bronze_rows(spark, config) >= 100, 300, "batches on the cluster")
            killed = cluster.kill_executor()
            assert killed is not None, "no executor was running"
            second = committed_ledger(config, 100, seed=52)
            ledger = Ledger({**first.committed, **second.committed}, first.aborted | second.aborted)
            wait_for(lambda: caught_up(spark, config, ledger), 400, "every committed record in every layer")
            # The worker replaced the executor; the driver never restarted.
            assert cluster.executor_pids() and killed not in cluster.executor_pids()
            assert running.poll() is None
        finally:
            stop_pipeline(running, log)
    finally:
        cluster.stop()
    assert not any(oracle(spark, config, ledger).values()), oracle(spark, config, ledger)
