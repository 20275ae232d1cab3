"""The three streams of the medallion pipeline, wired source -> transform -> sink.

Exactly-once, end to end, rests on three parts:
* a replayable source: Kafka offsets (bronze) and Delta table versions (silver,
  gold) are written to the stream's offset log before a batch runs;
* the checkpoint: a batch whose commit-log entry is missing is replayed with
  exactly the offsets logged for it;
* idempotent sinks: bronze uses Delta's streaming sink, which records
  (query id, batch id) in the table's log; silver and gold tag their MERGEs
  the same way, so a replayed batch changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from . import checkpoints
from .config import Config
from .kafka_io import spark_source_options, topic_partitions
from .sinks import add_to_windows, insert_new_kafka_records, kafka_key_ranges
from .tables import BRONZE, GOLD, LAYERS, QUARANTINE, SILVER, STREAMS, Lakehouse, ensure_tables
from .transforms import (
    bronze_records,
    first_per_kafka_record,
    parse_events,
    quarantined_records,
    valid_events,
    window_aggregates,
)

log = logging.getLogger(__name__)

# Kafka's "earliest" in a startingOffsets JSON.
EARLIEST = -2


def trigger_for(config: Config, available_now: bool) -> dict:
    return {"availableNow": True} if available_now else {"processingTime": config.trigger_interval}


def start_stream(spark: SparkSession, config: Config, layer: str, available_now: bool) -> StreamingQuery:
    lakehouse = Lakehouse(config.lakehouse_root)
    ensure_tables(spark, lakehouse)
    prepared = checkpoints.prepare(spark, lakehouse, STREAMS[layer])
    starters: dict[str, Callable[..., StreamingQuery]] = {
        "bronze": _start_bronze,
        "silver": _start_silver,
        "gold": _start_gold,
    }
    writer = starters[layer](spark, config, lakehouse, prepared)
    return (
        writer.option("checkpointLocation", lakehouse.checkpoint(layer))
        .queryName(layer)
        .trigger(**trigger_for(config, available_now))
        .start()
    )


def run_available_now(spark: SparkSession, config: Config, layers: tuple[str, ...] = LAYERS) -> None:
    """Process everything available, one layer after the other, so each sees what the one before wrote."""
    for layer in layers:
        start_stream(spark, config, layer, available_now=True).awaitTermination()


def _start_bronze(spark: SparkSession, config: Config, lakehouse: Lakehouse, prepared: checkpoints.Prepared):
    options = spark_source_options(config)
    if prepared.lost_checkpoint:
        options["startingOffsets"] = resume_offsets(spark, config, lakehouse)
        log.warning("bronze: checkpoint lost; resuming after the offsets in bronze: %s", options["startingOffsets"])
    kafka_rows = spark.readStream.format("kafka").options(**options).load()
    # Delta's streaming sink is idempotent by itself: it records (query id, batch id).
    return (
        bronze_records(kafka_rows)
        .writeStream.format("delta")
        .outputMode("append")
        .option("path", lakehouse.table(BRONZE))
    )


def resume_offsets(spark: SparkSession, config: Config, lakehouse: Lakehouse) -> str:
    """startingOffsets JSON: the next offset after what bronze holds, earliest elsewhere."""
    ingested = {
        (row.topic, row.partition): row.next_offset
        for row in spark.read.format("delta")
        .load(lakehouse.table(BRONZE))
        .groupBy("topic", "partition")
        .agg((F.max("offset") + 1).alias("next_offset"))
        .collect()
    }
    offsets = {
        topic: {str(p): ingested.get((topic, p), EARLIEST) for p in partitions}
        for topic, partitions in topic_partitions(config).items()
    }
    return json.dumps(offsets)


def _start_silver(spark: SparkSession, config: Config, lakehouse: Lakehouse, prepared: checkpoints.Prepared):
    silver_path, quarantine_path = lakehouse.table(SILVER), lakehouse.table(QUARANTINE)

    def write_batch(bronze_batch: DataFrame, batch_id: int) -> None:
        parsed = parse_events(first_per_kafka_record(bronze_batch)).persist()
        try:
            ranges = kafka_key_ranges(parsed)
            insert_new_kafka_records(valid_events(parsed), silver_path, ranges, prepared.stream_id, batch_id)
            insert_new_kafka_records(quarantined_records(parsed), quarantine_path, ranges, prepared.stream_id, batch_id)
        finally:
            parsed.unpersist()

    bronze = spark.readStream.format("delta").load(lakehouse.table(BRONZE))
    return bronze.writeStream.foreachBatch(write_batch)


def _start_gold(spark: SparkSession, config: Config, lakehouse: Lakehouse, prepared: checkpoints.Prepared):
    gold_path = lakehouse.table(GOLD)

    def write_batch(silver_batch: DataFrame, batch_id: int) -> None:
        if silver_batch.isEmpty():
            return
        add_to_windows(window_aggregates(silver_batch, config.gold_window), gold_path, prepared.stream_id, batch_id)

    silver = spark.readStream.format("delta").load(lakehouse.table(SILVER))
    return silver.writeStream.foreachBatch(write_batch)
