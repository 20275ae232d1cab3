"""Where every table and checkpoint lives, and what each table holds.

Layout under the lakehouse root (LAKEHOUSE_ROOT):

    tables/bronze_events         raw Kafka records, append-only
    tables/silver_events         parsed, typed, one row per Kafka record
    tables/quarantine_events     records that failed parsing, with the reason
    tables/gold_event_windows    per event_type and event-time window
    checkpoints/<stream>         one Spark checkpoint per stream, never shared

and which stream reads what and writes where.
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

BRONZE = "bronze_events"
SILVER = "silver_events"
QUARANTINE = "quarantine_events"
GOLD = "gold_event_windows"

AMOUNT_TYPE = DecimalType(18, 2)
# Spark widens sum(DECIMAL(18,2)) to DECIMAL(28,2): exact for any realistic total.
AMOUNT_SUM_TYPE = DecimalType(28, 2)

KAFKA_KEY_COLUMNS = ["topic", "partition", "offset"]

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)

BRONZE_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("timestamp_type", IntegerType(), True),
        StructField("ingest_time", TimestampType(), False),
    ]
)

SILVER_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("event_time", TimestampType(), False),
        StructField("user_id", StringType(), False),
        StructField("event_type", StringType(), False),
        StructField("amount", AMOUNT_TYPE, False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("ingest_time", TimestampType(), False),
    ]
)

QUARANTINE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
        StructField("reason", StringType(), False),
        StructField("ingest_time", TimestampType(), False),
    ]
)

GOLD_SCHEMA = StructType(
    [
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("event_type", StringType(), False),
        StructField("event_count", LongType(), False),
        StructField("amount_sum", AMOUNT_SUM_TYPE, False),
    ]
)

SCHEMAS = {BRONZE: BRONZE_SCHEMA, SILVER: SILVER_SCHEMA, QUARANTINE: QUARANTINE_SCHEMA, GOLD: GOLD_SCHEMA}
# Delta itself rejects updates and deletes on these: raw and parsed history is never rewritten.
APPEND_ONLY = {BRONZE, SILVER, QUARANTINE}


@dataclass(frozen=True)
class Stream:
    name: str
    source: str  # "kafka" or the table it streams from
    sinks: tuple[str, ...]
    downstream: tuple[str, ...]
    # An aggregating sink cannot absorb a replay from scratch: a lost checkpoint
    # must not restart it, and a reset empties it so it is rebuilt from its source.
    rebuilt_from_source: bool = False


STREAMS = {
    "bronze": Stream("bronze", "kafka", (BRONZE,), ("silver", "gold")),
    "silver": Stream("silver", BRONZE, (SILVER, QUARANTINE), ("gold",)),
    "gold": Stream("gold", SILVER, (GOLD,), (), rebuilt_from_source=True),
}
LAYERS = tuple(STREAMS)


def with_downstream(stream: str) -> list[Stream]:
    return [STREAMS[name] for name in (stream, *STREAMS[stream].downstream)]


@dataclass(frozen=True)
class Lakehouse:
    root: str

    def table(self, name: str) -> str:
        return f"{self.root}/tables/{name}"

    def checkpoint(self, stream: str) -> str:
        return f"{self.root}/checkpoints/{stream}"


def ensure_tables(spark: SparkSession, lakehouse: Lakehouse) -> None:
    """Create every table with its explicit schema, so streams never infer one."""
    for name, schema in SCHEMAS.items():
        builder = DeltaTable.createIfNotExists(spark).location(lakehouse.table(name)).addColumns(schema)
        if name in APPEND_ONLY:
            builder = builder.property("delta.appendOnly", "true")
        try:
            builder.execute()
        except Exception:
            # Streams of one pipeline may start in separate processes at once: if
            # another one created the table first, there is nothing left to do.
            if not table_exists(spark, lakehouse.table(name)):
                raise


def table_exists(spark: SparkSession, path: str) -> bool:
    # Not DeltaTable.isDeltaTable: it can keep answering False from a cached log
    # after another process created the table. Loading refreshes the snapshot.
    try:
        spark.read.format("delta").load(path)
    except AnalysisException:
        return False
    return True


def table_has_rows(spark: SparkSession, path: str) -> bool:
    return table_exists(spark, path) and bool(spark.read.format("delta").load(path).take(1))
