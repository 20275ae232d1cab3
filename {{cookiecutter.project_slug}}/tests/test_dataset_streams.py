"""A second dataset beside the first: its own topic, its own bronze, silver and gold streams on real Delta
tables, its business key deduplicated, each of its golds exact across batches, a crash between silver's
commits, a reset, and its fused stream through a crash after silver's commit and back.

Every expectation is computed in plain Python from Kafka's committed records, read by a plain consumer,
with none of the pipeline's code.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Producer
from conftest import committed_records, fresh_topic
from delta.tables import DeltaTable
from pyspark.sql import functions as F
from test_checkpoints import foreign_lease

from {{ cookiecutter.package_name }}.pipeline.audit.cut import Bound
from {{ cookiecutter.package_name }}.pipeline.audit.findings import Finding
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.config import Mode
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.delta.tables import Lakehouse, with_downstream
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery import lease
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import (
    BETWEEN_SINK_COMMITS,
    CRASH_POINT_VAR,
    FUSED_POINTS,
)
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now, switch_mode

PURCHASES_CONTRACT = Contract(
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
# Named apart from any dataset a bake ships.
PURCHASES = Dataset("purchases", PURCHASES_CONTRACT, (BY_SHOP, HOURLY), dedup_key=("order_id",), dedup_horizon="1 day")

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
AFTER_SILVER_COMMIT = FUSED_POINTS[1]


def order(order_id: str, minutes: float, shop: str, customer: str, total: str) -> bytes:
    at = (T0 + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
    text = json.dumps({"order_id": order_id, "ordered_at": at, "shop": shop, "customer": customer})
    return (text[:-1] + f', "total": {total}}}').encode()  # a JSON number, written as its decimal text


# Two batches, each (partition, value). The first holds an application-level retry of o1 (another
# partition, the same order) and a record that is not JSON; the second a retry of o2 a minute later, and
# an o3 again two days after the first o3: outside the horizon, a new order.
FIRST = [
    (0, order("o1", 1, "north", "ann", "10.00")),
    (1, order("o1", 1, "north", "ann", "10.00")),
    (0, order("o2", 3, "north", "bob", "25.50")),
    (1, order("o3", 4, "south", "ann", "7.25")),
    (0, b"{not json"),
    (1, order("o4", 12, "north", "cid", "99.99")),
]
SECOND = [
    (1, order("o2", 4, "north", "bob", "25.50")),
    (0, order("o5", 13, "north", "ann", "1.00")),
    (0, order("o3", 4 + 2 * 24 * 60, "south", "ann", "7.25")),
    (1, order("o6", 65, "south", "dan", "3.10")),
]
THIRD = [(0, order("o7", 5, "north", "eve", "4.00"))]
# For the fused stream: o8 twice in one batch on two partitions, a retry of o5 (kept in a batch before, by
# the layered silver), a record that is not JSON, and a new order in another hour.
FOURTH = [
    (0, order("o8", 20, "north", "fay", "5.00")),
    (1, order("o8", 20, "north", "fay", "5.00")),
    (1, order("o5", 13, "north", "ann", "1.00")),
    (0, b"{oops"),
    (1, order("o9", 70, "south", "gus", "8.00")),
]


def produce(config, topic: str, values: list[tuple[int, bytes]]) -> None:
    producer = Producer(client_config(config, **{"enable.idempotence": True}))
    for partition, value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0


class Ledger:
    """Kafka's committed records of the topic, read by a plain consumer (``committed_records``), each marked
    with the bronze batch that took it: the records new since the last look."""

    def __init__(self, config, topic: str):
        self.config, self.topic = config, topic
        self.batches: dict[tuple[int, int], tuple[int, bytes]] = {}  # (partition, offset): (batch, value)

    def look(self) -> None:
        batch = max((taken for taken, _ in self.batches.values()), default=-1) + 1
        for (_, partition, offset), value in committed_records(self.config, [self.topic]).items():
            self.batches.setdefault((partition, offset), (batch, value))

    def expected(self) -> tuple[set, set, dict, dict]:
        """(silver's kept coordinates, quarantine's (partition, offset, reason), by_shop, hourly): JSON read
        here, the first copy of an order kept in the order bronze took them (batch, partition, offset)."""
        kept: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
        silver, quarantine, orders = set(), set(), []
        for (partition, offset), (_, value) in sorted(self.batches.items(), key=lambda item: (item[1][0], item[0])):
            try:
                body = json.loads(value, parse_float=Decimal)
            except ValueError:
                quarantine.add((partition, offset, "not json"))
                continue
            at = datetime.fromisoformat(body["ordered_at"])
            first = next((named for when, named in kept[body["order_id"]] if abs(when - at) <= HORIZON), None)
            if first is not None:
                quarantine.add((partition, offset, f"duplicate of {first}"))
                continue
            kept[body["order_id"]].append((at, f"{self.topic}/{partition}/{offset}"))
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
        by_shop_rows = {key: (count, total, top, len(names)) for key, (count, total, top, names) in by_shop.items()}
        return silver, quarantine, by_shop_rows, {start: len(names) for start, names in hourly.items()}


def found(spark, lakehouse: Lakehouse) -> tuple[set, set, dict, dict]:
    def read(table):
        return spark.read.format("delta").load(lakehouse.table(table)).collect()

    silver = {(row.partition, row.offset) for row in read(PURCHASES.silver)}
    quarantine = {
        (row.partition, row.offset, "not json" if "not valid JSON" in row.reason else row.reason)
        for row in read(PURCHASES.quarantine)
    }
    by_shop = {
        (row.window_start.astimezone(UTC), row.shop): (
            row.event_count,
            row.total_sum,
            row.total_max,
            row.customer_distinct,
        )
        for row in read(PURCHASES.gold_table(BY_SHOP))
    }
    hourly = {
        row.window_start.astimezone(UTC): row.customer_approx_distinct for row in read(PURCHASES.gold_table(HOURLY))
    }
    return silver, quarantine, by_shop, hourly


@pytest.fixture
def orders_topic(kafka_bootstrap) -> str:
    return fresh_topic(kafka_bootstrap, "orders")


@pytest.fixture
def orders_config(config, orders_topic, monkeypatch):
    """The test's config (its broker, its events topic, its lakehouse) with ``[dataset_purchases]`` reading
    the orders topic; the packaged config's own second datasets left out."""
    monkeypatch.setenv("PIPELINE_DATASETS", PURCHASES.name)
    return config.model_copy(update={"dataset_sections": {"dataset_purchases": {"topics": [orders_topic]}}})


# One stream of PURCHASES in a process of its own, which a crash point may kill.
STREAM_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
from test_dataset_streams import PURCHASES
from {{ cookiecutter.package_name }}.cli.connect import spark_session
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.egress import configure
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now
config = configure(load_config("local"))
config = config.model_copy(update={"dataset_sections": {"dataset_purchases": {"topics": [sys.argv[3]]}}})
run_available_now(spark_session(config, "orders-" + sys.argv[2]), config, (sys.argv[2],), PURCHASES)
"""


def run_killed(config, stream: str, crash: str) -> None:
    """Run ``stream`` of PURCHASES in a process of its own, killed at the crash point ``crash``; its topics as
    ``config`` has them."""
    [topic] = config.dataset_sections["dataset_purchases"]["topics"]
    environ = {"KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers, "LAKEHOUSE_ROOT": config.lakehouse_root}
    killed = subprocess.run(
        [sys.executable, "-c", STREAM_ALONE, str(Path(__file__).parent), stream, topic],
        env={**os.environ, **environ, CRASH_POINT_VAR: crash},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert f"crash point {crash}: killing the driver" in killed.stderr


@pytest.mark.slow
# Two processes of its own, seven runs of the streams, two switches and six audits: more than the suite's
# 900 s a test on a busy 2-core machine.
@pytest.mark.timeout(1800)
def test_a_second_datasets_streams_are_exact_through_crashes_a_reset_and_both_modes(spark, orders_config, orders_topic):
    config, lakehouse = orders_config, Lakehouse(orders_config.lakehouse_root)
    assert PURCHASES.streams == (
        "purchases_bronze",
        "purchases_silver",
        "purchases_gold_by_shop",
        "purchases_gold_hourly",
    )
    assert PURCHASES.values_table(BY_SHOP, BY_SHOP.aggregates[3]) in PURCHASES.tables
    ledger = Ledger(config, orders_topic)

    produce(config, orders_topic, FIRST)
    ledger.look()
    with streams_seen_together(spark) as seen:
        run_available_now(spark, config, PURCHASES.streams, PURCHASES)
    assert found(spark, lakehouse) == ledger.expected()
    # Each stream started once the one writing what it reads had ended; the two golds, which read the same
    # silver and write tables of their own, ran side by side.
    bronze_stream, silver_stream, *golds = PURCHASES.streams
    assert frozenset(golds) in seen, seen
    assert all(len(together) == 1 for together in seen if bronze_stream in together or silver_stream in together), seen
    # Its bronze holds its topic's records, and the first dataset's tables were never made.
    bronze = spark.read.format("delta").load(lakehouse.table(PURCHASES.bronze))
    assert {row.topic for row in bronze.select("topic").distinct().collect()} == {orders_topic}
    assert not (Path(config.lakehouse_root) / "tables" / "bronze_events").exists()

    # Silver's second batch dies between its two commits: silver holds the batch's kept orders, quarantine
    # not yet its duplicates. The replay meets a silver that holds the very records it judges: none of
    # them may count as a copy of itself, and each duplicate still names the order kept before it.
    produce(config, orders_topic, SECOND)
    ledger.look()
    run_available_now(spark, config, ("purchases_bronze",), PURCHASES)
    run_killed(config, "purchases_silver", f"purchases_silver:{BETWEEN_SINK_COMMITS}:1")
    run_available_now(spark, config, PURCHASES.streams, PURCHASES)
    both = ledger.expected()
    assert found(spark, lakehouse) == both
    silver, quarantine, by_shop, hourly = both
    # What the batches hold, so that the expectation itself cannot be empty or trivial.
    assert len(silver) == 7 and {reason for *_, reason in quarantine} == {
        "not json",
        f"duplicate of {orders_topic}/0/0",
        f"duplicate of {orders_topic}/0/1",
    }
    assert by_shop[(T0, "north")] == (2, Decimal("35.50"), Decimal("25.50"), 2)
    assert hourly == {T0: 3, T0 + timedelta(hours=1): 1, T0 + timedelta(days=2): 1}
    # The audit agrees, whole and over the last batch alone, whose retry of o2 names a record outside it.
    assert audit_errors(spark, config) == {}
    assert audit_errors(spark, config, Bound(last_batches=1)) == {}

    # A reset of silver rebuilds silver, quarantine and both golds (and the table of distinct values)
    # from bronze: the same rows as the streams wrote.
    rebuilt = reset(spark, lakehouse, with_downstream("purchases_silver", PURCHASES), config.gold_window, PURCHASES)
    assert [each.stream for each in rebuilt] == list(PURCHASES.streams[1:])
    assert found(spark, lakehouse) == both

    # Handed over to its fused stream, which dies after silver's commit of its first batch (bronze's,
    # quarantine's and the golds' commits made or not, beside it). The replay keeps the same records:
    # one o8 of the two, and the retry of o5 a duplicate of the o5 the layered silver kept.
    assert "silver holds bronze" in switch_mode(spark, config, Mode.FUSED, PURCHASES)
    produce(config, orders_topic, FOURTH)
    ledger.look()
    run_killed(config, "purchases_fused", f"purchases_fused:{AFTER_SILVER_COMMIT}:0")
    run_available_now(spark, config, ("purchases_fused",), PURCHASES)
    fused = ledger.expected()
    assert found(spark, lakehouse) == fused
    assert len(fused[0]) == 9 and f"duplicate of {orders_topic}/0/3" in {reason for *_, reason in fused[1]}
    assert audit_errors(spark, config) == {}
    assert audit_errors(spark, config, Bound(last_batches=1)) == {}

    # And back: the layered streams start where the fused one stopped, and go on from there with one more
    # order, read from Kafka, added once to each gold.
    assert "purchases_silver starts at bronze version" in switch_mode(spark, config, Mode.LAYERED, PURCHASES)
    produce(config, orders_topic, THIRD)
    ledger.look()
    # The hourly gold's stream runs elsewhere (its lease held by a live process on another host): its start is
    # refused, and that refusal is what the run raises once the by-shop gold beside it has taken the order.
    hourly_stream = PURCHASES.gold_stream(HOURLY)
    taken = [int(name.name) for name in Path(lease.lease_directory(lakehouse, hourly_stream)).glob("[0-9]*")]
    held = Path(lease.lease_path(lakehouse, hourly_stream, max(taken, default=0) + 1))
    foreign_lease(held, int(time.time() * 1000), ttl_s=600)
    with pytest.raises(lease.LeaseHeld, match=f"(?s){hourly_stream}.*held by pid 4242 on host another-host"):
        run_available_now(spark, config, PURCHASES.streams, PURCHASES)
    *layered, hourly = ledger.expected()
    assert list(found(spark, lakehouse)) == [*layered, fused[3]]
    held.unlink()  # its holder released it
    run_available_now(spark, config, PURCHASES.streams, PURCHASES)
    assert found(spark, lakehouse) == (*layered, hourly)
    assert audit_errors(spark, config) == {}

    # Then the audit catches what a defect could leave: a value the distinct count never counted, and a
    # sketch's estimate further off than its error allows.
    values = lakehouse.table(PURCHASES.values_table(BY_SHOP, BY_SHOP.aggregates[3]))
    stray = spark.read.format("delta").load(values).limit(1).withColumn("value", F.lit("zed"))
    stray.write.format("delta").mode("append").save(values)
    DeltaTable.forPath(spark, lakehouse.table(PURCHASES.gold_table(HOURLY))).update(
        F.col("window_start") == F.lit(T0), {"customer_approx_distinct": F.lit(9)}
    )
    assert audit_errors(spark, config) == {
        Finding.GOLD_DISTINCT_VALUES_NOT_MATCHING_SILVER: 1,
        Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER: 1,
    }


@contextmanager
def streams_seen_together(spark, every_s: float = 0.05) -> Iterator[set[frozenset[str]]]:
    """The sets of streams seen active at once in ``spark`` while the block runs, looked at every ``every_s``."""
    seen: set[frozenset[str]] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(every_s):
            active = frozenset(query.name for query in spark.streams.active)
            if active:
                seen.add(active)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def audit_errors(spark, config, bound: Bound | None = None) -> dict[str, int]:
    report = run_audit(spark, config, PURCHASES, bound)
    return {name: count for name, count in report.errors.items() if count}
