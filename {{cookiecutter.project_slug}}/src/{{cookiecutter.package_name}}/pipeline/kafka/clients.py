"""Everything that talks to Kafka settings: Spark source options and client configs.

Spark's Kafka source (a JVM client) and the confluent-kafka clients (librdkafka) are
configured here from the same KafkaConfig, so TLS and SASL settings cannot drift
apart between bronze, the audit, the producers and the admin calls. Its secrets are SecretStr
and are unwrapped only here, in the settings handed to a client.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from ..config import LOCAL_BOOTSTRAP, SASL_PASSWORD_VAR, SSL_KEY_PASSWORD_VAR, Config, ConfigError, KafkaConfig

log = logging.getLogger(__name__)
T = TypeVar("T")

# What an admin question meets for a moment while a broker restarts or a leader moves: the same question
# asked again gets its answer. Bronze asks before every batch, so one restart must not fail the batch.
TRANSIENT_ADMIN_ERRORS = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_CONTROLLER,
        KafkaError.REQUEST_TIMED_OUT,
    }
)
ADMIN_RETRY_S = 60.0

JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


@dataclass(frozen=True)
class Sources:
    """The cluster bronze reads and the id of each topic there (a topic missing from the cluster is absent)."""

    cluster_id: str | None
    topic_ids: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps({"cluster_id": self.cluster_id, "topic_ids": self.topic_ids}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Sources:
        data = json.loads(text)
        return cls(data.get("cluster_id"), dict(data.get("topic_ids", {})))


def bootstrap_servers(config: Config) -> str:
    """The brokers to connect to. 'local' must have been resolved by the caller (the CLI does it once)."""
    if config.kafka.bootstrap_servers == LOCAL_BOOTSTRAP:
        raise ConfigError(
            "kafka.bootstrap_servers: 'local' names the development broker and was not resolved; "
            "run through the command line, or set KAFKA_BOOTSTRAP_SERVERS"
        )
    return config.kafka.bootstrap_servers


def client_config(config: Config, **extra: object) -> dict:
    """Settings for confluent-kafka producers, consumers and admin clients, security included.

    Example::

        producer = Producer(client_config(config, **{"linger.ms": 5}))
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    settings: dict = {"bootstrap.servers": bootstrap_servers(config)}
    kafka = config.kafka
    if kafka.security_protocol != "PLAINTEXT":
        settings["security.protocol"] = kafka.security_protocol
        settings["ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_endpoint_identification else "none"
        # Without a CA file, the system's CAs (librdkafka's own default path may not exist here).
        settings["ssl.ca.location"] = kafka.ssl_ca_location or "probe"
        if kafka.ssl_certificate_location:
            settings["ssl.certificate.location"] = kafka.ssl_certificate_location
            settings["ssl.key.location"] = kafka.ssl_key_location
            if kafka.ssl_key_password is not None:
                settings["ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    if kafka.sasl_mechanism:
        settings.update(
            {
                "sasl.mechanism": kafka.sasl_mechanism,
                "sasl.username": kafka.sasl_username,
                "sasl.password": kafka.sasl_password.get_secret_value() if kafka.sasl_password else None,
            }
        )
    settings.update(extra)
    return settings


def spark_security_options(config: Config) -> dict[str, str]:
    """Security options of Spark's Kafka source and batch reader (the ``kafka.`` prefixed ones).

    Example::

        spark.read.format("kafka").options(**spark_security_options(config))
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    kafka = config.kafka
    options = {"kafka.security.protocol": kafka.security_protocol}
    if kafka.security_protocol != "PLAINTEXT":
        # The JVM client's way to turn host name checks off is an empty algorithm.
        options["kafka.ssl.endpoint.identification.algorithm"] = "https" if kafka.ssl_endpoint_identification else ""
        if kafka.ssl_ca_location:
            options["kafka.ssl.truststore.type"] = "PEM"
            options["kafka.ssl.truststore.location"] = kafka.ssl_ca_location
        if kafka.ssl_certificate_location:
            # A PEM keystore given by location must be one file holding key and chain, and its
            # key must be encrypted; given by value, the team's separate files work as they are.
            # The values travel to the executors with the options, so only the driver reads them.
            options["kafka.ssl.keystore.type"] = "PEM"
            options["kafka.ssl.keystore.certificate.chain"] = Path(kafka.ssl_certificate_location).read_text()
            options["kafka.ssl.keystore.key"] = Path(kafka.ssl_key_location or "").read_text()
            if kafka.ssl_key_password is not None:
                options["kafka.ssl.key.password"] = kafka.ssl_key_password.get_secret_value()
    if kafka.sasl_mechanism:
        user = _jaas_quote(kafka.sasl_username or "")
        password = _jaas_quote(kafka.sasl_password.get_secret_value() if kafka.sasl_password else "")
        options["kafka.sasl.mechanism"] = kafka.sasl_mechanism
        # Spark redacts option values that contain "password" from its logs and UI.
        options["kafka.sasl.jaas.config"] = (
            f'{JAAS_MODULES[kafka.sasl_mechanism]} required username="{user}" password="{password}";'
        )
    return options


def check_connection(config: Config, timeout: float = 15.0) -> None:
    """Connect and authenticate once with a short timeout; raise ConfigError naming the setting at fault.

    Spark's JVM client retries a refused login or an untrusted certificate forever, so the
    command line calls this before Spark starts: a wrong password stops the run in seconds.

    Example::

        check_connection(config)   # ConfigError: kafka.ssl_ca_location: ... not trusted ...
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, not {timeout!r}")
    errors: list[tuple[str, str]] = []
    settings = client_config(
        config,
        # The callback copies: librdkafka's error objects are not to be kept past it.
        error_cb=lambda error: errors.append((error.name(), error.str())),
        # The callback sees every error; librdkafka's own log would repeat each on stderr.
        log_level=0,
        **{"reconnect.backoff.max.ms": 1000, "socket.connection.setup.timeout.ms": max(1000, int(timeout * 1000))},
    )
    try:
        admin = AdminClient(settings)
    except KafkaException as error:
        # librdkafka loads the CA, certificate and key when the client is created.
        raise ConfigError(explain_refusal(config.kafka, str(error.args[0].str()))) from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=min(1.0, timeout))
            return
        except KafkaException:
            pass
        admin.poll(0.1)
        refused = [error for error in errors if error[0] in {"_AUTHENTICATION", "_SSL"} or "SSL" in error[1]]
        if refused:
            raise ConfigError(explain_refusal(config.kafka, refused[0][1]))
        if time.monotonic() > deadline:
            raise ConfigError(
                f"kafka.bootstrap_servers: no broker at {config.kafka.bootstrap_servers} answered within "
                f"{timeout:g} s with kafka.security_protocol {config.kafka.security_protocol} "
                "(a plaintext client on a TLS listener, or the other way round, looks like this too)"
            )


def explain_refusal(kafka: KafkaConfig, detail: str) -> str:
    """The setting a broker's refusal points at, then librdkafka's own words."""
    if "certificate verify failed" in detail:
        ca = f"the CA in {kafka.ssl_ca_location}" if kafka.ssl_ca_location else "the system's CAs"
        return (
            f"kafka.ssl_ca_location: the broker's certificate is not trusted by {ca}, or does not name the "
            f"host in kafka.bootstrap_servers (kafka.ssl_endpoint_identification): {detail}"
        )
    if "bad certificate" in detail or "certificate required" in detail or "unknown ca" in detail:
        if kafka.ssl_certificate_location is None:
            return (
                "kafka.ssl_certificate_location: the broker requires a client certificate (mutual TLS) and none "
                f"is configured; set kafka.ssl_certificate_location and kafka.ssl_key_location: {detail}"
            )
        return (
            f"kafka.ssl_certificate_location: the broker refused the client certificate "
            f"{kafka.ssl_certificate_location} (not signed by a CA it trusts?): {detail}"
        )
    if "SASL" in detail or "uthenticat" in detail:
        return (
            f"kafka.sasl_username: the broker refused user {kafka.sasl_username!r} with {kafka.sasl_mechanism}; "
            f"check the user, the password ({SASL_PASSWORD_VAR} or kafka.sasl_password_file) and "
            f"kafka.sasl_mechanism: {detail}"
        )
    if "ssl.key" in detail and kafka.ssl_key_location:
        return (
            f"kafka.ssl_key_location: the client key could not be used (wrong password in "
            f"kafka.ssl_key_password_file or {SSL_KEY_PASSWORD_VAR}?): {detail}"
        )
    for key in ("ssl.certificate.location", "ssl.ca.location"):
        if key in detail:
            return f"kafka.{key.replace('.', '_', 1).replace('.', '_')}: {detail}"
    return f"kafka.security_protocol: the TLS connection to {kafka.bootstrap_servers} failed: {detail}"


def spark_source_options(config: Config) -> dict[str, str]:
    """Options of the bronze Kafka source: committed records only, headers kept."""
    return {
        "kafka.bootstrap.servers": bootstrap_servers(config),
        "subscribe": ",".join(config.kafka.topics),
        # Records of aborted or still-open transactions never reach bronze.
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
        "kafka.fetch.max.wait.ms": str(config.kafka.fetch_max_wait_ms),
        "startingOffsets": config.kafka.starting_offsets,
        "failOnDataLoss": str(config.kafka.fail_on_data_loss).lower(),
        "maxOffsetsPerTrigger": str(config.kafka.max_offsets_per_trigger),
        **spark_security_options(config),
    }


def topic_partitions(config: Config, topics: list[str] | None = None) -> dict[str, list[int]]:
    """Partition numbers of each topic (default: the configured ones), as the cluster reports them now."""
    metadata = _admin(config).list_topics(timeout=30)
    partitions = {}
    for topic in config.kafka.topics if topics is None else topics:
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise RuntimeError(f"Kafka topic {topic!r} does not exist on {bootstrap_servers(config)}")
        partitions[topic] = sorted(described.partitions)
    return partitions


def earliest_offsets(config: Config, topics: list[str]) -> dict[tuple[str, int], int]:
    """The first offset Kafka still holds in each partition of ``topics`` (above 0 once retention deleted some).

    Example::

        earliest_offsets(config, ["events"])  # {("events", 0): 0, ("events", 1): 1200}
    """
    return {partition: low for partition, (low, _) in watermark_offsets(config, topics).items()}


def watermark_offsets(config: Config, topics: list[str]) -> dict[tuple[str, int], tuple[int, int]]:
    """(first offset held, next offset to be written) of each partition of ``topics``.

    Example::

        watermark_offsets(config, ["events"])  # {("events", 0): (0, 5120)}
    """
    if isinstance(topics, str):
        raise TypeError("topics must be a list of topic names, not a string")
    if not topics:
        return {}
    partitions = topic_partitions(config, topics)
    with _consumer(config) as consumer:
        return {
            (topic, partition): consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            for topic, numbers in partitions.items()
            for partition in numbers
        }


def offsets_for_time(config: Config, partitions: list[tuple[str, int]], epoch_ms: int) -> dict[tuple[str, int], int]:
    """The first offset of each partition whose record timestamp is at or after ``epoch_ms``.

    A partition with no record that late answers its end offset (nothing to read from there).

    Example::

        offsets_for_time(config, [("events", 0)], 1_767_225_600_000)  # {("events", 0): 4096}
    """
    if not isinstance(epoch_ms, int) or epoch_ms < 0:
        raise ValueError(f"epoch_ms must be a non-negative int, got {epoch_ms!r}")
    if not partitions:
        return {}
    asked = [TopicPartition(topic, partition, epoch_ms) for topic, partition in partitions]
    with _consumer(config) as consumer:
        found = consumer.offsets_for_times(asked, timeout=30)
        ends = {(tp.topic, tp.partition): consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in asked}
    # -1: no record at or after the time.
    return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else ends[(tp.topic, tp.partition)] for tp in found}


def compacted_topics(config: Config, topics: list[str]) -> set[str]:
    """Those of ``topics`` whose cleanup.policy compacts: Kafka removes a record once a later one has its key.

    Example::

        compacted_topics(config, ["events", "customers"])  # {"customers"}
    """
    if isinstance(topics, str):
        raise TypeError("topics must be a list of topic names, not a string")
    resources = [ConfigResource(ConfigResource.Type.TOPIC, topic) for topic in topics]
    if not resources:
        return set()

    def ask() -> set[str]:
        described = _admin(config).describe_configs(resources, request_timeout=30)
        return {
            resource.name
            for resource, future in described.items()
            if "compact" in future.result()["cleanup.policy"].value.split(",")
        }

    return asked_until_answered(ask, f"the cleanup.policy of topics {', '.join(topics)}")


def asked_until_answered(ask: Callable[[], T], what: str, within_s: float = ADMIN_RETRY_S) -> T:
    """``ask()``, asked again while it fails with one of ``TRANSIENT_ADMIN_ERRORS`` for up to ``within_s``
    seconds (then the last error is raised); any other error at once. ``what`` names the question in the log.

    Example::

        asked_until_answered(lambda: admin.describe_cluster(request_timeout=30).result(), "the cluster id")
    """
    if not callable(ask):
        raise TypeError(f"ask must be callable, not {type(ask).__name__}")
    if within_s <= 0:
        raise ValueError(f"within_s must be positive, got {within_s!r}")
    deadline = time.monotonic() + within_s
    pause_s = 0.5
    while True:
        try:
            return ask()
        except KafkaException as error:
            code = error.args[0].code() if error.args and isinstance(error.args[0], KafkaError) else None
            if code not in TRANSIENT_ADMIN_ERRORS or time.monotonic() + pause_s > deadline:
                raise
            log.warning("Kafka did not answer %s (%s); asking again in %.1f s", what, error.args[0].name(), pause_s)
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, 5.0)


@contextmanager
def _consumer(config: Config):
    consumer = Consumer(client_config(config, **{"group.id": "lakehouse-offsets", "enable.auto.commit": False}))
    try:
        yield consumer
    finally:
        consumer.close()


def describe_sources(config: Config, topics: list[str], cluster: bool = True) -> Sources:
    """The cluster's id (when ``cluster``) and Kafka's id of each of ``topics`` that exists, as ``Sources``.

    Example::

        describe_sources(config, ["events"])  # Sources(cluster_id="MkU3...", topic_ids={"events": "Xh1..."})
    """
    if isinstance(topics, str):
        raise TypeError("topics must be a list of topic names, not a string")
    admin = _admin(config)

    def ask() -> Sources:
        cluster_id = admin.describe_cluster(request_timeout=30).result().cluster_id if cluster else None
        topic_ids = {}
        if topics:
            for topic, future in admin.describe_topics(TopicCollection(list(topics)), request_timeout=30).items():
                try:
                    topic_ids[topic] = str(future.result().topic_id)
                except KafkaException as error:
                    if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
        return Sources(cluster_id, topic_ids)

    return asked_until_answered(ask, f"the ids of topics {', '.join(topics)}")


def describe_topic(config: Config, topic: str) -> tuple[str, int] | None:
    """(Kafka's id of ``topic``, its partition count); None when there is no such topic.

    Example::

        describe_topic(config, "gold-changes")  # ("Xh1...", 2)
    """
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic must be a topic name, not {topic!r}")

    def ask() -> tuple[str, int] | None:
        future = _admin(config).describe_topics(TopicCollection([topic]), request_timeout=30)[topic]
        try:
            described = future.result()
        except KafkaException as error:
            if error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return None
            raise
        return str(described.topic_id), len(described.partitions)

    return asked_until_answered(ask, f"the id of topic {topic}")


# One admin client per configuration: bronze asks for topic ids before every batch, and for
# partitions and offsets at its start.
_admins: dict[str, AdminClient] = {}


def _admin(config: Config) -> AdminClient:
    settings = client_config(config)
    key = repr(sorted(settings.items()))
    if key not in _admins:
        _admins[key] = AdminClient(settings)
    return _admins[key]


def ensure_topics(config: Config, partitions: int = 1) -> None:
    """Create the configured topics if missing (local runs; production topics are provisioned)."""
    admin = _admin(config)
    existing = admin.list_topics(timeout=30).topics
    missing = [
        NewTopic(topic, num_partitions=partitions, replication_factor=1)
        for topic in config.kafka.topics
        if topic not in existing
    ]
    for future in admin.create_topics(missing).values() if missing else []:
        future.result(timeout=30)


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
