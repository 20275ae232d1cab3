"""Quarantine replay: quarantined records judged again under the current contract and expectations, those
that pass moved to silver exactly once (and on to gold and the egresses, which read silver).

A record leaves quarantine when a producer's bug is fixed upstream of records already written, or when
a rule turns out too strict and is relaxed in the dataset's module. ``replay`` reads the quarantined
records (all of them, or those of one reason, or those Kafka received since a time), parses them again
exactly as silver parses bronze (``silver.parse_records``: the contract, the expectations, the business
key judged against silver), and then:

1. appends the records that pass to silver, in one commit tagged with the replay's number
   (txnAppId ``quarantine-replay-<dataset>``, txnVersion the number): the commit point. The records keep
   their Kafka coordinates, so silver's deduplication and the audit hold as for any record;
2. in one MERGE into quarantine, deletes each selected record silver now holds, and gives each that still
   fails the reason it fails for now (the first rule it fails, as silver would name it). Quarantine is
   append-only but for this MERGE, as bronze is but for `checkpoints drop-bronze-copies`.

A record is never in silver and awaiting replay in quarantine at once: a quarantined record silver holds
has been moved, and is awaiting only its deletion. A replay killed between the two commits leaves such
records; the next replay deletes them first (the audit names them until then, with that way out). Each
step is idempotent, so a replay killed anywhere is finished by running it again.

The replay holds the silver stream's lease (and the fused stream's) while it runs: silver has one writer
at a time, as every table of the pipeline has, so a record a recovering silver batch writes and the
replay moves cannot both land. A dataset the fused stream carries is refused: its gold is aggregated from
each Kafka batch, not read from silver, so records moved into silver would never reach it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from .config import Config, Mode, duration_seconds
from .contract import quarantine_label_column
from .dataset import Dataset
from .delta.tables import (
    KAFKA_KEY_COLUMNS,
    KAFKA_PARTITION_COLUMNS,
    Lakehouse,
    latest_snapshot,
    read_properties,
    set_properties,
    table_exists,
)
from .delta.writes import append_idempotent, retry_conflicts
from .expectations import counted, failure_aggregates, refuse_failed, with_kafka_time
from .instants import to_micros
from .recovery import checkpoints
from .recovery.crash_points import AFTER_QUARANTINE_COMMIT, AFTER_SILVER_COMMIT, reach
from .recovery.lease import holding
from .recovery.sink_progress import last_tagged_batch
from .refusals import Refusal
from .silver import (
    kafka_key_ranges,
    offset_range_predicate,
    parse_records,
    quarantined_records,
    reason_counts,
    schemas_for,
    valid_events,
    without_duplicates,
)
from .streams import switch_command

# The columns a quarantined record keeps of bronze's, by their bronze names: what silver parses.
QUARANTINE_AS_BRONZE = {
    "topic": "topic",
    "topic_id": "topic_id",
    "partition": "partition",
    "offset": "offset",
    "timestamp": "kafka_timestamp",
    "key": "key",
    "value": "value",
    "headers": "headers",
    "ingest_time": "ingest_time",
}
APPEND_ONLY = "delta.appendOnly"


def app_id(dataset: Dataset) -> str:
    """The txnAppId of ``dataset``'s replays in silver: its txnVersion is the replay's number.

    Example::

        app_id(ORDERS)  # "quarantine-replay-orders"
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    return f"quarantine-replay-{dataset.name}"


def stream_name(dataset: Dataset) -> str:
    """The name a replay of ``dataset`` has in its log lines and crash points (``<dataset>_replay``;
    the crash point's batch id is the replay's number).

    Example::

        stream_name(ORDERS)  # "orders_replay"
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    return f"{dataset.name}_replay"


@dataclass(frozen=True)
class Selection:
    """Which quarantined records a replay judges again: all of them, or those whose reason (or its label,
    ``contract.quarantine_label``) is ``reason``, and/or whose Kafka timestamp is at or after ``since``
    (an aware datetime).

    Example::

        Selection(reason="expectation total_not_negative not met")
    """

    reason: str | None = None
    since: datetime | None = None

    def __post_init__(self) -> None:
        if self.reason is not None and (not isinstance(self.reason, str) or not self.reason):
            raise ValueError(f"reason must be a quarantine reason, not {self.reason!r}")
        if self.since is not None and (not isinstance(self.since, datetime) or self.since.tzinfo is None):
            raise ValueError(f"since must be a datetime with a time zone, not {self.since!r}")

    def of(self, quarantine: DataFrame) -> DataFrame:
        """The rows of ``quarantine`` selected."""
        rows = quarantine
        if self.reason is not None:
            reason = F.col("reason")
            rows = rows.where((reason == F.lit(self.reason)) | (quarantine_label_column(reason) == F.lit(self.reason)))
        if self.since is not None:
            rows = rows.where(F.unix_micros(F.col("kafka_timestamp")) >= F.lit(to_micros(self.since)))
        return rows


@dataclass(frozen=True)
class Replayed:
    """What one replay did: its number, the records it judged, those it moved to silver, those a replay
    killed before had moved and it removed from quarantine, and those that stay, by their reason's label now
    (``silver.reason_counts``)."""

    dataset: str
    number: int | None
    judged: int = 0
    moved: int = 0
    finished: int = 0
    staying: dict[str, int] = field(default_factory=dict)

    def summary(self, silver: str, quarantine: str) -> str:
        if self.number is None:
            return f"{self.dataset}: no record of {quarantine} is selected; nothing replayed"
        staying = sum(self.staying.values())
        line = (
            f"{self.dataset}: replay {self.number} judged {self.judged} quarantined record(s) again: "
            f"{self.moved} moved to {silver}, {staying} stay in {quarantine}"
        )
        if self.staying:
            line += " (" + "; ".join(f"{reason}: {count}" for reason, count in sorted(self.staying.items())) + ")"
        if self.finished:
            line += f"; {self.finished} moved by a replay that was stopped were removed from {quarantine}"
        return line


def replay(spark: SparkSession, config: Config, dataset: Dataset, selection: Selection = Selection()) -> Replayed:
    """Judge ``dataset``'s quarantined records of ``selection`` again and move those that pass to silver,
    exactly once (see the module). Holds the silver and fused streams' leases meanwhile: LeaseHeld while
    one runs, CheckpointError where the fused stream carries the dataset, ExpectationFailed (nothing
    written) when a record now fails an expectation whose action is FAIL.

    Example::

        replay(spark, config, ORDERS, Selection(reason="expectation total_not_negative not met"))
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    if not isinstance(selection, Selection):
        raise TypeError(f"selection must be a Selection, not {type(selection).__name__}")
    lakehouse = Lakehouse(config.lakehouse_root)
    silver_stream, fused = dataset.stream("silver"), dataset.stream("fused")
    again = f"Then run `quarantine replay --dataset {dataset.name}` again."
    ttl_s = duration_seconds(config.lease_ttl, "pipeline.lease_ttl")
    with holding(spark, lakehouse, [silver_stream, fused], way_out=again, ttl_s=ttl_s):
        if checkpoints.read_stream_id_if_readable(spark, lakehouse.checkpoint(fused), fused) is not None:
            raise checkpoints.CheckpointError(
                Refusal.REPLAY_FUSED.message(
                    fused,
                    dataset=dataset.name,
                    checkpoint=lakehouse.checkpoint(fused),
                    layered=f"`{switch_command(Mode.LAYERED, dataset)}`",
                    fused=f"`{switch_command(Mode.FUSED, dataset)}`",
                )
            )
        return _replay(spark, config, lakehouse, dataset, selection)


def _replay(
    spark: SparkSession, config: Config, lakehouse: Lakehouse, dataset: Dataset, selection: Selection
) -> Replayed:
    silver_path, quarantine_path = lakehouse.table(dataset.silver), lakehouse.table(dataset.quarantine)
    if not table_exists(spark, quarantine_path) or not table_exists(spark, silver_path):
        return Replayed(dataset.name, None)
    if read_properties(spark, quarantine_path).get(APPEND_ONLY) != "true":
        set_properties(spark, quarantine_path, {APPEND_ONLY: "true"})  # a replay killed inside its MERGE
    selected = selection.of(spark.read.format("delta").load(quarantine_path)).persist()
    try:
        ranges = kafka_key_ranges(selected)
        if not ranges:
            return Replayed(dataset.name, None)
        last = last_tagged_batch(latest_snapshot(spark, silver_path), app_id(dataset))
        number = 0 if last is None else last + 1
        moved_before = _held_by_silver(spark, silver_path, ranges)
        pending = selected.join(moved_before, list(KAFKA_KEY_COLUMNS), "left_anti")
        as_bronze = pending.select(*[F.col(column).alias(name) for name, column in QUARANTINE_AS_BRONZE.items()])
        parsed = parse_records(as_bronze, dataset, schemas_for(config, dataset))
        if dataset.dedup_key:
            parsed = without_duplicates(parsed, silver_path, dataset)
        parsed = parsed.persist()
        try:
            return _move(spark, dataset, parsed, selected, ranges, number, silver_path, quarantine_path)
        finally:
            parsed.unpersist()
    finally:
        selected.unpersist()


def _move(
    spark: SparkSession,
    dataset: Dataset,
    parsed: DataFrame,
    selected: DataFrame,
    ranges: list,
    number: int,
    silver_path: str,
    quarantine_path: str,
) -> Replayed:
    stream = stream_name(dataset)
    judged = kafka_key_ranges(
        with_kafka_time(parsed), F.count("reason").alias("rejected"), *failure_aggregates(dataset.expectations)
    )
    if counted(dataset.expectations):
        refuse_failed(f"[{stream}] replay {number} of {dataset.quarantine}", judged, dataset.expectations)
    records, rejected = sum(row.records for row in judged), sum(row.rejected for row in judged)
    if rejected < records:
        # One file per Kafka partition, as silver's own appends write.
        moved = valid_events(parsed, dataset.contract).repartition(*KAFKA_PARTITION_COLUMNS)
        append_idempotent(moved, silver_path, app_id(dataset), number)
    reach(stream, AFTER_SILVER_COMMIT, number)
    now_held = _held_by_silver(spark, silver_path, ranges).withColumn("_moved", F.lit(True))
    still = quarantined_records(parsed).select(*KAFKA_KEY_COLUMNS, F.col("reason").alias("_reason_now"))
    # What quarantine must change: records silver holds now, and records whose reason is another now.
    changes = (
        selected.select(*KAFKA_KEY_COLUMNS, "reason")
        .join(now_held, list(KAFKA_KEY_COLUMNS), "left")
        .join(still, list(KAFKA_KEY_COLUMNS), "left")
        .where(F.col("_moved") | (F.col("_reason_now") != F.col("reason")))
        .drop("reason")
    )
    finished = sum(row.records for row in ranges) - records
    same_record = " AND ".join(f"t.`{column}` = s.`{column}`" for column in KAFKA_KEY_COLUMNS)

    def merge() -> None:
        (
            DeltaTable.forPath(spark, quarantine_path)
            .alias("t")
            .merge(changes.alias("s"), F.expr(same_record) & offset_range_predicate(ranges, prefix="t."))
            .whenMatchedDelete(condition="s._moved")
            .whenMatchedUpdate(condition="t.reason <> s._reason_now", set={"reason": "s._reason_now"})
            .execute()
        )

    # Quarantine is append-only but for this MERGE (as bronze is but for `drop-bronze-copies`): a replay
    # killed before it is append-only again leaves it so, and the next replay makes it so. A replay that
    # changes nothing there (every record stays, for the reason it had) commits nothing to it.
    if not changes.isEmpty():
        set_properties(spark, quarantine_path, {APPEND_ONLY: "false"})
        retry_conflicts(merge, f"{quarantine_path} replay {number}")
        set_properties(spark, quarantine_path, {APPEND_ONLY: "true"})
    reach(stream, AFTER_QUARANTINE_COMMIT, number)
    staying = reason_counts(parsed) if rejected else {}
    return Replayed(dataset.name, number, records, records - rejected, finished, staying)


def _held_by_silver(spark: SparkSession, silver_path: str, ranges: list) -> DataFrame:
    """The Kafka coordinates silver holds within ``ranges`` (Delta reads only the files that may hold them)."""
    silver = spark.read.format("delta").load(silver_path)
    return silver.where(offset_range_predicate(ranges)).select(*KAFKA_KEY_COLUMNS).distinct()
