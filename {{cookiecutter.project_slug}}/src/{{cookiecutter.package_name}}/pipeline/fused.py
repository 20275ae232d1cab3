"""The low-latency mode: one stream per dataset that takes each Kafka batch into bronze, silver,
quarantine and every gold.

In the layered mode a record crosses three streams on its way to gold, and each one polls its
source, plans a batch and commits: on two cores that is seconds per hop. Here one micro-batch of
Kafka records is written to all of the dataset's tables, each commit tagged with the same (stream id, batch id),
Delta's documented pattern for idempotent writes to several tables from one ``foreachBatch``.
Bronze's append and silver's each run in a thread of their own (``Beside``) while quarantine and
the golds are written in the batch's thread: no write reads another's commit, so their order is
free, and a batch costs its longest chain of jobs rather than the sum of them. Quarantine and the
golds stay one after the other: their MERGEs take the tag from the session's settings (``delta_transaction``).
The transforms and writers are the layers' own (``bronze.py``, ``silver.py``, ``gold.py``); this
module chains them and says which rows gold adds.

What keeps a replayed batch exact, table by table:

* the batch's records: a replay of a batch bronze holds reads them back from bronze's commit of it
  (``rows_of_commit``), never from Kafka again, which may have removed part of the batch's offsets
  since (retention, a compacted topic's cleaner); a batch bronze does not hold yet reads Kafka, and
  the retention check at the start covers its range. Inside a batch the Kafka rows are cached for
  every table's write, and a cached block an executor takes with it is read from Kafka again. Where
  Kafka may then answer with less and Spark goes on (``kafka.fail_on_data_loss = false``, or a topic
  in ``kafka.compacted_topics``, whose cleaner leaves gaps Spark never reports), bronze commits
  first and the other tables read the batch back from that commit (``reads_bronze_back``): one
  more job a batch, and no table can hold less of the batch than bronze. Otherwise Spark fails the
  batch on a missing offset, and its replay reads bronze's commit;
* bronze: the tagged append of bronze's own stream;
* silver: the batch's valid records that silver does not hold yet (a Kafka batch holds each record
  once), appended under the tag; quarantine: silver's own insert of new Kafka records. A business
  key is judged against silver as it is at the batch's start, a replay's own rows left out by their
  coordinates (``dedup.py``): the same records are kept either way;
* each gold (and each exact distinct count's table of values): the window aggregates of exactly
  the rows this batch's silver commit added. In the steady state no
  silver file may hold the batch's offsets and those are all its valid rows. Otherwise (a replay, a
  record bronze held before) they are the rows silver lacked just before the batch's commit: silver
  read at the version before it, which a replay finds by the commit's tag. So a crash after either
  commit replays gold with the same rows, and at the versions the batch recorded gold never counts
  a row that silver does not hold (between two commits of one batch a reader may see gold ahead).

A dataset's fused stream has its own checkpoint and lease, and binds all of the dataset's tables to its
id as every stream binds its own; it replaces the dataset's layered streams, never runs beside them
(``streams.check_mode``; ``checkpoints switch`` hands a lakehouse from one mode to the other). The
egress streams read gold's change feed in both modes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from urllib.parse import unquote

from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from .bronze import KafkaIngest
from .config import Config
from .dataset import Dataset
from .datasets.events import DATASET as EVENTS_DATASET
from .delta.tables import (
    KAFKA_KEY_COLUMNS,
    KAFKA_PARTITION_COLUMNS,
    Lakehouse,
    commit_actions,
    fused_stream,
    latest_snapshot,
    may_hold,
    tagged_version,
)
from .delta.writes import append_idempotent
from .formats.registry import WriterSchemas
from .gold import add_to_windows, distinct_values, touched_windows, values_paths, window_aggregates, window_of
from .recovery import checkpoints
from .recovery.crash_points import FUSED_POINTS, crash_points, reach
from .recovery.lease import check_held
from .recovery.sink_progress import last_tagged_batch, record_sink_versions
from .silver import (
    insert_new_kafka_records,
    offset_range_predicate,
    parse_records,
    quarantined_records,
    ranges_and_quarantine_share,
    valid_events,
    without_duplicates,
)

AFTER_BRONZE, AFTER_SILVER, AFTER_QUARANTINE = FUSED_POINTS


class Beside:
    """A table's write of the batch, run in a thread of its own beside the batch's other writes.

    An ``InheritableThread``: its Spark jobs carry the stream's job group, so stopping the query
    cancels them too. ``join`` waits and raises what the write raised; ``wait`` only waits.
    """

    def __init__(self, write: Callable[[], None], name: str):
        self._error: BaseException | None = None

        def run() -> None:
            try:
                write()
            except BaseException as error:  # noqa: BLE001 - raised again by join(), in the batch's thread
                self._error = error

        self._thread = InheritableThread(target=run, name=name, daemon=True)
        self._thread.start()

    def wait(self) -> None:
        self._thread.join()

    def join(self) -> None:
        self.wait()
        if self._error is not None:
            raise self._error


def _tagged_commit(spark: SparkSession, path: str, app_id: str | None, batch_id: int, snapshot) -> int | None:
    """The version of the table's commit tagged (``app_id``, ``batch_id``); None when ``snapshot`` (its newest)
    holds no commit of that batch."""
    committed = None if app_id is None else last_tagged_batch(snapshot, app_id)
    if committed is None or committed < batch_id:
        return None
    version = tagged_version(spark, path, app_id, batch_id, snapshot.version())
    if version is None:
        raise RuntimeError(_log_file_gone(path, app_id, batch_id))
    return version


def _log_file_gone(path: str, app_id: str, batch_id: int) -> str:
    return f"{path}: the commit of batch {batch_id} of stream {app_id} is recorded but its log file is gone"


def rows_of_commit(spark: SparkSession, path: str, app_id: str | None, batch_id: int) -> DataFrame | None:
    """The rows the commit tagged (``app_id``, ``batch_id``) added to the table at ``path``, read back from
    that commit's files at its version; None when the table holds no commit of that batch.

    A replayed fused batch reads its records here, not from Kafka again: Kafka may have removed part
    of the batch's offsets since bronze's commit (retention, a compacted topic's cleaner), and rows
    read again from a smaller range would give silver, quarantine and gold less than bronze holds.

    Example::

        rows_of_commit(spark, lakehouse.table(EVENTS_DATASET.bronze), stream_id, 7)  # bronze's rows of batch 7, or None
    """
    if not path:
        raise ValueError("path must name a Delta table")
    if batch_id < 0:
        raise ValueError(f"batch_id must be at least 0, got {batch_id}")
    version = _tagged_commit(spark, path, app_id, batch_id, latest_snapshot(spark, path))
    if version is None:
        return None
    actions = commit_actions(spark, path, version)
    if actions is None:
        raise RuntimeError(_log_file_gone(path, app_id, batch_id))
    # A data file's name is unique in its table (Delta names each with a UUID); the log records its path
    # relative to the table, URL-encoded.
    names = sorted({unquote(action["add"]["path"]).rsplit("/", 1)[-1] for action in actions if "add" in action})
    table = spark.read.format("delta").option("versionAsOf", version).load(path)
    return table.where(F.col("_metadata.file_name").isin(names)).select(*table.columns)


def rows_new_to_silver(valid: DataFrame, path: str, ranges: list, app_id: str | None, batch_id: int) -> DataFrame:
    """The rows of ``valid`` (a batch's silver rows) that silver's commit of the batch adds, or added.

    Before the batch's commit: the rows silver does not hold (all of them when no silver file may
    hold the batch's offsets). After it (a replay): the rows silver did not hold at the version
    before that commit, found by its tag (``app_id``, ``batch_id``). The same rows either way, so
    gold adds the same sums when the batch is replayed.

    Example::

        rows_new_to_silver(valid_events(parsed), lakehouse.table(SILVER), kafka_key_ranges(parsed), stream_id, 7)
    """
    if not isinstance(valid, DataFrame):
        raise TypeError(f"valid must be a DataFrame of silver rows, not {type(valid).__name__}")
    if not path:
        raise ValueError("path must name silver's table")
    if not ranges:
        return valid
    session = valid.sparkSession
    snapshot = latest_snapshot(session, path)
    version = _tagged_commit(session, path, app_id, batch_id, snapshot)
    if version is not None:
        before = version - 1
    elif not may_hold(session, path, offset_range_predicate(ranges)):
        return valid
    else:
        before = snapshot.version()
    held = (
        session.read.format("delta")
        .option("versionAsOf", before)
        .load(path)
        .where(offset_range_predicate(ranges))
        .select(*KAFKA_KEY_COLUMNS)
    )
    return valid.join(held, KAFKA_KEY_COLUMNS, "left_anti")


def reads_bronze_back(config: Config) -> bool:
    """Whether a fused batch commits bronze first and reads its records back from that commit: when Kafka
    may answer a read of the batch again with fewer records and Spark goes on without a word.

    Example::

        reads_bronze_back(config)  # False with kafka.fail_on_data_loss and no compacted topics
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    return not config.kafka.fail_on_data_loss or bool(config.kafka.compacted_topics)


def stream_writer(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    prepared: checkpoints.Prepared,
    dataset: Dataset = EVENTS_DATASET,
    schemas: WriterSchemas | None = None,
) -> DataStreamWriter:
    """``dataset``'s fused stream, ready to start: each Kafka batch into its bronze, silver, quarantine and
    every gold once (each exact distinct count's table of values too), under its contract and business key
    (``schemas``: where the writer schemas of a dataset not in JSON are, ``silver.schemas_for``).

    Example::

        fused.stream_writer(spark, config, lakehouse, prepared).option("checkpointLocation", ...).start()
    """
    stream = fused_stream(dataset)
    contract, name = dataset.contract, stream.name
    paths = {table: lakehouse.table(table) for table in stream.sinks}
    bronze_path, silver_path = paths[dataset.bronze], paths[dataset.silver]
    quarantine_path = paths[dataset.quarantine]
    golds = [
        (
            each,
            window_of(each, config.gold_window),
            paths[dataset.gold_table(each)],
            values_paths(lakehouse, dataset, each),
        )
        for each in dataset.golds
    ]
    checkpoint, app_id = lakehouse.checkpoint(name), prepared.stream_id
    ingest = KafkaIngest(spark, config, lakehouse, prepared, name, dataset)
    # The batch a start replays (planned, never committed): the only one bronze may hold already, so
    # the only one whose rows are looked for there, and no other batch pays for the look.
    planned = checkpoints.last_planned_batch(spark, checkpoint)
    replayed = planned if planned != checkpoints.last_committed_batch(spark, checkpoint) else None
    serial = reads_bronze_back(config)

    def write_batch(rows: DataFrame, batch_id: int) -> None:
        session = rows.sparkSession  # the stream's own session, cloned at its start
        ingest.evaluate_for_batch(rows, batch_id)
        from_kafka = ingest.identified(rows, batch_id)
        # A replay of a batch bronze holds reads bronze's rows of it, never Kafka again.
        committed = rows_of_commit(session, bronze_path, app_id, batch_id) if batch_id == replayed else None
        cached, beside = [], []

        def write_bronze(identified: DataFrame) -> None:
            check_held(lakehouse, name)
            append_idempotent(identified, bronze_path, app_id, batch_id)
            reach(name, AFTER_BRONZE, batch_id)

        def write_silver(added: DataFrame) -> None:
            check_held(lakehouse, name)
            # One file per Kafka partition, as silver's own stream writes.
            append_idempotent(added.repartition(*KAFKA_PARTITION_COLUMNS), silver_path, app_id, batch_id)
            reach(name, AFTER_SILVER, batch_id)

        try:
            with crash_points(session, name, batch_id):
                if committed is None and serial and app_id is not None:
                    # Bronze first, then every other table from its commit (reads_bronze_back).
                    write_bronze(from_kafka)
                    committed = rows_of_commit(session, bronze_path, app_id, batch_id)
                # Cached: the first job to read a partition (bronze's append, or the key ranges' job
                # running beside it) reads it from Kafka and fills the cache; the other waits and reads it back.
                identified = (from_kafka if committed is None else committed).persist()
                parsed = parse_records(identified, dataset, schemas).persist()
                cached += [identified, parsed]
                if dataset.dedup_key:
                    # Judged against silver as it is now: on a replay after silver's commit, the batch's own
                    # rows there are left out by their coordinates, so the marks are the same.
                    parsed = without_duplicates(parsed, silver_path, dataset).persist()
                    cached.append(parsed)
                if committed is None:  # else bronze holds the batch already: its rows are the ones read back
                    beside.append(Beside(partial(write_bronze, identified), f"{name}-bronze"))
                ranges, rejected, records = ranges_and_quarantine_share(parsed, name, batch_id, dataset)
                added = None
                if rejected < records:
                    valid = valid_events(parsed, contract)
                    added = rows_new_to_silver(valid, silver_path, ranges, app_id, batch_id)
                    if added is not valid:
                        added = added.persist()  # an anti-join with silver: computed once for every table
                        cached.append(added)
                    beside.append(Beside(partial(write_silver, added), f"{name}-silver"))
                if rejected:
                    check_held(lakehouse, name)
                    insert_new_kafka_records(quarantined_records(parsed), quarantine_path, ranges, app_id, batch_id)
                    reach(name, AFTER_QUARANTINE, batch_id)
                for declared, window, gold_path, values_paths in golds if added is not None else ():
                    aggregates = window_aggregates(added, window, contract, declared).persist()
                    cached.append(aggregates)
                    windows = touched_windows(aggregates)
                    if windows:
                        values = distinct_values(added, window, contract, declared)
                        distinct = {column: (values[column], path) for column, path in values_paths.items()}
                        check_held(lakehouse, name)
                        add_to_windows(aggregates, gold_path, app_id, batch_id, contract, windows, declared, distinct)
                for write in beside:
                    write.join()
            check_held(lakehouse, name)  # before the checkpoint's sink versions and commit-log entry
            if app_id is not None:
                record_sink_versions(session, checkpoint, batch_id, paths)
        finally:
            for write in beside:
                write.wait()  # a failed batch too: nothing of it may still run when its cache goes
            for frame in reversed(cached):
                frame.unpersist()

    return ingest.rows.writeStream.foreachBatch(write_batch)
