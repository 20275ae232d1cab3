"""The streams of the pipeline, started and reset: Kafka -> bronze -> silver -> gold -> each egress.

Each layer's whole story is in its own module (``bronze.py``, ``silver.py``, ``gold.py``, the
``egress/`` package): its source, its pure transforms, its idempotent writer and its guards.
This module wires a stream to what every stream shares, in the same order for each:

1. the tables exist with the schemas of the dataset's contract (``delta/tables.py``);
2. one process per stream: a lease beside the checkpoint (``recovery/lease.py``);
3. the checkpoint is bound to the stream's tables, and a lost, swapped or older checkpoint is
   refused with its way out (``recovery/checkpoints.py``); the mode is checked and the checkpoint
   made while the other mode's leases are held too (``check_mode``);
4. the layer's own guards, then its stream, started with the checkpoint and the trigger.

Exactly-once, end to end, rests on three parts:
* a replayable source: Kafka offsets (bronze) and Delta table versions (silver,
  gold) are written to the stream's offset log before a batch runs;
* the checkpoint: a batch whose commit-log entry is missing is replayed with
  exactly the offsets logged for it;
* idempotent sinks: every stream writes in foreachBatch and tags each Delta
  commit with (stream id, batch id): an append in bronze, MERGEs in silver and
  gold. A replayed batch finds its tag committed and changes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from . import bronze, fused, gold, silver
from .config import Config, Mode, duration_seconds
from .dataset import Dataset, Naming
from .datasets import config_of, owner, running
from .datasets.events import DATASET as EVENTS_DATASET
from .delta.tables import (
    Lakehouse,
    Layer,
    Stream,
    commit_actions,
    dataset_streams,
    ensure_tables,
    fused_stream,
    latest_snapshot,
    read_properties,
    set_properties,
    silver_schema,
    table_exists,
    with_downstream,
)
from .delta.writes import FENCED_BATCH, Delivery, cancel_warm_ups
from .egress import configured, published, target
from .egress import stream as egress_stream
from .expectations import check_expectations
from .kafka import identity
from .recovery import checkpoints, lease, rebuild
from .recovery.sink_progress import IDENTITY_PROPERTY, START_PROPERTY
from .refusals import Refusal

log = logging.getLogger(__name__)


def trigger_for(config: Config, available_now: bool, layer: str = Layer.BRONZE) -> dict:
    """The trigger of a stream of ``layer`` (a ``Layer``'s value).

    Bronze runs every trigger_interval. Silver and gold poll their source table at the
    shorter downstream_trigger_interval: with the full interval each, a record waited up
    to one interval per layer on its way to gold. A poll that finds no new commit runs
    no batch.
    """
    if available_now:
        return {"availableNow": True}
    if layer in (Layer.BRONZE, Layer.FUSED):
        return {"processingTime": config.trigger_interval}
    interval = min(
        (config.trigger_interval, config.downstream_trigger_interval),
        key=lambda value: duration_seconds(value, "pipeline.downstream_trigger_interval"),
    )
    return {"processingTime": interval}


def start_stream(
    spark: SparkSession,
    config: Config,
    layer: str,
    available_now: bool,
    delivery: Delivery = Delivery.EXACTLY_ONCE,
    dataset: Dataset | None = None,
) -> StreamingQuery:
    """Start one stream of ``dataset`` by its name (a layer's, a gold's, the fused one), or an egress.
    Without ``dataset``, the stream of the project's dataset that declares it (``datasets.owner``).

    Example::

        start_stream(spark, config, "silver", available_now=True).awaitTermination()
    """
    egresses = configured(config)
    stream = declared_stream(config, layer, dataset)
    dataset = stream.dataset
    fused_one = fused_stream(dataset)
    lakehouse = Lakehouse(config.lakehouse_root)
    schemas = silver.schemas_for(config, dataset)  # ConfigError before anything starts, for a format it needs
    if layer in (dataset.stream("silver"), fused_one.name):
        silver.check_latest_writers(config_of(config, dataset), dataset)
        check_expectations(spark, dataset.name, dataset.expectations, silver_schema(dataset.contract))
    ensure_tables(spark, lakehouse, dataset, change_feed=published(config, dataset))
    # Before prepare, which writes the checkpoint's metadata and binds the tables.
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    stream_lease = lease.acquire(spark, lakehouse, layer, ttl_s=ttl_s)
    stream_lease.heartbeat()  # renewed while the stream starts, too
    try:
        check_mode(spark, lakehouse, layer, dataset)  # at once, without waiting on a lease, where it refuses anyway
        with other_mode_held(spark, lakehouse, layer, ttl_s, dataset):
            check_mode(spark, lakehouse, layer, dataset)  # again, now that no stream of the other mode can start
            prepared = checkpoints.prepare(spark, lakehouse, stream)
        if stream.layer in (Layer.BRONZE, Layer.FUSED):
            bronze.check_subscription(spark, config, lakehouse, layer, dataset)
        if stream.layer in (Layer.GOLD, Layer.FUSED):
            for each in [stream.gold] if stream.layer is Layer.GOLD else dataset.golds:
                window = gold.window_of(each, config.gold_window)
                gold.check_window(spark, lakehouse, window, layer, dataset.gold_table(each))
        if delivery is Delivery.AT_LEAST_ONCE:
            prepared = dataclasses.replace(prepared, stream_id=None)
        starters: dict[Layer, Callable[[], DataStreamWriter]] = {
            Layer.BRONZE: lambda: bronze.stream_writer(spark, config, lakehouse, prepared, dataset),
            Layer.SILVER: lambda: silver.stream_writer(spark, lakehouse, prepared, dataset, schemas),
            Layer.GOLD: lambda: gold.stream_writer(spark, config, lakehouse, prepared, dataset, stream.gold),
            Layer.FUSED: lambda: fused.stream_writer(spark, config, lakehouse, prepared, dataset, schemas),
        }
        if layer in egresses:
            module = egresses[layer]
            writer = module.start(spark, config, lakehouse, prepared.stream_id, target(config, layer))
        else:
            writer = starters[stream.layer]()
        query = (
            writer.option("checkpointLocation", lakehouse.checkpoint(layer))
            .queryName(layer)
            .trigger(**trigger_for(config, available_now, stream.layer.value))
            .start()
        )
    except BaseException:
        stream_lease.release()  # a refused or failed start leaves the stream free at once
        raise
    stream_lease.guard(query)
    return query


def declared_stream(config: Config, name: str, dataset: Dataset | None = None) -> Stream:
    """The stream ``name`` of ``dataset`` (a layer's, a gold's, the fused one) or an egress stream the config
    runs, with the table it reads and the tables it writes. Without ``dataset``, of the project's dataset
    that declares it (``datasets.owner``); an egress stream is of the dataset whose gold it publishes.

    Example::

        declared_stream(config, "orders_silver").source  # "bronze_orders"
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a stream's name, not {type(name).__name__}")
    if name in configured(config):
        return egress_stream(name)
    own = dataset or owner(name) or EVENTS_DATASET
    fused_one = fused_stream(own)
    found = dataset_streams(own).get(name) or (fused_one if name == fused_one.name else None)
    if found is None:
        raise ValueError(f"layer must be one of {', '.join(stream_names(config, dataset))}, not {name!r}")
    return found


def stream_names(config: Config, dataset: Dataset | None = None) -> tuple[str, ...]:
    """Every stream of ``dataset`` (default: of each dataset the config runs, in turn) the config runs: its
    layers, one stream per gold (or the fused stream), then each egress stream that publishes one of its golds.

    Example::

        stream_names(config)  # ("bronze", "silver", "gold", "orders_bronze", ..., "kafka_egress")
    """
    datasets = running(config) if dataset is None else (dataset,)
    layers = [
        name
        for each in datasets
        for name in ((fused_stream(each).name,) if config.mode is Mode.FUSED else tuple(dataset_streams(each)))
    ]
    names = {each.name for each in datasets}
    return (*layers, *(name for name in configured(config) if target(config, name).dataset.name in names))


def streams_holding_the_lakehouse(
    spark: SparkSession, lakehouse: Lakehouse, mode: Mode, dataset: Dataset = EVENTS_DATASET
) -> list[str]:
    """The streams of ``dataset`` in ``mode`` that have a checkpoint in ``lakehouse`` (an id in its metadata).

    Example::

        streams_holding_the_lakehouse(spark, Lakehouse("/data/lake"), Mode.LAYERED)  # ["bronze", "silver", "gold"]
    """
    if not isinstance(mode, Mode):
        raise TypeError(f"mode must be a Mode, not {type(mode).__name__}")
    names = (fused_stream(dataset).name,) if mode is Mode.FUSED else tuple(dataset_streams(dataset))
    return [
        name
        for name in names
        if checkpoints.read_stream_id_if_readable(spark, lakehouse.checkpoint(name), name) is not None
    ]


# How long a layered start waits for the fused stream's lease while another start holds it for its own check.
MODE_CHECK_WAIT_S = 60.0


def other_mode_streams(layer: str, dataset: Dataset = EVENTS_DATASET) -> list[str]:
    """The streams of ``dataset`` of the mode its stream ``layer`` is not of: the fused stream for a layer,
    the layers for the fused stream; none for an egress, which runs in either mode.

    Example::

        other_mode_streams("silver")  # ["fused"]
    """
    layered, fused_name = list(dataset_streams(dataset)), fused_stream(dataset).name
    if layer == fused_name:
        return layered
    if layer in layered:
        return [fused_name]
    return []


@contextmanager
def other_mode_held(
    spark: SparkSession,
    lakehouse: Lakehouse,
    layer: str,
    ttl_s: float = lease.DEFAULT_TTL_S,
    dataset: Dataset = EVENTS_DATASET,
) -> Iterator[None]:
    """Hold the leases of the other mode's streams for a block: ``layer``'s mode check and the checkpoint it
    makes. Without them, two starts of different modes on an empty lakehouse both find no checkpoint of
    the other mode and both make their own.

    A fused start refuses (LeaseHeld) at once where a layered stream runs or starts. A layered start
    waits up to ``MODE_CHECK_WAIT_S`` for the fused lease, which another layered start holds for its
    own check for a moment, then refuses naming its holder.

    Example::

        with other_mode_held(spark, Lakehouse("/data/lake"), "bronze"):
            check_mode(spark, Lakehouse("/data/lake"), "bronze")  # no fused start meanwhile
    """
    others = other_mode_streams(layer, dataset)
    if not others:
        yield
        return
    mode = Mode.FUSED if layer == fused_stream(dataset).name else Mode.LAYERED
    way_out = f"The two modes never run side by side: `{switch_command(mode, dataset)}` hands the lakehouse over."
    deadline = time.monotonic() + (0 if mode is Mode.FUSED else MODE_CHECK_WAIT_S)
    held = ExitStack()
    while True:
        try:
            held.enter_context(lease.holding(spark, lakehouse, others, way_out=way_out, ttl_s=ttl_s))
            break
        except lease.LeaseHeld:
            if time.monotonic() >= deadline:
                raise
            time.sleep(lease.WATCH_INTERVAL_S)
            check_mode(spark, lakehouse, layer, dataset)  # the fused start that held it may have made its checkpoint
    with held:
        yield


def check_mode(spark: SparkSession, lakehouse: Lakehouse, layer: str, dataset: Dataset = EVENTS_DATASET) -> None:
    """Refuse a stream of ``dataset`` of one mode where the other mode's streams carry its tables on.

    The layered bronze stream would read Kafka again from its own, older offsets, and the layered gold
    would add silver rows the fused stream added already (and the other way round): the two modes
    never run side by side, and one hands over to the other with ``switch_mode``.

    Example::

        check_mode(spark, Lakehouse("/data/lake"), "fused")  # or CheckpointError naming `checkpoints switch fused`
    """
    if layer == fused_stream(dataset).name:
        mode, other = Mode.FUSED, Mode.LAYERED
    elif layer in dataset_streams(dataset):
        mode, other = Mode.LAYERED, Mode.FUSED
    else:
        return  # an egress reads gold's changes in either mode
    found = streams_holding_the_lakehouse(spark, lakehouse, other, dataset)
    if found:
        raise checkpoints.CheckpointError(
            Refusal.OTHER_MODE.message(
                layer,
                mode=mode.value,
                switch=f"`{switch_command(mode, dataset)}`",
                other=other.value,
                streams=", ".join(found),
                checkpoints=", ".join(lakehouse.checkpoint(name) for name in found),
            )
        )


def run_available_now(
    spark: SparkSession, config: Config, layers: tuple[str, ...] | None = None, dataset: Dataset | None = None
) -> None:
    """Process everything available in ``layers`` (stream names; default ``stream_names(config, dataset)``),
    each of ``dataset``, or without one, of the project's dataset that declares it.

    A stream starts once every stream among ``layers`` that writes the table it reads has ended, so it sees
    all they wrote; streams that do not read each other's tables (two datasets, a dataset's golds, the
    egresses of one gold) run side by side in this driver. Starts take turns (``ensure_tables`` and the
    checks before a start see one start at a time). After a failure no other stream starts, the ones
    running end their available batches, and the failure of the first failed stream in ``layers``' order
    is raised; LeaseLost, naming the stream and the way out, if it stopped because this process lost its
    lease.

    Example::

        run_available_now(spark, config)  # bronze, then silver, then gold; orders' streams beside them
    """
    names = list(stream_names(config, dataset) if layers is None else layers)
    waits_for = upstream_streams(config, names, dataset)
    lakehouse = Lakehouse(config.lakehouse_root)
    starting = threading.Lock()

    def run(layer: str) -> None:
        # PySpark gives each Python thread a JVM thread of its own, without the driver's active session,
        # which Delta asks for where it loads a table from its checkpoint.
        SparkSession._get_j_spark_session_class(spark._jvm).setActiveSession(spark._jsparkSession)
        with starting:
            query = start_stream(spark, config, layer, available_now=True, dataset=dataset)
        try:
            query.awaitTermination()
        except StreamingQueryException:
            lease.check_not_lost(lakehouse, layer)  # a batch refused to write: say why, not how
            raise
        # A stream the heartbeat stopped because its lease was lost ends like one that
        # finished: the streams after it must not start as if it had written everything.
        lease.check_not_lost(lakehouse, layer)

    ended: set[str] = set()
    failures: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max_workers=len(names) or 1, thread_name_prefix="available-now") as pool:
        running: dict[Future, str] = {}
        waiting = list(names)
        while waiting or running:
            ready = [name for name in waiting if waits_for[name] <= ended] if not failures else []
            for name in ready:
                waiting.remove(name)
                running[pool.submit(run, name)] = name
            if not running:
                break  # what waits, waits on a stream that failed
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                name = running.pop(future)
                error = future.exception()
                if error is None:
                    ended.add(name)
                else:
                    failures[name] = error
            if not running:
                cancel_warm_ups(spark)  # the warm-ups after the last batches have no batch to serve
    if failures:
        first, *others = sorted(failures, key=names.index)
        for name in others:
            log.warning("%s failed too: %s", name, failures[name])
        raise failures[first]


def upstream_streams(config: Config, names: list[str], dataset: Dataset | None = None) -> dict[str, set[str]]:
    """For each stream of ``names``, the streams among ``names`` that write the table it reads.

    Example::

        upstream_streams(config, ["bronze", "silver", "gold"])  # {"bronze": set(), "silver": {"bronze"}, ...}
    """
    declared = {name: declared_stream(config, name, dataset) for name in names}
    return {
        name: {other for other, writer in declared.items() if other != name and stream.source in writer.sinks}
        for name, stream in declared.items()
    }


def reset(
    spark: SparkSession,
    lakehouse: Lakehouse,
    streams: list[Stream],
    gold_window: str,
    dataset: Dataset = EVENTS_DATASET,
    config: Config | None = None,
) -> list[rebuild.Rebuilt]:
    """Forget the checkpoints of ``streams`` (of ``dataset``, or egresses); rebuild aside the ones that are
    rebuilt, each in one commit per table.

    The ids of the streams it ends are fenced first: on their Delta tables (``checkpoints.reset``)
    and, for an egress ``config`` turns on, on its sink (the egress's ``fence``), so a process of an
    old stream that wakes after the reset writes nothing.

    Silver is rebuilt only with gold (a reset of silver or above): an overwrite of silver would stop a gold
    stream that goes on reading it. Alone (``--only``), silver's new stream re-reads bronze keeping each
    record once instead (see ``rebuild.rebuilt_by_reset``).

    Example::

        reset(spark, Lakehouse("/data/lake"), with_downstream("silver"), config.gold_window)
    """
    duration_seconds(gold_window, "pipeline.gold_window")
    egresses = configured(config) if config is not None else {}
    # As ``dataset`` declares them now: a gold's stream rebuilds the gold declared today.
    layered = dataset_streams(dataset)
    streams = [layered.get(stream.name, stream) for stream in streams]
    for stream in streams:
        if stream.name in egresses:
            old_id = checkpoints.read_stream_id_if_readable(spark, lakehouse.checkpoint(stream.name), stream.name)
            if old_id is not None:
                egresses[stream.name].fence(config, old_id)
    checkpoints.reset(spark, lakehouse, streams)
    # A reset before the first run rebuilds tables no stream has made yet: made here, as a start makes
    # them. The ones that exist are rebuilt under the contract, which may be another than theirs.
    change_feed = published(config, dataset) if config is not None else ()
    ensure_tables(spark, lakehouse, dataset, change_feed=change_feed, check_existing=False)
    bronze_reset = any(stream.layer is Layer.BRONZE for stream in streams)
    if bronze_reset and table_exists(spark, lakehouse.table(dataset.bronze)):
        identity.forget_cluster(spark, lakehouse, dataset)  # the reset accepts the cluster that answers now
    rebuilt = []
    schemas = silver.schemas_for(config, dataset) if config is not None else None
    for stream in rebuild.rebuilt_by_reset(streams):
        if stream.layer is Layer.SILVER:
            rebuilt.append(
                rebuild.rebuild(
                    spark, lakehouse, stream, lambda bronze_rows: silver.rebuilt_rows(bronze_rows, dataset, schemas)
                )
            )
            continue
        window = gold.window_of(stream.gold, gold_window)
        rebuilt.append(
            rebuild.rebuild(
                spark,
                lakehouse,
                stream,
                lambda silver_rows, each=stream.gold: gold.rebuilt_rows(silver_rows, gold_window, dataset, each),
                {gold.WINDOW_PROPERTY: window},
            )
        )
    return rebuilt


def switch_mode(spark: SparkSession, config: Config, to: Mode, dataset: Dataset = EVENTS_DATASET) -> str:
    """Hand the lakehouse over from the other mode's streams to those of ``to``, exactly; says what it did.

    To fused: silver and gold first read everything bronze and silver hold (an availableNow run of
    each), then their checkpoints end, their ids fenced on their tables, and the fused stream gets a
    checkpoint of its own: it reads Kafka after the offsets bronze holds and adds to silver and gold
    from there. To layered: a batch the fused stream planned and did not finish is finished first
    (an availableNow run); then its checkpoint ends, its id fenced, and silver's and gold's new
    streams start after the versions of bronze and silver it wrote (the property a rebuild sets),
    bronze's after the offsets bronze holds. A fused stream that cannot resume as it is (its
    checkpoint lost, or refused) says nothing certain of its last batch: silver and gold are then
    rebuilt from bronze, as a reset of silver rebuilds them.

    Every stream of both modes must be stopped: their leases are held while the checkpoints change. Under
    them the ids of the streams that end are fenced on their tables first, and what the hand-over goes by is
    read after the fence: a process of the other mode that stood still past its lease and wakes inside the
    switch cannot commit after the check. A layered commit that landed before the fence and that silver or
    gold never read has silver and gold rebuilt from bronze (as a reset of silver rebuilds them), so the
    fused stream never starts past rows silver lacks.

    Example::

        switch_mode(spark, config, Mode.FUSED)  # "silver and gold read bronze to version 41; ..."
    """
    if not isinstance(to, Mode):
        raise TypeError(f"to must be a Mode, not {type(to).__name__}")
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse, dataset, change_feed=published(config, dataset))
    fused_one, layered = fused_stream(dataset), dataset_streams(dataset)
    fused_checkpoint = bool(streams_holding_the_lakehouse(spark, lakehouse, Mode.FUSED, dataset))
    # Nothing of the fused stream left (its checkpoint, or its id on a table: a switch cut short) is layered.
    if to is Mode.FUSED:
        already = fused_checkpoint
    else:
        already = not fused_checkpoint and not _fused_ids(spark, lakehouse, dataset)
    if already:
        return f"the lakehouse runs in the {to.value} mode already: nothing to hand over"
    if to is Mode.FUSED:
        run_available_now(spark, config, _downstream_of_bronze(dataset), dataset)
    else:
        state = checkpoints.inspect(spark, lakehouse, fused_one)
        if state.stream_id is not None and state.refusal() is None and state.last_planned != state.last_committed:
            run_available_now(spark, config, (fused_one.name,), dataset)
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    way_out = f"Then run `{switch_command(to, dataset)}` again."
    with lease.holding(spark, lakehouse, [*layered, fused_one.name], way_out=way_out, ttl_s=ttl_s):
        if to is Mode.FUSED:
            if streams_holding_the_lakehouse(spark, lakehouse, Mode.FUSED, dataset):  # another switch was quicker
                return f"the lakehouse runs in the {to.value} mode already: nothing to hand over"
            return _hand_to_fused(spark, lakehouse, config, dataset)
        return _hand_to_layered(spark, lakehouse, config, dataset)


def switch_command(to: Mode, dataset: Dataset = EVENTS_DATASET) -> str:
    """The command that hands ``dataset``'s tables over to the streams of mode ``to``.

    Example::

        switch_command(Mode.FUSED, ORDERS)  # "checkpoints switch fused --dataset orders"
    """
    if not isinstance(to, Mode):
        raise TypeError(f"to must be a Mode, not {type(to).__name__}")
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    named = "" if dataset.naming is Naming.SOLE else f" --dataset {dataset.name}"
    return f"checkpoints switch {to.value}{named}"


def _downstream_of_bronze(dataset: Dataset) -> tuple[str, ...]:
    """The names of ``dataset``'s silver stream and of each gold's, in the order they run."""
    return tuple(name for name in dataset_streams(dataset) if name != dataset.stream("bronze"))


def _fused_ids(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset) -> set[str]:
    fused_one = fused_stream(dataset)
    return {
        value
        for name in fused_one.sinks
        if (value := read_properties(spark, lakehouse.table(name)).get(IDENTITY_PROPERTY % fused_one.name))
    }


def _hand_to_fused(spark: SparkSession, lakehouse: Lakehouse, config: Config, dataset: Dataset) -> str:
    layered = dataset_streams(dataset)
    # Fence first, then check: from the fence on no layered commit lands, so what is unread now stays so.
    checkpoints.fence(spark, lakehouse, list(layered.values()))
    unread = {name: _first_unread_rows(spark, lakehouse, layered[name]) for name in _downstream_of_bronze(dataset)}
    overtaken = [f"{layered[name].source} version {version}" for name, version in unread.items() if version is not None]
    if overtaken:
        # A layered process wrote after silver and gold finished (one that stood still past its lease):
        # rows silver or gold never read. Their ids are fenced, so they can no longer read them: rebuilt.
        rebuilt = reset_fused(spark, config, dataset)
        done = ", ".join(f"{each.stream} from {each.source} version {each.source_version}" for each in rebuilt)
        return (
            f"{' and '.join(overtaken)} added rows while the switch ran, never read by the layer below: rebuilt "
            f"{done}; the layered checkpoints are gone and the fused stream reads Kafka after the offsets bronze holds"
        )
    checkpoints.reset(spark, lakehouse, list(layered.values()))
    checkpoints.create_stream_id(spark, lakehouse.checkpoint(fused_stream(dataset).name))
    versions = {
        name: latest_snapshot(spark, lakehouse.table(name)).version() for name in (dataset.bronze, dataset.silver)
    }
    return (
        f"silver holds bronze to version {versions[dataset.bronze]} and gold silver to version "
        f"{versions[dataset.silver]}; the layered checkpoints are gone and the fused stream reads Kafka after "
        "the offsets bronze holds"
    )


def _first_unread_rows(spark: SparkSession, lakehouse: Lakehouse, stream: Stream) -> int | None:
    """The first version of ``stream``'s source that adds rows the stream has not read in a committed batch;
    None when it read them all. A fence's commit adds none."""
    state = checkpoints.inspect(spark, lakehouse, stream)
    # Where its last committed batch ended: a batch planned and not committed may never have been written.
    first = 0 if state.source is None else state.source.resumes_from.newest_read + 1
    newest = latest_snapshot(spark, lakehouse.table(stream.source)).version()
    for version in range(first, newest + 1):
        actions = commit_actions(spark, lakehouse.table(stream.source), version) or []
        if any(action.get("txn", {}).get("version") == FENCED_BATCH for action in actions):
            continue
        if any("add" in action and action["add"].get("dataChange", True) for action in actions):
            return version
    return None


def _fused_finished(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset) -> bool:
    """Whether ``dataset``'s fused stream can resume as it is and its last planned batch reached all of its tables:
    then silver holds all of bronze and each gold all of silver. A metadata file that cannot be read says nothing."""
    try:
        state = checkpoints.inspect(spark, lakehouse, fused_stream(dataset))
    except checkpoints.CheckpointError:
        return False
    return state.stream_id is not None and state.refusal() is None and state.last_planned == state.last_committed


def _fused_progress(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset) -> tuple[int | None, int | None]:
    checkpoint = lakehouse.checkpoint(fused_stream(dataset).name)
    return checkpoints.last_planned_batch(spark, checkpoint), checkpoints.last_committed_batch(spark, checkpoint)


def _hand_to_layered(spark: SparkSession, lakehouse: Lakehouse, config: Config, dataset: Dataset) -> str:
    fused_one, layered = fused_stream(dataset), dataset_streams(dataset)
    # Whether it can resume as it is, read before the fence (after it, its tables read as ahead of it).
    finished = _fused_finished(spark, lakehouse, dataset)
    progress = _fused_progress(spark, lakehouse, dataset)
    # Fence first, then check: a fused process that stood still past its lease commits nothing from here
    # on, and a batch it planned or finished since the look above shows in its checkpoint now.
    checkpoints.fence(spark, lakehouse, [fused_one])
    finished = finished and _fused_progress(spark, lakehouse, dataset) == progress
    checkpoints.reset(spark, lakehouse, [fused_one])
    if not finished:
        silver_and_down = with_downstream(dataset.stream("silver"), dataset)
        rebuilt = reset(spark, lakehouse, silver_and_down, config.gold_window, dataset, config)
        done = ", ".join(f"{each.stream} from {each.source} version {each.source_version}" for each in rebuilt)
        return (
            f"the fused stream's last batch is not known to be whole: rebuilt {done}; bronze resumes after its offsets"
        )
    started = {}
    for name in _downstream_of_bronze(dataset):
        stream = layered[name]
        source_version = latest_snapshot(spark, lakehouse.table(stream.source)).version()
        stream_id = str(uuid.uuid4())
        start = json.dumps({"stream_id": stream_id, "source_version": source_version + 1})
        for position, table in enumerate(stream.sinks):
            properties = {IDENTITY_PROPERTY % name: stream_id}
            if position == 0:
                properties[START_PROPERTY % name] = start
            set_properties(spark, lakehouse.table(table), properties)
        checkpoints.create_stream_id(spark, lakehouse.checkpoint(name), stream_id)
        started[name] = source_version + 1
    silver_name, *gold_names = _downstream_of_bronze(dataset)
    golds = " and ".join(f"{name} at silver version {started[name]}" for name in gold_names)
    return (
        f"{silver_name} starts at bronze version {started[silver_name]}, {golds}; "
        "bronze resumes after the offsets it holds"
    )


def reset_fused(spark: SparkSession, config: Config, dataset: Dataset = EVENTS_DATASET) -> list[rebuild.Rebuilt]:
    """Start the fused stream anew: its id fenced, silver and gold rebuilt from bronze, a new checkpoint.

    What `checkpoints reset bronze` is to the layered streams: whatever the fused stream's last batch
    left half-written, silver and quarantine are rebuilt from bronze (aside, swapped in) and gold from
    silver, and the new fused stream reads Kafka after the offsets bronze holds. The caller holds the
    leases of every stream of both modes.

    Example::

        reset_fused(spark, config)  # [Rebuilt("silver", ...), Rebuilt("gold", ...)]
    """
    lakehouse, fused_one = Lakehouse(config.lakehouse_root), fused_stream(dataset)
    checkpoints.reset(spark, lakehouse, [fused_one])
    silver_and_down = with_downstream(dataset.stream("silver"), dataset)
    rebuilt = reset(spark, lakehouse, silver_and_down, config.gold_window, dataset, config)
    # The rebuild leaves silver and gold to new layered streams: their ids are ended at once.
    checkpoints.reset(spark, lakehouse, list(dataset_streams(dataset).values()))
    checkpoints.create_stream_id(spark, lakehouse.checkpoint(fused_one.name))
    return rebuilt


def restart_fused(spark: SparkSession, config: Config, dataset: Dataset = EVENTS_DATASET) -> str:
    """A new fused checkpoint that reads Kafka after the offsets bronze holds, silver and gold left as they are:
    `checkpoints reset fused --only`, the way out of a changed subscription or topic, and what
    `checkpoints accept-loss` does after recording the lost records. Exact when the fused stream's last
    batch reached all four tables; otherwise silver and gold are rebuilt from bronze first
    (``reset_fused``). The caller holds the leases of every stream of both modes. Says what it did.

    Example::

        restart_fused(spark, config)  # "the fused stream resumes after the Kafka offsets bronze holds"
    """
    lakehouse, fused_one = Lakehouse(config.lakehouse_root), fused_stream(dataset)
    if not _fused_finished(spark, lakehouse, dataset):
        rebuilt = reset_fused(spark, config, dataset)
        done = ", ".join(f"{each.stream} from {each.source} version {each.source_version}" for each in rebuilt)
        return f"the fused stream's last batch is not known to be whole: rebuilt {done}; it resumes after bronze"
    checkpoints.reset(spark, lakehouse, [fused_one])
    identity.forget_cluster(spark, lakehouse, dataset)  # the reset accepts the cluster that answers now
    checkpoints.create_stream_id(spark, lakehouse.checkpoint(fused_one.name))
    return "the fused stream resumes after the Kafka offsets bronze holds; silver and gold stay as they are"
