"""PostgreSQL egress: gold mirrored into a table exactly once, one database transaction per batch.

The marker row (stream id, batch id) of ``<table>_egress_batches`` moves forward first, and only from
the batch before (at this batch: a replay, nothing else is done; anywhere else, or missing after batch
0: refused, never re-created), the batch's rows are upserted and its deleted keys removed, and the
COMMIT makes rows and marker visible together; a driver killed before it leaves nothing. Large batches
are first staged by the executors in ``<table>_egress_staging``, keyed on (stream id, batch id, gold
key) so that a retried task overwrites its rows. Batch 0 of a stream id (gold's snapshot) replaces
the table's contents: a new stream id mirrors gold from scratch. Values travel as text from Spark.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from pydantic import AliasChoices, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Config, ConfigError, Duration, Invalid, Section, Text, duration_seconds, read_secret
from ..delta.tables import Lakehouse, TableSchemaError
from ..monitoring import EgressOutcome, report_egress_batch
from ..recovery.checkpoints import CheckpointError, last_committed_batch, last_planned_batch
from ..recovery.crash_points import AFTER_PRE_COMMIT, AFTER_STAGING, crash_points, reach
from ..recovery.lease import check_held
from ..refusals import Refusal
from . import Target, first_target, section_settings
from .changes import (
    DELETED,
    GOLD_VERSION,
    check_changes_readable,
    gold_changes,
    latest_per_window,
    published_schema,
)

SECTION = "egress_postgres"
STREAM = "postgres_egress"
DESTINATION = "table"
# What the audit counts in the marker table besides the rows (audit_errors).
MARKERS_OF_OTHER_STREAMS = f"{STREAM}_markers_of_other_streams"
FINDINGS = (MARKERS_OF_OTHER_STREAMS,)
LOCAL_DSN = "local"  # the server of `postgres-local start`; the command line resolves it
MARKER, STAGING, KEY, STAGING_KEY = "_egress_batches", "_egress_staging", "_gold_key", "_egress_staging_key"
TABLES, CONSTRAINTS = {"table": "", "marker": MARKER, "staging": STAGING}, {"unique": KEY, "staged_key": STAGING_KEY}
# PostgreSQL cuts identifiers at 63 bytes: the longest name derived from the table's must still fit.
MAX_NAME = 63 - len(STAGING_KEY)
# Concatenated, not an f-string: doubled braces would be template syntax when the project is baked.
TABLE_PATTERN = re.compile(r"(?:([a-z_][a-z0-9_]{0,62})\.)?([a-z_][a-z0-9_]{0," + str(MAX_NAME - 1) + "})")
TIMESTAMP_TEXT = "yyyy-MM-dd HH:mm:ss.SSSSSSXXX"  # microseconds and the offset: exact in any time zone
# By Spark's simpleString, spelled as format_type() returns them: the layout check compares strings.
PG_TYPES = {"timestamp": "timestamp with time zone", "string": "text", "int": "integer", "double": "double precision"}
PG_TYPES |= {name: name for name in ("bigint", "boolean", "date")}
AUTH_FAILED = re.compile(r"authentication failed|no password supplied|password is required")
CREATE_TABLE = "CREATE TABLE IF NOT EXISTS {table} ({columns}, CONSTRAINT {unique} UNIQUE NULLS NOT DISTINCT ({key}))"
CREATE_MARKER = (
    "CREATE TABLE IF NOT EXISTS {marker} (stream_id text PRIMARY KEY, batch_id bigint NOT NULL, "
    "gold_version bigint, committed_at timestamptz NOT NULL DEFAULT now())"
)
# Logged, not UNLOGGED: staged rows must survive a database crash between staging and apply.
CREATE_STAGING = (
    "CREATE TABLE IF NOT EXISTS {staging} ({columns}, "
    "CONSTRAINT {staged_key} UNIQUE NULLS NOT DISTINCT (stream_id, batch_id, {key}))"
)
ROWS, CREATE_ROWS = "egress_rows", "CREATE TEMP TABLE {rows} ({columns}) ON COMMIT DROP"  # what a COPY fills
COLUMNS = (
    "SELECT attname, format_type(atttypid, atttypmod), attnotnull FROM pg_attribute "
    "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
)
# The marker row is locked for the batch's transaction: read, checked, then moved by one batch.
LOCK_MARKER = "SELECT batch_id FROM {marker} WHERE stream_id = %s FOR UPDATE"
FIRST_MARKER = "INSERT INTO {marker} (stream_id, batch_id, gold_version) VALUES (%s, %s, %s)"
MOVE_MARKER = (
    "UPDATE {marker} SET batch_id = %s, gold_version = COALESCE(%s, gold_version), committed_at = now() "
    "WHERE stream_id = %s"
)
UPSERT = (
    "INSERT INTO {table} ({gold}) SELECT {gold} FROM ({source}) AS s WHERE NOT s.deleted "
    "ON CONFLICT ON CONSTRAINT {unique} DO UPDATE SET {update}"
)
DELETE = "DELETE FROM {table} AS t USING ({source}) AS s WHERE s.deleted AND {match}"
# An upsert, not a COPY straight into staging: a retried task overwrites what its first attempt staged.
STAGE = (
    "INSERT INTO {staging} (stream_id, batch_id, {staged}) SELECT %s, %s, {staged} FROM {rows} "
    "ON CONFLICT ON CONSTRAINT {staged_key} DO UPDATE SET {update}"
)
MARKED = "SELECT batch_id FROM {marker} WHERE stream_id = %s"
# Who holds the marker row: the row's xmax is the transaction that locked it (a lone locker's).
HOLDERS = (
    "SELECT a.pid, a.state, now() - a.xact_start FROM {marker} AS m "
    "JOIN pg_stat_activity AS a ON a.backend_xid::text = m.xmax::text WHERE m.stream_id = %s"
)
STAGED_BATCH = "SELECT * FROM {staging} WHERE stream_id = %s AND batch_id = %s"
CLEAR_STAGED = "DELETE FROM {staging} WHERE stream_id = %s AND batch_id <= %s"


class PostgresEgressSettings(Section):
    """``[egress_postgres]``; EGRESS_POSTGRES_<KEY> overrides a key, EGRESS_POSTGRES_PASSWORD is the password.

    The driver reads the password here, from the environment or the file named by password_file,
    and never shows it. It does not travel to the executors that stage rows: they get the settings
    without it (``for_executors``) and read it where they run (``on_executor``), from the same
    variable or file, as Spark hands secrets to executors (``spark.executorEnv.*``, a cluster
    manager's secrets, or a file mounted on every node).
    """

    model_config = SettingsConfigDict(env_prefix="EGRESS_POSTGRES_")

    dsn: str  # libpq key=value string (or URI), or "local"
    table: str  # where the first dataset's first gold goes
    # Any other gold it mirrors, each to a table of its own: "orders.by_shop" = "orders_by_shop".
    golds: dict[str, str] = Field(default_factory=dict)
    password_file: Text | None = None
    password: SecretStr | None = Field(None, validate_default=True)  # or read from password_file
    stage_above_rows: int = Field(10_000, gt=0)
    # Where `postgres-local start` keeps the development server; POSTGRES_LOCAL_HOME too, like KAFKA_LOCAL_HOME.
    local_home: Text = Field(".postgres-local", validation_alias=AliasChoices("local_home", "POSTGRES_LOCAL_HOME"))
    # The server ends a session of this egress left idle inside a transaction (its process paused, gone or cut
    # off before COMMIT), which frees the marker row it holds; a batch waits for that row at most
    # lock_timeout, so lock_timeout is the longer of the two and a batch outlives an orphaned session.
    idle_in_transaction_timeout: Duration = "1 minute"
    lock_timeout: Duration = "2 minutes"
    # TCP keepalive probes after this much silence, both ways: a dead peer is found in about twice this.
    keepalive_idle: Duration = "30 seconds"

    @field_validator("dsn")
    @classmethod
    def _dsn(cls, dsn: str) -> str:
        try:
            params = {} if dsn == LOCAL_DSN else conninfo_to_dict(dsn) if dsn.strip() else None
        except psycopg.ProgrammingError:  # not its message: it quotes pieces of the string, a password perhaps
            params = None
        if params is None:
            raise ValueError("is not a libpq connection string 'host=... dbname=... user=...' or 'local'")
        if "password" in params:
            raise ValueError(f"holds a password; secrets go in password_file or {PASSWORD_VAR}, not here")
        return dsn

    @field_validator("table")
    @classmethod
    def _table(cls, table: str) -> str:
        if not TABLE_PATTERN.fullmatch(table):
            raise ValueError(f"{table!r} is not name or schema.name ([a-z_][a-z0-9_]*, {MAX_NAME} max)")
        return table

    @field_validator("golds")
    @classmethod
    def _gold_tables(cls, golds: dict[str, str]) -> dict[str, str]:
        for gold, table in golds.items():
            if not TABLE_PATTERN.fullmatch(table):
                raise ValueError(f"{gold}: {table!r} is not name or schema.name ([a-z_][a-z0-9_]*, {MAX_NAME} max)")
        return golds

    @field_validator("password")
    @classmethod
    def _password(cls, password: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return cls.secret(password, info)

    @model_validator(mode="after")
    def _lock_outlives_idle(self) -> PostgresEgressSettings:
        idle, lock = (duration_seconds(value, key) for key, value in self.session_timeouts().items())
        if lock <= idle:
            raise Invalid(
                "lock_timeout",
                f"{self.lock_timeout!r} must be longer than idle_in_transaction_timeout "
                f"{self.idle_in_transaction_timeout!r}: a batch must outwait a session the server ends",
            )
        return self

    def for_executors(self) -> PostgresEgressSettings:
        """These settings without the password: what a task's closure may carry.

        Example::

            rows.foreachPartition(partial(stage, settings.for_executors()))
        """
        return self.model_copy(update={"password": None})

    def on_executor(self, environ: Mapping[str, str] | None = None) -> PostgresEgressSettings:
        """These settings with the password read where this process runs: its variable, or password_file.

        ConfigError names both ways when neither is there (an executor without the secret).

        Example::

            _connect(settings.on_executor())  # on an executor, inside a task
        """
        environ = os.environ if environ is None else environ
        password = environ.get(PASSWORD_VAR)
        if not password and self.password_file is not None:
            try:
                password = read_secret(self.password_file, "password_file")
            except Invalid as error:
                raise ConfigError(f"{SECTION}.{error.key}: on an executor: {error.reason}") from None
        if not password:
            raise ConfigError(
                f"{SECTION}.password_file: the executors that stage rows have no database password: set "
                f"{PASSWORD_VAR} in their environment (spark.executorEnv.{PASSWORD_VAR}, or the cluster "
                "manager's secrets) or mount the file password_file names on every executor"
            )
        return self.model_copy(update={"password": SecretStr(password)})

    def session_timeouts(self) -> dict[str, str]:
        """The two session timeouts, by key (idle first): what _connect sets and what a refusal names."""
        return {"idle_in_transaction_timeout": self.idle_in_transaction_timeout, "lock_timeout": self.lock_timeout}


Settings = PostgresEgressSettings
PASSWORD_VAR = PostgresEgressSettings.variables("password")[0]


def _connect(settings: PostgresEgressSettings) -> psycopg.Connection:
    # Autocommit: explicit transaction blocks. UTC: timestamps read back as stored. Timeouts, never a hang:
    # at connect, on a lock, for a session of ours left in a transaction, and keepalives both ways.
    if settings.dsn == LOCAL_DSN:
        raise ConfigError(f"{SECTION}.dsn: is 'local' but names no server; run `postgres-local start` first")
    params = conninfo_to_dict(settings.dsn)
    idle, lock = (duration_seconds(value, key) for key, value in settings.session_timeouts().items())
    keepalive = duration_seconds(settings.keepalive_idle, "keepalive_idle")
    server = {
        "TimeZone": "UTC",
        "idle_in_transaction_session_timeout": f"{idle}s",
        "lock_timeout": f"{lock}s",
        "tcp_keepalives_idle": keepalive,
        "tcp_keepalives_interval": max(keepalive // 3, 1),
        "tcp_keepalives_count": 3,
    }
    opts = " ".join(filter(None, [params.get("options"), *(f"-c {name}={value}" for name, value in server.items())]))
    password = settings.password.get_secret_value() if settings.password is not None else None
    return psycopg.connect(
        settings.dsn,
        password=password,
        options=opts,
        connect_timeout=10,
        autocommit=True,
        keepalives=1,
        keepalives_idle=keepalive,
        keepalives_interval=max(keepalive // 3, 1),
        keepalives_count=3,
    )


def _as_text(latest: DataFrame, layout: _Layout) -> DataFrame:
    rows = latest.select(*(name for name, _, _ in layout.layouts()[1]))  # the COPY's column order
    text = [F.date_format(c, TIMESTAMP_TEXT) if t == "timestamp" else F.col(c).cast("string") for c, t in rows.dtypes]
    return rows.select(*text)


def _names(names: Iterable[str], template: str = "{0}") -> sql.Composed:
    return sql.SQL(", ").join(sql.SQL(template).format(sql.Identifier(name)) for name in names)


def _definitions(columns: Iterable[tuple[str, str, bool]]) -> sql.Composed:
    return sql.SQL(", ").join(sql.Identifier(n) + sql.SQL(f" {pg}{' NOT NULL' if nn else ''}") for n, pg, nn in columns)


@dataclass(frozen=True)
class _Layout:
    """Table names and gold's columns in plain strings: it travels to the executors that stage rows."""

    schema: str | None
    name: str
    columns: tuple[tuple[str, str, bool], ...]  # gold's (name, PostgreSQL type, NOT NULL)
    key: tuple[str, ...]

    @classmethod
    def of(cls, target: Target) -> _Layout:
        columns = []
        # The gold's key and aggregates: a sketch merged into an approximate distinct count stays behind.
        for f in published_schema(target).fields[:-1]:  # gold_version is the egress's own column
            spark_type = f.dataType.simpleString()
            if spark_type not in PG_TYPES and not spark_type.startswith("decimal("):
                raise ValueError(f"gold column {f.name} is {spark_type}, which has no PostgreSQL type in PG_TYPES")
            columns.append((f.name, PG_TYPES.get(spark_type) or "numeric" + spark_type[7:], not f.nullable))
        schema, name = TABLE_PATTERN.fullmatch(target.destination).groups()
        return cls(schema, name, tuple(columns), tuple(target.gold.key))

    def qualified(self, suffix: str = "") -> str:
        return ".".join(filter(None, [self.schema, self.name + suffix]))

    def layouts(self) -> tuple[list, list, list]:
        """Columns of the table, of a COPY's rows (what _as_text renders) and of the staging table."""
        version = [(GOLD_VERSION, "bigint", True)]
        rows = [(n, pg, False) for n, pg, _ in self.columns] + version + [(DELETED, "boolean", True)]
        return [*self.columns, *version], rows, [("stream_id", "text", True), ("batch_id", "bigint", True), *rows]

    def sql(self, template: str, **parts: sql.Composable) -> sql.Composed:
        names = {part: sql.Identifier(*filter(None, [self.schema]), self.name + s) for part, s in TABLES.items()}
        names |= {part: sql.Identifier(self.name + s) for part, s in CONSTRAINTS.items()}  # never schema-qualified
        return sql.SQL(template).format(**names, key=_names(self.key), rows=sql.Identifier(ROWS), **parts)


def _copy_rows(cur: psycopg.Cursor, layout: _Layout, rows: Iterable) -> None:
    cur.execute(layout.sql(CREATE_ROWS, columns=_definitions(layout.layouts()[1])))
    with cur.copy(layout.sql("COPY {rows} FROM STDIN")) as copy:
        for row in rows:
            copy.write_row(row)


def _apply(cur: psycopg.Cursor, layout: _Layout, source: sql.Composable, params: tuple) -> None:
    """Upsert the live rows of ``source``, delete its deleted keys: the one apply SQL of both paths."""
    gold = [name for name, _, _ in layout.layouts()[0]]
    update = _names([name for name in gold if name not in layout.key], "{0} = EXCLUDED.{0}")
    cur.execute(layout.sql(UPSERT, gold=_names(gold), source=source, update=update), params)
    # = lets the key's index serve the match; IS NOT DISTINCT FROM (no index) only where a null must match a null.
    nullable = {name for name, _, not_null in layout.columns if not not_null}
    same = (sql.SQL("t.{0} IS NOT DISTINCT FROM s.{0}" if k in nullable else "t.{0} = s.{0}") for k in layout.key)
    match = sql.SQL(" AND ").join(test.format(sql.Identifier(k)) for test, k in zip(same, layout.key, strict=True))
    cur.execute(layout.sql(DELETE, source=source, match=match), params)


def _stage_partition(settings: PostgresEgressSettings, layout: _Layout, stream_id: str, batch_id: int, rows) -> None:
    # On an executor: the closure carries no password; it is read here (see PostgresEgressSettings).
    staged = [name for name, _, _ in layout.layouts()[1]]
    update = _names([name for name in staged if name not in layout.key], "{0} = EXCLUDED.{0}")
    with _connect(settings.on_executor()) as conn, conn.transaction(), conn.cursor() as cur:
        _copy_rows(cur, layout, rows)
        cur.execute(layout.sql(STAGE, staged=_names(staged), update=update), (stream_id, batch_id))


class PostgresEgress:
    """Applies batches of a gold's changes to its table, one transaction each; creating it creates the tables.

    ``target`` is the gold and its table (default: the first dataset's first gold, to ``settings.table``).

    Example::

        PostgresEgress(settings(config), stream_id).apply(changes_batch, batch_id=7)
    """

    def __init__(self, settings: PostgresEgressSettings, stream_id: str, target: Target | None = None) -> None:
        if not isinstance(settings, PostgresEgressSettings) or not TABLE_PATTERN.fullmatch(settings.table):
            raise TypeError(f"settings must be PostgresEgressSettings, not {settings!r}")
        if not stream_id or not isinstance(stream_id, str):
            raise ValueError("stream_id is needed: the marker row is keyed on it")
        if target is not None and not isinstance(target, Target):
            raise TypeError(f"target must be an egress Target, not {type(target).__name__}")
        self.settings, self.stream_id = settings, stream_id
        self.target = target or first_target(STREAM, settings.table)
        self.stream = self.target.stream
        layout = self.layout = _Layout.of(self.target)
        with _connect(settings) as conn, conn.transaction(), conn.cursor() as cur:
            target, _, staging = layout.layouts()
            cur.execute(layout.sql(CREATE_TABLE, columns=_definitions(target)))
            cur.execute(layout.sql(CREATE_MARKER))
            cur.execute(layout.sql(CREATE_STAGING, columns=_definitions(staging)))
            # An existing table is left as it is, so it must be the one this contract makes.
            for part, expected in (("table", target), ("staging", staging)):
                found = [tuple(row) for row in cur.execute(COLUMNS, [layout.sql("{" + part + "}").as_string(conn)])]
                if found != expected:
                    tables = ", ".join(layout.qualified(suffix) for suffix in TABLES.values())
                    raise TableSchemaError(
                        Refusal.POSTGRES_TABLE_LAYOUT.message(
                            self.stream,
                            table=layout.qualified(TABLES[part]),
                            found=found,
                            expected=expected,
                            tables=tables,
                        )
                    )

    def committed_batch(self) -> int | None:
        """The last batch id this stream id committed to the table; None before the first."""
        with _connect(self.settings) as conn:
            found = conn.execute(self.layout.sql(MARKED), [self.stream_id]).fetchone()
        return found and found[0]

    def apply(self, changes: DataFrame, batch_id: int) -> int:
        """Apply one batch of gold's change feed (see the class) in one transaction; its rows, 0 for a replay."""
        if not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"batch_id must be a batch number, not {batch_id!r}")
        latest = latest_per_window(changes, self.target.gold).persist()  # checks that changes is gold's change feed
        try:
            count, version = latest.agg(F.count(F.lit(1)), F.max(GOLD_VERSION)).first()
            rows, staged = _as_text(latest, self.layout), count > self.settings.stage_above_rows
            if staged:
                rows.foreachPartition(self.stager(batch_id))
                reach(self.stream, AFTER_STAGING, batch_id)
            applied = self._commit(batch_id, version, None if staged else rows)
        finally:
            latest.unpersist()
        outcome = EgressOutcome.COMMITTED if applied else EgressOutcome.ALREADY_COMMITTED
        report_egress_batch(self.stream, batch_id, outcome, count if applied else 0, f"table {self.target.destination}")
        return count if applied else 0

    def stager(self, batch_id: int) -> Callable[[Iterable], None]:
        """The function each executor runs on its partition of a staged batch: no secret in it.

        Example::

            rows.foreachPartition(egress.stager(batch_id=7))
        """
        return partial(_stage_partition, self.settings.for_executors(), self.layout, self.stream_id, batch_id)

    def _commit(self, batch_id: int, gold_version: int | None, rows: DataFrame | None) -> bool:
        # The batch's one transaction: marker first, then its rows from ``rows`` (COPY) or from staging (None).
        layout, stream = self.layout, self.stream_id
        with _connect(self.settings) as conn, conn.transaction(), conn.cursor() as cur:
            marker = self._lock_marker(cur, batch_id)
            if marker == batch_id:
                cur.execute(layout.sql(CLEAR_STAGED), (stream, batch_id))  # a replay: only what it staged goes
                return False
            if marker is None:
                cur.execute(layout.sql(FIRST_MARKER), (stream, batch_id, gold_version))
            else:
                cur.execute(layout.sql(MOVE_MARKER), (batch_id, gold_version, stream))
            if batch_id == 0:
                # Gold's full snapshot for a new stream id: afterwards the table holds exactly gold's rows.
                cur.execute(layout.sql("DELETE FROM {table}"))
                cur.execute(layout.sql("DELETE FROM {marker} WHERE stream_id <> %s"), [stream])
                cur.execute(layout.sql("DELETE FROM {staging} WHERE stream_id <> %s"), [stream])
            if rows is not None:
                _copy_rows(cur, layout, rows.toLocalIterator())
            source, params = (STAGED_BATCH, (stream, batch_id)) if rows is None else ("SELECT * FROM {rows}", ())
            _apply(cur, layout, layout.sql(source), params)
            # Also what an earlier attempt, a late speculative task or a lower threshold left behind.
            cur.execute(layout.sql(CLEAR_STAGED), (stream, batch_id))
            reach(self.stream, AFTER_PRE_COMMIT, batch_id)
        return True

    def _lock_marker(self, cur: psycopg.Cursor, batch_id: int) -> int | None:
        """The stream's marker, locked until COMMIT; CheckpointError unless it is at this batch or the one before.

        Batch 0 of a stream id is the one batch that finds no marker. Anything else means the row was
        deleted, restored or rolled back while the stream ran (or another stream id's batch 0 took the
        table over): moving it on, or making it again, would add this batch's changes to a table that
        does not hold the batches before.
        """
        try:
            found = cur.execute(self.layout.sql(LOCK_MARKER), [self.stream_id]).fetchone()
        except psycopg.errors.LockNotAvailable:
            raise self._lock_timeout() from None
        marker = found[0] if found else None
        expected = batch_id - 1 if batch_id > 0 else None
        if marker in (batch_id, expected):
            return marker
        raise CheckpointError(
            Refusal.POSTGRES_MARKER_MOVED.message(
                self.stream,
                marker=self.layout.qualified(MARKER),
                stream_id=self.stream_id,
                found="no row" if marker is None else f"batch {marker}",
                batch=batch_id,
                expected="no row" if expected is None else f"batch {expected}",
            )
        )

    def _lock_timeout(self) -> TimeoutError:
        # Asked on a new session: the one that waited is aborted. Not a refusal: a retry may pass.
        with _connect(self.settings) as conn:
            holders = conn.execute(self.layout.sql(HOLDERS), [self.stream_id]).fetchall()
        held = "; ".join(f"pid {pid} ({state}, in its transaction for {age})" for pid, state, age in holders)
        return TimeoutError(
            f"{SECTION}.lock_timeout: waited {self.settings.lock_timeout} for the marker row of stream "
            f"{self.stream_id} in {self.layout.qualified(MARKER)}, held by {held or 'another session'}: "
            "another process writes this table with the same stream id. Stop it, or raise lock_timeout"
        )


def check_connection(config: Config) -> None:
    """Log in once with the configured settings; ConfigError names the setting to fix, never the password.

    Example::

        check_connection(config)  # before Spark starts: a refused login stops the run with exit 2
    """
    checked = settings(config)
    try:
        with _connect(checked) as conn:
            if conn.info.server_version < 150000:  # UNIQUE NULLS NOT DISTINCT: a null dimension is still one key
                raise ConfigError(f"{SECTION}.dsn: the server runs PostgreSQL before 15; the egress needs 15 or later")
    except psycopg.OperationalError as error:
        reason = " ".join(str(error).split())  # libpq's: it names host and user, never the password
        if not AUTH_FAILED.search(reason):
            raise ConfigError(f"{SECTION}.dsn: cannot connect with {checked.dsn!r}: {reason}") from None
        fix = f"put its password in the file named there (or EGRESS_POSTGRES_PASSWORD_FILE), or in {PASSWORD_VAR}"
        user = conninfo_to_dict(checked.dsn).get("user")
        raise ConfigError(f"{SECTION}.password_file: PostgreSQL refused user {user!r} ({reason}); {fix}") from None


def fence(config: Config, stream_id: str) -> None:
    """Nothing to do: the database fences an old stream itself (kept for symmetry with kafka.py).

    A process of the old stream still inside its transaction holds its marker row's lock; the
    new stream's first batch deletes that row and the table's rows, so it waits for that
    transaction to end (``idle_in_transaction_timeout`` at most) and then replaces the table with
    gold's snapshot. A transaction of the old stream that begins later finds no marker and is refused.

    Example::

        fence(config, "6f1c...")  # does nothing
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")


def provision_local(config: Config) -> None:
    """Nothing to provision: the stream creates its tables when it starts (kept for symmetry with kafka.py).

    Example::

        provision_local(config)  # does nothing
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")


def describe(config: Config, target: Target | None = None) -> dict:
    """Where the egress writes ``target`` (default: the first gold); the dsn holds no password (the settings
    refuse one there).

    Example::

        describe(config)  # {"table": "gold_event_windows", "marker_table": "gold_event_windows_egress_batches", ...}
    """
    layout = _Layout.of(target or first_target(STREAM, settings(config).table))
    return {"table": layout.qualified(), "marker_table": layout.qualified(MARKER), "dsn": settings(config).dsn}


def read_back(spark: SparkSession, config: Config, target: Target | None = None) -> DataFrame:
    """The table of ``target`` (default: the first gold) as its readers see it, for the audit: the gold's
    key and aggregates, and gold_version.

    Example::

        read_back(spark, config).orderBy("window_start").show()
    """
    target = target or first_target(STREAM, settings(config).table)
    schema = published_schema(target)
    rows = _read(config, target, "SELECT {gold} FROM {table}", gold=_names(schema.names))
    return spark.createDataFrame(rows, schema)  # through the driver: a mirror is gold's size; values arrive exact


def audit_errors(spark: SparkSession, config: Config, target: Target | None = None) -> dict[str, int]:
    """Wrong besides the rows: markers of other stream ids in ``target``'s marker table, whose batch 0 deletes
    them (a second writer). The key names the stream: ``<stream>_markers_of_other_streams``.

    Example::

        audit_errors(spark, config)  # {"postgres_egress_markers_of_other_streams": 0}
    """
    target = target or first_target(STREAM, settings(config).table)
    [(markers,)] = _read(config, target, "SELECT count(*) FROM {marker}") or [(0,)]
    return {MARKERS_OF_OTHER_STREAMS.replace(STREAM, target.stream, 1): max(markers - 1, 0)}


def settings(config: Config) -> PostgresEgressSettings:
    """This egress's settings in ``config`` (parsed by ``egress.configure``); ValueError when it is off.

    Example::

        settings(config).table  # "gold_event_windows"
    """
    return section_settings(config, STREAM, PostgresEgressSettings)


def _read(config: Config, target: Target, query: str, **parts: sql.Composable) -> list[tuple]:
    layout = _Layout.of(target)
    with _connect(settings(config)) as conn:
        # Reading changes nothing: before the stream's first start there are no tables, and no rows.
        if conn.execute("SELECT to_regclass(%s)", [layout.sql("{marker}").as_string(conn)]).fetchone()[0] is None:
            return []
        return conn.execute(layout.sql(query, **parts)).fetchall()


def start(spark: SparkSession, config: Config, lakehouse: Lakehouse, stream_id: str, target: Target | None = None):
    """The writer of the stream that mirrors ``target`` (default: the first gold), a transaction per
    micro-batch; CheckpointError if marker and checkpoint disagree.

    Example::

        start(spark, config, lakehouse, prepared.stream_id).option("checkpointLocation", path).start()
    """
    if not isinstance(lakehouse, Lakehouse):
        raise TypeError(f"lakehouse must be a Lakehouse, not {type(lakehouse).__name__}")
    target = target or first_target(STREAM, settings(config).table)
    stream = target.stream
    check_changes_readable(spark, lakehouse, stream, target.gold_table)
    egress = PostgresEgress(settings(config), stream_id, target)
    marker, checkpoint = egress.committed_batch(), lakehouse.checkpoint(stream)
    planned, done = last_planned_batch(spark, checkpoint), last_committed_batch(spark, checkpoint)
    ahead = marker is not None and (planned is None or marker > planned)
    # Each batch moves the marker before Spark logs the batch committed: a marker behind it means lost batches.
    behind = done is not None and (marker is None or marker < done)
    if ahead or behind:
        raise CheckpointError(
            Refusal.POSTGRES_MARKER_MISMATCH.message(
                stream,
                marker=egress.layout.qualified(MARKER),
                batch=marker,
                stream_id=stream_id,
                checkpoint=checkpoint,
                planned=planned,
                committed=done,
                older="checkpoint" if ahead else "table",
                newer="table" if ahead else "checkpoint",
            )
        )

    def write_batch(changes: DataFrame, batch_id: int) -> None:
        with crash_points(changes.sparkSession, stream, batch_id):
            check_held(lakehouse, stream)
            egress.apply(changes, batch_id)
        check_held(lakehouse, stream)  # before Spark's commit-log entry

    return gold_changes(spark, lakehouse, target.gold_table).writeStream.foreachBatch(write_batch)
