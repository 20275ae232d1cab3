"""The orders dataset: the shop's orders, an example of a second dataset beside the events.

Its topics are named in ``[dataset_orders]`` of each environment's config (conf/<env>.toml). Each
record's value is Avro in the Confluent wire format: a record {"order_id", "ordered_at" (a timestamp),
"shop", "customer", "total" (a decimal of two places)}, read with the writer schema its id names in the
schema registry (``[schema_registry]``), resolved into this contract (``pipeline/formats/avro.py``). A
producer that retries sends an order again as a new Kafka record: silver keeps the first record of
each ``order_id`` within a day of event time and quarantines the others as
``duplicate of <topic>/<partition>/<offset>``.

Its expectations, one of each action (``pipeline/expectations.py``): an order whose total is not
positive goes to quarantine as ``expectation total_positive not met``; an order over 90,000 stays in
silver and is counted (``large_total``); an order time more than a day after Kafka took the record (a
producer's clock set ahead) stops the stream before its batch is committed (``ordered_at_not_ahead``).
A batch of 1,000 orders or more of which over a quarter would go to quarantine, for any reason, is
not committed either: a producer gone wrong.

Gold ``by_shop`` counts the orders of each shop per 10 minutes, with their total, the largest order,
and the customers who ordered, exactly and as a HyperLogLog estimate; gold ``hourly`` counts all
orders per hour, with the smallest order and the estimated customers. Tables ``bronze_orders``,
``silver_orders``, ``quarantine_orders``, ``gold_orders_by_shop`` (and
``gold_orders_by_shop_customer_distinct_values`` behind its exact count), ``gold_orders_hourly``;
streams ``orders_bronze``, ``orders_silver``, ``orders_gold_by_shop``, ``orders_gold_hourly``.
"""

from ..contract import Contract, Field, Kind
from ..dataset import Aggregate, AggregateKind, Dataset, Gold
from ..expectations import Action, QuarantineLimit, in_range, not_after
from ..formats import Format

ORDERS = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("customer", Kind.STRING),
        # Exact: a value that would need rounding is quarantined, never altered.
        Field("total", Kind.DECIMAL, precision=12, scale=2),
    ),
    event_time="ordered_at",
    dimensions=("shop",),
    measures=("total",),
)

DATASET = Dataset(
    name="orders",
    contract=ORDERS,
    format=Format.AVRO,
    golds=(
        Gold(
            "by_shop",
            (
                Aggregate(AggregateKind.COUNT),
                Aggregate(AggregateKind.SUM, "total"),
                Aggregate(AggregateKind.MAX, "total"),
                Aggregate(AggregateKind.DISTINCT, "customer"),
                Aggregate(AggregateKind.APPROX_DISTINCT, "customer"),
            ),
            dimensions=("shop",),
            window="10 minutes",
        ),
        Gold(
            "hourly",
            (
                Aggregate(AggregateKind.COUNT),
                Aggregate(AggregateKind.MIN, "total"),
                Aggregate(AggregateKind.APPROX_DISTINCT, "customer"),
            ),
            window="1 hour",
        ),
    ),
    dedup_key=("order_id",),
    dedup_horizon="1 day",
    expectations=(
        in_range("total_positive", "total", minimum="0.01"),
        in_range("large_total", "total", maximum=90000, action=Action.WARN),
        not_after("ordered_at_not_ahead", "ordered_at", "1 day", Action.FAIL),
    ),
    quarantine_limit=QuarantineLimit(share=0.25),
)
