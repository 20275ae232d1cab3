"""Checkpoints against their tables and their operators, through the command line.

Each scenario does to a real lakehouse what an operator or a crash does (an older
checkpoint put back, a table RESTOREd, a metadata file cut short, a second
process started), checks the refusal names what it found and the way out, then
takes that way out and checks the tables against what was produced.
"""

import io
import json
import os
import pty
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.devtools.kafka_local import LocalKafka, partitions_with_leaders
from {{ cookiecutter.package_name }}.devtools.sample import produce, sample_records
from {{ cookiecutter.package_name }}.pipeline.bronze import FIRST_OFFSETS, resume_offsets
from {{ cookiecutter.package_name }}.pipeline.config import duration_seconds
from {{ cookiecutter.package_name }}.pipeline.delta import files
from {{ cookiecutter.package_name }}.pipeline.delta.tables import (
    BRONZE,
    GOLD,
    QUARANTINE,
    SILVER,
    STREAMS,
    Lakehouse,
    ensure_tables,
    set_properties,
)
from {{ cookiecutter.package_name }}.pipeline.kafka import retention
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config, topic_partitions
from {{ cookiecutter.package_name }}.pipeline.kafka.identity import SourceGuard, recorded_compacted, recorded_sources
from {{ cookiecutter.package_name }}.pipeline.kafka.retention import needed_offsets
from {{ cookiecutter.package_name }}.pipeline.recovery import checkpoints, lease
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import CRASH_POINT_VAR
from {{ cookiecutter.package_name }}.pipeline.streams import start_stream


def produce_records(config, count: int, seed: int) -> list:
    records = list(sample_records(count, seed, 0.0, prefix=f"c{seed}"))
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=50)
    return records


def checkpoint(config, stream: str) -> Path:
    return Path(Lakehouse(config.lakehouse_root).checkpoint(stream))


def newest(directory: Path) -> int:
    return max(int(name.name) for name in directory.iterdir() if name.name.isdigit())


def refused_run(capsys, layer: str = "all") -> str:
    """Run ``layer`` (every layer by default) through the command line, expect the refusal (exit 3) and
    return its text."""
    capsys.readouterr()
    assert main(["run", "--layer", layer, "--available-now"]) == 3
    return capsys.readouterr().err


def load(spark, config, name: str):
    return spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(name))


def test_an_empty_or_truncated_metadata_file_is_a_checkpoint_error_naming_it(spark, tmp_path):
    metadata = tmp_path / "checkpoints" / "silver" / "metadata"
    metadata.parent.mkdir(parents=True)
    for broken in ("", '{"id":"3f1c', "[]"):
        metadata.write_text(broken)
        with pytest.raises(checkpoints.CheckpointError) as refused:
            checkpoints.read_stream_id(spark, str(metadata.parent), "silver")
        assert f"the checkpoint metadata file {metadata} is" in str(refused.value)
        assert "checkpoints reset silver" in str(refused.value)


@pytest.mark.slow
def test_a_cut_metadata_file_refuses_the_start_without_a_traceback_and_reset_gets_out(spark, pipeline_env, capsys):
    produce_records(pipeline_env, 10, seed=1)
    metadata = checkpoint(pipeline_env, "bronze") / "metadata"
    metadata.parent.mkdir(parents=True)
    metadata.write_text('{"id":"3f1c')  # the first start died while writing it

    assert main(["run", "--layer", "bronze", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"the checkpoint metadata file {metadata} is not a stream id" in refusal
    assert "checkpoints reset bronze" in refusal
    assert "Traceback" not in refusal

    assert main(["checkpoints", "reset", "bronze", "--yes"]) == 0
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    assert load(spark, pipeline_env, BRONZE).count() == 10


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["bronze", "gold"])
def test_a_reset_before_the_first_run_makes_the_tables_and_the_first_run_reads_everything(spark, pipeline_env, stream):
    records = produce_records(pipeline_env, 12, seed=3)

    # An operator's reset on a lakehouse no stream has written to yet (it rebuilt tables that did not exist).
    assert main(["checkpoints", "reset", stream, "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    assert load(spark, pipeline_env, BRONZE).count() == len(records)
    parsed = load(spark, pipeline_env, SILVER).count()
    assert parsed + load(spark, pipeline_env, QUARANTINE).count() == len(records)
    assert parsed == len(records)
    assert_gold_is_computed_from(spark, pipeline_env, records)


def test_reset_without_a_terminal_refuses_without_yes_and_on_a_terminal_asks(tmp_path, capsys, monkeypatch):
    root = tmp_path / "lake"
    (root / "checkpoints" / "gold").mkdir(parents=True)
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(root))
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # as under cron or CI, whatever runs pytest

    assert main(["checkpoints", "reset", "gold"]) == 3
    refusal = capsys.readouterr().err
    assert "--yes" in refusal and str(root / "checkpoints" / "gold") in refusal
    assert (root / "checkpoints" / "gold").is_dir()

    # On a terminal it asks; anything but "yes" leaves everything as it was.
    controller, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "checkpoints", "reset", "silver"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        env={**os.environ, "LAKEHOUSE_ROOT": str(root)},
    )
    os.close(terminal)
    seen = b""
    deadline = time.monotonic() + 60
    while b"Type 'yes'" not in seen and time.monotonic() < deadline:
        seen += os.read(controller, 4096)
    assert b"Reset silver, gold?" in seen, seen
    os.write(controller, b"no\n")
    assert child.wait(timeout=60) == 1
    os.close(controller)
    assert (root / "checkpoints" / "gold").is_dir()


def test_a_start_killed_while_writing_its_first_offsets_is_resumed_by_the_next_start(spark, pipeline_env):
    config = pipeline_env
    lakehouse = Lakehouse(config.lakehouse_root)
    # What a first start killed while Spark wrote offsets/0 leaves: the checkpoint bound to the tables,
    # and Spark's temporary file, never renamed into place. Spark refuses to plan batch 0 into an
    # offset log that is not empty (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY), at every start.
    ensure_tables(spark, lakehouse)
    checkpoints.prepare(spark, lakehouse, STREAMS["bronze"])
    offsets = checkpoint(config, "bronze") / "offsets"
    offsets.mkdir()
    (offsets / ".0.0cffbc7b-c744-44de-a3ac-04da7b308cd4.tmp").write_bytes(b"")
    records = produce_records(config, 30, seed=61)

    assert main(["run", "--layer", "bronze", "--available-now"]) == 0

    assert [name.name for name in offsets.iterdir() if name.name.endswith(".tmp")] == []
    bronze = spark.read.format("delta").load(lakehouse.table(BRONZE))
    assert sorted(bytes(row.value) for row in bronze.select("value").collect()) == sorted(v for _, v in records)


def foreign_lease(path: Path, renewed_ms: int, ttl_s: float = 3.0) -> None:
    """What a process on another machine leaves when it dies: nothing here can see its pid."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "owner": "other",
        "stream": "silver",
        "host": "another-host",
        "pid": 4242,
        "started": "2024-05-01T09:00:00+0000",
        "renewed_ms": renewed_ms,
        "ttl_s": ttl_s,
    }
    path.write_text(json.dumps(record))


def test_a_live_lease_is_respected_and_an_expired_one_taken_over(spark, tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    first = Path(lease.lease_path(lakehouse, "silver", 1))
    foreign_lease(first, renewed_ms=int(time.time() * 1000))
    assert lease.read_lease(spark, lakehouse, "silver")[0] is lease.LeaseStatus.HELD
    with pytest.raises(lease.LeaseHeld, match="held by pid 4242 on host another-host"):
        lease.acquire(spark, lakehouse, "silver")

    time.sleep(3.5)
    assert lease.read_lease(spark, lakehouse, "silver")[0] is lease.LeaseStatus.EXPIRED
    taken = lease.acquire(spark, lakehouse, "silver")
    # The next generation, created exclusively; the expired one is gone.
    second = Path(lease.lease_path(lakehouse, "silver", 2))
    record = json.loads(second.read_text())
    assert (record["host"], record["pid"]) == (socket.gethostname(), os.getpid())
    assert not first.exists()
    taken.release()
    assert not second.exists()


def test_a_contender_whose_look_at_an_expired_lease_went_stale_cannot_take_it_from_the_winner(
    spark, tmp_path, monkeypatch, contend_with_a_stale_look
):
    # One process playing both contenders: the loser's look is a stale view (what it saw just before
    # the winner took the lease), as a second process racing the first would have it.
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    foreign_lease(Path(lease.lease_path(lakehouse, "silver", 1)), renewed_ms=int(time.time() * 1000) - 10_000)
    directory = lease.lease_directory(lakehouse, "silver")
    # A contender that looked at the lease (generation 1, expired) just before this process took it.
    stale_view = lease._current(spark, directory)
    winner = lease.acquire(spark, lakehouse, "silver")
    assert winner.generation == 2
    lease._HELD.pop(directory)  # from here on, this process plays the other contender
    contend_with_a_stale_look(stale_view)

    with pytest.raises(lease.LeaseHeld, match="took the lease .* at the same moment"):
        lease.acquire(spark, lakehouse, "silver")
    monkeypatch.undo()
    assert json.loads(Path(winner.path).read_text())["owner"] == winner.record.owner
    winner.check()  # the winner still holds it
    winner.release()


def test_a_lease_record_cut_short_is_held_by_its_age_and_names_no_process_to_kill(spark, tmp_path):
    # A holder killed while it wrote its record (on a local disk the file is there before its text).
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    cut_short = Path(lease.lease_path(lakehouse, "silver", 1))
    cut_short.parent.mkdir(parents=True)
    cut_short.write_text('{"owner": "0b1')

    with pytest.raises(lease.LeaseHeld) as refused:
        lease.acquire(spark, lakehouse, "silver")
    assert "held by a process whose record cannot be read" in str(refused.value)
    assert "kill -TERM -1" not in str(refused.value), "kill -1 signals every process the user may signal"
    assert "kill -TERM <pid>" in str(refused.value)


def test_a_directory_or_file_deleted_between_look_and_read_reads_as_absent(spark, tmp_path):
    # Another process releases a lease (deletes its file and directory) while this one reads them:
    # Hadoop's exists() says yes, then listing or opening raises FileNotFoundException.
    directory = tmp_path / "bronze.leases"
    path = str(directory)
    stop = threading.Event()

    def release_and_take_again() -> None:
        while not stop.is_set():
            directory.mkdir(exist_ok=True)
            (directory / "0000000001").write_text("{}")
            shutil.rmtree(directory, ignore_errors=True)

    deleter = threading.Thread(target=release_and_take_again, daemon=True)
    deleter.start()
    fs, jvm_path = files.filesystem(spark, path)
    raced, deadline = 0, time.monotonic() + 60
    try:
        while raced < 3 and time.monotonic() < deadline:
            # A plain look-then-read: proves the window is hit in this run.
            try:
                if fs.exists(jvm_path):
                    fs.listStatus(jvm_path)
            except Exception as error:  # noqa: BLE001 - Py4JJavaError wrapping what Hadoop raised
                # Gone before the listing began, or while it ran (Java's File.list() answers null,
                # which Hadoop reports as denied access or an invalid directory).
                gone = ("FileNotFoundException", "AccessDeniedException", "Invalid directory")
                assert any(words in str(error) for words in gone), error
                raced += 1
            assert files.list_names(spark, path) in ([], ["0000000001"])
            assert files.read_text(spark, f"{path}/0000000001") in (None, "", "{}")
    finally:
        stop.set()
        deleter.join()
    assert raced >= 3, "the deletions never landed between a look and a read: nothing was tested"


def test_a_stream_restarted_while_its_last_run_still_releases_the_lease_waits_and_takes_it(
    spark, tmp_path, monkeypatch
):
    # The heartbeat thread releases the lease of a query that ended while the main thread starts
    # the stream again (an available-now run after another): the restart must not find the file
    # of its own previous run and refuse the stream as held by this very process.
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    previous = lease.acquire(spark, lakehouse, "gold")
    deleting, go_on = threading.Event(), threading.Event()
    delete = files.delete

    def slow_delete(session, path):
        deleting.set()
        go_on.wait(10)
        return delete(session, path)

    monkeypatch.setattr(files, "delete", slow_delete)
    releasing = threading.Thread(target=previous.release, daemon=True)
    releasing.start()
    assert deleting.wait(10)
    release = previous.release
    restart_waits = threading.Event()

    def restart_reaches_the_release_under_way(*args, **kwargs):
        # Synchronised on the event itself: the restart found its previous run's lease while that
        # lease's delete had not landed (it waits on go_on); only now may the delete go on.
        assert previous._lock.locked() and not go_on.is_set(), "the release was no longer under way"
        restart_waits.set()
        go_on.set()
        return release(*args, **kwargs)

    monkeypatch.setattr(previous, "release", restart_reaches_the_release_under_way)

    restarted = lease.acquire(spark, lakehouse, "gold")
    assert restart_waits.is_set(), "the restart never met the release under way: nothing was tested"
    releasing.join(10)
    assert lease.read_lease(spark, lakehouse, "gold") == (lease.LeaseStatus.HELD, restarted.record)
    restarted.release()
    assert lease.read_lease(spark, lakehouse, "gold") == (lease.LeaseStatus.FREE, None)


def test_a_holder_not_renewed_for_three_quarters_of_its_lease_may_write_nothing(spark, tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    held = lease.acquire(spark, lakehouse, "gold", ttl_s=2.0)  # no heartbeat: as if the process stood still
    lease.check_held(lakehouse, "gold")

    time.sleep(1.6)  # more than 2 s less a quarter, measured on this process's monotonic clock
    with pytest.raises(lease.LeaseLost, match=r"gold: this process lost lease .* \(pipeline.lease_ttl 2 s"):
        lease.check_held(lakehouse, "gold")
    assert not held.renew()  # too late to renew: another process may already have taken the stream
    held.release()


def test_a_renewal_that_fails_does_not_count_and_the_query_is_stopped_in_time(spark, tmp_path, monkeypatch):
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    held = lease.acquire(spark, lakehouse, "bronze", ttl_s=4.0)
    stopped, stopped_after = threading.Event(), []
    began = time.monotonic()

    def unreachable_storage(*args, **kwargs):
        raise OSError("storage unreachable")

    def stop_the_query() -> None:
        stopped_after.append(time.monotonic() - began)
        stopped.set()

    monkeypatch.setattr(lease, "_write", unreachable_storage)
    held.heartbeat(on_lost=stop_the_query)
    assert stopped.wait(10) and held.lost.is_set()
    assert stopped_after[0] < 4.0, stopped_after  # before another process may take over
    with pytest.raises(lease.LeaseLost):
        lease.check_held(lakehouse, "bronze")
    monkeypatch.undo()
    held.release()


def test_a_stream_stopped_inside_a_long_batch_keeps_its_lease_until_the_batch_has_ended(
    spark, config, monkeypatch, capsys
):
    """A SIGTERM during a long batch (a rolling restart) stops the query: Spark reports it inactive at
    once while its batch goes on, up to Spark's commit-log entry. For as long as that batch runs, the
    lease stays held, so no other process or reset takes the stream; once released, no write of this
    process for the stream passes its check."""
    produce_records(config, 20, seed=61)
    lakehouse = Lakehouse(config.lakehouse_root)
    monkeypatch.setenv(CRASH_POINT_VAR, "bronze:after_sink_commit:0:pause=6")
    capsys.readouterr()
    query = start_stream(spark, config, "bronze", available_now=False)
    stopping = threading.Thread(target=query.stop, daemon=True)
    try:
        deadline = time.monotonic() + 180
        while "crash point bronze:after_sink_commit:0: pausing" not in capsys.readouterr().err:
            assert time.monotonic() < deadline and query.isActive, "bronze's batch 0 never reached its pause"
            time.sleep(0.2)
        stopping.start()
        while query.isActive:
            time.sleep(0.05)
        inactive_at, looks = time.monotonic(), 0
        while stopping.is_alive():  # the batch still runs: its thread has not ended
            assert lease.read_lease(spark, lakehouse, "bronze")[0] is lease.LeaseStatus.HELD, (
                f"lease let go {time.monotonic() - inactive_at:.1f} s after the stop, while the batch still ran"
            )
            looks += 1
            time.sleep(0.2)
        assert looks >= 5 and time.monotonic() - inactive_at > 4 * lease.WATCH_INTERVAL_S, "nothing was tested"
    finally:
        query.stop()
    deadline = time.monotonic() + 10
    while lease.read_lease(spark, lakehouse, "bronze")[0] is not lease.LeaseStatus.FREE:
        assert time.monotonic() < deadline, "the lease was not released after the batch ended"
        time.sleep(0.2)
    with pytest.raises(lease.LeaseLost, match="bronze: this process released lease .* writes nothing more"):
        lease.check_held(lakehouse, "bronze")
    again = lease.acquire(spark, lakehouse, "bronze")  # taken again, the stream may write once more
    lease.check_held(lakehouse, "bronze")
    again.release()


def test_a_holder_in_another_pid_namespace_or_boot_is_judged_by_age_not_by_its_pid(spark, tmp_path):
    """Two containers sharing the host's network share its host name, not their pids: a pid that names
    no process here may be a live holder there. Only a holder of this very system (host, boot id and
    PID namespace) is judged dead by its pid; a record that names neither a boot id nor a PID namespace
    is judged by host and pid."""
    lakehouse = Lakehouse(str(tmp_path / "lake"))
    host, pid_namespace = socket.gethostname(), os.readlink("/proc/self/ns/pid")
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that names no process here
    path = Path(lease.lease_path(lakehouse, "silver", 1))
    path.parent.mkdir(parents=True)

    def holder(**fields) -> dict:
        record = {"owner": "other", "stream": "silver", "host": host, "pid": dead.pid, "started": "?"}
        return {**record, "renewed_ms": int(time.time() * 1000), "ttl_s": 60.0, **fields}

    for other in ({"pid_namespace": "pid:[1]", "boot_id": boot_id}, {"pid_namespace": pid_namespace, "boot_id": "0"}):
        path.write_text(json.dumps(holder(**other)))
        assert lease.read_lease(spark, lakehouse, "silver")[0] is lease.LeaseStatus.HELD, other
        with pytest.raises(lease.LeaseHeld, match=f"held by pid {dead.pid} on host {host}"):
            lease.acquire(spark, lakehouse, "silver")
    for this_system in ({}, {"pid_namespace": pid_namespace, "boot_id": boot_id}):  # {}: a record naming neither
        path.write_text(json.dumps(holder(**this_system)))
        assert lease.read_lease(spark, lakehouse, "silver")[0] is lease.LeaseStatus.HOLDER_DEAD, this_system

    taken = lease.acquire(spark, lakehouse, "silver")
    record = json.loads(Path(taken.path).read_text())
    assert (record["host"], record["boot_id"], record["pid_namespace"]) == (host, boot_id, pid_namespace)
    taken.release()


def test_a_holders_lease_age_runs_on_a_clock_that_counts_a_suspend():
    """CLOCK_MONOTONIC stands still while the system is suspended or its VM paused; a holder measuring
    on it would, woken after an hour, take its last renewal for seconds old and write. Here the boot
    clock runs an hour ahead of the monotonic one, as after an hour suspended (a time namespace)."""
    measure = (
        "import time; from {{ cookiecutter.package_name }}.pipeline.recovery import lease; "
        "print(lease.clock() - time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME) - lease.clock())"
    )
    namespace = ["unshare", "--user", "--map-root-user", "--time", "--boottime", "3600", "--fork"]
    measured = subprocess.run([*namespace, sys.executable, "-c", measure], capture_output=True, text=True, timeout=120)
    assert measured.returncode == 0, measured.stderr[-3000:]
    ahead, behind_boot = (float(value) for value in measured.stdout.split())
    assert 3599 < ahead < 3601 and abs(behind_boot) < 1, measured.stdout


def test_txn_retention_on_a_sink_is_refused_naming_the_property_and_the_command(spark, pipeline_env, capsys):
    assert main(["run", "--layer", "gold", "--available-now"]) == 0
    gold = Lakehouse(pipeline_env.lakehouse_root).table(GOLD)
    spark.sql(
        f"ALTER TABLE delta.`{gold}` SET TBLPROPERTIES ('delta.setTransactionRetentionDuration' = 'interval 1 days')"
    )
    capsys.readouterr()

    assert main(["run", "--layer", "gold", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    command = f"ALTER TABLE delta.`{gold}` UNSET TBLPROPERTIES ('delta.setTransactionRetentionDuration')"
    assert command in refusal

    spark.sql(command)
    assert main(["run", "--layer", "gold", "--available-now"]) == 0


@pytest.mark.slow
@pytest.mark.storage
def test_an_older_checkpoint_put_back_is_refused_until_reset_which_is_exact(
    spark, pipeline_env, capsys, monkeypatch, tmp_path, lakehouse_files
):
    monkeypatch.setenv("KAFKA_MAX_OFFSETS_PER_TRIGGER", "20")
    first = produce_records(pipeline_env, 60, seed=2)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    bronze_checkpoint = Lakehouse(pipeline_env.lakehouse_root).checkpoint("bronze")
    old_copy = tmp_path / "bronze-checkpoint-backup"  # on this disk, wherever the lakehouse is
    lakehouse_files.copy(bronze_checkpoint, old_copy)
    old_batch = lakehouse_files.newest_batch(old_copy / "commits")

    second = produce_records(pipeline_env, 40, seed=3)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    new_batch = lakehouse_files.newest_batch(f"{bronze_checkpoint}/commits")
    assert new_batch > old_batch
    lakehouse_files.remove(bronze_checkpoint)
    lakehouse_files.copy(old_copy, bronze_checkpoint)
    capsys.readouterr()

    assert main(["run", "--layer", "all", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"has committed batch {new_batch} of stream" in refusal
    assert f"last planned batch {old_batch}, last committed batch {old_batch}" in refusal
    assert "checkpoints reset bronze" in refusal
    assert main(["checkpoints", "list"]) == 0
    assert "bronze  table ahead" in capsys.readouterr().out

    assert main(["checkpoints", "reset", "bronze", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    capsys.readouterr()
    assert main(["checkpoints", "list"]) == 0
    assert "refuses" not in capsys.readouterr().out
    assert main(["audit"]) == 0

    bronze = load(spark, pipeline_env, BRONZE)
    assert bronze.count() == bronze.select("topic", "partition", "offset").distinct().count() == 100
    assert {bytes(row.value) for row in bronze.select("value").collect()} == {value for _, value in first + second}


@pytest.mark.slow
def test_gold_restored_to_an_older_version_is_refused_until_reset_which_is_exact(spark, pipeline_env, capsys):
    records = produce_records(pipeline_env, 50, seed=4)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    gold_path = Lakehouse(pipeline_env.lakehouse_root).table(GOLD)
    before = DeltaTable.forPath(spark, gold_path).history(1).first()["version"]
    records += produce_records(pipeline_env, 30, seed=5)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    spark.sql(f"RESTORE TABLE delta.`{gold_path}` TO VERSION AS OF {before}")
    capsys.readouterr()

    assert main(["run", "--layer", "gold", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"sink table {GOLD} at {gold_path} was restored" in refusal
    assert f"to version {before}" in refusal
    assert "checkpoints reset gold" in refusal

    assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
    assert main(["run", "--layer", "gold", "--available-now"]) == 0
    assert main(["audit"]) == 0
    assert_gold_is_computed_from(spark, pipeline_env, records)


@pytest.mark.slow
def test_silver_put_back_from_an_older_copy_is_refused_even_once_written_again_until_reset_which_is_exact(
    spark, pipeline_env, capsys, tmp_path
):
    # Silver and quarantine are left alone by a batch with nothing for them: their Delta txn cannot
    # tell an older copy from a table the last batches did not touch; the versions recorded can.
    records = produce_records(pipeline_env, 40, seed=6)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    lakehouse = Lakehouse(pipeline_env.lakehouse_root)
    silver_path = Path(lakehouse.table(SILVER))
    old_copy = tmp_path / "silver-backup"
    shutil.copytree(silver_path, old_copy)
    shutil.copytree(lakehouse.table(QUARANTINE), tmp_path / "quarantine-backup")
    shutil.copytree(checkpoint(pipeline_env, "silver"), tmp_path / "silver-checkpoint-backup")
    records += produce_records(pipeline_env, 30, seed=7)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    last_batch = newest(checkpoint(pipeline_env, "silver") / "commits")
    shutil.rmtree(silver_path)
    shutil.copytree(old_copy, silver_path)

    refusal = refused_run(capsys)
    assert f"sink table {SILVER} at {silver_path} is at version" in refusal
    assert f"after batch {last_batch}, the last checkpoint" in refusal
    assert "checkpoints reset silver" in refusal
    # Gold, started alone, has read silver past the version the copy is at, and names the same way out.
    refusal = refused_run(capsys, "gold")
    assert f"gold: the stream has read {SILVER} at {silver_path} up to version" in refusal
    assert "was put back from an older copy or replaced" in refusal and "checkpoints reset silver" in refusal

    # Silver's checkpoint and quarantine put back too: silver resumes from the copies and writes, with
    # more records, the versions gold has read once more. Gold would go on after rows it never read.
    put_back = {"quarantine": lakehouse.table(QUARANTINE), "silver-checkpoint": checkpoint(pipeline_env, "silver")}
    for name, path in put_back.items():
        shutil.rmtree(path)
        shutil.copytree(tmp_path / f"{name}-backup", path)
    time.sleep(checkpoints.REWRITE_TOLERANCE_MS / 1000)
    records += produce_records(pipeline_env, 10, seed=11)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    assert main(["run", "--layer", "silver", "--available-now"]) == 0
    refusal = refused_run(capsys, "gold")
    assert f"gold: the stream has read {SILVER} at {silver_path} up to version" in refusal
    assert "was committed at" in refusal and "after the stream read it" in refusal
    assert "checkpoints reset silver" in refusal

    assert main(["checkpoints", "reset", "silver", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert main(["audit"]) == 0
    events = [json.loads(value) for _, value in records]
    assert {row.event_id for row in load(spark, pipeline_env, SILVER).select("event_id").collect()} == {
        event["event_id"] for event in events
    }
    assert_gold_is_computed_from(spark, pipeline_env, records)


@pytest.mark.slow
def test_a_source_restored_under_the_stream_reading_it_is_refused_until_its_writer_is_reset_which_is_exact(
    spark, pipeline_env, capsys
):
    # Silver RESTOREd, then gold started alone: Spark's Delta source stops on the commit that removes rows
    # (DELTA_SOURCE_IGNORE_DELETE). The start refuses first and names silver's reset; bronze under silver alike.
    lakehouse = Lakehouse(pipeline_env.lakehouse_root)
    records = produce_records(pipeline_env, 40, seed=8)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    bronze_before = DeltaTable.forPath(spark, lakehouse.table(BRONZE)).history(1).first()["version"]
    silver_before = DeltaTable.forPath(spark, lakehouse.table(SILVER)).history(1).first()["version"]
    records += produce_records(pipeline_env, 30, seed=9)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    spark.sql(f"RESTORE TABLE delta.`{lakehouse.table(SILVER)}` TO VERSION AS OF {silver_before}").collect()

    refusal = refused_run(capsys, "gold")
    assert f"gold: {SILVER} at {lakehouse.table(SILVER)} has a commit that removes rows (version" in refusal
    assert "RESTORE)" in refusal and "checkpoints reset silver" in refusal
    assert main(["checkpoints", "list"]) == 0
    assert "gold    source rewritten" in capsys.readouterr().out
    assert main(["checkpoints", "reset", "silver", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    spark.sql(f"RESTORE TABLE delta.`{lakehouse.table(BRONZE)}` TO VERSION AS OF {bronze_before}").collect()
    records += produce_records(pipeline_env, 10, seed=10)
    refusal = refused_run(capsys, "silver")
    assert f"silver: {BRONZE} at {lakehouse.table(BRONZE)} has a commit that removes rows" in refusal
    assert "checkpoints reset bronze" in refusal
    # The way out: bronze reads again what the RESTORE took from it, silver and gold are rebuilt.
    assert main(["checkpoints", "reset", "bronze", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert main(["audit"]) == 0
    events = [json.loads(value) for _, value in records]
    assert sorted(row.event_id for row in load(spark, pipeline_env, SILVER).select("event_id").collect()) == sorted(
        event["event_id"] for event in events
    )
    assert_gold_is_computed_from(spark, pipeline_env, records)


@pytest.mark.slow
def test_a_second_process_is_refused_while_the_first_runs_and_starts_once_it_is_killed(spark, pipeline_env, capsys):
    produce_records(pipeline_env, 20, seed=6)
    lease_file = Path(lease.lease_path(Lakehouse(pipeline_env.lakehouse_root), "bronze", 1))
    log_path = Path(pipeline_env.lakehouse_root).parent / "first.log"
    with log_path.open("w") as log_file:
        first = subprocess.Popen(
            [sys.executable, "-m", "{{ cookiecutter.package_name }}", "run", "--layer", "bronze"],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 240
        while not (checkpoint(pipeline_env, "bronze") / "commits" / "0").exists():
            assert first.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first process never committed a batch"
            time.sleep(1)
        assert json.loads(lease_file.read_text())["pid"] == first.pid

        assert main(["run", "--layer", "bronze", "--available-now"]) == 3
        refusal = capsys.readouterr().err
        assert f"lease {lease_file} is held by pid {first.pid} on host {socket.gethostname()}" in refusal
        assert main(["checkpoints", "reset", "bronze", "--yes"]) == 3
        assert "refusing to reset bronze, silver, gold" in capsys.readouterr().err
        assert (checkpoint(pipeline_env, "bronze") / "commits" / "0").exists()
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, no clean-up
        first.wait()

    produce_records(pipeline_env, 5, seed=7)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    assert load(spark, pipeline_env, BRONZE).count() == 25


def windows_of(records: list, window_s: int) -> dict[tuple, tuple[int, Decimal]]:
    """Gold computed in plain Python from what was produced: (window start, event type) -> (count, amount)."""
    totals: dict[tuple, tuple[int, Decimal]] = {}
    for _, value in records:
        event = json.loads(value)
        epoch = int(datetime.fromisoformat(event["event_time"].replace("Z", "+00:00")).timestamp())
        key = (epoch - epoch % window_s, event["event_type"])
        count, amount = totals.get(key, (0, Decimal("0")))
        totals[key] = (count + 1, amount + Decimal(str(event["amount"])))
    return totals


def gold_windows(spark, path: str, version: int | None = None) -> dict[tuple, tuple[int, Decimal]]:
    reader = spark.read.format("delta")
    table = (reader if version is None else reader.option("versionAsOf", version)).load(path)
    rows = table.select(F.col("window_start").cast("long").alias("start"), "event_type", "event_count", "amount_sum")
    return {(row.start, row.event_type): (row.event_count, row.amount_sum) for row in rows.collect()}


def assert_gold_is_computed_from(spark, config, records: list) -> None:
    """Gold, window for window, as computed in plain Python from ``records`` (what was produced): the
    audit recomputes gold with the pipeline's own aggregation, so it cannot catch a fault of it."""
    window_s = duration_seconds(config.gold_window, "pipeline.gold_window")
    assert gold_windows(spark, Lakehouse(config.lakehouse_root).table(GOLD)) == windows_of(records, window_s)


@pytest.mark.slow
def test_a_changed_gold_window_is_refused_until_reset_rebuilds_gold_at_it_without_an_empty_moment(
    spark, pipeline_env, capsys, monkeypatch, tmp_path
):
    old_window = pipeline_env.gold_window
    new_window = "15 minutes" if old_window != "15 minutes" else "30 minutes"
    records = produce_records(pipeline_env, 80, seed=6)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    gold_path = Lakehouse(pipeline_env.lakehouse_root).table(GOLD)
    before = DeltaTable.forPath(spark, gold_path).history(1).first()["version"]
    old_gold = gold_windows(spark, gold_path)
    assert old_gold == windows_of(records, duration_seconds(old_window, "old"))

    packaged = resources.files("{{ cookiecutter.package_name }}").joinpath("conf", "local.toml").read_text()
    changed = re.sub(r'(?m)^gold_window = ".*"$', f'gold_window = "{new_window}"', packaged)
    assert changed != packaged
    (tmp_path / "changed.toml").write_text(changed)
    monkeypatch.setenv("PIPELINE_CONFIG", str(tmp_path / "changed.toml"))
    capsys.readouterr()

    assert main(["run", "--layer", "gold", "--available-now"]) == 3
    refusal = capsys.readouterr().err
    assert f"holds windows of {old_window!r}, but pipeline.gold_window is {new_window!r}" in refusal
    assert "checkpoints reset gold" in refusal
    assert DeltaTable.forPath(spark, gold_path).history(1).first()["version"] == before
    assert main(["checkpoints", "list"]) == 0
    assert f"refuses to start: gold: the table {gold_path} holds windows of {old_window!r}" in capsys.readouterr().out

    assert main(["checkpoints", "reset", "gold", "--yes"]) == 0
    new_gold = windows_of(records, duration_seconds(new_window, "new"))
    after = DeltaTable.forPath(spark, gold_path).history(1).first()["version"]
    # What a reader of gold could see during the reset: the old gold whole, then the new one whole.
    seen = [gold_windows(spark, gold_path, version) for version in range(before, after + 1)]
    assert all(each in (old_gold, new_gold) for each in seen), [len(each) for each in seen]
    assert seen[-1] == new_gold and old_gold != new_gold

    # Gold's new stream goes on after the silver version it was rebuilt from: nothing twice, nothing lost.
    records += produce_records(pipeline_env, 40, seed=7)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert gold_windows(spark, gold_path) == windows_of(records, duration_seconds(new_window, "new"))
    assert main(["audit"]) == 0


def bronze_keys(spark, config) -> set[tuple[str, int, int]]:
    """The coordinates bronze holds, each held once: a set alone would hide a record written twice."""
    rows = [tuple(row) for row in load(spark, config, BRONZE).select("topic", "partition", "offset").collect()]
    assert len(rows) == len(set(rows)), "bronze holds a record more than once"
    return set(rows)


@pytest.mark.slow
def test_a_topic_added_late_or_removed_is_refused_until_bronze_alone_is_reset_which_is_exact(
    spark, pipeline_env, capsys, monkeypatch, kafka_oracle
):
    first = pipeline_env.kafka.topics[0]
    produce_records(pipeline_env, 30, seed=8)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    # A second topic whose first records retention has already deleted.
    second = f"{first}-late"
    admin = AdminClient(client_config(pipeline_env))
    admin.create_topics([NewTopic(second, num_partitions=1, replication_factor=1)])[second].result(timeout=30)
    produce(client_config(pipeline_env), second, list(sample_records(20, 9, 0.0, prefix="c9")), transaction_size=50)
    for future in admin.delete_records([TopicPartition(second, 0, 6)]).values():
        future.result(timeout=30)
    silver_commits = newest(checkpoint(pipeline_env, "silver") / "commits")
    gold_commits = newest(checkpoint(pipeline_env, "gold") / "commits")

    monkeypatch.setenv("KAFKA_TOPICS", f"{first},{second}")
    refusal = refused_run(capsys)
    assert f"{second}[0] starts at offset 6" in refusal
    assert "checkpoints reset bronze --only" in refusal
    assert main(["checkpoints", "reset", "bronze", "--only", "--yes"]) == 0
    # Silver and gold were left as they are: they go on from their own checkpoints.
    assert newest(checkpoint(pipeline_env, "silver") / "commits") == silver_commits
    assert newest(checkpoint(pipeline_env, "gold") / "commits") == gold_commits
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    assert bronze_keys(spark, pipeline_env) == set(kafka_oracle(pipeline_env, [first, second]))

    # The first topic leaves the subscription: what bronze has of it stays, nothing newer comes in.
    kept = kafka_oracle(pipeline_env, [first])
    produce_records(pipeline_env, 5, seed=10)
    produce(client_config(pipeline_env), second, list(sample_records(7, 11, 0.0, prefix="c11")), transaction_size=50)
    monkeypatch.setenv("KAFKA_TOPICS", second)
    refusal = refused_run(capsys)
    assert f"removed from kafka.topics: {first}" in refusal and "checkpoints reset bronze --only" in refusal
    assert main(["checkpoints", "reset", "bronze", "--only", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    expected = {**kept, **kafka_oracle(pipeline_env, [second])}
    assert bronze_keys(spark, pipeline_env) == set(expected) and len(expected) == 30 + 14 + 7
    silver = load(spark, pipeline_env, SILVER).select("topic", "partition", "offset").collect()
    assert sorted(tuple(row) for row in silver) == sorted(expected)
    assert_gold_is_computed_from(spark, pipeline_env, [(None, value) for value in expected.values()])
    assert main(["audit"]) == 0


def recreate_topic(config, topic: str, partitions: int = 2) -> None:
    """Delete ``topic`` and create it again under the same name (Kafka gives it a new topic id).

    Returns once the broker answers with the new id: the controller has the new topic before the
    broker's metadata does, and until then the broker still describes the old one.
    """
    admin = AdminClient(client_config(config))
    old_id = topic_id(admin, topic)
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:
        try:
            admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
            break
        except Exception:  # noqa: BLE001 - the deletion is still being completed; retried until the deadline
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    while topic_id(admin, topic) in (None, old_id):
        assert time.monotonic() < deadline, f"the broker still describes {topic} with its old id {old_id}"
        time.sleep(0.2)


def topic_id(admin: AdminClient, topic: str) -> str | None:
    """Kafka's id of ``topic`` as the broker describes it now; None while it has none."""
    try:
        return str(admin.describe_topics(TopicCollection([topic]), request_timeout=30)[topic].result().topic_id)
    except KafkaException:
        return None


def test_a_topic_created_again_under_bronze_is_refused_at_the_next_batch_and_at_a_resuming_start(spark, config):
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    topic = config.kafka.topics[0]
    guard = SourceGuard.at_start(spark, config, lakehouse, resuming=False)
    old_id = guard.topic_ids()[topic]

    recreate_topic(config, topic)

    for check in (guard.topic_ids, lambda: SourceGuard.at_start(spark, config, lakehouse, resuming=True)):
        with pytest.raises(checkpoints.CheckpointError) as refused:
            check()
        assert f"topic {topic} was deleted and created again (topic id {old_id} recorded on bronze, " in str(
            refused.value
        )
        assert "checkpoints reset bronze --only" in str(refused.value)
    # A new checkpoint (the way out) reads the new topic: its id is recorded.
    new_id = SourceGuard.at_start(spark, config, lakehouse, resuming=False).topic_ids()[topic]
    assert new_id != old_id
    assert recorded_sources(spark, lakehouse).topic_ids == {topic: new_id}


def test_a_topic_made_compacted_under_bronze_is_refused_at_the_next_batch_and_at_a_start_until_it_is_declared(
    spark, config, cleanup_policy
):
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    topic = config.kafka.topics[0]
    guard = SourceGuard.at_start(spark, config, lakehouse, resuming=False)
    guard.topic_ids()

    # From now on Kafka may remove a record before bronze reads it, and Spark's source skips the gap.
    cleanup_policy(config, topic, "compact")

    for check in (guard.topic_ids, lambda: SourceGuard.at_start(spark, config, lakehouse, resuming=True)):
        with pytest.raises(checkpoints.CheckpointError) as refused:
            check()
        message = str(refused.value)
        assert f"bronze: {topic}: cleanup.policy compacts, and kafka.compacted_topics [] does not name it" in message
        assert f"--entity-name {topic} --add-config cleanup.policy=delete" in message
        assert "KAFKA_COMPACTED_TOPICS" in message
    # Both ways out: a changelog by design, named in the config, is read; or the policy set back.
    declared = config.model_copy(update={"kafka": config.kafka.model_copy(update={"compacted_topics": (topic,)})})
    assert topic in SourceGuard.at_start(spark, declared, lakehouse, resuming=True).topic_ids()
    cleanup_policy(config, topic, "delete")
    assert topic in guard.topic_ids()
    # Recorded when found, so that the audit accounts for what the cleaner removed meanwhile.
    assert recorded_compacted(spark, lakehouse) == {topic}
    # Bronze put back to its first version (a restore from an older copy does the same): the record is not
    # bronze's, so it stays, and the audit does not blame bronze for every record the cleaner removed.
    spark.sql(f"RESTORE TABLE delta.`{lakehouse.table(BRONZE)}` TO VERSION AS OF 0").collect()
    assert recorded_compacted(spark, lakehouse) == {topic}


def test_a_broker_lost_while_bronze_asks_for_its_topic_ids_is_asked_again_once_it_is_back(spark, config, kafka_broker):
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    guard = SourceGuard.at_start(spark, config, lakehouse, resuming=False)
    topic_ids = guard.topic_ids()  # the admin client is connected from here on
    pid = kafka_broker.status()["pid"]
    try:
        # The broker stands still: its kernel takes the next request, the broker never answers it. Then it
        # dies with the request unanswered (a crash or a restart in the middle of a batch's check).
        os.kill(pid, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            asked = pool.submit(guard.topic_ids)
            time.sleep(3)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while kafka_broker.status() is not None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not asked.done(), f"the check gave up while the broker was down: {asked.exception()!r}"
            kafka_broker.start()
            assert asked.result(timeout=120) == topic_ids
    finally:
        if kafka_broker.status() is not None and kafka_broker.status()["pid"] == pid:
            os.kill(pid, signal.SIGKILL)
        kafka_broker.start()


@pytest.mark.slow
def test_a_topic_deleted_and_created_again_is_refused_until_bronze_alone_is_reset_then_old_and_new_records_stay(
    spark, pipeline_env, capsys
):
    topic = pipeline_env.kafka.topics[0]
    old = produce_records(pipeline_env, 30, seed=12)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    recreate_topic(pipeline_env, topic)
    # More records than before: offsets the checkpoint holds exist again, naming other records.
    new = produce_records(pipeline_env, 40, seed=13)

    refusal = refused_run(capsys)
    assert f"topic {topic} was deleted and created again" in refusal
    assert "checkpoints reset bronze --only" in refusal
    assert main(["checkpoints", "reset", "bronze", "--only", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    # The oracle is what was produced: every event of both incarnations once, none lost to a reused offset.
    silver = load(spark, pipeline_env, SILVER).select("event_id", "topic_id", "partition", "offset").collect()
    produced = [json.loads(value)["event_id"] for _, value in old + new]
    assert sorted(row.event_id for row in silver) == sorted(produced)
    reused = {(row.partition, row.offset) for row in silver if row.event_id.startswith("c12")} & {
        (row.partition, row.offset) for row in silver if row.event_id.startswith("c13")
    }
    assert reused, "the new topic's offsets never met the old ones: the scenario did not happen"
    assert_gold_is_computed_from(spark, pipeline_env, old + new)
    assert main(["audit"]) == 0


def partition_ends(config, topic: str) -> dict[int, int]:
    """{partition: the offset Kafka will give its next record}, read by a plain consumer."""
    consumer = Consumer(client_config(config, **{"group.id": f"ends-{time.monotonic_ns()}"}))
    try:
        partitions = partitions_with_leaders(consumer, topic)
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in partitions}
    finally:
        consumer.close()


def delete_records_below(config, topic: str, ends: dict[int, int]) -> None:
    """What retention does, on request: Kafka deletes every record of each partition below ``ends``."""
    admin = AdminClient(client_config(config))
    wanted = [TopicPartition(topic, partition, offset) for partition, offset in ends.items()]
    for future in admin.delete_records(wanted).values():
        future.result(timeout=30)


@pytest.mark.slow
def test_in_the_fused_mode_a_changed_subscription_and_lost_records_each_name_a_way_out_that_is_exact(
    spark, pipeline_env, capsys, monkeypatch, kafka_oracle
):
    monkeypatch.setenv("PIPELINE_MODE", "fused")
    first = pipeline_env.kafka.topics[0]
    read = produce_records(pipeline_env, 30, seed=21)
    assert main(["run", "--available-now"]) == 0

    # Records Kafka deleted before the fused stream read them: refused, accepted, audited as lost.
    before = partition_ends(pipeline_env, first)
    produce_records(pipeline_env, 20, seed=22)
    deleted = partition_ends(pipeline_env, first)
    delete_records_below(pipeline_env, first, deleted)
    later = produce_records(pipeline_env, 10, seed=23)
    refusal = refused_run(capsys)
    assert "Kafka no longer holds the records bronze needs next: " in refusal and "checkpoints accept-loss" in refusal
    assert main(["checkpoints", "accept-loss", "--yes"]) == 0
    assert "fused resumes after them" in capsys.readouterr().out
    assert main(["run", "--available-now"]) == 0

    # A second topic, added above its first offset: the fused stream alone starts anew, silver and gold stay.
    second = f"{first}-late"
    admin = AdminClient(client_config(pipeline_env))
    admin.create_topics([NewTopic(second, num_partitions=1, replication_factor=1)])[second].result(timeout=30)
    added = list(sample_records(20, 24, 0.0, prefix="c24"))
    produce(client_config(pipeline_env), second, added, transaction_size=50)
    delete_records_below(pipeline_env, second, {0: 6})
    monkeypatch.setenv("KAFKA_TOPICS", f"{first},{second}")
    refusal = refused_run(capsys)
    assert f"{second}[0] starts at offset 6" in refusal and "checkpoints reset fused --only" in refusal
    assert main(["checkpoints", "reset", "fused", "--only", "--yes"]) == 0
    assert "silver and gold stay as they are" in capsys.readouterr().out
    assert main(["run", "--available-now"]) == 0

    # Kafka has deleted what the first topic's bronze rows began with: the added topic is judged against it.
    held = {key for key in bronze_keys(spark, pipeline_env) if key[0] == second}
    assert held == set(kafka_oracle(pipeline_env, [second]))
    produced = [json.loads(value)["event_id"] for _, value in read + later + added[6:]]
    silver = load(spark, pipeline_env, SILVER).select("event_id").collect()
    assert sorted(row.event_id for row in silver) == sorted(produced)
    assert_gold_is_computed_from(spark, pipeline_env, read + later + added[6:])
    lost = sum(deleted[p] - before.get(p, 0) for p in deleted)
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["datasets"]["events"]
    assert report["warnings"]["kafka_offsets_deleted_before_bronze_read_them_accepted_as_lost"] == lost


def test_only_real_offsets_are_needed_earliest_and_latest_name_none():
    assert needed_offsets('{"events": {"0": 120, "1": -2, "2": -1}, "clicks": {"0": 0}}') == {
        ("events", 0): 120,
        ("clicks", 0): 0,
    }
    assert needed_offsets(None) == {}
    # A partition added after the offsets were written: Spark reads it from 0.
    assert needed_offsets('{"events": {"0": 120, "1": -2}}', {"events": [0, 1, 2], "clicks": [0]}) == {
        ("events", 0): 120,
        ("events", 2): 0,
    }


def test_records_accepted_as_lost_stay_recorded_when_bronze_is_put_back_and_count_each_offset_once(spark, config):
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    topic = config.kafka.topics[0]
    # A topic id as the Kafka client prints it, in base64 with "/" and "+": a "/" in a record's name would
    # make a directory of it, and the gap would never be found again.
    topic_id = "S/PAF5N3RHG9zDpjZ8Cy+Q"
    first = retention.Gap(topic, topic_id, 0, 100, 150)
    assert retention.record(spark, lakehouse, [first], retention.ACCEPTED_BY_COMMAND) == [first]
    # Another process found the same partition's gap later, when Kafka had deleted more: only the rest is new.
    later = retention.Gap(topic, topic_id, 0, 120, 180)
    other = retention.Gap(topic, topic_id, 1, 0, 5)
    new = retention.record(spark, lakehouse, [later, other], retention.ACCEPTED_BY_SETTING)
    assert new == [retention.Gap(topic, topic_id, 0, 150, 180), other]
    assert retention.record(spark, lakehouse, [first, later, other], retention.ACCEPTED_BY_COMMAND) == []
    # Bronze put back to its first version (a restore from an older copy does the same): bronze would be
    # refused again for a gap already accepted, and the audit would report fewer offsets than Kafka deleted.
    set_properties(spark, lakehouse.table(BRONZE), {"lakehouse.test.touched": "1"})
    spark.sql(f"RESTORE TABLE delta.`{lakehouse.table(BRONZE)}` TO VERSION AS OF 0").collect()
    assert retention.accepted_ends(spark, lakehouse) == {(topic, topic_id, 0): 180, (topic, topic_id, 1): 5}
    assert retention.lost_offsets(spark, lakehouse) == 80 + 5
    assert [gap["accepted_by"] for gap in retention.recorded(spark, lakehouse)] == [
        retention.ACCEPTED_BY_COMMAND,
        retention.ACCEPTED_BY_SETTING,
        retention.ACCEPTED_BY_SETTING,
    ]


def test_a_lost_checkpoint_resumes_a_partition_bronze_holds_nothing_of_where_bronze_began(spark, config):
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    topic = config.kafka.topics[0]
    ids = SourceGuard.at_start(spark, config, lakehouse, resuming=False).topic_ids()
    # Bronze's first checkpoint began at offset 7 of partition 0 (a start at "latest"), and read nothing yet.
    began = [{"topic": topic, "topic_id": ids[topic], "partition": 0, "offset": 7}]
    set_properties(spark, lakehouse.table(BRONZE), {FIRST_OFFSETS: json.dumps(began)})

    resumed = json.loads(resume_offsets(spark, config, lakehouse, ids))

    # Not from Kafka's first record: what came before offset 7 was never bronze's. The other partitions,
    # which bronze's first checkpoint did not read, were added after it began: Spark reads those from 0.
    assert resumed == {topic: {str(p): 7 if p == 0 else 0 for p in topic_partitions(config)[topic]}}


@pytest.mark.storage
def test_a_bronze_start_refused_after_making_its_checkpoint_goes_on_after_the_rows_bronze_holds(
    spark, pipeline_env, capsys, cleanup_policy
):
    topic = pipeline_env.kafka.topics[0]
    first = produce_records(pipeline_env, 30, seed=21)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0
    lakehouse = Lakehouse(pipeline_env.lakehouse_root)
    files.delete(spark, lakehouse.checkpoint("bronze"), recursive=True)
    # The start after the loss makes a checkpoint, then refuses (a compacted topic, whose way out, the
    # policy set back, keeps that checkpoint): the next start finds a checkpoint that planned nothing.
    cleanup_policy(pipeline_env, topic, "compact")
    assert "cleanup.policy compacts" in refused_run(capsys, "bronze")
    cleanup_policy(pipeline_env, topic, "delete")
    later = produce_records(pipeline_env, 10, seed=22)
    assert main(["run", "--layer", "bronze", "--available-now"]) == 0

    # The oracle is what was produced: each record once in bronze, not read again from Kafka's first offset.
    bronze = load(spark, pipeline_env, BRONZE)
    assert bronze.groupBy("topic", "partition", "offset").count().where("count > 1").count() == 0
    produced = [json.loads(value)["event_id"] for _, value in first + later]
    held = [json.loads(row.value)["event_id"] for row in bronze.select("value").collect()]
    assert sorted(held) == sorted(produced)


@pytest.mark.slow
def test_records_kafka_deleted_before_bronze_read_them_are_refused_until_accepted_then_audited_as_lost(
    spark, pipeline_env, capsys, monkeypatch
):
    topic = pipeline_env.kafka.topics[0]
    read = produce_records(pipeline_env, 30, seed=16)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    before = partition_ends(pipeline_env, topic)
    # A partition added meanwhile, which bronze's checkpoint has never seen: Spark reads it from 0.
    admin = AdminClient(client_config(pipeline_env))
    admin.create_partitions([NewPartitions(topic, len(before) + 1)])[topic].result(30)
    added = len(before)
    produce_records(pipeline_env, 20, seed=17)
    # Retention deletes them (and, below them, what bronze read) before bronze runs again.
    deleted = partition_ends(pipeline_env, topic)
    delete_records_below(pipeline_env, topic, deleted)
    later = produce_records(pipeline_env, 10, seed=18)
    gaps = {p: (before.get(p, 0), deleted[p]) for p in deleted if deleted[p] > before.get(p, 0)}
    assert added in gaps and len(gaps) > 1, f"the scenario did not happen: gaps {gaps}"

    refusal = refused_run(capsys)
    assert "Kafka no longer holds the records bronze needs next: " in refusal
    for partition, (start, end) in gaps.items():
        assert f"{topic}[{partition}] offsets {start}-{end - 1} ({end - start})" in refusal
    assert "checkpoints accept-loss" in refusal
    assert main(["checkpoints", "accept-loss"]) == 3, "not a terminal: accepting a loss needs --yes"
    assert "without confirmation" in capsys.readouterr().err
    assert main(["checkpoints", "accept-loss", "--yes"]) == 0
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    # The oracle is what was produced: what bronze read before the deletion and what came after it, once each.
    produced = [json.loads(value)["event_id"] for _, value in read + later]
    silver = load(spark, pipeline_env, SILVER).select("event_id").collect()
    assert sorted(row.event_id for row in silver) == sorted(produced)
    assert_gold_is_computed_from(spark, pipeline_env, read + later)
    lost = sum(end - start for start, end in gaps.values())
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["datasets"]["events"]
    assert report["warnings"]["kafka_offsets_deleted_before_bronze_read_them_accepted_as_lost"] == lost
    assert main(["checkpoints", "accept-loss", "--yes"]) == 0
    assert "nothing to accept" in capsys.readouterr().out

    # With kafka.fail_on_data_loss off, Spark skips them by itself: bronze records them, never silently.
    monkeypatch.setenv("KAFKA_FAIL_ON_DATA_LOSS", "false")
    start = partition_ends(pipeline_env, topic)
    produce_records(pipeline_env, 20, seed=19)
    end = partition_ends(pipeline_env, topic)
    delete_records_below(pipeline_env, topic, end)
    last = produce_records(pipeline_env, 5, seed=20)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    produced += [json.loads(value)["event_id"] for _, value in last]
    silver = load(spark, pipeline_env, SILVER).select("event_id").collect()
    assert sorted(row.event_id for row in silver) == sorted(produced)
    assert_gold_is_computed_from(spark, pipeline_env, read + later + last)
    lost += sum(end[p] - start[p] for p in end)
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["datasets"]["events"]
    assert report["warnings"]["kafka_offsets_deleted_before_bronze_read_them_accepted_as_lost"] == lost


@pytest.mark.slow
def test_copies_appended_to_bronze_fail_the_audit_until_dropped_and_silver_reset_then_each_record_is_held_once(
    spark, pipeline_env, capsys
):
    assert main(["checkpoints", "drop-bronze-copies", "--yes"]) == 0, "no bronze yet: nothing to drop"
    assert "nothing to drop" in capsys.readouterr().out
    first = produce_records(pipeline_env, 40, seed=21)
    assert main(["run", "--layer", "all", "--available-now"]) == 0
    bronze_path = Lakehouse(pipeline_env.lakehouse_root).table(BRONZE)
    # Another application appends three rows bronze holds already.
    copies = load(spark, pipeline_env, BRONZE).orderBy("partition", "offset").limit(3)
    copies.write.format("delta").mode("append").save(bronze_path)
    capsys.readouterr()
    assert main(["audit", "--json"]) == 1
    errors = json.loads(capsys.readouterr().out)["datasets"]["events"]["errors"]
    assert errors["bronze_duplicates"] == 3
    assert errors["silver_duplicates"] == 0, "silver keeps each record once"

    assert main(["checkpoints", "drop-bronze-copies"]) == 3, "not a terminal: dropping needs --yes"
    assert "remove 3 extra rows of 3 records" in capsys.readouterr().err
    assert main(["checkpoints", "drop-bronze-copies", "--yes"]) == 0
    later = produce_records(pipeline_env, 10, seed=22)
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    # The oracle is what was produced, each record once in bronze and in silver.
    produced = sorted(json.loads(value)["event_id"] for _, value in first + later)
    bronze = load(spark, pipeline_env, BRONZE)
    assert sorted(json.loads(row.value)["event_id"] for row in bronze.select("value").collect()) == produced
    silver = load(spark, pipeline_env, SILVER).select("event_id").collect()
    assert sorted(row.event_id for row in silver) == produced
    assert_gold_is_computed_from(spark, pipeline_env, first + later)
    properties = DeltaTable.forPath(spark, bronze_path).detail().first().properties
    assert properties["delta.appendOnly"] == "true"
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["datasets"]["events"]["errors"]["bronze_duplicates"] == 0
    assert main(["checkpoints", "drop-bronze-copies", "--yes"]) == 0
    assert "nothing to drop" in capsys.readouterr().out


@pytest.mark.slow
def test_another_cluster_answering_is_refused_until_bronze_alone_is_reset_then_both_clusters_records_stay(
    spark, pipeline_env, capsys, monkeypatch, tmp_path
):
    topic = pipeline_env.kafka.topics[0]
    old = produce_records(pipeline_env, 30, seed=14)
    assert main(["run", "--layer", "all", "--available-now"]) == 0

    # kafka.bootstrap_servers now reaches another cluster, with a topic of the same name whose offsets
    # start again at 0: the checkpoint's offsets would name other records there, or skip them.
    other = LocalKafka(tmp_path / "other-cluster")
    try:
        kafka = pipeline_env.kafka.model_copy(update={"bootstrap_servers": other.start()})
        moved = pipeline_env.model_copy(update={"kafka": kafka})
        admin = AdminClient(client_config(moved))
        admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(timeout=30)
        new = produce_records(moved, 40, seed=15)
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", moved.kafka.bootstrap_servers)

        refusal = refused_run(capsys)
        assert "another Kafka cluster answers (cluster id " in refusal
        assert "checkpoints reset bronze --only" in refusal
        # Its checkpoint lost as well: bronze must not read the other cluster from its start without a word.
        shutil.rmtree(checkpoint(pipeline_env, "bronze"))
        assert "another Kafka cluster answers (cluster id " in refused_run(capsys)
        assert main(["checkpoints", "reset", "bronze", "--only", "--yes"]) == 0
        assert main(["run", "--layer", "all", "--available-now"]) == 0

        # The oracle is what was produced to each cluster: every event once, the first cluster's kept.
        produced = [json.loads(value)["event_id"] for _, value in old + new]
        silver = load(spark, pipeline_env, SILVER).select("event_id").collect()
        assert sorted(row.event_id for row in silver) == sorted(produced)
        assert_gold_is_computed_from(spark, pipeline_env, old + new)
        assert main(["audit"]) == 0
    finally:
        other.stop()
