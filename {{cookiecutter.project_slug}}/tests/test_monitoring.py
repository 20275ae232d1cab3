"""What the metrics say, read back through prometheus-client's own registry."""

import json
from datetime import UTC, datetime

from prometheus_client import REGISTRY
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.pipeline.contract import quarantine_label, quarantine_label_column
from {{ cookiecutter.package_name }}.pipeline.datasets.events import EVENTS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import BRONZE_SCHEMA
from {{ cookiecutter.package_name }}.pipeline.monitoring import report_quarantine
from {{ cookiecutter.package_name }}.pipeline.silver import parse_events, ranges_and_quarantine_share


def quarantined(stream: str) -> dict[str, float]:
    """{reason label: count} of ``lakehouse_quarantined_records_total`` for ``stream``."""
    return {
        sample.labels["reason"]: sample.value
        for family in REGISTRY.collect()
        for sample in family.samples
        if sample.name == "lakehouse_quarantined_records_total" and sample.labels["stream"] == stream
    }


def test_quarantine_reasons_reach_the_metrics_as_their_rule_whatever_json_the_producer_sent():
    # A JSON type names the keys of the object sent: unbounded, one series each if it were a label.
    reasons = {
        "field amount must be a number, got OBJECT<a: BIGINT>": 2,
        "field amount must be a number, got OBJECT<b: BIGINT, c: STRING>": 3,
        "field amount must be a number, got STRING": 1,
        "value is not valid JSON": 4,
    }
    report_quarantine("silver-labels", 0, records=10, quarantined=10, reasons=reasons)

    labels = quarantined("silver-labels")
    assert labels == {"field amount must be a number, got <type>": 6, "value is not valid JSON": 4}
    assert set(labels) <= set(EVENTS.quarantine_reasons())


def test_every_quarantined_record_is_counted_by_its_rule_however_few_a_batch_holds(spark):
    # 1 malformed record in 20: far below the share that makes a batch's quarantine an alert.
    event = {"event_time": "2024-05-01T09:00:00Z", "user_id": "u", "event_type": "click", "amount": 1.5}
    good = [json.dumps({**event, "event_id": f"e{n}"}) for n in range(19)]
    bad = json.dumps({**event, "event_id": "x", "amount": {"a": 1}})
    now = datetime(2024, 5, 1, 9, 1, tzinfo=UTC)
    rows = [
        (None, value.encode(), None, "t", "id", 0, offset, now, 0, now) for offset, value in enumerate([*good, bad])
    ]
    bronze = spark.createDataFrame(rows, BRONZE_SCHEMA)
    before = quarantined("silver-few")

    _, rejected, records = ranges_and_quarantine_share(parse_events(bronze, EVENTS), "silver-few", 0)

    assert (rejected, records) == (1, 20)
    counted = {label: count - before.get(label, 0) for label, count in quarantined("silver-few").items()}
    assert counted == {"field amount must be a number, got <type>": 1}


def test_the_quarantine_label_in_spark_is_the_label_in_python(spark):
    reasons = [*EVENTS.quarantine_reasons(), "field amount must be a number, got OBJECT<a: BIGINT, b: STRING>"]
    frame = spark.createDataFrame([(reason,) for reason in reasons], "reason string")

    labelled = frame.select("reason", quarantine_label_column(F.col("reason")).alias("label")).collect()

    assert {row.reason: row.label for row in labelled} == {reason: quarantine_label(reason) for reason in reasons}
