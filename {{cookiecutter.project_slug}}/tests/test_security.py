"""Kafka security against a local broker that demands it: SASL_SSL (PLAIN, SCRAM) and mutual TLS.

The broker is `kafka-local start --secure`: its own CA, a broker and a client certificate, and
a SCRAM user. Every refusal must stop the command line before Spark starts, naming the setting
at fault, and no secret may reach a log, a progress line, `describe`, an exception, a
checkpoint or Spark's event log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.devtools.kafka_local import LocalKafka
from {{ cookiecutter.package_name }}.devtools.kafka_secure import SecureFiles, create_certificates
from {{ cookiecutter.package_name }}.devtools.sample import produce, sample_records
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.delta.tables import GOLD, QUARANTINE, SILVER, Lakehouse
from {{ cookiecutter.package_name }}.pipeline.egress import configure
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import check_connection, client_config
from {{ cookiecutter.package_name }}.pipeline.streams import run_available_now

# One worker runs this file (make test uses two): its secure broker starts once.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("security")]

# Every variable a test may set; each test starts without any of them.
KAFKA_VARS = (
    "KAFKA_BOOTSTRAP_SERVERS",
    "KAFKA_TOPICS",
    "KAFKA_SECURITY_PROTOCOL",
    "KAFKA_SASL_MECHANISM",
    "KAFKA_SASL_USERNAME",
    "KAFKA_SASL_PASSWORD",
    "KAFKA_SASL_PASSWORD_FILE",
    "KAFKA_SSL_CA_LOCATION",
    "KAFKA_SSL_CERTIFICATE_LOCATION",
    "KAFKA_SSL_KEY_LOCATION",
    "KAFKA_SSL_KEY_PASSWORD",
    "KAFKA_SSL_KEY_PASSWORD_FILE",
    "PIPELINE_ENV",
    "PIPELINE_CONFIG",
)


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    broker = LocalKafka(tmp_path_factory.mktemp("secure-kafka"))
    broker.start(secure=True)
    yield broker
    broker.stop()


@pytest.fixture(scope="module")
def listeners(secure_broker: LocalKafka) -> dict:
    secure = secure_broker.secure_listeners()
    assert secure is not None
    return secure


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> SecureFiles:
    """A CA, and a client certificate, the broker has never heard of."""
    return create_certificates(tmp_path_factory.mktemp("other-ca"))


@pytest.fixture
def secure_topic(secure_broker: LocalKafka) -> str:
    name = f"secure-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": secure_broker.bootstrap_servers})
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(timeout=30)
    return name


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for var in KAFKA_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def sasl_env(listeners: dict, mechanism: str = "SCRAM-SHA-512", **changes: str) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": listeners["sasl_ssl"],
        "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KAFKA_SASL_MECHANISM": mechanism,
        "KAFKA_SASL_USERNAME": listeners["user"],
        "KAFKA_SASL_PASSWORD_FILE": listeners["sasl_password_file"],
        "KAFKA_SSL_CA_LOCATION": listeners["ca"],
        **changes,
    }


def mtls_env(listeners: dict, **changes: str) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": listeners["mtls"],
        "KAFKA_SECURITY_PROTOCOL": "SSL",
        "KAFKA_SSL_CA_LOCATION": listeners["ca"],
        "KAFKA_SSL_CERTIFICATE_LOCATION": listeners["client_certificate"],
        "KAFKA_SSL_KEY_LOCATION": listeners["client_key"],
        **changes,
    }


def secrets_of(listeners: dict) -> list[str]:
    """The SASL password and the body of the client key, as they could leak."""
    key_lines = [line for line in Path(listeners["client_key"]).read_text().splitlines() if "-----" not in line]
    return [Path(listeners["sasl_password_file"]).read_text().strip(), *key_lines]


def assert_no_secret(secrets: list[str], where: str, text: str) -> None:
    for secret in secrets:
        assert secret not in text, f"a secret appears in {where}"


def files_text(root: Path) -> Iterator[tuple[str, str]]:
    for path in root.rglob("*"):
        if path.is_file():
            yield str(path), path.read_bytes().decode(errors="replace")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_each_sasl_mechanism_connects(listeners, secure_topic, mechanism, kafka_oracle):
    config = load_config("local", environ={**sasl_env(listeners, mechanism), "KAFKA_TOPICS": secure_topic})

    check_connection(config, timeout=10)
    sent = list(sample_records(3, seed=1))
    assert produce(client_config(config), secure_topic, sent) == 3
    # Read back from the broker over the same listener and mechanism: what it holds, not what was sent.
    assert sorted(kafka_oracle(config, [secure_topic]).values()) == sorted(value for _, value in sent)


def test_mutual_tls_connects_and_the_listener_demands_a_certificate(
    listeners, secure_topic, secure_broker, kafka_oracle
):
    config = load_config("local", environ={**mtls_env(listeners), "KAFKA_TOPICS": secure_topic})

    check_connection(config, timeout=10)
    sent = list(sample_records(3, seed=2))
    assert produce(client_config(config), secure_topic, sent) == 3
    assert sorted(kafka_oracle(config, [secure_topic]).values()) == sorted(value for _, value in sent)
    properties = secure_broker.config_path.read_text()
    assert "listener.name.mtls.ssl.client.auth=required" in properties
    # Owner-only: it holds the keystore password and the PLAIN user's password.
    assert secure_broker.config_path.stat().st_mode & 0o077 == 0


def test_kafka_local_start_secure_prints_what_a_client_needs_but_no_password(
    secure_broker, listeners, clean_env, capsys
):
    clean_env.setenv("KAFKA_LOCAL_HOME", str(secure_broker.home))

    # The broker runs already: the command finds it and prints the same.
    assert main(["kafka-local", "start", "--secure"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == secure_broker.bootstrap_servers
    for needed in ("sasl_ssl", "mtls", "ca", "client_certificate", "client_key", "sasl_password_file"):
        assert listeners[needed] in out
    assert f"user {listeners['user']}" in out
    assert_no_secret(secrets_of(listeners), "kafka-local start --secure", out)
    for secret_file in (listeners["sasl_password_file"], listeners["client_key"]):
        assert Path(secret_file).stat().st_mode & 0o077 == 0, secret_file


REFUSALS = {
    "wrong-password": (
        lambda listeners, other: sasl_env(
            listeners, KAFKA_SASL_PASSWORD_FILE="", KAFKA_SASL_PASSWORD="not-the-password-4711"
        ),
        "kafka.sasl_username: the broker refused user 'pipeline' with SCRAM-SHA-512",
    ),
    "unknown-user": (
        lambda listeners, other: sasl_env(listeners, "SCRAM-SHA-256", KAFKA_SASL_USERNAME="mallory"),
        "kafka.sasl_username: the broker refused user 'mallory' with SCRAM-SHA-256",
    ),
    "untrusted-ca": (
        lambda listeners, other: sasl_env(listeners, KAFKA_SSL_CA_LOCATION=str(other.ca)),
        "kafka.ssl_ca_location: the broker's certificate is not trusted by the CA in",
    ),
    "missing-client-certificate": (
        lambda listeners, other: mtls_env(listeners, KAFKA_SSL_CERTIFICATE_LOCATION="", KAFKA_SSL_KEY_LOCATION=""),
        "kafka.ssl_certificate_location: the broker requires a client certificate (mutual TLS) and none",
    ),
    "client-certificate-of-another-ca": (
        lambda listeners, other: mtls_env(
            listeners,
            KAFKA_SSL_CERTIFICATE_LOCATION=str(other.client_certificate),
            KAFKA_SSL_KEY_LOCATION=str(other.client_key),
        ),
        "kafka.ssl_certificate_location: the broker refused the client certificate",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refused_connection_stops_the_run_before_spark_naming_the_setting(
    listeners, other_ca, secure_topic, clean_env, tmp_path, capsys, case
):
    make_env, named = REFUSALS[case]
    env = {**make_env(listeners, other_ca), "KAFKA_TOPICS": secure_topic, "LAKEHOUSE_ROOT": str(tmp_path / "lake")}
    for var, value in env.items():
        clean_env.setenv(var, value)

    started = time.monotonic()
    exit_code = main(["run", "--layer", "all", "--available-now"])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()

    assert exit_code == 2, err
    assert err.startswith(f"config error: {named}"), err
    assert "Traceback" not in err
    assert elapsed < 15, f"took {elapsed:.0f} s to fail"
    # The pipeline did not start: no table, no checkpoint.
    assert not (tmp_path / "lake").exists()
    assert_no_secret([*secrets_of(listeners), "not-the-password-4711"], "the error", out + err)


def test_a_secure_run_leaks_no_secret_and_describe_shows_none(listeners, secure_topic, clean_env, tmp_path, capsys):
    # The fast-tier counterpart of the slow end-to-end runs: every surface short of Spark.
    for var, value in {**sasl_env(listeners), "KAFKA_TOPICS": secure_topic}.items():
        clean_env.setenv(var, value)
    clean_env.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    config = load_config()

    assert main(["describe", "--json"]) == 0
    assert main(["describe"]) == 0
    assert main(["produce-sample", "--count", "5"]) == 0
    out, err = capsys.readouterr()
    assert "produced 5 records" in out
    secrets = secrets_of(listeners)
    assert_no_secret(secrets, "describe and produce-sample", out + err)
    assert_no_secret(secrets, "repr(config)", repr(config))


# --- bronze -> silver -> gold over a secure listener -----------------------------------------------


def configured_config(environ: dict[str, str]):
    """The local config with ``environ``'s overrides, its egress tables parsed: what the command line runs on."""
    return configure(load_config("local", environ=environ), environ)


def gold_and_silver_counts(spark, config) -> tuple[int, int]:
    lakehouse = Lakehouse(config.lakehouse_root)
    silver = spark.read.format("delta").load(lakehouse.table(SILVER)).count()
    gold = spark.read.format("delta").load(lakehouse.table(GOLD)).agg(F.sum("event_count")).first()[0]
    return silver, gold


@pytest.mark.slow
def test_scram_pipeline_end_to_end_leaks_no_secret_to_logs_checkpoints_or_the_event_log(
    spark, listeners, secure_topic, tmp_path
):
    lakehouse, event_log = tmp_path / "lake", tmp_path / "spark-events"
    event_log.mkdir()
    env_vars = {**sasl_env(listeners), "KAFKA_TOPICS": secure_topic, "LAKEHOUSE_ROOT": str(lakehouse)}
    config = configured_config({**env_vars, "PIPELINE_EGRESS": os.environ["PIPELINE_EGRESS"]})
    produce(client_config(config), secure_topic, sample_records(60, seed=11, malformed_ratio=0.1), 20)

    # Bronze, the one stream that talks to Kafka, in a driver of its own, so that its event log
    # can be switched on (uncompressed, to be read here); silver and gold in the session's.
    environ = {key: value for key, value in os.environ.items() if key not in KAFKA_VARS}
    environ.update(env_vars)
    environ["PYSPARK_SUBMIT_ARGS"] = (
        f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir={event_log.as_uri()} "
        "--conf spark.eventLog.compress=false pyspark-shell"
    )
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]
    bronze = [*command, "run", "--layer", "bronze", "--available-now"]
    run = subprocess.run(bronze, env=environ, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-5000:]
    assert "[bronze] batch 0" in run.stdout + run.stderr
    described = subprocess.run([*command, "describe"], env=environ, capture_output=True, text=True, check=True)
    run_available_now(spark, config, ("silver", "gold"))

    silver, gold = gold_and_silver_counts(spark, config)
    quarantined = spark.read.format("delta").load(Lakehouse(config.lakehouse_root).table(QUARANTINE)).count()
    assert silver + quarantined == 60 and gold == silver

    secrets = secrets_of(listeners)
    assert_no_secret(secrets, "the run's output and progress lines", run.stdout + run.stderr)
    assert_no_secret(secrets, "describe", described.stdout + described.stderr)
    logs = list(files_text(event_log))
    assert logs and any("SparkListenerApplicationStart" in text for _, text in logs)
    for name, text in [*logs, *files_text(lakehouse)]:
        assert_no_secret(secrets, name, text)


@pytest.mark.slow
def test_mutual_tls_pipeline_end_to_end_keeps_the_key_out_of_checkpoints_and_logs(
    spark, listeners, secure_topic, tmp_path, capfd, caplog
):
    environ = {**mtls_env(listeners), "KAFKA_TOPICS": secure_topic, "LAKEHOUSE_ROOT": str(tmp_path / "lake")}
    config = configured_config({**environ, "PIPELINE_EGRESS": os.environ["PIPELINE_EGRESS"]})
    records = list(sample_records(40, seed=12))
    produce(client_config(config), secure_topic, records, 20)
    check_connection(config)

    run_available_now(spark, config)

    assert gold_and_silver_counts(spark, config) == (40, 40)
    # The audit reads Kafka again, through Spark's batch reader, with the same certificate.
    report = run_audit(spark, config)
    assert report.clean, report.as_dict()
    secrets = secrets_of(listeners)
    captured = capfd.readouterr()
    assert_no_secret(secrets, "the test's output and logs", captured.out + captured.err + caplog.text)
    assert_no_secret(secrets, "the audit report", json.dumps(report.as_dict()))
    for name, text in files_text(tmp_path / "lake"):
        assert_no_secret(secrets, name, text)
