"""Silver's dedup on a business key: a second Kafka record of a key silver holds goes to quarantine.

A producer that retries at the application level sends the same event again as a new Kafka record:
other coordinates, the same ``event_id``. A dataset that declares a ``dedup_key`` (``dataset.py``)
keeps the first record of each key in silver and quarantines the others with the reason
``duplicate of <topic>/<partition>/<offset>``, naming the record silver keeps.

"First" is bronze's order: ingest time, then topic, partition and offset. A silver batch follows
bronze's commits in order, so a key's first record is the same whether the records arrive in one
batch or many, in a replay, or in a rebuild of silver from all of bronze. With a ``dedup_horizon``, a
record is a duplicate only of a kept record whose event time is at most the horizon away from its
own; each record is judged against the records kept before it, in that order.

Everything here is a pure ``DataFrame -> DataFrame`` function: the caller reads what silver holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .contract import DUPLICATE_OF, EVENT_TIME_RANGE

# The coordinates that name a Kafka record in silver and quarantine.
_COORDINATES = ("topic", "topic_id", "partition", "offset")
# The types of what the fold below carries: the kept records, and the duplicates with the record each is of.
_KEPT = "array<struct<micros:bigint,named:string>>"
_DUPLICATES = "array<struct<topic:string,topic_id:string,partition:int,offset:bigint,of:string>>"
# Every two event times silver can hold are this near (the contract quarantines the others): a longer
# horizon is none, and the bound below stays far inside a long.
CALENDAR_SPAN_S = int((EVENT_TIME_RANGE[1] - EVENT_TIME_RANGE[0]).total_seconds())


def _order() -> Column:
    # Bronze's order; a struct compares field by field.
    return F.struct(F.unix_micros("ingest_time").alias("at"), "topic", "partition", "offset")


def _named() -> Column:
    return F.concat_ws("/", "topic", F.col("partition").cast("string"), F.col("offset").cast("string"))


def mark_business_key_duplicates(
    parsed: DataFrame,
    held: DataFrame,
    key: Sequence[str],
    event_time: str,
    horizon_s: int | None = None,
) -> DataFrame:
    """``parsed`` (silver's parsed batch: Kafka columns, fields, ``reason``) with ``reason`` set to
    ``duplicate of <topic>/<partition>/<offset>`` on each valid record whose ``key`` a kept record
    already has: one of ``held`` (silver's rows of those keys) or one before it in the batch.
    With ``horizon_s``, only a kept record at most that many seconds away in ``event_time`` counts.

    ``held`` may hold rows of this very batch (a replay after silver committed it): a record is never
    a duplicate of itself, so those are left out by their coordinates.

    Example::

        marked = mark_business_key_duplicates(parsed, silver_rows, ("event_id",), "event_time", 7 * 86400)
        valid_events(marked), quarantined_records(marked)
    """
    if isinstance(key, str) or not key or not all(isinstance(name, str) for name in key):
        raise ValueError(f"key must be a non-empty sequence of field names, not {key!r}")
    if not isinstance(event_time, str) or not event_time:
        raise ValueError(f"event_time must name a field, not {event_time!r}")
    if horizon_s is not None and (not isinstance(horizon_s, int) or horizon_s <= 0):
        raise ValueError(f"horizon_s must be a positive number of seconds or None, not {horizon_s!r}")
    key = list(key)
    candidates = parsed.where(F.col("reason").isNull()).select(
        *key,
        F.struct(
            _order().alias("order"),
            F.unix_micros(event_time).alias("micros"),
            _named().alias("named"),
            *_COORDINATES,
        ).alias("record"),
    )
    # Silver's kept rows of the batch's keys, less the batch's own (a replay after silver's commit).
    kept_before = (
        held.join(
            candidates.select(*(F.col(f"record.{name}").alias(name) for name in _COORDINATES)),
            list(_COORDINATES),
            "left_anti",
        )
        .join(candidates.select(*key).distinct(), key, "left_semi")
        .groupBy(*key)
        .agg(F.collect_list(F.struct(F.unix_micros(event_time).alias("micros"), _named().alias("named"))).alias("held"))
    )
    if horizon_s is None or horizon_s >= CALENDAR_SPAN_S:
        near = "true"
    else:
        near = f"abs(k.micros - r.micros) <= {horizon_s * 1_000_000}L"
    # Each key's records in bronze's order, each judged against what was kept before it.
    judged = (
        candidates.groupBy(*key)
        .agg(F.array_sort(F.collect_list("record")).alias("records"))
        .join(kept_before, key, "left")
        .select(
            F.expr(
                f"aggregate(records, named_struct('kept', coalesce(held, CAST(array() AS {_KEPT})), "
                f"'duplicates', CAST(array() AS {_DUPLICATES})), "
                "(acc, r) -> CASE WHEN exists(acc.kept, k -> " + near + ") "
                "THEN named_struct('kept', acc.kept, 'duplicates', array_append(acc.duplicates, named_struct("
                "'topic', r.topic, 'topic_id', r.topic_id, 'partition', r.partition, 'offset', r.offset, "
                "'of', filter(acc.kept, k -> " + near + ")[0].named))) "
                "ELSE named_struct('kept', array_append(acc.kept, named_struct('micros', r.micros, 'named', r.named)), "
                "'duplicates', acc.duplicates) END).duplicates"
            ).alias("duplicates")
        )
        .select(F.explode("duplicates").alias("d"))
        .select("d.topic", "d.topic_id", "d.partition", "d.offset", F.concat(F.lit(DUPLICATE_OF), "d.of").alias("_of"))
    )
    return (
        parsed.join(judged, list(_COORDINATES), "left")
        .withColumn("reason", F.coalesce("reason", "_of"))
        .select(*parsed.columns)
    )
