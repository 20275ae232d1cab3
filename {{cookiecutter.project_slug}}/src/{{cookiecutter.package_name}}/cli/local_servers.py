"""The one resolver of development servers: a config that names "local" gets the running server's address.

`kafka-local start` runs a broker and the bootstrap "local" names it; `registry-local start` runs a schema
registry and schema_registry.url "local" names it; `postgres-local start` (with a PostgreSQL egress) runs
a server and the egress DSN "local" names it. The pipeline never sees "local"
(``kafka/clients.py`` refuses it) and never imports the development tools: they are resolved here, once,
at the edge. The `kafka-local` and `registry-local` commands live here too.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from pydantic import SecretStr

from ..pipeline.config import LOCAL_BOOTSTRAP, LOCAL_ENDPOINT, LOCAL_REGISTRY, Config, ConfigError, read_secret
from .exit_codes import ExitCode

# The PostgreSQL development server's part of the command line: a bake without the PostgreSQL egress
# has no such module, and nothing to resolve.
POSTGRES_LOCAL = f"{__package__}.postgres_local"


def uses_local_broker(config: Config) -> bool:
    """The config names the development broker (bootstrap "local"), not a cluster."""
    return config.kafka.bootstrap_servers == LOCAL_BOOTSTRAP


def uses_local_s3(config: Config) -> bool:
    """The lakehouse is on S3 and the config names the development server (endpoint "local")."""
    from ..pipeline.session.s3 import is_s3

    return config.s3.endpoint == LOCAL_ENDPOINT and is_s3(config.lakehouse_root)


def resolve(config: Config, egress: bool = True, registry: bool | None = None) -> Config:
    """The config with every "local" server replaced by the running one's address (and credentials).

    ``egress`` False leaves the egress sinks' "local" as it is (a command that never reaches them);
    ``registry`` says whether the schema registry is needed (default: ``needs_registry``).
    Raises ConfigError naming the setting when it says "local" and no such server runs.

    Example::

        resolve(configure(load_config("local"))).kafka.bootstrap_servers  # "127.0.0.1:39092"
    """
    config = resolve_local_registry(resolve_local_s3(resolve_local_bootstrap(config)), registry)
    postgres = _postgres_local() if egress else None
    return config if postgres is None else postgres.resolve_local_postgres(config)


def resolve_local_bootstrap(config: Config) -> Config:
    """The config with bootstrap "local" replaced by the address of the running development broker."""
    if not uses_local_broker(config):
        return config
    from ..devtools.kafka_local import running_bootstrap

    bootstrap = running_bootstrap(config.kafka_local_home)
    if bootstrap is None:
        raise ConfigError(
            f"kafka.bootstrap_servers: is 'local' but no local broker runs in {config.kafka_local_home}; "
            "start one with `kafka-local start` or set KAFKA_BOOTSTRAP_SERVERS"
        )
    return config.model_copy(update={"kafka": config.kafka.model_copy(update={"bootstrap_servers": bootstrap})})


def resolve_local_s3(config: Config) -> Config:
    """The config with s3.endpoint "local" replaced by the running `s3-local` server (and its credentials file).

    Only for a lakehouse root on S3; raises ConfigError naming s3.endpoint when no such server runs.
    """
    if not uses_local_s3(config):
        return config
    from ..devtools.s3_local import LocalS3

    server = LocalS3(config.s3_local_home)
    endpoint = server.endpoint
    if endpoint is None:
        raise ConfigError(
            f"s3.endpoint: is 'local' but no local S3 server runs in {config.s3_local_home}; "
            "start one with `s3-local start` or set S3_ENDPOINT"
        )
    s3 = config.s3.model_copy(
        update={"endpoint": endpoint, "path_style_access": True, "credentials_file": str(server.credentials_file)}
    )
    return config.model_copy(update={"s3": s3})


def needs_registry(config: Config, datasets: tuple | None = None) -> bool:
    """Whether a dataset the config runs (or one of ``datasets``) names its writer schemas in the registry:
    a dataset in Avro or Protobuf.

    Example::

        needs_registry(config)  # True when the orders dataset, in Avro, runs
    """
    from ..pipeline.datasets import running
    from ..pipeline.formats import Format

    return any(each.format is not Format.JSON for each in (running(config) if datasets is None else datasets))


def resolve_local_registry(config: Config, needed: bool | None = None) -> Config:
    """The config with schema_registry.url "local" replaced by the URL of the running `registry-local` registry,
    when a registry is ``needed`` (default: ``needs_registry``); else unchanged, so that a command running JSON
    datasets alone needs no registry.

    Raises ConfigError naming schema_registry.url when it is needed and no such registry runs.
    """
    if config.schema_registry.url != LOCAL_REGISTRY:
        return config
    if not (needs_registry(config) if needed is None else needed):
        return config
    from ..devtools.registry_local import LocalRegistry

    status = LocalRegistry(config.registry_local_home).status()
    if status is None:
        raise ConfigError(
            f"schema_registry.url: is 'local' but no local schema registry runs in {config.registry_local_home}; "
            "start one with `registry-local start` or set SCHEMA_REGISTRY_URL"
        )
    update: dict = {"url": status["url"]}
    if "ca" in status:
        # A secure one (`registry-local start --secure`): its CA and its one user, the password read from its file.
        update.update(
            ssl_ca_location=status["ca"],
            basic_auth_username=status["user"],
            basic_auth_password_file=status["password_file"],
            basic_auth_password=SecretStr(read_secret(status["password_file"], "basic_auth_password_file")),
            bearer_token=None,
            bearer_token_file=None,
        )
    return config.model_copy(update={"schema_registry": config.schema_registry.model_copy(update=update)})


def private_servers(config: Config, workdir: Path, stack: ExitStack) -> Config:
    """For a chaos run: private servers under ``workdir`` for each "local" one that does not run; then resolved.

    The servers started here are stopped when ``stack`` closes.
    """
    if uses_local_broker(config):
        from ..devtools.kafka_local import LocalKafka, running_bootstrap

        if running_bootstrap(config.kafka_local_home) is None:
            broker = LocalKafka(workdir / "kafka")
            kafka = config.kafka.model_copy(update={"bootstrap_servers": broker.start()})
            stack.callback(broker.stop)
            config = config.model_copy(update={"kafka": kafka})
    if uses_local_s3(config):
        from ..devtools.s3_local import LocalS3

        if LocalS3(config.s3_local_home).endpoint is None:
            server = LocalS3(workdir / "s3")
            server.start()
            stack.callback(server.stop)
            config = config.model_copy(update={"s3_local_home": server.home})
    # A run drives every declared dataset, whatever PIPELINE_DATASETS says in this process.
    from ..pipeline.datasets import DATASETS

    registry_needed = needs_registry(config, DATASETS)
    if config.schema_registry.url == LOCAL_REGISTRY and registry_needed:
        from ..devtools.registry_local import LocalRegistry, running_url

        if running_url(config.registry_local_home) is None:
            registry = LocalRegistry(workdir / "registry")
            registry.start()
            stack.callback(registry.stop)
            config = config.model_copy(update={"registry_local_home": registry.home})
    postgres = _postgres_local()
    if postgres is not None:
        config = postgres.private_postgres(config, workdir, stack)
    return resolve(config, registry=registry_needed)


def start_stop_or_status(server, command: str, action: str, secret_file: tuple[str, Path]) -> int:
    """`start`, `stop` and `status` of a development server that keeps a secret in a file (postgres-local,
    s3-local): `start` prints the address, then where the secret is (``secret_file``: label, path), never
    the secret itself."""
    if action != "start":
        return stop_or_status(server, action)
    try:
        print(server.start())
    except RuntimeError as error:
        print(f"{command}: {error}", file=sys.stderr)
        return ExitCode.FAILED
    label, path = secret_file
    print(f"{label}: {path}")
    return ExitCode.OK


def stop_or_status(server, action: str) -> int:
    """`stop` and `status` of a development server (kafka-local, postgres-local): the same words, exit codes."""
    if action == "stop":
        print("stopped" if server.stop() else "not running")
        return ExitCode.OK
    status = server.status()
    print(json.dumps(status, default=str) if status else "not running")
    return ExitCode.OK if status else ExitCode.FAILED


def register(commands) -> None:
    local = commands.add_parser("kafka-local", help="a single-node Kafka broker for development")
    local.add_argument("action", choices=["start", "stop", "status"])
    local.add_argument(
        "--secure",
        action="store_true",
        help="start: also listen with SASL_SSL (PLAIN, SCRAM) and with mutual TLS, on certificates made on first start",
    )
    local.set_defaults(handler=kafka_local)
    registry = commands.add_parser("registry-local", help="a schema registry (Apicurio) for development")
    registry.add_argument("action", choices=["start", "stop", "status"])
    registry.add_argument(
        "--secure",
        action="store_true",
        help="start: https only, on a private CA made on first start, and HTTP basic auth demanded",
    )
    registry.set_defaults(handler=registry_local)
    postgres = _postgres_local()
    if postgres is not None:
        postgres.register(commands)


def kafka_local(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.kafka_local import LocalKafka

    broker = LocalKafka(config.kafka_local_home)
    if args.action == "start":
        try:
            print(broker.start(secure=args.secure))
        except RuntimeError as error:
            print(f"kafka-local: {error}", file=sys.stderr)
            return ExitCode.FAILED
        secure = broker.secure_listeners()
        if args.secure and secure:
            from ..devtools.kafka_secure import client_instructions

            print(client_instructions(secure))
        return ExitCode.OK
    return stop_or_status(broker, args.action)


def registry_local(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.registry_local import LocalRegistry

    registry = LocalRegistry(config.registry_local_home)
    if args.action == "start":
        try:
            print(registry.start(secure=args.secure))
        except RuntimeError as error:
            print(f"registry-local: {error}", file=sys.stderr)
            return ExitCode.FAILED
        status = registry.status()
        if status and "ca" in status:
            # What a client outside this project needs; with url "local" the project finds it by itself.
            print(
                f"SCHEMA_REGISTRY_SSL_CA_LOCATION={status['ca']}\n"
                f"SCHEMA_REGISTRY_BASIC_AUTH_USERNAME={status['user']}\n"
                f"SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD_FILE={status['password_file']}"
            )
        return ExitCode.OK
    return stop_or_status(registry, args.action)


def _postgres_local():
    """The PostgreSQL development server's command-line module, or None in a bake without it."""
    if importlib.util.find_spec(POSTGRES_LOCAL) is None:
        return None
    return importlib.import_module(POSTGRES_LOCAL)
