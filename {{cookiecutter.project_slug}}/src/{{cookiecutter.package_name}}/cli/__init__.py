"""Command line: a thin layer over the pipeline, the development tools and the benchmark.

One module per command group, its parser and its handlers together:

* ``streams.py``: `run`, `describe`, `show`;
* ``audit.py``: `audit`;
* ``checkpoints.py``: `checkpoints list`, `checkpoints reset`;
* ``quarantine.py``: `quarantine replay`;
* ``local_servers.py``: `kafka-local`, `registry-local` (and ``postgres_local.py``: `postgres-local`,
  with a PostgreSQL egress), and the one resolver of "local" development servers; ``s3_local.py``:
  `s3-local`;
* ``schemas.py``: `describe-schema`;
* ``dev.py``: `produce-sample`, `demo`, `chaos`, `nemesis`, `bench`, `setup`.

``connect.py`` is what a command does before its work (servers resolved, Kafka reached, egress sinks
checked, Spark built); ``exit_codes.py`` is the one table of exit codes. Development modules are imported
inside the handlers that need them, so `run` in production loads the pipeline only.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ..pipeline.config import ConfigError, load_config
from ..pipeline.delta.tables import TableSchemaError
from ..pipeline.egress import configure
from ..pipeline.recovery.checkpoints import CheckpointError
from . import audit, checkpoints, dev, local_servers, quarantine, s3_local, schemas, streams
from .exit_codes import ExitCode

GROUPS = (streams, audit, checkpoints, quarantine, local_servers, s3_local, schemas, dev)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Exactly-once medallion streaming pipeline: Kafka to Delta Lake.")
    parser.add_argument("--env", help="config environment (default: $PIPELINE_ENV or 'local')")
    parser.add_argument("--config", help="config file replacing the packaged one ($PIPELINE_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # py4j logs every call the JVM makes into Python (each foreachBatch) at INFO: noise in every
    # pipeline log and the demo's output. Its warnings and errors still show.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # So does the HTTP client of confluent-kafka's schema registry client (httpx2) at each request.
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    try:
        # Every table checked, the egresses' too, before a command does anything: a bad key exits 2.
        config = configure(load_config(args.env, args.config))
        return int(args.handler(config, args))
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except (CheckpointError, TableSchemaError) as error:
        print(f"refusing to start: {error}", file=sys.stderr)
        return ExitCode.REFUSED
