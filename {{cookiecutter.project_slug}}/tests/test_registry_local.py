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

from {{ cookiecutter.package_name }}.cli import local_servers
from {{ cookiecutter.package_name }}.cli.exit_codes import ExitCode
from {{ cookiecutter.package_name }}.devtools.registry_local import CONFLUENT_API, LocalRegistry, running_url
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.pipeline.formats.registry import client_conf

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
    # Not running: "local" names the setting and the way to start one.
    with pytest.raises(ConfigError, match=r"schema_registry\.url: is 'local' but no local schema registry runs"):
        local_servers.resolve_local_registry(config)
    assert local_servers.registry_local(config, argparse.Namespace(action="status")) == ExitCode.FAILED

    registry = LocalRegistry(home)
    url = registry.start()
    try:
        assert url.startswith("http://127.0.0.1:") and url.endswith(CONFLUENT_API)
        assert local_servers.resolve_local_registry(config).schema_registry.url == url
        # A second start (another process's `registry-local start`) finds the running one.
        pid = registry.status()["pid"]
        assert local_servers.registry_local(config, argparse.Namespace(action="start")) == ExitCode.OK
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
