"""The command line's egress edge: the checks before a run{% if cookiecutter.egress in ["both", "postgres"] %} and the development PostgreSQL server{% endif %}.

Kept apart from cli.py for length.{% if cookiecutter.egress in ["both", "postgres"] %} Like the Kafka bootstrap "local", an egress DSN "local"
is resolved here, once, to the server `postgres-local start` runs; the pipeline never
imports the development tools.{% endif %}
"""

from __future__ import annotations
{% if cookiecutter.egress in ["both", "postgres"] %}
import argparse
import dataclasses
import sys
from contextlib import ExitStack
from pathlib import Path

from .pipeline.config import Config, ConfigError

POSTGRES = "postgres_egress"
LOCAL_DSN = "local"
DEFAULT_LOCAL_HOME = ".postgres-local"


def add_local_server_commands(commands) -> None:
    """`postgres-local start|stop|status`: the development server the PostgreSQL egress writes to."""
    local = commands.add_parser("postgres-local", help="a PostgreSQL server for development (the egress's target)")
    local.add_argument("action", choices=["start", "stop", "status"])
{%- else %}
import argparse
from contextlib import ExitStack
from pathlib import Path

from .pipeline.config import Config, ConfigError


def add_local_server_commands(commands) -> None:
    """No development server to add: this project has no PostgreSQL egress."""
{%- endif %}


def prepare_egress(config: Config, args: argparse.Namespace) -> Config:
    """Before `run`, `audit` or `show` of an egress: resolve a "local" DSN, create the development output
    topic for a `run` on the local broker, and check every egress sink.

    Raises ConfigError naming the setting when an egress asked for is off, or its sink cannot be
    reached or refuses the login.
    """
    from .pipeline.egress import configured, installed_names

    asked = getattr(args, "layer", None) or getattr(args, "table", None)
    if asked in installed_names() and asked not in config.egress:
        raise ConfigError(f"{asked}: is off: its config section is missing or PIPELINE_EGRESS leaves it out")
    config = resolve_local_postgres(config)
    for module in configured(config).values():
        if args.local_broker and args.command == "run":
            module.provision_local(config)
        module.check_connection(config)
    return config


def show_egress(config: Config, stream: str, limit: int, spark) -> int:
    """Print what an egress's sink holds, read back as its consumers see it (gold's columns and gold_version)."""
    from .pipeline.contract import EVENTS
    from .pipeline.egress import configured

    modules = configured(config)  # prepare_egress refused an egress that is off
    rows = modules[stream].read_back(spark, config)
    where = ", ".join(f"{key} {value}" for key, value in modules[stream].describe(config).items())
    print(f"{stream} ({where}): {rows.count()} rows")
    rows.orderBy(*EVENTS.gold_key).show(limit, truncate=False)
    return 0
{%- if cookiecutter.egress in ["both", "postgres"] %}


def _local_home(config: Config) -> Path:
    settings = config.egress.get(POSTGRES)
    return Path(settings.local_home if settings is not None else DEFAULT_LOCAL_HOME).expanduser()


def resolve_local_postgres(config: Config) -> Config:
    """The config with an egress DSN "local" replaced by the running development server's, and its password."""
    settings = config.egress.get(POSTGRES)
    if settings is None or settings.dsn != LOCAL_DSN:
        return config
    from .devtools.postgres_local import LocalPostgres, running_dsn

    home = _local_home(config)
    dsn = running_dsn(home)
    if dsn is None:
        raise ConfigError(
            f"egress_postgres.dsn: is 'local' but no local PostgreSQL runs in {home}; start one with "
            "`postgres-local start`, or set EGRESS_POSTGRES_DSN and EGRESS_POSTGRES_PASSWORD"
        )
    password = LocalPostgres(home).password_file.read_text().strip()
    resolved = dataclasses.replace(settings, dsn=dsn, password=password)
    return dataclasses.replace(config, egress={**config.egress, POSTGRES: resolved})


def cmd_postgres_local(config: Config, args: argparse.Namespace) -> int:
    from .devtools.postgres_local import LocalPostgres

    server = LocalPostgres(_local_home(config))
    if args.action == "start":
        try:
            print(server.start())
        except RuntimeError as error:
            print(f"postgres-local: {error}", file=sys.stderr)
            return 1
        print(f"password file: {server.password_file}")
        return 0
    from .cli import stop_or_status

    return stop_or_status(server, args.action)


def private_egress_servers(config: Config, workdir: Path, stack: ExitStack) -> Config:
    """For a chaos run: a private PostgreSQL under ``workdir`` when the egress DSN is "local" and none runs.

    The server is stopped when ``stack`` closes.
    """
    settings = config.egress.get(POSTGRES)
    if settings is None or settings.dsn != LOCAL_DSN:
        return config
    from .devtools.postgres_local import LocalPostgres, running_dsn

    if running_dsn(_local_home(config)) is None:
        settings = dataclasses.replace(settings, local_home=str(workdir / "postgres"))
        config = dataclasses.replace(config, egress={**config.egress, POSTGRES: settings})
        server = LocalPostgres(_local_home(config))
        server.start()
        stack.callback(server.stop)
    return resolve_local_postgres(config)


LOCAL_SERVER_COMMANDS = {"postgres-local": cmd_postgres_local}
{%- else %}


def resolve_local_postgres(config: Config) -> Config:
    return config


def private_egress_servers(config: Config, workdir: Path, stack: ExitStack) -> Config:
    return config


LOCAL_SERVER_COMMANDS: dict = {}
{%- endif %}
