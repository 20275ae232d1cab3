"""A second dataset beside the first: its own silver and gold streams on real Delta tables, its business
key deduplicated, each of its golds exact across batches, a crash between silver's commits, and a reset.

Its bronze table is written here as bronze writes it (the Kafka record's bytes and coordinates): what is
under test starts at silver. Every expectation is computed in plain Python from the records written,
with none of the pipeline's code.
"""

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE_SCHEMA, Lakehouse, ensure_tables, with_downstream
from {{ cookiecutter.package_name }}.pipeline.egress import configure
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import BETWEEN_SINK_COMMITS, CRASH_POINT_VAR
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now

ORDERS_CONTRACT = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("customer", Kind.STRING),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
    ),
    event_time="ordered_at",
    dimensions=("shop",),
    measures=("total",),
)
BY_SHOP = Gold(
    "by_shop",
    (
        Aggregate(AggregateKind.COUNT),
        Aggregate(AggregateKind.SUM, "total"),
        Aggregate(AggregateKind.MAX, "total"),
        Aggregate(AggregateKind.DISTINCT, "customer"),
    ),
    dimensions=("shop",),
    window="10 minutes",
)
HOURLY = Gold("hourly", (Aggregate(AggregateKind.APPROX_DISTINCT, "customer"),), window="1 hour")
HORIZON = timedelta(days=1)
ORDERS = Dataset("orders", ORDERS_CONTRACT, (BY_SHOP, HOURLY), dedup_key=("order_id",), dedup_horizon="1 day")

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
TOPIC, TOPIC_ID = "orders", "r5Rk1kCkQj6mWcZ1d0v0Aw"


def order(order_id: str, minutes: float, shop: str, customer: str, total: str) -> bytes:
    at = (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
    text = json.dumps({"order_id": order_id, "ordered_at": at, "shop": shop, "customer": customer})
    return (text[:-1] + f', "total": {total}}}').encode()  # a JSON number, written as its decimal text


def bronze_rows(batch: int, values: list[tuple[int, bytes]]) -> list[tuple]:
    """Bronze rows of one ingest: (partition, value) each, offsets counted per partition from ``batch`` * 100."""
    ingested = T0 + timedelta(hours=2, minutes=batch)
    counters: dict[int, int] = defaultdict(lambda: batch * 100)
    rows = []
    for partition, value in values:
        offset = counters[partition]
        counters[partition] += 1
        rows.append((None, value, [], TOPIC, TOPIC_ID, partition, offset, ingested, 0, ingested))
    return rows


# Two ingests. The first holds an application-level retry of o1 (another partition, the same order) and a
# record that is not JSON; the second a retry of o2 a minute later, and an o3 again two days after the
# first o3: outside the horizon, a new order.
FIRST = bronze_rows(
    0,
    [
        (0, order("o1", 1, "north", "ann", "10.00")),
        (1, order("o1", 1, "north", "ann", "10.00")),
        (0, order("o2", 3, "north", "bob", "25.50")),
        (1, order("o3", 4, "south", "ann", "7.25")),
        (0, b"{not json"),
        (1, order("o4", 12, "north", "cid", "99.99")),
    ],
)
SECOND = bronze_rows(
    1,
    [
        (1, order("o2", 4, "north", "bob", "25.50")),
        (0, order("o5", 13, "north", "ann", "1.00")),
        (0, order("o3", 4 + 2 * 24 * 60, "south", "ann", "7.25")),
        (1, order("o6", 65, "south", "dan", "3.10")),
    ],
)


def write_bronze(spark, lakehouse: Lakehouse, rows: list[tuple]) -> None:
    spark.createDataFrame(rows, BRONZE_SCHEMA).write.format("delta").mode("append").save(lakehouse.table(ORDERS.bronze))


def expected(rows: list[tuple]) -> tuple[set, set, dict, dict]:
    """(silver's kept coordinates, quarantine's {coordinates: reason} as a set, by_shop, hourly), from
    the bronze rows alone: JSON read here, the first copy of an order in bronze's order kept."""
    kept: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
    silver, quarantine, orders = set(), set(), []
    for row in sorted(rows, key=lambda r: (r[9], r[3], r[5], r[6])):
        partition, offset = row[5], row[6]
        try:
            body = json.loads(row[1], parse_float=Decimal)
        except ValueError:
            quarantine.add((partition, offset, "not json"))
            continue
        at = datetime.fromisoformat(body["ordered_at"])
        first = next((named for when, named in kept[body["order_id"]] if abs(when - at) <= HORIZON), None)
        if first is not None:
            quarantine.add((partition, offset, f"duplicate of {first}"))
            continue
        kept[body["order_id"]].append((at, f"{TOPIC}/{partition}/{offset}"))
        silver.add((partition, offset))
        orders.append((at, body))
    by_shop: dict = defaultdict(lambda: [0, Decimal(0), None, set()])
    hourly: dict = defaultdict(set)
    for at, body in orders:
        start = at.replace(minute=at.minute - at.minute % 10, second=0)
        row = by_shop[(start, body["shop"])]
        total = Decimal(body["total"])
        row[0], row[1], row[3] = row[0] + 1, row[1] + total, row[3] | {body["customer"]}
        row[2] = total if row[2] is None else max(row[2], total)
        hourly[at.replace(minute=0, second=0)].add(body["customer"])
    by_shop_rows = {key: (count, total, top, len(customers)) for key, (count, total, top, customers) in by_shop.items()}
    return silver, quarantine, by_shop_rows, {start: len(customers) for start, customers in hourly.items()}


def found(spark, lakehouse: Lakehouse) -> tuple[set, set, dict, dict]:
    def read(table):
        return spark.read.format("delta").load(lakehouse.table(table)).collect()

    silver = {(row.partition, row.offset) for row in read(ORDERS.silver)}
    quarantine = {
        (row.partition, row.offset, "not json" if "not valid JSON" in row.reason else row.reason)
        for row in read(ORDERS.quarantine)
    }
    by_shop = {
        (row.window_start.astimezone(UTC), row.shop): (
            row.event_count,
            row.total_sum,
            row.total_max,
            row.customer_distinct,
        )
        for row in read(ORDERS.gold_table(BY_SHOP))
    }
    hourly = {row.window_start.astimezone(UTC): row.customer_approx_distinct for row in read(ORDERS.gold_table(HOURLY))}
    return silver, quarantine, by_shop, hourly


def orders_environ(lakehouse_root: str) -> dict[str, str]:
    # Silver and gold never reach Kafka: the broker named here is never asked.
    return {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "KAFKA_TOPICS": TOPIC, "LAKEHOUSE_ROOT": lakehouse_root}


@pytest.fixture
def orders_config(tmp_path):
    environ = orders_environ(str(tmp_path / "lake"))
    return configure(load_config("local", environ=environ), environ)


# Silver's stream of ORDERS in a process of its own, which a crash point may kill.
SILVER_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
from test_dataset_streams import ORDERS
from {{ cookiecutter.package_name }}.cli.connect import spark_session
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.egress import configure
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now
config = configure(load_config("local"))
run_available_now(spark_session(config, "orders-silver"), config, ("orders_silver",), ORDERS)
"""


@pytest.mark.slow
def test_a_second_datasets_silver_and_golds_are_exact_through_batches_a_crash_and_a_reset(spark, orders_config):
    config, lakehouse = orders_config, Lakehouse(orders_config.lakehouse_root)
    downstream = ORDERS.streams[1:]  # silver, then one stream per gold
    assert downstream == ("orders_silver", "orders_gold_by_shop", "orders_gold_hourly")
    ensure_tables(spark, lakehouse, ORDERS)
    assert ORDERS.values_table(BY_SHOP, BY_SHOP.aggregates[3]) in ORDERS.tables

    write_bronze(spark, lakehouse, FIRST)
    run_available_now(spark, config, downstream, ORDERS)
    assert found(spark, lakehouse) == expected(FIRST)

    # Silver's second batch dies between its two commits: silver holds the batch's kept orders, quarantine
    # not yet its duplicates. The replay meets a silver that holds the very records it judges: none of
    # them may count as a copy of itself, and each duplicate still names the order kept before it.
    write_bronze(spark, lakehouse, SECOND)
    crash = f"orders_silver:{BETWEEN_SINK_COMMITS}:1"
    killed = subprocess.run(
        [sys.executable, "-c", SILVER_ALONE, str(Path(__file__).parent)],
        env={**os.environ, **orders_environ(config.lakehouse_root), CRASH_POINT_VAR: crash},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert f"crash point {crash}: killing the driver" in killed.stderr
    run_available_now(spark, config, downstream, ORDERS)
    both = expected(FIRST + SECOND)
    assert found(spark, lakehouse) == both
    silver, quarantine, by_shop, hourly = both
    # What the batches hold, so that the expectation itself cannot be empty or trivial.
    assert len(silver) == 7 and {reason for *_, reason in quarantine} == {
        "not json",
        f"duplicate of {TOPIC}/0/0",
        f"duplicate of {TOPIC}/0/1",
    }
    assert by_shop[(T0, "north")] == (2, Decimal("35.50"), Decimal("25.50"), 2)
    assert hourly == {T0: 3, T0 + timedelta(hours=1): 1, T0 + timedelta(days=2): 1}

    # A reset of silver rebuilds silver, quarantine and both golds (and the table of distinct values)
    # from bronze: the same rows as the streams wrote.
    rebuilt = reset(spark, lakehouse, with_downstream("orders_silver", ORDERS), config.gold_window, ORDERS)
    assert [each.stream for each in rebuilt] == list(downstream)
    assert found(spark, lakehouse) == both
    # The rebuilt golds go on from there: one more order added once to each.
    third = bronze_rows(2, [(0, order("o7", 5, "north", "eve", "4.00"))])
    write_bronze(spark, lakehouse, third)
    run_available_now(spark, config, downstream, ORDERS)
    assert found(spark, lakehouse) == expected(FIRST + SECOND + third)
