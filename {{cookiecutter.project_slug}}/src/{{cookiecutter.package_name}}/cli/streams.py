"""`run`, `describe` and `show`: the pipeline's streams run, described and their tables printed."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..pipeline.config import Config, ConfigError
from ..pipeline.dataset import Dataset
from ..pipeline.datasets import DATASETS
from ..pipeline.egress import installed_streams
from .connect import connect, spark_session
from .exit_codes import ExitCode
from .live import LiveLine


def register(commands) -> None:
    run_parser = commands.add_parser("run", help="run pipeline streams")
    run_parser.add_argument(
        "--layer", choices=["bronze", "silver", "gold", "fused", *installed_streams(), "all"], default="all"
    )
    run_parser.add_argument("--available-now", action="store_true", help="process everything available, then exit 0")
    add_dataset_argument(run_parser, "the dataset whose streams run (default: every dataset)")
    run_parser.set_defaults(handler=run)

    describe_parser = commands.add_parser("describe", help="streams, tables and checkpoints")
    describe_parser.add_argument("--json", action="store_true")
    describe_parser.set_defaults(handler=print_description)

    show_parser = commands.add_parser("show", help="print tables (one Spark start for all of them)")
    show_parser.add_argument(
        "tables", nargs="+", metavar="table", choices=["bronze", "silver", "quarantine", "gold", *installed_streams()]
    )
    show_parser.add_argument("--limit", type=int, default=20, help="rows printed per table")
    add_dataset_argument(show_parser, "print this dataset's tables (default: every dataset's)")
    show_parser.set_defaults(handler=show)


def add_dataset_argument(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--dataset NAME``: one of the project's datasets (default None: every one the config runs)."""
    parser.add_argument("--dataset", choices=[each.name for each in DATASETS], help=help_text)


def datasets_of(config: Config, name: str | None) -> tuple[Dataset, ...]:
    """The datasets a command works on: dataset ``name``, refused (ConfigError naming its table) where the
    config does not run it; without a name, every dataset the config runs.

    Example::

        datasets_of(config, None)  # (events, orders)
    """
    from ..pipeline.datasets import dataset, kafka_of, running

    if name is None:
        return running(config)
    declared = dataset(name)
    kafka_of(config, declared)
    return (declared,)


def selected_streams(config: Config, layer: str, dataset: str | None) -> tuple[str, ...]:
    """The streams `run --layer LAYER [--dataset NAME]` starts, in the order an availableNow run takes them:
    that layer's streams of each dataset named (every gold's stream for "gold"), or all their streams for
    "all", then the egress streams that publish their golds; an egress stream by its name.

    Example::

        selected_streams(config, "gold", None)  # ("gold", "orders_gold_by_shop", "orders_gold_hourly")
    """
    from ..pipeline.delta.tables import dataset_streams, fused_stream
    from ..pipeline.streams import stream_names

    if layer in installed_streams():
        return (layer,)
    datasets = datasets_of(config, dataset)
    if layer == "all":
        return stream_names(config, datasets[0] if dataset is not None else None)
    names = []
    for each in datasets:
        if layer == "fused":
            names.append(fused_stream(each).name)
        else:
            names.extend(name for name, stream in dataset_streams(each).items() if layer == stream.layer)
    return tuple(names)


def run(config: Config, args: argparse.Namespace) -> int:
    from ..pipeline.monitoring import ProgressReporter, serve_metrics
    from ..pipeline.recovery.lease import LeaseLost
    from ..pipeline.streams import run_available_now

    config = connect(config, egress=True, asked=args.layer, provision=True)
    if config.metrics_port:
        try:
            serve_metrics(config.metrics_address, config.metrics_port)
        except OSError as error:
            raise ConfigError(str(error)) from error
    stop_requested = threading.Event()

    def request_stop(*_: object) -> None:
        stop_requested.set()

    # Before Spark starts, so a SIGTERM during start-up also stops cleanly, and
    # again after: starting the SparkContext replaces the SIGINT handler.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    # Before Spark: a dataset the config does not run exits 2.
    layers = selected_streams(config, args.layer, args.dataset)
    spark = spark_session(config, f"pipeline-{args.layer}")
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    if not args.available_now:
        # A continuous run is watched through its log and metrics, not waited for at a terminal.
        with _reporting(spark, ProgressReporter(spark)):
            return _run_until_stopped(spark, config, layers, stop_requested)
    with LiveLine(spark, f"run --available-now: {', '.join(layers)}") as live:
        with _reporting(spark, ProgressReporter(spark, echo=live.write, on_batch=live.batch)):
            try:
                run_available_now(spark, config, layers)
            except LeaseLost as error:  # a stream that failed, as in a continuous run: not a refused start
                live.write(f"stopped: {error}")
                return ExitCode.FAILED
    return ExitCode.OK


@contextmanager
def _reporting(spark, reporter) -> Iterator[None]:
    spark.streams.addListener(reporter)
    try:
        yield
    finally:
        # Listener events are delivered asynchronously: let the last batches report.
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
        spark.streams.removeListener(reporter)


# A stream started again after a failure a new start mends (``_restartable``): at most this many times
# within the window, so that a broker that keeps failing ends the run, as any other failure does.
RESTARTS_PER_WINDOW = 5
RESTART_WINDOW_S = 600.0


def _run_until_stopped(spark, config: Config, layers: tuple[str, ...], stop_requested: threading.Event) -> int:
    from ..pipeline.streams import start_stream

    queries = []
    for layer in layers:
        if not stop_requested.is_set():
            queries.append(start_stream(spark, config, layer, available_now=False))
    restarts: list[float] = []
    while not stop_requested.is_set():
        if all(query.isActive for query in queries):
            stop_requested.wait(1.0)
            continue
        # An egress whose producer lost its broker connection fails its batch rather than make a new
        # producer inside it: started again, it fences first and reads its marker after. A broker that
        # keeps dropping the connection ends the run as any failure does.
        ended = [index for index, query in enumerate(queries) if not query.isActive]
        restarts = [at for at in restarts if at > time.monotonic() - RESTART_WINDOW_S]
        if len(restarts) + len(ended) > RESTARTS_PER_WINDOW or not all(_restartable(queries[i]) for i in ended):
            break
        for index in ended:
            print(
                f"stream {queries[index].name} failed: {_failure(config, queries[index])}; starting it again",
                file=sys.stderr,
            )
            restarts.append(time.monotonic())
            queries[index] = start_stream(spark, config, queries[index].name, available_now=False)
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
        print(f"stream {query.name} failed: {_failure(config, query)}", file=sys.stderr)
    return ExitCode.FAILED if failed else ExitCode.OK


def _restartable(query) -> bool:
    """A stream that failed only because its egress's producer must be made anew: a new start does that."""
    from ..pipeline.egress import installed

    kafka = installed().get("kafka_egress")
    restarts_the_stream = getattr(kafka, "restarts_the_stream", None)
    return restarts_the_stream is not None and restarts_the_stream(query.exception())


def _failure(config: Config, query) -> str:
    """Why a stream ended without a stop request: the lease this process lost, with the way out (the
    heartbeat stopped the query, or a batch refused to write), or else Spark's error."""
    from ..pipeline.delta.tables import Lakehouse
    from ..pipeline.recovery.lease import LeaseLost, check_not_lost

    try:
        check_not_lost(Lakehouse(config.lakehouse_root), query.name)
    except LeaseLost as error:
        return str(error)
    return str(query.exception() or "it ended without a stop request: see the log")


def _stop_after_current_batch(query, timeout_s: float = 120.0) -> None:
    # Spark has no graceful stop: stop() interrupts a running batch. That is safe
    # (the batch is replayed, exactly once, on the next start), but waiting for
    # the current trigger to end usually avoids it.
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.05)
    query.stop()


def describe(config: Config) -> dict:
    """The datasets, streams, tables, checkpoints and egresses of ``config`` as plain data (`describe --json`).

    Stream and table names are the project's own across its datasets: each stream names its dataset.
    """
    from ..pipeline.config import Mode
    from ..pipeline.datasets import config_of, running
    from ..pipeline.delta.tables import Lakehouse, dataset_streams, fused_stream, table_schemas
    from ..pipeline.egress import configured, target

    lakehouse = Lakehouse(config.lakehouse_root)
    egress = {
        name: {
            "source": f"change data feed of {lakehouse.table(target(config, name).gold_table)}",
            **module.describe(config, target(config, name)),
            "checkpoint": lakehouse.checkpoint(name),
        }
        for name, module in configured(config).items()
    }
    datasets, streams, tables = {}, {}, {}
    for declared in running(config):
        topics = list(config_of(config, declared).kafka.topics)
        datasets[declared.name] = {"topics": topics, "golds": [gold.name for gold in declared.golds]}
        fused = fused_stream(declared)
        for name, stream in ({fused.name: fused} if config.mode is Mode.FUSED else dataset_streams(declared)).items():
            streams[name] = {
                "dataset": declared.name,
                "source": f"kafka:{','.join(topics)}" if stream.source == "kafka" else lakehouse.table(stream.source),
                "sinks": {table: lakehouse.table(table) for table in stream.sinks},
                "checkpoint": lakehouse.checkpoint(name),
                "downstream": list(stream.downstream),
            }
        tables.update({name: lakehouse.table(name) for name in table_schemas(declared)})
    return {
        "env": config.env,
        "mode": config.mode.value,
        "lakehouse_root": config.lakehouse_root,
        "datasets": datasets,
        "streams": streams,
        "tables": tables,
        "egress": egress,
    }


def print_description(config: Config, args: argparse.Namespace) -> int:
    description = describe(config)
    if args.json:
        print(json.dumps(description, indent=2))
        return ExitCode.OK
    print(f"env {description['env']}, {description['mode']} mode, lakehouse {description['lakehouse_root']}")
    for name, dataset in description["datasets"].items():
        print(f"dataset {name}: topics {', '.join(dataset['topics'])}; golds {', '.join(dataset['golds'])}")
    for name, stream in description["streams"].items():
        print(f"stream {name} ({stream['dataset']}): {stream['source']} -> {', '.join(stream['sinks'].values())}")
        print(f"  checkpoint {stream['checkpoint']}")
    for name, egress in description["egress"].items():
        sink = ", ".join(f"{key} {value}" for key, value in egress.items() if key not in {"source", "checkpoint"})
        print(f"egress {name}: {egress['source']} -> {sink}")
        print(f"  checkpoint {egress['checkpoint']}")
    return ExitCode.OK


def show(config: Config, args: argparse.Namespace) -> int:
    from ..pipeline.delta.tables import KAFKA_KEY_COLUMNS

    egresses = [name for name in args.tables if name in installed_streams()]
    # Every egress named is checked (on, reachable) before Spark starts.
    egress_config = config
    for stream in egresses:
        egress_config = connect(config, egress=True, asked=stream)
    datasets = datasets_of(config, args.dataset)
    for name in args.tables:
        if name in egresses:
            _show_egress(egress_config, name, args.limit)
            continue
        for declared in datasets:
            if name != "gold":
                table_name = {"bronze": declared.bronze, "silver": declared.silver, "quarantine": declared.quarantine}
                _show_table(config, table_name[name], KAFKA_KEY_COLUMNS, args.limit)
                continue
            for gold in declared.golds:
                # A HyperLogLog sketch is bytes to merge, not to read: its estimate is shown beside it.
                _show_table(config, declared.gold_table(gold), list(gold.key), args.limit, hidden=gold.sketches)
    return ExitCode.OK


def _show_table(config: Config, table_name: str, ordering: list[str], limit: int, hidden: tuple[str, ...] = ()) -> None:
    from ..pipeline.delta.tables import Lakehouse

    path = Lakehouse(config.lakehouse_root).table(table_name)
    table = spark_session(config, "show").read.format("delta").load(path)
    left_out = f" (not shown: {', '.join(hidden)})" if hidden else ""
    print(f"{table_name}: {table.count()} rows{left_out}")
    table.drop(*hidden).orderBy(*ordering).show(limit, truncate=False)


def _show_egress(config: Config, stream: str, limit: int) -> None:
    """Print what an egress's sink holds, read back as its consumers see it (gold's columns and gold_version)."""
    from ..pipeline.egress import configured, target

    module, published = configured(config)[stream], target(config, stream)  # connect refused an egress that is off
    rows = module.read_back(spark_session(config, "show"), config, published)
    where = ", ".join(f"{key} {value}" for key, value in module.describe(config, published).items())
    print(f"{stream} ({where}): {rows.count()} rows")
    rows.orderBy(*published.gold.key).show(limit, truncate=False)
