"""Silver's dedup on a business key (pipeline/dedup.py), on real Spark DataFrames."""

from datetime import UTC, datetime, timedelta

import pytest
from chispa import assert_df_equality
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from {{ cookiecutter.package_name }}.pipeline.dedup import mark_business_key_duplicates

PARSED = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("ingest_time", TimestampType(), False),
        StructField("event_id", StringType(), True),
        StructField("event_time", TimestampType(), True),
        StructField("reason", StringType(), True),
    ]
)
HELD = StructType([field for field in PARSED.fields if field.name not in ("reason",)])
DAY = timedelta(days=1)
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
INGESTED = datetime(2024, 3, 20, 8, 0, tzinfo=UTC)


def record(partition, offset, event_id, event_time=T0, reason=None, ingested=INGESTED):
    return ("orders", "id-1", partition, offset, ingested, event_id, event_time, reason)


def marked(spark, batch, held=(), horizon_s=None):
    parsed = spark.createDataFrame(batch, PARSED)
    silver = spark.createDataFrame([row[:-1] for row in held], HELD)
    return mark_business_key_duplicates(parsed, silver, ("event_id",), "event_time", horizon_s)


def test_the_first_copy_in_bronzes_order_is_kept_and_every_other_names_it(spark):
    batch = [
        record(1, 7, "a"),  # a's first copy: partition 0 comes before partition 1 in one ingest
        record(0, 9, "a"),
        record(0, 10, "b"),
        record(2, 3, "a"),
        record(0, 11, "c", reason="missing required field amount"),  # already quarantined: not a copy of anything
        record(1, 8, "c"),
    ]
    expected = [
        record(1, 7, "a", reason="duplicate of orders/0/9"),
        record(0, 9, "a"),
        record(0, 10, "b"),
        record(2, 3, "a", reason="duplicate of orders/0/9"),
        record(0, 11, "c", reason="missing required field amount"),
        record(1, 8, "c"),
    ]

    assert_df_equality(marked(spark, batch), spark.createDataFrame(expected, PARSED), ignore_row_order=True)


def test_a_key_silver_holds_makes_every_copy_a_duplicate_of_the_held_record(spark):
    held = [record(0, 1, "a", ingested=INGESTED - DAY)]
    batch = [record(0, 20, "a"), record(1, 4, "a"), record(1, 5, "b")]
    expected = [
        record(0, 20, "a", reason="duplicate of orders/0/1"),
        record(1, 4, "a", reason="duplicate of orders/0/1"),
        record(1, 5, "b"),
    ]

    assert_df_equality(marked(spark, batch, held), spark.createDataFrame(expected, PARSED), ignore_row_order=True)


def test_a_replay_after_silver_committed_the_batch_marks_the_same_records(spark):
    batch = [record(0, 20, "a"), record(1, 4, "a")]
    first = marked(spark, batch)
    # Silver now holds the batch's kept record: replayed, the batch must come out the same.
    committed = [row for row in first.collect() if row.reason is None]
    again = marked(spark, batch, held=[tuple(row) for row in committed])

    assert_df_equality(again, first, ignore_row_order=True)
    assert sorted(row.reason or "" for row in again.collect()) == ["", "duplicate of orders/0/20"]


def test_with_a_horizon_a_record_is_a_duplicate_only_of_a_kept_record_near_it_in_event_time(spark):
    held = [record(0, 1, "a", event_time=T0, ingested=INGESTED - DAY)]
    batch = [
        record(0, 10, "a", event_time=T0 + 5 * DAY),  # within 7 days of the held record
        record(0, 11, "a", event_time=T0 + 10 * DAY),  # 10 days from the held one; the copy above was not kept
        record(0, 12, "a", event_time=T0 + 12 * DAY),  # 2 days from the one kept just before it
        record(0, 13, "a", event_time=T0 - 30 * DAY),  # far from all: kept
    ]
    expected = [
        record(0, 10, "a", event_time=T0 + 5 * DAY, reason="duplicate of orders/0/1"),
        record(0, 11, "a", event_time=T0 + 10 * DAY),
        record(0, 12, "a", event_time=T0 + 12 * DAY, reason="duplicate of orders/0/11"),
        record(0, 13, "a", event_time=T0 - 30 * DAY),
    ]

    result = marked(spark, batch, held, horizon_s=7 * 86400)

    assert_df_equality(result, spark.createDataFrame(expected, PARSED), ignore_row_order=True)


def test_a_horizon_longer_than_the_calendar_silver_holds_is_the_same_as_none(spark):
    batch = [record(0, 1, "a", event_time=datetime(1600, 1, 1, tzinfo=UTC)), record(0, 2, "a")]

    result = marked(spark, batch, horizon_s=10**15)

    assert [row.reason for row in result.orderBy("offset").collect()] == [None, "duplicate of orders/0/1"]


@pytest.mark.parametrize(
    ("key", "horizon_s", "problem"),
    [("event_id", None, "key must be"), ((), None, "key must be"), (("event_id",), 0, "horizon_s must be")],
)
def test_a_bad_key_or_horizon_is_refused_before_spark_is_asked(key, horizon_s, problem):
    with pytest.raises(ValueError, match=problem):
        mark_business_key_duplicates(None, None, key, "event_time", horizon_s)
