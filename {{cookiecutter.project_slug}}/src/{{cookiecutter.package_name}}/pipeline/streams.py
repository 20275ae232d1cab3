"""The three streams of the medallion pipeline, wired source -> transform -> sink.

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
from collections.abc import Callable
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from . import checkpoints, lease, rebuild
from .config import Config, duration_seconds
from .contract import EVENTS, Contract
from .crash_points import BETWEEN_SINK_COMMITS, crash_points, reach
from .egress import configured
from .egress import stream as egress_stream
from .kafka_io import earliest_offsets, spark_source_options, topic_partitions
from .progress import QUARANTINE_ALERT_SHARE, report_quarantine
from .sink_progress import record_sink_versions
from .sinks import Delivery, add_to_windows, append_idempotent, insert_new_kafka_records, kafka_key_ranges
from .source_identity import SourceGuard
from .tables import BRONZE, GOLD, LAYERS, QUARANTINE, SILVER, STREAMS, Lakehouse, ensure_tables
from .transforms import (
    bronze_records,
    first_per_kafka_record,
    parse_events,
    quarantined_records,
    valid_events,
    window_aggregates,
    with_topic_ids,
)

log = logging.getLogger(__name__)

# Kafka's "earliest" in a startingOffsets JSON.
EARLIEST = -2


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
    stream_lease = lease.acquire(spark, lakehouse, layer)
    # An egress writes outside the lakehouse: it checks its own sink's marker against the checkpoint.
    stream = STREAMS.get(layer) or egress_stream(layer)
    prepared = checkpoints.prepare(spark, lakehouse, stream)
    if layer == "bronze":
        check_subscription(spark, config, lakehouse)
    if layer == rebuild.STREAM:
        rebuild.check_window(spark, lakehouse, config.gold_window)
    if delivery is Delivery.AT_LEAST_ONCE:
        prepared = dataclasses.replace(prepared, stream_id=None)
    starters: dict[str, Callable[[], DataStreamWriter]] = {
        "bronze": lambda: _start_bronze(spark, config, lakehouse, prepared),
        "silver": lambda: _start_silver(spark, lakehouse, prepared, contract),
        "gold": lambda: _start_gold(spark, config, lakehouse, prepared, contract),
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
    stream_lease.guard(query)
    return query


def stream_names(config: Config) -> tuple[str, ...]:
    """Every stream the config runs: the three layers, then each egress it turns on."""
    return (*LAYERS, *configured(config))


def run_available_now(
    spark: SparkSession, config: Config, layers: tuple[str, ...] | None = None, contract: Contract = EVENTS
) -> None:
    """Process everything available, one stream after the other, so each sees what the one before wrote."""
    for layer in stream_names(config) if layers is None else layers:
        start_stream(spark, config, layer, available_now=True, contract=contract).awaitTermination()


def _start_bronze(spark: SparkSession, config: Config, lakehouse: Lakehouse, prepared: checkpoints.Prepared):
    options = spark_source_options(config)
    resuming = checkpoints.last_planned_batch(spark, lakehouse.checkpoint("bronze")) is not None
    sources = SourceGuard.at_start(spark, config, lakehouse, resuming)
    if prepared.lost_checkpoint:
        options["startingOffsets"] = resume_offsets(spark, config, lakehouse, sources.recorded_ids)
        log.warning("bronze: checkpoint lost; resuming after the offsets in bronze: %s", options["startingOffsets"])
    bronze_path = lakehouse.table(BRONZE)

    def write_batch(rows: DataFrame, batch_id: int) -> None:
        # Asked before each batch: a topic created again since the start is refused before anything is written.
        identified = with_topic_ids(rows, sources.topic_ids())
        with crash_points(rows.sparkSession, "bronze", batch_id):
            append_idempotent(identified, bronze_path, prepared.stream_id, batch_id)

    kafka_rows = spark.readStream.format("kafka").options(**options).load()
    # Applied to the stream, not inside write_batch: here current_timestamp() is
    # the batch time from the offset log, the same when the batch is replayed.
    return bronze_records(kafka_rows).writeStream.foreachBatch(write_batch)


def check_subscription(spark: SparkSession, config: Config, lakehouse: Lakehouse) -> None:
    """Refuse bronze when the topics changed in a way Spark's source stops on for good; name the exact way out.

    Spark counts a topic dropped from the subscription as lost partitions, and an added one whose
    first offset is above 0 as missed records: with failOnDataLoss, every start fails. An added
    topic that starts at 0 is read from its beginning by Spark itself.

    Example::

        check_subscription(spark, config, Lakehouse("/data/lake"))  # or CheckpointError
    """
    checkpoint = lakehouse.checkpoint("bronze")
    offsets = checkpoints.committed_offsets(spark, checkpoint)
    if offsets is None or not config.kafka.fail_on_data_loss:
        return
    read, wanted = set(json.loads(offsets)), set(config.kafka.topics)
    removed = sorted(read - wanted)
    late = {f"{t}[{p}]": first for (t, p), first in earliest_offsets(config, sorted(wanted - read)).items() if first}
    if not removed and not late:
        return
    found = []
    if removed:
        found.append(f"removed from kafka.topics: {', '.join(removed)}")
    if late:
        found.append("added above offset 0: " + ", ".join(f"{tp} starts at offset {o}" for tp, o in late.items()))
    raise checkpoints.CheckpointError(
        f"bronze: checkpoint {checkpoint} reads topics {sorted(read)}, but kafka.topics is {sorted(wanted)} "
        f"({'; '.join(found)}): Spark would stop on this as lost data at every start. Way out: "
        f"`{checkpoints.COMMAND} checkpoints reset bronze --only` (it asks first; add `--yes` when not on a "
        f"terminal): bronze alone starts a new checkpoint that resumes each topic after the offsets bronze "
        f"holds and reads an added topic from its first offset; a removed topic's records stay in bronze, "
        f"silver and gold go on as they are."
    )


def resume_offsets(spark: SparkSession, config: Config, lakehouse: Lakehouse, topic_ids: dict[str, str]) -> str:
    """startingOffsets JSON: the next offset after what bronze holds of each topic's current id, earliest elsewhere.

    Rows of a topic's earlier incarnation (another id) say nothing about the current one's offsets.
    """
    ingested = {}
    if topic_ids:
        current = reduce(
            lambda left, right: left | right,
            [(F.col("topic") == topic) & (F.col("topic_id") == topic_id) for topic, topic_id in topic_ids.items()],
        )
        ingested = {
            (row.topic, row.partition): row.next_offset
            for row in spark.read.format("delta")
            .load(lakehouse.table(BRONZE))
            .where(current)
            .groupBy("topic", "partition")
            .agg((F.max("offset") + 1).alias("next_offset"))
            .collect()
        }
    offsets = {
        topic: {str(p): ingested.get((topic, p), EARLIEST) for p in partitions}
        for topic, partitions in topic_partitions(config).items()
    }
    return json.dumps(offsets)


def _start_silver(spark: SparkSession, lakehouse: Lakehouse, prepared: checkpoints.Prepared, contract: Contract):
    silver_path, quarantine_path = lakehouse.table(SILVER), lakehouse.table(QUARANTINE)
    checkpoint, sinks = lakehouse.checkpoint("silver"), {SILVER: silver_path, QUARANTINE: quarantine_path}

    def write_batch(bronze_batch: DataFrame, batch_id: int) -> None:
        parsed = parse_events(first_per_kafka_record(bronze_batch), contract).persist()
        try:
            with crash_points(bronze_batch.sparkSession, "silver", batch_id):
                ranges = kafka_key_ranges(parsed, F.count("reason").alias("rejected"))
                rejected, records = sum(r.rejected for r in ranges), sum(r.records for r in ranges)
                if rejected:
                    report_quarantine("silver", batch_id, records, rejected, _reasons(parsed, rejected, records))
                # Two tables, two commits: each is idempotent on its own, so a crash
                # between them is repaired by the replay writing only the second. A table
                # with nothing to insert is left alone (a replay finds nothing either):
                # a MERGE costs about a second even when its source is empty.
                if rejected < records:
                    insert_new_kafka_records(
                        valid_events(parsed, contract), silver_path, ranges, prepared.stream_id, batch_id
                    )
                if rejected:
                    reach("silver", BETWEEN_SINK_COMMITS, batch_id)
                    insert_new_kafka_records(
                        quarantined_records(parsed), quarantine_path, ranges, prepared.stream_id, batch_id
                    )
            if prepared.stream_id is not None:
                record_sink_versions(bronze_batch.sparkSession, checkpoint, batch_id, sinks)
        finally:
            parsed.unpersist()

    return _from_table(spark, lakehouse, "silver", prepared).writeStream.foreachBatch(write_batch)


def _reasons(parsed: DataFrame, rejected: int, records: int) -> dict[str, int]:
    # Counted only when the share calls for a look (one more small job); a few malformed records are normal.
    if rejected < records * QUARANTINE_ALERT_SHARE:
        return {}
    counts = parsed.where(F.col("reason").isNotNull()).groupBy("reason").count().orderBy(F.desc("count")).limit(5)
    return {row.reason: row["count"] for row in counts.collect()}


def _start_gold(
    spark: SparkSession, config: Config, lakehouse: Lakehouse, prepared: checkpoints.Prepared, contract: Contract
):
    gold_path, checkpoint = lakehouse.table(GOLD), lakehouse.checkpoint("gold")

    def write_batch(silver_batch: DataFrame, batch_id: int) -> None:
        # Aggregated once and cached: the batch is scanned once. (isEmpty() on the batch
        # was a second scan per batch, and made numInputRows count the rows it read too.)
        aggregates = window_aggregates(silver_batch, config.gold_window, contract).persist()
        try:
            if not aggregates.isEmpty():
                with crash_points(silver_batch.sparkSession, "gold", batch_id):
                    add_to_windows(aggregates, gold_path, prepared.stream_id, batch_id, contract)
            if prepared.stream_id is not None:
                record_sink_versions(silver_batch.sparkSession, checkpoint, batch_id, {GOLD: gold_path})
        finally:
            aggregates.unpersist()

    return _from_table(spark, lakehouse, "gold", prepared).writeStream.foreachBatch(write_batch)


def _from_table(spark: SparkSession, lakehouse: Lakehouse, stream: str, prepared: checkpoints.Prepared) -> DataFrame:
    """The Delta stream of the table ``stream`` reads; after a rebuild, from the version after the one it read."""
    source = spark.readStream.format("delta")
    # Set by a rebuild for its new stream only: the source up to there is in the stream's tables already.
    start = None
    if prepared.stream_id is not None:
        start = rebuild.starting_version(spark, lakehouse, stream, prepared.stream_id)
    if start is not None:
        source = source.option("startingVersion", start)
    return source.load(lakehouse.table(STREAMS[stream].source))
