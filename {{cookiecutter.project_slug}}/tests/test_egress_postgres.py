"""The PostgreSQL egress on the real broker, Spark, Delta and a real PostgreSQL: the table mirrors gold exactly.

Each test has its own lakehouse and its own target table on one PostgreSQL server for the module.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from delta.tables import DeltaTable
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pyspark import cloudpickle
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.devtools.postgres_local import LocalPostgres
from {{ cookiecutter.package_name }}.devtools.sample import (
    CALENDAR_EDGES,
    calendar_edge_records,
    produce,
    sample_records,
    value_writer,
)
from {{ cookiecutter.package_name }}.pipeline.audit import findings
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, load_section
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import GOLD, QUARANTINE, Lakehouse
from {{ cookiecutter.package_name }}.pipeline.egress import installed as installed_egresses
from {{ cookiecutter.package_name }}.pipeline.egress import target_stream
from {{ cookiecutter.package_name }}.pipeline.egress.postgres import (
    SECTION,
    STREAM,
    PostgresEgress,
    PostgresEgressSettings,
    _connect,
    audit_errors,
    check_connection,
    describe,
    read_back,
    settings,
    start,
)
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery import checkpoints
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import (
    AFTER_PRE_COMMIT,
    AFTER_SINK_COMMIT,
    AFTER_STAGING,
    CRASH_POINT_VAR,
)
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now

EVENT_START = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
KEY, VALUES = list(EVENTS.gold_key), list(EVENTS.gold_values)
TIMESTAMPS = {"window_start", "window_end"}
# One worker runs this file (make test uses two): its PostgreSQL server starts once.
pytestmark = pytest.mark.xdist_group("postgres")


@pytest.fixture(scope="module")
def postgres(tmp_path_factory) -> tuple[str, str]:
    """A real PostgreSQL server for this module: (dsn without password, password)."""
    server = LocalPostgres(tmp_path_factory.mktemp("postgres"))
    dsn = server.start()
    yield dsn, server.password_file.read_text().strip()
    server.stop()


def connect(postgres) -> psycopg.Connection:
    dsn, password = postgres
    return psycopg.connect(dsn, password=password, autocommit=True, connect_timeout=10)


def parse_settings(values: dict, environ: dict) -> PostgresEgressSettings:
    """An ``[egress_postgres]`` table and its environment, parsed as the command line parses them."""
    return load_section(PostgresEgressSettings, values, environ, SECTION)


def with_egress(config, postgres, table: str, **values):
    """``config`` with only this egress on, writing ``table`` on the test server.

    The password is in a file, as production mounts it: the executors that stage rows read it
    there (they run in this process's workers, started before any test could set a variable).
    """
    dsn, password = postgres
    password_file = Path(config.lakehouse_root).parent / "postgres-password"
    password_file.write_text(password)
    password_file.chmod(0o600)
    parsed = parse_settings({"dsn": dsn, "table": table, "password_file": str(password_file), **values}, {})
    return config.model_copy(update={"egress": {STREAM: parsed}})


def produce_events(config, count: int, seed: int, start: datetime = EVENT_START) -> None:
    records = list(sample_records(count, seed, start=start, prefix=f"pg{seed}"))
    produce(client_config(config), config.kafka.topics[0], records, transaction_size=50)


def gold_path(config) -> str:
    return Lakehouse(config.lakehouse_root).table(GOLD)


def gold_mirror(spark, config) -> dict[tuple, tuple]:
    """Gold as the egress must mirror it: key -> (values..., gold version of the row's last change)."""
    as_micros = [F.unix_micros(c).alias(c) if c in TIMESTAMPS else F.col(c) for c in KEY]
    gold = spark.read.format("delta").load(gold_path(config)).select(*as_micros, *VALUES)
    changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    versions = (
        changes.load(gold_path(config))
        .where(F.col("_change_type").isin("insert", "update_postimage"))
        .select(*as_micros, "_commit_version")
        .groupBy(*KEY)
        .agg(F.max("_commit_version").alias("gold_version"))
    )
    # A left join on a key whose dimensions may be null: null-safe equality.
    on = [gold[c].eqNullSafe(versions[c]) for c in KEY]
    rows = gold.join(versions, on, "left").select(*(gold[c] for c in KEY), *VALUES, "gold_version").collect()
    return {tuple(row[: len(KEY)]): tuple(row[len(KEY) :]) for row in rows}


def table_mirror(postgres, table: str) -> dict[tuple, tuple]:
    """The PostgreSQL table, timestamps as exact epoch microseconds."""
    key = ", ".join(f"(extract(epoch FROM {c}) * 1000000)::bigint" if c in TIMESTAMPS else c for c in KEY)
    with connect(postgres) as conn:
        rows = conn.execute(f"SELECT {key}, {', '.join(VALUES)}, gold_version FROM {table}").fetchall()
    return {tuple(row[: len(KEY)]): tuple(row[len(KEY) :]) for row in rows}


def assert_mirrors_gold(spark, config, postgres, table: str) -> dict:
    expected = gold_mirror(spark, config)
    found = table_mirror(postgres, table)
    assert expected and all(values[-1] is not None for values in expected.values())
    assert found == expected
    return found


def markers(postgres, table: str) -> dict[str, int]:
    with connect(postgres) as conn:
        return dict(conn.execute(f"SELECT stream_id, batch_id FROM {table}_egress_batches").fetchall())


def staged_rows(postgres, table: str) -> int:
    with connect(postgres) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}_egress_staging").fetchone()[0]


def row_versions(postgres, table: str) -> list:
    """Each row's xmin and the marker's commit time: any rewrite, even to the same values, changes them."""
    with connect(postgres) as conn:
        rows = conn.execute(f"SELECT xmin::text FROM {table} ORDER BY 1").fetchall()
        return rows + conn.execute(f"SELECT batch_id, committed_at FROM {table}_egress_batches").fetchall()


def egress_checkpoint(config) -> Path:
    return Path(Lakehouse(config.lakehouse_root).checkpoint(STREAM))


def test_the_table_mirrors_gold_row_for_row_and_a_replayed_batch_changes_nothing(spark, config, postgres):
    config = with_egress(config, postgres, "gold_mirror")
    produce_events(config, 300, seed=1)

    run_available_now(spark, config)

    assert_mirrors_gold(spark, config, postgres, "gold_mirror")
    [(stream_id, batch)] = markers(postgres, "gold_mirror").items()
    assert batch == checkpoints.last_committed_batch(spark, str(egress_checkpoint(config)))
    assert describe(config)["marker_table"] == "gold_mirror_egress_batches"
    # What the audit reads: the table through Spark, exact.
    as_micros = [F.unix_micros(c).alias(c) if c in TIMESTAMPS else F.col(c) for c in KEY]
    read = read_back(spark, config).select(*as_micros, *VALUES, "gold_version").collect()
    assert {tuple(row[: len(KEY)]): tuple(row[len(KEY) :]) for row in read} == gold_mirror(spark, config)
    assert audit_errors(spark, config) == {"postgres_egress_markers_of_other_streams": 0}

    # As if the driver died after the database commit, before Spark's commit-log entry: Spark replays the batch.
    before = row_versions(postgres, "gold_mirror")
    (egress_checkpoint(config) / "commits" / str(batch)).unlink()
    (egress_checkpoint(config) / "commits" / f".{batch}.crc").unlink(missing_ok=True)
    run_available_now(spark, config, (STREAM,))
    assert checkpoints.last_committed_batch(spark, str(egress_checkpoint(config))) == batch
    assert row_versions(postgres, "gold_mirror") == before

    # Gold rows deleted, then more events (windows updated and new ones): the next batch carries all three.
    refunds = {key for key in gold_mirror(spark, config) if key[2] == "refund"}
    DeltaTable.forPath(spark, gold_path(config)).delete("event_type = 'refund'")
    produce_events(config, 200, seed=2, start=EVENT_START + timedelta(minutes=5))
    run_available_now(spark, config)

    mirrored = assert_mirrors_gold(spark, config, postgres, "gold_mirror")
    assert refunds - set(mirrored), "the windows before the new events stay deleted"
    assert markers(postgres, "gold_mirror") == {stream_id: batch + 1}

    # A new stream id's first batch (gold's snapshot) replaces whatever the table held.
    with connect(postgres) as conn:
        conn.execute("INSERT INTO gold_mirror VALUES ('2020-01-01 00:00Z', '2020-01-01 00:01Z', 'stale', 1, 1.00, 1)")
    snapshot = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
    assert PostgresEgress(settings(config), "new-stream").apply(snapshot.load(gold_path(config)), 0) > 0
    assert_mirrors_gold(spark, config, postgres, "gold_mirror")
    assert markers(postgres, "gold_mirror") == {"new-stream": 0}


def log_staging(config, postgres, table: str) -> Callable[[], dict[int, int]]:
    """Make the egress's tables, and have PostgreSQL log each row an executor stages (a trigger on the
    staging table): returns a function giving {batch id: rows staged}, however soon they were cleared."""
    PostgresEgress(settings(config), "makes-the-tables")
    with connect(postgres) as conn:
        conn.execute(f"CREATE TABLE {table}_staged_log (batch_id bigint NOT NULL)")
        conn.execute(
            f"CREATE FUNCTION {table}_log_staged() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN INSERT INTO {table}_staged_log VALUES (NEW.batch_id); RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER {table}_log_staged AFTER INSERT OR UPDATE ON {table}_egress_staging "
            f"FOR EACH ROW EXECUTE FUNCTION {table}_log_staged()"
        )

    def staged() -> dict[int, int]:
        with connect(postgres) as conn:
            return dict(conn.execute(f"SELECT batch_id, count(*) FROM {table}_staged_log GROUP BY 1").fetchall())

    return staged


def test_a_batch_above_the_threshold_is_staged_by_the_executors_one_at_it_is_not_and_staging_ends_empty(
    spark, config, postgres
):
    config = with_egress(config, postgres, "gold_staged", stage_above_rows=1)
    staged = log_staging(config, postgres, "gold_staged")
    produce_events(config, 300, seed=3)

    run_available_now(spark, config)

    rows = assert_mirrors_gold(spark, config, postgres, "gold_staged")
    # Gold's snapshot, more rows than the threshold: every row staged once, then cleared.
    assert staged() == {0: len(rows)} and len(rows) > 1
    assert staged_rows(postgres, "gold_staged") == 0

    # A batch of exactly as many rows as the threshold is applied by the driver: nothing staged.
    per_type = {name: sum(1 for key in rows if key[2] == name) for name in ("page_view", "refund")}
    DeltaTable.forPath(spark, gold_path(config)).delete("event_type = 'page_view'")
    at_threshold = with_egress(config, postgres, "gold_staged", stage_above_rows=per_type["page_view"])
    run_available_now(spark, at_threshold, (STREAM,))
    rows = assert_mirrors_gold(spark, config, postgres, "gold_staged")
    assert "page_view" not in {key[2] for key in rows}
    assert staged() == {0: len(rows) + per_type["page_view"]}
    # One row more than the threshold: staged, each row once.
    DeltaTable.forPath(spark, gold_path(config)).delete("event_type = 'refund'")
    above = with_egress(config, postgres, "gold_staged", stage_above_rows=per_type["refund"] - 1)
    run_available_now(spark, above, (STREAM,))
    assert "refund" not in {key[2] for key in assert_mirrors_gold(spark, config, postgres, "gold_staged")}
    assert staged() == {0: len(rows) + per_type["page_view"], 2: per_type["refund"]}
    assert staged_rows(postgres, "gold_staged") == 0

    # The table ahead of the checkpoint (a checkpoint restored from a copy, say) refuses to start.
    stream_id = checkpoints.read_stream_id(spark, str(egress_checkpoint(config)), STREAM)
    with connect(postgres) as conn:
        conn.execute("UPDATE gold_staged_egress_batches SET batch_id = batch_id + 5")
    lakehouse = Lakehouse(config.lakehouse_root)
    with pytest.raises(checkpoints.CheckpointError, match=r"gold_staged_egress_batches.*reset postgres_egress"):
        start(spark, config, lakehouse, stream_id)
    # And the table behind it (restored from an older backup, dropped) too: batches would be missing.
    with connect(postgres) as conn:
        conn.execute("DELETE FROM gold_staged_egress_batches")
    with pytest.raises(checkpoints.CheckpointError, match=r"table .*is older than the checkpoint"):
        start(spark, config, lakehouse, stream_id)


def test_the_executors_get_no_password_in_their_closure_and_read_it_where_they_run(config, postgres, tmp_path):
    config = with_egress(config, postgres, "gold_secret")
    password = postgres[1]
    stager = PostgresEgress(settings(config), "secret-stream").stager(batch_id=3)

    # What Spark pickles and ships with every task of a staged batch.
    assert password.encode() not in cloudpickle.dumps(stager)
    assert stager.args[0].password is None
    # On an executor: the password file (or the variable) where it runs, never the closure.
    assert stager.args[0].on_executor({}).password.get_secret_value() == password
    assert (
        stager.args[0].on_executor({"EGRESS_POSTGRES_PASSWORD": "from-env"}).password.get_secret_value() == "from-env"
    )
    elsewhere = stager.args[0].model_copy(update={"password_file": str(tmp_path / "not-mounted")})
    with pytest.raises(ConfigError, match=r"^egress_postgres\.password_file: on an executor: .* does not exist"):
        elsewhere.on_executor({})
    with pytest.raises(ConfigError, match=r"spark\.executorEnv\.EGRESS_POSTGRES_PASSWORD"):
        elsewhere.model_copy(update={"password_file": None}).on_executor({})


def test_a_gold_version_of_more_than_a_thousand_files_is_applied_in_one_batch(spark, config, postgres, gold_in_files):
    config = with_egress(config, postgres, "gold_many_files")
    # More files than Delta's source admits per batch by default (1,000): the snapshot a new
    # stream id starts from, then a rebuild's overwrite (every file removed, every row added again).
    gold_in_files(spark, gold_path(config), windows=1002, files=1002)
    run_available_now(spark, config, (STREAM,))
    assert checkpoints.last_committed_batch(spark, str(egress_checkpoint(config))) == 0
    assert_mirrors_gold(spark, config, postgres, "gold_many_files")

    gold_in_files(spark, gold_path(config), windows=952, files=952, mode="overwrite", bump=1)
    run_available_now(spark, config, (STREAM,))

    # One batch: in two, a row's delete and its new insert would be applied apart, the row deleted.
    assert checkpoints.last_committed_batch(spark, str(egress_checkpoint(config))) == 1
    assert len(assert_mirrors_gold(spark, config, postgres, "gold_many_files")) == 952


def gold_changes_since(spark, config, version: int):
    """Gold's change feed from ``version`` on: what the egress stream hands a batch."""
    changes = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", version)
    return changes.load(gold_path(config))


def gold_version(spark, config) -> int:
    return DeltaTable.forPath(spark, gold_path(config)).history(1).first().version


def test_a_marker_row_deleted_or_rolled_back_under_a_running_stream_is_refused_until_a_reset(
    spark, config, postgres, monkeypatch, gold_in_files
):
    config = with_egress(config, postgres, "gold_marker")
    # The egress follows gold alone: a gold written here stands for the layers above.
    gold_in_files(spark, gold_path(config), windows=6, files=2)
    run_available_now(spark, config, (STREAM,))
    egress = PostgresEgress(settings(config), "running-stream")
    assert egress.apply(gold_changes_since(spark, config, 0), 0) > 0
    before = gold_version(spark, config)
    DeltaTable.forPath(spark, gold_path(config)).update("event_count = 1", {"event_count": "event_count + 10"})
    assert egress.apply(gold_changes_since(spark, config, before + 1), 1) > 0
    mirrored = row_versions(postgres, "gold_marker")

    # Rolled back under the stream (a restore of the marker table): batch 2 would land on a table
    # that is not known to hold batch 1. Refused, and nothing written.
    with connect(postgres) as conn:
        conn.execute("UPDATE gold_marker_egress_batches SET batch_id = 0 WHERE stream_id = 'running-stream'")
    with pytest.raises(checkpoints.CheckpointError, match=r"holds batch 0 for stream running-stream where batch 2 "):
        egress.apply(gold_changes_since(spark, config, before + 1), 2)
    # Deleted: never made again. The message names the way out.
    with connect(postgres) as conn:
        conn.execute("DELETE FROM gold_marker_egress_batches")
    gone = r"holds no row for stream running-stream where batch 2 needs batch 1.*reset postgres_egress"
    with pytest.raises(checkpoints.CheckpointError, match=gone):
        egress.apply(gold_changes_since(spark, config, before + 1), 2)
    assert row_versions(postgres, "gold_marker") == mirrored[:-1]  # the rows untouched, the marker gone
    assert table_mirror(postgres, "gold_marker") == gold_mirror(spark, config)

    # The pipeline's own stream, its marker deleted too, then the way out, through the command line.
    with connect(postgres) as conn:
        conn.execute("DELETE FROM gold_marker_egress_batches")
    monkeypatch.setenv("PIPELINE_EGRESS", "egress_postgres")
    monkeypatch.setenv("EGRESS_POSTGRES_DSN", postgres[0])
    monkeypatch.setenv("EGRESS_POSTGRES_PASSWORD", postgres[1])
    monkeypatch.setenv("EGRESS_POSTGRES_TABLE", "gold_marker")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", config.kafka.bootstrap_servers)
    monkeypatch.setenv("KAFKA_TOPICS", ",".join(config.kafka.topics))
    monkeypatch.setenv("LAKEHOUSE_ROOT", config.lakehouse_root)
    assert main(["run", "--layer", STREAM, "--available-now"]) == 3
    assert main(["checkpoints", "reset", STREAM, "--yes"]) == 0
    with connect(postgres) as conn:
        conn.execute("INSERT INTO gold_marker VALUES ('2020-01-01 00:00Z', '2020-01-01 00:01Z', 'stale', 1, 1.00, 1)")
    assert main(["run", "--layer", STREAM, "--available-now"]) == 0
    # A new stream id's batch 0 is gold's snapshot: every row carries the snapshot's version.
    values = {key: found[:-1] for key, found in table_mirror(postgres, "gold_marker").items()}
    assert values == {key: expected[:-1] for key, expected in gold_mirror(spark, config).items()}
    [(stream_id, batch)] = markers(postgres, "gold_marker").items()
    assert stream_id == checkpoints.read_stream_id(spark, str(egress_checkpoint(config)), STREAM) and batch == 0


def test_a_session_left_inside_its_transaction_is_ended_by_the_server_and_the_next_batch_goes_on(
    spark, config, postgres, gold_in_files
):
    timeouts = {"idle_in_transaction_timeout": "2 seconds", "lock_timeout": "1 minute"}
    config = with_egress(config, postgres, "gold_orphan", **timeouts)
    gold_in_files(spark, gold_path(config), windows=6, files=2)
    egress = PostgresEgress(settings(config), "orphaned")
    egress.apply(gold_changes_since(spark, config, 0), 0)

    # A session of the egress that moved the marker and never got to COMMIT, its process paused or
    # cut off without the server noticing: it holds the marker row's lock.
    orphan = _connect(settings(config))
    orphan.execute("BEGIN")
    orphan.execute("SELECT batch_id FROM gold_orphan_egress_batches WHERE stream_id = 'orphaned' FOR UPDATE")

    before = gold_version(spark, config)
    DeltaTable.forPath(spark, gold_path(config)).update("event_count = 1", {"event_count": "event_count + 10"})
    assert egress.apply(gold_changes_since(spark, config, before + 1), 1) > 0

    assert table_mirror(postgres, "gold_orphan") == gold_mirror(spark, config)
    assert markers(postgres, "gold_orphan") == {"orphaned": 1}
    with pytest.raises(psycopg.Error):  # the server ended it
        orphan.execute("SELECT 1")
    orphan.close()


class ConnectionCutAtCommit:
    """A TCP proxy in front of the real server that, once armed, cuts the next connection that sends COMMIT.

    ``answered``: COMMIT reaches the server, its answer never reaches the client (the outcome unknown to
    it, committed in fact). ``unanswered``: COMMIT never reaches the server, and the server's side of
    the connection stays open as in a network partition: the server sees a session idle inside its
    transaction, holding its locks.
    """

    # A simple-protocol Query message: 'Q', its length (4 + 6 + 1), "COMMIT" and its terminator.
    COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"

    def __init__(self, server_port: int, mode: str):
        self.server_port, self.mode = server_port, mode
        self.armed, self.cut = threading.Event(), threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.partitioned: list[socket.socket] = []  # server sides kept open, silent
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.server_port))
            this_one_cut = threading.Event()
            threading.Thread(target=self._pump, args=(client, server, True, this_one_cut), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, this_one_cut), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, to_server: bool, this_one_cut) -> None:
        try:
            while data := source.recv(65536):
                if not to_server and this_one_cut.is_set():
                    return  # the server's answer to COMMIT (or anything after it) never arrives
                if to_server and self.armed.is_set() and not self.cut.is_set() and self.COMMIT in data:
                    this_one_cut.set()
                    self.cut.set()
                    if self.mode == "answered":
                        target.sendall(data)  # the server commits; the other pump drops its answer
                        time.sleep(0.5)
                    else:
                        self.partitioned.append(target)
                    source.close()
                    return
                target.sendall(data)
        except OSError:
            pass
        finally:
            if target not in self.partitioned:
                with contextlib.suppress(OSError):
                    target.close()

    def close(self) -> None:
        self.listener.close()
        for each in self.partitioned:
            each.close()


@pytest.mark.parametrize("mode", ["answered", "unanswered"])
def test_a_connection_cut_at_commit_is_resolved_through_the_marker_without_waiting_on_a_lock(
    spark, config, postgres, gold_in_files, mode
):
    dsn, _ = postgres
    server_port = int(conninfo_to_dict(dsn)["port"])
    proxy = ConnectionCutAtCommit(server_port, mode)
    table = f"gold_cut_{mode}"
    try:
        timeouts = {"idle_in_transaction_timeout": "2 seconds", "lock_timeout": "1 minute"}
        config = with_egress(config, postgres, table, **timeouts)
        proxied = settings(config).model_copy(update={"dsn": make_conninfo(dsn, port=proxy.port)})
        gold_in_files(spark, gold_path(config), windows=6, files=2)
        egress = PostgresEgress(proxied, "cut")
        egress.apply(gold_changes_since(spark, config, 0), 0)
        before = gold_version(spark, config)
        DeltaTable.forPath(spark, gold_path(config)).update("event_count = 1", {"event_count": "event_count + 10"})
        batch = gold_changes_since(spark, config, before + 1)

        proxy.armed.set()
        with pytest.raises(psycopg.OperationalError):
            egress.apply(batch, 1)
        assert proxy.cut.is_set()
        assert markers(postgres, table) == {"cut": 1 if mode == "answered" else 0}

        # Spark replays the batch: the marker says whether it committed; an orphaned session's lock
        # is gone within idle_in_transaction_timeout, not after TCP's hours.
        started = time.monotonic()
        applied = egress.apply(batch, 1)
        assert applied == 0 if mode == "answered" else applied > 0
        assert time.monotonic() - started < 30
        assert table_mirror(postgres, table) == gold_mirror(spark, config)
        assert markers(postgres, table) == {"cut": 1}
    finally:
        proxy.close()


def test_a_batch_that_waits_longer_than_lock_timeout_fails_naming_the_setting_and_the_holder(
    spark, config, postgres, gold_in_files
):
    timeouts = {"idle_in_transaction_timeout": "1 second", "lock_timeout": "2 seconds"}
    config = with_egress(config, postgres, "gold_locked", **timeouts)
    gold_in_files(spark, gold_path(config), windows=6, files=2)
    egress = PostgresEgress(settings(config), "locked")
    egress.apply(gold_changes_since(spark, config, 0), 0)
    # A session the egress's idle timeout does not cover (another client, or one of ours busy in a
    # statement) holds the marker row: the batch waits lock_timeout, then fails naming both.
    with connect(postgres) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT batch_id FROM gold_locked_egress_batches WHERE stream_id = 'locked' FOR UPDATE")
        pid = holder.info.backend_pid
        with pytest.raises(TimeoutError, match=rf"^egress_postgres\.lock_timeout: waited 2 seconds .*pid {pid} "):
            egress.apply(gold_changes_since(spark, config, 0), 1)
        holder.execute("ROLLBACK")
    assert markers(postgres, "gold_locked") == {"locked": 0}


# --- through the command line, in a process of its own -------------------------------------------------


def pipeline(*args: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def pipeline_env(config, postgres, table: str, **extra: str) -> dict:
    dsn, password = postgres
    env = {key: value for key, value in os.environ.items() if not key.startswith(("EGRESS_", CRASH_POINT_VAR))}
    return {
        **env,
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_EGRESS": "egress_postgres",
        "EGRESS_POSTGRES_DSN": dsn,
        "EGRESS_POSTGRES_PASSWORD": password,
        "EGRESS_POSTGRES_TABLE": table,
        **extra,
    }


def crash_at(config, postgres, point: str, layer: str = STREAM, **extra: str) -> None:
    crash = f"{STREAM}:{point}:0"
    env = pipeline_env(config, postgres, "gold_crash", **{CRASH_POINT_VAR: crash}, **extra)
    crashed = pipeline("run", "--layer", layer, "--available-now", env=env)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert f"crash point {crash}" in crashed.stderr


@pytest.mark.faults
def test_a_crash_at_any_point_of_the_egress_loses_and_doubles_nothing(spark, config, postgres):
    produce_events(config, 300, seed=4)

    # Executors staged batch 0, the driver's transaction never began: nothing in the table.
    crash_at(config, postgres, AFTER_STAGING, "all", EGRESS_POSTGRES_STAGE_ABOVE_ROWS="1")
    gold_rows = len(gold_mirror(spark, config))
    assert staged_rows(postgres, "gold_crash") == gold_rows
    assert table_mirror(postgres, "gold_crash") == {} and markers(postgres, "gold_crash") == {}

    # The layers above have nothing new from here on: only the egress is run.
    # Staged again (overwritten, not doubled), applied in the open transaction, killed before COMMIT.
    crash_at(config, postgres, AFTER_PRE_COMMIT, EGRESS_POSTGRES_STAGE_ABOVE_ROWS="1")
    assert staged_rows(postgres, "gold_crash") == gold_rows
    assert table_mirror(postgres, "gold_crash") == {} and markers(postgres, "gold_crash") == {}

    # Committed to PostgreSQL, killed before Spark's commit-log entry: the table is right already.
    crash_at(config, postgres, AFTER_SINK_COMMIT)
    assert_mirrors_gold(spark, config, postgres, "gold_crash")
    assert list(markers(postgres, "gold_crash").values()) == [0]
    assert staged_rows(postgres, "gold_crash") == 0
    before = row_versions(postgres, "gold_crash")

    # The rerun replays batch 0: the marker makes it a no-op.
    recovered = pipeline("run", "--layer", STREAM, "--available-now", env=pipeline_env(config, postgres, "gold_crash"))
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    assert row_versions(postgres, "gold_crash") == before
    assert_mirrors_gold(spark, config, postgres, "gold_crash")
    assert checkpoints.last_committed_batch(spark, str(egress_checkpoint(config))) == 0


def test_a_wrong_password_stops_the_run_with_exit_2_naming_the_setting(config, postgres):
    wrong = "not-" + postgres[1]
    env = pipeline_env(config, postgres, "gold_password", EGRESS_POSTGRES_PASSWORD=wrong)

    refused = pipeline("run", "--layer", STREAM, "--available-now", env=env)

    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "config error: egress_postgres.password_file" in refused.stderr
    assert "EGRESS_POSTGRES_PASSWORD" in refused.stderr and wrong not in refused.stderr + refused.stdout


def test_check_connection_names_the_setting_to_fix_and_never_the_password(config, postgres):
    check_connection(with_egress(config, postgres, "gold_checked"))

    wrong = "not-" + postgres[1]
    parsed = parse_settings({"dsn": postgres[0], "table": "gold_checked"}, {"EGRESS_POSTGRES_PASSWORD": wrong})
    refused = config.model_copy(update={"egress": {STREAM: parsed}})
    with pytest.raises(ConfigError, match=r"^egress_postgres\.password_file: .*user 'pipeline'") as error:
        check_connection(refused)
    assert wrong not in str(error.value) and wrong not in repr(refused)

    unreachable = with_egress(config, postgres, "gold_checked", dsn="host=127.0.0.1 port=1 dbname=lakehouse")
    with pytest.raises(ConfigError, match=r"^egress_postgres\.dsn: cannot connect"):
        check_connection(unreachable)
    with pytest.raises(ConfigError, match=r"^egress_postgres\.dsn: is 'local'"):
        check_connection(with_egress(config, postgres, "gold_checked", dsn="local"))


@pytest.mark.parametrize(
    ("values", "environ", "message"),
    [
        ({"tabel": "x"}, {}, r"egress_postgres\.tabel: unknown key"),
        ({"dsn": "host=db password=hunter2"}, {}, r"egress_postgres\.dsn: holds a password"),
        ({"dsn": "postgresql://app:hunter2@db/lake"}, {}, r"egress_postgres\.dsn: holds a password"),
        ({"dsn": "host=db hunter2"}, {}, r"egress_postgres\.dsn: is not a libpq"),
        ({"table": "Gold-Windows"}, {}, r"egress_postgres\.table: "),
        ({"table": "public.gold.windows"}, {}, r"egress_postgres\.table: "),
        ({"table": "g" * 45}, {}, r"egress_postgres\.table: "),
        ({"stage_above_rows": 0}, {}, r"egress_postgres\.stage_above_rows: "),
        ({"stage_above_rows": "many"}, {}, r"egress_postgres\.stage_above_rows: "),
        ({"password_file": "/nonexistent/pw"}, {}, r"egress_postgres\.password_file: .* does not exist"),
        ({"password_file": "/pw"}, {"EGRESS_POSTGRES_PASSWORD": "pw"}, r"egress_postgres\.password_file: .*together"),
        ({"lock_timeout": "30 seconds"}, {}, r"egress_postgres\.lock_timeout: .*longer than idle_in_transaction"),
        ({"idle_in_transaction_timeout": "soon"}, {}, r"egress_postgres\.idle_in_transaction_timeout: 'soon' is not"),
        ({}, {"EGRESS_POSTGRES_KEEPALIVE_IDLE": "0 seconds"}, r"egress_postgres\.keepalive_idle: .*longer than zero"),
    ],
)
def test_settings_refusals_name_the_key(values, environ, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_settings({"dsn": "host=db dbname=lake user=app", "table": "gold", **values}, environ)
    assert "hunter2" not in str(error.value)


def test_settings_defaults_and_a_schema_qualified_table():
    environ = {"EGRESS_POSTGRES_PASSWORD": "s3cret", "EGRESS_POSTGRES_STAGE_ABOVE_ROWS": "500"}
    parsed = parse_settings({"dsn": "local", "table": "mart.gold"}, environ)
    assert parsed.dsn == "local" and parsed.table == "mart.gold" and parsed.stage_above_rows == 500
    assert parsed.local_home == ".postgres-local"
    assert parsed.password.get_secret_value() == "s3cret" and "s3cret" not in repr(parsed)
    assert parse_settings({"dsn": "local", "table": "g"}, {"POSTGRES_LOCAL_HOME": "/srv/pg"}).local_home == "/srv/pg"


def test_a_password_in_the_config_file_is_refused_naming_the_variable():
    refused = r"^egress_postgres\.password: a secret never goes in a config file; set EGRESS_POSTGRES_PASSWORD"
    with pytest.raises(ConfigError, match=refused):
        parse_settings({"dsn": "local", "table": "g", "password": "hunter2"}, {})


def test_calendar_edge_event_times_run_through_every_egress_once_each_in_one_driver(
    spark, config, postgres, kafka_oracle, monkeypatch, capsys
):
    # Both egresses where the bake has both: the Kafka egress's changelog is read back too.
    with_kafka = "kafka_egress" in installed_egresses()
    out = f"gold-edges-{os.getpid()}-{time.monotonic_ns()}"
    admin = AdminClient(client_config(config))
    compacted = NewTopic(out, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
    admin.create_topics([compacted])[out].result(timeout=30)
    dsn, password = postgres
    for name, value in {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_EGRESS": "egress_kafka,egress_postgres" if with_kafka else "egress_postgres",
        "EGRESS_KAFKA_TOPIC": out,
        "EGRESS_POSTGRES_DSN": dsn,
        "EGRESS_POSTGRES_PASSWORD": password,
        "EGRESS_POSTGRES_TABLE": "gold_edges",
    }.items():
        monkeypatch.setenv(name, value)
    # A dimension holding U+0000, which PostgreSQL's text cannot: quarantined, not the egress stopped.
    nul = {"event_id": "nul-0", "event_time": "2024-05-01T09:00:00Z", "user_id": "u", "amount": 1.25}
    nul_record = (b"user-edge", json.dumps({**nul, "event_type": "page\u0000view"}).encode())
    for _ in range(2):
        # The same event ids twice (an application's retry): one gold row per window, counted twice.
        produce(client_config(config), config.kafka.topics[0], [*calendar_edge_records("edge"), nul_record])
        assert main(["run", "--layer", "all", "--available-now"]) == 0, capsys.readouterr().err[-3000:]

    in_range = sum(CALENDAR_EDGES.values())
    quarantine = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(QUARANTINE))
    assert quarantine.where("reason = 'field event_type contains the character U+0000'").count() == 2
    assert_mirrors_gold(spark, config, postgres, "gold_edges")
    assert len(table_mirror(postgres, "gold_edges")) == in_range
    # The output topic folded by key, by a plain read_committed consumer: the last value of each key.
    folded: dict[tuple[str, str], dict] = {}
    for _, value in sorted(kafka_oracle(config, [out]).items()):
        record = json.loads(value) if value else None
        if record is not None and "event_count" in record:
            folded[(record["window_start"], record["event_type"])] = record
    assert sorted(record["event_count"] for record in folded.values()) == ([2] * in_range if with_kafka else [])
    capsys.readouterr()
    assert main(["audit", "--json"]) == 0, capsys.readouterr().out[-3000:]
    # Every key the audit reports is a declared finding, each of which the runbook explains (test_docs.py).
    report = json.loads(capsys.readouterr().out)["datasets"]["events"]
    egresses = ["postgres_egress", *(["kafka_egress"] if with_kafka else [])]
    assert sorted({*report["errors"], *report["warnings"]} - set(findings.keys(egresses))) == []


# --- golds beyond the first: each published by a stream of its own ------------------------------


def plain(value: object) -> object:
    """A published or mirrored value as plain Python: a timestamp as a UTC instant, a number exact."""
    if isinstance(value, str) and value[:4].isdigit() and "T" in value:
        return datetime.fromisoformat(value).astimezone(UTC)
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, float):
        raise AssertionError(f"a float where an exact number is published: {value!r}")
    return value


def gold_table_rows(spark, config, table: str, columns: tuple[str, ...]) -> set[tuple]:
    """The gold table's rows, timestamps read as exact epoch microseconds and made UTC instants."""
    as_micros = [F.unix_micros(c).alias(c) if c in TIMESTAMPS else F.col(c) for c in columns]
    rows = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(table)).select(*as_micros).collect()
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    return {
        tuple(epoch + timedelta(microseconds=v) if c in TIMESTAMPS else v for c, v in zip(columns, row, strict=True))
        for row in rows
    }


def topic_fold(records: dict, topic: str, columns: tuple[str, ...], key: tuple[str, ...]) -> tuple[set[tuple], list]:
    """The topic folded by key in log order, from its values alone (this gold never deletes a row), and
    every (key, gold_version) it holds, in log order."""
    state, versions = {}, []
    for (found_topic, _, _), value in sorted(records.items()):
        if found_topic != topic:
            continue
        row = json.loads(value, parse_float=Decimal)
        state[tuple(row[name] for name in key)] = tuple(plain(row[name]) for name in columns)
        versions.append((tuple(row[name] for name in key), row["gold_version"]))
    return set(state.values()), versions


def order_records(prefix: str, count: int, start: datetime, write) -> list[tuple[bytes, bytes]]:
    """Orders of three shops and five customers, one every two minutes, each value written by ``write`` (its
    dataset's format); the fourth sent again as a retry."""
    records = []
    for number in range(count):
        value = {
            "order_id": f"{prefix}-{number}",
            "ordered_at": (start + timedelta(minutes=2 * number)).isoformat(),
            "shop": f"shop-{number % 3}",
            "customer": f"c{number % 5}",
            "total": Decimal(f"{number}.25"),
        }
        records.append((f"{prefix}-{number}".encode(), write(value)))
    return [*records, records[3]]


@pytest.mark.slow
@pytest.mark.skipif(len(DATASETS) < 2, reason="a bake with one dataset has no gold beyond the first")
def test_each_gold_an_egress_names_goes_out_once_by_its_own_stream_through_a_crash_and_the_audit(
    spark, config, postgres, kafka_oracle, monkeypatch, capsys, schema_registry
):
    with_kafka = "kafka_egress" in installed_egresses()
    second = DATASETS[1]
    by_shop, hourly = second.golds[0], second.golds[-1]
    run_id = f"{os.getpid()}-{time.monotonic_ns()}"
    orders, first_out, by_shop_out, hourly_out = (f"{name}-{run_id}" for name in ("orders", "gold", "shop", "hourly"))
    admin = AdminClient(client_config(config))
    topics = [NewTopic(orders, num_partitions=2, replication_factor=1)]
    topics += [
        NewTopic(name, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
        for name in (first_out, by_shop_out, hourly_out)
    ]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)
    dsn, password = postgres
    mirror = f"mirror_{second.name}_{by_shop.name}"
    for name, value in {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "KAFKA_TOPICS": ",".join(config.kafka.topics),
        f"DATASET_{second.name.upper()}_TOPICS": orders,
        "PIPELINE_DATASETS": second.name,
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "PIPELINE_EGRESS": "egress_kafka,egress_postgres" if with_kafka else "egress_postgres",
        "EGRESS_KAFKA_TOPIC": first_out,
        # Both golds of the second dataset to Kafka, one of them to PostgreSQL.
        "EGRESS_KAFKA_GOLDS": f"{second.name}.{by_shop.name}={by_shop_out}, {second.name}.{hourly.name}={hourly_out}",
        "EGRESS_POSTGRES_DSN": dsn,
        "EGRESS_POSTGRES_PASSWORD": password,
        "EGRESS_POSTGRES_TABLE": f"gold_first_{os.getpid()}",
        "EGRESS_POSTGRES_GOLDS": f"{second.name}.{by_shop.name}={mirror}",
        "SCHEMA_REGISTRY_URL": schema_registry,
    }.items():
        monkeypatch.setenv(name, value)
    streams = {
        (egress, gold.name): target_stream(egress, second, gold)
        for egress in ("kafka_egress", "postgres_egress")
        for gold in (by_shop, hourly)
    }
    t0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
    write = value_writer(second, {"url": schema_registry}, orders)
    produce(client_config(config), orders, order_records("a", 40, t0, write))
    # The dataset's streams, then the egress streams of its golds. One of these is killed inside its first
    # batch (the Kafka one between its produce and its commit), and the next run replays it.
    run_orders = ["run", "--layer", "all", "--available-now", "--dataset", second.name]
    stream, point = (streams["kafka_egress", by_shop.name], AFTER_PRE_COMMIT)
    if not with_kafka:
        stream, point = (streams["postgres_egress", by_shop.name], AFTER_SINK_COMMIT)
    where = f"{stream}:{point}:0"
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", *run_orders]
    crashed = subprocess.run(command, env={**os.environ, CRASH_POINT_VAR: where}, capture_output=True, text=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert f"crash point {where}" in crashed.stderr
    assert main(run_orders) == 0, capsys.readouterr().err[-3000:]

    # Judged from outside: each topic folds to its gold, and no gold version went out twice.
    published = kafka_oracle(config, [by_shop_out, hourly_out]) if with_kafka else {}
    for gold, out in ((by_shop, by_shop_out), (hourly, hourly_out)):
        expected = gold_table_rows(spark, config, second.gold_table(gold), gold.columns)
        assert len(expected) > 1
        folded, versions = topic_fold(published, out, gold.columns, gold.key)
        assert folded == (expected if with_kafka else set())
        assert len(versions) == len(set(versions)), f"{out}: a gold version published twice"
    # The table PostgreSQL mirrors holds the gold's rows; the gold it was not asked for has no table.
    with connect(postgres) as conn:
        rows = conn.execute(f"SELECT {', '.join(by_shop.columns)} FROM {mirror}").fetchall()
        markers_there = conn.execute(f"SELECT count(*) FROM {mirror}_egress_batches").fetchone()[0]
        unasked = conn.execute("SELECT to_regclass(%s)", [f"gold_{second.name}_{hourly.name}"]).fetchone()[0]
    assert {tuple(plain(value) for value in row) for row in rows} == gold_table_rows(
        spark, config, second.gold_table(by_shop), by_shop.columns
    )
    assert markers_there == 1 and unasked is None
    assert not Path(Lakehouse(config.lakehouse_root).checkpoint(streams["postgres_egress", hourly.name])).exists()

    # The audit reconciles each egress stream with its own gold, under the stream's own keys.
    capsys.readouterr()
    assert main(["audit", "--json", "--dataset", second.name]) == 0, capsys.readouterr().out[-3000:]
    report = json.loads(capsys.readouterr().out)["datasets"][second.name]
    audited = [stream for (egress, _), stream in streams.items() if egress == "kafka_egress" and with_kafka]
    audited.append(streams["postgres_egress", by_shop.name])
    for stream in audited:
        assert report["errors"][f"{stream}_rows_not_matching_gold"] == 0
        assert report["counts"][f"{stream}_rows"] > 1
    assert sorted({*report["errors"], *report["warnings"]} - set(findings.keys(audited))) == []
