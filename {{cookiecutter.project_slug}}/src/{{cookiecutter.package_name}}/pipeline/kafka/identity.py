"""Which Kafka topics bronze's records came from: topic ids and the cluster id, recorded and checked.

Kafka offsets name a record only within one incarnation of a topic: a topic
deleted and created again, or the same name on another cluster, starts again at
offset 0. Every bronze, silver and quarantine row therefore carries the topic's
id (Kafka's topic UUID) beside its name, and silver's key is (topic, topic_id,
partition, offset), so records of a new incarnation are never taken for records
already held.

Bronze records the ids and the cluster id it reads from as a table property
(``lakehouse.bronze.sources``). A checkpoint that has planned batches holds
offsets of the recorded incarnation; if the cluster now reports another id for
a topic, or another cluster answers, those offsets would point into other
records (skipped, or read twice under other numbers), so bronze refuses to
start, and a batch that finds the change refuses before writing. The way out,
``checkpoints reset bronze --only``, starts bronze's checkpoint anew: each
topic resumes after the offsets bronze holds *for its current id*, so a new
incarnation is read from its first offset, and nothing of the old one is lost.

A compacted topic is refused the same way, at every start and before every batch, unless
``kafka.compacted_topics`` names it: the log cleaner removes a record once a later one has its key,
and Spark's source skips the gap, so what it removed before bronze read it would be lost without a
trace. Every compacted topic found is recorded for the audit, in a file of its own beside the tables
(``compacted_records``): a bronze put back from an older copy, or restored to an older version, must not
forget that the log cleaner may have removed records it holds.

Another cluster is refused on every start, with a checkpoint or without one (a
lost checkpoint would otherwise read the other cluster from its first offsets
without a word): the reset of bronze is what accepts a new cluster
(``forget_cluster``). A topic created again needs no such gate without a
checkpoint: its new incarnation is read from its first offset either way.
"""

from __future__ import annotations

import json
import logging
import time

from pyspark.sql import SparkSession

from ..config import Config
from ..dataset import Dataset
from ..datasets.events import DATASET as EVENTS_DATASET
from ..delta.files import create_new, list_names
from ..delta.tables import Lakehouse, read_properties, set_properties
from ..recovery import checkpoints
from ..refusals import Refusal
from .clients import Sources, bootstrap_servers, compacted_topics, describe_sources

log = logging.getLogger(__name__)

PROPERTY = "lakehouse.bronze.sources"


def recorded_sources(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> Sources | None:
    """The sources recorded on ``dataset``'s bronze; None before its first start."""
    text = read_properties(spark, lakehouse.table(dataset.bronze)).get(PROPERTY)
    return None if text is None else Sources.from_json(text)


def changes(recorded: Sources, current: Sources, topics: bool = True) -> list[str]:
    """What differs between the recorded sources and the cluster's, in words; [] when nothing does.

    A topic with no recorded id is new to bronze, not a change. Without ``topics``, only the cluster.

    Example::

        changes(Sources("c1", {"events": "A"}), Sources("c1", {"events": "B"}))
        # ["topic events was deleted and created again (topic id A recorded on bronze, B now)"]
    """
    if not isinstance(recorded, Sources) or not isinstance(current, Sources):
        raise TypeError("recorded and current must be Sources")
    found = []
    if recorded.cluster_id and current.cluster_id and recorded.cluster_id != current.cluster_id:
        found.append(
            f"another Kafka cluster answers (cluster id {recorded.cluster_id} recorded on bronze, "
            f"{current.cluster_id} now)"
        )
    for topic, old in sorted(recorded.topic_ids.items()) if topics else ():
        new = current.topic_ids.get(topic)
        if new is not None and new != old:
            found.append(f"topic {topic} was deleted and created again (topic id {old} recorded on bronze, {new} now)")
    return found


def refusal(config: Config, lakehouse: Lakehouse, found: list[str], stream: str = "bronze") -> str:
    """The refusal of ``stream`` (the one reading Kafka: bronze, or the fused stream) for the changes ``found``."""
    return Refusal.SOURCE_CHANGED.message(
        stream,
        changes="; ".join(found),
        bootstrap=bootstrap_servers(config),
        checkpoint=lakehouse.checkpoint(stream),
    )


def forget_cluster(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> None:
    """Let bronze's next start record whichever cluster answers: what a reset of bronze accepts.

    The topic ids stay: they are what bronze's rows came from, and what it resumes after.

    Example::

        forget_cluster(spark, Lakehouse("/data/lake"))
    """
    recorded = recorded_sources(spark, lakehouse, dataset)
    if recorded is not None and recorded.cluster_id is not None:
        set_properties(spark, lakehouse.table(dataset.bronze), {PROPERTY: Sources(None, recorded.topic_ids).as_json()})


def compacted_records(lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> str:
    """The directory where bronze records each topic it found compacted, a file named after the topic.

    A file per topic, created once and never rewritten: two processes finding the same topic need no
    read-modify-write, and the record lives outside bronze's table, which an operator may put back.

    Example::

        compacted_records(Lakehouse("/data/lake"))  # "/data/lake/sources/compacted"
    """
    return f"{lakehouse.sources(dataset)}/compacted"


def recorded_compacted(spark: SparkSession, lakehouse: Lakehouse, dataset: Dataset = EVENTS_DATASET) -> set[str]:
    """The topics bronze has found compacted, at a start or before a batch (``compacted_records``),
    kept after a policy is set back and after bronze's table is put back.

    Example::

        recorded_compacted(spark, Lakehouse("/data/lake"))  # {"customers"}
    """
    # A hidden name is a record another process is creating (delta/files.create_new), not yet one.
    return {name for name in list_names(spark, compacted_records(lakehouse, dataset)) if not name.startswith(".")}


class SourceGuard:
    """Bronze's check of its sources: once at start, then before each batch is written.

    Example::

        guard = SourceGuard.at_start(spark, config, lakehouse, resuming=True)  # or CheckpointError
        guard.topic_ids()  # {"events": "Xh1...", ...}; CheckpointError if a topic changed since
    """

    def __init__(
        self,
        spark: SparkSession,
        config: Config,
        lakehouse: Lakehouse,
        sources: Sources,
        stream: str = "bronze",
        dataset: Dataset = EVENTS_DATASET,
    ):
        self._spark, self._config, self._lakehouse = spark, config, lakehouse
        self._sources, self._stream, self._dataset = sources, stream, dataset
        self._compacted = recorded_compacted(spark, lakehouse, dataset)

    @classmethod
    def at_start(
        cls,
        spark: SparkSession,
        config: Config,
        lakehouse: Lakehouse,
        resuming: bool,
        stream: str = "bronze",
        dataset: Dataset = EVENTS_DATASET,
    ) -> SourceGuard:
        """Check the cluster against the record on ``dataset``'s bronze and record it, for ``stream`` (the one
        reading Kafka); ``resuming``: its checkpoint has planned batches. ``config`` as the dataset reads it
        (``datasets.config_of``)."""
        current = describe_sources(config, list(config.kafka.topics))
        recorded = recorded_sources(spark, lakehouse, dataset)
        if recorded is not None:
            found = changes(recorded, current, topics=resuming)
            if found:
                raise checkpoints.CheckpointError(refusal(config, lakehouse, found, stream))
        guard = cls(spark, config, lakehouse, recorded or Sources(None), stream, dataset)
        guard._check_compaction(current.topic_ids)
        guard._record(current)
        return guard

    @property
    def recorded_ids(self) -> dict[str, str]:
        """The ids as last checked and recorded on bronze (no call to Kafka)."""
        return dict(self._sources.topic_ids)

    def topic_ids(self) -> dict[str, str]:
        """The current id of every configured topic that exists, refused if one changed since the start."""
        current = describe_sources(self._config, list(self._config.kafka.topics), cluster=False)
        found = changes(self._sources, current)
        if found:
            raise checkpoints.CheckpointError(refusal(self._config, self._lakehouse, found, self._stream))
        self._check_compaction(current.topic_ids)
        if any(topic not in self._sources.topic_ids for topic in current.topic_ids):
            self._record(current)
        return current.topic_ids

    def _check_compaction(self, topic_ids: dict[str, str]) -> None:
        """Refuse (CheckpointError) a compacted topic among ``topic_ids``'s (existing ones) that
        ``kafka.compacted_topics`` does not name: Spark's source skips what the log cleaner removed, so
        records would be lost before bronze read them without a trace. Every compacted topic found is
        recorded first (``compacted_records``), named or not: records bronze holds that the cleaner
        removed since are then no riddle to the audit, even after the policy is set back."""
        compacted = compacted_topics(self._config, list(topic_ids))
        for topic in sorted(compacted - self._compacted):
            found = {"topic_id": topic_ids[topic], "found_ms": int(time.time() * 1000)}
            create_new(self._spark, f"{compacted_records(self._lakehouse, self._dataset)}/{topic}", json.dumps(found))
            self._compacted.add(topic)
        undeclared = sorted(compacted - set(self._config.kafka.compacted_topics))
        if undeclared:
            raise checkpoints.CheckpointError(
                Refusal.SOURCE_COMPACTED.message(
                    self._stream,
                    topics=", ".join(undeclared),
                    declared=list(self._config.kafka.compacted_topics),
                    bootstrap=bootstrap_servers(self._config),
                    topic=undeclared[0],
                )
            )

    def _record(self, current: Sources) -> None:
        # Ids of topics no longer configured stay: they are what bronze's older rows came from.
        merged = Sources(
            current.cluster_id or self._sources.cluster_id, {**self._sources.topic_ids, **current.topic_ids}
        )
        if merged != self._sources:
            set_properties(self._spark, self._lakehouse.table(self._dataset.bronze), {PROPERTY: merged.as_json()})
            log.info("%s: reading %s", self._stream, merged.as_json())
        self._sources = merged
