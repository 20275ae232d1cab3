"""A dataset declared once: its golds checked against its contract, its tables and streams named after it."""

import re

import pytest

from {{ cookiecutter.package_name }}.pipeline.config import Mode, load_config
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold, Naming
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS, check_apart, dataset, running
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import (
    FUSED,
    GOLD_SCHEMA,
    STREAMS,
    TABLES,
    Layer,
    dataset_streams,
    fused_stream,
)
from {{ cookiecutter.package_name }}.pipeline.egress import configure, configured, target
from {{ cookiecutter.package_name }}.pipeline.streams import declared_stream, stream_names, upstream_streams

ORDERS = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("customer", Kind.STRING),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
        Field("coupon", Kind.STRING, required=False),
        Field("paid", Kind.BOOLEAN, required=False),
    ),
    event_time="ordered_at",
)
COUNT = Aggregate(AggregateKind.COUNT)


def gold(*aggregates: Aggregate, dimensions=("shop",), name="by_shop", window=None) -> Gold:
    return Gold(name, aggregates or (COUNT,), dimensions, window)


def orders(*golds: Gold, **options) -> Dataset:
    return Dataset("orders", ORDERS, golds or (gold(),), **options)


def test_a_dataset_names_its_tables_and_streams_after_itself_and_its_golds():
    by_shop = gold(COUNT, Aggregate(AggregateKind.MAX, "total"), Aggregate(AggregateKind.DISTINCT, "customer"))
    hourly = gold(Aggregate(AggregateKind.APPROX_DISTINCT, "customer"), name="hourly", dimensions=(), window="1 hour")
    declared = orders(by_shop, hourly)

    assert declared.tables == (
        "bronze_orders",
        "silver_orders",
        "quarantine_orders",
        "gold_orders_by_shop",
        "gold_orders_by_shop_customer_distinct_values",
        "gold_orders_hourly",
    )
    assert declared.gold_tables(by_shop)[1] == declared.values_table(by_shop, by_shop.aggregates[2])
    with pytest.raises(ValueError, match="gold hourly has no exact distinct count 'customer_approx_distinct'"):
        declared.values_table(hourly, hourly.aggregates[0])
    assert declared.streams == ("orders_bronze", "orders_silver", "orders_gold_by_shop", "orders_gold_hourly")
    assert declared.stream("fused") == "orders_fused"
    assert by_shop.columns == ("window_start", "window_end", "shop", "event_count", "total_max", "customer_distinct")
    assert hourly.values == ("customer_approx_distinct",)
    assert (by_shop.sketches, hourly.sketches) == ((), ("customer_approx_distinct_sketch",))


def test_a_datasets_streams_read_and_write_its_own_tables_and_each_gold_has_a_stream():
    by_shop, hourly = gold(), gold(name="hourly", dimensions=())
    streams = dataset_streams(orders(by_shop, hourly))

    golds = ("orders_gold_by_shop", "orders_gold_hourly")
    assert [(s.name, s.source, s.sinks, s.downstream, s.rebuilt_from_source) for s in streams.values()] == [
        ("orders_bronze", "kafka", ("bronze_orders",), ("orders_silver", *golds), False),
        ("orders_silver", "bronze_orders", ("silver_orders", "quarantine_orders"), golds, False),
        ("orders_gold_by_shop", "silver_orders", ("gold_orders_by_shop",), (), True),
        ("orders_gold_hourly", "silver_orders", ("gold_orders_hourly",), (), True),
    ]
    assert [(s.layer, s.gold) for s in streams.values()] == [
        (Layer.BRONZE, None),
        (Layer.SILVER, None),
        (Layer.GOLD, by_shop),
        (Layer.GOLD, hourly),
    ]
    fused = fused_stream(orders(by_shop, hourly))
    assert (fused.name, fused.source, fused.sinks) == ("orders_fused", "kafka", orders(by_shop, hourly).tables)


def test_the_first_dataset_keeps_the_names_of_a_lakehouse_of_one_dataset():
    # A lakehouse written before datasets existed runs on under these names, without a migration.
    [events] = [declared for declared in DATASETS if declared.naming is Naming.SOLE]
    assert events.tables == TABLES == ("bronze_events", "silver_events", "quarantine_events", "gold_event_windows")
    assert events.streams == tuple(STREAMS) == ("bronze", "silver", "gold")
    assert events.stream("fused") == FUSED.name == "fused"
    assert FUSED.sinks == TABLES
    assert STREAMS["bronze"].downstream == ("silver", "gold")
    assert events.contract is EVENTS
    assert events.golds[0].columns == tuple(GOLD_SCHEMA.fieldNames())
    second = Gold("by_user", (COUNT,), ("user_id",))
    two_golds = Dataset("events", EVENTS, (events.golds[0], second), naming=Naming.SOLE)
    assert two_golds.gold_stream(second) == "gold_by_user"


def test_a_dataset_is_found_by_name_and_an_unknown_name_lists_the_known():
    assert dataset("events") is DATASETS[0]
    known = ", ".join(each.name for each in DATASETS)
    with pytest.raises(ValueError, match=f"dataset must be one of {known}, not 'nowhere'"):
        dataset("nowhere")


BAD_GOLDS = [
    pytest.param(lambda: Aggregate(AggregateKind.COUNT, "total"), "aggregate count: counts events", id="count-field"),
    pytest.param(lambda: Aggregate(AggregateKind.SUM), "aggregate sum: needs the field", id="sum-no-field"),
    pytest.param(lambda: Aggregate("sum", "total"), "aggregate: kind must be an AggregateKind", id="kind-a-string"),
    pytest.param(
        lambda: Aggregate(AggregateKind.MAX, "total", column="max-total"),
        "column 'max-total' is not a plain column name",
        id="column-not-a-name",
    ),
    pytest.param(lambda: Gold("By Shop", (COUNT,)), "gold 'By Shop': a name is a lower-case letter", id="gold-name"),
    pytest.param(lambda: Gold("empty", ()), "gold empty: declare at least one aggregate", id="no-aggregate"),
    pytest.param(lambda: Gold("g", (COUNT,), "shop"), "gold g: dimensions must be a sequence", id="dimensions-string"),
    pytest.param(
        lambda: gold(COUNT, Aggregate(AggregateKind.MIN, "total", column="event_count")),
        "gold by_shop: column event_count is declared twice",
        id="column-twice",
    ),
    pytest.param(
        lambda: gold(Aggregate(AggregateKind.MIN, "total", column="event_count")),
        "gold by_shop: column event_count is taken by a column the pipeline adds",
        id="count-column-taken",
    ),
    pytest.param(
        lambda: gold(Aggregate(AggregateKind.MAX, "total", column="offset")),
        "gold by_shop: column offset is taken",
        id="kafka-column-taken",
    ),
    pytest.param(
        lambda: gold(window="fortnightly"),
        "gold by_shop: window: 'fortnightly' is not a duration",
        id="window-not-a-duration",
    ),
]


@pytest.mark.parametrize(("declare", "message"), BAD_GOLDS)
def test_a_bad_aggregate_or_gold_fails_naming_what_is_wrong(declare, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declare()


BAD_DATASETS = [
    pytest.param(
        lambda: orders(gold(Aggregate(AggregateKind.SUM, "shop"))),
        "gold by_shop: sum of shop needs a required DECIMAL, INTEGER or LONG field, not STRING",
        id="sum-of-a-string",
    ),
    pytest.param(
        lambda: orders(gold(Aggregate(AggregateKind.MAX, "paid"))),
        "gold by_shop: max of paid needs a number or a timestamp, not BOOLEAN",
        id="max-of-a-boolean",
    ),
    pytest.param(
        lambda: orders(gold(Aggregate(AggregateKind.DISTINCT, "customer_id"))),
        "gold by_shop: distinct of customer_id, not a field of the contract",
        id="aggregate-field-not-declared",
    ),
    pytest.param(
        lambda: orders(gold(dimensions=("country",))),
        "gold by_shop: dimension country is not a field of the contract",
        id="dimension-not-declared",
    ),
    pytest.param(
        lambda: orders(gold(dimensions=("ordered_at",))),
        "gold by_shop: the event time ordered_at is the window already",
        id="event-time-as-dimension",
    ),
    pytest.param(lambda: orders(gold(), gold()), "dataset orders: gold by_shop is declared twice", id="gold-twice"),
    pytest.param(lambda: Dataset("orders", ORDERS, ()), "dataset orders: declare at least one gold", id="no-gold"),
    pytest.param(
        lambda: Dataset("Orders", ORDERS, (gold(),)), "dataset 'Orders': a name is a lower-case letter", id="name"
    ),
    pytest.param(
        lambda: orders(dedup_key=("coupon",)),
        "dataset orders: dedup key coupon must be required",
        id="dedup-key-optional",
    ),
    pytest.param(
        lambda: orders(dedup_key=("order",)),
        "dataset orders: dedup key order is not a field of the contract",
        id="dedup-key-not-declared",
    ),
    pytest.param(
        lambda: orders(dedup_key="order_id"),
        "dataset orders: dedup_key must be a sequence",
        id="dedup-key-a-string",
    ),
    pytest.param(
        lambda: orders(dedup_horizon="7 days"),
        "dataset orders: a dedup horizon needs a dedup key",
        id="horizon-without-key",
    ),
    pytest.param(
        lambda: orders(dedup_key=("order_id",), dedup_horizon="a week"),
        "dataset orders: dedup_horizon: 'a week' is not a duration",
        id="horizon-not-a-duration",
    ),
    pytest.param(
        lambda: check_apart((orders(), Dataset("orders", EVENTS, (Gold.of("g", EVENTS),)))),
        "dataset orders: declared twice",
        id="dataset-twice",
    ),
    pytest.param(
        lambda: check_apart((DATASETS[0], Dataset("shop", ORDERS, (gold(),), naming=Naming.SOLE))),
        "dataset shop: table or stream bronze is dataset events's too",
        id="two-sole-datasets",
    ),
]


@pytest.mark.parametrize(("declare", "message"), BAD_DATASETS)
def test_a_bad_dataset_fails_naming_the_dataset_and_what_is_wrong(declare, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        declare()


@pytest.mark.parametrize("mode", list(Mode))
def test_an_available_now_run_waits_for_the_streams_writing_what_a_stream_reads_and_for_no_other(mode):
    environ = {"PIPELINE_MODE": mode.value}
    config = configure(load_config("local", environ=environ), environ)
    names = stream_names(config)
    writers_of = {}
    for each in running(config):
        layered = dataset_streams(each)
        if mode is Mode.FUSED:
            writers_of.update({table: {each.stream("fused")} for table in each.tables})
            continue
        writers_of.update({table: {name} for name, stream in layered.items() for table in stream.sinks})
        bronze, silver, *golds = layered
        assert golds and names.index(bronze) < names.index(silver) < min(names.index(name) for name in golds)

    waits_for = upstream_streams(config, list(names))

    assert set(waits_for) == set(names)
    for name in names:
        stream = declared_stream(config, name)
        assert waits_for[name] == writers_of.get(stream.source, set()), name
    # Bronze and the fused stream read Kafka: no stream holds them back.
    assert {name for name, upstream in waits_for.items() if not upstream} == {
        each.stream("fused" if mode is Mode.FUSED else "bronze") for each in running(config)
    }
    # An egress waits for the stream writing the gold it publishes: in the fused mode, the fused stream.
    for name in configured(config):
        published = target(config, name)
        fused = published.dataset.stream("fused")
        writer = fused if mode is Mode.FUSED else published.dataset.gold_stream(published.gold)
        assert waits_for[name] == {writer}, name
