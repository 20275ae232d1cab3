"""Command line: a thin layer over the pipeline, the development tools and the benchmark.

This is the edge where the development broker meets the pipeline: a config whose
bootstrap is "local" is resolved here, once, to the broker `kafka-local start` runs.
Development modules are imported inside the commands that need them, so `run` in
production loads the pipeline only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from .audit_command import add_audit_command
from .audit_command import cmd_audit as run_audit_command
from .egress_commands import (
    LOCAL_SERVER_COMMANDS,
    add_local_server_commands,
    prepare_egress,
    private_egress_servers,
    show_egress,
)
from .pipeline import checkpoints
from .pipeline.config import LOCAL_BOOTSTRAP, Config, ConfigError, load_config
from .pipeline.egress import installed_names
from .pipeline.tables import TableSchemaError

EXIT_CONFIG = 2
EXIT_UNSAFE_START = 3
# Commands that talk to Kafka through the configured brokers. chaos and bench start a
# private broker when none runs, so they resolve "local" themselves.
NEEDS_KAFKA = {"run", "produce-sample", "audit"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--env", help="config environment (default: $PIPELINE_ENV or 'local')")
    parser.add_argument("--config", help="config file replacing the packaged one ($PIPELINE_CONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run pipeline streams")
    run.add_argument("--layer", choices=["bronze", "silver", "gold", *installed_names(), "all"], default="all")
    run.add_argument("--available-now", action="store_true", help="process everything available, then exit 0")

    produce = commands.add_parser("produce-sample", help="produce sample events to the first configured topic")
    produce.add_argument("--count", type=int, required=True)
    produce.add_argument("--malformed-ratio", type=float, default=0.0)
    produce.add_argument("--seed", type=int, default=7)

    describe = commands.add_parser("describe", help="streams, tables and checkpoints")
    describe.add_argument("--json", action="store_true")

    add_audit_command(commands)

    cps = commands.add_parser("checkpoints", help="list or reset stream checkpoints")
    cp_actions = cps.add_subparsers(dest="action", required=True)
    cp_list = cp_actions.add_parser("list", help="each stream's checkpoint progress against its sink tables")
    cp_list.add_argument("--json", action="store_true")
    reset = cp_actions.add_parser("reset", help="reset a stream and everything downstream of it")
    reset.add_argument("stream", choices=["bronze", "silver", "gold", *installed_names()])
    reset.add_argument("--yes", action="store_true", help="do not ask (required when not on a terminal)")
    reset.add_argument("--only", action="store_true", help="this stream only; downstream goes on (tables intact)")

    show = commands.add_parser("show", help="print a table")
    show.add_argument("table", choices=["bronze", "silver", "quarantine", "gold", *installed_names()])
    show.add_argument("--limit", type=int, default=20)

    local = commands.add_parser("kafka-local", help="a single-node Kafka broker for development")
    local.add_argument("action", choices=["start", "stop", "status"])
    local.add_argument(
        "--secure",
        action="store_true",
        help="start: also listen with SASL_SSL (PLAIN, SCRAM) and with mutual TLS, on certificates made on first start",
    )

    add_local_server_commands(commands)

    chaos = commands.add_parser(
        "chaos", help="kill and restart the pipeline at random while producing, then check exactly-once"
    )
    chaos.add_argument("--kills", type=int, default=10)
    chaos.add_argument("--seed", type=int, default=1)
    chaos.add_argument("--records", type=int, default=2000)
    chaos.add_argument("--workdir", default=".chaos", help="each run gets a fresh lakehouse below it")

    bench = commands.add_parser(
        "bench", help="measure throughput, dedup scaling, batch overhead, latency, exactly-once and recovery cost"
    )
    bench.add_argument("--quick", action="store_true", help="a smaller run (under 12 minutes)")
    bench.add_argument("--output", default="bench-results", help="directory for bench.json and bench.png")
    bench.add_argument("--keep", action="store_true", help="keep the work directory, broker and topics")

    commands.add_parser("setup", help="download and cache every JVM jar (Spark packages, Kafka broker)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = load_config(args.env, args.config)
        args.local_broker = config.kafka.bootstrap_servers == LOCAL_BOOTSTRAP
        shows_egress = args.command == "show" and args.table in installed_names()
        if args.command in NEEDS_KAFKA or shows_egress:
            config = resolve_local_bootstrap(config)
            from .pipeline.kafka_io import check_connection

            # Before Spark: its Kafka client would retry a refused login forever.
            check_connection(config)
            if args.command in {"run", "audit"} or shows_egress:
                config = prepare_egress(config, args)
        return COMMANDS[args.command](config, args)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return EXIT_CONFIG
    except (checkpoints.CheckpointError, TableSchemaError) as error:
        print(f"refusing to start: {error}", file=sys.stderr)
        return EXIT_UNSAFE_START


def resolve_local_bootstrap(config: Config) -> Config:
    """The config with bootstrap "local" replaced by the address of the running development broker."""
    if config.kafka.bootstrap_servers != LOCAL_BOOTSTRAP:
        return config
    from .devtools.kafka_local import running_bootstrap

    bootstrap = running_bootstrap(config.kafka_local_home)
    if bootstrap is None:
        raise ConfigError(
            f"kafka.bootstrap_servers: is 'local' but no local broker runs in {config.kafka_local_home}; "
            "start one with `kafka-local start` or set KAFKA_BOOTSTRAP_SERVERS"
        )
    return dataclasses.replace(config, kafka=dataclasses.replace(config.kafka, bootstrap_servers=bootstrap))


def _spark(config: Config, app: str):
    from .pipeline.spark import build_spark

    spark = build_spark(
        app_name=app,
        master=config.spark_master,
        shuffle_partitions=config.shuffle_partitions,
        ui_enabled=config.spark_ui_enabled,
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


def cmd_run(config: Config, args: argparse.Namespace) -> int:
    from .pipeline.progress import ProgressReporter
    from .pipeline.streams import run_available_now, stream_names

    stop_requested = threading.Event()

    def request_stop(*_: object) -> None:
        stop_requested.set()

    # Before Spark starts, so a SIGTERM during start-up also stops cleanly, and
    # again after: starting the SparkContext replaces the SIGINT handler.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    spark = _spark(config, f"pipeline-{args.layer}")
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    reporter = ProgressReporter()
    spark.streams.addListener(reporter)
    layers = stream_names(config) if args.layer == "all" else (args.layer,)
    try:
        if args.available_now:
            run_available_now(spark, config, layers)
            return 0
        return _run_until_stopped(spark, config, layers, stop_requested)
    finally:
        # Listener events are delivered asynchronously: let the last batches report.
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        spark.streams.removeListener(reporter)


def _run_until_stopped(spark, config: Config, layers: tuple[str, ...], stop_requested: threading.Event) -> int:
    from .pipeline.streams import start_stream

    queries = []
    for layer in layers:
        if not stop_requested.is_set():
            queries.append(start_stream(spark, config, layer, available_now=False))
    while not stop_requested.is_set() and all(query.isActive for query in queries):
        stop_requested.wait(1.0)
    # A stream that ended on its own failed, with an exception or without one (its lease
    # was taken over by another process); the others are stopped by us.
    failed = [query for query in queries if not query.isActive]
    for query in queries:
        if query.isActive:
            _stop_after_current_batch(query)
            if query.exception() is not None:
                print(
                    f"stream {query.name} was stopped inside a batch; that batch is replayed on the next start",
                    file=sys.stderr,
                )
    for query in failed:
        reason = query.exception() or "it ended without a stop request: see the log for its lease"
        print(f"stream {query.name} failed: {reason}", file=sys.stderr)
    return 1 if failed else 0


def _stop_after_current_batch(query, timeout_s: float = 120.0) -> None:
    # Spark has no graceful stop: stop() interrupts a running batch. That is safe
    # (the batch is replayed, exactly once, on the next start), but waiting for
    # the current trigger to end usually avoids it.
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def cmd_produce_sample(config: Config, args: argparse.Namespace) -> int:
    from .devtools.sample import produce, sample_records
    from .pipeline.kafka_io import client_config, ensure_topics

    if args.local_broker:
        ensure_topics(config)
    topic = config.kafka.topics[0]
    sent = produce(client_config(config), topic, sample_records(args.count, args.seed, args.malformed_ratio))
    print(f"produced {sent} records to {topic}")
    return 0


def describe(config: Config) -> dict:
    from .pipeline.egress import configured
    from .pipeline.tables import SCHEMAS, STREAMS, Lakehouse

    lakehouse = Lakehouse(config.lakehouse_root)
    egress = {
        name: {
            "source": f"change data feed of {lakehouse.table(STREAMS['gold'].sinks[0])}",
            **module.describe(config),
            "checkpoint": lakehouse.checkpoint(name),
        }
        for name, module in configured(config).items()
    }
    return {
        "env": config.env,
        "lakehouse_root": config.lakehouse_root,
        "streams": {
            name: {
                "source": f"kafka:{','.join(config.kafka.topics)}"
                if stream.source == "kafka"
                else lakehouse.table(stream.source),
                "sinks": {table: lakehouse.table(table) for table in stream.sinks},
                "checkpoint": lakehouse.checkpoint(name),
                "downstream": list(stream.downstream),
            }
            for name, stream in STREAMS.items()
        },
        "tables": {name: lakehouse.table(name) for name in SCHEMAS},
        "egress": egress,
    }


def cmd_describe(config: Config, args: argparse.Namespace) -> int:
    description = describe(config)
    if args.json:
        print(json.dumps(description, indent=2))
        return 0
    print(f"env {description['env']}, lakehouse {description['lakehouse_root']}")
    for name, stream in description["streams"].items():
        print(f"stream {name}: {stream['source']} -> {', '.join(stream['sinks'].values())}")
        print(f"  checkpoint {stream['checkpoint']}")
    for name, egress in description["egress"].items():
        sink = ", ".join(f"{key} {value}" for key, value in egress.items() if key not in {"source", "checkpoint"})
        print(f"egress {name}: {egress['source']} -> {sink}")
        print(f"  checkpoint {egress['checkpoint']}")
    return 0


def cmd_audit(config: Config, args: argparse.Namespace) -> int:
    return run_audit_command(config, args, lambda: _spark(config, "audit"))


def cmd_checkpoints(config: Config, args: argparse.Namespace) -> int:
    from .checkpoint_commands import list_checkpoints, reset_checkpoints

    if args.action == "reset":
        return reset_checkpoints(config, args.stream, args.yes, lambda: _spark(config, "checkpoints"), args.only)
    return list_checkpoints(config, args.json, _spark(config, "checkpoints"))


def cmd_show(config: Config, args: argparse.Namespace) -> int:
    from .pipeline.contract import EVENTS
    from .pipeline.tables import BRONZE, GOLD, KAFKA_KEY_COLUMNS, QUARANTINE, SILVER, Lakehouse

    if args.table in installed_names():
        return show_egress(config, args.table, args.limit, _spark(config, "show"))
    name = {"bronze": BRONZE, "silver": SILVER, "quarantine": QUARANTINE, "gold": GOLD}[args.table]
    table = _spark(config, "show").read.format("delta").load(Lakehouse(config.lakehouse_root).table(name))
    ordering = list(EVENTS.gold_key) if args.table == "gold" else KAFKA_KEY_COLUMNS
    print(f"{name}: {table.count()} rows")
    table.orderBy(*ordering).show(args.limit, truncate=False)
    return 0


def cmd_kafka_local(config: Config, args: argparse.Namespace) -> int:
    from .devtools.kafka_local import LocalKafka

    broker = LocalKafka(config.kafka_local_home)
    if args.action == "start":
        try:
            print(broker.start(secure=args.secure))
        except RuntimeError as error:
            print(f"kafka-local: {error}", file=sys.stderr)
            return 1
        secure = broker.secure_listeners()
        if args.secure and secure:
            from .devtools.kafka_secure import client_instructions

            print(client_instructions(secure))
        return 0
    return stop_or_status(broker, args.action)


def stop_or_status(server, action: str) -> int:
    """`stop` and `status` of a development server (kafka-local, postgres-local): the same words, exit codes."""
    if action == "stop":
        print("stopped" if server.stop() else "not running")
        return 0
    status = server.status()
    print(json.dumps(status, default=str) if status else "not running")
    return 0 if status else 1


def cmd_chaos(config: Config, args: argparse.Namespace) -> int:
    from .devtools.chaos import run_chaos
    from .devtools.kafka_local import LocalKafka, running_bootstrap

    workdir = Path(args.workdir).resolve() / f"run-{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}"
    # Never the configured lakehouse: the runner creates its own topic and tables.
    run_config = dataclasses.replace(config, lakehouse_root=str(workdir / "lakehouse"))
    with ExitStack() as servers:
        if args.local_broker and running_bootstrap(config.kafka_local_home) is None:
            broker = LocalKafka(workdir / "kafka")
            kafka = dataclasses.replace(config.kafka, bootstrap_servers=broker.start())
            servers.callback(broker.stop)
            run_config = dataclasses.replace(run_config, kafka=kafka)
        else:
            run_config = resolve_local_bootstrap(run_config)
        run_config = private_egress_servers(run_config, workdir, servers)
        report = run_chaos(run_config, args.kills, args.seed, args.records)
    print(report.table())
    print(f"work directory: {workdir}")
    return 0 if report.clean else 1


def cmd_bench(config: Config, args: argparse.Namespace) -> int:
    from .bench import run_bench

    run_bench(config, quick=args.quick, output_dir=Path(args.output), keep=args.keep)
    return 0


def cmd_setup(config: Config, args: argparse.Namespace) -> int:
    from .devtools.kafka_local import resolve_broker_jars

    jars = resolve_broker_jars()
    print(f"Kafka broker: {len(jars)} jars cached")
    spark = _spark(config, "setup")
    print(f"Spark {spark.version} with Delta Lake and the Kafka connector: jars cached")
    spark.stop()
    return 0


COMMANDS = {
    "run": cmd_run,
    "produce-sample": cmd_produce_sample,
    "describe": cmd_describe,
    "audit": cmd_audit,
    "checkpoints": cmd_checkpoints,
    "show": cmd_show,
    "kafka-local": cmd_kafka_local,
    **LOCAL_SERVER_COMMANDS,
    "chaos": cmd_chaos,
    "bench": cmd_bench,
    "setup": cmd_setup,
}
