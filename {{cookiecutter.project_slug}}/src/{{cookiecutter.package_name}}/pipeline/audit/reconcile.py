"""Reconcile Kafka <-> bronze <-> silver + quarantine <-> gold <-> each egress's sink.

Kafka offsets have gaps (transaction markers, aborted records, compaction), so
the audit compares against the committed records that exist, read back with
read_committed, never against offset arithmetic. Content is compared too: each
bronze record's key and value against Kafka's (a digest), and silver and
quarantine against bronze parsed again.

The pipeline may keep running: the audit reads a cut (cut.py), how far each
stream had got by its checkpoint and its tables, and checks each stream against
exactly what it had consumed; records after the cut are in flight, not missing.
A bound (the last N bronze batches, or records since a time) keeps it cheap on a
large lakehouse: Kafka is read over that range only, the tables are read through
filters their statistics prune on, and gold over the windows those records touch.
On a compacted topic, a bronze record Kafka no longer has is accounted for when a
later record has its key, or when it is a tombstone. Records Kafka deleted before
bronze read them cannot be read from anywhere: the audit reports the offsets
someone accepted as lost (kafka/retention.py) as a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..bronze import with_topic_ids
from ..config import Config, duration_seconds
from ..contract import WINDOW_START, Contract, quarantine_label_column
from ..dataset import Aggregate, AggregateKind, Dataset, Gold
from ..datasets import config_of
from ..datasets.events import DATASET as EVENTS_DATASET
from ..datasets.events import EVENTS
from ..dedup import mark_business_key_duplicates
from ..delta.tables import KAFKA_KEY_COLUMNS, Lakehouse, check_schema, declared_gold, table_schemas
from ..egress import GOLD_VERSION, configured, target
from ..formats.registry import WriterSchemas
from ..gold import distinct_values, window_aggregates, window_of
from ..kafka import retention
from ..kafka.clients import bootstrap_servers, compacted_topics, describe_sources, spark_security_options
from ..kafka.identity import recorded_compacted
from ..monitoring import QUARANTINE_ALERT_SHARE
from ..silver import (
    first_per_kafka_record,
    parse_events,
    parse_records,
    quarantined_records,
    schemas_for,
    valid_events,
)
from .cut import Bound, Consumed, Cut, take_cut, touched_windows
from .findings import Finding

KAFKA_RECORD = "topic string, topic_id string, partition int, offset long, key binary, value binary"


@dataclass
class AuditReport:
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    warnings: dict[str, int] = field(default_factory=dict)
    cut: dict = field(default_factory=dict)
    # The quarantined records of the cut by their reason's label (``contract.quarantine_label``).
    quarantine_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(self.errors.values())

    def as_dict(self) -> dict:
        return {
            "verdict": "clean" if self.clean else "FAILED",
            "counts": self.counts,
            "errors": self.errors,
            "warnings": self.warnings,
            "quarantine_by_reason": self.quarantine_by_reason,
            "cut": self.cut,
        }


# Records per partition the quarantine signal looks at.
NEWEST = 1000


def committed_kafka_records(spark: SparkSession, config: Config, cut: Cut, topic_ids: dict[str, str]) -> DataFrame:
    """Coordinates (each topic's current id from ``topic_ids``), key and value of the records in the cut's range."""
    assigned, starting, ending = cut.kafka_offsets()
    if not assigned:
        # Bronze has read nothing yet, or nothing lies in the bound.
        return spark.createDataFrame([], KAFKA_RECORD)
    rows = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers(config))
        # The partitions in the range only: `assign` with offsets for exactly those.
        .option("assign", assigned)
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .options(**spark_security_options(config))
        .load()
    )
    return with_topic_ids(rows, topic_ids).select(*KAFKA_KEY_COLUMNS, "key", "value")


def run_audit(
    spark: SparkSession,
    config: Config,
    dataset: Dataset = EVENTS_DATASET,
    bound: Bound | None = None,
    environ: Mapping[str, str] | None = None,
) -> AuditReport:
    """Reconcile ``dataset``'s tables with its Kafka topics at a cut of the (perhaps running) pipeline.

    Each of its golds is recomputed from silver as its stream had read it; ``bound`` narrows the audit
    to bronze's last batches or to records since a time. Each egress stream that publishes one of its
    golds is audited with it. A dataset's topics are read as the pipeline's
    processes read them, with the overrides ``environ`` holds (default os.environ).

    Example::

        run_audit(spark, config, bound=Bound(last_batches=20)).clean
    """
    bound = Bound() if bound is None else bound
    config = config_of(config, dataset, environ)
    lakehouse = Lakehouse(config.lakehouse_root)
    contract, schemas = dataset.contract, table_schemas(dataset)
    published = {name: target(config, name) for name in configured(config)}
    egresses = {name: module for name, module in configured(config).items() if published[name].dataset == dataset}
    cut = take_cut(spark, config, lakehouse, bound, {name: published[name].gold_table for name in egresses}, dataset)

    def table(name: str, read: Consumed | None = None) -> DataFrame:
        version = cut.versions.get(name) if read is None else read.whole
        reader = spark.read.format("delta")
        if version is not None and version >= 0:
            # Pinned: every query of the audit sees the same version, whatever commits meanwhile.
            reader = reader.option("versionAsOf", version)
        rows = reader.load(lakehouse.table(name))
        if read is None:
            # Tables of another contract would fail obscurely, or compare the wrong columns.
            check_schema(name, lakehouse.table(name), schemas[name], rows.schema)
        return rows.where(F.lit(False)) if version is not None and version < 0 else rows

    # In layer order: a lakehouse of another contract is named by its first table that differs.
    layers = (dataset.bronze, dataset.silver, dataset.quarantine)
    tables = {name: table(name) for name in (*layers, *(dataset.gold_table(gold) for gold in dataset.golds))}
    topic_ids = describe_sources(config, list(config.kafka.topics), cluster=False).topic_ids
    in_range = cut.rows_in_range(topic_ids)
    bronze, silver, quarantine = (in_range(tables[name]) for name in layers)
    kafka = committed_kafka_records(spark, config, cut, topic_ids)
    # Compacted now, or found compacted by bronze before (a policy set back since): Kafka may have removed
    # records bronze holds, as compaction does.
    compacted_now = compacted_topics(config, list(topic_ids))
    compacted = compacted_now | (recorded_compacted(spark, lakehouse, dataset) & set(topic_ids))
    report = reconcile(
        kafka,
        bronze,
        silver,
        quarantine,
        None,
        config.gold_window,
        contract,
        bronze_read=in_range(table(dataset.bronze, cut.silver_read)),
        compacted=compacted,
        kafka_log_start=cut.kafka_log_start,
    )
    report.cut = cut.as_dict()
    report.quarantine_by_reason = quarantine_reasons(quarantine)
    # A compacted topic removes a record once a later one has its key: what it removed before bronze read
    # it is gone from Kafka and was never in bronze, so no one can count it. Named in kafka.compacted_topics,
    # or compacted once and set back (both ways out of bronze's refusal), a warning; compacted now and not
    # named, a check the audit cannot make.
    undeclared = compacted_now - set(config.kafka.compacted_topics)
    accepted = compacted - undeclared
    if accepted:
        report.warnings[Finding.COMPACTED_TOPICS_ACCEPTED] = len(accepted)
    if undeclared:
        report.errors[Finding.COMPACTED_TOPICS_NOT_DECLARED] = len(undeclared)
    lost = retention.lost_offsets(spark, lakehouse, dataset)
    if lost:
        # Kafka deleted them before bronze read them, and someone accepted it (kafka/retention.py): reported
        # as offsets, since the records are gone and some offsets were transaction markers.
        report.warnings[Finding.KAFKA_OFFSETS_ACCEPTED_AS_LOST] = lost
    # A business key's first record may lie before a bounded range: silver's rows outside it were kept there.
    kept_before = None if bound.whole else _outside(tables[dataset.silver], silver)
    writers = schemas_for(config, dataset)
    report.errors.update(
        compare_content(kafka, bronze, silver, quarantine, dataset=dataset, kept_before=kept_before, writers=writers)
    )
    # Each gold against silver as its stream had read it. A check the audit cannot make fails the verdict:
    # gold and the egresses read whole versions (WHOLE_VERSIONS), so a batch ending inside one is a
    # checkpoint written otherwise (without that setting, or by hand): the stream's next batch moves past it.
    report.errors[Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER] = 0
    report.errors[Finding.GOLD_DISTINCT_VALUES_NOT_MATCHING_SILVER] = 0
    report.counts["gold_windows"] = 0

    @cache
    def windows_of(gold: Gold):
        # The windows of ``gold`` the bounded records touched, in silver as its stream had read it: one job
        # per gold, for its own check and the egresses' of the first gold.
        silver_read = in_range(table(dataset.silver, cut.gold_reads[gold.name]))
        return touched_windows(silver_read, window_of(gold, config.gold_window), contract, bound.whole)

    for gold in dataset.golds:
        read = cut.gold_reads[gold.name]
        if not read.exact:
            report.errors[Finding.GOLD_NOT_AUDITED] = report.errors.get(Finding.GOLD_NOT_AUDITED, 0) + 1
            continue
        window = window_of(gold, config.gold_window)
        silver_then = table(dataset.silver, read)
        windows = windows_of(gold)
        values = {
            aggregate.column: windows(table(dataset.values_table(gold, aggregate)), WINDOW_START)
            for aggregate in gold.aggregates
            if aggregate.kind is AggregateKind.DISTINCT
        }
        found = check_gold(
            windows(tables[dataset.gold_table(gold)], WINDOW_START),
            windows(silver_then, contract.event_time),
            window,
            contract,
            gold,
            values,
        )
        for name, count in found.items():
            (report.counts if name == "gold_windows" else report.errors)[name] += count
        if len(dataset.golds) > 1:
            report.counts.update({f"{dataset.gold_table(gold)}_{name}": count for name, count in found.items()})
    for name, module in egresses.items():
        read = cut.egress_read[name]
        if not read.exact:
            report.errors[Finding.EGRESS_NOT_AUDITED.of(name)] = 1
            continue
        each, windows = published[name], windows_of(published[name].gold)
        gold_then = windows(table(each.gold_table, read), WINDOW_START)
        gold_now = windows(tables[each.gold_table], WINDOW_START)
        mirror = windows(module.read_back(spark, config, each), WINDOW_START)
        reconcile_egress(
            report, name, mirror, gold_then, contract, through=read.whole, gold_now=gold_now, published=each.gold
        )
        report.errors.update(module.audit_errors(spark, config, each))
    return report


def _outside(rows: DataFrame, in_range: DataFrame) -> DataFrame:
    """``rows`` whose Kafka record is not among ``in_range``'s."""
    return rows.join(in_range.select(*KAFKA_KEY_COLUMNS), KAFKA_KEY_COLUMNS, "left_anti")


# How far an approximate distinct count may be from the exact count, relative to it: three standard errors
# of Spark's HyperLogLog sketch at its lgConfigK of 12 (about 1.6 % each), rounded up to whole values.
APPROX_DISTINCT_TOLERANCE = 0.05


def check_gold(
    gold_rows: DataFrame,
    silver_rows: DataFrame,
    window_duration: str,
    contract: Contract,
    gold: Gold | None = None,
    values: dict[str, DataFrame] | None = None,
) -> dict[str, int]:
    """Gold against silver, in one Spark job: ``gold_windows`` (the rows), the rows that differ from
    ``silver_rows`` aggregated again (an approximate distinct count may be off by ``APPROX_DISTINCT_TOLERANCE``
    of the exact count), and the rows of each exact distinct count's table of values (``values``, by
    column) that differ from silver's distinct values.

    Example::

        check_gold(gold, silver, "10 minutes", ORDERS, by_shop, {"customer_distinct": values})
    """
    gold = declared_gold(contract, gold)
    values = values or {}
    wanted = {a.column for a in gold.aggregates if a.kind is AggregateKind.DISTINCT}
    if set(values) != wanted:
        raise ValueError(f"values must hold the tables of values of {sorted(wanted)}, not {sorted(values)}")
    # The exact count stands in for the estimate, which is then compared within the tolerance.
    exact = Gold(
        gold.name,
        tuple(
            Aggregate(AggregateKind.DISTINCT, a.field, a.column) if a.kind is AggregateKind.APPROX_DISTINCT else a
            for a in gold.aggregates
        ),
        gold.dimensions,
        gold.window,
    )
    expected = window_aggregates(silver_rows, window_duration, contract, exact)
    checks = {
        "gold_windows": gold_rows,
        Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER: _gold_differences(expected, gold_rows.select(*gold.columns), gold),
    }
    if values:
        held = distinct_values(silver_rows, window_duration, contract, gold)
        differing = [
            _symmetric_difference(held[column], rows.select(*held[column].columns)) for column, rows in values.items()
        ]
        checks[Finding.GOLD_DISTINCT_VALUES_NOT_MATCHING_SILVER] = reduce(DataFrame.unionByName, differing)
    found = count_rows(checks)
    found.setdefault(Finding.GOLD_DISTINCT_VALUES_NOT_MATCHING_SILVER, 0)
    return found


def _symmetric_difference(expected: DataFrame, found: DataFrame) -> DataFrame:
    # exceptAll compares nulls as equal: an optional dimension's null is a value of its own.
    return expected.exceptAll(found).unionByName(found.exceptAll(expected))


def reconcile_egress(
    report: AuditReport,
    name: str,
    mirror: DataFrame,
    gold: DataFrame,
    contract: Contract,
    through: int | None = None,
    gold_now: DataFrame | None = None,
    published: Gold | None = None,
) -> None:
    """An egress's sink, read back as its consumers see it, must equal ``gold``'s rows row for row: the rows
    of the gold it publishes (``published``; None: the contract's own), sketches aside.

    With ``through`` (the last gold version the egress had consumed), ``gold`` is gold as of that
    version: rows the egress wrote from later versions are in flight, and so is a row gold has
    dropped since (``gold_now`` lacks it), which the egress may already have deleted.
    """
    published = declared_gold(contract, published)
    columns, key = published.columns, published.key
    not_matching = Finding.EGRESS_ROWS_NOT_MATCHING_GOLD.of(name)
    gold = gold.select(*columns)
    # Read back once (a whole topic folded, or a table over JDBC) for the checks' one job.
    read_back = mirror.persist()
    try:
        checks = {f"{name}_rows": read_back}
        mirror = read_back
        if through is not None:
            later = mirror.where(F.col(GOLD_VERSION) > through).select(*key)
            dropped = gold.select(*key).exceptAll(gold_now.select(*key))
            in_flight = later.unionByName(dropped).distinct()
            checks[f"{name}_rows_in_flight"] = later
            mirror, gold = (
                _without(rows, in_flight, key) for rows in (mirror.where(F.col(GOLD_VERSION) <= through), gold)
            )
        checks[not_matching] = _gold_differences(mirror.select(*columns), gold, published)
        counted = count_rows(checks)
    finally:
        read_back.unpersist()
    report.errors[not_matching] = counted.pop(not_matching)
    report.counts.update(counted)


def _without(rows: DataFrame, keys: DataFrame, key: tuple[str, ...]) -> DataFrame:
    # Null-safe: an optional dimension's null is a value of its own.
    same = reduce(lambda left, right: left & right, [F.col(f"r.{c}").eqNullSafe(F.col(f"k.{c}")) for c in key])
    return rows.alias("r").join(keys.alias("k"), same, "left_anti").select("r.*")


def _gold_differences(expected: DataFrame, gold_rows: DataFrame, gold: Gold) -> DataFrame:
    """Rows of ``gold`` missing, unexpected or with other values than the recomputation ``expected``; an
    approximate distinct count against the exact one, within ``APPROX_DISTINCT_TOLERANCE``."""
    # Null-safe throughout: an optional dimension's null is a value of its own.
    same_key = reduce(lambda left, right: left & right, [F.col(f"e.{c}").eqNullSafe(F.col(f"g.{c}")) for c in gold.key])
    differs = [
        ~F.col(f"e.{a.column}").eqNullSafe(F.col(f"g.{a.column}"))
        for a in gold.aggregates
        if a.kind is not AggregateKind.APPROX_DISTINCT
    ]
    differs += [
        F.coalesce(
            F.abs(F.col(f"e.{a.column}") - F.col(f"g.{a.column}"))
            > F.ceil(F.col(f"e.{a.column}") * APPROX_DISTINCT_TOLERANCE),
            F.lit(True),
        )
        for a in gold.aggregates
        if a.kind is AggregateKind.APPROX_DISTINCT
    ]
    joined = expected.alias("e").join(gold_rows.alias("g"), same_key, "full_outer")
    return joined.where(reduce(lambda left, right: left | right, differs))


def compare_content(
    kafka: DataFrame,
    bronze: DataFrame,
    silver: DataFrame,
    quarantine: DataFrame,
    contract: Contract = EVENTS,
    *,
    dataset: Dataset | None = None,
    kept_before: DataFrame | None = None,
    writers: WriterSchemas | None = None,
) -> dict[str, int]:
    """Content, not only coordinates: bronze's key and value against Kafka's, silver and quarantine parsed again.

    A record rewritten in place (a table edited by hand, a bad repair) keeps its coordinates,
    so the coordinate checks cannot see it. With ``dataset`` (its contract, instead of ``contract``) and
    its business key, bronze's records are judged again as silver judged them: the first of each key kept,
    the others quarantined naming it; ``kept_before`` holds silver's rows kept before these records (a
    bounded audit's records outside its range). A dataset not in JSON is read with its writer schemas from
    ``writers`` (``silver.schemas_for``).

    Example::

        compare_content(kafka, bronze, silver, quarantine)[Finding.SILVER_ROWS_NOT_AS_PARSED_FROM_BRONZE]  # 0
    """
    missing = {"key", "value"} - set(kafka.columns)
    if missing:
        raise ValueError(f"kafka must hold the records' key and value; missing {sorted(missing)}")
    contract = contract if dataset is None else dataset.contract

    def digests(rows: DataFrame) -> DataFrame:
        return rows.select(*KAFKA_KEY_COLUMNS, F.xxhash64("key", "value").alias("digest"))

    in_kafka = digests(kafka).withColumnRenamed("digest", "kafka_digest")
    first = first_per_kafka_record(bronze)
    reparsed = parse_events(first, contract) if dataset is None else parse_records(first, dataset, writers, bronze)
    if dataset is not None and dataset.dedup_key:
        reparsed = judged_duplicates(reparsed, dataset, kept_before)
    return count_rows(
        {
            Finding.BRONZE_RECORDS_NOT_AS_IN_KAFKA: digests(bronze)
            .join(in_kafka, KAFKA_KEY_COLUMNS)
            .where(F.col("digest") != F.col("kafka_digest")),
            Finding.SILVER_ROWS_NOT_AS_PARSED_FROM_BRONZE: _not_in(silver, valid_events(reparsed, contract)),
            Finding.QUARANTINE_ROWS_NOT_AS_PARSED_FROM_BRONZE: _not_in(quarantine, quarantined_records(reparsed)),
        }
    )


def judged_duplicates(reparsed: DataFrame, dataset: Dataset, kept_before: DataFrame | None = None) -> DataFrame:
    """``reparsed`` with each record whose business key a record kept before it has marked as a duplicate,
    as silver marks it (``dedup.mark_business_key_duplicates``); ``kept_before``: silver's rows kept earlier.

    Example::

        judged_duplicates(parse_events(bronze, ORDERS.contract), ORDERS)
    """
    if not isinstance(dataset, Dataset) or not dataset.dedup_key:
        raise ValueError(f"dataset must be a Dataset with a dedup_key, not {dataset!r}")
    held_columns = [*KAFKA_KEY_COLUMNS, "ingest_time", *dataset.dedup_key, dataset.contract.event_time]
    held = reparsed.where(F.lit(False)).select(*held_columns) if kept_before is None else kept_before
    horizon_s = None
    if dataset.dedup_horizon is not None:
        horizon_s = duration_seconds(dataset.dedup_horizon, f"dataset {dataset.name}: dedup_horizon")
    return mark_business_key_duplicates(
        reparsed, held.select(*held_columns), dataset.dedup_key, dataset.contract.event_time, horizon_s
    )


def quarantine_reasons(quarantine: DataFrame) -> dict[str, int]:
    """The rows of ``quarantine`` counted by their reason's label (``contract.quarantine_label``: a bounded
    set, where reasons naming a JSON type or a record are not), most frequent first.

    Example::

        quarantine_reasons(quarantine)  # {"expectation total_not_negative not met": 3, ...}
    """
    label = quarantine_label_column(F.col("reason")).alias("label")
    counts = quarantine.groupBy(label).count().orderBy(F.desc("count"), "label").collect()
    return {row.label: row["count"] for row in counts}


def _not_in(rows: DataFrame, expected: DataFrame) -> DataFrame:
    return rows.exceptAll(expected.select(*rows.columns))


def count_rows(checks: dict[str, DataFrame]) -> dict[str, int]:
    """The rows of each DataFrame, counted in one Spark job: a count each would schedule, plan and read
    its tables once per check, and an audit is mostly such fixed costs.

    Example::

        count_rows({"gold_windows": gold, Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER: differences})
    """
    if not checks:
        raise ValueError("checks must name at least one DataFrame to count")
    tagged = reduce(DataFrame.unionByName, [rows.select(F.lit(name).alias("check")) for name, rows in checks.items()])
    found = {row["check"]: row["count"] for row in tagged.groupBy("check").count().collect()}
    return {name: found.get(name, 0) for name in checks}


def _newest_quarantined_percent(copies: DataFrame, newest: int = NEWEST) -> int:
    """The share of the newest records of each partition that silver or quarantine holds, in quarantine.

    From ``copies_per_record`` (persisted by ``reconcile``): silver and quarantine are not read again.
    """
    # The newest offsets of each partition: a producer that broke recently shows, whatever came before.
    by_partition = Window.partitionBy(*INCARNATION).orderBy(F.desc("offset"))
    share = (
        copies.where((F.col("silver") > 0) | (F.col("quarantine") > 0))
        .withColumn("rank", F.row_number().over(by_partition))
        .where(F.col("rank") <= newest)
        .agg(F.avg((F.col("quarantine") > 0).cast("int")))
        .first()[0]
    )
    return 0 if share is None else round(100 * share)


# The sides of the coordinate checks: each counts the copies it holds of a Kafka record.
SIDES = ("kafka", "bronze", "consumed", "silver", "quarantine")
# A partition of one incarnation of a topic (a topic deleted and created again has another id).
INCARNATION = ["topic", "topic_id", "partition"]


def copies_per_record(sides: dict[str, DataFrame]) -> DataFrame:
    """One row per Kafka record (its coordinates) seen on any side, with the copies each side holds.

    Every coordinate check of the audit is a sum over this one table, so the audit reads each side
    once and runs one job for all of them instead of a join per check.

    Example::

        copies_per_record({"kafka": kafka_keys, "bronze": bronze_keys, ...}).where("bronze = 0 AND kafka > 0")
    """
    if set(sides) != set(SIDES):
        raise ValueError(f"sides must be exactly {SIDES}, not {sorted(sides)}")
    tagged = reduce(
        DataFrame.unionByName,
        [sides[name].select(*KAFKA_KEY_COLUMNS, F.lit(name).alias("side")) for name in SIDES],
    )
    return tagged.groupBy(*KAFKA_KEY_COLUMNS).agg(
        *[F.sum(F.when(F.col("side") == name, 1).otherwise(0)).alias(name) for name in SIDES]
    )


def reconcile(
    kafka: DataFrame,
    bronze: DataFrame,
    silver: DataFrame,
    quarantine: DataFrame,
    gold: DataFrame | None,
    window_duration: str,
    contract: Contract = EVENTS,
    *,
    bronze_read: DataFrame | None = None,
    silver_read: DataFrame | None = None,
    compacted: set[str] | frozenset[str] = frozenset(),
    kafka_log_start: dict[tuple[str, int], int] | None = None,
) -> AuditReport:
    """Every check of the audit, on DataFrames: usable on planted data in tests.

    ``bronze_read`` is bronze as silver had consumed it and ``silver_read`` silver as gold had
    (default: the tables as given, for a drained pipeline). ``gold`` None leaves gold unchecked.
    ``compacted`` names compacted topics, whose records Kafka removes once a later one has their key;
    ``kafka_log_start`` each partition's first offset (below it retention deleted; default: the first read).

    Example::

        reconcile(kafka, bronze, silver, quarantine, gold, "1 minute").errors[Finding.SILVER_DUPLICATES]  # 0
    """
    if compacted and not {"key", "value"} <= set(kafka.columns) & set(bronze.columns):
        raise ValueError("kafka and bronze must hold key and value to account for compacted topics")
    kafka_keys = kafka.select(*KAFKA_KEY_COLUMNS)
    bronze_keys = bronze.select(*KAFKA_KEY_COLUMNS)
    silver_keys = silver.select(*KAFKA_KEY_COLUMNS)
    quarantine_keys = quarantine.select(*KAFKA_KEY_COLUMNS)
    consumed = bronze_keys if bronze_read is None else bronze_read.select(*KAFKA_KEY_COLUMNS)
    copies = copies_per_record(
        {
            "kafka": kafka_keys,
            "bronze": bronze_keys,
            "consumed": consumed,
            "silver": silver_keys,
            "quarantine": quarantine_keys,
        }
    ).persist()
    try:
        absent = _bronze_not_in_kafka(copies, kafka_log_start)
        parsed = F.col("silver") + F.col("quarantine")

        def total(column, where=None):
            counted = column if where is None else F.when(where, column).otherwise(0)
            return F.coalesce(F.sum(counted), F.lit(0))

        sums = absent.agg(
            total(F.col("kafka")).alias("kafka_committed_records"),
            total(F.col("bronze")).alias("bronze_rows"),
            total(F.col("silver")).alias("silver_rows"),
            total(F.col("quarantine")).alias("quarantine_rows"),
            total(F.col("kafka"), F.col("bronze") == 0).alias(Finding.KAFKA_RECORDS_MISSING_IN_BRONZE),
            total(F.col("bronze"), F.col("absent")).alias(Finding.BRONZE_RECORDS_NOT_COMMITTED_IN_KAFKA),
            F.count_if((F.col("consumed") > 0) & (parsed == 0)).alias(
                Finding.BRONZE_RECORDS_MISSING_IN_SILVER_AND_QUARANTINE
            ),
            total(F.col("silver") - 1, F.col("silver") > 0).alias(Finding.SILVER_DUPLICATES),
            total(F.col("quarantine") - 1, F.col("quarantine") > 0).alias(Finding.QUARANTINE_DUPLICATES),
            total(F.col("silver") * F.col("quarantine")).alias(Finding.RECORDS_IN_BOTH_SILVER_AND_QUARANTINE),
            total(parsed, F.col("bronze") == 0).alias(Finding.SILVER_OR_QUARANTINE_RECORDS_NOT_IN_BRONZE),
            total(F.col("bronze") - 1, F.col("bronze") > 0).alias(Finding.BRONZE_DUPLICATES),
        ).first()
        not_committed, compacted_away = sums[Finding.BRONZE_RECORDS_NOT_COMMITTED_IN_KAFKA], 0
        if compacted and not_committed:
            not_committed, compacted_away = _explained_by_compaction(kafka, bronze, absent, compacted)
        newest_quarantined = _newest_quarantined_percent(copies)
        report = AuditReport()
        report.counts = {
            "kafka_committed_records": sums["kafka_committed_records"],
            "bronze_rows": sums["bronze_rows"],
            "silver_rows": sums["silver_rows"],
            "quarantine_rows": sums["quarantine_rows"],
            "newest_records_quarantined_percent": newest_quarantined,
            "bronze_records_compacted_away_in_kafka": compacted_away,
        }
        # Bronze's own writes are idempotent per batch (Delta's txnAppId/txnVersion) and every start
        # resumes after the rows it holds: a second copy in bronze came from outside, or from a defect.
        # Silver keeps one copy per record, so that is bronze's error alone.
        summed = (
            Finding.KAFKA_RECORDS_MISSING_IN_BRONZE,
            Finding.BRONZE_DUPLICATES,
            Finding.BRONZE_RECORDS_MISSING_IN_SILVER_AND_QUARANTINE,
            Finding.SILVER_DUPLICATES,
            Finding.QUARANTINE_DUPLICATES,
            Finding.RECORDS_IN_BOTH_SILVER_AND_QUARANTINE,
            Finding.SILVER_OR_QUARANTINE_RECORDS_NOT_IN_BRONZE,
        )
        report.errors = {finding: sums[finding] for finding in summed}
        report.errors[Finding.BRONZE_RECORDS_NOT_COMMITTED_IN_KAFKA] = not_committed
        if gold is not None:
            found = check_gold(gold, silver if silver_read is None else silver_read, window_duration, contract)
            report.counts["gold_windows"] = found["gold_windows"]
            report.errors[Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER] = found[Finding.GOLD_WINDOWS_NOT_MATCHING_SILVER]
        report.warnings = {
            # Not a loss (quarantine keeps them), but gold no longer grows: a producer changed its events.
            Finding.NEWEST_RECORDS_MOSTLY_QUARANTINED: (
                newest_quarantined if newest_quarantined >= 100 * QUARANTINE_ALERT_SHARE else 0
            ),
        }
        return report
    finally:
        copies.unpersist()


def _bronze_not_in_kafka(copies: DataFrame, log_start: dict[tuple[str, int], int] | None) -> DataFrame:
    """``copies`` with ``absent``: bronze holds the record, Kafka should and does not."""
    # Records Kafka has already deleted by retention stay in bronze legitimately, and so do
    # the records of a topic's earlier incarnation (another topic id): Kafka has none of them.
    floor = F.min(F.when(F.col("kafka") > 0, F.col("offset"))).over(Window.partitionBy(*INCARNATION))
    rows = copies.withColumn("floor", floor)
    if log_start:
        # Compaction leaves gaps from the log's start on: the floor is where retention stopped.
        starts = copies.sparkSession.createDataFrame(
            [(topic, partition, offset) for (topic, partition), offset in log_start.items()],
            "topic string, partition int, log_start long",
        )
        # The log start names a partition, not an incarnation: an incarnation Kafka holds nothing
        # of keeps no floor (least() would take the log start alone, its nulls skipped).
        rows = rows.join(F.broadcast(starts), ["topic", "partition"], "left").withColumn(
            "floor", F.when(F.col("floor").isNotNull(), F.least("floor", "log_start"))
        )
    # An incarnation Kafka holds nothing of has no floor: none of its records is expected there.
    absent = (F.col("bronze") > 0) & (F.col("kafka") == 0) & F.coalesce(F.col("offset") >= F.col("floor"), F.lit(False))
    return rows.withColumn("absent", absent)


def _explained_by_compaction(kafka: DataFrame, bronze: DataFrame, absent: DataFrame, compacted) -> tuple[int, int]:
    """(bronze records Kafka should hold and does not, those a compacted topic removed legitimately)."""
    # Compaction keeps the newest record of each key, and drops a tombstone (null value) after a while.
    by_key = [*INCARNATION, "key"]
    newest = (
        bronze.select(*by_key, "offset")
        .unionByName(kafka.select(*by_key, "offset"))
        .groupBy(*by_key)
        .agg(F.max("offset").alias("newest"))
    )
    missing = absent.where("absent").select(*KAFKA_KEY_COLUMNS, "bronze")
    explained = (
        missing.where(F.col("topic").isin(*sorted(compacted)))
        .select(*KAFKA_KEY_COLUMNS)
        .join(bronze.select(*KAFKA_KEY_COLUMNS, "key", "value"), KAFKA_KEY_COLUMNS)
        .join(newest, by_key, "left")
        # Every copy bronze holds at those coordinates must be explained.
        .groupBy(*KAFKA_KEY_COLUMNS)
        .agg(F.min(F.col("value").isNull() | (F.col("offset") < F.coalesce("newest", "offset"))).alias("ok"))
        .where("ok")
        .select(*KAFKA_KEY_COLUMNS)
    )
    left = missing.join(explained, KAFKA_KEY_COLUMNS, "left_anti").agg(F.coalesce(F.sum("bronze"), F.lit(0)))
    return left.first()[0], explained.count()
