"""The peer's pipeline: this project's medallion as a team would write it in Spark Declarative Pipelines.

``spark-pipelines run`` loads this file (``bench/peer.py`` writes the spec naming a copy of it); nothing
else imports it, and it cannot run outside that command: the decorators register the flows with the
pipeline's graph, which only the command has. It reads its settings from the spec's ``configuration``
(the ``peer.*`` keys ``peer.pipeline_configuration`` writes), through the session the command gives it.

* bronze: a streaming table of the topic's records, read with ``read_committed`` and the project's
  ``fetch.max.wait.ms``, like the project's bronze. Uncapped unless the spec names a batch size
  (``peer.max_offsets_per_trigger``: the capped comparison caps both alike). Without a dedup by
  default: Delta's streaming sink already skips a replayed batch, so a dedup buys SDP nothing. With
  ``peer.bronze_dedup = rocksdb`` it deduplicates on the Kafka coordinates (topic, partition, offset)
  within a watermark on the Kafka timestamp, its state in RocksDB (the spec sets the provider). The
  dedup has to be here, in the flow that reads Kafka: a watermark or a dedup on
  ``readStream.table("bronze")`` fails on a fresh pipeline with TABLE_OR_VIEW_NOT_FOUND, since the
  Connect planner analyses it before bronze exists (SPARK-57489).
* silver and quarantine: two streaming tables of bronze, each parsing it with the project's own
  per-record work (``silver.parse_events`` with the events contract, which has no expectations: the
  same VARIANT parse, the same contract checks, the same reasons), then keeping what the project's
  silver keeps (``silver.valid_events``) or its quarantine (``silver.quarantined_records``). Bronze
  has the project's columns for it, its ``topic_id`` null: the peer does not ask Kafka for topic ids.
  SDP writes one table per flow, so each flow parses bronze: that is SDP's cost of the same two
  tables. The same work on both sides, so that the figures compare the engines and not two parsers.
* gold: a materialized view of silver counted and summed per tumbling event-time window and
  dimension values, as the project's ``gold.window_aggregates``. SDP recomputes it from all of silver
  at every run, truncating it first.

``peer._same_tables`` checks after every workload that both golds hold the same rows and both
quarantines the same records.
"""

from __future__ import annotations

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.pipeline.contract import EVENT_COUNT, WINDOW_END, WINDOW_START
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.silver import parse_events, quarantined_records, valid_events

# Bronze's dedup (``peer.bronze_dedup``): none, or on the Kafka coordinates with its state in RocksDB.
DEDUPS = ("none", "rocksdb")
# Bronze's columns, named: a query function may not ask a DataFrame for its columns (no analysis runs there).
# The project's bronze columns: topic_id null (the peer does not ask Kafka for topic ids), so that silver and
# quarantine select theirs as the project's do.
BRONZE_COLUMNS = ("key", "value", "headers", "topic", "topic_id", "partition", "offset", "timestamp", "ingest_time")

spark = SparkSession.active()


def setting(key: str, default: str | None = None) -> str:
    """A ``peer.*`` value of the spec's configuration; a missing one without a default fails the load."""
    value = spark.conf.get(f"peer.{key}", default)
    if value is None or value == "":
        raise ValueError(f"the peer's pipeline spec sets no peer.{key}")
    return value


@dp.table(name="bronze", comment="Kafka records as they were committed")
def bronze():
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", setting("bootstrap_servers"))
        .option("subscribe", setting("topic"))
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("kafka.fetch.max.wait.ms", setting("fetch_max_wait_ms"))
        .option("includeHeaders", "true")
    )
    batch = setting("max_offsets_per_trigger", "0")
    if int(batch) > 0:
        reader = reader.option("maxOffsetsPerTrigger", batch)
    records = reader.load()
    dedup = setting("bronze_dedup", "none")
    if dedup not in DEDUPS:
        raise ValueError(f"peer.bronze_dedup is one of {DEDUPS}, not {dedup!r}")
    if dedup == "rocksdb":
        records = records.withWatermark("timestamp", setting("dedup_watermark", "10 minutes"))
        records = records.dropDuplicatesWithinWatermark(["topic", "partition", "offset"])
    return records.select(
        "key",
        "value",
        "headers",
        "topic",
        F.lit(None).cast("string").alias("topic_id"),
        "partition",
        "offset",
        "timestamp",
        F.current_timestamp().alias("ingest_time"),
    )


@dp.table(name="silver", comment="Valid events, one typed column per contract field")
def silver():
    return valid_events(parse_events(spark.readStream.table("bronze"), EVENTS, BRONZE_COLUMNS))


@dp.table(name="quarantine", comment="Records the contract refuses, each with the first reason it failed")
def quarantine():
    return quarantined_records(parse_events(spark.readStream.table("bronze"), EVENTS, BRONZE_COLUMNS))


@dp.materialized_view(name="gold", comment="Events counted and summed per event-time window and dimensions")
def gold():
    sums = [F.sum(measure).alias(EVENTS.measure_column(measure)) for measure in EVENTS.measures]
    return (
        spark.read.table("silver")
        .groupBy(F.window(EVENTS.event_time, setting("window")).alias("_window"), *EVENTS.dimensions)
        .agg(F.count(F.lit(1)).alias(EVENT_COUNT), *sums)
        .select(
            F.col("_window.start").alias(WINDOW_START),
            F.col("_window.end").alias(WINDOW_END),
            *EVENTS.dimensions,
            *EVENTS.gold_values,
        )
    )
