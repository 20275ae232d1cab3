"""`audit`: reconcile the lakehouse at a cut of the running pipeline, whole or bounded."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime

from ..pipeline.audit.cut import AuditRangeError, Bound
from ..pipeline.config import Config, ConfigError, duration_seconds
from .connect import connect, spark_session
from .exit_codes import ExitCode
from .live import LiveLine
from .streams import add_dataset_argument, datasets_of


def register(commands) -> None:
    audit = commands.add_parser(
        "audit",
        help="reconcile Kafka, bronze, silver, quarantine, gold and each egress at a cut of the running pipeline",
    )
    audit.add_argument("--json", action="store_true")
    add_dataset_argument(audit, "audit this dataset (default: every dataset, one report each)")
    bound = audit.add_mutually_exclusive_group()
    bound.add_argument("--last-batches", type=int, metavar="N", help="only the records of bronze's last N batches")
    bound.add_argument(
        "--since",
        metavar="WHEN",
        help="only records Kafka timestamped since WHEN: an ISO-8601 time ('2026-11-23T08:00:00+00:00') "
        "or a duration back from now ('2 hours')",
    )
    audit.set_defaults(handler=audit_command)


def parse_bound(last_batches: int | None, since: str | None, now_s: float | None = None) -> Bound:
    """The audit's bound from the command line; ConfigError naming the flag for a value that is not one.

    Example::

        parse_bound(None, "2 hours")  # Bound(since_ms=<two hours ago>)
    """
    if last_batches is not None and last_batches < 1:
        raise ConfigError(f"--last-batches: {last_batches} is not a number of batches (1 or more)")
    if since is None:
        return Bound(last_batches=last_batches)
    now_s = time.time() if now_s is None else now_s
    try:
        when = datetime.fromisoformat(since.strip())
    except ValueError:
        when = None
    if when is None:
        try:
            return Bound(since_ms=int((now_s - duration_seconds(since, "--since")) * 1000))
        except ConfigError:
            raise ConfigError(
                f"--since: {since!r} is neither an ISO-8601 time (2026-11-23T08:00:00+00:00) "
                f"nor a duration like '2 hours'"
            ) from None
    if when.tzinfo is None:
        raise ConfigError(f"--since: {since!r} has no UTC offset; write it as {since}+00:00 or with your zone's")
    if when.timestamp() > now_s:
        raise ConfigError(f"--since: {since!r} is in the future")
    return Bound(since_ms=int(when.timestamp() * 1000))


def audit_command(config: Config, args: argparse.Namespace) -> int:
    from ..pipeline.audit.reconcile import run_audit

    config = connect(config, egress=True)
    bound = parse_bound(args.last_batches, args.since)
    datasets = datasets_of(config, args.dataset)
    reports = {}
    try:
        spark = spark_session(config, "audit")
        for declared in datasets:
            with LiveLine(spark, f"audit of {declared.name}: reading Kafka and every table at one cut"):
                reports[declared.name] = run_audit(spark, config, declared, bound)
    except AuditRangeError as error:
        # A bound the checkpoint cannot answer: bad input.
        print(f"audit: {error}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    clean = all(report.clean for report in reports.values())
    if args.json:
        verdict = "clean" if clean else "FAILED"
        print(json.dumps({"verdict": verdict, "datasets": {n: r.as_dict() for n, r in reports.items()}}, indent=2))
        return ExitCode.OK if clean else ExitCode.FAILED
    for name, report in reports.items():
        print(f"dataset {name}")
        for section in ("counts", "errors", "warnings"):
            print(f"  {section}")
            for key, value in getattr(report, section).items():
                print(f"    {key:<60} {value:>10}")
        if report.quarantine_by_reason:
            print("  quarantine by reason")
            for reason, count in report.quarantine_by_reason.items():
                print(f"    {reason:<60} {count:>10}")
        cut = report.cut
        print(f"  cut: table versions {cut['table_versions']}; stream batches {cut['batches']}")
        print(f"    kafka range [first, end) per partition: {cut['kafka_range'] or 'none read by bronze yet'}")
        print(f"  {name}: {'clean' if report.clean else 'FAILED'}")
    print(f"audit verdict: {'clean' if clean else 'FAILED'}")
    return ExitCode.OK if clean else ExitCode.FAILED
