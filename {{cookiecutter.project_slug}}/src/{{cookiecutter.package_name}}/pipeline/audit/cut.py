"""The cut an audit looks at: how far each stream had got, taken from its checkpoint and its tables.

The pipeline keeps running while this is read. For each stream, its commit log is read
first and its sink tables after: sinks commit before Spark writes the commit-log entry,
so the tables then hold every batch the commit log names, and a table's set transaction
(txn) names a later batch when one has committed since. That batch ends at the source
offsets Spark logged before running it: Kafka offsets for bronze, a version of the table
read for silver, gold and each egress. So the audit knows exactly what each stream had
consumed, and checks:

* Kafka's committed records below bronze's offsets are in bronze;
* bronze, as of the last version silver consumed whole, is in silver + quarantine;
* gold equals silver, as of the last version gold consumed, aggregated;
* each egress equals gold as of the last version it consumed.

Streams are read downstream first, so that a table read later holds everything a
stream read before it was made from. In the fused mode one stream writes the four tables
in each batch, and records the version each reached after it (``record_sink_versions``):
the cut is its last committed batch, every table pinned at its recorded version, where
silver holds bronze, and gold silver, whole. A bound (the last N bronze batches, or records
since a time) narrows the Kafka range, and with it every check, to those records.
Unbounded, each partition is audited from where bronze's first checkpoint began
reading it (``bronze.first_offsets``; after a start at "latest", the records before
were never bronze's), or from Kafka's first record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..bronze import first_offsets
from ..config import Config
from ..contract import Contract
from ..dataset import Dataset
from ..datasets.events import DATASET as EVENTS_DATASET
from ..delta.tables import Lakehouse, Stream, change_feed_files, dataset_streams, fused_stream, latest_snapshot
from ..kafka.clients import offsets_for_time, watermark_offsets
from ..kafka.identity import recorded_sources
from ..recovery import checkpoints, rebuild
from ..recovery.sink_progress import read_sink_progress, recorded_sink_versions

# A Delta source offset's index before the first file of its version (Spark logs -1).
BASE_INDEX = -1
# Kafka's "earliest" in a startingOffsets JSON: a partition audited from its first record.
EARLIEST = -2

Partition = tuple[str, int]


class AuditRangeError(ValueError):
    """A bound the checkpoint cannot answer: the offset log no longer has the batch it needs."""


@dataclass(frozen=True)
class Bound:
    """What to audit: everything (the default), bronze's last ``last_batches`` batches, or records since ``since_ms``.

    Example::

        Bound(last_batches=20), Bound(since_ms=1_767_225_600_000), Bound()
    """

    last_batches: int | None = None
    since_ms: int | None = None

    def __post_init__(self):
        if self.last_batches is not None and self.since_ms is not None:
            raise ValueError("give last_batches or since_ms, not both")
        if self.last_batches is not None and (not isinstance(self.last_batches, int) or self.last_batches < 1):
            raise ValueError(f"last_batches must be an int >= 1, got {self.last_batches!r}")
        if self.since_ms is not None and (not isinstance(self.since_ms, int) or self.since_ms < 0):
            raise ValueError(f"since_ms must be epoch milliseconds (an int >= 0), got {self.since_ms!r}")

    @property
    def whole(self) -> bool:
        return self.last_batches is None and self.since_ms is None


@dataclass(frozen=True)
class Consumed:
    """How far a stream has read a Delta table: every version up to ``whole`` (-1: none).

    ``exact``: no version is partly read. Delta splits a large version over batches
    (maxFilesPerTrigger); a batch that ends inside one has read only some of its files.
    """

    whole: int
    exact: bool = True


def delta_consumed(offset_json: str | None) -> Consumed:
    """What a stream had read of a Delta table when its batch ended at ``offset_json`` (Delta's source offset).

    Example::

        delta_consumed('{"sourceVersion":1,"reservoirVersion":8,"index":-1,"isStartingVersion":false}')
        # Consumed(whole=7, exact=True): versions 0..7 read, nothing of 8
    """
    if offset_json is None:
        return Consumed(-1)
    offset = json.loads(offset_json)
    version, index = offset["reservoirVersion"], offset["index"]
    if offset["isStartingVersion"]:
        # Inside the initial snapshot of `version` (Delta moves past it to version + 1, index -1).
        return Consumed(-1, index == BASE_INDEX)
    return Consumed(version - 1, index == BASE_INDEX)


def change_feed_consumed(offset_json: str | None, indexed_files: Callable[[int], int | None]) -> Consumed:
    """What a change-feed stream (``readChangeFeed``: each egress) had read when its batch ended at ``offset_json``.

    Delta's plain source, and the change feed's initial snapshot, move past a version read whole to
    (version + 1, -1). The change feed's versions after it do not: a batch that read version v to its
    last change file ends at (v, n - 1). ``indexed_files(v)`` counts the files the feed indexes in
    v (``delta.tables.change_feed_files``), or is None when that can no longer be told (the commit
    file cleaned up).

    Example::

        change_feed_consumed('{"sourceVersion":1,"reservoirVersion":32,"index":0,"isStartingVersion":false}',
                             lambda version: 1)
        # Consumed(whole=32, exact=True): version 32's one change file was read
    """
    consumed = delta_consumed(offset_json)
    if consumed.exact:
        return consumed
    offset = json.loads(offset_json)
    version, index = offset["reservoirVersion"], offset["index"]
    if not offset["isStartingVersion"] and index == (indexed_files(version) or 0) - 1:
        return Consumed(version, True)
    return consumed


@dataclass(frozen=True)
class Cut:
    """Pinned table versions, what each stream had consumed, and the Kafka range audited."""

    versions: dict[str, int | None]
    batches: dict[str, int | None]
    kafka_start: dict[Partition, int]
    kafka_end: dict[Partition, int]
    # Below it, retention has deleted records; above it, compaction may have removed some.
    kafka_log_start: dict[Partition, int]
    silver_read: Consumed  # bronze, as silver had read it
    gold_reads: dict[str, Consumed]  # silver, as each gold's stream had read it, by the gold's name
    egress_read: dict[str, Consumed] = field(default_factory=dict)  # its gold, as each egress stream had read it
    bound: Bound = field(default_factory=Bound)

    @property
    def gold_read(self) -> Consumed:
        """Silver, as the first gold's stream had read it (the gold the egresses publish)."""
        return next(iter(self.gold_reads.values()))

    def kafka_offsets(self) -> tuple[str | None, str, str]:
        """Spark's assign, startingOffsets and endingOffsets JSON for the partitions with records in the range.

        assign is None when there are none (bronze has read nothing, or nothing lies in the bound).
        """
        assign, start, end = {}, {}, {}
        for (topic, partition), until in sorted(self.kafka_end.items()):
            begin = self.kafka_start.get((topic, partition), EARLIEST)
            if begin < until:
                assign.setdefault(topic, []).append(partition)
                start.setdefault(topic, {})[str(partition)] = begin
                end.setdefault(topic, {})[str(partition)] = until
        return (json.dumps(assign) if assign else None), json.dumps(start), json.dumps(end)

    def rows_in_range(self, topic_ids: dict[str, str]) -> Callable[[DataFrame], DataFrame]:
        """A filter to the rows whose Kafka coordinates lie in the bound; every row when not bounded.

        Bronze's statistics, and silver's and quarantine's partitions, prune on these columns.
        """
        if self.bound.whole:
            return lambda rows: rows
        ranges = [
            (F.col("topic") == topic)
            & (F.col("topic_id") == topic_ids.get(topic, ""))
            & (F.col("partition") == partition)
            & (F.col("offset") >= self.kafka_start.get((topic, partition), EARLIEST))
            & (F.col("offset") < end)
            for (topic, partition), end in self.kafka_end.items()
        ]
        predicate = reduce(lambda left, right: left | right, ranges, F.lit(False))
        return lambda rows: rows.where(predicate)

    def as_dict(self) -> dict:
        return {
            "table_versions": self.versions,
            "batches": self.batches,
            "kafka_range": {
                f"{topic}[{partition}]": [self.kafka_start.get((topic, partition), EARLIEST), end]
                for (topic, partition), end in self.kafka_end.items()
            },
            "silver_read_bronze_through_version": self.silver_read.whole,
            "gold_read_silver_through_version": self.gold_read.whole,
            **{f"gold_{name}_read_silver_through_version": read.whole for name, read in self.gold_reads.items()},
            **{f"{name}_read_gold_through_version": read.whole for name, read in self.egress_read.items()},
            "bound": {"last_batches": self.bound.last_batches, "since_ms": self.bound.since_ms},
        }


def take_cut(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    bound: Bound | None = None,
    egresses: Mapping[str, str] | None = None,
    dataset: Dataset = EVENTS_DATASET,
) -> Cut:
    """Read how far every stream of ``dataset`` has got, downstream first, without stopping any; ``config`` as
    the dataset reads it (``datasets.config_of``). ``egresses`` are egress streams of its golds, each with the
    gold table it reads.

    Example::

        cut = take_cut(spark, config, Lakehouse("/data/lake"), Bound(last_batches=10))
        cut.versions["silver_events"], cut.kafka_end[("events", 0)]
    """
    bound = Bound() if bound is None else bound
    if not isinstance(bound, Bound):
        raise TypeError(f"bound must be a Bound, not {type(bound).__name__}")
    versions: dict[str, int | None] = {}
    batches: dict[str, int | None] = {}
    egress_read = {}

    def changes_of(gold: str):
        def gold_changes(version: int) -> int | None:
            paths = change_feed_files(spark, lakehouse.table(gold), version)
            return None if paths is None else len(paths)

        return gold_changes

    for name, gold in (egresses or {}).items():
        # The egress's sink is read later by the audit: its rows of later batches are told apart by gold_version.
        checkpoint = lakehouse.checkpoint(name)
        batches[name] = checkpoints.last_committed_batch(spark, checkpoint)
        read_changes = changes_of(gold)
        egress_read[name] = _consumed_at(
            spark,
            checkpoint,
            batches[name],
            read=lambda offset, changes=read_changes: change_feed_consumed(offset, changes),
        )
    streams, fused = dataset_streams(dataset), fused_stream(dataset)
    gold_reads = {}
    if checkpoints.read_stream_id_if_readable(spark, lakehouse.checkpoint(fused.name), fused.name) is not None:
        kafka_reader = fused.name
        bronze_batch = _fused_batch(spark, lakehouse, versions, batches, fused)
        silver_read = Consumed(versions[dataset.bronze])
        gold_reads = {gold.name: Consumed(versions[dataset.silver]) for gold in dataset.golds}
    else:
        kafka_reader = dataset.stream("bronze")
        for gold in dataset.golds:
            stream = streams[dataset.gold_stream(gold)]
            gold_batch = _stream_batch(spark, lakehouse, stream, versions, batches)
            gold_reads[gold.name] = _consumed_at(spark, lakehouse.checkpoint(stream.name), gold_batch)
            if gold_batch is None:
                gold_reads[gold.name] = _rebuilt_from(spark, lakehouse, stream, gold_reads[gold.name])
        silver = streams[dataset.stream("silver")]
        silver_batch = _stream_batch(spark, lakehouse, silver, versions, batches)
        silver_read = _consumed_at(spark, lakehouse.checkpoint(silver.name), silver_batch)
        if silver_batch is None:
            silver_read = _rebuilt_from(spark, lakehouse, silver, silver_read)
        bronze_batch = _stream_batch(spark, lakehouse, streams[kafka_reader], versions, batches)
    kafka_end = _kafka_offsets(spark, lakehouse, bronze_batch, kafka_reader)
    # A topic created again, or emptied by retention, may hold less than the checkpoint read.
    marks = watermark_offsets(config, sorted({topic for topic, _ in kafka_end}))
    kafka_end = {tp: min(end, marks[tp][1]) for tp, end in kafka_end.items() if tp in marks}
    log_start = {tp: marks[tp][0] for tp in kafka_end}
    return Cut(
        versions=versions,
        batches=batches,
        kafka_start=_kafka_start(
            spark, config, lakehouse, bound, bronze_batch, kafka_end, log_start, kafka_reader, dataset
        ),
        kafka_end=kafka_end,
        kafka_log_start=log_start,
        silver_read=silver_read,
        gold_reads=gold_reads,
        egress_read=egress_read,
        bound=bound,
    )


def _stream_batch(
    spark: SparkSession, lakehouse: Lakehouse, stream: Stream, versions: dict, batches: dict
) -> int | None:
    """The newest batch of ``stream`` its sinks hold in full; pins each sink's version in ``versions``."""
    checkpoint = lakehouse.checkpoint(stream.name)
    stream_id = checkpoints.read_stream_id(spark, checkpoint, stream.name)
    committed = checkpoints.last_committed_batch(spark, checkpoint)
    txns = []
    # The sink a batch commits last is read first (silver: quarantine, then silver): a batch
    # found there has committed to the others too.
    for position, name in enumerate(reversed(stream.sinks)):
        sink = read_sink_progress(spark, name, lakehouse.table(name), stream.name, stream_id)
        versions[name] = sink.version
        if position == 0 and sink.txn_batch is not None:
            txns.append(sink.txn_batch)
    batch = max([b for b in (committed, *txns) if b is not None], default=None)
    batches[stream.name] = batch
    return batch


def _fused_batch(spark: SparkSession, lakehouse: Lakehouse, versions: dict, batches: dict, fused: Stream) -> int | None:
    """The fused stream's last committed batch, each table pinned in ``versions`` where that batch left it:
    silver then holds all of bronze, and gold all of silver, at those versions.

    Before its first batch (the tables as the layered streams or a reset left them, whole), each table is
    pinned where it is now, gold first.
    """
    checkpoint = lakehouse.checkpoint(fused.name)
    batch = checkpoints.last_committed_batch(spark, checkpoint)
    recorded = recorded_sink_versions(spark, checkpoint, batch)
    for name in reversed(fused.sinks):
        versions[name] = recorded.get(name, latest_snapshot(spark, lakehouse.table(name)).version())
    batches[fused.name] = batch
    return batch


def _consumed_at(
    spark: SparkSession,
    checkpoint: str,
    batch: int | None,
    read: Callable[[str | None], Consumed] = delta_consumed,
) -> Consumed:
    return read(None if batch is None else checkpoints.batch_offsets(spark, checkpoint, batch))


def _rebuilt_from(spark: SparkSession, lakehouse: Lakehouse, stream: Stream, otherwise: Consumed) -> Consumed:
    # Tables rebuilt by a reset hold their source through the version they were built from, before the stream's
    # first batch.
    stream_id = checkpoints.read_stream_id(spark, lakehouse.checkpoint(stream.name), stream.name)
    start = None if stream_id is None else rebuild.starting_version(spark, lakehouse, stream, stream_id)
    return otherwise if start is None else Consumed(start - 1)


def _kafka_offsets(
    spark: SparkSession, lakehouse: Lakehouse, batch: int | None, reader: str = "bronze"
) -> dict[Partition, int]:
    if batch is None:
        return {}
    text = checkpoints.batch_offsets(spark, lakehouse.checkpoint(reader), batch)
    if text is None:
        raise AuditRangeError(f"{reader}: the offset log of {lakehouse.checkpoint(reader)} has no batch {batch}")
    return {(topic, int(p)): offset for topic, parts in json.loads(text).items() for p, offset in parts.items()}


def _kafka_start(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    bound: Bound,
    bronze_batch: int | None,
    kafka_end: dict[Partition, int],
    log_start: dict[Partition, int],
    reader: str = "bronze",
    dataset: Dataset = EVENTS_DATASET,
) -> dict[Partition, int]:
    if bound.since_ms is not None:
        return offsets_for_time(config, sorted(kafka_end), bound.since_ms)
    if bound.last_batches is None or bronze_batch is None or bronze_batch - bound.last_batches < 0:
        recorded = recorded_sources(spark, lakehouse, dataset)
        first = first_offsets(spark, lakehouse, recorded.topic_ids, dataset) if recorded is not None else {}
        # Once retention deleted records past it, Kafka's first record is where the audit starts.
        return {tp: offset for tp, offset in first.items() if offset > log_start.get(tp, offset)}
    before = bronze_batch - bound.last_batches
    try:
        start = _kafka_offsets(spark, lakehouse, before, reader)
    except AuditRangeError:
        oldest = min(checkpoints.planned_batches(spark, lakehouse.checkpoint(reader)))
        raise AuditRangeError(
            f"--last-batches {bound.last_batches}: {reader}'s offset log keeps batches {oldest} to {bronze_batch} "
            f"(Spark keeps spark.sql.streaming.minBatchesToRetain of them) and a bound starts where the batch "
            f"before it ended: give --last-batches {bronze_batch - oldest} or fewer, or --since, or no bound"
        ) from None
    # A partition bronze had not read yet at that batch: all of it is in the last batches.
    return {tp: start.get(tp, EARLIEST) for tp in kafka_end}


def touched_windows(silver_in_range: DataFrame, window_duration: str, contract: Contract, whole: bool):
    """A filter ``(rows, time column)`` to the span of the windows the bounded records fall in; none when not bounded.

    Example::

        windows = touched_windows(silver_rows, "1 minute", EVENTS, whole=False)
        windows(gold, "window_start"), windows(silver, "event_time")
    """
    if whole:
        return lambda rows, column: rows
    window = F.window(contract.event_time, window_duration)
    # As microseconds, both ways (``instants``): exact at any date, whatever the driver's zone.
    span = silver_in_range.agg(
        F.min(F.unix_micros(window.start)).alias("low"), F.max(F.unix_micros(window.end)).alias("high")
    ).first()
    if span.low is None:
        return lambda rows, column: rows.where(F.lit(False))
    low, high = F.timestamp_micros(F.lit(span.low)), F.timestamp_micros(F.lit(span.high))
    # Tumbling windows: the rows of the windows in the span are exactly those in [first start, last end).
    return lambda rows, column: rows.where((F.col(column) >= low) & (F.col(column) < high))
