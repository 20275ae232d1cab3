"""The local PostgreSQL server itself: a real server in tmp_path, stopped and started again."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from {{ cookiecutter.package_name }}.devtools.postgres_local import LocalPostgres, running_dsn


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[LocalPostgres]:
    server = LocalPostgres(tmp_path / "postgres")
    yield server
    server.stop()


def connect(dsn: str, password: str) -> psycopg.Connection:
    return psycopg.connect(dsn, password=password, connect_timeout=10)


def test_server_lifecycle(postgres: LocalPostgres) -> None:
    dsn = postgres.start()
    assert dsn.startswith("host=127.0.0.1 port=") and dsn.endswith(" dbname=lakehouse user=pipeline")
    assert "password" not in dsn
    for secret in (postgres.password_file, postgres.home / "postgres.password"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    password = postgres.password_file.read_text().strip()

    with connect(dsn, password) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == ("pipeline", "lakehouse")
        conn.execute("create table events (id int primary key, name text)")
        conn.execute("insert into events values (1, 'click')")
    with connect(dsn, password) as conn:
        assert conn.execute("select id, name from events").fetchall() == [(1, "click")]

    pid = postgres.status()["pid"]
    assert postgres.start() == dsn
    assert postgres.status()["pid"] == pid
    assert running_dsn(postgres.home) == dsn

    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        connect(dsn, password + "x")

    assert postgres.stop() is True
    assert postgres.status() is None
    assert postgres.dsn is None
    assert postgres.stop() is False
    with pytest.raises(psycopg.OperationalError):
        connect(dsn, password)

    assert postgres.start() == dsn
    assert postgres.status()["pid"] != pid
    with connect(dsn, password) as conn:
        assert conn.execute("select id, name from events").fetchall() == [(1, "click")]


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="home must be a path"):
        LocalPostgres(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be positive"):
        LocalPostgres(tmp_path).start(timeout=0)
    with pytest.raises(TypeError, match="timeout must be a number"):
        LocalPostgres(tmp_path).stop(timeout="soon")  # type: ignore[arg-type]
