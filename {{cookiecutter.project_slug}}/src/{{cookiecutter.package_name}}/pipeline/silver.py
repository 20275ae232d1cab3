"""Silver: bronze records parsed, typed and deduplicated; malformed ones quarantined with their reason.

The source is bronze's Delta stream (its versions are the offsets in the checkpoint). Each
batch keeps one copy per Kafka record (topic, topic id, partition, offset), parses the value
once into a VARIANT and reads every field of the event contract (``contract.py``) from it; a
record that fails a check goes to the quarantine table with the first reason it failed, never
dropped. The sink inserts only the Kafka records a table does not hold yet, in a commit tagged
with (stream id, batch id): an append when no file of the table may hold a row within the
batch's offset ranges (the steady state), else a MERGE restricted to those ranges, so a replay or a
re-ingested record adds nothing and the cost follows the batch, not the table.

A dataset that declares a business key (``dedup_key``) also keeps one record per key: a later one
goes to quarantine as ``duplicate of <topic>/<partition>/<offset>`` (``dedup.py``), judged against
silver's rows of the batch's keys (those near enough in event time, with a ``dedup_horizon``).

A reset rebuilds silver and quarantine from bronze under the current contract
(``rebuilt_rows``; the mechanism is in ``recovery/rebuild.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from .config import LOCAL_REGISTRY, Config, ConfigError, duration_seconds
from .contract import (
    EVENT_TIME_RANGE,
    NOT_AN_OBJECT,
    NOT_JSON,
    NOT_UTF8,
    TOMBSTONE,
    Contract,
    Field,
    Kind,
    Rule,
    quarantine_label_column,
)
from .dataset import Dataset
from .datasets.events import DATASET as EVENTS_DATASET
from .datasets.events import EVENTS
from .dedup import CALENDAR_SPAN_S, mark_business_key_duplicates
from .delta.tables import KAFKA_KEY_COLUMNS, KAFKA_PARTITION_COLUMNS, Lakehouse, dataset_streams, may_hold
from .delta.writes import append_idempotent, delta_transaction, retry_conflicts, warm_up_state
from .expectations import (
    ExpectationFailed,
    counted,
    failure_aggregates,
    failures,
    judged,
    refuse_failed,
    with_kafka_time,
)
from .formats import Format, protobuf
from .formats.avro import parse_avro, resolve, schema_ids
from .formats.protobuf import message_paths, parse_protobuf
from .formats.registry import RegistryAccess, RegistryUnavailable, WriterSchemas, writer_schemas
from .instants import to_micros
from .monitoring import report_expectations, report_quarantine
from .recovery import checkpoints
from .recovery.crash_points import BETWEEN_SINK_COMMITS, crash_points, reach
from .recovery.lease import check_held
from .recovery.rebuild import source_stream
from .recovery.sink_progress import record_sink_versions
from .session.codegen import SMALL_BRONZE_BATCH, evaluate_for_delta_batch

# The sample contract demands an explicit offset: a bare local time is ambiguous.
ISO_8601_WITH_OFFSET = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
# JSON types as schema_of_variant names them.
NUMERIC_JSON_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\))$"
# Numbers without a fraction: parse_json keeps 3.0, and integers beyond 64 bits, as DECIMAL(p,0).
INTEGER_JSON_TYPES = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,0\))$"
# A DECIMAL field's value is also read this wide: if the two differ, reading it
# into the field's type rounded it, and the record is refused.
WIDE_DECIMAL_SCALE = 18


def first_per_kafka_record(rows: DataFrame) -> DataFrame:
    """One row per Kafka record (topic, topic id, partition, offset): the earliest ingested copy.

    Bronze can hold the same Kafka record twice after a re-ingestion; the copies
    are identical but for ingest_time, and picking the earliest keeps the choice
    deterministic when a batch is replayed.
    """
    earliest_first = Window.partitionBy(*KAFKA_KEY_COLUMNS).orderBy(F.col("ingest_time").asc())
    return rows.withColumn("_copy", F.row_number().over(earliest_first)).where("_copy = 1").drop("_copy")


def _json_type(field: Field) -> str:
    """Working column: the field's JSON type as schema_of_variant names it (null if absent)."""
    return f"_json_type_{field.name}"


def _text(field: Field) -> str:
    """Working column: a TIMESTAMP field's JSON string."""
    return f"_text_{field.name}"


def _wide(field: Field) -> str:
    """Working column: a DECIMAL field's value read with more digits than it keeps."""
    return f"_wide_{field.name}"


def _read_fields(contract: Contract) -> dict[str, Column]:
    """Each field's JSON type and value, read out of the parsed document ``_doc``.

    try_variant_get never fails a batch: a value that cannot be read is null, and
    the checks tell why.
    """
    doc = F.col("_doc")
    columns: dict[str, Column] = {}
    for field in contract.fields:
        path = f"$.{field.name}"
        columns[_json_type(field)] = F.schema_of_variant(F.try_variant_get(doc, path, "variant"))
        if field.kind is Kind.TIMESTAMP:
            columns[_text(field)] = F.try_variant_get(doc, path, "string")
        else:
            columns[field.name] = F.try_variant_get(doc, path, field.spark_type.simpleString())
        if field.kind is Kind.DECIMAL:
            wide_scale = max(WIDE_DECIMAL_SCALE, field.scale)
            columns[_wide(field)] = F.try_variant_get(doc, path, f"decimal(38,{wide_scale})")
    return columns


def _failed(rule: Rule, field: Field) -> Column:
    """True when ``field`` of a record fails ``rule``."""
    json_type, value = F.col(_json_type(field)), F.col(field.name)
    absent = json_type.isNull() | (json_type == "VOID")
    match rule:
        case Rule.MISSING:
            return absent
        case Rule.NOT_A_STRING:
            failed = json_type != "STRING"
        case Rule.EMPTY:
            failed = F.length(F.trim(value)) == 0
        case Rule.NOT_A_TIMESTAMP:
            failed = ~F.col(_text(field)).rlike(ISO_8601_WITH_OFFSET) | value.isNull()
        case Rule.NOT_A_NUMBER:
            failed = ~json_type.rlike(NUMERIC_JSON_TYPES)
        case Rule.NOT_AN_INTEGER:
            failed = ~json_type.rlike(INTEGER_JSON_TYPES)
        case Rule.DOES_NOT_FIT if field.kind is Kind.DECIMAL:
            # A value that would need rounding or overflow is refused, never altered.
            failed = value.isNull() | (value != F.col(_wide(field)))
        case Rule.DOES_NOT_FIT:
            failed = value.isNull()
        case Rule.NOT_A_BOOLEAN:
            failed = json_type != "BOOLEAN"
        case Rule.CONTAINS_NUL:
            failed = F.instr(value, "\u0000") > 0
        case Rule.OUT_OF_RANGE:
            # Compared as microseconds: a TIMESTAMP literal before 1582 would be rebased (``instants``).
            earliest, end = (to_micros(instant) for instant in EVENT_TIME_RANGE)
            failed = ~F.unix_micros(value).between(earliest, end - 1)
    # An optional field that is absent (or JSON null) is valid, and null in silver.
    return ~absent & failed


def _not_an_object(contract: Contract) -> Column:
    """True when the parsed document is not a JSON object (an array, a string, a number...).

    A document holding a field is an object: a path like ``$.event_time`` finds nothing in an array
    or a scalar. So the whole document's schema, which costs about as much as reading two fields, is
    read only for the few records that lack the event time, a field every contract requires (``&``
    evaluates its right side only when its left is true).
    """
    not_object = ~F.schema_of_variant(F.col("_doc")).startswith("OBJECT<")
    return F.col(_json_type(contract.field(contract.event_time))).isNull() & not_object


def _rejection_reason(contract: Contract) -> Column:
    """The first check a record fails, or null for a valid event."""
    checks: list[tuple[Column, Column]] = [
        (F.col("value").isNull(), F.lit(TOMBSTONE)),
        (~F.is_valid_utf8(F.col("value").cast("string")), F.lit(NOT_UTF8)),
        (F.col("_doc").isNull(), F.lit(NOT_JSON)),
        (_not_an_object(contract), F.lit(NOT_AN_OBJECT)),
    ]
    for rule, field in contract.checks():
        reason = F.lit(rule.message(field))
        if rule.appends_json_type:
            reason = F.concat(reason, F.col(_json_type(field)))
        checks.append((_failed(rule, field), reason))
    return F.coalesce(*[F.when(failed, reason) for failed, reason in checks])


def parse_events(
    bronze: DataFrame, contract: Contract = EVENTS, bronze_columns: Sequence[str] | None = None
) -> DataFrame:
    """Bronze rows plus one typed column per contract field and `reason` (null when the event is valid).

    The value is parsed once, into a VARIANT, and every field is read from that. ``bronze_columns``
    (default: all of ``bronze``'s) are the columns of ``bronze`` kept: named, they are not asked of
    ``bronze``, whose plan can then be built where no analysis may run (a query function of Spark
    Declarative Pipelines).

    Example::

        parsed = parse_events(bronze_batch)
    """
    if bronze_columns is not None and (
        isinstance(bronze_columns, str) or not all(isinstance(name, str) and name for name in bronze_columns)
    ):
        raise ValueError(f"bronze_columns must be a sequence of column names, not {bronze_columns!r}")
    read = _read_fields(contract)
    timestamps = {
        field.name: F.try_to_timestamp(F.col(_text(field))) for field in contract.fields if field.kind is Kind.TIMESTAMP
    }
    parsed = (
        bronze.withColumns({"_doc": F.try_parse_json(F.col("value").cast("string"))})
        .withColumns(read)
        .withColumns(timestamps)
        .withColumns({"reason": _rejection_reason(contract)})
    )
    kept = bronze.columns if bronze_columns is None else list(bronze_columns)
    return parsed.select(*kept, *contract.names, "reason")


def parse_records(
    bronze: DataFrame, dataset: Dataset, schemas: WriterSchemas | None = None, ids_of: DataFrame | None = None
) -> DataFrame:
    """Bronze rows plus one typed column per field of ``dataset``'s contract and `reason`, in its format:
    ``parse_events`` for JSON, ``formats.avro.parse_avro`` for Avro, whose writer schemas ``schemas``
    finds (``schemas_for``); a record the contract reads and one of the dataset's quarantining
    expectations refuses has that expectation's reason (``expectations.judged``).
    RegistryUnavailable when the registry does not answer: the batch fails.
    ``ids_of`` (default ``bronze``) is where the batch's schema ids are read: the batch as bronze gave it,
    when ``bronze`` is its copies taken apart by ``first_per_kafka_record``, which would be computed
    twice otherwise.

    Example::

        parsed = parse_records(bronze_batch, ORDERS, schemas_for(config, ORDERS))
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    return judged(_read(bronze, dataset, schemas, ids_of), dataset.expectations)


def _read(bronze: DataFrame, dataset: Dataset, schemas: WriterSchemas | None, ids_of: DataFrame | None) -> DataFrame:
    if dataset.format is Format.JSON:
        return parse_events(bronze, dataset.contract)
    if not isinstance(schemas, WriterSchemas):
        raise ValueError(f"dataset {dataset.name} is in {dataset.format}: its writer schemas come from a registry")
    named = bronze if ids_of is None else ids_of
    if dataset.format is Format.PROTOBUF:
        pairs = message_paths(named)
        writers = schemas.lookup(sorted({schema_id for schema_id, _ in pairs}))
        return parse_protobuf(bronze, dataset.contract, writers, [pair for pair in pairs if pair[1] is not None])
    return parse_avro(bronze, dataset.contract, schemas.lookup(schema_ids(named)))


def schemas_for(config: Config, dataset: Dataset) -> WriterSchemas | None:
    """Where ``dataset``'s writer schemas are looked up: None for JSON, else the registry of
    ``schema_registry.url`` (ConfigError naming it when it is empty).

    Example::

        schemas_for(config, ORDERS)  # WriterSchemas of config.schema_registry.url, or None
    """
    if dataset.format is Format.JSON:
        return None
    url = config.schema_registry.url
    if not url:
        raise ConfigError(
            f"schema_registry.url: dataset {dataset.name} is in {dataset.format}, which names its writer schemas "
            "in a registry: set its URL (SCHEMA_REGISTRY_URL; `local` for the registry of `registry-local start`)"
        )
    if url == LOCAL_REGISTRY:
        # A command resolves "local" only for the datasets it runs (cli/local_servers.py).
        raise ConfigError(
            f"schema_registry.url: is 'local', resolved only for the datasets a command runs, and dataset "
            f"{dataset.name} is not among them: name it in PIPELINE_DATASETS, or set SCHEMA_REGISTRY_URL"
        )
    return writer_schemas(RegistryAccess.of(config.schema_registry))


def check_latest_writers(config: Config, dataset: Dataset) -> None:
    """For a dataset not in JSON: ConfigError when the latest schema of a topic's subject (``<topic>-value``)
    cannot be read into its contract (every record its producers now write would go to quarantine, so the
    stream does not start), or when the registry does not answer.

    Example::

        check_latest_writers(config_of(config, ORDERS), ORDERS)
    """
    schemas = schemas_for(config, dataset)
    if schemas is None:
        return
    for topic in config.kafka.topics:
        subject = f"{topic}-value"
        try:
            latest = schemas.latest(subject)
        except RegistryUnavailable as error:
            raise ConfigError(str(error)) from None
        if latest is None:
            continue
        if dataset.format is Format.PROTOBUF:
            # The message a Confluent serializer names by default: the file's first.
            problem = protobuf.resolve(dataset.contract, latest, "0").problem
        else:
            problem = resolve(dataset.contract, latest).problem
        if problem is not None:
            raise ConfigError(
                f"dataset {dataset.name}: the latest schema of subject {subject} (id {latest.schema_id}) cannot be "
                f"read into its contract ({problem}): every record its producers write now would go to quarantine. "
                f"Change the contract to read it (`describe-schema {subject}` prints its fields) or register a "
                "schema the contract reads, then start again"
            )


def valid_events(parsed: DataFrame, contract: Contract = EVENTS) -> DataFrame:
    """The silver rows: contract fields in declaration order, then the Kafka coordinates.

    Required fields are never null here (a record lacking one has a reason), but
    Spark cannot know it: the columns are nullable in the DataFrame, and the silver
    table's NOT NULL constraints are checked when the rows are written.
    """
    return parsed.where(F.col("reason").isNull()).select(
        *contract.names,
        "topic",
        "topic_id",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "ingest_time",
    )


def quarantined_records(parsed: DataFrame) -> DataFrame:
    return parsed.where(F.col("reason").isNotNull()).select(
        "topic",
        "topic_id",
        "partition",
        "offset",
        F.col("timestamp").alias("kafka_timestamp"),
        "key",
        "value",
        "headers",
        "reason",
        "ingest_time",
    )


def kafka_key_ranges(rows: DataFrame, *aggregates: Column) -> list[Row]:
    """(topic, topic_id, partition, first_offset, last_offset, records, *aggregates) of a batch, per partition."""
    return (
        rows.groupBy("topic", "topic_id", "partition")
        .agg(
            F.min("offset").alias("first_offset"),
            F.max("offset").alias("last_offset"),
            F.count(F.lit(1)).alias("records"),
            *aggregates,
        )
        .collect()
    )


def ranges_and_quarantine_share(
    parsed: DataFrame, stream: str, batch_id: int, dataset: Dataset | None = None
) -> tuple[list[Row], int, int]:
    """A parsed batch's ``kafka_key_ranges`` with its rejected records counted, and the batch's rejected and
    total records; the quarantine share reported for ``stream`` when any was rejected, and the records
    failing each of ``dataset``'s expectations that warns or fails. ExpectationFailed, before anything is
    written, when a record fails one that fails or the batch quarantines more than the dataset's quarantine
    limit. One Spark job (``parsed`` should be cached: the sinks read it again).

    Example::

        ranges, rejected, records = ranges_and_quarantine_share(parsed, "orders_silver", 7, ORDERS_DATASET)
    """
    if not stream:
        raise ValueError("stream must name the stream whose batch this is")
    expectations = () if dataset is None else dataset.expectations
    judged_rows = with_kafka_time(parsed) if counted(expectations) else parsed
    ranges = kafka_key_ranges(judged_rows, F.count("reason").alias("rejected"), *failure_aggregates(expectations))
    rejected, records = sum(r.rejected for r in ranges), sum(r.records for r in ranges)
    reasons = reason_counts(parsed) if rejected else {}
    if rejected:
        report_quarantine(stream, batch_id, records, rejected, reasons)
    if counted(expectations):
        report_expectations(stream, batch_id, failures(ranges, expectations))
        refuse_failed(f"[{stream}] batch {batch_id}", ranges, expectations)
    if dataset is not None and dataset.quarantine_limit is not None:
        dataset.quarantine_limit.check(stream, batch_id, records, rejected, reasons)
    return ranges, rejected, records


def offset_range_predicate(ranges: list[Row], prefix: str = "") -> Column:
    """True for a row of one of the batch's (topic, topic id, partition) within its offset range.

    Only the table's columns and literals: Delta skips every file whose offset statistics fall
    outside the batch, so what it costs follows the batch size, not the table size.

    Example::

        table.where(offset_range_predicate(kafka_key_ranges(batch)))  # the rows of the batch's offsets
    """
    if not ranges:
        raise ValueError("ranges must hold at least one (topic, topic_id, partition) range")
    return reduce(
        lambda left, right: left | right,
        [
            (F.col(f"{prefix}topic") == F.lit(r.topic))
            & (F.col(f"{prefix}topic_id") == F.lit(r.topic_id))
            & (F.col(f"{prefix}partition") == F.lit(r.partition))
            & F.col(f"{prefix}offset").between(F.lit(r.first_offset), F.lit(r.last_offset))
            for r in ranges
        ],
    )


def insert_new_kafka_records(rows: DataFrame, path: str, ranges: list[Row], app_id: str | None, batch_id: int) -> None:
    """Insert the rows whose (topic, topic_id, partition, offset) the table does not hold yet.

    In the steady state no file of the table may hold a row within the batch's offset ranges
    (``may_hold``, asked of the files' statistics), and the rows are appended; otherwise (a
    replay, a rebuild's overlap, a record bronze holds twice) a MERGE inserts only what is
    missing. Both commits carry the tag (``app_id``, ``batch_id``), so a replayed batch adds
    nothing either way.

    Example::

        insert_new_kafka_records(rows, lakehouse.table(SILVER), kafka_key_ranges(rows), stream_id, 7)
    """
    if not ranges:
        return
    session = rows.sparkSession
    # Asked of the table's newest version, from its files' statistics (0.2 s on a 1,000,000-row
    # silver, where a query reading the rows takes 0.45-0.87 s); the append that follows is blind
    # (no conflict with a later commit). The pipeline's own writers cannot commit in between: a table has
    # one stream, a stream one holder, and a holder that lost its lease is fenced (its commit
    # fails). A writer from outside that adds the same records at that moment is not stopped,
    # and the audit names it (silver_duplicates), as it does one that adds them a moment later.
    if not may_hold(session, path, offset_range_predicate(ranges)):
        # One file per Kafka partition, as the MERGE writes (Delta repartitions its output by
        # the table's partition columns): no file spans two partitions' offsets.
        append_idempotent(rows.repartition(*KAFKA_PARTITION_COLUMNS), path, app_id, batch_id)
        return
    condition = (
        (F.col("t.topic") == F.col("s.topic"))
        & (F.col("t.topic_id") == F.col("s.topic_id"))
        & (F.col("t.partition") == F.col("s.partition"))
        & (F.col("t.offset") == F.col("s.offset"))
        & offset_range_predicate(ranges, prefix="t.")
    )

    def merge() -> None:
        with delta_transaction(session, app_id, batch_id):
            (
                DeltaTable.forPath(session, path)
                .alias("t")
                .merge(rows.alias("s"), condition)
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_conflicts(merge, f"{path} batch {batch_id}")
    warm_up_state(session, path)


def stream_writer(
    spark: SparkSession,
    lakehouse: Lakehouse,
    prepared: checkpoints.Prepared,
    dataset: Dataset = EVENTS_DATASET,
    schemas: WriterSchemas | None = None,
) -> DataStreamWriter:
    """``dataset``'s silver stream, ready to start: each bronze batch parsed into silver and quarantine once
    (``schemas``: where the writer schemas of a dataset not in JSON are, ``schemas_for``).

    Example::

        silver.stream_writer(spark, lakehouse, prepared).option("checkpointLocation", ...).start()
    """
    stream = dataset.stream("silver")
    silver_path, quarantine_path = lakehouse.table(dataset.silver), lakehouse.table(dataset.quarantine)
    checkpoint, sinks = lakehouse.checkpoint(stream), {dataset.silver: silver_path, dataset.quarantine: quarantine_path}

    def write_batch(bronze_batch: DataFrame, batch_id: int) -> None:
        evaluate_for_delta_batch(bronze_batch, SMALL_BRONZE_BATCH)
        parsed = parse_records(first_per_kafka_record(bronze_batch), dataset, schemas, bronze_batch).persist()
        checked = None
        if dataset.dedup_key:
            checked, parsed = parsed, without_duplicates(parsed, silver_path, dataset).persist()
        try:
            with crash_points(bronze_batch.sparkSession, stream, batch_id):
                ranges, rejected, records = ranges_and_quarantine_share(parsed, stream, batch_id, dataset)
                if checked is not None:
                    # The marked rows are cached now, read from the parse cached before: it is read no more.
                    checked.unpersist()
                # Two tables, two commits: each is idempotent on its own, so a crash
                # between them is repaired by the replay writing only the second. A table
                # with nothing to insert is left alone (a replay finds nothing either):
                # a MERGE costs about a second even when its source is empty.
                if rejected < records:
                    check_held(lakehouse, stream)
                    insert_new_kafka_records(
                        valid_events(parsed, dataset.contract), silver_path, ranges, prepared.stream_id, batch_id
                    )
                if rejected:
                    reach(stream, BETWEEN_SINK_COMMITS, batch_id)
                    check_held(lakehouse, stream)
                    insert_new_kafka_records(
                        quarantined_records(parsed), quarantine_path, ranges, prepared.stream_id, batch_id
                    )
            check_held(lakehouse, stream)  # before the checkpoint's sink versions and commit-log entry
            if prepared.stream_id is not None:
                record_sink_versions(bronze_batch.sparkSession, checkpoint, batch_id, sinks)
        finally:
            parsed.unpersist()
            if checked is not None:
                checked.unpersist()

    source = source_stream(spark, lakehouse, dataset_streams(dataset)[stream], prepared.stream_id)
    return source.writeStream.foreachBatch(write_batch)


def without_duplicates(parsed: DataFrame, silver_path: str | None, dataset: Dataset) -> DataFrame:
    """``parsed`` with each valid record whose business key a kept record has marked as its duplicate
    (``dedup.mark_business_key_duplicates``), judged against the rows of silver at ``silver_path``
    (None: an empty silver, as a rebuild from all of bronze starts). With a horizon, silver is read only
    within it of the batch's event times, so Delta skips the files outside; without one, every file
    that may hold the batch's keys is read. ``parsed`` should be cached: its event times are collected.

    Example::

        marked = without_duplicates(parsed, lakehouse.table(ORDERS.silver), ORDERS)
    """
    if not isinstance(dataset, Dataset) or not dataset.dedup_key:
        raise ValueError(f"dataset must be a Dataset with a dedup_key, not {dataset!r}")
    contract, session = dataset.contract, parsed.sparkSession
    horizon_s = None
    if dataset.dedup_horizon is not None:
        horizon_s = duration_seconds(dataset.dedup_horizon, f"dataset {dataset.name}: dedup_horizon")
    held_columns = [*KAFKA_KEY_COLUMNS, "ingest_time", *dataset.dedup_key, contract.event_time]
    if silver_path is None:
        held = parsed.where(F.lit(False)).select(*held_columns)
        return mark_business_key_duplicates(parsed, held, dataset.dedup_key, contract.event_time, horizon_s)
    held = session.read.format("delta").load(silver_path)
    if horizon_s is not None and horizon_s < CALENDAR_SPAN_S:
        # Valid event times only (the contract quarantines the others): each within the supported calendar.
        valid = parsed.where(F.col("reason").isNull())
        # Micros, not datetimes: a timestamp collected comes back naive, in the session's time zone.
        micros = F.unix_micros(contract.event_time)
        [span] = valid.agg(F.min(micros).alias("first"), F.max(micros).alias("last")).collect()
        if span.first is None:
            return parsed
        horizon_us = horizon_s * 1_000_000
        near = F.col(contract.event_time).between(
            F.timestamp_micros(F.lit(span.first - horizon_us)), F.timestamp_micros(F.lit(span.last + horizon_us))
        )
        held = held.where(near)
    return mark_business_key_duplicates(
        parsed, held.select(*held_columns), dataset.dedup_key, contract.event_time, horizon_s
    )


def reason_counts(parsed: DataFrame) -> dict[str, int]:
    """How many of a batch's ``parsed`` rows each quarantine rule rejected, by the rule's label
    (``contract.quarantine_label``: a bounded set, whatever JSON the producer sent). One small job
    over the cached batch.

    Example::

        report_quarantine("silver", 7, 500, 120, reason_counts(parsed))
    """
    reason = F.col("reason")
    label = quarantine_label_column(reason)
    counts = parsed.where(reason.isNotNull()).groupBy(label.alias("label")).count().collect()
    return {row.label: row["count"] for row in counts}


def rebuilt_rows(
    bronze: DataFrame, dataset: Dataset = EVENTS_DATASET, schemas: WriterSchemas | None = None
) -> tuple[dict[str, DataFrame], DataFrame]:
    """``dataset``'s silver and quarantine rows rebuilt from ``bronze`` (read at one version), and the cached parse
    (``schemas``: as ``stream_writer`` takes them).

    Parsed once for both tables: the caller unpersists the second element when both are written. A
    business key keeps the first record of each key in bronze's order, as the stream does.

    Example::

        rows, cached = rebuilt_rows(spark.read.format("delta").load(lakehouse.table(BRONZE)))
    """
    parsed = parse_records(first_per_kafka_record(bronze), dataset, schemas, bronze)
    if dataset.dedup_key:
        parsed = without_duplicates(parsed, None, dataset)
    parsed = parsed.persist()
    if counted(dataset.expectations):
        # A record an expectation that fails refuses is never in silver: not after a rebuild either.
        ranges = kafka_key_ranges(with_kafka_time(parsed), *failure_aggregates(dataset.expectations))
        try:
            refuse_failed(f"the rebuild of {dataset.silver} from {dataset.bronze}", ranges, dataset.expectations)
        except ExpectationFailed:
            parsed.unpersist()
            raise
    rows = {dataset.silver: valid_events(parsed, dataset.contract), dataset.quarantine: quarantined_records(parsed)}
    return rows, parsed
