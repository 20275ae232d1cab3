"""The streams of the pipeline, started and reset: Kafka -> bronze -> silver -> gold -> each egress.

Each layer's whole story is in its own module (``bronze.py``, ``silver.py``, ``gold.py``, the
``egress/`` package): its source, its pure transforms, its idempotent writer and its guards.
This module wires a stream to what every stream shares, in the same order for each:

1. the tables exist with the schemas of the event contract (``delta/tables.py``);
2. one process per stream: a lease beside the checkpoint (``recovery/lease.py``);
3. the checkpoint is bound to the stream's tables, and a lost, swapped or older checkpoint is
   refused with its way out (``recovery/checkpoints.py``);
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
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from . import bronze, gold, silver
from .config import Config, duration_seconds
from .contract import EVENTS, Contract
from .delta.tables import BRONZE, LAYERS, STREAMS, Lakehouse, Stream, ensure_tables, table_exists
from .delta.writes import Delivery, cancel_warm_ups
from .egress import configured
from .egress import stream as egress_stream
from .kafka import identity
from .recovery import checkpoints, lease, rebuild


def trigger_for(config: Config, available_now: bool, layer: str = "bronze") -> dict:
    """The trigger of ``layer``'s stream.

    Bronze runs every trigger_interval. Silver and gold poll their source table at the
    shorter downstream_trigger_interval: with the full interval each, a record waited up
    to one interval per layer on its way to gold. A poll that finds no new commit runs
    no batch.
    """
    if available_now:
        return {"availableNow": True}
    if layer == "bronze":
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
    contract: Contract = EVENTS,
) -> StreamingQuery:
    """Start one stream of the pipeline; silver parses and gold aggregates by ``contract``.

    Example::

        start_stream(spark, config, "silver", available_now=True).awaitTermination()
    """
    egresses = configured(config)
    if layer not in STREAMS and layer not in egresses:
        raise ValueError(f"layer must be one of {', '.join(stream_names(config))}, not {layer!r}")
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse, contract, change_feed=bool(egresses))
    # Before prepare, which writes the checkpoint's metadata and binds the tables.
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    stream_lease = lease.acquire(spark, lakehouse, layer, ttl_s=ttl_s)
    stream_lease.heartbeat()  # renewed while the stream starts, too
    try:
        # An egress writes outside the lakehouse: it checks its own sink's marker against the checkpoint.
        stream = STREAMS.get(layer) or egress_stream(layer)
        prepared = checkpoints.prepare(spark, lakehouse, stream)
        if layer == "bronze":
            bronze.check_subscription(spark, config, lakehouse)
        if layer == gold.STREAM:
            gold.check_window(spark, lakehouse, config.gold_window)
        if delivery is Delivery.AT_LEAST_ONCE:
            prepared = dataclasses.replace(prepared, stream_id=None)
        starters: dict[str, Callable[[], DataStreamWriter]] = {
            "bronze": lambda: bronze.stream_writer(spark, config, lakehouse, prepared),
            "silver": lambda: silver.stream_writer(spark, lakehouse, prepared, contract),
            "gold": lambda: gold.stream_writer(spark, config, lakehouse, prepared, contract),
            **{
                name: (lambda module=module: module.start(spark, config, lakehouse, prepared.stream_id, contract))
                for name, module in egresses.items()
            },
        }
        writer = starters[layer]()
        query = (
            writer.option("checkpointLocation", lakehouse.checkpoint(layer))
            .queryName(layer)
            .trigger(**trigger_for(config, available_now, layer))
            .start()
        )
    except BaseException:
        stream_lease.release()  # a refused or failed start leaves the stream free at once
        raise
    stream_lease.guard(query)
    return query


def stream_names(config: Config) -> tuple[str, ...]:
    """Every stream the config runs: the three layers, then each egress it turns on."""
    return (*LAYERS, *configured(config))


def run_available_now(
    spark: SparkSession, config: Config, layers: tuple[str, ...] | None = None, contract: Contract = EVENTS
) -> None:
    """Process everything available, one stream after the other, so each sees what the one before wrote.

    Raises LeaseLost, naming the stream and the way out, if one stopped because this process lost its lease.
    """
    lakehouse = Lakehouse(config.lakehouse_root)
    for layer in stream_names(config) if layers is None else layers:
        try:
            try:
                start_stream(spark, config, layer, available_now=True, contract=contract).awaitTermination()
            except StreamingQueryException:
                lease.check_not_lost(lakehouse, layer)  # a batch refused to write: say why, not how
                raise
            # A stream the heartbeat stopped because its lease was lost ends like one that
            # finished: the next stream must not start as if this one had written everything.
            lease.check_not_lost(lakehouse, layer)
        finally:
            cancel_warm_ups(spark)  # the warm-up after the last batch has no batch to serve


def reset(
    spark: SparkSession,
    lakehouse: Lakehouse,
    streams: list[Stream],
    gold_window: str,
    contract: Contract = EVENTS,
    config: Config | None = None,
) -> list[rebuild.Rebuilt]:
    """Forget the checkpoints of ``streams``; rebuild aside the ones that are rebuilt, each in one commit per table.

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
    for stream in streams:
        if stream.name in egresses:
            old_id = checkpoints.read_stream_id_if_readable(spark, lakehouse.checkpoint(stream.name), stream.name)
            if old_id is not None:
                egresses[stream.name].fence(config, old_id)
    checkpoints.reset(spark, lakehouse, streams)
    # A reset before the first run rebuilds tables no stream has made yet: made here, as a start makes
    # them. The ones that exist are rebuilt under the contract, which may be another than theirs.
    ensure_tables(spark, lakehouse, contract, change_feed=bool(egresses), check_existing=False)
    if any(stream.name == "bronze" for stream in streams) and table_exists(spark, lakehouse.table(BRONZE)):
        identity.forget_cluster(spark, lakehouse)  # the reset accepts the cluster that answers now
    builders: dict[str, tuple[rebuild.RowsBuilder, dict[str, str]]] = {
        "silver": (lambda bronze_rows: silver.rebuilt_rows(bronze_rows, contract), {}),
        "gold": (
            lambda silver_rows: gold.rebuilt_rows(silver_rows, gold_window, contract),
            {gold.WINDOW_PROPERTY: gold_window},
        ),
    }
    return [
        rebuild.rebuild(spark, lakehouse, name, builders[name][0], builders[name][1], contract)
        for name in rebuild.rebuilt_by_reset(streams)
    ]
