"""Protobuf in the Confluent wire format, read into a contract: values written by confluent-kafka's own
ProtobufSerializer (from classes protoc generated) through a real registry, three writer versions, a
schema registered as .proto text, and bad records mixed in, read by Spark."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F

from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind, quarantine_label
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.formats import Format, wire
from {{ cookiecutter.package_name }}.pipeline.formats.protobuf import (
    descriptor_set,
    message_name,
    message_paths,
    parse_protobuf,
    quarantine_reasons,
    resolve,
)
from {{ cookiecutter.package_name }}.pipeline.formats.registry import WriterSchema, WriterSchemas, client_conf
from {{ cookiecutter.package_name }}.pipeline.silver import parse_records

pytestmark = pytest.mark.xdist_group("schema_registry")

ORDERS = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("quantity", Kind.LONG),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
        Field("coupon", Kind.STRING, required=False),
    ),
    event_time="ordered_at",
    dimensions=("shop",),
    measures=("quantity", "total"),
)
HEAD = 'syntax = "proto3";\npackage shop.{version};\nimport "google/protobuf/timestamp.proto";\n'
# Three versions a producer went through: v2 adds coupon and widens quantity to int64; v3 drops note and
# puts another message before Order, so that its records name message 1 of the file.
V1 = HEAD.format(version="v1") + (
    "message Order { string order_id = 1; google.protobuf.Timestamp ordered_at = 2; string shop = 3;"
    " int32 quantity = 4; string total = 5; string note = 6; }\n"
)
V2 = HEAD.format(version="v2") + (
    "message Order { string order_id = 1; google.protobuf.Timestamp ordered_at = 2; string shop = 3;"
    " int64 quantity = 4; string total = 5; string note = 6; optional string coupon = 7; }\n"
)
V3 = HEAD.format(version="v3") + (
    "message Audit { string who = 1; }\n"
    "message Order { reserved 6; string order_id = 1; google.protobuf.Timestamp ordered_at = 2; string shop = 3;"
    " int64 quantity = 4; string total = 5; optional string coupon = 7; }\n"
)
# A team's schema the contract cannot read: quantity as text.
TEXT_QUANTITY = HEAD.format(version="text") + (
    "message Order { string order_id = 1; google.protobuf.Timestamp ordered_at = 2; string shop = 3;"
    " string quantity = 4; string total = 5; }\n"
)
AVRO = '{"type": "record", "name": "Order", "fields": [{"name": "order_id", "type": "string"}]}'
AT = datetime(2024, 6, 1, 12, 0, 30, 250000, tzinfo=UTC)


def generated(tmp_path: Path, name: str, source: str):
    """The Python module protoc generates for ``source``: what a producer's build makes."""
    (tmp_path / f"{name}.proto").write_text(source)
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{tmp_path}", f"--python_out={tmp_path}", f"{name}.proto"]
    subprocess.run(command, check=True, capture_output=True)
    spec = importlib.util.spec_from_file_location(f"{name}_pb2", tmp_path / f"{name}_pb2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def micros(instant: datetime) -> int:
    return int(instant.timestamp()) * 1_000_000 + instant.microsecond


def test_three_writer_versions_resolve_into_the_contract_and_every_bad_record_gets_its_reason(
    spark, schema_registry, tmp_path
) -> None:
    client = SchemaRegistryClient(client_conf(schema_registry))
    topic = "protobuf-orders"
    modules = {
        version: generated(tmp_path, f"order_{version}", text) for version, text in (("v1", V1), ("v2", V2), ("v3", V3))
    }

    def serialize(version: str, topic_name: str = topic, **fields) -> bytes:
        module = modules[version]
        serializer = ProtobufSerializer(module.Order, client, {"use.deprecated.format": False})
        message = module.Order(**{name: value for name, value in fields.items() if name != "ordered_at"})
        message.ordered_at.FromDatetime(fields.get("ordered_at", AT))
        return serializer(message, SerializationContext(topic_name, MessageField.VALUE))

    base = {"order_id": "o-1", "shop": "north", "quantity": 2, "total": "10.50"}
    v1 = serialize("v1", **base, note="first")
    v2 = serialize("v2", **{**base, "order_id": "o-2", "quantity": 5_000_000_000, "coupon": "C10"})
    v3 = serialize("v3", **{**base, "order_id": "o-3"})
    ids = [int.from_bytes(value[1:5], "big") for value in (v1, v2, v3)]
    assert len(set(ids)) == 3, ids
    # The Python serializer registers a base64 FileDescriptorProto, names message [0] with one byte 0 and
    # message [1] (v3's Order) with the count and index as zigzag varints.
    assert v1[5] == 0 and v3[5:7] == bytes([2, 2])
    # The same v3 registered as .proto text, as Confluent's Java serializer and a hand do.
    text_id = client.register_schema("protobuf-orders-by-hand-value", Schema(V3, "PROTOBUF"))
    assert text_id not in ids
    quantity_id = client.register_schema("protobuf-other-team-value", Schema(TEXT_QUANTITY, "PROTOBUF"))
    avro_id = client.register_schema("protobuf-avro-value", Schema(AVRO, "AVRO"))
    unknown_id = max(*ids, text_id, quantity_id, avro_id) + 1000

    def framed(schema_id: int, indexes: bytes, body: bytes) -> bytes:
        return bytes([0]) + schema_id.to_bytes(4, "big") + indexes + body

    v3_body = v3[7:]
    values = [
        v1,
        v2,
        v3,
        framed(text_id, bytes([2, 2]), v3_body),
        serialize("v3", **{**base, "order_id": "o-5", "shop": ""}),
        serialize("v3", **{**base, "order_id": "o-6", "total": "10.505"}),
        serialize("v3", **{**base, "order_id": "o-7", "total": "ten"}),
        serialize("v3", **{**base, "order_id": "o-8", "ordered_at": datetime(1500, 1, 1, tzinfo=UTC)}),
        None,
        b'{"order_id": "o-10"}',
        b"\x00\x00\x01",
        framed(unknown_id, b"\x00", v1[6:]),
        framed(ids[0], b"\x00", b"\xff\xff\xff\xff"),
        framed(quantity_id, b"\x00", v1[6:]),
        framed(avro_id, b"\x00", v1[6:]),
        framed(ids[2], bytes([2, 6]), v3_body),
        framed(ids[2], bytes([0x81]), v3_body),
    ]
    bronze = spark.createDataFrame(
        [(topic, 0, offset, value) for offset, value in enumerate(values)],
        "topic string, partition int, offset long, value binary",
    )
    pairs = message_paths(bronze)
    assert {pair for pair in pairs if pair[0] == ids[2]} == {(ids[2], "1"), (ids[2], "3"), (ids[2], None)}
    writers = WriterSchemas(schema_registry).lookup(sorted({schema_id for schema_id, _ in pairs}))
    assert writers[unknown_id] is None and writers[avro_id].schema_type == "AVRO"

    parsed = parse_protobuf(bronze, ORDERS, writers, [pair for pair in pairs if pair[1] is not None])

    assert parsed.columns == [*bronze.columns, *ORDERS.names, "reason"]
    valid = parsed.where("reason IS NULL").select(
        "offset", "order_id", F.unix_micros("ordered_at").alias("at"), "shop", "quantity", "total", "coupon"
    )
    expected = spark.createDataFrame(
        [
            (0, "o-1", micros(AT), "north", 2, Decimal("10.50"), None),
            (1, "o-2", micros(AT), "north", 5_000_000_000, Decimal("10.50"), "C10"),
            (2, "o-3", micros(AT), "north", 2, Decimal("10.50"), None),
            (3, "o-3", micros(AT), "north", 2, Decimal("10.50"), None),
        ],
        valid.schema,
    )
    assert_df_equality(valid, expected, ignore_row_order=True, ignore_nullable=True)
    reasons = {row.offset: row.reason for row in parsed.where("reason IS NOT NULL").collect()}
    unresolvable = reasons.pop(13)
    assert unresolvable == f"{wire.UNRESOLVABLE}{quantity_id}: field quantity is not a long in Protobuf", unresolvable
    assert reasons == {
        4: "field shop must not be empty",
        5: "field total does not fit DECIMAL(12,2) exactly",
        6: "field total does not fit DECIMAL(12,2) exactly",
        7: "field ordered_at is outside the supported range [1583-01-01T00:00:00Z, 9999-01-01T00:00:00Z)",
        8: "null value (tombstone)",
        9: wire.NOT_WIRE_FORMAT,
        10: wire.NOT_WIRE_FORMAT,
        11: f"{wire.UNKNOWN_SCHEMA}{unknown_id}",
        12: f"{wire.UNREADABLE}{ids[0]}",
        14: f"writer schema is not Protobuf, id {avro_id}",
        15: f"{wire.NO_MESSAGE}{ids[2]}",
        16: f"{wire.NO_MESSAGE}{ids[2]}",
    }
    labels = {quarantine_label(reason) for reason in [*reasons.values(), unresolvable]}
    assert labels <= set(quarantine_reasons(ORDERS)), labels - set(quarantine_reasons(ORDERS))
    # Silver's own entry point finds the pairs and the writers itself: the same rows.
    dataset = Dataset(
        "proto_orders", ORDERS, (Gold("by_shop", (Aggregate(AggregateKind.COUNT),)),), format=Format.PROTOBUF
    )
    assert_df_equality(parse_records(bronze, dataset, WriterSchemas(schema_registry)), parsed, ignore_row_order=True)


def test_a_writer_schema_is_read_from_proto_text_or_a_serialized_descriptor_and_imports_are_checked() -> None:
    text = WriterSchema(1, "PROTOBUF", V3)
    assert message_name(descriptor_set(text), "1") == "shop.v3.Order"
    assert message_name(descriptor_set(text), "0") == "shop.v3.Audit"
    with pytest.raises(KeyError):
        message_name(descriptor_set(text), "2")
    assert resolve(ORDERS, text, "1").problem is None
    assert resolve(ORDERS, text, "0").problem == "message shop.v3.Audit has no field order_id"
    broken = WriterSchema(2, "PROTOBUF", 'syntax = "proto3";\nmessage Order { strin order_id = 1; }\n')
    assert resolve(ORDERS, broken, "0").problem.startswith("not valid .proto source")
    imports = WriterSchema(3, "PROTOBUF", 'syntax = "proto3";\nimport "shop/common.proto";\nmessage Order {}\n')
    assert "shop/common.proto" in resolve(ORDERS, imports, "0").problem
    with pytest.raises(TypeError, match="writer must be a WriterSchema"):
        descriptor_set(V3)
