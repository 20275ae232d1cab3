"""Gold: silver events aggregated per tumbling event-time window and dimensions.

The source is silver's Delta stream. Each batch is aggregated per window (``pipeline.gold_window``)
and the gold's dimensions, then merged into gold in a commit tagged with (stream id, batch id).
What a gold computes is its declaration (``dataset.Gold``): counts and sums are added to a window's
row, minima and maxima kept with ``least`` and ``greatest``, and an approximate distinct count kept
as a HyperLogLog sketch, merged with ``hll_union`` and estimated from the union. Addition is not idempotent by itself,
the tag is what makes a replayed batch count nothing twice.
When no gold file may hold any of the batch's windows (a catch-up, a stream that moved on to new
windows), the batch's rows are appended; otherwise a MERGE adds them to the rows of their windows,
reading only the gold files that hold those windows.

Gold's rows depend on the window size: the window gold was built with is a table property
(``lakehouse.gold.window``), and a stream started with another one is refused
(``window_refusal``), since it would add windows of a second size to the same table. A reset
rebuilds gold from silver at the configured window (``rebuilt_rows``; the mechanism is in
``recovery/rebuild.py``).
"""

from __future__ import annotations

from datetime import datetime
from functools import reduce

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from .config import Config, duration_seconds
from .contract import WINDOW_END, WINDOW_START, Contract
from .dataset import Aggregate, AggregateKind, Dataset, Gold
from .datasets.events import DATASET as EVENTS_DATASET
from .datasets.events import EVENTS
from .delta.tables import (
    FIRST_BATCH,
    FIRST_STREAM,
    VALUE,
    Lakehouse,
    dataset_streams,
    declared_gold,
    latest_snapshot,
    may_hold,
    read_properties,
    set_properties,
)
from .delta.writes import append_idempotent, delta_transaction, retry_conflicts, warm_up_state
from .instants import from_micros, literal
from .recovery import checkpoints
from .recovery.crash_points import crash_points
from .recovery.lease import check_held
from .recovery.rebuild import source_stream
from .recovery.sink_progress import record_sink_versions
from .refusals import Refusal
from .session.codegen import SMALL_SILVER_BATCH, evaluate_for_delta_batch

WINDOW_PROPERTY = "lakehouse.gold.window"
# The events dataset's first gold stream's name (its checkpoint, its identity property).
STREAM = EVENTS_DATASET.gold_stream(EVENTS_DATASET.golds[0])


# What a window's row becomes when a batch brings more of it: the target's value ``t`` and the batch's ``s``.
# least and greatest skip a null, so an optional field's minimum is the least value present.
_MERGED = {
    AggregateKind.COUNT: lambda t, s: t + s,
    AggregateKind.SUM: lambda t, s: t + s,
    AggregateKind.MIN: F.least,
    AggregateKind.MAX: F.greatest,
    # The sketches' union; the estimate is made from it (below).
    AggregateKind.APPROX_DISTINCT: F.hll_union,
    # A batch brings the count of the values new to the window (``add_to_windows``).
    AggregateKind.DISTINCT: lambda t, s: t + s,
}
_AGGREGATED = {
    AggregateKind.COUNT: lambda field: F.count(F.lit(1)),
    AggregateKind.SUM: F.sum,
    AggregateKind.MIN: F.min,
    AggregateKind.MAX: F.max,
    # Spark's HyperLogLog sketch (DataSketches, lgConfigK 12: a relative standard error of about 1.6 %).
    AggregateKind.APPROX_DISTINCT: F.hll_sketch_agg,
    # Exact over the rows given: right for a whole table; a batch's is replaced by its new values' count.
    AggregateKind.DISTINCT: F.count_distinct,
}


def window_aggregates(
    events: DataFrame, window_duration: str, contract: Contract = EVENTS, gold: Gold | None = None
) -> DataFrame:
    """Per tumbling event-time window and dimension values, the aggregates ``gold`` declares
    (None: the contract's count and measure sums).

    Example::

        window_aggregates(silver, "1 minute").columns
        # ['window_start', 'window_end', 'event_type', 'event_count', 'amount_sum']
    """
    gold = declared_gold(contract, gold)
    # An approximate distinct count is aggregated as its sketch, and estimated from it.
    aggregates = [
        _AGGREGATED[aggregate.kind](aggregate.field).alias(aggregate.sketch_column or aggregate.column)
        for aggregate in gold.aggregates
    ]
    return (
        events.groupBy(F.window(contract.event_time, window_duration).alias("_window"), *gold.dimensions)
        .agg(*aggregates)
        .select(
            F.col("_window.start").alias(WINDOW_START),
            F.col("_window.end").alias(WINDOW_END),
            *gold.dimensions,
            *(_estimated(aggregate) for aggregate in gold.aggregates),
            *gold.sketches,
        )
    )


def _estimated(aggregate: Aggregate, sketch: Column | None = None) -> Column:
    # The aggregate's column; an approximate distinct count's is estimated from ``sketch`` (default: its own).
    if aggregate.sketch_column is None:
        return F.col(aggregate.column)
    sketch = F.col(aggregate.sketch_column) if sketch is None else sketch
    return F.hll_sketch_estimate(sketch).alias(aggregate.column)


def distinct_values(
    events: DataFrame, window_duration: str, contract: Contract = EVENTS, gold: Gold | None = None
) -> dict[str, DataFrame]:
    """Per exact distinct count of ``gold`` (by its column), the distinct (window, dimensions, value)
    rows of ``events``, nulls left out: what ``add_to_windows`` records in the aggregate's table of values.

    Example::

        distinct_values(batch, "1 minute", ORDERS, by_shop)["customer_distinct"].columns
        # ['window_start', 'window_end', 'shop', 'value']
    """
    gold = declared_gold(contract, gold)
    window = F.window(contract.event_time, window_duration)
    return {
        aggregate.column: events.where(F.col(aggregate.field).isNotNull())
        .select(
            window.start.alias(WINDOW_START),
            window.end.alias(WINDOW_END),
            *gold.dimensions,
            F.col(aggregate.field).alias(VALUE),
        )
        .distinct()
        for aggregate in gold.aggregates
        if aggregate.kind is AggregateKind.DISTINCT
    }


def _count_new_values(
    values: DataFrame,
    path: str,
    app_id: str | None,
    batch_id: int,
    contract: Contract,
    gold: Gold,
    windows: list[tuple[datetime, datetime]],
) -> DataFrame:
    """Insert the batch's ``values`` the table at ``path`` lacks, each marked with this batch, in a
    commit tagged (``app_id``, ``batch_id``); then count, per gold key, the values marked with it.

    The count is read back from the table, not from the insert: a replay after the insert committed
    (it is skipped) counts the same values.
    """
    session = values.sparkSession
    marked = values.withColumns({FIRST_STREAM: F.lit(app_id).cast("string"), FIRST_BATCH: F.lit(batch_id)})
    condition = _same_gold_row(contract, gold) & (F.col(f"t.{VALUE}") == F.col(f"s.{VALUE}"))

    def insert() -> None:
        with delta_transaction(session, app_id, batch_id):
            (
                DeltaTable.forPath(session, path)
                .alias("t")
                .merge(marked.alias("s"), condition & _window_predicate(windows, prefix="t."))
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_conflicts(insert, f"{path} batch {batch_id}")
    this_batch = F.col(FIRST_STREAM).eqNullSafe(F.lit(app_id).cast("string")) & (F.col(FIRST_BATCH) == batch_id)
    return (
        session.read.format("delta")
        .load(path)
        .where(_window_predicate(windows) & this_batch)
        .groupBy(*gold.key)
        .count()
    )


def _merged_values(gold: Gold) -> dict[str, Column]:
    merged = {}
    for aggregate in gold.aggregates:
        column = aggregate.sketch_column or aggregate.column
        merged[column] = _MERGED[aggregate.kind](F.col(f"t.{column}"), F.col(f"s.{column}"))
        if aggregate.sketch_column is not None:
            merged[aggregate.column] = _estimated(aggregate, merged[column])
    return merged


def _same_gold_row(contract: Contract, gold: Gold, aliases: tuple[str, str] = ("t", "s")) -> Column:
    # An optional dimension can be null, and null = null is not true: <=> matches it.
    nullable = {name for name in gold.dimensions if not contract.field(name).required}
    left, right = aliases
    return reduce(
        lambda one, other: one & other,
        [
            F.col(f"{left}.{name}").eqNullSafe(F.col(f"{right}.{name}"))
            if name in nullable
            else F.col(f"{left}.{name}") == F.col(f"{right}.{name}")
            for name in gold.key
        ],
    )


# A batch of scattered event times touches windows far apart; past this many ranges the
# closest ones are joined (a wider range reads a few more files, but every range is one
# more OR in the MERGE condition, planned and evaluated for each row).
MAX_WINDOW_RANGES = 16


def window_ranges(
    starts: list[datetime], ends: list[datetime], max_ranges: int = MAX_WINDOW_RANGES
) -> list[tuple[datetime, datetime]]:
    """Touched windows (start, end pairs) as at most ``max_ranges`` (first start, last start) ranges.

    Adjacent windows fold into one range; beyond ``max_ranges``, the ranges with the
    smallest gaps between them are joined.
    """
    if len(starts) != len(ends):
        raise ValueError(f"starts and ends must pair up, got {len(starts)} and {len(ends)}")
    if max_ranges < 1:
        raise ValueError(f"max_ranges must be at least 1, got {max_ranges}")
    runs: list[list[datetime]] = []
    for start, end in sorted(set(zip(starts, ends, strict=True))):
        if runs and runs[-1][2] == start:
            runs[-1][1:] = [start, end]
        else:
            runs.append([start, start, end])
    if len(runs) > max_ranges:
        gaps = sorted(range(1, len(runs)), key=lambda i: runs[i][0] - runs[i - 1][2], reverse=True)
        splits = sorted(gaps[: max_ranges - 1])
        bounds = zip([0, *splits], [*splits, len(runs)], strict=True)
        runs = [[runs[first][0], runs[last - 1][1], runs[last - 1][2]] for first, last in bounds]
    return [(first, last) for first, last, _ in runs]


def touched_windows(aggregates: DataFrame) -> list[tuple[datetime, datetime]]:
    """The windows of a batch's ``aggregates`` as (first start, last start) ranges (``window_ranges``); [] for none.

    One Spark job: on a cached ``aggregates`` it is the job that fills the cache.

    Example::

        touched_windows(window_aggregates(batch, "1 minute"))  # [(10:00, 10:04), (12:31, 12:31)]
    """
    if not isinstance(aggregates, DataFrame):
        raise TypeError(f"aggregates must be a DataFrame, not {type(aggregates).__name__}")
    # The bounds leave Spark as microseconds since the epoch (``instants``): collected as timestamps
    # they would be the driver's local time. Every bound lies in Python's years 1 to 9999, since the
    # contract quarantines event times outside its range (``contract.EVENT_TIME_RANGE``).
    bounds = aggregates.select(F.unix_micros(WINDOW_START).alias("start"), F.unix_micros(WINDOW_END).alias("end"))
    rows = bounds.distinct().collect()
    return window_ranges([from_micros(r.start) for r in rows], [from_micros(r.end) for r in rows])


def _window_predicate(windows: list[tuple[datetime, datetime]], prefix: str = "") -> Column:
    # Table columns and literals only, so Delta skips every gold file outside the batch's
    # windows: a late event adds its own small range, not everything since. The literals are
    # exact at any date (``instants.literal``): a rebased one would miss a window before 1582.
    return reduce(
        lambda left, right: left | right,
        [F.col(f"{prefix}{WINDOW_START}").between(literal(first), literal(last)) for first, last in windows],
    )


def add_to_windows(
    aggregates: DataFrame,
    path: str,
    app_id: str | None,
    batch_id: int,
    contract: Contract = EVENTS,
    windows: list[tuple[datetime, datetime]] | None = None,
    gold: Gold | None = None,
    distinct: dict[str, tuple[DataFrame, str]] | None = None,
) -> None:
    """Merge a batch's per-window aggregates (``window_aggregates``) into the gold table.

    Rows match on the gold's key (window and dimensions); counts and sums are added, minima and
    maxima kept. An exact distinct count needs, in ``distinct`` under its column, the batch's
    values (``distinct_values``) and the path of its table of values (made with ``distinct_values_schema``):
    the values new to that table are recorded there first, and their count is added to gold.
    Addition is not idempotent by itself; the transaction tag is what
    makes a replayed batch count nothing twice. ``windows`` are the batch's
    (``touched_windows``, computed here when None). When no gold file may hold any of them
    (``may_hold``, asked of the files' statistics), no gold row shares a key with the batch
    and its rows are appended; otherwise a MERGE reads only the gold files holding them.
    ``aggregates`` should be cached: it is read once for its windows and once to write.

    Example::

        add_to_windows(window_aggregates(batch, "1 minute").cache(), lakehouse.table(GOLD), stream_id, 7)
    """
    if not path:
        raise ValueError("path must name a Delta table")
    gold = declared_gold(contract, gold)
    distinct = distinct or {}
    wanted = {aggregate.column for aggregate in gold.aggregates if aggregate.kind is AggregateKind.DISTINCT}
    if set(distinct) != wanted:
        raise ValueError(f"distinct must give the values and table of {sorted(wanted)}, not of {sorted(distinct)}")
    session = aggregates.sparkSession
    if windows is None:
        windows = touched_windows(aggregates)
    if not windows:
        return
    for column, (values, values_path) in distinct.items():
        # The batch's count of distinct values becomes the count of those new to the window.
        new_values = _count_new_values(values, values_path, app_id, batch_id, contract, gold, windows)
        same_key = _same_gold_row(contract, gold, ("a", "n"))
        aggregates = (
            aggregates.alias("a")
            .join(new_values.alias("n"), same_key, "left")
            .select(
                *(
                    F.coalesce(F.col("n.count"), F.lit(0)).alias(name) if name == column else F.col(f"a.{name}")
                    for name in aggregates.columns
                )
            )
        )
    # Asked of gold's newest version; the append that follows is blind. Gold has one writer
    # (its stream, one lease holder at a time, a fenced id's commit fails), so no row of these
    # windows can be committed in between. A batch of scattered late events that only straddles
    # files still takes the MERGE, which is exact either way.
    if not may_hold(session, path, _window_predicate(windows)):
        append_idempotent(aggregates, path, app_id, batch_id)
        return
    condition = _same_gold_row(contract, gold) & _window_predicate(windows, prefix="t.")

    def merge() -> None:
        with delta_transaction(session, app_id, batch_id):
            (
                DeltaTable.forPath(session, path)
                .alias("t")
                .merge(aggregates.alias("s"), condition)
                .whenMatchedUpdate(set=_merged_values(gold))
                .whenNotMatchedInsertAll()
                .execute()
            )

    retry_conflicts(merge, f"{path} batch {batch_id}")
    warm_up_state(session, path)


def window_of(gold: Gold, gold_window: str) -> str:
    """The window ``gold`` aggregates by: its own, or the pipeline's ``gold_window``.

    Example::

        window_of(Gold("hourly", (Aggregate(AggregateKind.COUNT),), window="1 hour"), "1 minute")  # "1 hour"
    """
    if not isinstance(gold, Gold):
        raise TypeError(f"gold must be a Gold, not {type(gold).__name__}")
    duration_seconds(gold_window, "pipeline.gold_window")
    return gold.window or gold_window


def values_paths(lakehouse: Lakehouse, dataset: Dataset, gold: Gold) -> dict[str, str]:
    """The path of the table of values behind each exact distinct count of ``dataset``'s ``gold``, by its column.

    Example::

        values_paths(Lakehouse("/data/lake"), ORDERS, by_shop)
        # {"customer_distinct": "/data/lake/tables/gold_orders_by_shop_customer_distinct_values"}
    """
    if not isinstance(lakehouse, Lakehouse):
        raise TypeError(f"lakehouse must be a Lakehouse, not {type(lakehouse).__name__}")
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    return {
        aggregate.column: lakehouse.table(dataset.values_table(gold, aggregate))
        for aggregate in gold.aggregates
        if aggregate.kind is AggregateKind.DISTINCT
    }


def stream_writer(
    spark: SparkSession,
    config: Config,
    lakehouse: Lakehouse,
    prepared: checkpoints.Prepared,
    dataset: Dataset = EVENTS_DATASET,
    gold: Gold | None = None,
) -> DataStreamWriter:
    """The stream of ``dataset``'s ``gold`` (None: its first), ready to start: each silver batch added to
    its windows once.

    Example::

        gold.stream_writer(spark, config, lakehouse, prepared).option("checkpointLocation", ...).start()
    """
    gold = dataset.golds[0] if gold is None else gold
    stream = dataset_streams(dataset)[dataset.gold_stream(gold)]
    window, contract = window_of(gold, config.gold_window), dataset.contract
    gold_path, checkpoint = lakehouse.table(dataset.gold_table(gold)), lakehouse.checkpoint(stream.name)
    values_paths_of = values_paths(lakehouse, dataset, gold)
    sinks = {name: lakehouse.table(name) for name in stream.sinks}

    def write_batch(silver_batch: DataFrame, batch_id: int) -> None:
        evaluate_for_delta_batch(silver_batch, SMALL_SILVER_BATCH)
        # Aggregated once and cached: the batch is scanned once, by the job that collects its
        # windows (an empty batch has none). An isEmpty() first would be one more job per batch.
        aggregates = window_aggregates(silver_batch, window, contract, gold).persist()
        try:
            windows = touched_windows(aggregates)
            if windows:
                values = distinct_values(silver_batch, window, contract, gold)
                distinct = {column: (values[column], path) for column, path in values_paths_of.items()}
                with crash_points(silver_batch.sparkSession, stream.name, batch_id):
                    check_held(lakehouse, stream.name)
                    add_to_windows(
                        aggregates, gold_path, prepared.stream_id, batch_id, contract, windows, gold, distinct
                    )
            check_held(lakehouse, stream.name)  # before the checkpoint's sink versions and commit-log entry
            if prepared.stream_id is not None:
                record_sink_versions(silver_batch.sparkSession, checkpoint, batch_id, sinks)
        finally:
            aggregates.unpersist()

    return source_stream(spark, lakehouse, stream, prepared.stream_id).writeStream.foreachBatch(write_batch)


def window_refusal(
    spark: SparkSession, lakehouse: Lakehouse, gold_window: str, stream: str = STREAM, table: str | None = None
) -> str | None:
    """Why ``stream`` cannot start with ``gold_window`` (its gold ``table``, by default the events dataset's
    first, holds windows of another size); None if it can.

    Example::

        window_refusal(spark, Lakehouse("/data/lake"), "15 minutes")  # "gold: the table ... holds windows of ..."
    """
    configured = duration_seconds(gold_window, "pipeline.gold_window")
    path = lakehouse.table(table or EVENTS_DATASET.gold_table(EVENTS_DATASET.golds[0]))
    if latest_snapshot(spark, path).version() < 0:
        return None
    recorded = read_properties(spark, path).get(WINDOW_PROPERTY)
    if recorded is None or duration_seconds(recorded, WINDOW_PROPERTY) == configured:
        return None
    return Refusal.GOLD_WINDOW_CHANGED.message(stream, path=path, recorded=recorded, configured=gold_window)


def check_window(
    spark: SparkSession, lakehouse: Lakehouse, gold_window: str, stream: str = STREAM, table: str | None = None
) -> None:
    """Refuse ``stream`` (a gold's, or the fused one) when its window differs from the one its gold ``table``
    was built with; record it on a new gold.

    Example::

        check_window(spark, Lakehouse("/data/lake"), config.gold_window)  # or CheckpointError
    """
    refusal = window_refusal(spark, lakehouse, gold_window, stream, table)
    if refusal is not None:
        raise checkpoints.CheckpointError(refusal)
    path = lakehouse.table(table or EVENTS_DATASET.gold_table(EVENTS_DATASET.golds[0]))
    if WINDOW_PROPERTY not in read_properties(spark, path):
        # A gold that records no window: taken as built with the window in use, and recorded so.
        set_properties(spark, path, {WINDOW_PROPERTY: gold_window})


def rebuilt_rows(
    silver: DataFrame, gold_window: str, dataset: Dataset = EVENTS_DATASET, gold: Gold | None = None
) -> tuple[dict[str, DataFrame], None]:
    """The rows of ``dataset``'s ``gold`` (None: its first) rebuilt from ``silver`` (read at one version) at
    the gold's window (``window_of``), and of its tables of distinct values; nothing is cached.

    Example::

        rows, _ = rebuilt_rows(spark.read.format("delta").load(lakehouse.table(SILVER)), "1 minute")
    """
    gold = dataset.golds[0] if gold is None else gold
    window, contract = window_of(gold, gold_window), dataset.contract
    rows = {dataset.gold_table(gold): window_aggregates(silver, window, contract, gold)}
    # Each value as first held by the rebuild itself: no stream, no batch.
    unmarked = {FIRST_STREAM: F.lit(None).cast("string"), FIRST_BATCH: F.lit(-1).cast("long")}
    for column, values in distinct_values(silver, window, contract, gold).items():
        [aggregate] = [a for a in gold.aggregates if a.column == column]
        rows[dataset.values_table(gold, aggregate)] = values.withColumns(unmarked)
    return rows, None
