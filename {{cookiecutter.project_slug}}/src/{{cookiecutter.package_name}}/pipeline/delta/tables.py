"""Where every table and checkpoint lives, and what each table holds.

Layout under the lakehouse root (LAKEHOUSE_ROOT), for the events dataset:

    tables/bronze_events         raw Kafka records with their topic's id, append-only
    tables/silver_events         parsed, typed, one row per Kafka record
    tables/quarantine_events     records that failed parsing, with the reason
    tables/gold_event_windows    per event-time window and dimension values
    checkpoints/<stream>         one Spark checkpoint per stream, never shared

and which stream reads what and writes where (``dataset_streams``). Every dataset
has tables of its own named after it (``dataset.py``), a gold's exact distinct
counts a table of values each. The silver and gold schemas come from the dataset's
contract (contract.py) and golds; bronze and quarantine hold raw records and do
not depend on them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ..contract import WINDOW_END, WINDOW_START, Contract
from ..dataset import Aggregate, AggregateKind, Dataset, Gold, Naming
from ..datasets.events import DATASET as EVENTS_DATASET
from ..datasets.events import EVENTS
from ..refusals import Refusal
from ..session.spark import java_class
from . import files

# The tables of the project's first dataset (datasets/events.py).
BRONZE = EVENTS_DATASET.bronze
SILVER = EVENTS_DATASET.silver
QUARANTINE = EVENTS_DATASET.quarantine
GOLD = EVENTS_DATASET.gold_table(EVENTS_DATASET.golds[0])
TABLES = EVENTS_DATASET.tables

# A record's identity: offsets restart at 0 in a topic created again, so its id is part of the key.
KAFKA_KEY_COLUMNS = ["topic", "topic_id", "partition", "offset"]

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)]), True
)

BRONZE_SCHEMA = StructType(
    [
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
        StructField("topic", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), True),
        StructField("timestamp_type", IntegerType(), True),
        StructField("ingest_time", TimestampType(), False),
    ]
)

QUARANTINE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("topic_id", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("key", BinaryType(), True),
        StructField("value", BinaryType(), True),
        StructField("headers", HEADERS_TYPE, True),
        StructField("reason", StringType(), False),
        StructField("ingest_time", TimestampType(), False),
    ]
)

# What silver keeps of each record after the contract's fields.
SILVER_KAFKA_FIELDS = [
    StructField("topic", StringType(), False),
    StructField("topic_id", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("offset", LongType(), False),
    StructField("kafka_timestamp", TimestampType(), True),
    StructField("ingest_time", TimestampType(), False),
]


def silver_schema(contract: Contract = EVENTS) -> StructType:
    """One column per contract field, in declaration order (NOT NULL when required), then the Kafka columns."""
    fields = [StructField(field.name, field.spark_type, not field.required) for field in contract.fields]
    return StructType([*fields, *SILVER_KAFKA_FIELDS])


def declared_gold(contract: Contract, gold: Gold | None) -> Gold:
    """``gold``, checked against ``contract``; None is the contract's own gold (``Gold.of``): its event
    count and the sum of each measure, by its dimensions.

    Example::

        declared_gold(EVENTS, None).values  # ('event_count', 'amount_sum')
    """
    if not isinstance(contract, Contract):
        raise TypeError(f"contract must be a Contract, not {type(contract).__name__}")
    if gold is None:
        return Gold.of(EVENTS_DATASET.golds[0].name, contract)
    if not isinstance(gold, Gold):
        raise TypeError(f"gold must be a Gold, not {type(gold).__name__}")
    gold.check_against(contract)
    return gold


def gold_schema(contract: Contract = EVENTS, gold: Gold | None = None) -> StructType:
    """Window, dimensions, then one column per aggregate ``gold`` declares (None: the contract's
    event_count and one sum per measure), then the sketch of each approximate distinct count.

    Example::

        gold_schema(EVENTS).fieldNames()  # ['window_start', 'window_end', 'event_type', 'event_count', 'amount_sum']
    """
    gold = declared_gold(contract, gold)
    dimensions = [contract.field(name) for name in gold.dimensions]
    return StructType(
        [
            StructField(WINDOW_START, TimestampType(), False),
            StructField(WINDOW_END, TimestampType(), False),
            *(StructField(field.name, field.spark_type, not field.required) for field in dimensions),
            *(_aggregate_field(aggregate, contract) for aggregate in gold.aggregates),
            *(StructField(name, BinaryType(), False) for name in gold.sketches),
        ]
    )


# A table of distinct values' columns after the gold key: the value, and the batch that first held it.
VALUE, FIRST_STREAM, FIRST_BATCH = "value", "first_stream", "first_batch"


def distinct_values_schema(contract: Contract, gold: Gold, column: str) -> StructType:
    """The schema of the table of values behind ``gold``'s exact distinct count ``column``: each
    distinct (window, dimensions, value) once, with the stream id and batch that first held it.

    Example::

        distinct_values_schema(ORDERS, by_shop, "customer_distinct").fieldNames()
        # ['window_start', 'window_end', 'shop', 'value', 'first_stream', 'first_batch']
    """
    if not isinstance(contract, Contract) or not isinstance(gold, Gold):
        raise TypeError(f"contract and gold must be a Contract and a Gold, not {contract!r} and {gold!r}")
    gold.check_against(contract)
    counted = [a.field for a in gold.aggregates if a.column == column and a.kind is AggregateKind.DISTINCT]
    if not counted:
        raise ValueError(f"gold {gold.name} has no exact distinct count {column!r}")
    key = gold_schema(contract, gold).fields[: len(gold.key)]
    return StructType(
        [
            *key,
            StructField(VALUE, contract.field(counted[0]).spark_type, False),
            StructField(FIRST_STREAM, StringType(), True),
            StructField(FIRST_BATCH, LongType(), False),
        ]
    )


def _aggregate_field(aggregate: Aggregate, contract: Contract) -> StructField:
    if aggregate.kind is AggregateKind.COUNT:
        return StructField(aggregate.column, LongType(), False)
    field = contract.field(aggregate.field)
    if aggregate.kind is AggregateKind.SUM:
        return StructField(aggregate.column, field.sum_type, False)
    if aggregate.kind in (AggregateKind.MIN, AggregateKind.MAX):
        # Of an optional field, a window whose events all lack it has none.
        return StructField(aggregate.column, field.spark_type, not field.required)
    return StructField(aggregate.column, LongType(), False)  # a distinct count


def table_schemas(dataset: Dataset = EVENTS_DATASET) -> dict[str, StructType]:
    """Every table of ``dataset`` and its schema under the dataset's contract.

    Example::

        list(table_schemas(EVENTS_DATASET))
        # ['bronze_events', 'silver_events', 'quarantine_events', 'gold_event_windows']
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    contract = dataset.contract
    schemas = {
        dataset.bronze: BRONZE_SCHEMA,
        dataset.silver: silver_schema(contract),
        dataset.quarantine: QUARANTINE_SCHEMA,
    }
    for gold in dataset.golds:
        schemas[dataset.gold_table(gold)] = gold_schema(contract, gold)
        for aggregate in gold.aggregates:
            if aggregate.kind is AggregateKind.DISTINCT:
                values = distinct_values_schema(contract, gold, aggregate.column)
                schemas[dataset.values_table(gold, aggregate)] = values
    return schemas


# The schemas of the default contract.
SILVER_SCHEMA = silver_schema(EVENTS)
GOLD_SCHEMA = gold_schema(EVENTS)
SCHEMAS = table_schemas(EVENTS_DATASET)
AMOUNT_TYPE = EVENTS.field("amount").spark_type
# Spark widens sum(DECIMAL(18,2)) to DECIMAL(28,2): exact for any realistic total.
AMOUNT_SUM_TYPE = EVENTS.field("amount").sum_type

# Silver and quarantine are deduplicated on Kafka coordinates by a MERGE that must read
# only the files that can hold the batch's offsets. One directory per Kafka partition keeps
# every file to one partition's narrow offset range whatever the skew between partitions,
# the number of topics or partitions added later; compaction works within a directory, so
# it keeps that property. The price: a batch writes one file per Kafka partition it holds.
KAFKA_PARTITION_COLUMNS = ("topic", "partition")


def partition_columns(name: str, dataset: Dataset = EVENTS_DATASET) -> tuple[str, ...]:
    """The columns table ``name`` of ``dataset`` is partitioned by: silver's and quarantine's Kafka partition."""
    return KAFKA_PARTITION_COLUMNS if name in (dataset.silver, dataset.quarantine) else ()


def table_properties(name: str, dataset: Dataset = EVENTS_DATASET) -> dict[str, str]:
    """Delta properties a table of ``dataset`` is created with (an existing table keeps its own).

    Bronze, silver and quarantine are append-only (Delta itself rejects updates and deletes: raw
    and parsed history is never rewritten). Statistics are collected only for the columns that
    data skipping uses (Delta's default is the first 32 columns, paid on every write): the offsets
    that the dedup MERGE prunes on, bronze's Kafka coordinates and times, silver's event time for
    readers. Gold keeps them all: it has few columns.

    Example::

        table_properties("silver_events")["delta.dataSkippingStatsColumns"]  # "offset,event_time"
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    if name not in dataset.tables:
        raise ValueError(f"name must be one of the tables of dataset {dataset.name}, not {name!r}")
    append_only = (dataset.bronze, dataset.silver, dataset.quarantine)
    properties = {"delta.appendOnly": "true"} if name in append_only else {}
    stats = {
        dataset.bronze: "topic,partition,offset,timestamp",
        dataset.silver: f"offset,{dataset.contract.event_time}",
        dataset.quarantine: "offset",
    }
    if name in stats:
        properties["delta.dataSkippingStatsColumns"] = stats[name]
    return properties


class Layer(StrEnum):
    """What a stream is: the layer it writes, the fused stream, or an egress."""

    BRONZE = "bronze"
    SILVER = "silver"
    GOLD = "gold"
    FUSED = "fused"
    EGRESS = "egress"


@dataclass(frozen=True)
class Stream:
    name: str
    source: str  # "kafka" or the table it streams from
    sinks: tuple[str, ...]
    downstream: tuple[str, ...]
    # An aggregating sink cannot absorb a replay from scratch: a lost checkpoint
    # must not restart it, and a reset empties it so it is rebuilt from its source.
    rebuilt_from_source: bool = False
    # Reads its source table's change feed (an egress): rows updated or removed there are changes it
    # passes on. The others follow their source's appends only, and a commit there that removes rows
    # stops them.
    reads_changes: bool = False
    layer: Layer | None = None
    # The dataset whose tables it writes (an egress: the one whose gold it publishes), and its gold.
    dataset: Dataset | None = None
    gold: Gold | None = None


def dataset_streams(dataset: Dataset) -> dict[str, Stream]:
    """``dataset``'s layered streams by name, bronze first: what each reads and writes, and which
    streams are downstream of it (each gold's stream its own).

    Example::

        list(dataset_streams(EVENTS_DATASET))  # ['bronze', 'silver', 'gold']
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    bronze, silver = dataset.stream("bronze"), dataset.stream("silver")
    golds = {dataset.gold_stream(gold): gold for gold in dataset.golds}
    return {
        bronze: Stream(bronze, "kafka", (dataset.bronze,), (silver, *golds), layer=Layer.BRONZE, dataset=dataset),
        silver: Stream(
            silver,
            dataset.bronze,
            (dataset.silver, dataset.quarantine),
            tuple(golds),
            layer=Layer.SILVER,
            dataset=dataset,
        ),
        **{
            name: Stream(
                name,
                dataset.silver,
                dataset.gold_tables(gold),
                (),
                rebuilt_from_source=True,
                layer=Layer.GOLD,
                dataset=dataset,
                gold=gold,
            )
            for name, gold in golds.items()
        },
    }


def fused_stream(dataset: Dataset) -> Stream:
    """``dataset``'s one stream of the low-latency mode: Kafka into all of its tables in each batch.

    Example::

        fused_stream(EVENTS_DATASET).sinks
        # ('bronze_events', 'silver_events', 'quarantine_events', 'gold_event_windows')
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    name = dataset.stream("fused")
    return Stream(name, "kafka", dataset.tables, (), rebuilt_from_source=True, layer=Layer.FUSED, dataset=dataset)


STREAMS = dataset_streams(EVENTS_DATASET)
LAYERS = tuple(STREAMS)

# The low-latency mode's one stream (fused.py): Kafka into all four tables in each batch. It runs
# instead of the three layered streams, never beside them (streams.check_mode).
FUSED = fused_stream(EVENTS_DATASET)

# Files a stream reading a Delta table admits per batch (Delta's maxFilesPerTrigger, 1,000 by default):
# unlimited, so that a batch never ends inside a version. A version split over batches (a rebuild's
# overwrite of many files) would leave gold holding part of a silver version, or an egress publishing
# a delete before the insert that replaces it, and the audit could not check either at that cut.
WHOLE_VERSIONS = str(2**31 - 1)


def with_downstream(stream: str, dataset: Dataset = EVENTS_DATASET) -> list[Stream]:
    """``dataset``'s layered stream ``stream`` and every stream downstream of it.

    Example::

        [each.name for each in with_downstream("silver")]  # ['silver', 'gold']
    """
    streams = dataset_streams(dataset)
    if stream not in streams:
        raise ValueError(f"stream must be one of {', '.join(streams)}, not {stream!r}")
    return [streams[name] for name in (stream, *streams[stream].downstream)]


def writer_of(table: str, dataset: Dataset = EVENTS_DATASET) -> Stream:
    """The layered stream of ``dataset`` that writes its table ``table``.

    Example::

        writer_of(SILVER).name  # "silver"
    """
    for stream in dataset_streams(dataset).values():
        if table in stream.sinks:
            return stream
    raise ValueError(f"table must be one of the tables of dataset {dataset.name}, not {table!r}")


@dataclass(frozen=True)
class Lakehouse:
    root: str

    def table(self, name: str) -> str:
        return f"{self.root}/tables/{name}"

    def checkpoint(self, stream: str) -> str:
        return f"{self.root}/checkpoints/{stream}"

    def sources(self, dataset: Dataset = EVENTS_DATASET) -> str:
        """Where ``dataset``'s bronze keeps what it found of its Kafka sources that must outlive its table
        (kafka/identity.py, kafka/retention.py): ``sources`` for a dataset of the first names
        (``Naming.SOLE``), ``datasets/<name>/sources`` for any other."""
        if dataset.naming is Naming.SOLE:
            return f"{self.root}/sources"
        return f"{self.root}/datasets/{dataset.name}/sources"

    def aside(self, name: str) -> str:
        """Where a reset builds table ``name`` before it replaces the table (recovery/rebuild.py)."""
        return f"{self.root}/rebuild/{name}"


class TableSchemaError(RuntimeError):
    """A table exists with another schema than the event contract gives it."""


def ensure_tables(
    spark: SparkSession,
    lakehouse: Lakehouse,
    dataset: Dataset = EVENTS_DATASET,
    change_feed: tuple[Gold, ...] = (),
    check_existing: bool = True,
) -> None:
    """Create every table of ``dataset`` with its explicit schema, so streams never infer one.

    A table that exists already is left as it is, so it must have the schema the
    dataset's contract gives it: Delta's createIfNotExists does not compare, and a MERGE
    silently drops source columns the table lacks. A table created for another
    contract raises TableSchemaError, naming the differences; with ``check_existing``
    off it is left unchecked (a reset that rebuilds it under the contract next).
    ``change_feed`` names the golds an egress publishes: each records its change data feed, an
    existing one too.

    Example::

        ensure_tables(spark, Lakehouse("/data/lake"), change_feed=EVENTS_DATASET.golds[:1])
    """
    if isinstance(change_feed, Gold) or not all(isinstance(gold, Gold) for gold in change_feed):
        raise TypeError(f"change_feed must be a sequence of Golds, not {change_feed!r}")
    published = {dataset.gold_table(gold) for gold in change_feed}
    for name, schema in table_schemas(dataset).items():
        path = lakehouse.table(name)
        snapshot = latest_snapshot(spark, path)
        if snapshot.version() >= 0:
            # An existing table: createIfNotExists would leave it as it is, at the cost of a Spark job.
            if check_existing:
                check_schema(name, path, schema, snapshot_schema(snapshot))
            continue
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
        if partition_columns(name, dataset):
            builder = builder.partitionedBy(*partition_columns(name, dataset))
        properties = table_properties(name, dataset)
        if name in published:
            properties[CHANGE_FEED] = "true"
        for key, value in properties.items():
            builder = builder.property(key, value)
        try:
            found = builder.execute().toDF().schema
        except Exception:
            # Streams of one pipeline may start in separate processes at once: if
            # another one created the table first, there is nothing left to do.
            if table_exists(spark, path):
                found = spark.read.format("delta").load(path).schema
            elif _holds_commits(spark, path):
                raise
            else:
                # A creation killed before its first commit leaves a _delta_log without one (empty, or
                # holding the commit's half-written temporary file), which Delta then takes for a table
                # that is not there: it never held anything.
                files.delete(spark, f"{path}/_delta_log", recursive=True)
                found = builder.execute().toDF().schema
        check_schema(name, path, schema, found)
    for name in sorted(published):
        _enable_change_feed(spark, lakehouse.table(name))


# A commit or a checkpoint of a Delta log: the files that make a table (a temporary file does not).
LOG_ENTRY = re.compile(r"^\d{20}\.(json|checkpoint.*\.parquet)$|^_last_checkpoint$")


def _holds_commits(spark: SparkSession, path: str) -> bool:
    return any(LOG_ENTRY.match(name) for name in files.list_names(spark, f"{path}/_delta_log"))


# The egress streams read gold's changes; each MERGE then also writes what it changed.
CHANGE_FEED = "delta.enableChangeDataFeed"


def change_feed_files(spark: SparkSession, path: str, version: int) -> list[str] | None:
    """The files the change feed of the table at ``path`` reads for ``version``, in the order it
    indexes them (URL-encoded, relative to the table), or None when the version's commit file is gone.

    Its change-data files when the version wrote them; otherwise Delta derives the changes from the
    files the version added and removed (DeltaSourceCDCSupport).

    Example::

        change_feed_files(spark, "/data/lake/tables/gold_event_windows", 32)  # ['_change_data/cdc-00000-....parquet']
    """
    if version < 0:
        raise ValueError(f"version must be at least 0, got {version}")
    actions = commit_actions(spark, path, version)
    if actions is None:
        return None
    return [action["cdc"]["path"] for action in actions if "cdc" in action] or [
        action[kind]["path"]
        for action in actions
        for kind in ("add", "remove")
        if kind in action and action[kind].get("dataChange", True)
    ]


def commit_actions(spark: SparkSession, path: str, version: int) -> list[dict] | None:
    """The actions of the table's commit ``version``, as its log file holds them (each a one-key dict:
    ``add``, ``remove``, ``commitInfo``...); None when that file is gone (the log's clean-up).

    Read straight from the file: Delta's own readers of one commit run a Spark job for it.

    Example::

        commit_actions(spark, "/data/lake/tables/silver_events", 18)[0]  # {"commitInfo": {"operation": "MERGE", ...}}
    """
    if not path:
        raise ValueError("path must be a Delta table's directory")
    if version < 0:
        raise ValueError(f"version must be at least 0, got {version}")
    text = files.read_text(spark, f"{path}/_delta_log/{version:020d}.json")
    if text is None:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def tagged_version(spark: SparkSession, path: str, app_id: str, batch_id: int, newest: int) -> int | None:
    """The version of the table at ``path`` whose commit carries the tag (``app_id``, ``batch_id``), looked
    for from version ``newest`` down; None when a commit of ``app_id`` with an earlier batch, or the log's
    clean-up, is met first.

    Read from the commit files, newest first: the tag of a batch being replayed is in one of the last few.

    Example::

        tagged_version(spark, "/data/lake/tables/silver_events", stream_id, 41, newest=230)  # 228
    """
    if not path or not app_id:
        raise ValueError("path must name a Delta table and app_id a stream id")
    if batch_id < 0:
        raise ValueError(f"batch_id must be at least 0, got {batch_id}")
    for version in range(newest, -1, -1):
        actions = commit_actions(spark, path, version)
        if actions is None:
            return None
        for action in actions:
            txn = action.get("txn")
            if txn is not None and txn.get("appId") == app_id:
                if txn.get("version") == batch_id:
                    return version
                if txn.get("version") < batch_id:
                    return None
    return None


def commit_time_ms(spark: SparkSession, path: str, version: int) -> int | None:
    """When the table's commit ``version`` was made, in milliseconds since the epoch, as the commit records it
    (its in-commit timestamp when the table has them, else its writer's clock); None when the file is gone.

    Read from the commit's content, which a copy of the table's directory keeps (a file's modification
    time does not).

    Example::

        commit_time_ms(spark, "/data/lake/tables/silver_events", 18)  # 1795906089865
    """
    actions = commit_actions(spark, path, version)
    info = next((action["commitInfo"] for action in actions or () if "commitInfo" in action), None)
    if info is None:
        return None
    made = info.get("inCommitTimestamp", info.get("timestamp"))
    return None if made is None else int(made)


@dataclass(frozen=True)
class RemovingCommit:
    version: int
    operation: str  # as the commit recorded it: RESTORE, DELETE, WRITE (an overwrite)...


def first_removing_commit(spark: SparkSession, path: str, first: int, last: int) -> RemovingCommit | None:
    """The first commit from version ``first`` to ``last`` that removes rows from the table at ``path``.

    A commit removes rows when it removes a file as a change of data: RESTORE, DELETE, UPDATE, a MERGE
    that updates, an overwrite. OPTIMIZE removes files too, but marks them as no change of data. This
    is what a stream reading the table without its change feed cannot go past: Spark stops it there
    (DELTA_SOURCE_IGNORE_DELETE, DELTA_SOURCE_TABLE_IGNORE_CHANGES). A version whose commit file the
    log's clean-up removed ends the search (None from there on).

    Example::

        first_removing_commit(spark, "/data/lake/tables/silver_events", 18, 25)  # RemovingCommit(19, "RESTORE")
    """
    if first < 0 or last < first - 1:
        raise ValueError(f"first must be a version and last at least first - 1, got {first} and {last}")
    for version in range(first, last + 1):
        actions = commit_actions(spark, path, version)
        if actions is None:
            return None
        if any("remove" in action and action["remove"].get("dataChange", True) for action in actions):
            info = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
            return RemovingCommit(version, str(info.get("operation") or "unknown"))
    return None


def _enable_change_feed(spark: SparkSession, path: str) -> None:
    if read_properties(spark, path).get(CHANGE_FEED) != "true":
        # Only on the gold made before an egress was turned on: the feed starts at this version.
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{CHANGE_FEED}' = 'true')")


def _columns(schema: StructType) -> list[tuple[str, str, bool]]:
    return [(field.name, field.dataType.simpleString(), field.nullable) for field in schema.fields]


def schema_differences(expected: StructType, found: StructType) -> list[str]:
    """What ``found`` has that ``expected`` has not, column by column; [] when they are the same."""
    want, have = _columns(expected), _columns(found)
    if want == have:
        return []
    by_name = {name: (data_type, nullable) for name, data_type, nullable in have}
    wanted = {name for name, _, _ in want}

    def described(data_type: str, nullable: bool) -> str:
        return data_type.upper() + ("" if nullable else " NOT NULL")

    differences = []
    for name, data_type, nullable in want:
        if name not in by_name:
            differences.append(f"missing column {name} {described(data_type, nullable)}")
        elif by_name[name] != (data_type, nullable):
            differences.append(
                f"column {name} is {described(*by_name[name])}, the contract says {described(data_type, nullable)}"
            )
    differences += [f"unexpected column {name}" for name, _, _ in have if name not in wanted]
    return differences or [
        f"columns in another order: {', '.join(n for n, _, _ in have)}; "
        f"the contract says {', '.join(n for n, _, _ in want)}"
    ]


def check_schema(name: str, path: str, expected: StructType, found: StructType) -> None:
    """Raise TableSchemaError, naming every difference, unless ``found`` is ``expected``."""
    differences = schema_differences(expected, found)
    if not differences:
        return
    if name == BRONZE:
        # Not made from the contract: a bronze table of another layout is another pipeline's.
        raise TableSchemaError(
            Refusal.FOREIGN_BRONZE.message(name, table=name, path=path, differences="; ".join(differences))
        )
    # Silver and quarantine are rebuilt together from bronze (and gold with them); gold alone from silver.
    stream = "gold" if name == GOLD else "silver"
    raise TableSchemaError(
        Refusal.CONTRACT_CHANGED.message(name, stream=stream, table=name, path=path, differences="; ".join(differences))
    )


def latest_snapshot(spark: SparkSession, path: str):
    """Delta's snapshot of the table at ``path``, brought up to date (version -1: no table).

    Its schema and properties come from the log, without the job that sums up every file.
    """
    none = java_class(spark, "scala.Option").empty()
    delta_log = java_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    return delta_log.forTable(spark._jsparkSession, path).update(False, none, none)


def snapshot_schema(snapshot) -> StructType:
    """The schema of a ``latest_snapshot``, nullability included, read from the log (no Spark job)."""
    return StructType.fromJson(json.loads(snapshot.schema().json()))


def table_exists(spark: SparkSession, path: str) -> bool:
    # Not DeltaTable.isDeltaTable: it can keep answering False from a cached log
    # after another process created the table. Loading refreshes the snapshot.
    try:
        spark.read.format("delta").load(path)
    except AnalysisException:
        return False
    return True


def table_has_rows(spark: SparkSession, path: str) -> bool:
    snapshot = latest_snapshot(spark, path)
    if snapshot.version() < 0:
        return False
    checksum = snapshot.checksumOpt()
    if checksum.isDefined() and checksum.get().numFiles() == 0:
        return False  # a table just created: no Spark job to say so
    return bool(spark.read.format("delta").load(path).take(1))


def may_hold(spark: SparkSession, path: str, predicate: Column) -> bool:
    """Whether a file of the Delta table at ``path`` may hold a row for which ``predicate`` is true.

    Answered from the newest snapshot's file statistics and partition values alone (Delta's
    data skipping keeps every file whose bounds meet the predicate, and every file without
    statistics); no data file is read. False is certain: no row of the table matches. True
    may be a file whose bounds straddle the predicate without holding a matching row. The
    predicate names the table's columns and literals only, so Delta can skip by it.

    Example::

        may_hold(spark, lakehouse.table(GOLD), F.col("window_start") >= F.lit(start))  # False: all new
    """
    if not path:
        raise ValueError("path must name a Delta table")
    if not isinstance(predicate, Column):
        raise TypeError(f"predicate must be a Column, not {type(predicate).__name__}")
    checksum = latest_snapshot(spark, path).checksumOpt()
    if checksum.isDefined() and checksum.get().numFiles() == 0:
        return False  # a table just created: said by its log, where the file listing is a Spark job
    return bool(spark.read.format("delta").load(path).where(predicate).inputFiles())


def read_properties(spark: SparkSession, path: str) -> dict[str, str]:
    """The table properties of the Delta table at ``path`` ({} when there is no table).

    Example::

        read_properties(spark, "/data/lake/tables/gold_event_windows")["lakehouse.gold.window"]  # "1 hour"
    """
    if not path:
        raise ValueError("path must name a Delta table")
    snapshot = latest_snapshot(spark, path)
    if snapshot.version() < 0:
        return {}
    # The metadata action as the log holds it, in one call: a Java map iterated from Python costs
    # a call per entry and ends on a Java exception that pyspark converts at some expense.
    return json.loads(snapshot.metadata().json())["metaData"].get("configuration", {})


def sql_string(value: str) -> str:
    """``value`` as a Spark SQL string literal (quoted, backslash escapes).

    Example::

        sql_string("it's")  # "'it\\'s'"
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def set_properties(spark: SparkSession, path: str, properties: dict[str, str]) -> None:
    """Set several table properties in one Delta commit, so they change together or not at all.

    Example::

        set_properties(spark, path, {"lakehouse.gold.window": "1 hour"})
    """
    if not properties:
        raise ValueError("properties must name at least one property")
    settings = ", ".join(f"'{key}' = {sql_string(value)}" for key, value in properties.items())
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({settings})")


def unset_property(spark: SparkSession, path: str, key: str) -> None:
    """Remove one table property; a property that is not set is not an error."""
    if not key:
        raise ValueError("key must name a table property")
    spark.sql(f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES IF EXISTS ('{key}')")
