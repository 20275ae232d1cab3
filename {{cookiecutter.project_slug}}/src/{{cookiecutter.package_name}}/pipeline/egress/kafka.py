"""Kafka egress: gold's changes to a topic exactly once, through Kafka transactions.

The two-phase commit of the classic design, with Kafka as the transactional sink:

* pre-commit, during the batch: the batch's records are computed first (Spark's work, no
  transaction open), then the driver produces each changed gold row in a Kafka
  transaction; the records are in the log but hidden from read_committed consumers;
* commit, once the batch is complete: the batch id goes into the same transaction as
  the committed offset of a consumer group named after the stream id
  (send_offsets_to_transaction), then the transaction commits: records and marker
  become visible together, or neither does. An empty batch moves the marker too;
* the marker moves by one batch only: a batch finds it at the batch before (or at
  itself: a replay, nothing is published); missing after batch 0, or anywhere else,
  it was deleted or expired, or the output topic was recreated, and the batch is
  refused rather than published on top of a changelog that lacks the batches before. The
  marker's metadata names the output topic's id and partition count too: a topic created again
  under its name, or given more partitions, is refused before a batch is published to it;
* the producer is made (``init_transactions``, which fences every older producer of the stream
  id) once, when the stream starts, before the marker is read; never inside a batch. A producer
  that lost a broker connection, or any producer that would need making again, fails the batch
  with ``ProducerLost``, publishing nothing: a process that stood still inside a batch past its
  lease cannot fence the process that took over (or undo a reset's fence) and commit with the
  marker it read before. The stream's next start (a continuous run starts it again at once)
  fences first and reads the marker after;
* after a crash: the transactional id is derived from the stream id, so the restarted
  producer fences the old one and Kafka aborts its open transaction; the marker says,
  from Kafka alone, whether the batch Spark replays was committed. If it was, nothing
  is published; if not, the batch is published again in full. A commit whose outcome
  is unknown (a timeout) is resolved by reading the marker, never by guessing.

The topic is a changelog: key = the gold row's key (window and dimensions) as JSON;
value = the row's figures and the gold version that produced them, as JSON or (``value_format =
"avro"``) as Avro in the Confluent wire format, its schema registered under ``<topic>-value`` in the
registry of ``schema_registry.url`` when the stream starts (``formats/avro_rows.py``), or a
tombstone (null) when gold deleted the row; header ``STREAM_ID_HEADER`` = the stream id
that published it, so a consumer tells a new changelog (a reset or a lost checkpoint
publishes gold's current rows again under a new id) from a repeat. Folding by key, as a
compacted topic or a consumer does, ends at gold. Consumers must read with isolation.level=read_committed:
read_uncommitted consumers also see the records of aborted transactions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from pydantic import Field
from pydantic_settings import SettingsConfigDict
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from ..config import Config, ConfigError, Section, TopicName
from ..dataset import Gold
from ..delta.tables import Lakehouse
from ..formats import Format, avro_rows, wire
from ..formats.registry import RegistryAccess, RegistryUnavailable, SchemaRefused, WriterSchemas, writer_schemas
from ..kafka.clients import client_config, describe_topic
from ..monitoring import EgressOutcome, report_egress_batch
from ..recovery.checkpoints import CheckpointError, last_committed_batch, last_planned_batch
from ..recovery.crash_points import AFTER_PRE_COMMIT, crash_points, reach
from ..recovery.lease import check_held
from ..refusals import Refusal
from . import Target, destination_key, first_gold, first_target, section_settings, target_egress, targets
from .changes import (
    DELETED,
    GOLD_VERSION,
    check_changes_readable,
    gold_changes,
    latest_per_window,
    published_schema,
)

log = logging.getLogger(__name__)

SECTION = "egress_kafka"
STREAM = "kafka_egress"
DESTINATION = "topic"
# What the audit counts in the topic besides its fold (audit_errors).
REPEATED_VERSIONS = f"{STREAM}_records_repeating_a_gold_version"
FINDINGS = (REPEATED_VERSIONS,)
# Every record's header naming the stream id that published it (bytes of the id's text).
STREAM_ID_HEADER = "lakehouse-stream-id"
# The namespace of the Avro record schemas of published rows.
NAMESPACE = __package__.partition(".")[0]
# The broker's default transaction.max.timeout.ms is 15 minutes.
MAX_TRANSACTION_TIMEOUT_MS = 900_000
# The marker lives on one partition of the output topic: the offset the stream's
# consumer group has committed there is the next batch id.
MARKER_PARTITION = 0
COMMIT_ATTEMPTS = 5
# Kafka's own calls (init, flush, offsets) wait at most this long.
KAFKA_TIMEOUT_S = 60.0
# What a client reports when it loses its connection to a broker. After that, librdkafka's producer may
# keep a group coordinator that is gone in its cache, and send_offsets_to_transaction then waits for it
# past its own timeout, for good (librdkafka issues 5456 and 5511, open in 2.16): a broker restarted
# between two batches hung the next one. Only a producer made afresh looks the coordinator up again, and
# that is made only by the stream's next start: the batch fails with ProducerLost.
CONNECTION_LOST = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
# A group's coordinator moving or loading its state, as right after a broker restart: asked again. The
# client's own answer to committed() does not flag these retriable.
COORDINATOR_BUSY = frozenset(
    {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE}
)


class EgressError(RuntimeError):
    """A batch could not be published; nothing of it is visible and the replay publishes it again."""


class ProducerLost(EgressError):
    """The producer lost a broker connection (it may keep a coordinator that is gone): the batch fails
    before its transaction begins, nothing of it is published, and this egress publishes no more.

    A producer is never made again inside a batch: that would fence whichever process holds the stream
    now, or undo a reset's fence, after this one checked its lease and read the marker. The stream's next
    start makes a new producer (the fence) and then reads the marker; a continuous run starts the stream
    again at once (``restarts_the_stream``)."""


def restarts_the_stream(failure: object) -> bool:
    """Whether a stream that ended with ``failure`` (its query's exception, or the error) failed only
    because its producer must be made anew: the stream is then started again, as a new process would.

    Example::

        if not query.isActive and restarts_the_stream(query.exception()):
            query = start_stream(spark, config, STREAM, available_now=False)
    """
    return failure is not None and ProducerLost.__name__ in str(failure)


class KafkaEgressSettings(Section):
    """``[egress_kafka]``; EGRESS_KAFKA_TOPIC (and EGRESS_KAFKA_<KEY> for any key) overrides it.

    ``topic`` is where the first dataset's first gold goes; ``golds`` names any other gold it publishes,
    each to a topic of its own (``"orders.by_shop" = "orders-by-shop-changes"``).
    """

    model_config = SettingsConfigDict(env_prefix="EGRESS_KAFKA_")

    topic: TopicName
    golds: dict[str, TopicName] = Field(default_factory=dict)
    # Longer than a batch can take: Kafka aborts a transaction open longer than this. At most the
    # broker's transaction.max.timeout.ms (15 minutes by default).
    transaction_timeout_ms: int = Field(60_000, ge=1000, le=MAX_TRANSACTION_TIMEOUT_MS)
    # A consumer rebuilds gold by folding the topic from its start: only compaction keeps every key's
    # newest value for as long as the topic lives. Off only for a topic no consumer folds from its start.
    require_compacted_topic: bool = True
    # How values are written: JSON objects, or Avro through the registry of schema_registry.url.
    value_format: Literal["json", "avro"] = Format.JSON.value


@dataclass(frozen=True)
class ValueSchema:
    """The Avro schema a stream writes its values with, and its id in the registry."""

    schema_id: int
    text: str


Settings = KafkaEgressSettings


def transactional_id(stream_id: str) -> str:
    """The producer's transactional id: one per stream id, so a restart fences the process before it."""
    if not stream_id:
        raise ValueError("stream_id must be the egress stream's id")
    return f"lakehouse-egress-{stream_id}"


def marker_group(stream_id: str) -> str:
    """The consumer group whose committed offset on the marker partition is the next batch id."""
    if not stream_id:
        raise ValueError("stream_id must be the egress stream's id")
    return f"lakehouse-egress-{stream_id}"


def changelog_records(latest: DataFrame, gold: Gold | None = None, avro: ValueSchema | None = None) -> DataFrame:
    """(key, value) of each changed row of ``gold`` (default: the first dataset's first): the key as JSON, the
    value as JSON or, with ``avro``, its bytes in the wire format; value null for a deleted row. A sketch an
    approximate distinct count merges is not published: its estimate is.

    Example::

        changelog_records(latest_per_window(batch)).show(truncate=False)
    """
    gold = first_gold(gold)
    if avro is not None and not isinstance(avro, ValueSchema):
        raise TypeError(f"avro must be a ValueSchema, not {type(avro).__name__}")
    missing = {GOLD_VERSION, DELETED, *gold.key} - set(latest.columns)
    if missing:
        raise ValueError(f"latest must come from latest_per_window; missing {sorted(missing)}")
    state = F.struct(*gold.key, *gold.values, GOLD_VERSION)
    value = F.to_json(state) if avro is None else avro_rows.encode(state, avro.schema_id, avro.text)
    return latest.select(F.to_json(F.struct(*gold.key)).alias("key"), F.when(~F.col(DELETED), value).alias("value"))


def value_schema_text(target: Target) -> str:
    """The Avro schema of ``target``'s published rows (its gold's key, figures and gold_version), named after
    its gold table: what the stream registers under ``<topic>-value``.

    Example::

        value_schema_text(target)  # '{"type": "record", "name": "gold_orders_by_shop", ...}'
    """
    return avro_rows.record_schema(published_schema(target), target.gold_table, NAMESPACE)


def register_value_schema(config: Config, target: Target) -> ValueSchema:
    """Register ``target``'s value schema under ``<topic>-value`` (or find it there): its id. ConfigError,
    naming ``egress_kafka.value_format`` and the subject, when the subject's compatibility refuses it or no
    registry is set; naming the registry's setting when it does not answer.

    Example::

        register_value_schema(config, target).schema_id  # 12
    """
    text = value_schema_text(target)
    subject = f"{target.destination}-value"
    try:
        return ValueSchema(_registry(config).register(subject, text), text)
    except SchemaRefused as error:
        raise ConfigError(
            f"{SECTION}.value_format: avro: {error}. The published columns of {target.gold_table} changed in a "
            f"way its consumers' schema rule refuses: publish to a new topic (`{topic_setting(target)[0]}`, then "
            f"`checkpoints reset {target.stream}`), or change the subject's compatibility if its consumers allow"
        ) from None
    except RegistryUnavailable as error:
        raise ConfigError(str(error)) from None


def _registry(config: Config) -> WriterSchemas:
    if not config.schema_registry.url:
        raise ConfigError(
            f"{SECTION}.value_format: avro names its schemas in a registry: set schema_registry.url "
            "(SCHEMA_REGISTRY_URL; `local` for the registry of `registry-local start`)"
        )
    return writer_schemas(RegistryAccess.of(config.schema_registry))


class KafkaEgress:
    """Publishes batches of gold changes to ``settings.topic``, one Kafka transaction each.

    Creating it fences every older producer of the same stream id and aborts its open
    transaction. Use one per running stream, from the driver. It makes its producer once: after
    ``ProducerLost`` it publishes nothing more, and the stream's next start creates another.

    ``target`` is the gold it publishes and its topic (default: the first dataset's first gold, to
    ``settings.topic``).

    Example::

        egress = KafkaEgress(config, settings(config), stream_id)
        egress.publish(changes_batch, batch_id=7)
    """

    def __init__(
        self,
        config: Config,
        settings: KafkaEgressSettings,
        stream_id: str,
        target: Target | None = None,
        commit_timeout_s: float = KAFKA_TIMEOUT_S,
    ) -> None:
        if not isinstance(settings, KafkaEgressSettings):
            raise TypeError(f"settings must be KafkaEgressSettings, not {type(settings).__name__}")
        if not stream_id:
            raise ValueError("stream_id is needed: the transactional id and the marker are derived from it")
        if not commit_timeout_s > 0:
            raise ValueError(f"commit_timeout_s must be positive, not {commit_timeout_s!r}")
        if target is not None and not isinstance(target, Target):
            raise TypeError(f"target must be an egress Target, not {type(target).__name__}")
        self.config, self.settings, self.stream_id = config, settings, stream_id
        self.target = target or first_target(STREAM, settings.topic)
        self.stream, self.topic = self.target.stream, self.target.destination
        self.commit_timeout_s = commit_timeout_s
        # Registered before anything is published: a refused schema stops the stream at its start.
        self.avro = register_value_schema(config, self.target) if settings.value_format == Format.AVRO else None
        self.marker = TopicPartition(self.topic, MARKER_PARTITION)
        self.delivery_errors: list[str] = []
        self.connection_lost = False
        self.producer = self._new_producer()  # the only place a producer is made: before any marker read
        marker_reader = {"group.id": marker_group(stream_id), "isolation.level": "read_committed"}
        self.consumer = Consumer(client_config(config, **marker_reader, **{"enable.auto.commit": False}))

    def _new_producer(self) -> Producer:
        """The stream's transactional producer, initialised: any older one of its stream id is fenced."""
        producer = Producer(
            client_config(
                self.config,
                **{
                    "transactional.id": transactional_id(self.stream_id),
                    "transaction.timeout.ms": self.settings.transaction_timeout_ms,
                    # The Java client's partitioner: the same key lands where a JVM producer puts it.
                    "partitioner": "murmur2_random",
                    "linger.ms": 20,
                    "error_cb": self._on_client_error,
                },
            )
        )
        producer.init_transactions(KAFKA_TIMEOUT_S)
        return producer

    def _on_client_error(self, error: KafkaError) -> None:
        # Served on the thread that polls the producer; librdkafka retries the connection itself.
        if error.code() in CONNECTION_LOST:
            self.connection_lost = True

    def committed_batch(self, timeout_s: float = KAFKA_TIMEOUT_S) -> int | None:
        """The last batch id committed to the topic by this stream; None before the first.

        A transaction still open or being committed makes Kafka answer "unstable" until it ends;
        past ``timeout_s`` that is a KafkaException (timed out), never a guess.
        """
        return _batch_of(self._marker(timeout_s))

    def check_topic(self, marker: TopicPartition | None = None) -> tuple[str, int]:
        """The output topic's (id, partition count); CheckpointError when either differs from what the
        marker records of the topic the stream published to.

        A topic deleted and created again under the same name has another id and lacks the batches
        published before: Kafka usually drops the marker with the old topic, but a marker that outlived
        it would let the next batch publish changes only, onto an empty changelog. Kafka places a key by
        hashing it over the partitions: with more of them, a key's next change lands in another
        partition than its earlier ones, and a consumer folding the topic by key can no longer tell
        which value is the newest. ``marker`` is the marker just read (default: read it). A marker whose
        metadata lacks the topic id or the partition count is not checked for the one it lacks.
        """
        marker = self._marker(KAFKA_TIMEOUT_S) if marker is None else marker
        recorded = json.loads(marker.metadata or "{}")
        described = describe_topic(self.config, self.topic)
        if described is None:
            raise ConfigError(f"{topic_setting(self.target)[0]}: topic {self.topic!r} does not exist")
        topic_id, partitions = described
        if recorded.get("topic_id") not in (None, topic_id):
            raise CheckpointError(
                Refusal.KAFKA_OUTPUT_TOPIC_RECREATED.message(
                    self.stream,
                    topic=self.topic,
                    recorded=recorded["topic_id"],
                    now=topic_id,
                    stream_id=self.stream_id,
                )
            )
        if recorded.get("partitions") not in (None, partitions):
            raise CheckpointError(
                Refusal.KAFKA_OUTPUT_PARTITIONS_CHANGED.message(
                    self.stream,
                    topic=self.topic,
                    recorded=recorded["partitions"],
                    now=partitions,
                    stream_id=self.stream_id,
                    key=self._key_text(),
                )
            )
        return topic_id, partitions

    def _key_text(self) -> str:
        """The config key naming this stream's topic, and its variable, as a way out names them."""
        key, variable = topic_setting(self.target)
        return f"`{key}` (or `{variable}`)"

    def _marker(self, timeout_s: float) -> TopicPartition:
        """The marker as the stream's consumer group has it committed. A retriable answer (the group's
        coordinator moving or still loading, as right after a broker restart) is asked again until
        ``timeout_s`` has passed; then, or on any other error, KafkaException."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                [found] = self.consumer.committed(
                    [TopicPartition(self.topic, MARKER_PARTITION)],
                    timeout=max(deadline - time.monotonic(), 1.0),
                )
                if found.error is not None:
                    raise KafkaException(found.error)
                return found
            except KafkaException as error:
                kafka_error: KafkaError = error.args[0]
                busy = kafka_error.retriable() or kafka_error.code() in COORDINATOR_BUSY
                if not busy or time.monotonic() > deadline:
                    raise
                log.warning("%s: reading the marker failed (%s); asking again", self.stream, kafka_error.str())
                time.sleep(0.5)

    def publish(self, changes: DataFrame, batch_id: int) -> int:
        """Publish one batch of gold's change feed in one transaction; returns the records published.

        A batch the marker shows as committed publishes nothing (a replay).
        """
        if batch_id < 0:
            raise ValueError(f"batch_id must not be negative, got {batch_id}")
        self._check_producer(batch_id)  # a connection lost between batches: failed before the marker is read
        marker = self._marker(KAFKA_TIMEOUT_S)
        committed = _batch_of(marker)
        if committed is not None and committed >= batch_id:
            sink = f"topic {self.topic} (marker {committed})"
            report_egress_batch(self.stream, batch_id, EgressOutcome.ALREADY_COMMITTED, records=0, sink=sink)
            return 0
        needed = batch_id - 1 if batch_id > 0 else None
        if committed != needed:
            raise CheckpointError(self.marker_refusal(committed, f"batch {batch_id} needs {_marker_text(needed)}"))
        topic_id, partitions = self.check_topic(marker)
        gold = self.target.gold
        records = changelog_records(latest_per_window(changes, gold), gold, self.avro)
        if batch_id == 0:
            # A new stream id starts a new changelog from gold's current rows: rows an older
            # stream published that gold no longer has get a tombstone, so folding ends at gold.
            records = records.unionByName(self._stale_keys(changes.sparkSession, records))
        # Spark's work done before the transaction opens: inside it, only producing and committing.
        records = records.persist()
        try:
            records.count()
            published = self._transaction(records, batch_id, topic_id, partitions)
        finally:
            records.unpersist()
        report_egress_batch(self.stream, batch_id, EgressOutcome.COMMITTED, published, f"topic {self.topic}")
        return published

    def marker_refusal(self, committed: int | None, needed: str) -> str:
        """The refusal of a marker that is not where the stream's progress puts it (``needed`` says where)."""
        return Refusal.KAFKA_MARKER_LOST.message(
            self.stream,
            topic=self.topic,
            found=_marker_text(committed),
            stream_id=self.stream_id,
            group=marker_group(self.stream_id),
            needed=needed,
        )

    def _check_producer(self, batch_id: int) -> None:
        self.producer.poll(0)  # serves what the client reported since the last batch, or during this one
        if self.connection_lost:
            # A producer made inside a batch would fence whoever holds the stream by now (this process may
            # have stood still since it checked its lease) and then commit with what it read before.
            raise self._lost(batch_id)

    def _lost(self, batch_id: int) -> ProducerLost:
        return ProducerLost(
            f"{self.stream}: the producer of stream {self.stream_id} lost a broker connection; nothing of batch "
            f"{batch_id} is published. The stream's next start makes a new producer, fencing any older one, "
            "then reads the marker and publishes the batch once"
        )

    def _transaction(self, records: DataFrame, batch_id: int, topic_id: str, partitions: int) -> int:
        self._check_producer(batch_id)
        opened = time.monotonic()
        try:
            self.producer.begin_transaction()
            published = 0
            for row in records.toLocalIterator():
                self._produce(row.key, row.value)
                published += 1
            self.producer.flush(KAFKA_TIMEOUT_S)
            reach(self.stream, AFTER_PRE_COMMIT, batch_id)
            metadata = json.dumps(
                {"stream_id": self.stream_id, "batch_id": batch_id, "topic_id": topic_id, "partitions": partitions}
            )
            self.producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, MARKER_PARTITION, batch_id + 1, metadata=metadata)],
                self.consumer.consumer_group_metadata(),
                KAFKA_TIMEOUT_S,
            )
            self._commit(batch_id)
        except (KafkaException, EgressError) as error:
            fatal = isinstance(error, KafkaException) and error.args[0].fatal()
            if self.connection_lost and not fatal and not isinstance(error, ProducerLost):
                # Lost inside the transaction (a coordinator gone, a call timed out): its records stay
                # hidden, and the next start's producer aborts the transaction as it fences this one.
                raise self._lost(batch_id) from error
            open_ms = (time.monotonic() - opened) * 1000
            if open_ms < self.settings.transaction_timeout_ms:
                raise
            # Kafka aborted a transaction open longer than its timeout: a replay would take as long.
            raise EgressError(
                f"{SECTION}.transaction_timeout_ms: the transaction of batch {batch_id} was open {open_ms:.0f} ms, "
                f"longer than transaction_timeout_ms {self.settings.transaction_timeout_ms}, and Kafka aborted it "
                f"({error}); nothing of it is visible. Raise {SECTION}.transaction_timeout_ms (at most the broker's "
                "transaction.max.timeout.ms; a batch publishes at most one record per gold row), then run again"
            ) from error
        return published

    def close(self, timeout_s: float = KAFKA_TIMEOUT_S) -> None:
        """Close the marker's consumer and the producer, delivering what the producer holds within ``timeout_s``."""
        self.consumer.close()
        try:
            self.producer.flush(timeout_s)
        except KafkaException:
            pass  # fenced by a newer process of this stream: nothing of ours is left to deliver

    def _produce(self, key: str, value: str | bytes | None) -> None:
        while True:
            try:
                encoded = value.encode() if isinstance(value, str) else value
                self.producer.produce(
                    self.topic, key=key.encode(), value=encoded, headers=[(STREAM_ID_HEADER, self.stream_id)]
                )
                return
            except BufferError:
                # The local queue is full: deliver some, then go on.
                self.producer.poll(0.1)

    def _commit(self, batch_id: int) -> None:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.producer.commit_transaction(self.commit_timeout_s)
                return
            except KafkaException as error:
                kafka_error: KafkaError = error.args[0]
                if kafka_error.txn_requires_abort():
                    self.producer.abort_transaction(KAFKA_TIMEOUT_S)
                    raise EgressError(
                        f"{self.stream}: the transaction of batch {batch_id} was aborted ({kafka_error.str()}); "
                        "nothing of it is visible, and the batch is published again when it is replayed"
                    ) from error
                if not kafka_error.retriable():
                    raise  # fatal, e.g. fenced: a newer process runs this stream
            # The outcome is unknown: the marker, committed in the same transaction, tells.
            committed = self._marker_once_stable()
            if committed is not None and committed >= batch_id:
                log.warning("%s: commit of batch %d timed out; the marker shows it committed", self.stream, batch_id)
                # The producer still waits for the outcome of its timed-out call and refuses to begin
                # the next transaction (_CONFLICT) until the commit is called again: Kafka has
                # committed, so this call completes at once.
                self.producer.commit_transaction(KAFKA_TIMEOUT_S)
                return
            log.warning(
                "%s: commit of batch %d timed out and the marker does not show it (yet); committing again "
                "(attempt %d of %d)",
                self.stream,
                batch_id,
                attempt + 1,
                COMMIT_ATTEMPTS,
            )
        raise EgressError(
            f"{self.stream}: the commit of batch {batch_id} did not complete after {COMMIT_ATTEMPTS} tries"
        )

    def _marker_once_stable(self) -> int | None:
        # While the transaction is open or being committed, Kafka answers "unstable" for its offsets;
        # the answer is read once it ends, within the transaction's own timeout (None: still unknown).
        deadline = time.monotonic() + min(self.settings.transaction_timeout_ms / 1000, KAFKA_TIMEOUT_S)
        while True:
            try:
                return self.committed_batch(timeout_s=max(deadline - time.monotonic(), 1.0))
            except KafkaException:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.2)

    def _stale_keys(self, spark: SparkSession, records: DataFrame) -> DataFrame:
        live = _folded(committed_changelog(spark, self.config, self.target, decoded=False))
        deleted = F.lit(None).cast(records.schema["value"].dataType).alias("value")
        return live.join(records, "key", "left_anti").select("key", deleted)


def _batch_of(marker: TopicPartition) -> int | None:
    # The committed offset is the next batch id; none committed yet is a negative sentinel.
    return marker.offset - 1 if marker.offset >= 0 else None


def _marker_text(batch: int | None) -> str:
    return "no marker" if batch is None else f"the marker at batch {batch}"


def committed_changelog(
    spark: SparkSession, config: Config, target: Target | None = None, decoded: bool = True
) -> DataFrame:
    """Every committed record of ``target``'s topic (default: the first gold's), as a read_committed consumer
    sees it: key, value (JSON text, or the wire format's bytes for Avro), gold_version, and the stream id
    that published it (``stream_id``, null for a record without the header). ``decoded=False`` leaves
    gold_version out, and an Avro topic's values unread.

    Example::

        committed_changelog(spark, config).groupBy("stream_id", "key", GOLD_VERSION).count().where("count > 1")
    """
    from ..kafka.clients import bootstrap_servers, spark_security_options

    target = target or first_target(STREAM, settings(config).topic)
    avro = settings(config).value_format == Format.AVRO
    records = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers(config))
        .option("subscribe", target.destination)
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .options(**spark_security_options(config))
        .load()
        .select(
            F.col("key").cast("string").alias("key"),
            F.col("value") if avro else F.col("value").cast("string").alias("value"),
            F.filter("headers", lambda header: header["key"] == STREAM_ID_HEADER)[0]["value"]
            .cast("string")
            .alias("stream_id"),
            "partition",
            "offset",
        )
    )
    if not decoded:
        return records
    version = published_row(config, target, records)[GOLD_VERSION].cast("long").alias(GOLD_VERSION)
    return records.select("key", "value", version, "stream_id", "partition", "offset")


def published_row(config: Config, target: Target, records: DataFrame) -> Column:
    """The published row of each of ``records`` (from ``committed_changelog``) as a struct of
    ``published_schema``: JSON parsed, or Avro read with the writer schema each value names (one job
    collects the ids first).

    Example::

        folded.select(published_row(config, target, folded).alias("row")).select("row.*")
    """
    if settings(config).value_format != Format.AVRO:
        return F.from_json("value", published_schema(target))
    ids = records.select(wire.schema_id(F.col("value")).alias("id")).where("id IS NOT NULL").distinct().collect()
    found = _registry(config).lookup(sorted(row.id for row in ids))
    if not found:
        return F.lit(None).cast(published_schema(target))
    missing = sorted(schema_id for schema_id, writer in found.items() if writer is None)
    if missing:
        raise EgressError(
            f"{target.stream}: topic {target.destination} holds values of schema ids {missing}, which the registry "
            "of schema_registry.url does not hold: something other than this egress wrote to it"
        )
    writers = {number: writer.text for number, writer in found.items()}
    return avro_rows.decode(F.col("value"), writers, value_schema_text(target))


def read_back(spark: SparkSession, config: Config, target: Target | None = None) -> DataFrame:
    """The topic of ``target`` (default: the first gold's) folded by key, as a consumer folds it: the gold's
    published columns and gold_version, tombstones removed.

    Example::

        read_back(spark, config).orderBy("window_start").show()
    """
    target = target or first_target(STREAM, settings(config).topic)
    folded = _folded(committed_changelog(spark, config, target, decoded=False))
    return folded.select(published_row(config, target, folded).alias("row")).select("row.*")


def _folded(changelog: DataFrame) -> DataFrame:
    # The newest value of each key; a tombstone deletes the key.
    return (
        changelog.groupBy("key")
        .agg(F.max_by("value", F.struct("partition", "offset")).alias("value"))
        .where(F.col("value").isNotNull())
    )


def audit_errors(spark: SparkSession, config: Config, target: Target | None = None) -> dict[str, int]:
    """What the audit counts as wrong in ``target``'s topic besides its fold: a (gold row, gold version) one
    stream id published twice (a new stream id, after a reset, publishes gold's current rows again as a new
    changelog). The key names the stream: ``<stream>_records_repeating_a_gold_version``.

    Example::

        audit_errors(spark, config)  # {"kafka_egress_records_repeating_a_gold_version": 0}
    """
    target = target or first_target(STREAM, settings(config).topic)
    changelog = committed_changelog(spark, config, target).where(F.col("value").isNotNull())
    repeated = changelog.groupBy("stream_id", "key", GOLD_VERSION).count()
    return {repeated_versions(target.stream): repeated.where("count > 1").count()}


def repeated_versions(stream: str) -> str:
    """The audit's key for the records of egress stream ``stream`` that repeat a gold version."""
    return REPEATED_VERSIONS.replace(STREAM, stream, 1)


def check_connection(config: Config) -> None:
    """Every output topic must exist (production topics are provisioned) and be compacted; ConfigError names
    the setting.

    Example::

        check_connection(config)  # before Spark starts: a topic that deletes by time stops the run with exit 2
    """
    egress = settings(config)
    if egress.value_format == Format.AVRO:
        try:
            _registry(config).check()
        except RegistryUnavailable as error:
            raise ConfigError(str(error)) from None
    admin = AdminClient(client_config(config))
    listed = admin.list_topics(timeout=30).topics
    for target in _targets(config):
        topic = target.destination
        key, variable = topic_setting(target)
        described = listed.get(topic)
        if described is None or described.error is not None:
            raise ConfigError(
                f"{key}: topic {topic!r} does not exist on {config.kafka.bootstrap_servers}; create it "
                f"with cleanup.policy=compact or set {variable}"
            )
        if not egress.require_compacted_topic:
            continue
        policy = cleanup_policy(admin, topic)
        if policy != "compact":
            raise ConfigError(
                f"{key}: topic {topic!r} has cleanup.policy={policy}: Kafka deletes its records by age, "
                "so a consumer folding the changelog from its start misses every gold row not changed since. "
                f"Compact it: kafka-configs.sh --bootstrap-server {config.kafka.bootstrap_servers} --alter "
                f"--entity-type topics --entity-name {topic} --add-config cleanup.policy=compact "
                f"(or, if no consumer folds it from its start, set {SECTION}.require_compacted_topic = false)"
            )


def topic_setting(target: Target) -> tuple[str, str]:
    """The config key that names ``target``'s topic, and the variable that overrides it: ``topic`` for the first
    dataset's first gold, the gold's entry of ``golds`` for another.

    Example::

        topic_setting(target)  # ('egress_kafka.golds."orders.by_shop"', "EGRESS_KAFKA_GOLDS")
    """
    key = destination_key(SECTION, DESTINATION, target)
    field = DESTINATION if key == f"{SECTION}.{DESTINATION}" else "golds"
    return key, KafkaEgressSettings.variables(field)[0]


def _targets(config: Config) -> list[Target]:
    """The golds this egress publishes in ``config``: its first stream's, then the others ``golds`` names."""
    return [each for each in targets(config).values() if target_egress(each.stream) == STREAM]


def cleanup_policy(admin: AdminClient, topic: str) -> str:
    """The topic's ``cleanup.policy`` as the broker reports it (``delete``, ``compact`` or both, comma-separated).

    ConfigError when the login may not read the topic's configuration (the DescribeConfigs ACL).

    Example::

        cleanup_policy(AdminClient(client_config(config)), "gold-changes")  # "compact"
    """
    if not topic:
        raise ValueError("topic must name the output topic")
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout=30)
    except KafkaException as error:
        raise ConfigError(
            f"{SECTION}.topic: cannot read the configuration of topic {topic!r} ({error.args[0].str()}); the "
            f"pipeline's user needs DescribeConfigs on it, or set {SECTION}.require_compacted_topic = false"
        ) from error
    return entries["cleanup.policy"].value


def fence(config: Config, stream_id: str) -> None:
    """End the producer of ``stream_id``: a process still running it can commit nothing more.

    A reset calls it before it forgets the stream: initialising a producer with the old
    transactional id makes the broker abort that id's open transaction and bump its epoch, so a
    process of the old stream that stood still (its lease lost) and wakes fails its commit as
    fenced instead of publishing a batch beside the new stream's snapshot.

    Example::

        fence(config, "6f1c...")  # the old stream id, read from its checkpoint
    """
    if not stream_id:
        raise ValueError("stream_id must be the egress stream's id")
    producer = Producer(client_config(config, **{"transactional.id": transactional_id(stream_id)}))
    producer.init_transactions(KAFKA_TIMEOUT_S)
    producer.flush(KAFKA_TIMEOUT_S)


def provision_local(config: Config) -> None:
    """Create the output topics on the development broker, compacted: a changelog keeps each key's newest value."""
    admin = AdminClient(client_config(config))
    existing = admin.list_topics(timeout=30).topics
    for target in _targets(config):
        if target.destination in existing:
            continue
        topic = target.destination
        new = NewTopic(topic, num_partitions=2, replication_factor=1, config={"cleanup.policy": "compact"})
        admin.create_topics([new])[topic].result(timeout=30)


def describe(config: Config, target: Target | None = None) -> dict:
    """Where the egress writes ``target`` (default: the first gold), and how consumers must read it.

    Example::

        describe(config)  # {"output_topic": "gold-changes", "isolation_level_for_consumers": "read_committed"}
    """
    target = target or first_target(STREAM, settings(config).topic)
    return {"output_topic": target.destination, "isolation_level_for_consumers": "read_committed"}


def start(spark: SparkSession, config: Config, lakehouse: Lakehouse, stream_id: str, target: Target | None = None):
    """The writer of the stream that publishes ``target`` (default: the first gold): the gold's change feed,
    one Kafka transaction per micro-batch.

    Refuses (CheckpointError) when the topic's marker is ahead of the checkpoint, or behind it (lost), or
    when gold changes it has yet to publish were removed by VACUUM.

    Example::

        start(spark, config, lakehouse, prepared.stream_id).option("checkpointLocation", path).start()
    """
    target = target or first_target(STREAM, settings(config).topic)
    stream = target.stream
    check_changes_readable(spark, lakehouse, stream, target.gold_table)
    egress = KafkaEgress(config, settings(config), stream_id, target)
    committed = egress.committed_batch()
    planned = last_planned_batch(spark, lakehouse.checkpoint(stream))
    done = last_committed_batch(spark, lakehouse.checkpoint(stream))
    if done is not None and (committed is None or committed < done):
        # Every batch moves the marker before Spark logs it committed: the marker was lost.
        egress.close()
        raise CheckpointError(
            egress.marker_refusal(committed, f"checkpoint {lakehouse.checkpoint(stream)} has batch {done} committed")
        )
    try:
        egress.check_topic()
    except CheckpointError:
        egress.close()
        raise
    if committed is not None and (planned is None or committed > planned):
        egress.close()
        raise CheckpointError(
            Refusal.KAFKA_MARKER_AHEAD.message(
                stream,
                topic=egress.topic,
                batch=committed,
                stream_id=stream_id,
                group=marker_group(stream_id),
                checkpoint=lakehouse.checkpoint(stream),
                planned=planned,
            )
        )

    def write_batch(changes: DataFrame, batch_id: int) -> None:
        with crash_points(changes.sparkSession, stream, batch_id):
            check_held(lakehouse, stream)
            try:
                egress.publish(changes, batch_id)
            except ProducerLost:
                egress.close(timeout_s=0)  # this egress publishes no more: the stream's next start makes another
                raise
        check_held(lakehouse, stream)  # before Spark's commit-log entry

    return gold_changes(spark, lakehouse, target.gold_table).writeStream.foreachBatch(write_batch)


def settings(config: Config) -> KafkaEgressSettings:
    """This egress's settings in ``config`` (parsed by ``egress.configure``); ValueError when it is off.

    Example::

        settings(config).topic  # "gold-changes"
    """
    return section_settings(config, STREAM, KafkaEgressSettings)
