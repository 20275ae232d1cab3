"""The chaos runner's oracle must be able to fail: each planted fault is reported by its kind.

Plain Python on planted rows: no broker, no Spark.
"""

from decimal import Decimal

from {{ cookiecutter.package_name }}.devtools.chaos import MALFORMED_PREFIX, Ledger, record_id, verify

LEDGER = Ledger(
    committed={
        "r-1": b'{"event_id": "r-1", "event_time": "2024-06-01T12:00:10+00:00", "event_type": "buy", "amount": 1.5}',
        "r-2": b'{"event_id": "r-2", "event_time": "2024-06-01T12:00:20+00:00", "event_type": "buy", "amount": 2.25}',
        "r-3": b"{broken",
    },
    aborted={"r-9"},
)
BRONZE_ROWS = [("t", 0, 0, "r-1"), ("t", 0, 1, "r-2"), ("t", 0, 2, "r-3")]
SILVER_ROWS = [("t", 0, 0), ("t", 0, 1)]
QUARANTINE_ROWS = [("t", 0, 2)]
WINDOW_12_00 = 1717243200
GOLD_ROWS = [(WINDOW_12_00, "buy", 2, Decimal("3.75"))]


def anomalies(bronze=BRONZE_ROWS, silver=SILVER_ROWS, quarantine=QUARANTINE_ROWS, gold=GOLD_ROWS) -> dict:
    found = verify(LEDGER, bronze, silver, quarantine, gold, 60)
    return {kind: count for kind, count in found.items() if count}


def test_oracle_finds_nothing_when_every_record_landed_once():
    assert anomalies() == {}


def test_oracle_reports_a_planted_duplicate():
    assert anomalies(silver=[*SILVER_ROWS, ("t", 0, 1)]) == {"duplicates_in_silver_or_quarantine": 1}


def test_oracle_reports_a_planted_loss():
    assert anomalies(silver=[("t", 0, 0)]) == {"committed_missing_in_silver_and_quarantine": 1}
    # Gold is checked against the committed input, not against silver: a loss upstream shows there too.
    found = anomalies(silver=[("t", 0, 0)], gold=[(WINDOW_12_00, "buy", 1, Decimal("1.50"))])
    assert found == {"committed_missing_in_silver_and_quarantine": 1, "gold_windows_wrong": 1}


def test_oracle_reports_an_aborted_record_that_became_visible():
    found = anomalies(bronze=[*BRONZE_ROWS, ("t", 0, 5, "r-9")])
    assert found == {"aborted_visible": 1}


def test_oracle_reports_gold_that_differs_from_the_committed_input():
    assert anomalies(gold=[(WINDOW_12_00, "buy", 3, Decimal("3.75"))]) == {"gold_windows_wrong": 1}


def test_oracle_reports_a_record_in_the_wrong_table():
    found = anomalies(silver=[*SILVER_ROWS, ("t", 0, 2)], quarantine=[])
    assert found == {"in_the_wrong_table": 1}


def test_a_record_is_known_by_the_id_its_value_carries_not_by_its_kafka_key():
    # A producer may give a record another record's key: the oracle counts records by their own id.
    assert record_id(LEDGER.committed["r-1"]) == "r-1"
    assert record_id(MALFORMED_PREFIX + b"r-7") == "r-7"
    assert record_id(b'{"not": "one of ours"}') == "?"
    assert record_id(None) == "?"
