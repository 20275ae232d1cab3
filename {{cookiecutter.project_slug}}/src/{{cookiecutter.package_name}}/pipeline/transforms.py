"""Pure DataFrame -> DataFrame steps of the pipeline: no reads, no writes.

Kafka rows come in, bronze rows go out; bronze rows are parsed into silver
events or quarantine rows with a reason; silver events are aggregated per
event_type and tumbling event-time window for gold.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .tables import AMOUNT_TYPE, KAFKA_KEY_COLUMNS

REQUIRED_STRING_FIELDS = ("event_id", "user_id", "event_type")
# The sample contract demands an explicit offset: a bare local time is ambiguous.
ISO_8601_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
NUMERIC_JSON_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\))$"


def bronze_records(kafka_rows: DataFrame) -> DataFrame:
    """Kafka source rows, kept whole, plus the time they were ingested.

    In a streaming query current_timestamp() is the micro-batch timestamp that
    Spark records in the offset log, so a replayed batch gets the same value.
    """
    return kafka_rows.select(
        "key",
        "value",
        "headers",
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.col("timestampType").alias("timestamp_type"),
        F.current_timestamp().alias("ingest_time"),
    )


def _json_type(field: str) -> Column:
    return F.expr(f"schema_of_variant(variant_get(_doc, '$.{field}'))")


def _rejection_reason() -> Column:
    """The first check a record fails, or null for a valid event."""
    checks: list[tuple[Column, Column | str]] = [
        (F.col("value").isNull(), "null value (tombstone)"),
        (~F.expr("is_valid_utf8(cast(value as string))"), "value is not valid UTF-8"),
        (F.col("_doc").isNull(), "value is not valid JSON"),
        (~F.expr("schema_of_variant(_doc)").startswith("OBJECT<"), "value is not a JSON object"),
    ]
    for field in (*REQUIRED_STRING_FIELDS, "event_time", "amount"):
        json_type = _json_type(field)
        checks.append((json_type.isNull() | (json_type == "VOID"), f"missing required field {field}"))
    for field in (*REQUIRED_STRING_FIELDS, "event_time"):
        json_type = _json_type(field)
        checks.append((json_type != "STRING", F.concat(F.lit(f"field {field} must be a string, got "), json_type)))
    for field in REQUIRED_STRING_FIELDS:
        checks.append((F.length(F.trim(field)) == 0, f"field {field} must not be empty"))
    checks += [
        (
            ~F.col("_event_time_text").rlike(ISO_8601_WITH_OFFSET) | F.col("event_time").isNull(),
            "field event_time is not an ISO-8601 timestamp with offset",
        ),
        (
            ~_json_type("amount").rlike(NUMERIC_JSON_TYPES),
            F.concat(F.lit("field amount must be a number, got "), _json_type("amount")),
        ),
        (
            # A value that would need rounding or overflow is refused, never altered.
            F.col("amount").isNull() | (F.col("amount") != F.col("_amount_wide")),
            "field amount does not fit DECIMAL(18,2) exactly",
        ),
    ]
    return F.coalesce(
        *[F.when(failed, F.lit(reason) if isinstance(reason, str) else reason) for failed, reason in checks]
    )


def parse_events(bronze: DataFrame) -> DataFrame:
    """Bronze rows plus typed event columns and `reason` (null when the event is valid)."""
    parsed = (
        bronze.withColumn("_doc", F.expr("try_parse_json(cast(value as string))"))
        .withColumn("event_id", F.expr("try_variant_get(_doc, '$.event_id', 'string')"))
        .withColumn("user_id", F.expr("try_variant_get(_doc, '$.user_id', 'string')"))
        .withColumn("event_type", F.expr("try_variant_get(_doc, '$.event_type', 'string')"))
        .withColumn("_event_time_text", F.expr("try_variant_get(_doc, '$.event_time', 'string')"))
        .withColumn("event_time", F.expr("try_to_timestamp(_event_time_text)"))
        .withColumn("amount", F.expr(f"try_variant_get(_doc, '$.amount', '{AMOUNT_TYPE.simpleString()}')"))
        .withColumn("_amount_wide", F.expr("try_variant_get(_doc, '$.amount', 'decimal(38,18)')"))
    )
    return parsed.withColumn("reason", _rejection_reason()).drop("_doc", "_event_time_text", "_amount_wide")


def valid_events(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("reason").isNull()).select(
        "event_id",
        "event_time",
        "user_id",
        "event_type",
        "amount",
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "ingest_time",
    )


def quarantined_records(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "key",
        "value",
        "headers",
        "reason",
        "ingest_time",
    )


def first_per_kafka_record(rows: DataFrame) -> DataFrame:
    """One row per (topic, partition, offset): the earliest ingested copy.

    Bronze can hold the same Kafka record twice after a re-ingestion; the copies
    are identical but for ingest_time, and picking the earliest keeps the choice
    deterministic when a batch is replayed.
    """
    earliest_first = Window.partitionBy(*KAFKA_KEY_COLUMNS).orderBy(F.col("ingest_time").asc())
    return rows.withColumn("_copy", F.row_number().over(earliest_first)).where("_copy = 1").drop("_copy")


def window_aggregates(events: DataFrame, window_duration: str) -> DataFrame:
    """Count and amount per event_type and tumbling event-time window."""
    return (
        events.groupBy(F.window("event_time", window_duration).alias("window"), "event_type")
        .agg(F.count(F.lit(1)).alias("event_count"), F.sum("amount").alias("amount_sum"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "event_type",
            "event_count",
            "amount_sum",
        )
    )
