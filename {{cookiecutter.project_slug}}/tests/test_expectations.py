"""Data-quality expectations: declared with a dataset, checked by Spark before a stream reads a record,
and applied by silver on real Kafka and Delta: a quarantining one names the record's reason, a warning one
counts, a failing one (or a batch over the dataset's quarantine limit) commits nothing of its batch until
the expectation or the limit is changed, then the batch lands once. What silver and quarantine should
hold is computed here from the records as they were produced."""

import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from confluent_kafka import Producer
from conftest import fresh_topic
from prometheus_client import REGISTRY
from pyspark.sql.types import StringType, StructField, StructType
from test_checkpoints import foreign_lease

from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, Mode
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE_SCHEMA, Lakehouse, silver_schema, with_downstream
from {{ cookiecutter.package_name }}.pipeline.expectations import (
    Action,
    Expectation,
    ExpectationFailed,
    QuarantineLimit,
    check_expectations,
    condition,
    in_range,
    matches,
    not_after,
    not_null,
    one_of,
)
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.quarantine_replay import replay
from {{ cookiecutter.package_name }}.pipeline.quarantine_replay import stream_name as replay_stream
from {{ cookiecutter.package_name }}.pipeline.recovery import lease
from {{ cookiecutter.package_name }}.pipeline.recovery.checkpoints import CheckpointError
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import CRASH_POINT_VAR
from {{ cookiecutter.package_name }}.pipeline.silver import parse_records
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now, switch_command, switch_mode

CONTRACT = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
        Field("coupon", Kind.STRING, required=False),
    ),
    event_time="ordered_at",
    dimensions=("shop",),
    measures=("total",),
)
BY_SHOP = Gold("by_shop", (Aggregate(AggregateKind.COUNT), Aggregate(AggregateKind.SUM, "total")), ("shop",))
KAFKA_TIME = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)
INGESTED = datetime(2024, 5, 1, 9, 5, tzinfo=UTC)
# One of each kind, in the order they are judged; two quarantining ones a record can both fail.
RULES = (
    in_range("total_not_negative", "total", minimum=0),
    matches("order_id_shape", "order_id", r"^o[0-9]+$"),
    one_of("known_shop", "shop", ("north", "south"), Action.WARN),
    not_after("not_ahead_of_kafka", "ordered_at", "1 day"),
    not_null("coupon_given", "coupon", Action.WARN),
    condition("big_orders_need_a_coupon", "total < 1000 OR coupon IS NOT NULL", Action.FAIL),
)


def checked(*expectations: Expectation, limit: QuarantineLimit | None = None) -> Dataset:
    # Named apart from any dataset a bake ships.
    return Dataset("checked_orders", CONTRACT, (BY_SHOP,), expectations=expectations, quarantine_limit=limit)


def order(order_id: str, shop: str, total: str, minutes: float = 1, coupon: str | None = None) -> bytes:
    at = (KAFKA_TIME + timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")
    body = {"order_id": order_id, "ordered_at": at, "shop": shop, **({"coupon": coupon} if coupon else {})}
    return (json.dumps(body)[:-1] + f', "total": {total}}}').encode()  # the total as a JSON number


# --- declared ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("declare", "named"),
    [
        (lambda: Expectation("Bad-Name", "true"), "a name is a lower-case letter"),
        (lambda: Expectation("x", "true", "quarantine"), "action must be an Action"),
        (lambda: condition("late", "ordered_at > current_timestamp()"), "current_timestamp() answers differently"),
        (lambda: condition("drawn", "RAND() < 0.5"), "RAND() answers differently"),
        (
            lambda: condition("read_late", "ingest_time < kafka_timestamp"),
            "ingest_time is when a batch read the record",
        ),
        (lambda: in_range("open", "total"), "needs a minimum, a maximum or both"),
        (lambda: in_range("upside_down", "total", minimum=5, maximum=1), "minimum 5 is above maximum 1"),
        (lambda: one_of("mixed", "shop", ("north", 1)), "must all be strings, all numbers or all booleans"),
        (lambda: not_after("soon", "ordered_at", "a while"), "soon: ahead"),
        (lambda: checked(not_null("x", "missing")), "checked_orders: expectation x: missing is not a field"),
        (lambda: checked(matches("x", "total", "^1")), "total is DECIMAL, and this expectation needs STRING"),
        (lambda: checked(in_range("x", "shop", minimum=1)), "shop is STRING, and this expectation needs"),
        (lambda: checked(one_of("x", "total", ("a",))), "total is DECIMAL, and this expectation needs STRING"),
        (lambda: checked(not_after("x", "shop", "1 day")), "shop is STRING, and this expectation needs TIMESTAMP"),
        (lambda: checked(not_null("x", "coupon"), not_null("x", "shop")), "expectation x is declared twice"),
    ],
)
def test_a_bad_expectation_is_refused_where_it_is_declared_naming_it(declare, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace(")", r"\)")):
        declare()


def test_a_quarantine_limit_fails_only_a_batch_big_enough_and_over_its_share():
    limit = QuarantineLimit(share=0.05, min_records=100)
    limit.check("orders_silver", 1, records=99, quarantined=99, reasons={})  # too few to judge
    limit.check("orders_silver", 2, records=1000, quarantined=50, reasons={})  # at the limit
    with pytest.raises(ExpectationFailed, match=r"batch 3: 51 of 1000 records would go to quarantine \(5\.1%\)"):
        limit.check("orders_silver", 3, records=1000, quarantined=51, reasons={"value is not valid JSON": 51})
    for share, min_records in ((1, 10), (-0.1, 10), (True, 10), (0.1, 0)):
        with pytest.raises(ValueError, match="quarantine limit"):
            QuarantineLimit(share, min_records)
    with pytest.raises(ValueError, match="quarantine_limit must be a QuarantineLimit"):
        Dataset("checked_orders", CONTRACT, (BY_SHOP,), quarantine_limit=0.05)


def test_a_function_named_inside_a_string_or_a_quoted_name_calls_nothing():
    assert condition("text", "coupon <> 'now()' AND `rand(` IS NULL OR shop = \"uuid()\"").sql


# --- checked by Spark at a stream's start -------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "found"),
    [
        ("total >", "Spark cannot run"),
        ("unknown_column > 1", "Spark cannot run"),
        ("no_such_function(total)", "Spark cannot run"),
        ("total + 1", "is decimal(13,2), not a boolean"),
    ],
)
def test_spark_refuses_at_the_start_an_expectation_it_cannot_run_naming_it(spark, sql, found):
    with pytest.raises(ConfigError, match=rf"^dataset checked_orders: expectation rule_x: .*{re.escape(found)}"):
        check_expectations(spark, "checked_orders", (condition("rule_x", sql),), silver_schema(CONTRACT))


def test_a_pattern_java_cannot_compile_is_refused_at_the_start(spark):
    with pytest.raises(ConfigError, match=r"expectation shape: Spark cannot run"):
        check_expectations(spark, "checked_orders", (matches("shape", "order_id", "o[0-9"),), silver_schema(CONTRACT))


def test_expectations_over_silvers_columns_pass_the_start(spark):
    check_expectations(spark, "checked_orders", RULES, silver_schema(CONTRACT))


# --- applied ------------------------------------------------------------------------------------


def test_the_first_quarantining_expectation_a_record_fails_names_its_reason(spark):
    dataset = checked(*RULES)
    values = [
        order("o1", "north", "10.00"),  # meets all
        order("o2", "east", "5.00"),  # an unknown shop: a warning, kept
        order("o3", "north", "-1.00"),  # negative
        order("x4", "north", "-2.00"),  # negative and of the wrong shape: the first declared names it
        order("o5", "north", "3.00", minutes=2 * 24 * 60),  # two days ahead of its Kafka timestamp
        order("o6", "north", "5000.00"),  # fails a FAIL expectation: judged by the batch, not here
        b"{not json",  # the contract's own reason comes first
    ]
    rows = [(None, value, [], "t", "id", 0, offset, KAFKA_TIME, 0, INGESTED) for offset, value in enumerate(values)]
    parsed = parse_records(spark.createDataFrame(rows, BRONZE_SCHEMA), dataset)

    reasons = parsed.select("offset", "reason").orderBy("offset")
    expected = spark.createDataFrame(
        [
            (0, None),
            (1, None),
            (2, "expectation total_not_negative not met"),
            (3, "expectation total_not_negative not met"),
            (4, "expectation not_ahead_of_kafka not met"),
            (5, None),
            (6, "value is not valid JSON"),
        ],
        StructType(
            [StructField("offset", BRONZE_SCHEMA["offset"].dataType, False), StructField("reason", StringType())]
        ),
    )
    assert_df_equality(reasons, expected, ignore_nullable=True)


# --- on real Kafka and Delta --------------------------------------------------------------------


@pytest.fixture
def orders_topic(kafka_bootstrap) -> str:
    return fresh_topic(kafka_bootstrap, "checked-orders")


@pytest.fixture
def checked_config(config, orders_topic, monkeypatch):
    """The test's config with dataset checked_orders reading ``orders_topic``, the one dataset the project runs."""
    monkeypatch.setenv("PIPELINE_DATASETS", "checked_orders")
    return config.model_copy(update={"dataset_sections": {"dataset_checked_orders": {"topics": [orders_topic]}}})


def failures_counted(stream: str, name: str) -> float:
    return (
        REGISTRY.get_sample_value("lakehouse_expectation_failures_total", {"stream": stream, "expectation": name}) or 0
    )


@pytest.mark.slow
def test_a_failing_expectation_commits_nothing_until_it_is_changed_then_the_batch_lands_once(
    spark, checked_config, orders_topic
):
    config = checked_config
    lakehouse = Lakehouse(config.lakehouse_root)
    values = {
        (0, 0): order("o1", "north", "10.00"),
        (1, 0): order("o2", "east", "5.00", coupon="C"),  # unknown shop: warned, kept
        (0, 1): order("o3", "south", "-1.00"),  # quarantined
        (1, 1): order("o4", "north", "5000.00"),  # no coupon: fails the batch
        (0, 2): order("o5", "south", "2500.00"),  # fails it too
    }
    producer = Producer(client_config(config, **{"enable.idempotence": True}))
    for (partition, _), value in sorted(values.items(), key=lambda item: item[0][::-1]):
        producer.produce(orders_topic, value, partition=partition)
    assert producer.flush(30) == 0
    strict = checked(*RULES)
    silver_stream = strict.stream("silver")
    warned_before = failures_counted(silver_stream, "known_shop")

    run_available_now(spark, config, (strict.stream("bronze"),), strict)
    with pytest.raises(
        Exception, match=r"expectation big_orders_need_a_coupon \(fail\) is not met by 2 record\(s\)"
    ) as failed:
        run_available_now(spark, config, (silver_stream,), strict)
    message = str(failed.value)
    assert f"the first {orders_topic}/0/2" in message and "change the expectation" in message
    assert ExpectationFailed.__name__ in message
    # Nothing of the batch was committed: silver and quarantine hold no row.
    for table in (strict.silver, strict.quarantine):
        assert spark.read.format("delta").load(lakehouse.table(table)).count() == 0
    # Its warning was counted before the batch failed.
    assert failures_counted(silver_stream, "known_shop") == warned_before + 1

    # The expectation changed to quarantine what it fails: three of the five records would go to quarantine,
    # over a limit of half a batch of three or more. Nothing is committed again.
    relaxed_rules = [*RULES[:-1], condition("big_orders_need_a_coupon", RULES[-1].sql, Action.QUARANTINE)]
    limited = checked(*relaxed_rules, limit=QuarantineLimit(share=0.5, min_records=3))
    with pytest.raises(Exception, match=r"3 of 5 records would go to quarantine \(60\.0%\), over the dataset's"):
        run_available_now(spark, config, (silver_stream,), limited)
    for table in (strict.silver, strict.quarantine):
        assert spark.read.format("delta").load(lakehouse.table(table)).count() == 0

    # The limit raised: the batch read again lands once.
    relaxed = checked(*relaxed_rules, limit=QuarantineLimit(share=0.75, min_records=3))
    run_available_now(spark, config, relaxed.streams, relaxed)
    expected = (
        [(0, 0), (1, 0)],
        [
            (0, 1, "expectation total_not_negative not met"),
            (0, 2, "expectation big_orders_need_a_coupon not met"),
            (1, 1, "expectation big_orders_need_a_coupon not met"),
        ],
        [("east", 1, Decimal("5.00")), ("north", 1, Decimal("10.00"))],
    )
    assert landed(spark, lakehouse, relaxed) == expected

    # A reset judges all of bronze again: with the failing expectation back it refuses, and once relaxed
    # again (the way out) it rebuilds the same rows, which the streams then go on from.
    rebuilt = with_downstream(silver_stream, strict)
    refused = rf"rebuild of {strict.silver} from {strict.bronze}: expectation big_orders_need_a_coupon \(fail\)"
    with pytest.raises(ExpectationFailed, match=refused):
        reset(spark, lakehouse, rebuilt, config.gold_window, strict, config)
    reset(spark, lakehouse, rebuilt, config.gold_window, relaxed, config)
    run_available_now(spark, config, relaxed.streams, relaxed)
    assert landed(spark, lakehouse, relaxed) == expected


def landed(spark, lakehouse: Lakehouse, dataset: Dataset) -> tuple[list, list, list]:
    """(silver's coordinates, quarantine's coordinates and reasons, gold's shops, counts and totals), sorted."""

    def read(table: str) -> list:
        return spark.read.format("delta").load(lakehouse.table(table)).collect()

    return (
        sorted((row.partition, row.offset) for row in read(dataset.silver)),
        sorted((row.partition, row.offset, row.reason) for row in read(dataset.quarantine)),
        sorted((row.shop, row.event_count, row.total_sum) for row in read(dataset.gold_table(BY_SHOP))),
    )


# --- replayed from quarantine -------------------------------------------------------------------

# The rules of a replay's test: two that quarantine (a record failing both is named by the first), one that warns.
STRICT = (
    in_range("total_not_negative", "total", minimum=0),
    matches("order_id_shape", "order_id", r"^o[0-9]+$"),
    one_of("known_shop", "shop", ("north", "south"), Action.WARN),
)
# The first relaxed: a total down to -5 passes now.
RELAXED = (in_range("total_not_negative", "total", minimum=-5), *STRICT[1:])
REPLAY_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
from test_expectations import RELAXED, checked
from {{ cookiecutter.package_name }}.cli.connect import spark_session
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.quarantine_replay import replay
config = load_config("local")
print(replay(spark_session(config, "replay"), config, checked(*RELAXED)))
"""


def replay_alone(config, crash: str, log: Path) -> int:
    """A quarantine replay of ``checked(*RELAXED)`` in a process of its own killed at ``crash``: its exit code."""
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        CRASH_POINT_VAR: crash,
    }
    with log.open("w") as out:
        return subprocess.run(
            [sys.executable, "-c", REPLAY_ALONE, str(Path(__file__).parent)],
            env={**os.environ, **environ},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
        ).returncode


@pytest.mark.slow
@pytest.mark.storage
def test_a_quarantine_replay_after_a_rule_is_relaxed_moves_exactly_what_passes_once_under_kills(
    spark, checked_config, orders_topic, tmp_path
):
    config = checked_config
    lakehouse = Lakehouse(config.lakehouse_root)
    values = [
        order("o1", "north", "10.00"),
        order("o2", "south", "-1.00"),  # negative: passes once relaxed
        order("o3", "east", "-4.00"),  # negative and an unknown shop: passes once relaxed, warned
        order("o4", "north", "-9.00"),  # too negative even then: stays
        order("x5", "south", "-2.00"),  # negative and of the wrong shape: stays, now for its shape
        b"{not json",  # the contract's own reason: stays
        order("o7", "south", "2.50"),
    ]
    producer = Producer(client_config(config, **{"enable.idempotence": True}))
    for value in values:
        producer.produce(orders_topic, value, partition=0)
    assert producer.flush(30) == 0
    strict, relaxed = checked(*STRICT), checked(*RELAXED)
    run_available_now(spark, config, strict.streams, strict)
    negative = "expectation total_not_negative not met"
    assert landed(spark, lakehouse, strict) == (
        [(0, 0), (0, 6)],
        [(0, 1, negative), (0, 2, negative), (0, 3, negative), (0, 4, negative), (0, 5, "value is not valid JSON")],
        [("north", 1, Decimal("10.00")), ("south", 1, Decimal("2.50"))],
    )
    replayed = replay_stream(relaxed)

    # Killed once silver holds what passes: quarantine still holds it too, moved and awaiting its deletion.
    assert replay_alone(config, f"{replayed}:after_silver_commit:0", tmp_path / "first.log") == -9
    silver, quarantine = (
        {(row.partition, row.offset) for row in spark.read.format("delta").load(lakehouse.table(table)).collect()}
        for table in (relaxed.silver, relaxed.quarantine)
    )
    assert silver == {(0, 0), (0, 1), (0, 2), (0, 6)} and quarantine == {(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)}
    # Killed again, replay 1 having deleted them and given the records that stay their reason now.
    assert replay_alone(config, f"{replayed}:after_quarantine_commit:1", tmp_path / "second.log") == -9
    # Run whole: nothing is left to move, and nothing moves twice.
    done = replay(spark, config, relaxed)
    assert (done.number, done.judged, done.moved, done.finished) == (1, 3, 0, 0)
    run_available_now(spark, config, relaxed.streams, relaxed)
    assert landed(spark, lakehouse, relaxed) == (
        [(0, 0), (0, 1), (0, 2), (0, 6)],
        [(0, 3, negative), (0, 4, "expectation order_id_shape not met"), (0, 5, "value is not valid JSON")],
        [("east", 1, Decimal("-4.00")), ("north", 1, Decimal("10.00")), ("south", 2, Decimal("1.50"))],
    )
    assert run_audit(spark, config, relaxed).clean


@pytest.mark.slow
def test_a_replay_refused_while_silver_runs_or_the_fused_stream_carries_it_lands_once_by_each_way_out(
    spark, checked_config, orders_topic
):
    config = checked_config
    lakehouse = Lakehouse(config.lakehouse_root)
    producer = Producer(client_config(config, **{"enable.idempotence": True}))
    for value in (order("o1", "north", "10.00"), order("o2", "south", "-1.00"), order("o3", "north", "-9.00")):
        producer.produce(orders_topic, value, partition=0)
    assert producer.flush(30) == 0
    strict, relaxed = checked(*STRICT), checked(*RELAXED)
    negative = "expectation total_not_negative not met"
    run_available_now(spark, config.model_copy(update={"mode": Mode.FUSED}), None, strict)
    before = landed(spark, lakehouse, strict)
    assert before == ([(0, 0)], [(0, 1, negative), (0, 2, negative)], [("north", 1, Decimal("10.00"))])

    # The fused stream aggregates gold from Kafka, not from silver: the replay refuses, naming the way out.
    with pytest.raises(CheckpointError) as refused:
        replay(spark, config, relaxed)
    message = str(refused.value)
    assert "the fused stream carries dataset checked_orders" in message, message
    layered, fused = switch_command(Mode.LAYERED, relaxed), switch_command(Mode.FUSED, relaxed)
    assert f"`{layered}`" in message and f"`{fused}`" in message, message
    assert landed(spark, lakehouse, relaxed) == before
    switch_mode(spark, config, Mode.LAYERED, relaxed)

    # A silver stream that runs (its lease held by a live process elsewhere): refused, and once it stops,
    # the replay goes on.
    silver = relaxed.stream("silver")
    taken = [int(name.name) for name in Path(lease.lease_directory(lakehouse, silver)).glob("[0-9]*")]
    foreign_lease(Path(lease.lease_path(lakehouse, silver, max(taken, default=0) + 1)), int(time.time() * 1000))
    with pytest.raises(lease.LeaseHeld, match="Then run `quarantine replay --dataset checked_orders` again"):
        replay(spark, config, relaxed)
    assert landed(spark, lakehouse, relaxed) == before
    time.sleep(3.5)  # the foreign lease's ttl: its holder stopped renewing
    done = replay(spark, config, relaxed)
    assert (done.judged, done.moved) == (2, 1)

    # The layered streams carry the moved record to gold; back in the fused mode, new records land too.
    run_available_now(spark, config, None, relaxed)
    switch_mode(spark, config, Mode.FUSED, relaxed)
    producer.produce(orders_topic, order("o4", "south", "3.00"), partition=0)
    assert producer.flush(30) == 0
    run_available_now(spark, config.model_copy(update={"mode": Mode.FUSED}), None, relaxed)
    assert landed(spark, lakehouse, relaxed) == (
        [(0, 0), (0, 1), (0, 3)],
        [(0, 2, negative)],
        [("north", 1, Decimal("10.00")), ("south", 2, Decimal("2.00"))],
    )
    assert run_audit(spark, config.model_copy(update={"mode": Mode.FUSED}), relaxed).clean
