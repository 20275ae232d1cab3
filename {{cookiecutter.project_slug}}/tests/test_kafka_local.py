"""The local broker itself: its own instance, since these tests stop and restart it."""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from {{ cookiecutter.package_name }}.devtools import kafka_local, kafka_secure
from {{ cookiecutter.package_name }}.devtools.kafka_local import LocalKafka

# One worker runs this file (make test uses two): its module broker starts once.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("kafka_local")]


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


def create_topic(bootstrap: str) -> str:
    topic = f"test-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(timeout=30)
    return topic


def produce_transaction(bootstrap: str, topic: str, values: list[str], commit: bool) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value=value.encode())
    if commit:
        producer.commit_transaction(30)
    else:
        producer.flush(30)  # make sure the records really reach the log before the abort marker
        producer.abort_transaction(30)


def consume_all(bootstrap: str, topic: str, isolation_level: str) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 50,
            "isolation.level": isolation_level,
        }
    )
    # assign() instead of subscribe(): no group rebalance to wait for.
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    values: list[str] = []
    try:
        for _ in range(300):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return values
                raise AssertionError(message.error())
            values.append(message.value().decode())
    finally:
        consumer.close()
    raise AssertionError(f"no end of partition reached; got {values}")


def test_resolved_jars_carry_kafka_and_the_log4j2_binding() -> None:
    names = {jar.name for jar in kafka_local.resolve_broker_jars()}
    assert f"kafka_2.13-{kafka_local.KAFKA_VERSION}.jar" in names
    log4j2 = kafka_local.LOG4J2_VERSION
    assert {f"log4j-slf4j-impl-{log4j2}.jar", f"log4j-core-{log4j2}.jar", f"log4j-api-{log4j2}.jar"} <= names
    # Kafka 4 stays on the slf4j 1.7 API, which the log4j-slf4j-impl binding serves.
    assert [name for name in names if name.startswith("slf4j-api-")] == ["slf4j-api-1.7.36.jar"]
    # A second slf4j binding would make the broker's logging pick one at random, and a leftover
    # log4j 1.x (reload4j) would be a second, unconfigured logging backend.
    assert not [
        name
        for name in names
        if name.startswith(("logback", "log4j-slf4j2-impl", "slf4j-reload4j", "slf4j-log4j12", "reload4j", "log4j-1."))
    ]


def test_broker_logs_through_the_log4j2_config(kafka: LocalKafka) -> None:
    log = kafka.log_path.read_text(errors="replace")
    # Log4j 2's built-in default prints ERROR only: INFO lines in our layout prove the file was read.
    assert re.search(r"^\[[-\d :,]+\] INFO \[BrokerServer id=1\] .* \(kafka\.server\.BrokerServer\)$", log, re.M)
    # slf4j complains on stderr (which goes to this log) about a missing or a second binding.
    assert "SLF4J:" not in log


def test_transactions_read_committed_skips_aborted(kafka: LocalKafka) -> None:
    bootstrap = kafka.bootstrap_servers
    assert bootstrap
    topic = create_topic(bootstrap)
    first, aborted, second = ["c1", "c2", "c3"], ["a1", "a2"], ["c4"]
    produce_transaction(bootstrap, topic, first, commit=True)
    produce_transaction(bootstrap, topic, aborted, commit=False)
    produce_transaction(bootstrap, topic, second, commit=True)

    assert consume_all(bootstrap, topic, "read_committed") == first + second
    assert consume_all(bootstrap, topic, "read_uncommitted") == first + aborted + second


def test_restart_keeps_address_and_data(kafka: LocalKafka) -> None:
    bootstrap = kafka.bootstrap_servers
    assert bootstrap
    topic = create_topic(bootstrap)
    produce_transaction(bootstrap, topic, ["kept"], commit=True)

    assert kafka.stop() is True
    assert kafka.status() is None
    assert kafka.bootstrap_servers is None
    assert kafka_local.running_bootstrap(kafka.home) is None
    assert kafka.stop() is False

    # Only the client port must stay stable; a taken controller port is simply replaced.
    old_controller_port = json.loads((kafka.home / "broker.json").read_text())["controller_port"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", old_controller_port))
        squatter.listen()
        assert kafka.start() == bootstrap
    # Ready means the broker answers: a reader asks for the topic's leaders until it has loaded them.
    assert kafka_local.partitions_with_leaders(AdminClient({"bootstrap.servers": bootstrap}), topic) == [0]
    assert consume_all(bootstrap, topic, "read_committed") == ["kept"]
    with pytest.raises(RuntimeError, match=r"^never-created: no leader for every partition within 1 s"):
        kafka_local.partitions_with_leaders(AdminClient({"bootstrap.servers": bootstrap}), "never-created", timeout_s=1)


def _broker_pids(config_path: Path) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" in args and str(config_path).encode() in args:
            pids.append(int(cmdline.parent.name))
    return pids


def test_second_start_reuses_running_broker(kafka: LocalKafka) -> None:
    status = kafka.status()
    assert status is not None
    # A fresh instance on the same home stands for a second CLI invocation.
    assert LocalKafka(kafka.home).start() == status["bootstrap"]
    assert kafka_local.running_bootstrap(kafka.home) == status["bootstrap"]
    assert _broker_pids(kafka.config_path) == [status["pid"]]


def test_failed_start_raises_with_broker_log(tmp_path: Path) -> None:
    # Data formatted for another node id: the broker refuses to start and exits.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.properties").write_text("version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=2\n")
    broker = LocalKafka(tmp_path)
    with pytest.raises(RuntimeError, match="Stored node id 2 doesn't match"):
        broker.start(timeout=60)
    assert broker.status() is None


def test_secure_start_refuses_a_broker_already_running_without_it(kafka: LocalKafka) -> None:
    with pytest.raises(RuntimeError, match="runs without --secure; stop it first"):
        LocalKafka(kafka.home).start(secure=True)
    assert kafka.secure_listeners() is None


def test_certificates_chain_to_their_ca_and_name_the_local_host(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import pkcs12

    files = kafka_secure.create_certificates(tmp_path / "secure")
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    client = x509.load_pem_x509_certificates(files.client_certificate.read_bytes())
    client[0].verify_directly_issued_by(ca)
    _, broker, _ = pkcs12.load_key_and_certificates(
        files.broker_keystore.read_bytes(), files.broker_keystore_password_file.read_bytes()
    )
    assert broker is not None
    broker.verify_directly_issued_by(ca)
    names = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert client[0].subject.rfc4514_string() == f"CN={kafka_secure.SECURE_USER}"
    # A second call keeps what the first made: the broker and clients already trust that CA.
    assert kafka_secure.create_certificates(tmp_path / "secure").ca.read_bytes() == files.ca.read_bytes()
    other = kafka_secure.create_certificates(tmp_path / "other")
    assert other.ca.read_bytes() != files.ca.read_bytes()
    secrets = (files.client_key, files.sasl_password_file, files.broker_keystore, files.broker_keystore_password_file)
    for secret in secrets:
        assert secret.stat().st_mode & 0o077 == 0, secret
