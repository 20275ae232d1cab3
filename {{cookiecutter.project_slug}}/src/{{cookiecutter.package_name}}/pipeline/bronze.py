"""Bronze: Kafka records into the bronze table, raw and lossless.

The source is Spark's Kafka source, reading with ``read_committed``; its offsets are written to
the stream's offset log before a batch runs, so a replayed batch reads exactly the same records.
Each record is kept whole (key, value, headers, Kafka timestamp) with the time it was ingested
and its topic's id (Kafka's topic UUID, looked up before each batch: a topic created again under
the same name is refused, see ``kafka/identity.py``). The sink is an append tagged with
(stream id, batch id): a replayed batch finds its tag committed and appends nothing.

The guards of this layer: a subscription changed in a way Spark's source would stop on at every
start (``check_subscription``); a lost checkpoint, after which bronze resumes after the offsets it
holds (``resume_offsets``); and records Kafka deleted before bronze read them, refused or recorded
at every start (``check_retained``, see ``kafka/retention.py``). Rows appended to bronze from
outside repeat records bronze holds; ``drop_copies`` keeps one of each (the audit names them).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from .config import Config
from .dataset import Dataset
from .datasets import config_of, topics_key
from .datasets.events import DATASET as EVENTS_DATASET
from .delta import files
from .delta.tables import (
    KAFKA_KEY_COLUMNS,
    Lakehouse,
    latest_snapshot,
    read_properties,
    set_properties,
    sql_string,
    table_has_rows,
)
from .delta.writes import append_idempotent
from .kafka import retention
from .kafka.clients import earliest_offsets, spark_source_options, topic_partitions
from .kafka.identity import SourceGuard
from .recovery import checkpoints
from .recovery.crash_points import crash_points
from .recovery.lease import check_held
from .recovery.sink_progress import read_sink_progress
from .refusals import Refusal, accept_loss_command
from .session.codegen import evaluate_for_kafka_batch

log = logging.getLogger(__name__)

# Kafka's "earliest" in a startingOffsets JSON.
EARLIEST = -2
# Where bronze's first checkpoint began reading each partition (JSON: topic, topic id, partition, offset).
# Records before it were never bronze's to read (kafka.starting_offsets = "latest"): the audit starts there.
FIRST_OFFSETS = "lakehouse.bronze.first_offsets"


def bronze_records(kafka_rows: DataFrame) -> DataFrame:
    """Kafka source rows, kept whole, plus the time they were ingested.

    In a streaming query current_timestamp() is the micro-batch timestamp that
    Spark records in the offset log, so a replayed batch gets the same value.
    """
    return kafka_rows.select(
        "key",
        "value",
        "headers",
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.col("timestampType").alias("timestamp_type"),
        F.current_timestamp().alias("ingest_time"),
    )


def with_topic_ids(bronze_rows: DataFrame, topic_ids: dict[str, str]) -> DataFrame:
    """Bronze rows with their topic's id (Kafka's topic UUID) after the topic's name, in bronze's column order.

    Spark's Kafka source does not give the id; bronze looks it up per batch (kafka/identity.py).
    """
    ids = F.create_map(*[F.lit(part) for pair in sorted(topic_ids.items()) for part in pair])
    topic_id = F.element_at(ids, F.col("topic")) if topic_ids else F.lit(None).cast("string")
    columns = [c for c in bronze_rows.columns if c != "topic_id"]
    at = columns.index("topic") + 1
    return bronze_rows.select(*columns[:at], topic_id.alias("topic_id"), *columns[at:])


def offsets_spanned(start: str, end: str) -> int | None:
    """How many offsets lie between two positions of Kafka's source (its offset JSON); None if ``start`` lacks one.

    Example::

        offsets_spanned('{"events":{"0":10,"1":4}}', '{"events":{"0":12,"1":5}}')  # 3
    """
    starts, ends = json.loads(start), json.loads(end)
    if not isinstance(starts, dict) or not isinstance(ends, dict):
        raise ValueError(
            f"offsets must be Kafka source offsets (partition offsets by topic), got {start!r} and {end!r}"
        )
    spans = [
        offset - starts.get(topic, {}).get(partition, offset + 1)
        for topic, partitions in ends.items()
        for partition, offset in partitions.items()
    ]
    return None if any(span < 0 for span in spans) else sum(spans)


class KafkaIngest:
    """Kafka's records of ``dataset``'s topics as bronze rows, for the stream that writes its bronze: bronze's
    own, or the fused one (``stream``, default the dataset's bronze stream).

    ``rows`` is the streaming DataFrame; ``identified`` gives a micro-batch of it its topics' ids, checked
    against Kafka before each batch (a topic created again since the start is refused before anything is
    written), and records where the stream's first checkpoint began reading.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        lakehouse: Lakehouse,
        prepared: checkpoints.Prepared,
        stream: str | None = None,
        dataset: Dataset = EVENTS_DATASET,
    ):
        config = config_of(config, dataset)
        stream = stream or dataset.stream("bronze")
        options = spark_source_options(config)
        checkpoint = lakehouse.checkpoint(stream)
        resuming = checkpoints.last_planned_batch(spark, checkpoint) is not None
        self._sources = SourceGuard.at_start(spark, config, lakehouse, resuming, stream, dataset)
        needed, after_rows = offsets_at_start(
            spark,
            config,
            lakehouse,
            self._sources.recorded_ids,
            prepared.stream_id,
            resuming,
            prepared.lost_checkpoint,
            stream,
            dataset,
        )
        # Until batch 0 commits (its replay included), this is the stream's first checkpoint starting.
        self._first_start = not after_rows and checkpoints.last_committed_batch(spark, checkpoint) is None
        if after_rows:
            options["startingOffsets"] = needed
            log.warning("%s: no offsets in its checkpoint; resuming after the offsets in bronze: %s", stream, needed)
        check_retained(spark, config, lakehouse, needed, self._sources.recorded_ids, stream, dataset)
        self._lakehouse, self._stream, self._checkpoint, self._dataset = lakehouse, stream, checkpoint, dataset
        self._last_end: tuple[int, str | None] | None = None  # (batch, its end offsets) read last
        kafka_rows = spark.readStream.format("kafka").options(**options).load()
        # Applied to the stream, not per batch: here current_timestamp() is the batch
        # time from the offset log, the same when the batch is replayed.
        self.rows = bronze_records(kafka_rows)

    def identified(self, rows: DataFrame, batch_id: int) -> DataFrame:
        """The batch's ``rows`` with their topics' ids, as bronze holds them."""
        topic_ids = self._sources.topic_ids()
        if self._first_start and batch_id == 0:
            record_first_offsets(rows.sparkSession, self._lakehouse, topic_ids, self._stream, self._dataset)
        return with_topic_ids(rows, topic_ids)

    def planned_records(self, spark: SparkSession, batch_id: int) -> int | None:
        """How many offsets batch ``batch_id`` spans (records and transaction markers), from the offset log.

        Its end offsets less those of the batch before; None when they are unknown: the stream's
        first batch, a partition the batch before did not read, an offset log entry gone.
        """
        previous = self._last_end[1] if self._last_end and self._last_end[0] == batch_id - 1 else None
        if previous is None and batch_id > 0:
            previous = checkpoints.batch_offsets(spark, self._checkpoint, batch_id - 1)
        end = checkpoints.batch_offsets(spark, self._checkpoint, batch_id)
        self._last_end = (batch_id, end)
        return None if previous is None or end is None else offsets_spanned(previous, end)

    def evaluate_for_batch(self, rows: DataFrame, batch_id: int) -> None:
        """Interpret or compile the batch's expressions, by its planned records (``session/codegen.py``)."""
        evaluate_for_kafka_batch(rows.sparkSession, self.planned_records(rows.sparkSession, batch_id))


def stream_writer(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    prepared: checkpoints.Prepared,
    dataset: Dataset = EVENTS_DATASET,
) -> DataStreamWriter:
    """The bronze stream of ``dataset``, ready to start: its topics' records appended to its bronze once each.

    Example::

        bronze.stream_writer(spark, config, lakehouse, prepared).option("checkpointLocation", ...).start()
    """
    bronze_path = lakehouse.table(dataset.bronze)
    stream = dataset.stream("bronze")
    ingest = KafkaIngest(spark, config, lakehouse, prepared, stream, dataset)

    def write_batch(rows: DataFrame, batch_id: int) -> None:
        ingest.evaluate_for_batch(rows, batch_id)
        identified = ingest.identified(rows, batch_id)
        with crash_points(rows.sparkSession, stream, batch_id):
            check_held(lakehouse, stream)
            append_idempotent(identified, bronze_path, prepared.stream_id, batch_id)
        check_held(lakehouse, stream)  # before Spark's commit-log entry

    return ingest.rows.writeStream.foreachBatch(write_batch)


def check_subscription(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    stream: str | None = None,
    dataset: Dataset = EVENTS_DATASET,
) -> None:
    """Refuse ``stream`` (the one reading ``dataset``'s topics: its bronze, or its fused stream) when the
    topics changed in a way Spark's source stops on for good; name the exact way out.

    Spark counts a topic dropped from the subscription as lost partitions, and an added one whose
    first offset is above 0 as missed records: with failOnDataLoss, every start fails. An added
    topic that starts at 0 is read from its beginning by Spark itself.

    Example::

        check_subscription(spark, config, Lakehouse("/data/lake"))  # or CheckpointError
    """
    config = config_of(config, dataset)
    stream = stream or dataset.stream("bronze")
    checkpoint = lakehouse.checkpoint(stream)
    offsets = checkpoints.committed_offsets(spark, checkpoint)
    if offsets is None or not config.kafka.fail_on_data_loss:
        return
    read, wanted = set(json.loads(offsets)), set(config.kafka.topics)
    removed = sorted(read - wanted)
    late = {f"{t}[{p}]": first for (t, p), first in earliest_offsets(config, sorted(wanted - read)).items() if first}
    if not removed and not late:
        return
    found = []
    if removed:
        found.append(f"removed from {topics_key(dataset)}: {', '.join(removed)}")
    if late:
        found.append("added above offset 0: " + ", ".join(f"{tp} starts at offset {o}" for tp, o in late.items()))
    raise checkpoints.CheckpointError(
        Refusal.SUBSCRIPTION_CHANGED.message(
            stream,
            checkpoint=checkpoint,
            read=sorted(read),
            topics_key=topics_key(dataset),
            wanted=sorted(wanted),
            changes="; ".join(found),
        )
    )


def check_retained(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    needed: str | None,
    topic_ids: dict[str, str],
    stream: str | None = None,
    dataset: Dataset = EVENTS_DATASET,
) -> None:
    """Refuse ``dataset``'s bronze (or ``stream``, its fused stream) when Kafka deleted records it needs next
    (``needed``: a startingOffsets JSON), or record them as lost when ``kafka.fail_on_data_loss`` is off; never
    let them go without a word. ``config`` as the dataset reads it (``datasets.config_of``).

    Example::

        check_retained(spark, config, lakehouse, '{"events": {"0": 120}}', {"events": "Xh1..."})  # or CheckpointError
    """
    gaps = retention.find_gaps(config, retention.needed_offsets(needed, topic_partitions(config)), topic_ids)
    if not gaps:
        return
    described = "; ".join(gap.describe() for gap in gaps)
    subject = stream or dataset.stream("bronze")
    if config.kafka.fail_on_data_loss:
        raise checkpoints.CheckpointError(
            Refusal.SOURCE_RECORDS_LOST.message(subject, gaps=described, accept=accept_loss_command(dataset.name))
        )
    retention.record(spark, lakehouse, gaps, retention.ACCEPTED_BY_SETTING, dataset)
    log.warning("%s: Kafka deleted records before it read them, recorded as lost on bronze: %s", subject, described)


def record_first_offsets(
    spark: SparkSession,
    lakehouse: Lakehouse,
    topic_ids: dict[str, str],
    stream: str = "bronze",
    dataset: Dataset = EVENTS_DATASET,
) -> None:
    """Record on bronze where its first checkpoint began reading each partition (``FIRST_OFFSETS``); a
    partition recorded already keeps its first offset.

    Spark's Kafka source resolves its starting offsets once and keeps them in the checkpoint
    (``initial_offsets``), so a start at "latest" is known exactly, whenever its first batch runs.
    """
    started = retention.needed_offsets(initial_offsets(spark, lakehouse.checkpoint(stream)))
    if not started:
        return
    entries = _first_offset_entries(spark, lakehouse, dataset)
    known = {(entry["topic"], entry["topic_id"], entry["partition"]) for entry in entries}
    new = [
        {"topic": topic, "topic_id": topic_ids.get(topic, ""), "partition": partition, "offset": offset}
        for (topic, partition), offset in sorted(started.items())
        if (topic, topic_ids.get(topic, ""), partition) not in known
    ]
    if new:
        set_properties(spark, lakehouse.table(dataset.bronze), {FIRST_OFFSETS: json.dumps([*entries, *new])})


def offsets_at_start(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    topic_ids: dict[str, str],
    stream_id: str | None,
    resuming: bool,
    lost_checkpoint: bool = False,
    stream: str = "bronze",
    dataset: Dataset = EVENTS_DATASET,
) -> tuple[str | None, bool]:
    """What a start of bronze needs next from Kafka (an offsets JSON; None when it starts at
    ``kafka.starting_offsets``), and whether it starts after the rows bronze holds rather than where
    its checkpoint says.

    A checkpoint that has planned nothing while bronze holds rows goes on after those rows, as a lost one
    does: one that a start made and then refused (its metadata written, no offsets yet) would otherwise
    start at ``kafka.starting_offsets``, read bronze's records again from the first, and skip a gap
    unchecked.

    Example::

        offsets_at_start(spark, config, lakehouse, {"events": "Xh1..."}, stream_id, resuming=False)
        # ('{"events": {"0": 120}}', True)
    """
    if resuming and not lost_checkpoint:
        return next_offsets(spark, lakehouse, stream_id, stream, dataset), False
    if lost_checkpoint or table_has_rows(spark, lakehouse.table(dataset.bronze)):
        return resume_offsets(spark, config, lakehouse, topic_ids, dataset), True
    return None, False


def next_offsets(
    spark: SparkSession,
    lakehouse: Lakehouse,
    stream_id: str | None,
    stream: str = "bronze",
    dataset: Dataset = EVENTS_DATASET,
) -> str | None:
    """The offsets JSON a resuming bronze reads Kafka from next: where the last batch bronze holds ended, or,
    before any, where its checkpoint began.

    The last batch bronze holds is the newer of the last one committed in the checkpoint and the last one
    the table has from stream ``stream_id``: a batch appended before a crash, and so not yet in the commit
    log, is replayed without reading Kafka (its append is found done), so its records are not needed again.
    """
    checkpoint = lakehouse.checkpoint(stream)
    held = read_sink_progress(spark, dataset.bronze, lakehouse.table(dataset.bronze), stream, stream_id).txn_batch
    batches = [batch for batch in (checkpoints.last_committed_batch(spark, checkpoint), held) if batch is not None]
    if not batches:
        return initial_offsets(spark, checkpoint)
    return checkpoints.batch_offsets(spark, checkpoint, max(batches))


def initial_offsets(spark: SparkSession, checkpoint: str) -> str | None:
    """The offsets JSON bronze's checkpoint began at, as Spark's Kafka source resolved its startingOffsets
    (``sources/0/0``: a zero byte, a version line, the JSON); None before a stream started on it.
    """
    text = files.read_text(spark, f"{checkpoint}/sources/0/0")
    return text.lstrip("\x00").partition("\n")[2] if text else None


def first_offsets(
    spark: SparkSession, lakehouse: Lakehouse, topic_ids: dict[str, str], dataset: Dataset = EVENTS_DATASET
) -> dict[tuple[str, int], int]:
    """Where the first checkpoint of ``dataset``'s bronze began reading each partition of the topics'
    incarnations ``topic_ids``.

    Example::

        first_offsets(spark, Lakehouse("/data/lake"), {"events": "Xh1..."})  # {("events", 0): 5120}
    """
    return {
        (entry["topic"], entry["partition"]): entry["offset"]
        for entry in _first_offset_entries(spark, lakehouse, dataset)
        if topic_ids.get(entry["topic"]) == entry["topic_id"]
    }


def _first_offset_entries(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset) -> list[dict]:
    return json.loads(read_properties(spark, lakehouse.table(dataset.bronze)).get(FIRST_OFFSETS) or "[]")


def gaps_at_start(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    stream: str | None = None,
    dataset: Dataset = EVENTS_DATASET,
) -> list[retention.Gap]:
    """What ``check_retained`` would find if ``stream`` (``dataset``'s bronze, or its fused stream) started
    now: the records it needs next that Kafka deleted.

    Refuses (CheckpointError) as a start does when another cluster answers or a topic was created again:
    offsets of another incarnation say nothing about this one.

    Example::

        gaps_at_start(spark, config, Lakehouse("/data/lake"))  # [Gap("events", "Xh1...", 0, 100, 150)]
    """
    config = config_of(config, dataset)
    stream = stream or dataset.stream("bronze")
    checkpoint = lakehouse.checkpoint(stream)
    resuming = checkpoints.last_planned_batch(spark, checkpoint) is not None
    sources = SourceGuard.at_start(spark, config, lakehouse, resuming, stream, dataset)
    stream_id = checkpoints.read_stream_id(spark, checkpoint, stream) if resuming else None
    needed, _ = offsets_at_start(
        spark, config, lakehouse, sources.recorded_ids, stream_id, resuming, stream=stream, dataset=dataset
    )
    if needed is None:
        return []
    return retention.find_gaps(config, retention.needed_offsets(needed, topic_partitions(config)), sources.recorded_ids)


def resume_offsets(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    topic_ids: dict[str, str],
    dataset: Dataset = EVENTS_DATASET,
) -> str:
    """startingOffsets JSON: the next offset after what bronze holds of each topic's current id; in a partition
    bronze holds nothing of, where its first checkpoint began reading it (``first_offsets``); in a
    partition added to the topic after that, 0, where Spark reads an added partition from; else earliest.

    Rows of a topic's earlier incarnation (another id) say nothing about the current one's offsets. Where
    a gap of records Kafka deleted was accepted (``kafka/retention.py``), bronze resumes after the gap.
    Where bronze began matters after a start at "latest": the records before it were never bronze's; and
    after retention, ``check_retained`` then sees what Kafka deleted before bronze read it.
    """
    ingested = {}
    if topic_ids:
        current = reduce(
            lambda left, right: left | right,
            [(F.col("topic") == topic) & (F.col("topic_id") == topic_id) for topic, topic_id in topic_ids.items()],
        )
        ingested = {
            (row.topic, row.partition): row.next_offset
            for row in spark.read.format("delta")
            .load(lakehouse.table(dataset.bronze))
            .where(current)
            .groupBy("topic", "partition")
            .agg((F.max("offset") + 1).alias("next_offset"))
            .collect()
        }
    began = first_offsets(spark, lakehouse, topic_ids, dataset)
    resume = {**began, **ingested}
    current = topic_partitions(config)
    for topic in {topic for topic, _ in began}:
        for partition in current.get(topic, []):
            resume.setdefault((topic, partition), 0)  # added after bronze began reading the topic
    for (topic, topic_id, partition), end in retention.accepted_ends(spark, lakehouse, dataset).items():
        if topic_ids.get(topic) == topic_id and (topic, partition) in resume:
            resume[(topic, partition)] = max(resume[(topic, partition)], end)
    offsets = {
        topic: {str(p): resume.get((topic, p), EARLIEST) for p in partitions} for topic, partitions in current.items()
    }
    return json.dumps(offsets)


def first_copies(bronze_rows: DataFrame) -> DataFrame:
    """One row per Kafka record (topic, topic id, partition, offset): the copy ingested first.

    Bronze's own batches never repeat a record, so a second copy came from outside, after it.

    Example::

        first_copies(spark.read.format("delta").load(lakehouse.table("bronze_events")))
    """
    if not isinstance(bronze_rows, DataFrame):
        raise TypeError("bronze_rows must be a DataFrame of bronze's rows")
    first = Window.partitionBy(*KAFKA_KEY_COLUMNS).orderBy("ingest_time")
    return bronze_rows.withColumn("_copy", F.row_number().over(first)).where(F.col("_copy") == 1).drop("_copy")


@dataclass(frozen=True)
class Copies:
    """What ``find_copies`` found: the records bronze holds more than once, at one version."""

    version: int
    records: int
    extra_rows: int
    where: str  # a SQL predicate true for every row of those records

    def describe(self) -> str:
        return f"{self.extra_rows} extra rows of {self.records} records at bronze version {self.version}"


def find_copies(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> Copies | None:
    """The records ``dataset``'s bronze holds more than once now, or None when it holds each once (one scan).

    Example::

        find_copies(spark, Lakehouse("/data/lake")).describe()  # "3 extra rows of 3 records at bronze version 7"
    """
    path = lakehouse.table(dataset.bronze)
    snapshot = latest_snapshot(spark, path)
    if snapshot.version() < 0:
        return None
    rows = spark.read.format("delta").option("versionAsOf", snapshot.version()).load(path)
    repeated = rows.groupBy(*KAFKA_KEY_COLUMNS).count().where(F.col("count") > 1).collect()
    if not repeated:
        return None
    by_partition: dict[tuple[str, str, int], list[int]] = {}
    for row in repeated:
        by_partition.setdefault((row.topic, row.topic_id, row.partition), []).append(row.offset)
    where = " OR ".join(
        f"(topic = {sql_string(topic)} AND topic_id = {sql_string(topic_id)} AND partition = {partition}"
        f" AND offset IN ({', '.join(str(offset) for offset in sorted(offsets))}))"
        for (topic, topic_id, partition), offsets in sorted(by_partition.items())
    )
    return Copies(snapshot.version(), len(repeated), sum(row["count"] - 1 for row in repeated), where)


def drop_copies(
    spark: SparkSession, lakehouse: Lakehouse, copies: Copies | None, dataset: Dataset = EVENTS_DATASET
) -> None:
    """Keep the first copy of each record ``find_copies`` found, in one commit that rewrites only those records.

    Bronze is append-only: the property is lifted for that commit and set again after it, also
    when there is nothing to remove (a run cut short in between). The caller holds bronze's
    stream, and silver's: a rewrite of bronze is a change silver's stream cannot read past, so
    silver is rebuilt after it (``checkpoints drop-bronze-copies`` does both). Holding bronze's stream,
    nothing commits to bronze between ``find_copies`` and this.

    Example::

        drop_copies(spark, Lakehouse("/data/lake"), find_copies(spark, Lakehouse("/data/lake")))
    """
    path = lakehouse.table(dataset.bronze)
    if latest_snapshot(spark, path).version() < 0:
        return  # no bronze yet: nothing to keep append-only
    if copies is not None:
        if not isinstance(copies, Copies):
            raise TypeError("copies must be what find_copies returned")
        set_properties(spark, path, {"delta.appendOnly": "false"})
        rows = spark.read.format("delta").load(path)
        first_copies(rows.where(copies.where)).write.format("delta").mode("overwrite").option(
            "replaceWhere", copies.where
        ).save(path)
    if read_properties(spark, path).get("delta.appendOnly") != "true":
        set_properties(spark, path, {"delta.appendOnly": "true"})
