"""`describe-schema`: the contract fields that read a subject's latest schema in the schema registry, to
paste into a dataset's module instead of typing a schema the registry already holds."""

from __future__ import annotations

import argparse
import sys

from ..pipeline.config import Config, ConfigError
from .exit_codes import ExitCode
from .local_servers import resolve_local_registry


def register(commands) -> None:
    parser = commands.add_parser(
        "describe-schema", help="the contract fields that read a subject's latest schema in the schema registry"
    )
    parser.add_argument("subject", help="a subject of the registry, e.g. orders-value")
    parser.set_defaults(handler=describe_schema)


def describe_schema(config: Config, args: argparse.Namespace) -> int:
    from ..pipeline.formats.avro import contract_fields
    from ..pipeline.formats.registry import RegistryAccess, RegistryUnavailable, WriterSchemas

    config = resolve_local_registry(config, needed=True)
    url = config.schema_registry.url
    if not url:
        raise ConfigError(
            "schema_registry.url: not set: name the registry to read the subject from (SCHEMA_REGISTRY_URL)"
        )
    try:
        latest = WriterSchemas(RegistryAccess.of(config.schema_registry)).latest(args.subject)
    except RegistryUnavailable as error:
        raise ConfigError(str(error)) from None
    if latest is None:
        print(f"describe-schema: subject {args.subject} has no schema in the registry", file=sys.stderr)
        return ExitCode.FAILED
    try:
        fields = contract_fields(latest)
    except ValueError as error:
        print(f"describe-schema: subject {args.subject}: {error}", file=sys.stderr)
        return ExitCode.FAILED
    print(f"# The fields that read subject {args.subject}'s latest schema (id {latest.schema_id}):")
    for line in fields:
        print(line)
    return ExitCode.OK
