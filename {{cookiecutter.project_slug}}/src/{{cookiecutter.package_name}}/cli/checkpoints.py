"""`checkpoints list`, `reset`, `accept-loss` and `drop-bronze-copies`: each stream's checkpoint against its
tables, and the ways back."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable

from ..pipeline import bronze as bronze_layer
from ..pipeline import gold as gold_layer
from ..pipeline import streams as pipeline_streams
from ..pipeline.config import Config, Mode, duration_seconds
from ..pipeline.dataset import Dataset
from ..pipeline.datasets import DATASETS, owner, running
from ..pipeline.delta.tables import (
    Lakehouse,
    Layer,
    Stream,
    TableSchemaError,
    dataset_streams,
    fused_stream,
    set_properties,
    with_downstream,
)
from ..pipeline.egress import configured, installed_streams
from ..pipeline.egress import stream as egress_stream
from ..pipeline.kafka import retention
from ..pipeline.recovery import checkpoints, rebuild
from ..pipeline.recovery.lease import LeaseHeld, holding, read_lease
from ..pipeline.recovery.sink_progress import REBUILDING_PROPERTY
from ..pipeline.refusals import Refusal
from .connect import connect, spark_session
from .exit_codes import ExitCode
from .live import LiveLine
from .streams import add_dataset_argument, datasets_of


def register(commands) -> None:
    group = commands.add_parser(
        "checkpoints", help="list, reset or switch the streams' checkpoints; accept lost records; drop bronze's copies"
    )
    actions = group.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="each stream's checkpoint progress against its sink tables")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(
        handler=lambda config, args: list_checkpoints(config, args.json, spark_session(config, "checkpoints"))
    )
    reset = actions.add_parser("reset", help="reset a stream and everything downstream of it")
    layered = [name for each in DATASETS for name in each.streams]
    fused = [each.stream("fused") for each in DATASETS]
    reset.add_argument("stream", choices=[*layered, *fused, *installed_streams()])
    reset.add_argument("--yes", action="store_true", help="do not ask (required when not on a terminal)")
    reset.add_argument("--only", action="store_true", help="this stream only; downstream goes on (tables intact)")
    reset.set_defaults(
        handler=lambda config, args: reset_checkpoints(
            config, args.stream, args.yes, lambda: spark_session(config, "checkpoints"), args.only
        )
    )

    switch = actions.add_parser(
        "switch", help="hand the lakehouse over to the layered streams or to the fused stream, exactly"
    )
    switch.add_argument("mode", choices=[mode.value for mode in Mode])
    switch.add_argument("--yes", action="store_true", help="do not ask (required when not on a terminal)")
    add_dataset_argument(switch, "the dataset whose tables change hands (default: every dataset)")
    switch.set_defaults(
        handler=lambda config, args: switch_mode(
            config, Mode(args.mode), args.yes, lambda: spark_session(config, "checkpoints"), args.dataset
        )
    )

    accept = actions.add_parser(
        "accept-loss",
        help="record the records Kafka deleted before bronze read them as lost; bronze resumes after them",
    )
    accept.add_argument("--yes", action="store_true", help="do not ask (required when not on a terminal)")
    add_dataset_argument(accept, "the dataset whose bronze lost records (default: every dataset)")
    accept.set_defaults(
        handler=lambda config, args: accept_loss(
            connect(config), args.yes, lambda resolved: spark_session(resolved, "checkpoints"), args.dataset
        )
    )

    copies = actions.add_parser(
        "drop-bronze-copies",
        help="keep one copy of each record bronze holds more than once, then reset silver and below",
    )
    copies.add_argument("--yes", action="store_true", help="do not ask (required when not on a terminal)")
    add_dataset_argument(copies, "the dataset whose bronze holds copies (default: every dataset)")
    copies.set_defaults(
        handler=lambda config, args: drop_bronze_copies(
            config, args.yes, lambda: spark_session(config, "checkpoints"), args.dataset
        )
    )


def confirmation(yes: bool, refusal: Callable[[], str], question: str, declined: str) -> ExitCode | None:
    """None when a destructive command may go on: ``yes``, or a person typed 'yes' at ``question``.

    Otherwise the exit code to return: not on a terminal nothing can ask, so ``refusal()`` is printed
    (exit 3); a person who answers anything else gets ``declined`` (exit 1).

    Example::

        refused = confirmation(args.yes, lambda: "refusing ...", "This will delete ...\n", "nothing deleted")
    """
    if yes:
        return None
    if not sys.stdin.isatty():
        print(refusal(), file=sys.stderr)
        return ExitCode.REFUSED
    if input(f"{question}Type 'yes' to go on: ").strip().lower() != "yes":
        print(declined)
        return ExitCode.FAILED
    return None


def list_checkpoints(config: Config, as_json: bool, spark) -> int:
    """Print each stream's checkpoint against its sink tables, its lease and the refusal a start would meet.

    Example::

        list_checkpoints(config, as_json=False, spark=spark)  # prints, returns 0
    """
    lakehouse = Lakehouse(config.lakehouse_root)
    listing = {}
    for declared in running(config):
        fused = fused_stream(declared)
        layers = {fused.name: fused} if config.mode is Mode.FUSED else dataset_streams(declared)
        for name, stream in layers.items():
            listing[name] = checkpoint_state(spark, lakehouse, stream)
            # A gold's stream (or the fused one, each gold) refuses a window its table was not built at.
            golds = declared.golds if stream.layer is Layer.FUSED else [stream.gold] if stream.gold else []
            for gold in golds:
                window = gold_layer.window_of(gold, config.gold_window)
                refusal = gold_layer.window_refusal(spark, lakehouse, window, name, declared.gold_table(gold))
                listing[name]["refusal"] = listing[name]["refusal"] or refusal
    for name in configured(config):
        listing[name] = checkpoint_state(spark, lakehouse, egress_stream(name))
    if as_json:
        print(json.dumps(listing, indent=2))
        return ExitCode.OK
    for name, state in listing.items():
        print(
            f"{name:<7} {state['status']:<20} planned {state['last_planned']}  committed {state['last_committed']}"
            f"  lease {state['lease']}\n        checkpoint {state['checkpoint']} (stream id {state['stream_id']})"
        )
        for table, sink in state["sinks"].items():
            print(f"        {table:<18} v{sink['version']}  last batch of this stream {sink['txn_batch']}")
        if state["refusal"]:
            print(f"        refuses to start: {state['refusal']}")
    return ExitCode.OK


def checkpoint_state(spark, lakehouse: Lakehouse, stream: Stream) -> dict:
    """One stream's state as plain data (what `checkpoints list --json` prints).

    Example::

        checkpoint_state(spark, Lakehouse("/data/lake"), dataset_streams(DATASETS[0])["gold"])["status"]  # "ok"
    """
    lease_status, holder = read_lease(spark, lakehouse, stream.name)
    state: dict = {
        "status": "unreadable",
        "checkpoint": lakehouse.checkpoint(stream.name),
        "stream_id": None,
        "last_planned": None,
        "last_committed": None,
        "lease": lease_status.value + (f" ({holder.describe()})" if holder else ""),
        "sinks": {},
    }
    try:
        found = checkpoints.inspect(spark, lakehouse, stream)
    except checkpoints.CheckpointError as error:  # an unreadable metadata file: listed, not fatal here
        return {**state, "refusal": str(error)}
    return {
        **state,
        "status": found.status.value,
        "stream_id": found.stream_id,
        "last_planned": found.last_planned,
        "last_committed": found.last_committed,
        "sinks": {
            name: {"path": sink.path, "version": sink.version, "txn_batch": sink.txn_batch}
            for name, sink in found.sinks.items()
        },
        "refusal": found.refusal(),
    }


def reset_checkpoints(
    config: Config, stream: str, yes: bool, make_spark: Callable[[], object], only: bool = False
) -> int:
    """Reset ``stream`` and what is downstream (``only``: it alone); asks on a terminal, needs ``yes`` otherwise.

    Refuses (exit 3) while any of those streams runs: their leases are held for the whole reset.
    ``only`` is exact while the stream's own tables are intact (a changed subscription, a lost
    checkpoint): bronze resumes after the offsets it holds, silver re-reads bronze keeping each
    record once, and the streams below read on from where they are.

    Example::

        reset_checkpoints(config, "gold", yes=True, make_spark=lambda: spark)  # 0
    """
    declared = owner(stream)  # the dataset of a layer's or a fused stream; None for an egress
    if declared is not None and stream == declared.stream("fused"):
        return _reset_fused(config, yes, make_spark, only, declared)
    lakehouse = Lakehouse(config.lakehouse_root)
    # An egress has nothing downstream: its reset starts a new stream id that mirrors gold again.
    if declared is None:
        streams = [egress_stream(stream)]
    else:
        streams = [dataset_streams(declared)[stream]] if only else with_downstream(stream, declared)
    names = ", ".join(each.name for each in streams)
    doomed = [lakehouse.checkpoint(each.name) for each in streams]
    rebuilt = [
        f"{lakehouse.table(table)} from {each.source}"
        + (f" at {gold_layer.window_of(each.gold, config.gold_window)!r}" if each.gold is not None else "")
        for each in rebuild.rebuilt_by_reset(streams)
        for table in each.sinks
    ]
    what = f"delete the checkpoints {', '.join(doomed)}" + (
        f" and rebuild {', '.join(rebuilt)} under the current event contract (one commit replaces each table)"
        if rebuilt
        else ""
    )
    target = f"{stream}{' --only' if only else ''}"
    refused = confirmation(
        yes,
        lambda: Refusal.RESET_UNCONFIRMED.message(stream, names=names, what=what, target=target),
        f"This will {what}.\nReset {names}? ",
        "nothing reset",
    )
    if refused is not None:
        return refused
    spark = make_spark()
    way_out = f"Then run `checkpoints reset {stream}{' --only' if only else ''}` again."
    try:
        # A layered stream reset in a lakehouse the fused stream carries on would start beside it: refused
        # at once, and checked again holding the fused stream's lease, so that none starts in between.
        if declared is not None:
            pipeline_streams.check_mode(spark, lakehouse, stream, declared)
        # Held for the whole reset: no stream starts halfway through it.
        ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
        held = [each.name for each in streams] + ([declared.stream("fused")] if declared is not None else [])
        with holding(spark, lakehouse, held, way_out=way_out, ttl_s=ttl_s):
            if declared is not None:
                pipeline_streams.check_mode(spark, lakehouse, stream, declared)
            with LiveLine(spark, f"resetting {names}" + (": rebuilding tables" if rebuilt else "")):
                done = pipeline_streams.reset(
                    spark, lakehouse, streams, config.gold_window, declared or streams[0].dataset, config=config
                )
    except (LeaseHeld, TableSchemaError, checkpoints.CheckpointError) as error:
        print(f"refusing to reset {names}: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    print(f"reset {names}; the next run resumes consistently")
    for each in done:
        rows = ", ".join(f"{table} {count} rows" for table, count in each.rows.items())
        print(
            f"{each.stream} rebuilt from {each.source} version {each.source_version}: {rows}; its stream goes on "
            f"from the next {each.source} version"
        )
    return ExitCode.OK


def _reset_fused(config: Config, yes: bool, make_spark: Callable[[], object], only: bool, declared: Dataset) -> int:
    lakehouse, name = Lakehouse(config.lakehouse_root), declared.stream("fused")
    checkpoint = lakehouse.checkpoint(name)
    rebuild_tables = (
        "rebuild silver and quarantine from bronze and each gold from silver under the current event contract (one "
        "commit replaces each table)"
    )
    if only:
        what = (
            f"start the checkpoint {checkpoint} anew after the Kafka offsets bronze holds, silver and the golds as "
            f"they are when its last batch reached all of {declared.name}'s tables (else {rebuild_tables} first)"
        )
    else:
        what = f"delete the checkpoint {checkpoint}, {rebuild_tables}, and start {name} after the Kafka "
        what += "offsets bronze holds"
    target = f"{name}{' --only' if only else ''}"
    refused = confirmation(
        yes,
        lambda: Refusal.RESET_UNCONFIRMED.message(name, names=name, what=what, target=target),
        f"This will {what}.\nReset {name}? ",
        "nothing reset",
    )
    if refused is not None:
        return refused
    spark = make_spark()
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    held = [*declared.streams, name]
    try:
        pipeline_streams.check_mode(spark, lakehouse, name, declared)
        with holding(spark, lakehouse, held, f"Then run `checkpoints reset {target}` again.", ttl_s):
            pipeline_streams.check_mode(spark, lakehouse, name, declared)  # again: no layered stream starts now
            with LiveLine(spark, f"resetting {name}" + ("" if only else ": rebuilding tables")):
                if only:
                    print(f"reset {name}: {pipeline_streams.restart_fused(spark, config, declared)}")
                    return ExitCode.OK
                done = pipeline_streams.reset_fused(spark, config, declared)
    except (LeaseHeld, TableSchemaError, checkpoints.CheckpointError) as error:
        print(f"refusing to reset {name}: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    for each in done:
        rows = ", ".join(f"{table} {count} rows" for table, count in each.rows.items())
        print(f"{each.stream} rebuilt from {each.source} version {each.source_version}: {rows}")
    print(f"reset {name}; it resumes after the Kafka offsets bronze holds")
    return ExitCode.OK


def switch_mode(
    config: Config, to: Mode, yes: bool, make_spark: Callable[[], object], dataset_name: str | None = None
) -> int:
    """Hand dataset ``dataset_name``'s tables (or each dataset's in turn) over to the streams of mode ``to``
    (``streams.switch_mode``); asks on a terminal, needs ``yes`` otherwise. Refuses (exit 3) while any stream
    of either mode runs.

    Example::

        switch_mode(config, Mode.FUSED, yes=True, make_spark=lambda: spark)  # 0
    """
    datasets = datasets_of(config, dataset_name)
    what = (
        f"let the {'silver and gold streams' if to is Mode.FUSED else 'fused streams'} of "
        f"{', '.join(each.name for each in datasets)} finish what they read, end their checkpoints and start the "
        f"{to.value} streams where they stopped"
    )
    again = f"checkpoints switch {to.value}" + (f" --dataset {dataset_name}" if dataset_name else "")
    refused = confirmation(
        yes,
        lambda: Refusal.SWITCH_UNCONFIRMED.message("switch", again=f"`{again} --yes`", what=what, mode=to.value),
        f"This will {what}.\nSwitch to {to.value}? ",
        "nothing switched",
    )
    if refused is not None:
        return refused
    spark = make_spark()
    for declared in datasets:
        try:
            with LiveLine(spark, f"switching {declared.name} to {to.value}"):
                done = pipeline_streams.switch_mode(spark, config, to, declared)
        except (LeaseHeld, TableSchemaError, checkpoints.CheckpointError) as error:
            print(f"refusing to switch {declared.name} to {to.value}: {error}", file=sys.stderr)
            return ExitCode.REFUSED
        print(f"switched {declared.name} to {to.value}: {done}")
    print(f'set pipeline.mode = "{to.value}" for `run`')
    return ExitCode.OK


def accept_loss(
    config: Config, yes: bool, make_spark: Callable[[Config], object], dataset_name: str | None = None
) -> int:
    """Accept the records Kafka deleted before bronze read them: record them on bronze as lost (the audit
    reports them), then start bronze's checkpoint anew after them; for dataset ``dataset_name``, or for each
    dataset in turn. Asks on a terminal, needs ``yes`` otherwise.

    Nothing to accept (Kafka holds every record bronze needs next) changes nothing. Refuses (exit 3) while
    bronze runs, and when another cluster answers or a topic was created again (their own refusal).

    Example::

        accept_loss(config, yes=True, make_spark=lambda config: spark)  # 0
    """
    spark = make_spark(config)
    return _each_dataset(config, dataset_name, lambda declared: _accept_loss_of(config, yes, spark, declared))


def _each_dataset(config: Config, dataset_name: str | None, action: Callable[[Dataset], int]) -> int:
    """``action`` on dataset ``dataset_name``, or on each dataset the config runs in turn, up to the first
    that does not exit 0; its exit code."""
    for declared in datasets_of(config, dataset_name):
        code = action(declared)
        if code != ExitCode.OK:
            return code
    return ExitCode.OK


def _accept_loss_of(config: Config, yes: bool, spark, declared: Dataset) -> int:
    lakehouse = Lakehouse(config.lakehouse_root)
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    way_out = f"Then run `checkpoints accept-loss --dataset {declared.name}` again."
    bronze_stream = declared.stream("bronze")
    # The stream that reads Kafka: bronze's, or the fused one where it carries the lakehouse on.
    fused = bool(pipeline_streams.streams_holding_the_lakehouse(spark, lakehouse, Mode.FUSED, declared))
    reader = declared.stream("fused") if fused else bronze_stream
    held = [*declared.streams, reader] if fused else [bronze_stream]
    try:
        # Held throughout: bronze cannot start between finding the gaps and restarting after them.
        with holding(spark, lakehouse, held, way_out=way_out, ttl_s=ttl_s):
            gaps = bronze_layer.gaps_at_start(spark, config, lakehouse, reader, declared)
            if not gaps:
                print(f"{declared.name}: nothing to accept: Kafka still holds every record bronze needs next")
                return ExitCode.OK
            described = "; ".join(gap.describe() for gap in gaps)
            what = f"record {described} as lost on {declared.bronze} and start {reader}'s checkpoint anew after them"
            refused = confirmation(
                yes,
                lambda: Refusal.LOSS_UNCONFIRMED.message(
                    bronze_stream, what=what, again=f"`checkpoints accept-loss --dataset {declared.name} --yes`"
                ),
                f"Kafka deleted records bronze never read.\nThis will {what}.\n",
                "nothing accepted",
            )
            if refused is not None:
                return refused
            retention.record(spark, lakehouse, gaps, retention.ACCEPTED_BY_COMMAND, declared)
            if fused:
                print(f"accept-loss: {pipeline_streams.restart_fused(spark, config, declared)}")
            else:
                bronze = dataset_streams(declared)[bronze_stream]
                pipeline_streams.reset(spark, lakehouse, [bronze], config.gold_window, declared, config=config)
    except (LeaseHeld, TableSchemaError, checkpoints.CheckpointError) as error:
        print(f"refusing to accept lost records: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    print(f"recorded as lost on {declared.bronze}: {described}; {reader} resumes after them")
    return ExitCode.OK


def drop_bronze_copies(
    config: Config, yes: bool, make_spark: Callable[[], object], dataset_name: str | None = None
) -> int:
    """The way out of the audit's ``bronze_duplicates``: bronze keeps the first copy of each record, in one
    commit, then silver and below are reset (rebuilt from bronze); for dataset ``dataset_name``, or for each
    dataset in turn. Asks on a terminal, needs ``yes`` otherwise.

    Silver kept one copy of each record all along, so only bronze was wrong; but a rewrite of bronze is a
    change silver's stream cannot read past. Silver is marked as being rebuilt before bronze changes: if
    this is cut short, silver's start refuses and names ``checkpoints reset silver``. Nothing to drop
    changes nothing. Refuses (exit 3) while any stream runs.

    Example::

        drop_bronze_copies(config, yes=True, make_spark=lambda: spark)  # 0
    """
    spark = make_spark()
    return _each_dataset(config, dataset_name, lambda declared: _drop_bronze_copies_of(config, yes, spark, declared))


def _drop_bronze_copies_of(config: Config, yes: bool, spark, declared: Dataset) -> int:
    lakehouse = Lakehouse(config.lakehouse_root)
    layered = dataset_streams(declared)
    bronze_stream, silver_stream = declared.stream("bronze"), declared.stream("silver")
    # The fused stream never reads bronze back: silver kept one copy of each record, and bronze is only mended.
    fused = bool(pipeline_streams.streams_holding_the_lakehouse(spark, lakehouse, Mode.FUSED, declared))
    streams = [layered[bronze_stream], fused_stream(declared)] if fused else with_downstream(bronze_stream, declared)
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    way_out = f"Then run `checkpoints drop-bronze-copies --dataset {declared.name}` again."
    try:
        # Held throughout: no stream writes between finding the copies, dropping them and the reset.
        with holding(spark, lakehouse, [each.name for each in streams], way_out=way_out, ttl_s=ttl_s):
            copies = bronze_layer.find_copies(spark, lakehouse, declared)
            if copies is None:
                bronze_layer.drop_copies(spark, lakehouse, None, declared)  # appendOnly back, if a run was cut short
                print(f"{declared.name}: nothing to drop: bronze holds each record once")
                return ExitCode.OK
            reset = [] if fused else with_downstream(silver_stream, declared)
            names = ", ".join(each.name for each in reset) or "nothing (the fused stream goes on)"
            what = f"remove {copies.describe()} from {declared.bronze} (the first copy of each stays) and reset {names}"
            refused = confirmation(
                yes,
                lambda: Refusal.COPIES_UNCONFIRMED.message(
                    bronze_stream, what=what, again=f"`checkpoints drop-bronze-copies --dataset {declared.name} --yes`"
                ),
                f"Bronze holds records more than once.\nThis will {what}.\n",
                "nothing dropped",
            )
            if refused is not None:
                return refused
            if reset:
                mark = {REBUILDING_PROPERTY % silver_stream: str(uuid.uuid4())}
                for table in layered[silver_stream].sinks:
                    set_properties(spark, lakehouse.table(table), mark)
            with LiveLine(spark, f"dropping bronze's copies, then resetting {names}"):
                bronze_layer.drop_copies(spark, lakehouse, copies, declared)
                if reset:
                    pipeline_streams.reset(spark, lakehouse, reset, config.gold_window, declared, config=config)
    except (LeaseHeld, TableSchemaError) as error:
        print(f"refusing to drop bronze's copies: {error}", file=sys.stderr)
        return ExitCode.REFUSED
    print(f"removed {copies.describe()} from {declared.bronze}; reset {names}: the next run resumes consistently")
    return ExitCode.OK
