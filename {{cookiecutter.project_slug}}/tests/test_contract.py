"""The event contract: declared once, checked when it is built, obeyed by every layer."""

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from {{ cookiecutter.package_name }}.devtools.sample import produce
from {{ cookiecutter.package_name }}.pipeline import gold as gold_module
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import reconcile, run_audit
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.datasets.events import DATASET as EVENTS_DATASET
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import (
    BRONZE,
    GOLD,
    GOLD_SCHEMA,
    QUARANTINE,
    QUARANTINE_SCHEMA,
    SILVER,
    SILVER_SCHEMA,
    Lakehouse,
    TableSchemaError,
    distinct_values_schema,
    ensure_tables,
    gold_schema,
    latest_snapshot,
    schema_differences,
    silver_schema,
    with_downstream,
)
from {{ cookiecutter.package_name }}.pipeline.gold import add_to_windows, distinct_values, touched_windows, window_aggregates
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery.checkpoints import CheckpointError
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import BETWEEN_SINK_COMMITS, CRASH_POINT_VAR
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now

EVENT_ID = Field("event_id", Kind.STRING)
EVENT_TIME = Field("event_time", Kind.TIMESTAMP)
AMOUNT = Field("amount", Kind.DECIMAL, precision=18, scale=2)


def contract(*fields: Field, event_time: str = "event_time", dimensions=(), measures=()) -> Contract:
    return Contract(fields=fields, event_time=event_time, dimensions=dimensions, measures=measures)


BAD_DECLARATIONS = [
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, Field("event_id", Kind.LONG)),
        "field event_id: declared twice",
        id="duplicate-name",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, Field("Event_ID", Kind.STRING)),
        "field Event_ID: declared twice (also as event_id)",
        id="duplicate-name-in-another-case",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, Field("event_time", Kind.STRING)),
        "field event_time: the event time must be a TIMESTAMP, not STRING",
        id="event-time-not-a-timestamp",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, Field("event_time", Kind.TIMESTAMP, required=False)),
        "field event_time: the event time must be required",
        id="event-time-optional",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, event_time="occurred_at"),
        "field occurred_at: named as the event time but not declared",
        id="event-time-not-declared",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, dimensions=("channel",)),
        "field channel: named as the dimension but not declared",
        id="dimension-not-declared",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, dimensions=("event_id", "event_id")),
        "field event_id: listed twice as a dimension",
        id="dimension-twice",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, dimensions=("event_time",)),
        "field event_time: the event time is gold's window already",
        id="event-time-as-dimension",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, measures=("event_id",)),
        "field event_id: a measure is summed, so it must be DECIMAL, INTEGER or LONG, not STRING",
        id="measure-not-numeric",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, AMOUNT, measures=("total",)),
        "field total: named as the measure but not declared",
        id="measure-not-declared",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, Field("amount", Kind.LONG, required=False), measures=("amount",)),
        "field amount: a measure must be required",
        id="measure-optional",
    ),
    pytest.param(
        lambda: contract(EVENT_ID, EVENT_TIME, AMOUNT, dimensions=("amount",), measures=("amount",)),
        "field amount: a field is a dimension or a measure, not both",
        id="dimension-and-measure",
    ),
    pytest.param(
        lambda: contract(
            EVENT_ID,
            EVENT_TIME,
            AMOUNT,
            Field("amount_sum", Kind.STRING),
            dimensions=("amount_sum",),
            measures=("amount",),
        ),
        "field amount: its gold column amount_sum is the dimension amount_sum",
        id="measure-sum-named-like-a-dimension",
    ),
    pytest.param(lambda: Field("offset", Kind.LONG), "field offset: the name is taken", id="kafka-column-name"),
    pytest.param(
        lambda: Field("event_count", Kind.LONG), "field event_count: the name is taken", id="gold-column-name"
    ),
    pytest.param(
        lambda: Field("event-id", Kind.STRING), "field 'event-id': a name is a letter", id="not-an-identifier"
    ),
    pytest.param(lambda: Field("_doc", Kind.STRING), "field '_doc': a name is a letter", id="leading-underscore"),
    pytest.param(lambda: Field("event_type", "string"), "field event_type: kind must be a Kind", id="kind-not-a-kind"),
    pytest.param(
        lambda: Field("amount", Kind.DECIMAL),
        "field amount: DECIMAL needs a precision from 1 to 38, got None",
        id="decimal-without-precision",
    ),
    pytest.param(
        lambda: Field("amount", Kind.DECIMAL, precision=39, scale=2),
        "field amount: DECIMAL needs a precision from 1 to 38, got 39",
        id="decimal-too-precise",
    ),
    pytest.param(
        lambda: Field("amount", Kind.DECIMAL, precision=4, scale=5),
        "field amount: DECIMAL needs a scale from 0 to its precision 4, got 5",
        id="decimal-scale-above-precision",
    ),
    pytest.param(
        lambda: Field("quantity", Kind.LONG, precision=10),
        "field quantity: precision and scale are for DECIMAL fields, not LONG",
        id="precision-on-a-long",
    ),
]


@pytest.mark.parametrize(("declare", "message"), BAD_DECLARATIONS)
def test_a_bad_declaration_fails_naming_the_field(declare, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declare()


def test_the_default_contract_gives_the_documented_silver_and_gold_schemas():
    assert SILVER_SCHEMA == StructType(
        [
            StructField("event_id", StringType(), False),
            StructField("event_time", TimestampType(), False),
            StructField("user_id", StringType(), False),
            StructField("event_type", StringType(), False),
            StructField("amount", DecimalType(18, 2), False),
            StructField("topic", StringType(), False),
            StructField("topic_id", StringType(), False),
            StructField("partition", IntegerType(), False),
            StructField("offset", LongType(), False),
            StructField("kafka_timestamp", TimestampType(), True),
            StructField("ingest_time", TimestampType(), False),
        ]
    )
    assert GOLD_SCHEMA == StructType(
        [
            StructField("window_start", TimestampType(), False),
            StructField("window_end", TimestampType(), False),
            StructField("event_type", StringType(), False),
            StructField("event_count", LongType(), False),
            StructField("amount_sum", DecimalType(28, 2), False),
        ]
    )


def test_the_default_contract_quarantines_with_the_documented_reasons_in_their_order():
    strings = ("event_id", "user_id", "event_type")
    assert EVENTS.quarantine_reasons() == [
        "null value (tombstone)",
        "value is not valid UTF-8",
        "value is not valid JSON",
        "value is not a JSON object",
        *(f"missing required field {name}" for name in (*strings, "event_time", "amount")),
        *(f"field {name} must be a string, got <type>" for name in (*strings, "event_time")),
        *(f"field {name} must not be empty" for name in strings),
        "field event_time is not an ISO-8601 timestamp with offset",
        "field amount must be a number, got <type>",
        "field amount does not fit DECIMAL(18,2) exactly",
        "field event_time is outside the supported range [1583-01-01T00:00:00Z, 9999-01-01T00:00:00Z)",
        *(f"field {name} contains the character U+0000" for name in strings),
    ]


# Orders per shop and optional coupon; three kinds of measures.
ORDERS = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("coupon", Kind.STRING, required=False),
        Field("quantity", Kind.INTEGER),
        Field("weight", Kind.LONG),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
    ),
    event_time="ordered_at",
    dimensions=("shop", "coupon"),
    measures=("quantity", "weight", "total"),
)


def events_declared_with(contract: Contract) -> Dataset:
    """The events dataset as a team that changed its contract declares it: the same tables and streams."""
    return dataclasses.replace(
        EVENTS_DATASET, contract=contract, golds=(Gold.of(EVENTS_DATASET.golds[0].name, contract),)
    )


def test_gold_sums_every_measure_per_window_and_dimensions_and_a_null_dimension_is_one_group(spark, tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    ensure_tables(spark, lakehouse, events_declared_with(ORDERS))
    at = datetime(2024, 1, 1, 10, 0, 5, tzinfo=UTC)
    first, second = (
        spark.createDataFrame(rows, silver_schema(ORDERS))
        for rows in (
            [
                ("o1", at, "north", None, 2, 2**40, Decimal("10.05"), "orders", "id-1", 0, 0, None, at),
                ("o2", at, "north", "SPRING", 1, 5, Decimal("3.00"), "orders", "id-1", 0, 1, None, at),
            ],
            [("o3", at, "north", None, 3, 1, Decimal("0.95"), "orders", "id-1", 0, 2, None, at)],
        )
    )
    aggregates = window_aggregates(first, "1 minute", ORDERS)
    assert [(f.name, f.dataType) for f in aggregates.schema] == [(f.name, f.dataType) for f in gold_schema(ORDERS)]

    # The second batch's null coupon must find the row the first one inserted.
    add_to_windows(aggregates, lakehouse.table(GOLD), "test", 0, ORDERS)
    add_to_windows(window_aggregates(second, "1 minute", ORDERS), lakehouse.table(GOLD), "test", 1, ORDERS)

    gold = spark.read.format("delta").load(lakehouse.table(GOLD))
    assert gold.schema == gold_schema(ORDERS)
    rows = [(r.shop, r.coupon, r.event_count, r.quantity_sum, r.weight_sum, r.total_sum) for r in gold.collect()]
    assert sorted(rows, key=str) == [
        ("north", "SPRING", 1, 1, 5, Decimal("3.00")),
        ("north", None, 2, 5, 2**40 + 1, Decimal("11.00")),
    ]
    # The audit's recomputation matches the null coupon too.
    silver = first.unionByName(second)
    keys = silver.select("topic", "topic_id", "partition", "offset")
    no_quarantine = spark.createDataFrame([], QUARANTINE_SCHEMA)
    report = reconcile(keys, keys, silver, no_quarantine, gold, "1 minute", ORDERS)
    assert report.clean, report.as_dict()


# A gold of other aggregates than the contract's own: per shop, the smallest and largest order, the
# last order time, the smallest quantity and about how many distinct order ids.
ORDER_EXTREMES = Gold(
    "extremes",
    dimensions=("shop",),
    aggregates=(
        Aggregate(AggregateKind.COUNT),
        Aggregate(AggregateKind.MIN, "total"),
        Aggregate(AggregateKind.MAX, "total"),
        Aggregate(AggregateKind.MAX, "ordered_at"),
        Aggregate(AggregateKind.MIN, "quantity"),
        Aggregate(AggregateKind.APPROX_DISTINCT, "order_id"),
    ),
)


def test_a_declared_gold_keeps_minima_and_maxima_across_batches_and_a_replayed_batch_changes_nothing(spark, tmp_path):
    path = str(tmp_path / "gold_extremes")
    DeltaTable.createIfNotExists(spark).location(path).addColumns(gold_schema(ORDERS, ORDER_EXTREMES)).execute()
    at = datetime(2024, 1, 1, 10, 0, 5, tzinfo=UTC)

    def silver(*orders):
        kafka = ("orders", "id-1", 0)
        rows = [
            (order_id, at + timedelta(seconds=late), shop, None, quantity, 1, Decimal(total), *kafka, n, None, at)
            for n, (order_id, late, shop, quantity, total) in enumerate(orders)
        ]
        return spark.createDataFrame(rows, silver_schema(ORDERS))

    first = silver(("o1", 0, "north", 2, "10.05"), ("o2", 10, "north", 5, "3.00"), ("o3", 20, "south", 1, "7.00"))
    # o1 again, in another Kafka record: an order counted twice, an order id once.
    second = silver(("o4", 30, "north", 1, "12.50"), ("o5", 1, "north", 9, "4.00"), ("o1", 40, "north", 3, "5.00"))
    # The first batch is appended (no gold file holds its window), the second merged; then it is replayed.
    for batch_id, batch in ((0, first), (1, second), (1, second)):
        aggregates = window_aggregates(batch, "1 minute", ORDERS, ORDER_EXTREMES)
        add_to_windows(aggregates, path, "test", batch_id, ORDERS, gold=ORDER_EXTREMES)

    start, end = datetime(2024, 1, 1, 10, 0, tzinfo=UTC), datetime(2024, 1, 1, 10, 1, tzinfo=UTC)
    schema = gold_schema(ORDERS, ORDER_EXTREMES)
    expected = spark.createDataFrame(
        [
            (start, end, "north", 5, Decimal("3.00"), Decimal("12.50"), at + timedelta(seconds=40), 1, 4),
            (start, end, "south", 1, Decimal("7.00"), Decimal("7.00"), at + timedelta(seconds=20), 1, 1),
        ],
        StructType([field for field in schema.fields if field.name not in ORDER_EXTREMES.sketches]),
    )
    gold = spark.read.format("delta").load(path)
    assert gold.schema == schema
    assert_df_equality(gold.drop(*ORDER_EXTREMES.sketches), expected, ignore_row_order=True)
    # The estimate is the merged sketch's, and a sketch of all the orders at once says the same.
    recomputed = window_aggregates(first.unionByName(second), "1 minute", ORDERS, ORDER_EXTREMES)
    assert_df_equality(recomputed.drop(*ORDER_EXTREMES.sketches), expected, ignore_row_order=True, ignore_nullable=True)


# Per shop and coupon (optional: a null coupon is one group), the orders and the distinct order ids.
ORDER_IDS = Gold(
    "order_ids",
    dimensions=("shop", "coupon"),
    aggregates=(Aggregate(AggregateKind.COUNT), Aggregate(AggregateKind.DISTINCT, "order_id")),
)


def test_an_exact_distinct_count_counts_each_value_once_across_batches_and_through_a_replay(spark, tmp_path):
    gold_path, values_path = str(tmp_path / "gold_order_ids"), str(tmp_path / "gold_order_ids_values")
    DeltaTable.createIfNotExists(spark).location(gold_path).addColumns(gold_schema(ORDERS, ORDER_IDS)).execute()
    values_schema = distinct_values_schema(ORDERS, ORDER_IDS, "order_id_distinct")
    DeltaTable.createIfNotExists(spark).location(values_path).addColumns(values_schema).execute()
    at = datetime(2024, 1, 1, 10, 0, 5, tzinfo=UTC)

    def silver(*orders):
        kafka = ("orders", "id-1", 0)
        rows = [
            (order_id, at, "north", coupon, 1, 1, Decimal("1.00"), *kafka, n, None, at)
            for n, (order_id, coupon) in enumerate(orders)
        ]
        return spark.createDataFrame(rows, silver_schema(ORDERS))

    def values(batch):
        return distinct_values(batch, "1 minute", ORDERS, ORDER_IDS)["order_id_distinct"]

    def add(batch, batch_id):
        aggregates = window_aggregates(batch, "1 minute", ORDERS, ORDER_IDS)
        distinct = {"order_id_distinct": (values(batch), values_path)}
        add_to_windows(aggregates, gold_path, "test", batch_id, ORDERS, gold=ORDER_IDS, distinct=distinct)

    first = silver(("o1", None), ("o2", None), ("o1", None), ("o3", "SPRING"))
    second = silver(("o2", None), ("o4", None), ("o3", "SPRING"))
    add(first, 0)
    # The process dies after the second batch's new values are recorded, before gold's commit: the
    # replay skips the recording (its tag) and still counts what the batch recorded.
    windows = touched_windows(window_aggregates(second, "1 minute", ORDERS, ORDER_IDS))
    gold_module._count_new_values(values(second), values_path, "test", 1, ORDERS, ORDER_IDS, windows).collect()
    add(second, 1)
    add(second, 1)  # and again, after gold's commit: nothing changes

    start, end = datetime(2024, 1, 1, 10, 0, tzinfo=UTC), datetime(2024, 1, 1, 10, 1, tzinfo=UTC)
    expected = spark.createDataFrame(
        [(start, end, "north", None, 5, 3), (start, end, "north", "SPRING", 2, 1)], gold_schema(ORDERS, ORDER_IDS)
    )
    assert_df_equality(spark.read.format("delta").load(gold_path), expected, ignore_row_order=True)
    # A count over all the orders at once agrees.
    recomputed = window_aggregates(first.unionByName(second), "1 minute", ORDERS, ORDER_IDS)
    assert_df_equality(recomputed, expected, ignore_row_order=True, ignore_nullable=True)
    # Each value is held once, marked with the batch that brought it first.
    held = {(r.coupon, r.value, r.first_batch) for r in spark.read.format("delta").load(values_path).collect()}
    assert held == {(None, "o1", 0), (None, "o2", 0), ("SPRING", "o3", 0), (None, "o4", 1)}


def test_an_exact_distinct_count_needs_the_batchs_values_and_their_table(spark):
    aggregates = window_aggregates(spark.createDataFrame([], silver_schema(ORDERS)), "1 minute", ORDERS, ORDER_IDS)

    with pytest.raises(ValueError, match=r"distinct must give the values and table of \['order_id_distinct'\]"):
        add_to_windows(aggregates, "/unused", "test", 0, ORDERS, gold=ORDER_IDS)


# The default contract plus a required channel that gold also groups by, and an optional quantity.
WITH_CHANNEL = Contract(
    fields=(
        Field("event_id", Kind.STRING),
        Field("event_time", Kind.TIMESTAMP),
        Field("user_id", Kind.STRING),
        Field("event_type", Kind.STRING),
        Field("channel", Kind.STRING),
        Field("quantity", Kind.INTEGER, required=False),
        Field("amount", Kind.DECIMAL, precision=18, scale=2),
    ),
    event_time="event_time",
    dimensions=("event_type", "channel"),
    measures=("amount",),
)


def test_tables_made_for_another_contract_are_refused_naming_the_difference(spark, tmp_path):
    lakehouse = Lakehouse(str(tmp_path / "lakehouse"))
    ensure_tables(spark, lakehouse)

    with pytest.raises(TableSchemaError) as refused:
        ensure_tables(spark, lakehouse, events_declared_with(WITH_CHANNEL))

    assert "silver_events at " in str(refused.value)
    assert "missing column channel STRING NOT NULL; missing column quantity INT." in str(refused.value)


def test_a_schema_difference_names_each_column_that_differs():
    loosened = StructType(
        [StructField(f.name, f.dataType, True) if f.name == "amount" else f for f in SILVER_SCHEMA.fields]
        + [StructField("extra", StringType(), True)]
    )

    assert schema_differences(SILVER_SCHEMA, SILVER_SCHEMA) == []
    assert schema_differences(SILVER_SCHEMA, loosened) == [
        "column amount is DECIMAL(18,2), the contract says DECIMAL(18,2) NOT NULL",
        "unexpected column extra",
    ]
    assert schema_differences(SILVER_SCHEMA, StructType(SILVER_SCHEMA.fields[::-1]))[0].startswith(
        "columns in another order: ingest_time, kafka_timestamp"
    )


START = datetime(2024, 5, 1, 11, 0, tzinfo=timezone(timedelta(hours=2)))


def channel_events(count: int, seed: int) -> list[tuple[bytes, bytes]]:
    """Records of WITH_CHANNEL: every 7th lacks its channel, some carry a quantity, some a bad one."""
    rng = random.Random(seed)
    records = []
    for index in range(count):
        event = {
            "event_id": f"s{seed}-{index}",
            "event_time": (START + timedelta(seconds=rng.randrange(240))).isoformat(),
            "user_id": f"user-{rng.randrange(20)}",
            "event_type": rng.choice(("view", "purchase")),
            "channel": rng.choice(("web", "app", "store")),
            "amount": rng.randrange(1, 100_000) / 100,
        }
        if index % 3 == 0:
            event["quantity"] = rng.randrange(1, 10)
        if index % 11 == 5:
            event["quantity"] = "three"
        if index % 7 == 0:
            del event["channel"]
        records.append((event["user_id"].encode(), json.dumps(event).encode()))
    return records


def expected_layers(records: list[tuple[bytes, bytes]]) -> tuple[dict, dict, dict]:
    """Silver (event_id -> channel, quantity), quarantine (value -> reason) and gold, in plain Python."""
    silver, quarantine = {}, {}
    gold: dict[tuple[int, str, str], list] = defaultdict(lambda: [0, Decimal("0")])
    for _, value in records:
        event = json.loads(value)
        if "channel" not in event:
            quarantine[value] = "missing required field channel"
        elif isinstance(event.get("quantity"), str):
            quarantine[value] = "field quantity must be an integer, got STRING"
        else:
            silver[event["event_id"]] = (event["channel"], event.get("quantity"))
            epoch = int(datetime.fromisoformat(event["event_time"]).timestamp())
            totals = gold[(epoch - epoch % 60, event["event_type"], event["channel"])]
            totals[0] += 1
            totals[1] += Decimal(str(event["amount"]))
    return silver, quarantine, {key: tuple(totals) for key, totals in gold.items()}


def assert_layers_follow_the_channel_contract(spark, lakehouse: Lakehouse, produced: list) -> None:
    """Silver, quarantine and gold against expected_layers(produced); silver's and gold's columns too."""

    def table(name: str):
        return spark.read.format("delta").load(lakehouse.table(name))

    expected_silver, expected_quarantine, expected_gold = expected_layers(produced)
    silver = table(SILVER)
    assert silver.columns == [
        *("event_id", "event_time", "user_id", "event_type", "channel", "quantity", "amount"),
        *("topic", "topic_id", "partition", "offset", "kafka_timestamp", "ingest_time"),
    ]
    assert silver.schema["channel"] == StructField("channel", StringType(), False)
    assert silver.schema["quantity"] == StructField("quantity", IntegerType(), True)
    assert {row.event_id: (row.channel, row.quantity) for row in silver.collect()} == expected_silver

    quarantine = {bytes(row.value): row.reason for row in table(QUARANTINE).collect()}
    assert quarantine == expected_quarantine

    gold = table(GOLD)
    assert gold.columns == ["window_start", "window_end", "event_type", "channel", "event_count", "amount_sum"]
    assert gold.where(F.col("window_end") != F.col("window_start") + F.expr("INTERVAL 1 MINUTE")).count() == 0
    rows = gold.select(F.col("window_start").cast("long").alias("start"), "*").collect()
    assert {(r.start, r.event_type, r.channel): (r.event_count, r.amount_sum) for r in rows} == expected_gold


def test_a_contract_with_a_new_required_dimension_reaches_silver_quarantine_gold_and_the_audit(spark, config):
    config = config.model_copy(update={"gold_window": "1 minute"})
    lakehouse = Lakehouse(config.lakehouse_root)
    produced = []
    # Two rounds into the same windows: the second one updates gold rows the first inserted.
    for seed in (1, 2):
        records = channel_events(150, seed)
        produce(client_config(config), config.kafka.topics[0], records, transaction_size=50)
        produced += records
        run_available_now(spark, config, dataset=events_declared_with(WITH_CHANNEL))

    assert_layers_follow_the_channel_contract(spark, lakehouse, produced)
    expected_silver, expected_quarantine, _ = expected_layers(produced)
    assert "missing required field channel" in expected_quarantine.values()
    assert "field quantity must be an integer, got STRING" in expected_quarantine.values()

    report = run_audit(spark, config, events_declared_with(WITH_CHANNEL))
    assert report.clean, report.as_dict()
    assert report.counts["silver_rows"] == len(expected_silver)
    assert report.counts["quarantine_rows"] == len(expected_quarantine)
    # The default contract does not fit these tables, and says so rather than comparing the wrong columns.
    with pytest.raises(TableSchemaError, match="silver_events"):
        run_audit(spark, config)


@pytest.mark.slow
def test_a_changed_contract_is_refused_until_a_reset_rebuilds_silver_and_gold_under_it_never_half_done(
    spark, pipeline_env
):
    config = pipeline_env.model_copy(update={"gold_window": "1 minute"})
    lakehouse = Lakehouse(config.lakehouse_root)

    def table(name: str, version: int | None = None):
        reader = spark.read.format("delta")
        return (reader if version is None else reader.option("versionAsOf", version)).load(lakehouse.table(name))

    def version(name: str) -> int:
        return latest_snapshot(spark, lakehouse.table(name)).version()

    first = channel_events(150, 1)
    produce(client_config(config), config.kafka.topics[0], first, transaction_size=50)
    # The shipped contract knows neither channel nor quantity: every record is valid under it.
    run_available_now(spark, config)
    old_silver = {row.event_id for row in table(SILVER).collect()}
    old_gold = set(table(GOLD).collect())
    assert len(old_silver) == 150 and table(QUARANTINE).count() == 0
    versions = {name: version(name) for name in (SILVER, GOLD)}

    with pytest.raises(TableSchemaError, match=r"missing column channel STRING NOT NULL.*checkpoints reset silver"):
        run_available_now(spark, config, dataset=events_declared_with(WITH_CHANNEL))

    # A reset killed between silver's swap and quarantine's: the next start refuses, naming the reset.
    crash = f"silver:{BETWEEN_SINK_COMMITS}:{version(BRONZE)}"
    killed = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "checkpoints", "reset", "silver", "--yes"],
        env={**os.environ, CRASH_POINT_VAR: crash},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    cut_short = r"silver: a reset that rebuilds .* was cut short.*checkpoints reset silver"
    with pytest.raises(CheckpointError, match=cut_short):
        run_available_now(spark, config, ("silver",))

    silver_rebuilt, gold_rebuilt = reset(
        spark, lakehouse, with_downstream("silver"), config.gold_window, events_declared_with(WITH_CHANNEL)
    )
    expected_silver, expected_quarantine, _ = expected_layers(first)
    assert silver_rebuilt.rows == {SILVER: len(expected_silver), QUARANTINE: len(expected_quarantine)}
    assert (silver_rebuilt.source, gold_rebuilt.source) == (BRONZE, SILVER)
    assert_layers_follow_the_channel_contract(spark, lakehouse, first)
    # Every version a reader could have seen, the killed reset's included: the old table whole or the new one
    # whole, never part of either; a changed schema is swapped in by a replace, empty, then the rows.
    new_gold = set(table(GOLD).collect())
    for v in range(versions[SILVER], version(SILVER) + 1):
        assert {row.event_id for row in table(SILVER, v).collect()} in (old_silver, set(expected_silver), set()), v
    for v in range(versions[GOLD], version(GOLD) + 1):
        assert set(table(GOLD, v).collect()) in (old_gold, new_gold, set()), v

    second = channel_events(150, 2)
    produce(client_config(config), config.kafka.topics[0], second, transaction_size=50)
    run_available_now(spark, config, dataset=events_declared_with(WITH_CHANNEL))
    assert_layers_follow_the_channel_contract(spark, lakehouse, first + second)
    report = run_audit(spark, config, events_declared_with(WITH_CHANNEL))
    assert report.clean, report.as_dict()
