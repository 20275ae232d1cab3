"""The peer's pipeline: this project's medallion as a team would write it in Spark Declarative Pipelines.

``spark-pipelines run`` loads this file (``bench/peer.py`` writes the spec naming a copy of it); nothing
else imports it, and it cannot run outside that command: the decorators register the flows with the
pipeline's graph, which only the command has. It reads its settings from the spec's ``configuration``
(the ``peer.*`` keys ``peer.pipeline_spec`` writes), through the session the command gives it.

* bronze: a streaming table of the topic's records, read with ``read_committed`` like the project's
  bronze, and deduplicated on the Kafka coordinates (topic, partition, offset) within a watermark on
  the Kafka timestamp. The dedup has to be here, in the flow that reads Kafka: a watermark or a dedup
  on ``readStream.table("bronze")`` fails on a fresh pipeline with TABLE_OR_VIEW_NOT_FOUND, since the
  Connect planner analyses it before bronze exists (SPARK-57489).
* silver: a streaming table of bronze's valid events, one typed column per field of the event contract
  (``pipeline/datasets/events.py``). ``from_json`` reads the fields, ``try_to_timestamp`` the event time (after
  the same ISO-8601-with-offset pattern as the project's silver), and each DECIMAL field is taken from
  its raw JSON text: ``from_json`` also reads a JSON *string* into a DECIMAL ("1.5") and rounds a number
  that does not fit (1.005), both of which the project refuses. A record failing a check is dropped:
  SDP has no quarantine (expectations are not in open-source SDP 4.2.0 either).
* gold: a materialized view of silver counted and summed per tumbling event-time window and
  dimension values, as the project's ``gold.window_aggregates``. SDP recomputes it from all of silver
  at every run, truncating it first.

The checks are those the sample's malformed records exercise (``devtools/sample.py``): not JSON, not an
object, a field missing, a number written as a string, a timestamp that is not one, an amount that
does not fit, bytes that are not UTF-8, a tombstone. On such a topic the peer's silver holds exactly the
project's silver rows, and its gold the project's gold (``peer._same_gold`` checks the latter at every
run of the benchmark). The project's silver checks more (a string field holding a JSON number, say).
"""

from __future__ import annotations

from functools import reduce

from pyspark import pipelines as dp
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from {{ cookiecutter.package_name }}.pipeline.contract import EVENT_COUNT, WINDOW_END, WINDOW_START, Kind
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS

# The same pattern as the project's silver (pipeline/silver.py): a bare local time is refused.
ISO_8601_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
# A JSON number as written: a string ("1.5") has quotes before it and does not match.
JSON_NUMBER = r"-?\d+(\.\d+)?([eE][+-]?\d+)?"
# A DECIMAL field is also read this wide: if the two differ, reading it into its type rounded it.
WIDE_DECIMAL = "decimal(38,18)"
KNOWN_KINDS = (Kind.STRING, Kind.TIMESTAMP, Kind.DECIMAL)

spark = SparkSession.active()


def setting(key: str, default: str | None = None) -> str:
    """A ``peer.*`` value of the spec's configuration; a missing one without a default fails the load."""
    value = spark.conf.get(f"peer.{key}", default)
    if value is None or value == "":
        raise ValueError(f"the peer's pipeline spec sets no peer.{key}")
    return value


unknown = [field.name for field in EVENTS.fields if field.kind not in KNOWN_KINDS]
if unknown:
    raise ValueError(f"the peer reads STRING, TIMESTAMP and DECIMAL fields only, not {', '.join(unknown)}")


@dp.table(name="bronze", comment="Kafka records, deduplicated on their coordinates within a watermark")
def bronze():
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", setting("bootstrap_servers"))
        .option("subscribe", setting("topic"))
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
    )
    batch = setting("max_offsets_per_trigger", "0")
    if int(batch) > 0:
        # The project's bronze batch size: both read the backlog in batches of the same size.
        reader = reader.option("maxOffsetsPerTrigger", batch)
    return (
        reader.load()
        .withWatermark("timestamp", setting("dedup_watermark", "10 minutes"))
        .dropDuplicatesWithinWatermark(["topic", "partition", "offset"])
        .select(
            "key",
            "value",
            "headers",
            "topic",
            "partition",
            "offset",
            "timestamp",
            F.current_timestamp().alias("ingest_time"),
        )
    )


def _raw_number(text: Column, name: str) -> Column:
    """The JSON number written for field ``name`` in the raw text, or null (absent, a string, null)."""
    found = F.regexp_extract(text, rf'"{name}"\s*:\s*({JSON_NUMBER})', 1)
    return F.when(found != "", found)


def _valid(fields: dict[str, Column]) -> Column:
    """True for an event every field of the contract accepts."""
    checks = []
    for field in EVENTS.fields:
        value = fields[field.name]
        if field.kind is Kind.STRING:
            ok = value.isNotNull() & (F.length(F.trim(value)) > 0)
        elif field.kind is Kind.TIMESTAMP:
            ok = value.isNotNull() & F.col(f"_text_{field.name}").rlike(ISO_8601_WITH_OFFSET)
        else:
            # Refused unless it fits the field's type exactly: a value is never rounded into silver.
            ok = value.isNotNull() & (value == F.col(f"_wide_{field.name}"))
        checks.append(ok if field.required else value.isNull() | ok)
    return reduce(lambda left, right: left & right, checks)


@dp.table(name="silver", comment="Valid events, one typed column per contract field")
def silver():
    schema = StructType([StructField(field.name, StringType()) for field in EVENTS.fields])
    text = F.col("value").cast("string")
    parsed = spark.readStream.table("bronze").withColumns({"_text": text, "_doc": F.from_json(text, schema)})
    working: dict[str, Column] = {}
    fields: dict[str, Column] = {}
    for field in EVENTS.fields:
        raw = F.col(f"_doc.{field.name}")
        if field.kind is Kind.TIMESTAMP:
            working[f"_text_{field.name}"] = raw
            fields[field.name] = F.try_to_timestamp(raw)
        elif field.kind is Kind.DECIMAL:
            number = _raw_number(F.col("_text"), field.name)
            working[f"_wide_{field.name}"] = number.try_cast(WIDE_DECIMAL)
            fields[field.name] = number.try_cast(field.spark_type.simpleString())
        else:
            fields[field.name] = raw
    typed = parsed.withColumns(working).withColumns(fields)
    return typed.where(_valid({name: F.col(name) for name in fields})).select(
        *EVENTS.names,
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "ingest_time",
    )


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
