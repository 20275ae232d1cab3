"""The local schema registry (Apicurio Registry) itself: a real server in a tmp dir, spoken to by
confluent-kafka's own schema-registry client and Avro serdes, no mocks."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import fastavro
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pydantic import SecretStr

from {{ cookiecutter.package_name }}.cli import local_servers
from {{ cookiecutter.package_name }}.cli.exit_codes import ExitCode
from {{ cookiecutter.package_name }}.cli.schemas import describe_schema
from {{ cookiecutter.package_name }}.devtools.kafka_secure import create_certificates
from {{ cookiecutter.package_name }}.devtools.registry_local import CONFLUENT_API, LocalRegistry, running_url
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.pipeline.formats.registry import (
    RegistryAccess,
    RegistryRefused,
    RegistryUnavailable,
    WriterSchemas,
    client_conf,
)

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"}],
}
# Not readable by a reader of v1 and not able to read v1's records: the subject's BACKWARD rule refuses it.
ORDER_INCOMPATIBLE = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "order_id", "type": "long"}, {"name": "shop", "type": "string"}],
}


def test_a_local_registry_serves_confluents_serdes_refuses_an_incompatible_schema_and_keeps_ids_over_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "registry"
    config = load_config("local", environ={"REGISTRY_LOCAL_HOME": str(home), "SCHEMA_REGISTRY_URL": "local"})
    # Not running: "local" names the setting and the way to start one, where a dataset needs the registry;
    # a command running JSON datasets alone goes on without one.
    with pytest.raises(ConfigError, match=r"schema_registry\.url: is 'local' but no local schema registry runs"):
        local_servers.resolve_local_registry(config, needed=True)
    assert local_servers.resolve_local_registry(config, needed=False).schema_registry.url == "local"
    assert local_servers.registry_local(config, argparse.Namespace(action="status")) == ExitCode.FAILED

    registry = LocalRegistry(home)
    url = registry.start()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith(CONFLUENT_API)
        assert local_servers.resolve_local_registry(config, needed=True).schema_registry.url == url
        # A second start (another process's `registry-local start`) finds the running one.
        pid = registry.status()["pid"]
        assert local_servers.registry_local(config, argparse.Namespace(action="start", secure=False)) == ExitCode.OK
        assert local_servers.registry_local(config, argparse.Namespace(action="status")) == ExitCode.OK
        shown = capsys.readouterr().out.splitlines()
        assert shown[-2] == url and json.loads(shown[-1])["pid"] == pid

        client = SchemaRegistryClient(client_conf(url))
        client.set_compatibility("orders-value", "BACKWARD")
        serializer = AvroSerializer(client, json.dumps(ORDER_V1))
        context = SerializationContext("orders", MessageField.VALUE)
        value = serializer({"order_id": "o-1", "amount": 12.5}, context)
        # The Confluent wire format: magic byte 0, the schema id (4 bytes, big-endian), the Avro body.
        assert value[0] == 0
        schema_id = int.from_bytes(value[1:5], "big")
        assert client.get_latest_version("orders-value").schema_id == schema_id
        assert AvroDeserializer(client)(value, context) == {"order_id": "o-1", "amount": 12.5}

        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema("orders-value", Schema(json.dumps(ORDER_INCOMPATIBLE), "AVRO"))
        assert refused.value.http_status_code == 409

        assert registry.stop() is True
        assert registry.status() is None and running_url(home) is None
        assert registry.start() == url  # its ports again, while they are free
        # The schema by its id, as a consumer of a record written before the restart asks for it.
        again = SchemaRegistryClient(client_conf(url))
        found = again.get_schema(schema_id)
        assert json.loads(found.schema_str) == ORDER_V1
        body = io.BytesIO(value[5:])
        assert fastavro.schemaless_reader(body, fastavro.parse_schema(json.loads(found.schema_str))) == {
            "order_id": "o-1",
            "amount": 12.5,
        }
    finally:
        registry.stop()
    assert local_servers.registry_local(config, argparse.Namespace(action="stop")) == ExitCode.OK
    assert capsys.readouterr().out.strip() == "not running"


def test_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="home must be a path"):
        LocalRegistry(42)
    with pytest.raises(ValueError, match="timeout must be positive"):
        LocalRegistry(tmp_path).start(timeout=0)
    with pytest.raises(ConfigError, match=r"schema_registry\.url.*not an http\(s\):// URL"):
        load_config("local", environ={"SCHEMA_REGISTRY_URL": "registry.example.com:8081"})


def test_a_secure_local_registry_answers_its_user_over_https_alone_and_each_refusal_names_its_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    home = tmp_path / "registry"
    config = load_config("local", environ={"REGISTRY_LOCAL_HOME": str(home), "SCHEMA_REGISTRY_URL": "local"})
    registry = LocalRegistry(home)
    assert local_servers.registry_local(config, argparse.Namespace(action="start", secure=True)) == ExitCode.OK
    try:
        status = registry.status()
        password = Path(status["password_file"]).read_text()
        url = status["url"]
        assert url.startswith("https://127.0.0.1:") and url.endswith(CONFLUENT_API)
        assert capsys.readouterr().out.splitlines() == [
            url,
            f"SCHEMA_REGISTRY_SSL_CA_LOCATION={status['ca']}",
            "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME=pipeline",
            f"SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD_FILE={status['password_file']}",
        ]
        # The password reached the registry through its owner-only file, not its command line or log.
        assert password not in Path(f"/proc/{status['pid']}/cmdline").read_bytes().decode(errors="replace")
        assert password not in registry.log_path.read_text(errors="replace")

        # "local" brings the CA and the user; so do the variables a client outside the project sets.
        resolved = local_servers.resolve_local_registry(config, needed=True)
        access_of_local = RegistryAccess.of(resolved.schema_registry)
        by_variables = load_config(
            "local",
            environ={
                "SCHEMA_REGISTRY_URL": url,
                "SCHEMA_REGISTRY_SSL_CA_LOCATION": status["ca"],
                "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME": "pipeline",
                "SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD_FILE": status["password_file"],
            },
        )
        assert RegistryAccess.of(by_variables.schema_registry) == access_of_local
        schema_id = SchemaRegistryClient(client_conf(access_of_local)).register_schema(
            "orders-value", Schema(json.dumps(ORDER_V1), "AVRO")
        )
        found = WriterSchemas(access_of_local).lookup([schema_id])[schema_id]
        assert json.loads(found.text) == ORDER_V1
        assert password not in repr(access_of_local) and password not in repr(resolved)

        ca = status["ca"]
        refusals = [
            (RegistryAccess(url, ca_location=ca), r"basic_auth_username and basic_auth_password_file, or bearer_token"),
            (
                RegistryAccess(url, ca_location=ca, username="pipeline", password=SecretStr(f"not-{password}")),
                r"basic_auth_username \(pipeline\) and basic_auth_password_file",
            ),
            (RegistryAccess(url, ca_location=ca, bearer_token=SecretStr("t0ken")), r"bearer_token_file"),
        ]
        answer = r"the registry at https://127\.0\.0\.1:\d+/apis/ccompat/v7 refused the credentials \(HTTP 401\)"
        for access, setting in refusals:
            with pytest.raises(RegistryRefused, match=rf"^schema_registry\.{setting}.*: {answer}"):
                WriterSchemas(access).lookup([schema_id])
        # A certificate the named CA did not sign (and none named: the system's CAs do not know it either).
        other = create_certificates(tmp_path / "other-ca")
        for untrusted, trusted in ((str(other.ca), f"the CA in {other.ca}"), (None, "the system's CAs")):
            access = RegistryAccess(url, ca_location=untrusted, username="pipeline", password=SecretStr(password))
            with pytest.raises(RegistryRefused, match=rf"^schema_registry\.ssl_ca_location: .* signed by {trusted}"):
                WriterSchemas(access).check()
        # https alone: nothing answers plain http at the registry's port.
        with pytest.raises(RegistryUnavailable, match=r"^schema_registry\.url: the registry at http://127"):
            WriterSchemas(url.replace("https://", "http://")).check()
        # A command turns a refusal into a ConfigError naming the setting (exit 2).
        wrong_password = resolved.schema_registry.model_copy(update={"basic_auth_password": SecretStr("x")})
        wrong = config.model_copy(update={"schema_registry": wrong_password})
        with pytest.raises(ConfigError, match=r"^schema_registry\.basic_auth_username \(pipeline\) and basic_auth_"):
            describe_schema(wrong, argparse.Namespace(subject="orders-value"))
        with pytest.raises(RuntimeError, match=r"runs with --secure; `registry-local stop` it first"):
            registry.start()
    finally:
        registry.stop()
