"""Everything that talks to Kafka settings: Spark source options and client configs."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from .config import LOCAL_BOOTSTRAP, Config, ConfigError

JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def bootstrap_servers(config: Config) -> str:
    """The brokers to connect to. 'local' must have been resolved by the caller (the CLI does it once)."""
    if config.kafka.bootstrap_servers == LOCAL_BOOTSTRAP:
        raise ConfigError(
            "kafka.bootstrap_servers: 'local' names the development broker and was not resolved; "
            "run through the command line, or set KAFKA_BOOTSTRAP_SERVERS"
        )
    return config.kafka.bootstrap_servers


def client_config(config: Config, **extra: object) -> dict:
    """Settings for confluent-kafka producers, consumers and admin clients."""
    settings: dict = {"bootstrap.servers": bootstrap_servers(config)}
    kafka = config.kafka
    if kafka.security_protocol != "PLAINTEXT":
        settings["security.protocol"] = kafka.security_protocol
    if kafka.sasl_mechanism:
        settings.update(
            {
                "sasl.mechanism": kafka.sasl_mechanism,
                "sasl.username": kafka.sasl_username,
                "sasl.password": kafka.sasl_password,
            }
        )
    settings.update(extra)
    return settings


def spark_security_options(config: Config) -> dict[str, str]:
    kafka = config.kafka
    options = {"kafka.security.protocol": kafka.security_protocol}
    if kafka.sasl_mechanism:
        user = _jaas_quote(kafka.sasl_username or "")
        password = _jaas_quote(kafka.sasl_password or "")
        options["kafka.sasl.mechanism"] = kafka.sasl_mechanism
        # Spark redacts option values that contain "password" from its logs and UI.
        options["kafka.sasl.jaas.config"] = (
            f'{JAAS_MODULES[kafka.sasl_mechanism]} required username="{user}" password="{password}";'
        )
    return options


def spark_source_options(config: Config) -> dict[str, str]:
    """Options of the bronze Kafka source: committed records only, headers kept."""
    return {
        "kafka.bootstrap.servers": bootstrap_servers(config),
        "subscribe": ",".join(config.kafka.topics),
        # Records of aborted or still-open transactions never reach bronze.
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
        "startingOffsets": config.kafka.starting_offsets,
        "failOnDataLoss": str(config.kafka.fail_on_data_loss).lower(),
        "maxOffsetsPerTrigger": str(config.kafka.max_offsets_per_trigger),
        **spark_security_options(config),
    }


def topic_partitions(config: Config) -> dict[str, list[int]]:
    """Partition numbers of each configured topic, as the cluster reports them now."""
    metadata = AdminClient(client_config(config)).list_topics(timeout=30)
    partitions = {}
    for topic in config.kafka.topics:
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise RuntimeError(f"Kafka topic {topic!r} does not exist on {bootstrap_servers(config)}")
        partitions[topic] = sorted(described.partitions)
    return partitions


def ensure_topics(config: Config, partitions: int = 1) -> None:
    """Create the configured topics if missing (local runs; production topics are provisioned)."""
    admin = AdminClient(client_config(config))
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
