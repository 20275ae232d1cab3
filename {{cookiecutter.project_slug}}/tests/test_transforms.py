"""The pure transforms, on static DataFrames shaped like bronze rows."""

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from {{ cookiecutter.package_name }}.pipeline.tables import BRONZE_SCHEMA, GOLD_SCHEMA, QUARANTINE_SCHEMA, SILVER_SCHEMA
from {{ cookiecutter.package_name }}.pipeline.transforms import (
    first_per_kafka_record,
    parse_events,
    quarantined_records,
    valid_events,
    window_aggregates,
)

INGESTED = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
KAFKA_TIME = datetime(2024, 1, 1, 11, 59, tzinfo=UTC)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


def event(**overrides) -> bytes:
    body = {
        "event_id": "e-1",
        "event_time": "2024-01-01T10:00:30+02:00",
        "user_id": "user-1",
        "event_type": "purchase",
        "amount": 12.5,
    }
    body.update(overrides)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


def bronze_row(offset: int, value: bytes | None, partition: int = 0, ingested: datetime = INGESTED) -> tuple:
    headers = [("source", b"test")]
    return (b"user-1", value, headers, "events", partition, offset, KAFKA_TIME, 0, ingested)


def bronze(spark, rows: list[tuple]):
    return spark.createDataFrame(rows, BRONZE_SCHEMA)


def test_valid_event_becomes_one_typed_silver_row(spark):
    parsed = parse_events(bronze(spark, [bronze_row(7, event())]))

    expected = spark.createDataFrame(
        [
            (
                "e-1",
                utc(2024, 1, 1, 8, 0, 30),
                "user-1",
                "purchase",
                Decimal("12.50"),
                "events",
                0,
                7,
                KAFKA_TIME,
                INGESTED,
            )
        ],
        SILVER_SCHEMA,
    )
    assert_df_equality(valid_events(parsed), expected, ignore_nullable=True)
    assert quarantined_records(parsed).count() == 0


MALFORMED = [
    (None, "null value (tombstone)"),
    (b"\xff\xfe{}", "value is not valid UTF-8"),
    (b"{not json", "value is not valid JSON"),
    (b"[1, 2]", "value is not a JSON object"),
    (event(amount=...), "missing required field amount"),
    (event(event_id=None), "missing required field event_id"),
    (event(user_id=...), "missing required field user_id"),
    (event(event_id=5), "field event_id must be a string, got BIGINT"),
    (event(event_type=""), "field event_type must not be empty"),
    (event(event_time="2024-01-01 10:00:00"), "field event_time is not an ISO-8601 timestamp with offset"),
    (event(event_time="2024-13-01T00:00:00Z"), "field event_time is not an ISO-8601 timestamp with offset"),
    (event(event_time=1704067200), "field event_time must be a string, got BIGINT"),
    (event(amount="1.50"), "field amount must be a number, got STRING"),
    (event(amount=1.005), "field amount does not fit DECIMAL(18,2) exactly"),
    (event(amount=10**17), "field amount does not fit DECIMAL(18,2) exactly"),
]


def test_every_malformed_record_is_quarantined_with_its_reason(spark):
    parsed = parse_events(bronze(spark, [bronze_row(offset, value) for offset, (value, _) in enumerate(MALFORMED)]))

    reasons = quarantined_records(parsed).select("offset", "reason").orderBy("offset")
    expected = spark.createDataFrame(
        [(offset, reason) for offset, (_, reason) in enumerate(MALFORMED)],
        StructType([StructField("offset", LongType()), StructField("reason", StringType())]),
    )
    assert_df_equality(reasons, expected, ignore_nullable=True)
    assert valid_events(parsed).count() == 0


def test_quarantine_row_keeps_raw_bytes_headers_and_kafka_coordinates(spark):
    parsed = parse_events(bronze(spark, [bronze_row(3, b"{broken", partition=1)]))

    expected = spark.createDataFrame(
        [
            (
                "events",
                1,
                3,
                KAFKA_TIME,
                b"user-1",
                b"{broken",
                [("source", b"test")],
                "value is not valid JSON",
                INGESTED,
            )
        ],
        QUARANTINE_SCHEMA,
    )
    assert_df_equality(quarantined_records(parsed), expected, ignore_nullable=True)


@pytest.mark.parametrize(
    ("amount", "expected"),
    [(0.1, Decimal("0.10")), (7, Decimal("7.00")), (1e3, Decimal("1000.00")), (99999.99, Decimal("99999.99"))],
)
def test_amount_is_exact_two_decimal(spark, amount, expected):
    parsed = parse_events(bronze(spark, [bronze_row(0, event(amount=amount))]))

    assert valid_events(parsed).first()["amount"] == expected


def test_first_per_kafka_record_keeps_the_earliest_ingested_copy(spark):
    later = utc(2024, 1, 2)
    rows = bronze(
        spark,
        [
            bronze_row(1, b"x", ingested=later),
            bronze_row(1, b"x"),
            bronze_row(2, b"y"),
            bronze_row(1, b"x", partition=1),
        ],
    )

    kept = first_per_kafka_record(rows).select("partition", "offset", "ingest_time").orderBy("partition", "offset")
    expected = spark.createDataFrame(
        [(0, 1, INGESTED), (0, 2, INGESTED), (1, 1, INGESTED)], "partition int, offset long, ingest_time timestamp"
    )
    assert_df_equality(kept, expected, ignore_nullable=True)


def test_window_aggregates_count_and_sum_per_event_type_and_tumbling_window(spark):
    silver = spark.createDataFrame(
        [
            ("a", utc(2024, 1, 1, 10, 0, 0), "u", "purchase", Decimal("0.10"), "events", 0, 0, None, INGESTED),
            ("b", utc(2024, 1, 1, 10, 0, 59), "u", "purchase", Decimal("0.20"), "events", 0, 1, None, INGESTED),
            # Exactly on the boundary: belongs to the next window.
            ("c", utc(2024, 1, 1, 10, 1, 0), "u", "purchase", Decimal("1.00"), "events", 0, 2, None, INGESTED),
            ("d", utc(2024, 1, 1, 10, 0, 30), "u", "refund", Decimal("5.55"), "events", 1, 0, None, INGESTED),
        ],
        SILVER_SCHEMA,
    )

    result = window_aggregates(silver, "1 minute").orderBy("window_start", "event_type")
    expected = spark.createDataFrame(
        [
            (utc(2024, 1, 1, 10, 0), utc(2024, 1, 1, 10, 1), "purchase", 2, Decimal("0.30")),
            (utc(2024, 1, 1, 10, 0), utc(2024, 1, 1, 10, 1), "refund", 1, Decimal("5.55")),
            (utc(2024, 1, 1, 10, 1), utc(2024, 1, 1, 10, 2), "purchase", 1, Decimal("1.00")),
        ],
        GOLD_SCHEMA,
    )
    assert_df_equality(result, expected, ignore_nullable=True)


def test_bronze_records_keep_every_kafka_column(spark):
    from {{ cookiecutter.package_name }}.pipeline.transforms import bronze_records

    kafka_rows = (
        bronze(spark, [bronze_row(5, b"v")]).drop("ingest_time").withColumnRenamed("timestamp_type", "timestampType")
    )

    result = bronze_records(kafka_rows)
    assert result.schema.fieldNames() == BRONZE_SCHEMA.fieldNames()
    assert result.where(F.col("ingest_time").isNull()).count() == 0
    assert_df_equality(
        result.drop("ingest_time"), bronze(spark, [bronze_row(5, b"v")]).drop("ingest_time"), ignore_nullable=True
    )
