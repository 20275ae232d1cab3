"""Pure DataFrame -> DataFrame steps of the pipeline: no reads, no writes.

Kafka rows come in, bronze rows go out; bronze rows are parsed into silver
events or quarantine rows with a reason; silver events are aggregated per
tumbling event-time window and dimensions for gold. What an event is, and how
gold aggregates it, comes from the event contract (contract.py).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .contract import (
    EVENT_COUNT,
    EVENTS,
    NOT_AN_OBJECT,
    NOT_JSON,
    NOT_UTF8,
    TOMBSTONE,
    WINDOW_END,
    WINDOW_START,
    Contract,
    Field,
    Kind,
    Rule,
)
from .tables import KAFKA_KEY_COLUMNS

# The sample contract demands an explicit offset: a bare local time is ambiguous.
ISO_8601_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
# JSON types as schema_of_variant names them.
NUMERIC_JSON_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\))$"
# Numbers without a fraction: parse_json keeps 3.0, and integers beyond 64 bits, as DECIMAL(p,0).
INTEGER_JSON_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,0\))$"
# A DECIMAL field's value is also read this wide: if the two differ, reading it
# into the field's type rounded it, and the record is refused.
WIDE_DECIMAL_SCALE = 18


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


def with_topic_ids(bronze_rows: DataFrame, topic_ids: dict[str, str]) -> DataFrame:
    """Bronze rows with their topic's id (Kafka's topic UUID) after the topic's name, in bronze's column order.

    Spark's Kafka source does not give the id; bronze looks it up per batch (source_identity.py).
    """
    ids = F.create_map(*[F.lit(part) for pair in sorted(topic_ids.items()) for part in pair])
    topic_id = F.element_at(ids, F.col("topic")) if topic_ids else F.lit(None).cast("string")
    columns = [c for c in bronze_rows.columns if c != "topic_id"]
    at = columns.index("topic") + 1
    return bronze_rows.select(*columns[:at], topic_id.alias("topic_id"), *columns[at:])


def _json_type(field: Field) -> str:
    """Working column: the field's JSON type as schema_of_variant names it (null if absent)."""
    return f"_json_type_{field.name}"


def _text(field: Field) -> str:
    """Working column: a TIMESTAMP field's JSON string."""
    return f"_text_{field.name}"


def _wide(field: Field) -> str:
    """Working column: a DECIMAL field's value read with more digits than it keeps."""
    return f"_wide_{field.name}"


def _read_fields(contract: Contract) -> dict[str, Column]:
    """Each field's JSON type and value, read out of the parsed document ``_doc``.

    try_variant_get never fails a batch: a value that cannot be read is null, and
    the checks tell why.
    """
    doc = F.col("_doc")
    columns: dict[str, Column] = {}
    for field in contract.fields:
        path = f"$.{field.name}"
        columns[_json_type(field)] = F.schema_of_variant(F.try_variant_get(doc, path, "variant"))
        if field.kind is Kind.TIMESTAMP:
            columns[_text(field)] = F.try_variant_get(doc, path, "string")
        else:
            columns[field.name] = F.try_variant_get(doc, path, field.spark_type.simpleString())
        if field.kind is Kind.DECIMAL:
            wide_scale = max(WIDE_DECIMAL_SCALE, field.scale)
            columns[_wide(field)] = F.try_variant_get(doc, path, f"decimal(38,{wide_scale})")
    return columns


def _failed(rule: Rule, field: Field) -> Column:
    """True when ``field`` of a record fails ``rule``."""
    json_type, value = F.col(_json_type(field)), F.col(field.name)
    absent = json_type.isNull() | (json_type == "VOID")
    match rule:
        case Rule.MISSING:
            return absent
        case Rule.NOT_A_STRING:
            failed = json_type != "STRING"
        case Rule.EMPTY:
            failed = F.length(F.trim(value)) == 0
        case Rule.NOT_A_TIMESTAMP:
            failed = ~F.col(_text(field)).rlike(ISO_8601_WITH_OFFSET) | value.isNull()
        case Rule.NOT_A_NUMBER:
            failed = ~json_type.rlike(NUMERIC_JSON_TYPES)
        case Rule.NOT_AN_INTEGER:
            failed = ~json_type.rlike(INTEGER_JSON_TYPES)
        case Rule.DOES_NOT_FIT if field.kind is Kind.DECIMAL:
            # A value that would need rounding or overflow is refused, never altered.
            failed = value.isNull() | (value != F.col(_wide(field)))
        case Rule.DOES_NOT_FIT:
            failed = value.isNull()
        case Rule.NOT_A_BOOLEAN:
            failed = json_type != "BOOLEAN"
    # An optional field that is absent (or JSON null) is valid, and null in silver.
    return ~absent & failed


def _rejection_reason(contract: Contract) -> Column:
    """The first check a record fails, or null for a valid event."""
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), F.lit(TOMBSTONE)),
        (~F.is_valid_utf8(F.col("value").cast("string")), F.lit(NOT_UTF8)),
        (F.col("_doc").isNull(), F.lit(NOT_JSON)),
        (~F.schema_of_variant(F.col("_doc")).startswith("OBJECT<"), F.lit(NOT_AN_OBJECT)),
    ]
    for rule, field in contract.checks():
        reason = F.lit(rule.message(field))
        if rule.appends_json_type:
            reason = F.concat(reason, F.col(_json_type(field)))
        checks.append((_failed(rule, field), reason))
    return F.coalesce(*[F.when(failed, reason) for failed, reason in checks])


def parse_events(bronze: DataFrame, contract: Contract = EVENTS) -> DataFrame:
    """Bronze rows plus one typed column per contract field and `reason` (null when the event is valid).

    The value is parsed once, into a VARIANT, and every field is read from that.
    """
    read = _read_fields(contract)
    timestamps = {
        field.name: F.try_to_timestamp(F.col(_text(field))) for field in contract.fields if field.kind is Kind.TIMESTAMP
    }
    parsed = (
        bronze.withColumns({"_doc": F.try_parse_json(F.col("value").cast("string"))})
        .withColumns(read)
        .withColumns(timestamps)
        .withColumns({"reason": _rejection_reason(contract)})
    )
    return parsed.select(*bronze.columns, *contract.names, "reason")


def valid_events(parsed: DataFrame, contract: Contract = EVENTS) -> DataFrame:
    """The silver rows: contract fields in declaration order, then the Kafka coordinates.

    Required fields are never null here (a record lacking one has a reason), but
    Spark cannot know it: the columns are nullable in the DataFrame, and the silver
    table's NOT NULL constraints are checked when the rows are written.
    """
    return parsed.where(F.col("reason").isNull()).select(
        *contract.names,
        "topic",
        "topic_id",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "ingest_time",
    )


def quarantined_records(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        "topic",
        "topic_id",
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
    """One row per Kafka record (topic, topic id, partition, offset): the earliest ingested copy.

    Bronze can hold the same Kafka record twice after a re-ingestion; the copies
    are identical but for ingest_time, and picking the earliest keeps the choice
    deterministic when a batch is replayed.
    """
    earliest_first = Window.partitionBy(*KAFKA_KEY_COLUMNS).orderBy(F.col("ingest_time").asc())
    return rows.withColumn("_copy", F.row_number().over(earliest_first)).where("_copy = 1").drop("_copy")


def window_aggregates(events: DataFrame, window_duration: str, contract: Contract = EVENTS) -> DataFrame:
    """Count and measure sums per tumbling event-time window and dimension values."""
    sums = [F.sum(measure).alias(contract.measure_column(measure)) for measure in contract.measures]
    return (
        events.groupBy(F.window(contract.event_time, window_duration).alias("_window"), *contract.dimensions)
        .agg(F.count(F.lit(1)).alias(EVENT_COUNT), *sums)
        .select(
            F.col("_window.start").alias(WINDOW_START),
            F.col("_window.end").alias(WINDOW_END),
            *contract.dimensions,
            *contract.gold_values,
        )
    )
