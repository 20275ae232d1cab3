"""Every key an audit report's errors and warnings hold (``audit --json``), declared once.

docs/runbook.md says what each means and the way out of it (tests/test_docs.py holds the two to each
other). A key with ``{egress}`` in it stands for one key per egress stream the project runs, named by the
stream (``kafka_egress``, ``postgres_egress``, ``orders_gold_by_shop_kafka_egress``). What an egress alone
reports (its ``audit_errors``) is declared in its module, as its ``FINDINGS``, named after its first stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from ..egress import installed, installed_streams, target_egress

EGRESS = "{egress}"


class Finding(StrEnum):
    # Kafka -> bronze.
    KAFKA_RECORDS_MISSING_IN_BRONZE = "kafka_records_missing_in_bronze"
    BRONZE_DUPLICATES = "bronze_duplicates"
    BRONZE_RECORDS_NOT_COMMITTED_IN_KAFKA = "bronze_records_not_committed_in_kafka"
    BRONZE_RECORDS_NOT_AS_IN_KAFKA = "bronze_records_not_as_in_kafka"
    COMPACTED_TOPICS_NOT_DECLARED = "compacted_topics_not_in_kafka_compacted_topics"
    # bronze -> silver + quarantine.
    BRONZE_RECORDS_MISSING_IN_SILVER_AND_QUARANTINE = "bronze_records_missing_in_silver_and_quarantine"
    SILVER_DUPLICATES = "silver_duplicates"
    QUARANTINE_DUPLICATES = "quarantine_duplicates"
    RECORDS_IN_BOTH_SILVER_AND_QUARANTINE = "records_in_both_silver_and_quarantine"
    SILVER_OR_QUARANTINE_RECORDS_NOT_IN_BRONZE = "silver_or_quarantine_records_not_in_bronze"
    SILVER_ROWS_NOT_AS_PARSED_FROM_BRONZE = "silver_rows_not_as_parsed_from_bronze"
    QUARANTINE_ROWS_NOT_AS_PARSED_FROM_BRONZE = "quarantine_rows_not_as_parsed_from_bronze"
    # silver -> gold.
    GOLD_WINDOWS_NOT_MATCHING_SILVER = "gold_windows_not_matching_silver"
    GOLD_DISTINCT_VALUES_NOT_MATCHING_SILVER = "gold_distinct_values_not_matching_silver"
    GOLD_NOT_AUDITED = "gold_not_audited_its_last_batch_ended_inside_a_silver_version"
    # gold -> each egress.
    EGRESS_NOT_AUDITED = f"{EGRESS}_not_audited_its_last_batch_ended_inside_a_gold_version"
    EGRESS_ROWS_NOT_MATCHING_GOLD = f"{EGRESS}_rows_not_matching_gold"
    # Warnings: nothing in the lakehouse is wrong, but someone should know.
    NEWEST_RECORDS_MOSTLY_QUARANTINED = "newest_records_mostly_quarantined"
    KAFKA_OFFSETS_ACCEPTED_AS_LOST = "kafka_offsets_deleted_before_bronze_read_them_accepted_as_lost"
    COMPACTED_TOPICS_ACCEPTED = "compacted_topics_whose_superseded_records_bronze_may_never_have_read"

    @property
    def is_warning(self) -> bool:
        return self in WARNINGS

    def of(self, egress: str) -> str:
        """The key for one egress (by its stream name) of a ``{egress}`` finding.

        Example::

            Finding.EGRESS_ROWS_NOT_MATCHING_GOLD.of("kafka_egress")  # "kafka_egress_rows_not_matching_gold"
        """
        if EGRESS not in self.value:
            raise ValueError(f"{self.name} is not a finding of each egress")
        if not egress.endswith("_egress"):
            raise ValueError(f"egress is {egress!r}, not an egress's stream name (<name>_egress)")
        return self.value.format(egress=egress)


WARNINGS = frozenset(
    {
        Finding.NEWEST_RECORDS_MOSTLY_QUARANTINED,
        Finding.KAFKA_OFFSETS_ACCEPTED_AS_LOST,
        Finding.COMPACTED_TOPICS_ACCEPTED,
    }
)


def keys(egresses: Iterable[str]) -> dict[str, bool]:
    """Every key a report can hold in a project whose egresses run ``egresses`` (stream names, each one
    this project can run: ``egress.installed_streams``), each with whether it is a warning.

    Example::

        keys(["kafka_egress"])["kafka_egress_rows_not_matching_gold"]  # False: an error
    """
    egresses = list(egresses)
    modules = installed()
    unknown = sorted(set(egresses) - set(installed_streams()))
    if unknown:
        raise ValueError(f"egresses {unknown} are not egress streams of this project ({list(installed_streams())})")
    found: dict[str, bool] = {}
    for finding in Finding:
        if EGRESS in finding.value:
            found.update({finding.of(egress): finding.is_warning for egress in egresses})
        else:
            found[finding.value] = finding.is_warning
    for egress in egresses:
        # An egress's own findings are named after its first stream: another stream's after that stream.
        first = target_egress(egress)
        found.update(dict.fromkeys((key.replace(first, egress, 1) for key in modules[first].FINDINGS), False))
    return found
