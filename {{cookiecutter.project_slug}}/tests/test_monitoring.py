"""What the metrics say, read back through prometheus-client's own registry."""

from prometheus_client import REGISTRY

from {{ cookiecutter.package_name }}.pipeline.contract import EVENTS
from {{ cookiecutter.package_name }}.pipeline.monitoring import report_quarantine


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
