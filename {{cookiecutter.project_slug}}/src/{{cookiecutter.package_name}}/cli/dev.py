"""`produce-sample`, `demo`, `chaos`, `nemesis`, `bench` and `setup`: the development and proving commands.

Each imports the development tools or the benchmark inside its handler, so `run` in production
loads the pipeline only.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

from ..pipeline.config import Config
from .connect import connect
from .exit_codes import ExitCode
from .local_servers import private_servers, uses_local_broker
from .streams import add_dataset_argument, datasets_of

T = TypeVar("T")


def register(commands) -> None:
    produce = commands.add_parser(
        "produce-sample", help="produce sample records to each dataset's first topic, drawn from its contract"
    )
    produce.add_argument("--count", type=int, required=True, help="records per dataset")
    produce.add_argument("--malformed-ratio", type=float, default=0.0)
    produce.add_argument("--seed", type=int, default=7)
    add_dataset_argument(produce, "produce this dataset's records (default: every dataset's)")
    produce.set_defaults(handler=produce_sample)

    demo_parser = commands.add_parser(
        "demo",
        help="produce-sample, run --layer all --available-now, show gold and each egress, then audit: one Spark start",
    )
    demo_parser.add_argument("--count", type=int, default=5000)
    demo_parser.add_argument("--malformed-ratio", type=float, default=0.01)
    demo_parser.add_argument("--seed", type=int, default=7)
    demo_parser.add_argument("--limit", type=int, default=10, help="rows printed per table")
    demo_parser.set_defaults(handler=demo)

    chaos_parser = commands.add_parser(
        "chaos", help="kill and restart the pipeline at random while producing, then check exactly-once"
    )
    chaos_parser.add_argument("--kills", type=int, default=10)
    chaos_parser.add_argument("--seed", type=int, default=1)
    chaos_parser.add_argument("--records", type=int, default=2000)
    chaos_parser.add_argument("--workdir", default=".chaos", help="each run gets a fresh lakehouse below it")
    chaos_parser.set_defaults(handler=chaos)

    nemesis_parser = commands.add_parser(
        "nemesis", help="a seeded schedule of combined faults (kills, freezes, lost checkpoints, ...), then check"
    )
    schedule = nemesis_parser.add_mutually_exclusive_group()
    schedule.add_argument("--actions", type=int, help="how many seeded actions (100 unless --replay)")
    schedule.add_argument(
        "--replay", metavar="SCHEDULE", help="play the schedule a run saved (its schedule.json) instead of drawing one"
    )
    nemesis_parser.add_argument("--seed", type=int, default=1)
    nemesis_parser.add_argument(
        "--shrink",
        action="store_true",
        help="with --replay of a failing run: replay ever shorter schedules (minutes each) for the shortest that fails",
    )
    nemesis_parser.add_argument("--workdir", default=".nemesis", help="each run gets a fresh lakehouse below it")
    nemesis_parser.add_argument(
        "--compiled",
        action="store_true",
        help="every stream compiles each batch, however small (production compiles only large ones)",
    )
    nemesis_parser.set_defaults(handler=nemesis)

    bench_parser = commands.add_parser(
        "bench", help="measure throughput, dedup scaling, batch overhead, latency, exactly-once and recovery cost"
    )
    bench_parser.add_argument("--quick", action="store_true", help="a smaller run (under 20 minutes)")
    bench_parser.add_argument("--output", default="bench-results", help="directory for bench.json and bench.png")
    bench_parser.add_argument(
        "--keep", action="store_true", help="keep the work directory, broker, S3 server and topics"
    )
    bench_parser.set_defaults(handler=bench)

    setup_parser = commands.add_parser(
        "setup", help="cache every JVM jar (Spark packages, Kafka broker) and write the Spark driver's class archive"
    )
    setup_parser.set_defaults(handler=setup)


# A dataset's records that are an application-level retry of an earlier one (``contract_records``): its
# business key then sends them to quarantine, as the demo shows.
SAMPLE_RETRY_RATIO = 0.02
# And about one in a hundred breaks the dataset's first quarantining expectation, where a producer can
# break one: the demo's quarantine shows the expectation's name.
SAMPLE_UNEXPECTED_RATIO = 0.01


def produce_sample(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.sample import breakable, contract_records, dataset_writer, produce, sample_records
    from ..pipeline.datasets import DATASETS, config_of
    from ..pipeline.kafka.clients import client_config, ensure_topics

    if not 0.0 <= args.malformed_ratio <= 1.0:
        print(f"{args.command}: --malformed-ratio must be between 0 and 1, not {args.malformed_ratio}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    local_broker = uses_local_broker(config)
    config = connect(config)
    for declared in datasets_of(config, args.dataset):
        reads = config_of(config, declared)
        if local_broker:
            ensure_topics(reads)
        topic = reads.kafka.topics[0]
        if declared is DATASETS[0]:
            records = sample_records(args.count, args.seed, args.malformed_ratio)
        else:
            unexpected = SAMPLE_UNEXPECTED_RATIO if breakable(declared) is not None else 0.0
            records = contract_records(
                declared,
                args.count,
                args.seed,
                args.malformed_ratio,
                SAMPLE_RETRY_RATIO,
                unexpected_ratio=unexpected,
                # An Avro dataset's through the schema registry, as its producers write it.
                write=dataset_writer(config, declared, topic),
            )
        sent = produce(client_config(config), topic, records)
        print(f"produced {sent} records to {topic} ({declared.name})")
    return ExitCode.OK


def demo(config: Config, args: argparse.Namespace) -> int:
    """`make demo`'s work: the handlers of `produce-sample`, `run`, `show` and `audit`, one after the other.

    In one process, so that Spark starts once: as four commands, each JVM's start and its first
    queries on cold code took most of the demo's time (the show and the audit alone about 100 s on
    2 cores).
    The exit code is the audit's.
    """
    from ..pipeline.egress import configured
    from . import audit, streams
    from .connect import spark_session

    if args.count < 1 or args.limit < 1:
        print("demo: --count and --limit must be at least 1", file=sys.stderr)
        return ExitCode.BAD_INPUT
    sample = argparse.Namespace(
        command=args.command, count=args.count, malformed_ratio=args.malformed_ratio, seed=args.seed, dataset=None
    )
    code = produce_sample(config, sample)
    if code != ExitCode.OK:
        return code
    # Spark first: `run` installs signal handlers for its streams, and Spark's own (Ctrl-C cancels
    # the running job) are put back after it, for the show and the audit.
    spark_session(config, "demo")
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = streams.run(config, argparse.Namespace(layer="all", available_now=True, dataset=None))
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    if code != ExitCode.OK:
        return code
    streams.show(config, argparse.Namespace(tables=["gold", *configured(config)], limit=args.limit, dataset=None))
    return audit.audit_command(config, argparse.Namespace(json=False, dataset=None, last_batches=None, since=None))


def chaos(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.chaos import run_chaos

    run = f"run-{time.strftime('%Y%m%d-%H%M%S')}-seed{args.seed}"
    workdir = Path(args.workdir).resolve() / run
    run_config = config.model_copy(update={"lakehouse_root": chaos_lakehouse(config.lakehouse_root, workdir, run)})
    with ExitStack() as servers:
        run_config = private_servers(run_config, workdir, servers)
        report = run_chaos(run_config, args.kills, args.seed, args.records, logs=workdir / "pipeline-logs")
    print(report.table())
    print(f"work directory: {workdir}")
    print(f"lakehouse: {run_config.lakehouse_root}")
    return ExitCode.OK if report.clean else ExitCode.FAILED


def nemesis(config: Config, args: argparse.Namespace) -> int:
    from ..devtools.kafka_local import LocalKafka
    from ..devtools.nemesis import Schedule, run_nemesis, shrink
    from ..pipeline.refusals import console_command

    if args.actions is not None and args.actions < 1:
        print("nemesis: --actions must be at least 1", file=sys.stderr)
        return ExitCode.BAD_INPUT
    if args.shrink and args.replay is None:
        print("nemesis: --shrink shortens a saved schedule: give it with --replay <run>/schedule.json", file=sys.stderr)
        return ExitCode.BAD_INPUT
    replay = None
    if args.replay is not None:
        try:
            replay = Schedule.load(Path(args.replay))
        except ValueError as error:
            print(f"nemesis: --replay: {error}", file=sys.stderr)
            return ExitCode.BAD_INPUT
    if args.shrink:
        if not replay.anomalies:
            print(f"nemesis: {args.replay} found no anomaly: there is nothing to shorten", file=sys.stderr)
            return ExitCode.BAD_INPUT
        shortest = shrink(replay, Path(args.workdir).resolve())
        if shortest is None:
            print(f"nemesis: {args.replay} played again found none of {', '.join(replay.anomalies)}", file=sys.stderr)
            return ExitCode.FAILED
        path = Path(args.workdir).resolve() / "shrink" / "shortest.json"
        shortest.save(path)
        print(f"shortest schedule that still finds {', '.join(replay.anomalies)}: {', '.join(shortest.names())}")
        print(f"saved: {path} (play it: {console_command()} nemesis --replay {path})")
        return ExitCode.OK
    seed = replay.seed if replay is not None else args.seed
    run = f"run-{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
    workdir = Path(args.workdir).resolve() / run
    run_config = config.model_copy(update={"lakehouse_root": chaos_lakehouse(config.lakehouse_root, workdir, run)})
    broker = None
    with ExitStack() as servers:
        if uses_local_broker(run_config):
            # A broker of the run's own, so that the schedule can restart it.
            broker = LocalKafka(workdir / "kafka")
            kafka = run_config.kafka.model_copy(update={"bootstrap_servers": broker.start()})
            servers.callback(broker.stop)
            run_config = run_config.model_copy(update={"kafka": kafka})
        run_config = private_servers(run_config, workdir, servers)
        report = run_nemesis(
            run_config,
            logs=workdir / "logs",
            actions=None if replay is not None else (args.actions or 100),
            seed=seed,
            replay=replay,
            broker=broker,
            schedule_file=workdir / "schedule.json",
            compiled=args.compiled,
        )
    print(report.table())
    print(f"work directory: {workdir}")
    if not report.clean:
        schedule = Schedule.load(workdir / "schedule.json")  # saved by the run after each of its steps
        actions = ", ".join(schedule.names())
        print(f"seed {seed}; the schedule up to the first anomaly ({len(schedule.actions)} actions): {actions}")
        replay_command = f"{console_command()} nemesis --replay {workdir / 'schedule.json'}"
        print(f"play it again: {replay_command}")
        print(f"shorten it:    {replay_command} --shrink")
    return ExitCode.OK if report.clean else ExitCode.FAILED


def chaos_lakehouse(configured_root: str, workdir: Path, run: str) -> str:
    """A chaos run's own lakehouse, never the configured one (the runner makes its own topic and tables).

    On the configured storage: in ``workdir``, or, for a root on S3, in the same bucket beside it
    (``s3a://lake/clickstream`` gives ``s3a://lake/clickstream-chaos/<run>``), so that the run exercises
    the store the pipeline runs on.
    """
    from ..pipeline.session.s3 import SCHEME, bucket_and_prefix, is_s3

    if not is_s3(configured_root):
        return str(workdir / "lakehouse")
    bucket, prefix = bucket_and_prefix(configured_root)
    beside = f"{prefix.rstrip('/')}-chaos" if prefix else "chaos"
    return f"{SCHEME}{bucket}/{beside}/{run}"


def bench(config: Config, args: argparse.Namespace) -> int:
    from ..bench import run_bench

    run_bench(config, quick=args.quick, output_dir=Path(args.output), keep=args.keep)
    return ExitCode.OK


def setup(config: Config, args: argparse.Namespace) -> int:
    from ..bench.harness import baseline_packages
    from ..devtools.kafka_local import resolve_broker_jars
    from ..pipeline.session import s3
    from ..pipeline.session.class_archive import write_archive
    from ..pipeline.session.spark import archive_path, build_spark

    jars = download_with_retries("Kafka broker jars", resolve_broker_jars)
    print(f"Kafka broker: {len(jars)} jars cached")
    # The jars of every storage (S3's connector too), whatever the config's lakehouse: nothing here
    # reaches the lakehouse, so an S3 server need not run yet. And those of the benchmark's baselines,
    # which the tests' sessions load too: two sessions fetching a jar into Ivy's cache at once may
    # each find the other's empty file.
    packages, conf = s3.connector_options()
    packages = [*packages, *baseline_packages()]
    spark = download_with_retries(
        "Spark's package jars",
        lambda: build_spark(
            app_name="setup",
            master=config.spark_master,
            shuffle_partitions=config.shuffle_partitions,
            ui_enabled=False,
            extra_conf=conf,
            extra_packages=packages,
        ),
    )
    print(f"Spark {spark.version} with Delta Lake, the Kafka connector and S3A: jars cached")
    spark.stop()
    archive = archive_path()
    if archive is None:
        archive = write_archive()
    print(f"Spark driver class archive (starts about 4 s faster): {archive}")
    return ExitCode.OK


# Maven Central now and then answers a jar request with an empty body (Ivy: "Downloaded file size
# (0) doesn't match expected Content Length ... Please retry"), which fails a fresh machine's
# `make install`; the next try fetches the same jar whole. What was fetched stays in Ivy's cache,
# so a try fetches only what is still missing.
DOWNLOAD_ATTEMPTS = 3
DOWNLOAD_PAUSE_S = 10.0


def download_with_retries(what: str, download: Callable[[], T], attempts: int = DOWNLOAD_ATTEMPTS) -> T:
    """Return ``download()``, calling it again after a pause when it raises a RuntimeError (Ivy's exit,
    or a JVM that ended before it started because spark-submit could not resolve its packages), up to
    ``attempts`` calls in all; the last failure is raised as it is.

    Example::

        jars = download_with_retries("Kafka broker jars", resolve_broker_jars)
    """
    if not callable(download):
        raise TypeError(f"download must be callable, not {type(download).__name__}")
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return download()
        except RuntimeError as error:
            if attempt == attempts:
                raise
            message = str(error).strip()
            reason = message.splitlines()[0].rstrip(":") if message else type(error).__name__
            print(
                f"{what}: the download failed ({reason}); attempt {attempt + 1} of {attempts} "
                f"in {DOWNLOAD_PAUSE_S * attempt:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            time.sleep(DOWNLOAD_PAUSE_S * attempt)
    raise AssertionError("unreachable: the last attempt returns or raises")
