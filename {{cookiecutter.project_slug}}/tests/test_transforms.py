"""The pure transforms, on static DataFrames shaped like bronze rows."""

import dataclasses
import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from {{ cookiecutter.package_name }}.devtools.oracle import unmet_reason
from {{ cookiecutter.package_name }}.devtools.sample import breakable, contract_records
from {{ cookiecutter.package_name }}.pipeline.bronze import bronze_records, with_topic_ids
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE_SCHEMA, HEADERS_TYPE, SILVER_SCHEMA
from {{ cookiecutter.package_name }}.pipeline.expectations import Action, in_range, matches, one_of
from {{ cookiecutter.package_name }}.pipeline.formats import Format
from {{ cookiecutter.package_name }}.pipeline.gold import window_aggregates
from {{ cookiecutter.package_name }}.pipeline.silver import (
    first_per_kafka_record,
    parse_events,
    parse_records,
    quarantined_records,
    valid_events,
    without_duplicates,
)

INGESTED = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
KAFKA_TIME = datetime(2024, 1, 1, 11, 59, tzinfo=UTC)


# The schemas the transforms really produce. The Kafka coordinates and ingest_time
# come NOT NULL from bronze; parsed fields, reason and the window bounds and sums are
# nullable as far as Spark knows (a valid event never lacks a required field, but no
# expression says so): the tables' NOT NULL constraints apply when rows are written.
VALID_EVENTS_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), True),
        StructField("event_time", TimestampType(), True),
        StructField("user_id", StringType(), True),
        StructField("event_type", StringType(), True),
        StructField("amount", DecimalType(18, 2), True),
        StructField("topic", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("ingest_time", TimestampType(), False),
    ]
)
QUARANTINED_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
        StructField("reason", StringType(), True),
        StructField("ingest_time", TimestampType(), False),
    ]
)
# From silver rows (event_type NOT NULL in the table): count() is never null, sum() may be.
WINDOW_AGGREGATES_SCHEMA = StructType(
    [
        StructField("window_start", TimestampType(), True),
        StructField("window_end", TimestampType(), True),
        StructField("event_type", StringType(), False),
        StructField("event_count", LongType(), False),
        StructField("amount_sum", DecimalType(28, 2), True),
    ]
)


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


TOPIC_ID = "Xh1mVgDMQz2Gd0fTYKMBzA"


def bronze_row(
    offset: int, value: bytes | None, partition: int = 0, ingested: datetime = INGESTED, topic_id: str = TOPIC_ID
) -> tuple:
    headers = [("source", b"test")]
    return (b"user-1", value, headers, "events", topic_id, partition, offset, KAFKA_TIME, 0, ingested)


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
                TOPIC_ID,
                0,
                7,
                KAFKA_TIME,
                INGESTED,
            )
        ],
        VALID_EVENTS_SCHEMA,
    )
    assert_df_equality(valid_events(parsed), expected)
    assert quarantined_records(parsed).count() == 0


def test_bronze_columns_named_are_the_ones_parse_events_keeps(spark):
    rows = bronze(spark, [bronze_row(7, event()), bronze_row(8, b"{not json")])
    kept = ["topic", "partition", "offset", "value"]

    parsed = parse_events(rows, EVENTS, kept)

    assert parsed.columns == [*kept, *EVENTS.names, "reason"]
    everything = parse_events(rows).select(*parsed.columns)
    assert_df_equality(parsed, everything, ignore_row_order=True)
    with pytest.raises(ValueError, match="bronze_columns"):
        parse_events(rows, EVENTS, "offset")


OUT_OF_RANGE = "field event_time is outside the supported range [1583-01-01T00:00:00Z, 9999-01-01T00:00:00Z)"
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
    (event(event_type="page\u0000view"), "field event_type contains the character U+0000"),
    (event(user_id="\u0000"), "field user_id contains the character U+0000"),
    (event(event_time="2024-01-01 10:00:00"), "field event_time is not an ISO-8601 timestamp with offset"),
    (event(event_time="2024-13-01T00:00:00Z"), "field event_time is not an ISO-8601 timestamp with offset"),
    (event(event_time=1704067200), "field event_time must be a string, got BIGINT"),
    # Go's zero time and .NET's MinValue and MaxValue, and instants beyond them: outside the range.
    (event(event_time="0001-01-01T00:00:00Z"), OUT_OF_RANGE),
    (event(event_time="0001-01-01T00:30:00+01:00"), OUT_OF_RANGE),  # 0000-12-31T23:30Z: before year 1
    (event(event_time="1582-10-10T12:00:00Z"), OUT_OF_RANGE),  # before the Gregorian calendar's first whole year
    (event(event_time="1583-01-01T00:30:00+01:00"), OUT_OF_RANGE),  # 1582-12-31T23:30Z
    (event(event_time="9999-01-01T00:00:00Z"), OUT_OF_RANGE),
    (event(event_time="9999-12-31T23:59:59.9999999Z"), OUT_OF_RANGE),
    (event(amount="1.50"), "field amount must be a number, got STRING"),
    (event(amount=1.005), "field amount does not fit DECIMAL(18,2) exactly"),
    (event(amount=10**17), "field amount does not fit DECIMAL(18,2) exactly"),
    (b"42", "value is not a JSON object"),
    # An array holding a whole event is no object, even with every field inside; an object without any
    # field is one (silver reads the document's schema only when the event time is absent).
    (b"[" + event() + b"]", "value is not a JSON object"),
    (b"{}", "missing required field event_id"),
    # More than one fault: the first check in order of precedence names the record.
    (event(user_id=..., amount=...), "missing required field user_id"),
    (event(event_type="", user_id=5), "field user_id must be a string, got BIGINT"),
    (event(event_time="yesterday", amount="1.50"), "field event_time is not an ISO-8601 timestamp with offset"),
]


def test_every_malformed_record_is_quarantined_with_its_reason(spark):
    parsed = parse_events(bronze(spark, [bronze_row(offset, value) for offset, (value, _) in enumerate(MALFORMED)]))

    reasons = quarantined_records(parsed).select("offset", "reason").orderBy("offset")
    expected = spark.createDataFrame(
        [(offset, reason) for offset, (_, reason) in enumerate(MALFORMED)],
        StructType([StructField("offset", LongType(), False), StructField("reason", StringType(), True)]),
    )
    assert_df_equality(reasons, expected)
    assert valid_events(parsed).count() == 0


def test_event_times_at_both_ends_of_the_supported_range_are_valid_and_exact(spark):
    times = {
        "1583-01-01T00:00:00Z": datetime(1583, 1, 1, tzinfo=UTC),
        "1582-12-31T23:30:00-01:00": datetime(1583, 1, 1, 0, 30, tzinfo=UTC),
        "9998-12-31T23:59:59.999999Z": datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    }
    rows = [bronze_row(offset, event(event_time=text)) for offset, text in enumerate(times)]
    parsed = parse_events(bronze(spark, rows))

    micros = valid_events(parsed).orderBy("offset").select(F.unix_micros("event_time").alias("micros"))
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert [row.micros for row in micros.collect()] == [
        (instant - epoch) // timedelta(microseconds=1) for instant in times.values()
    ]
    assert quarantined_records(parsed).count() == 0


def test_quarantine_row_keeps_raw_bytes_headers_and_kafka_coordinates(spark):
    parsed = parse_events(bronze(spark, [bronze_row(3, b"{broken", partition=1)]))

    expected = spark.createDataFrame(
        [
            (
                "events",
                TOPIC_ID,
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
        QUARANTINED_SCHEMA,
    )
    assert_df_equality(quarantined_records(parsed), expected)


@pytest.mark.parametrize(
    ("amount", "expected"),
    [(0.1, Decimal("0.10")), (7, Decimal("7.00")), (1e3, Decimal("1000.00")), (99999.99, Decimal("99999.99"))],
)
def test_amount_is_exact_two_decimal(spark, amount, expected):
    parsed = parse_events(bronze(spark, [bronze_row(0, event(amount=amount))]))

    assert valid_events(parsed).first()["amount"] == expected


def test_first_per_kafka_record_keeps_the_earliest_copy_and_a_recreated_topics_record_at_the_same_offset(spark):
    later = utc(2024, 1, 2)
    rows = bronze(
        spark,
        [
            bronze_row(1, b"x", ingested=later),
            bronze_row(1, b"x"),
            bronze_row(2, b"y"),
            bronze_row(1, b"x", partition=1),
            # The topic deleted and created again: offset 1 names another record.
            bronze_row(1, b"z", topic_id="NEW-INCARNATION", ingested=later),
        ],
    )

    kept = (
        first_per_kafka_record(rows)
        .select("topic_id", "partition", "offset", "ingest_time")
        .orderBy("topic_id", "partition", "offset")
    )
    expected = spark.createDataFrame(
        [
            ("NEW-INCARNATION", 0, 1, later),
            (TOPIC_ID, 0, 1, INGESTED),
            (TOPIC_ID, 0, 2, INGESTED),
            (TOPIC_ID, 1, 1, INGESTED),
        ],
        StructType(
            [
                StructField("topic_id", StringType(), False),
                StructField("partition", IntegerType(), False),
                StructField("offset", LongType(), False),
                StructField("ingest_time", TimestampType(), False),
            ]
        ),
    )
    assert_df_equality(kept, expected)


def test_window_aggregates_count_and_sum_per_event_type_and_tumbling_window(spark):
    ID = TOPIC_ID  # noqa: N806 - keeps the rows on one line each
    silver = spark.createDataFrame(
        [
            ("a", utc(2024, 1, 1, 10, 0, 0), "u", "purchase", Decimal("0.10"), "events", ID, 0, 0, None, INGESTED),
            ("b", utc(2024, 1, 1, 10, 0, 59), "u", "purchase", Decimal("0.20"), "events", ID, 0, 1, None, INGESTED),
            # Exactly on the boundary: belongs to the next window.
            ("c", utc(2024, 1, 1, 10, 1, 0), "u", "purchase", Decimal("1.00"), "events", ID, 0, 2, None, INGESTED),
            ("d", utc(2024, 1, 1, 10, 0, 30), "u", "refund", Decimal("5.55"), "events", ID, 1, 0, None, INGESTED),
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
        WINDOW_AGGREGATES_SCHEMA,
    )
    assert_df_equality(result, expected)


def kafka_rows(spark, rows: list[tuple]):
    """Rows as the Kafka source gives them: bronze's columns but topic_id and ingest_time, timestampType camel-cased."""
    return bronze(spark, rows).drop("topic_id", "ingest_time").withColumnRenamed("timestamp_type", "timestampType")


def test_bronze_records_keep_every_kafka_column_and_get_their_topics_id(spark):
    result = with_topic_ids(bronze_records(kafka_rows(spark, [bronze_row(5, b"v")])), {"events": TOPIC_ID, "b": "B"})

    # Spark cannot know the lookup finds every topic: bronze's NOT NULL constraint checks it on write.
    looked_up = [StructField(f.name, f.dataType, True) if f.name == "topic_id" else f for f in BRONZE_SCHEMA.fields]
    assert result.schema == StructType(looked_up)
    assert_df_equality(
        result.drop("ingest_time"),
        bronze(spark, [bronze_row(5, b"v")]).drop("ingest_time"),
        ignore_nullable=True,
    )


def test_every_row_of_one_batch_gets_the_one_time_the_batch_ran(spark):
    rows = kafka_rows(spark, [bronze_row(offset, b"v", partition=offset % 2) for offset in range(8)]).repartition(4)

    before = datetime.now()
    ingested = {row.ingest_time for row in bronze_records(rows).collect()}
    after = datetime.now()

    assert len(ingested) == 1
    assert before <= ingested.pop() <= after


# The default contract and two optional fields of kinds it does not use.
WITH_QUANTITY_AND_GIFT = Contract(
    fields=(
        *EVENTS.fields,
        Field("quantity", Kind.INTEGER, required=False),
        Field("gift", Kind.BOOLEAN, required=False),
        Field("sequence", Kind.LONG, required=False),
    ),
    event_time="event_time",
    dimensions=("event_type",),
    measures=("amount",),
)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (event(quantity="three"), "field quantity must be an integer, got STRING"),
        (event(quantity=1.5), "field quantity must be an integer, got DECIMAL(2,1)"),
        (event(quantity=2**31), "field quantity does not fit INT exactly"),
        (event(gift="yes"), "field gift must be a boolean, got STRING"),
        (event(gift=1), "field gift must be a boolean, got BIGINT"),
        (event(sequence=10**20), "field sequence does not fit BIGINT exactly"),
        (event(sequence=1e300), "field sequence must be an integer, got DOUBLE"),
    ],
)
def test_a_declared_field_quarantines_a_value_its_kind_refuses_with_its_reason(spark, value, reason):
    parsed = parse_events(bronze(spark, [bronze_row(0, value)]), WITH_QUANTITY_AND_GIFT)

    assert [row.reason for row in quarantined_records(parsed).collect()] == [reason]
    assert valid_events(parsed, WITH_QUANTITY_AND_GIFT).count() == 0


def test_optional_fields_are_typed_when_present_and_null_when_absent_or_json_null(spark):
    values = [
        event(quantity=3, gift=True, sequence=2**40),
        event(quantity=3.0, gift=False, sequence=-1),
        event(),
        event(quantity=None, gift=None, sequence=None),
    ]
    parsed = parse_events(
        bronze(spark, [bronze_row(offset, value) for offset, value in enumerate(values)]), WITH_QUANTITY_AND_GIFT
    )

    result = valid_events(parsed, WITH_QUANTITY_AND_GIFT).select("offset", "quantity", "gift", "sequence")
    expected = spark.createDataFrame(
        [(0, 3, True, 2**40), (1, 3, False, -1), (2, None, None, None), (3, None, None, None)],
        "offset long not null, quantity int, gift boolean, sequence bigint",
    )
    assert_df_equality(result, expected, ignore_row_order=True)
    assert valid_events(parsed, WITH_QUANTITY_AND_GIFT).columns == [
        *("event_id", "event_time", "user_id", "event_type", "amount", "quantity", "gift", "sequence"),
        *("topic", "topic_id", "partition", "offset", "kafka_timestamp", "ingest_time"),
    ]


@pytest.mark.parametrize("dataset", DATASETS, ids=lambda dataset: dataset.name)
def test_a_datasets_sample_drawn_from_its_contract_is_valid_but_for_the_bad_and_the_retried_records(spark, dataset):
    # Each contract as JSON carries it; a sample in Avro, through a registry, is test_formats_avro's.
    dataset = dataclasses.replace(dataset, format=Format.JSON)
    records = list(contract_records(dataset, 300, seed=3, malformed_ratio=0.1, retry_ratio=0.1))
    # The ways of being bad that are the same bytes each time; the others are made from a record's values.
    constant = {b"{not json", b'["an", "array"]', b"\xff\xfe not utf-8", None}
    first_seen: dict[bytes | None, int] = {}
    retried = {
        offset
        for offset, (_, value) in enumerate(records)
        if value not in constant and first_seen.setdefault(value, offset) != offset
    }
    rows = [
        (key, value, [], "samples", TOPIC_ID, 0, offset, KAFKA_TIME, 0, INGESTED)
        for offset, (key, value) in enumerate(records)
    ]
    parsed = parse_events(bronze(spark, rows), dataset.contract)
    if dataset.dedup_key:
        parsed = without_duplicates(parsed, None, dataset)
    reasons = {row.offset: row.reason for row in parsed.select("offset", "reason").collect()}

    bad = {offset for offset, reason in reasons.items() if reason and not reason.startswith("duplicate of ")}
    duplicates = {offset for offset, reason in reasons.items() if reason and reason.startswith("duplicate of ")}
    # Each bad record is one of the ways a record is bad, in turn; a retry repeats a valid one.
    assert len(bad) >= 20 and bad.isdisjoint(retried), sorted(bad)
    assert {records[offset][1] for offset in bad} >= {b"{not json", b'["an", "array"]', None}
    if dataset.dedup_key:
        assert duplicates == retried and len(retried) >= 20
    else:
        assert duplicates == set()
    # The rest are valid and typed: every required field there.
    valid = valid_events(parsed, dataset.contract).collect()
    assert len(valid) == len(records) - len(bad) - len(duplicates)
    assert all(row[field.name] is not None for row in valid for field in dataset.contract.fields if field.required)


def test_silver_and_the_oracle_agree_on_which_sample_records_fail_each_expectation_and_which_fails_first(spark):
    # Two quarantining rules a sample breaks (the first on purpose, the second by chance: one event type in
    # four is unknown) and one that warns: silver's SQL and the oracle's Python judge them apart.
    dataset = Dataset(
        "checked_events",
        EVENTS,
        (Gold.of("windows", EVENTS),),
        expectations=(
            in_range("amount_positive", "amount", minimum="0.01"),
            one_of("known_type", "event_type", ("event_type-000", "event_type-001", "event_type-002")),
            matches("user_shape", "user_id", "^user_id-00", Action.WARN),
        ),
    )
    assert breakable(dataset) is dataset.expectations[0]
    records = list(contract_records(dataset, 400, seed=5, malformed_ratio=0.05, unexpected_ratio=0.1))
    rows = [
        (key, value, [], "samples", TOPIC_ID, 0, offset, KAFKA_TIME, 0, INGESTED)
        for offset, (key, value) in enumerate(records)
    ]
    parsed = parse_records(bronze(spark, rows), dataset)
    found = {row.offset: row.reason for row in parsed.select("offset", "reason").collect()}
    by_rule = {offset: reason for offset, reason in found.items() if reason and reason.startswith("expectation ")}
    expected = {
        offset: unmet_reason(dataset, value)
        for offset, (_, value) in enumerate(records)
        if found[offset] is None or found[offset].startswith("expectation ")
        if unmet_reason(dataset, value) is not None
    }
    assert by_rule == expected
    counts = Counter(expected.values())
    assert counts["expectation amount_positive not met"] >= 25 and counts["expectation known_type not met"] >= 60, (
        counts
    )
