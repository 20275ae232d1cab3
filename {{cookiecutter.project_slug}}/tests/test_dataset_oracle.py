"""The oracle for any dataset must be able to fail: each planted fault in a table is reported by its kind.

Plain Python on planted rows, as its reader collects them: no broker, no Spark.
"""

import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from {{ cookiecutter.package_name }}.devtools.oracle import BROKEN_PREFIX, judge_published, judge_rows, window_seconds
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.expectations import Action, condition, in_range, matches, not_null, one_of

CONTRACT = Contract(
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
        Aggregate(AggregateKind.APPROX_DISTINCT, "customer"),
    ),
    dimensions=("shop",),
    window="10 minutes",
)
SHOPS = Dataset("shops", CONTRACT, (BY_SHOP,), dedup_key=("order_id",))


def order(order_id: str, minute: int, customer: str, total: str) -> bytes:
    at = f"2024-06-01T12:{minute:02d}:00+00:00"
    text = json.dumps({"order_id": order_id, "ordered_at": at, "shop": "north", "customer": customer})
    return (text[:-1] + f', "total": {total}' + "}").encode()  # a JSON number, written as its decimal text


O1, O2, BROKEN = order("o1", 1, "ann", "10.00"), order("o2", 2, "bob", "5.50"), BROKEN_PREFIX + b"r-3"
# o1 sent twice (a retry: the same bytes), o2 once, one broken record.
COMMITTED = [O1, O2, O1, BROKEN]
T, AT = "orders", datetime(2024, 6, 1, 12, 0, tzinfo=UTC)


def silver_row(offset: int, order_id: str, minute: int, customer: str, total: str) -> dict:
    return {
        "topic": T,
        "partition": 0,
        "offset": offset,
        "order_id": order_id,
        "ordered_at": AT.replace(minute=minute),
        "shop": "north",
        "customer": customer,
        "total": Decimal(total),
    }


def tables() -> dict:
    return {
        "bronze": [{"value": value} for value in COMMITTED],
        "silver": [silver_row(0, "o1", 1, "ann", "10.00"), silver_row(1, "o2", 2, "bob", "5.50")],
        "quarantine": [
            {"topic": T, "partition": 0, "offset": 2, "value": O1, "reason": f"duplicate of {T}/0/0"},
            {"topic": T, "partition": 0, "offset": 3, "value": BROKEN, "reason": "not valid JSON"},
        ],
        "golds": {
            "by_shop": [
                {
                    "window_start": AT,
                    "shop": "north",
                    "event_count": 2,
                    "total_sum": Decimal("15.50"),
                    "total_max": Decimal("10.00"),
                    "customer_distinct": 2,
                    "customer_approx_distinct": 2,
                }
            ]
        },
    }


def found(planted: dict) -> dict[str, int]:
    result = judge_rows(
        SHOPS,
        COMMITTED,
        planted["bronze"],
        planted["silver"],
        planted["quarantine"],
        planted["golds"],
        "1 minute",
    )
    return {kind: count for kind, count in result.items() if count}


def test_the_oracle_finds_nothing_when_each_record_landed_once_and_each_key_was_kept_once():
    assert found(tables()) == {}


def test_the_oracle_reports_a_record_bronze_holds_twice_or_lacks():
    planted = tables()
    planted["bronze"].append({"value": O2})
    assert found(planted) == {"bronze": 1}
    planted["bronze"] = planted["bronze"][1:-1]
    assert found(planted) == {"bronze": 1}


def test_the_oracle_reports_a_business_key_silver_holds_twice():
    planted = tables()
    planted["silver"].append(silver_row(2, "o1", 1, "ann", "10.00"))
    planted["quarantine"].pop(0)
    assert found(planted) == {"silver": 1, "quarantine": 1}


def test_the_oracle_reports_a_copy_naming_a_record_of_another_key():
    planted = tables()
    planted["quarantine"][0]["reason"] = f"duplicate of {T}/0/1"
    assert found(planted) == {"quarantine": 1}


def test_the_oracle_reports_a_broken_record_kept_out_of_quarantine():
    planted = tables()
    planted["quarantine"].pop()
    assert found(planted) == {"quarantine": 1}


@pytest.mark.parametrize(
    "column, value",
    [
        ("event_count", 3),
        ("total_sum", Decimal("25.50")),
        ("total_max", Decimal("5.50")),
        ("customer_distinct", 1),
        ("customer_approx_distinct", 4),
    ],
)
def test_the_oracle_reports_a_gold_aggregate_the_kept_records_do_not_give(column, value):
    planted = tables()
    planted["golds"]["by_shop"][0][column] = value
    assert found(planted) == {"gold": 1}


def test_the_oracle_reports_a_gold_window_no_record_falls_in():
    planted = tables()
    planted["golds"]["by_shop"].append({**planted["golds"]["by_shop"][0], "window_start": AT.replace(hour=13)})
    assert found(planted) == {"gold": 1}


def test_a_published_gold_is_judged_from_its_json_values_and_a_wrong_or_missing_row_is_reported():
    # As a consumer folds an egress's topic: the window start as ISO text, numbers exact.
    published = json.loads(
        '{"window_start": "2024-06-01T12:00:00.000000Z", "shop": "north", "event_count": 2, "total_sum": 15.50, '
        '"total_max": 10.00, "customer_distinct": 2, "customer_approx_distinct": 2, "gold_version": 4}',
        parse_float=Decimal,
    )
    assert judge_published(SHOPS, COMMITTED, BY_SHOP, [published], "1 minute") == 0
    assert judge_published(SHOPS, COMMITTED, BY_SHOP, [{**published, "total_sum": Decimal("16.50")}], "1 minute") == 1
    assert judge_published(SHOPS, COMMITTED, BY_SHOP, [], "1 minute") == 1
    with pytest.raises(ValueError, match="one of the golds of dataset 'shops'"):
        judge_published(SHOPS, COMMITTED, Gold("other", (Aggregate(AggregateKind.COUNT),)), [], "1 minute")


def test_a_window_duration_is_read_in_plain_words():
    assert window_seconds("10 minutes") == 600
    assert window_seconds("1 hour") == 3600
    with pytest.raises(ValueError, match="a number and a unit"):
        window_seconds("10m")


# The same orders, judged by a dataset that quarantines an order under 6.00 and warns of one from a
# customer not named in lower case: o2 (5.50) fails the first, ann and bob meet the second.
CHECKED = Dataset(
    "shops",
    CONTRACT,
    (BY_SHOP,),
    dedup_key=("order_id",),
    expectations=(
        in_range("total_at_least_six", "total", minimum="6.00"),
        matches("customer_lower_case", "customer", "^[a-z]+$", Action.WARN),
    ),
)
UNMET = "expectation total_at_least_six not met"


def checked_tables() -> dict:
    planted = tables()
    planted["silver"].pop()  # o2
    planted["quarantine"].append({"topic": T, "partition": 0, "offset": 1, "value": O2, "reason": UNMET})
    by_shop = planted["golds"]["by_shop"][0]
    by_shop.update(event_count=1, total_sum=Decimal("10.00"), customer_distinct=1, customer_approx_distinct=1)
    return planted


def found_checked(planted: dict, dataset: Dataset = CHECKED, committed: list[bytes] = COMMITTED) -> dict[str, int]:
    tables_in_order = (planted[name] for name in ("bronze", "silver", "quarantine", "golds"))
    result = judge_rows(dataset, committed, *tables_in_order, "1 minute")
    return {kind: count for kind, count in result.items() if count}


def test_the_oracle_judges_a_quarantining_expectation_from_its_declaration_and_finds_nothing_when_it_held():
    assert found_checked(checked_tables()) == {}


def test_the_oracle_reports_a_record_failing_an_expectation_kept_in_silver_or_quarantined_for_another_reason():
    kept = checked_tables()
    kept["silver"].append(silver_row(1, "o2", 2, "bob", "5.50"))
    kept["quarantine"].pop()
    assert found_checked(kept) == {"silver": 1, "quarantine": 1}
    mislabelled = checked_tables()
    mislabelled["quarantine"][-1]["reason"] = "expectation customer_lower_case not met"
    assert found_checked(mislabelled) == {"quarantine": 2}
    # Without the expectation, the same tables lack o2 in silver and in gold.
    assert found(checked_tables()) == {"silver": 1, "quarantine": 1, "gold": 1}


@pytest.mark.parametrize(
    "expectation, meets_o1, meets_o2",
    [
        (not_null("total_given", "total"), True, True),
        (one_of("known_customer", "customer", ("ann",)), True, False),
        (one_of("round_total", "total", (10, Decimal("7.25"))), True, False),
        (matches("customer_with_n", "customer", "n"), True, False),
        (in_range("total_up_to_eight", "total", maximum=8), False, True),
    ],
)
def test_the_oracle_judges_each_built_in_rule_a_record_can_fail(expectation, meets_o1, meets_o2):
    # o1 and o2 once each, and the broken record; a record failing the rule is in quarantine, not silver.
    dataset = Dataset("shops", CONTRACT, (BY_SHOP,), dedup_key=("order_id",), expectations=(expectation,))
    planted = tables()
    planted["bronze"].pop(2)
    planted["quarantine"].pop(0)
    for offset, value, meets in ((0, O1, meets_o1), (1, O2, meets_o2)):
        if not meets:
            planted["silver"] = [row for row in planted["silver"] if row["offset"] != offset]
            reason = f"expectation {expectation.name} not met"
            planted["quarantine"].append(
                {"topic": T, "partition": 0, "offset": offset, "value": value, "reason": reason}
            )
    planted["golds"] = {"by_shop": []}
    assert found_checked(planted, dataset, [O1, O2, BROKEN]) == {"gold": 1}  # the planted gold is empty


def test_the_oracle_refuses_a_quarantining_rule_it_cannot_judge_from_the_json_alone():
    dataset = Dataset("shops", CONTRACT, (BY_SHOP,), expectations=(condition("north_only", "shop = 'north'"),))
    with pytest.raises(ValueError, match="expectation north_only is a condition rule, which this oracle cannot judge"):
        judge_rows(dataset, COMMITTED, [], [], [], {}, "1 minute")
