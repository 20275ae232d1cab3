"""Reconcile Kafka <-> bronze <-> silver + quarantine <-> gold <-> each egress's sink.

Kafka offsets have gaps (transaction markers, aborted records, compaction), so
the audit compares against the committed records that exist, read back with
read_committed, never against offset arithmetic. Content is compared too: each
bronze record's key and value against Kafka's (a digest), and silver and
quarantine against bronze parsed again. Run it on a drained pipeline (after
`run --available-now`): records still in flight count as missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from .config import Config
from .contract import EVENTS, Contract
from .egress import configured
from .kafka_io import bootstrap_servers, describe_sources, spark_security_options
from .progress import QUARANTINE_ALERT_SHARE
from .tables import BRONZE, GOLD, KAFKA_KEY_COLUMNS, QUARANTINE, SILVER, Lakehouse, check_schema, table_schemas
from .transforms import (
    first_per_kafka_record,
    parse_events,
    quarantined_records,
    valid_events,
    window_aggregates,
    with_topic_ids,
)


@dataclass
class AuditReport:
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(self.errors.values())

    def as_dict(self) -> dict:
        return {
            "verdict": "clean" if self.clean else "FAILED",
            "counts": self.counts,
            "errors": self.errors,
            "warnings": self.warnings,
        }


# Records per partition the quarantine signal looks at.
NEWEST = 1000


def committed_kafka_records(spark: SparkSession, config: Config) -> DataFrame:
    """Coordinates (with each topic's current id), key and value of every committed record Kafka holds now."""
    topic_ids = describe_sources(config, list(config.kafka.topics), cluster=False).topic_ids
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers(config))
        .option("subscribe", ",".join(config.kafka.topics))
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .options(**spark_security_options(config))
        .load()
    )
    return with_topic_ids(rows, topic_ids).select(*KAFKA_KEY_COLUMNS, "key", "value")


def run_audit(spark: SparkSession, config: Config, contract: Contract = EVENTS) -> AuditReport:
    """Reconcile the lakehouse of ``config`` with Kafka; gold is recomputed from silver by ``contract``."""
    lakehouse = Lakehouse(config.lakehouse_root)
    schemas = table_schemas(contract)

    def table(name: str) -> DataFrame:
        rows = spark.read.format("delta").load(lakehouse.table(name))
        # Tables of another contract would fail obscurely, or compare the wrong columns.
        check_schema(name, lakehouse.table(name), schemas[name], rows.schema)
        return rows

    # In layer order: a lakehouse of another contract is named by its first table that differs.
    tables = {name: table(name) for name in (BRONZE, SILVER, QUARANTINE, GOLD)}
    kafka = committed_kafka_records(spark, config)
    report = reconcile(kafka, *tables.values(), config.gold_window, contract)
    report.errors.update(compare_content(kafka, tables[BRONZE], tables[SILVER], tables[QUARANTINE], contract))
    for name, module in configured(config).items():
        reconcile_egress(report, name, module.read_back(spark, config), tables[GOLD], contract)
        report.errors.update(module.audit_errors(spark, config))
    return report


def reconcile_egress(report: AuditReport, name: str, mirror: DataFrame, gold: DataFrame, contract: Contract) -> None:
    """An egress's sink, read back as its consumers see it, must equal gold row for row."""
    columns = gold.columns
    report.counts[f"{name}_rows"] = mirror.count()
    report.errors[f"{name}_rows_not_matching_gold"] = _gold_differences(mirror.select(*columns), gold, contract).count()


def _gold_differences(expected: DataFrame, gold: DataFrame, contract: Contract) -> DataFrame:
    """Gold rows missing, unexpected or with other counts or sums than the recomputation."""
    # Null-safe throughout: an optional dimension's null is a value of its own.
    same_key = reduce(
        lambda left, right: left & right, [F.col(f"e.{c}").eqNullSafe(F.col(f"g.{c}")) for c in contract.gold_key]
    )
    differs = reduce(
        lambda left, right: left | right,
        [~F.col(f"e.{c}").eqNullSafe(F.col(f"g.{c}")) for c in contract.gold_values],
    )
    return expected.alias("e").join(gold.alias("g"), same_key, "full_outer").where(differs)


def compare_content(
    kafka: DataFrame, bronze: DataFrame, silver: DataFrame, quarantine: DataFrame, contract: Contract = EVENTS
) -> dict[str, int]:
    """Content, not only coordinates: bronze's key and value against Kafka's, silver and quarantine parsed again.

    A record rewritten in place (a table edited by hand, a bad repair) keeps its coordinates,
    so the coordinate checks cannot see it.

    Example::

        compare_content(kafka, bronze, silver, quarantine)["silver_rows_not_as_parsed_from_bronze"]  # 0
    """
    missing = {"key", "value"} - set(kafka.columns)
    if missing:
        raise ValueError(f"kafka must hold the records' key and value; missing {sorted(missing)}")

    def digests(rows: DataFrame) -> DataFrame:
        return rows.select(*KAFKA_KEY_COLUMNS, F.xxhash64("key", "value").alias("digest"))

    in_kafka = digests(kafka).withColumnRenamed("digest", "kafka_digest")
    reparsed = parse_events(first_per_kafka_record(bronze), contract)
    return {
        "bronze_records_not_as_in_kafka": digests(bronze)
        .join(in_kafka, KAFKA_KEY_COLUMNS)
        .where(F.col("digest") != F.col("kafka_digest"))
        .count(),
        "silver_rows_not_as_parsed_from_bronze": _not_in(silver, valid_events(reparsed, contract)),
        "quarantine_rows_not_as_parsed_from_bronze": _not_in(quarantine, quarantined_records(reparsed)),
    }


def _not_in(rows: DataFrame, expected: DataFrame) -> int:
    return rows.exceptAll(expected.select(*rows.columns)).count()


def _newest_quarantined_percent(silver_keys: DataFrame, quarantine_keys: DataFrame, newest: int = NEWEST) -> int:
    # The newest offsets of each partition: a producer that broke recently shows, whatever came before.
    flagged = silver_keys.withColumn("quarantined", F.lit(0)).unionByName(
        quarantine_keys.withColumn("quarantined", F.lit(1))
    )
    by_partition = Window.partitionBy("topic", "topic_id", "partition").orderBy(F.desc("offset"))
    share = (
        flagged.withColumn("rank", F.row_number().over(by_partition))
        .where(F.col("rank") <= newest)
        .agg(F.avg("quarantined"))
        .first()[0]
    )
    return 0 if share is None else round(100 * share)


def _missing(left: DataFrame, right: DataFrame, keys: list[str]) -> int:
    return left.join(right, keys, "left_anti").count()


def _extra_copies(rows: DataFrame) -> int:
    return rows.count() - rows.select(*KAFKA_KEY_COLUMNS).distinct().count()


def reconcile(
    kafka: DataFrame,
    bronze: DataFrame,
    silver: DataFrame,
    quarantine: DataFrame,
    gold: DataFrame,
    window_duration: str,
    contract: Contract = EVENTS,
) -> AuditReport:
    """Every check of the audit, on DataFrames: usable on planted data in tests."""
    kafka_keys = kafka.select(*KAFKA_KEY_COLUMNS).persist()
    bronze_keys = bronze.select(*KAFKA_KEY_COLUMNS).persist()
    silver_keys = silver.select(*KAFKA_KEY_COLUMNS).persist()
    quarantine_keys = quarantine.select(*KAFKA_KEY_COLUMNS).persist()
    try:
        # Records Kafka has already deleted by retention stay in bronze legitimately, and so do
        # the records of a topic's earlier incarnation (another topic id): Kafka has none of them.
        incarnation = ["topic", "topic_id", "partition"]
        kafka_floor = kafka_keys.groupBy(*incarnation).agg(F.min("offset").alias("floor"))
        bronze_in_kafka_range = bronze_keys.join(kafka_floor, incarnation).where("offset >= floor")
        bronze_distinct = bronze_keys.distinct()
        parsed_keys = silver_keys.unionByName(quarantine_keys)
        newest_quarantined = _newest_quarantined_percent(silver_keys, quarantine_keys)
        gold_diff = _gold_differences(window_aggregates(silver, window_duration, contract), gold, contract)
        report = AuditReport()
        report.counts = {
            "kafka_committed_records": kafka_keys.count(),
            "bronze_rows": bronze_keys.count(),
            "silver_rows": silver_keys.count(),
            "quarantine_rows": quarantine_keys.count(),
            "gold_windows": gold.count(),
            "newest_records_quarantined_percent": newest_quarantined,
        }
        report.errors = {
            "kafka_records_missing_in_bronze": _missing(kafka_keys, bronze_keys, KAFKA_KEY_COLUMNS),
            "bronze_records_not_committed_in_kafka": _missing(
                bronze_in_kafka_range.select(*KAFKA_KEY_COLUMNS), kafka_keys, KAFKA_KEY_COLUMNS
            ),
            "bronze_records_missing_in_silver_and_quarantine": _missing(
                bronze_distinct, parsed_keys, KAFKA_KEY_COLUMNS
            ),
            "silver_duplicates": _extra_copies(silver_keys),
            "quarantine_duplicates": _extra_copies(quarantine_keys),
            "records_in_both_silver_and_quarantine": silver_keys.join(quarantine_keys, KAFKA_KEY_COLUMNS).count(),
            "silver_or_quarantine_records_not_in_bronze": _missing(parsed_keys, bronze_distinct, KAFKA_KEY_COLUMNS),
            "gold_windows_not_matching_silver": gold_diff.count(),
        }
        report.warnings = {
            # Re-ingestion (e.g. a bronze replay from older offsets) repeats raw
            # records; silver's key dedup absorbs them, so they are not a loss or a double count.
            "bronze_reingested_duplicates": _extra_copies(bronze_keys),
            # Not a loss (quarantine keeps them), but gold no longer grows: a producer changed its events.
            "newest_records_mostly_quarantined": (
                newest_quarantined if newest_quarantined >= 100 * QUARANTINE_ALERT_SHARE else 0
            ),
        }
        return report
    finally:
        for frame in (kafka_keys, bronze_keys, silver_keys, quarantine_keys):
            frame.unpersist()
