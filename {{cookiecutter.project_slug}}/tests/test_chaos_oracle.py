"""The chaos runner's oracle must be able to fail: each planted fault is reported by its kind.

Every kind the oracle reports (``verify``'s and ``judge``'s) has a planted fault here. Most are plain
Python on planted rows: no broker, no Spark. One setup plants faults of every kind in real Delta
tables{% if cookiecutter.egress in ["both", "kafka"] %} and a real output topic{% endif %} at once and asks ``judge``, so that the oracle's readers are shown to
carry each fault to its kind too.
"""

import json
{% if cookiecutter.egress in ["both", "kafka"] %}import uuid
{% endif %}from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
{% if cookiecutter.egress in ["both", "kafka"] %}from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
{% endif %}
from {{ cookiecutter.package_name }}.devtools.chaos import (
    KAFKA_EGRESS,
    MALFORMED_PREFIX,
    POSTGRES_EGRESS,
    STREAM_ID_HEADER,
    Ledger,
    folded_changelog,
    judge,
    record_id,
    repeated_versions,
    verify,
)
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE, GOLD, QUARANTINE, SILVER, Lakehouse
{% if cookiecutter.egress in ["both", "kafka"] %}from {{ cookiecutter.package_name }}.pipeline.egress.kafka import KafkaEgressSettings
{% endif %}
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


EGRESS_KINDS = {f"{KAFKA_EGRESS}_windows_wrong", f"{POSTGRES_EGRESS}_windows_wrong"}


def anomalies(bronze=BRONZE_ROWS, silver=SILVER_ROWS, quarantine=QUARANTINE_ROWS, gold=GOLD_ROWS, egress=None) -> dict:
    found = verify(LEDGER, bronze, silver, quarantine, gold, 60, egress)
    return {kind: count for kind, count in found.items() if count}


def test_every_kind_the_oracle_reports_has_a_planted_fault_in_this_module():
    # A kind added to verify without a test here that names it fails this one (an egress's kinds are
    # named by their stream: the tests below plant each).
    egress = dict.fromkeys((KAFKA_EGRESS, POSTGRES_EGRESS), GOLD_ROWS)
    kinds = set(verify(LEDGER, BRONZE_ROWS, SILVER_ROWS, QUARANTINE_ROWS, GOLD_ROWS, 60, egress)) - EGRESS_KINDS
    source = Path(__file__).read_text()
    assert {kind for kind in kinds if f'"{kind}"' not in source} == set()


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


def test_oracle_reports_a_committed_record_that_never_reached_bronze():
    # Lost at bronze, so lost downstream too: silver lacks it and gold's window misses its event.
    found = anomalies(bronze=BRONZE_ROWS[::2], silver=SILVER_ROWS[:1], gold=[(WINDOW_12_00, "buy", 1, Decimal("1.50"))])
    assert found == {
        "committed_missing_in_bronze": 1,
        "committed_missing_in_silver_and_quarantine": 1,
        "gold_windows_wrong": 1,
    }


def test_oracle_reports_a_record_bronze_holds_twice():
    # Bronze wrote the batch twice (its second copy at other offsets); silver took one copy.
    assert anomalies(bronze=[*BRONZE_ROWS, ("t", 0, 3, "r-1")]) == {"duplicates_in_bronze": 1}


def test_oracle_reports_a_record_the_runner_never_wrote():
    assert anomalies(bronze=[*BRONZE_ROWS, ("t", 1, 0, "r-77")]) == {"unknown_records": 1}
    # A value it did not make at all ("?") counts too, in bronze or as a silver row bronze lacks.
    assert anomalies(bronze=[*BRONZE_ROWS, ("t", 1, 0, "?")]) == {"unknown_records": 1}
    assert anomalies(silver=[*SILVER_ROWS, ("t", 1, 9)]) == {"unknown_records": 1}


@pytest.mark.parametrize("stream", [KAFKA_EGRESS, POSTGRES_EGRESS])
def test_oracle_reports_an_egress_sink_that_differs_from_the_committed_input(stream):
    other = ({KAFKA_EGRESS, POSTGRES_EGRESS} - {stream}).pop()
    assert anomalies(egress={stream: GOLD_ROWS, other: GOLD_ROWS}) == {}
    wrong_count = [(WINDOW_12_00, "buy", 3, Decimal("3.75"))]
    assert anomalies(egress={stream: wrong_count, other: GOLD_ROWS}) == {f"{stream}_windows_wrong": 1}
    # A window the sink lacks, and one it has that the input never had: one wrong window each.
    extra = [*GOLD_ROWS, (WINDOW_12_00 + 60, "buy", 1, Decimal("1.00"))]
    assert anomalies(egress={stream: [], other: GOLD_ROWS}) == {f"{stream}_windows_wrong": 1}
    assert anomalies(egress={stream: extra, other: GOLD_ROWS}) == {f"{stream}_windows_wrong": 1}


def changelog_record(partition: int, offset: int, stream_id: str, version: int, count: int, amount: str) -> tuple:
    """One record of the Kafka egress's changelog as ``read_topic`` returns it: the window 12:00 of "buy"."""
    start = datetime.fromtimestamp(WINDOW_12_00, UTC)
    key = json.dumps({"window_start": start.isoformat(), "event_type": "buy"}).encode()
    value = json.dumps({"event_count": count, "amount_sum": float(amount), "gold_version": version}).encode()
    return (partition, offset, key, value, {STREAM_ID_HEADER: stream_id.encode()})


def test_oracle_reports_a_gold_version_a_changelog_repeats_and_folds_the_changelog_in_log_order():
    first = changelog_record(0, 0, "s-1", 1, 1, "1.50")
    newest = changelog_record(0, 1, "s-1", 2, 2, "3.75")
    assert repeated_versions([first, newest]) == 0
    # A new stream id (a reset) publishing gold again is a new changelog, not a repeat; a tombstone is no version.
    again = changelog_record(0, 5, "s-2", 2, 2, "3.75")
    assert repeated_versions([first, newest, again, (0, 6, again[2], None, again[4])]) == 0
    assert repeated_versions([first, newest, changelog_record(1, 0, "s-1", 2, 2, "3.75")]) == 1

    def egress_kinds(records) -> dict:
        return anomalies(egress={KAFKA_EGRESS: folded_changelog(records)})

    assert egress_kinds([newest, first]) == {}  # read out of order: folded by (partition, offset)
    assert egress_kinds([first]) == {f"{KAFKA_EGRESS}_windows_wrong": 1}
    assert egress_kinds([first, newest, (0, 2, first[2], None, {})]) == {f"{KAFKA_EGRESS}_windows_wrong": 1}


# --- the oracle's readers, on real tables and a real topic: one setup for every kind ----------


{% if cookiecutter.egress in ["both", "kafka"] %}def plant_changelog(bootstrap: str, topic: str, records: list[tuple], aborted: list[tuple]) -> None:
    """``records`` committed to ``topic`` in one transaction, ``aborted`` in one aborted after them."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"plant-{topic}"})
    producer.init_transactions(30)
    for planted, commit in ((records, True), (aborted, False)):
        producer.begin_transaction()
        for partition, _, key, value, headers in planted:
            producer.produce(topic, key=key, value=value, partition=partition, headers=list(headers.items()))
        producer.flush(30)
        (producer.commit_transaction if commit else producer.abort_transaction)(30)


{% endif %}def test_judge_reports_each_fault_planted_in_the_tables_and_sinks_it_reads(spark, config{% if cookiecutter.egress in ["both", "kafka"] %}, kafka_bootstrap{% endif %}):
    ledger = Ledger(
        committed={
            **LEDGER.committed,
            "r-3": MALFORMED_PREFIX + b"r-3",  # as the runner makes one: its id in its value
            "r-4": b'{"event_id": "r-4", "event_time": "2024-06-01T12:01:05+00:00", "event_type": "buy", "amount": 4}',
        },
        aborted=LEDGER.aborted,
    )
    values = ledger.committed
    # Bronze: r-1 twice (a batch written twice), r-77 that no one committed, r-4 never there.
    bronze = [("t", 0, 0, values["r-1"]), ("t", 0, 1, values["r-2"]), ("t", 0, 2, values["r-3"])]
    bronze += [("t", 0, 3, values["r-1"]), ("t", 1, 0, values["r-1"].replace(b"r-1", b"r-77"))]
    window = datetime.fromtimestamp(WINDOW_12_00, UTC)
    gold = [(window, "buy", 2, Decimal("3.75")), (window.replace(minute=1), "buy", 1, Decimal("4.00"))]
    lakehouse = Lakehouse(config.lakehouse_root)

    def write(name: str, rows: list, schema: str) -> None:
        spark.createDataFrame(rows, schema).write.format("delta").save(lakehouse.table(name))

    write(BRONZE, bronze, "topic string, partition int, offset long, value binary")
    write(SILVER, SILVER_ROWS, "topic string, partition int, offset long")
    write(QUARANTINE, QUARANTINE_ROWS, "topic string, partition int, offset long")
    write(GOLD, gold, "window_start timestamp, event_type string, event_count long, amount_sum decimal(38,2)")

{% if cookiecutter.egress in ["both", "kafka"] %}    # The output topic: window 12:00 as gold has it, but one version published twice by one stream id,
    # and window 12:01 with a wrong count; an aborted transaction's record (read_committed never sees it).
    out = f"planted-gold-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(out, num_partitions=2, replication_factor=1)])[out].result(timeout=30)
    twelve = changelog_record(0, 0, "s-1", 1, 2, "3.75")
    one = changelog_record(1, 0, "s-1", 1, 7, "4.00")
    one = (1, 0, one[2].replace(b"12:00:00", b"12:01:00"), one[3], one[4])
    plant_changelog(kafka_bootstrap, out, [twelve, twelve, one], aborted=[changelog_record(0, 9, "s-1", 9, 99, "9")])
    config = config.model_copy(update={"egress": {KAFKA_EGRESS: KafkaEgressSettings(topic=out)}})

{% endif %}    found, aborted_records = judge(spark, config, ledger, {% if cookiecutter.egress in ["both", "kafka"] %}{"EGRESS_KAFKA_TOPIC": out}{% else %}{}{% endif %})
    assert {kind: count for kind, count in found.items() if count} == {
        "committed_missing_in_bronze": 1,
        "committed_missing_in_silver_and_quarantine": 1,
        "duplicates_in_bronze": 1,
        "unknown_records": 1,
{%- if cookiecutter.egress in ["both", "kafka"] %}
        f"{KAFKA_EGRESS}_windows_wrong": 1,
        f"{KAFKA_EGRESS}_records_repeating_a_gold_version": 1,
{%- endif %}
    }
    assert aborted_records == {% if cookiecutter.egress in ["both", "kafka"] %}1{% else %}0{% endif %}
