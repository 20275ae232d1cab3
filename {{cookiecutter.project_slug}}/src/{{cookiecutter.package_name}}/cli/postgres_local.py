"""`postgres-local start|stop|status`, and the egress DSN "local" resolved to the server it runs.

Like the Kafka bootstrap "local" (``local_servers.py``), the DSN "local" is resolved once, at the
edge; the pipeline never imports the development tools.
"""

from __future__ import annotations

import argparse
from contextlib import ExitStack
from pathlib import Path

from ..pipeline.config import Config, ConfigError, load_section
from ..pipeline.egress import settings_of

POSTGRES, SECTION = "postgres_egress", "egress_postgres"
LOCAL_DSN = "local"
DEFAULT_LOCAL_HOME = ".postgres-local"


def register(commands) -> None:
    """`postgres-local start|stop|status`: the development server the PostgreSQL egress writes to."""
    local = commands.add_parser("postgres-local", help="a PostgreSQL server for development (the egress's target)")
    local.add_argument("action", choices=["start", "stop", "status"])
    local.set_defaults(handler=postgres_local)


def postgres_local(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.postgres_local import LocalPostgres
    from .local_servers import start_stop_or_status

    server = LocalPostgres(_local_home(config))
    return start_stop_or_status(server, "postgres-local", args.action, ("password file", server.password_file))


def resolve_local_postgres(config: Config) -> Config:
    """The config with an egress DSN "local" replaced by the running development server's, and its password.

    Example::

        settings_of(resolve_local_postgres(config))["postgres_egress"].dsn  # "host=127.0.0.1 port=... user=..."
    """
    settings = _settings(config)
    if settings is None or settings.dsn != LOCAL_DSN:
        return config
    from ..devtools.postgres_local import LocalPostgres, running_dsn

    home = _local_home(config)
    dsn = running_dsn(home)
    if dsn is None:
        raise ConfigError(
            f"egress_postgres.dsn: is 'local' but no local PostgreSQL runs in {home}; start one with "
            "`postgres-local start`, or set EGRESS_POSTGRES_DSN and EGRESS_POSTGRES_PASSWORD"
        )
    # As if the table named the server and its password file: checked and read by the egress's own model.
    password_file = str(LocalPostgres(home).password_file)
    table = {**settings.model_dump(exclude={"password"}), "dsn": dsn, "password_file": password_file}
    resolved = load_section(type(settings), table, {}, SECTION)
    return config.model_copy(update={"egress": {**settings_of(config), POSTGRES: resolved}})


def private_postgres(config: Config, workdir: Path, stack: ExitStack) -> Config:
    """For a chaos run: a private PostgreSQL under ``workdir`` when the egress DSN is "local" and none runs.

    The server is stopped when ``stack`` closes; the DSN is left "local" for ``resolve_local_postgres``.
    """
    settings = _settings(config)
    if settings is None or settings.dsn != LOCAL_DSN:
        return config
    from ..devtools.postgres_local import LocalPostgres, running_dsn

    if running_dsn(_local_home(config)) is None:
        settings = settings.model_copy(update={"local_home": str(workdir / "postgres")})
        config = config.model_copy(update={"egress": {**settings_of(config), POSTGRES: settings}})
        server = LocalPostgres(_local_home(config))
        server.start()
        stack.callback(server.stop)
    return config


def _settings(config: Config):
    """The PostgreSQL egress's settings, None when the config leaves it off."""
    return settings_of(config).get(POSTGRES)


def _local_home(config: Config) -> Path:
    # postgres-local works with the egress off too (PIPELINE_EGRESS=none): then in the default home.
    settings = _settings(config)
    return Path(settings.local_home if settings is not None else DEFAULT_LOCAL_HOME).expanduser()
