"""`quarantine replay`: quarantined records judged again, those that now pass moved to silver exactly once."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime

from ..pipeline.config import Config
from .audit import parse_bound
from .connect import connect, spark_session
from .exit_codes import ExitCode
from .live import LiveLine
from .streams import add_dataset_argument, datasets_of


def register(commands) -> None:
    quarantine = commands.add_parser("quarantine", help="the quarantined records: replay them into silver")
    actions = quarantine.add_subparsers(dest="action", required=True)
    replay = actions.add_parser(
        "replay",
        help="judge quarantined records again under the current contract and expectations; move those that pass "
        "to silver (and on to gold and the egresses), exactly once",
    )
    add_dataset_argument(replay, "replay this dataset's quarantine (default: every dataset's, in turn)")
    replay.add_argument(
        "--reason",
        help="only records of this reason, or of this label (the reason with `<type>`, `<record>` or `<id>` "
        "where it names a JSON type, a record or a schema id, as the metrics label it)",
    )
    replay.add_argument(
        "--since",
        metavar="WHEN",
        help="only records Kafka timestamped since WHEN: an ISO-8601 time ('2026-11-23T08:00:00+00:00') "
        "or a duration back from now ('2 hours')",
    )
    replay.set_defaults(handler=replay_quarantine)


def replay_quarantine(config: Config, args: argparse.Namespace) -> int:
    from ..pipeline.expectations import ExpectationFailed
    from ..pipeline.quarantine_replay import Selection, replay
    from ..pipeline.recovery.checkpoints import CheckpointError
    from ..pipeline.recovery.lease import LeaseHeld

    # Flags and datasets checked before Spark starts: a bad value exits 2 naming it.
    since = None
    if args.since is not None:
        since = datetime.fromtimestamp(parse_bound(None, args.since).since_ms / 1000, UTC)
    selection = Selection(reason=args.reason or None, since=since)
    datasets = datasets_of(config, args.dataset)
    config = connect(config)
    spark = spark_session(config, "quarantine-replay")
    for dataset in datasets:
        try:
            with LiveLine(spark, f"replaying the quarantine of {dataset.name}"):
                done = replay(spark, config, dataset, selection)
        except (LeaseHeld, CheckpointError) as error:
            print(f"refusing to replay the quarantine of {dataset.name}: {error}", file=sys.stderr)
            return ExitCode.REFUSED
        except ExpectationFailed as error:
            print(f"stopped: {error}", file=sys.stderr)
            return ExitCode.FAILED
        print(done.summary(dataset.silver, dataset.quarantine))
    return ExitCode.OK
