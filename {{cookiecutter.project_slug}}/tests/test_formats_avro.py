"""Avro in the Confluent wire format, read into a contract: values written by confluent-kafka's own
AvroSerializer through a real registry, three writer versions and bad records mixed in, read by Spark."""

from __future__ import annotations

import argparse
import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import functions as F
from test_transforms import bronze, bronze_row

from {{ cookiecutter.package_name }}.cli.exit_codes import ExitCode
from {{ cookiecutter.package_name }}.cli.schemas import describe_schema
from {{ cookiecutter.package_name }}.devtools.oracle import record_reader, unmet_reason
from {{ cookiecutter.package_name }}.devtools.sample import UNKNOWN_SCHEMA_ID, contract_records, value_writer
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.contract import (
    TOMBSTONE,
    Contract,
    Field,
    Kind,
    quarantine_label,
    quarantine_label_column,
)
from {{ cookiecutter.package_name }}.pipeline.dataset import Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.expectations import in_range
from {{ cookiecutter.package_name }}.pipeline.formats import Format, wire
from {{ cookiecutter.package_name }}.pipeline.formats.avro import parse_avro, quarantine_reasons, resolve, schema_ids
from {{ cookiecutter.package_name }}.pipeline.formats.registry import (
    RegistryUnavailable,
    WriterSchema,
    WriterSchemas,
    client_conf,
)
from {{ cookiecutter.package_name }}.pipeline.silver import parse_records, without_duplicates

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
# A dataset's sample as the sample producer draws it: a business key, a dimension, a decimal and an optional field.
SAMPLED = Contract(
    fields=(
        Field("order_id", Kind.STRING),
        Field("ordered_at", Kind.TIMESTAMP),
        Field("shop", Kind.STRING),
        Field("customer", Kind.STRING, required=False),
        Field("total", Kind.DECIMAL, precision=12, scale=2),
    ),
    event_time="ordered_at",
    dimensions=("shop",),
    measures=("total",),
)
MILLIS = {"type": "long", "logicalType": "timestamp-millis"}
MICROS = {"type": "long", "logicalType": "timestamp-micros"}


def decimal(precision: int) -> dict:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": 2}


def order_schema(*fields: dict) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop", "fields": list(fields)})


# Three versions a producer went through: v2 adds coupon (with a default), promotes quantity from int
# to long and writes microseconds; v3 removes note. The contract reads every one of them.
V1 = order_schema(
    {"name": "order_id", "type": "string"},
    {"name": "ordered_at", "type": MILLIS},
    {"name": "shop", "type": "string"},
    {"name": "quantity", "type": "int"},
    {"name": "total", "type": decimal(10)},
    {"name": "note", "type": "string"},
)
V2 = order_schema(
    {"name": "order_id", "type": "string"},
    {"name": "ordered_at", "type": MICROS},
    {"name": "shop", "type": "string"},
    {"name": "quantity", "type": "long"},
    {"name": "total", "type": decimal(12)},
    {"name": "note", "type": "string"},
    {"name": "coupon", "type": ["null", "string"], "default": None},
)
V3 = order_schema(
    {"name": "order_id", "type": "string"},
    {"name": "ordered_at", "type": MICROS},
    {"name": "shop", "type": "string"},
    {"name": "quantity", "type": "long"},
    {"name": "total", "type": decimal(12)},
    {"name": "coupon", "type": ["null", "string"], "default": None},
)
# Another team's schema for the same record: the event time as text, which the contract cannot read.
TEXT_TIME = order_schema(
    {"name": "order_id", "type": "string"},
    {"name": "ordered_at", "type": "string"},
    {"name": "shop", "type": "string"},
    {"name": "quantity", "type": "long"},
    {"name": "total", "type": decimal(12)},
)
PROTO = 'syntax = "proto3";\nmessage Order { string order_id = 1; }\n'
AT = datetime(2024, 6, 1, 12, 0, 30, 250000, tzinfo=UTC)


def micros(instant: datetime) -> int:
    return int(instant.timestamp()) * 1_000_000 + instant.microsecond


def test_three_writer_versions_resolve_into_the_contract_and_every_bad_record_gets_its_reason(
    spark, schema_registry
) -> None:
    client = SchemaRegistryClient(client_conf(schema_registry))
    topic = "avro-orders"
    client.set_compatibility(f"{topic}-value", "BACKWARD")

    def serialize(schema: str, record: dict, subject_topic: str = topic) -> bytes:
        serializer = AvroSerializer(client, schema)
        return serializer(record, SerializationContext(subject_topic, MessageField.VALUE))

    base = {"order_id": "o-1", "ordered_at": AT, "shop": "north", "quantity": 2, "total": Decimal("10.50")}
    v1 = serialize(V1, {**base, "note": "first"})
    v2 = serialize(V2, {**base, "order_id": "o-2", "quantity": 5_000_000_000, "note": "n", "coupon": "C10"})
    v3 = serialize(V3, {**base, "order_id": "o-3", "coupon": None})
    ids = [int.from_bytes(value[1:5], "big") for value in (v1, v2, v3)]
    assert len(set(ids)) == 3, ids
    empty_shop = serialize(V3, {**base, "order_id": "o-4", "shop": "", "coupon": None})
    too_early = serialize(V3, {**base, "order_id": "o-5", "ordered_at": datetime(1500, 1, 1, tzinfo=UTC)})
    text_time = serialize(TEXT_TIME, {**base, "ordered_at": AT.isoformat()}, "other-team")
    proto_id = client.register_schema("proto-orders-value", Schema(PROTO, "PROTOBUF"))
    text_id = int.from_bytes(text_time[1:5], "big")
    unknown_id = max(*ids, text_id, proto_id) + 1000

    def framed(schema_id: int, body: bytes) -> bytes:
        return bytes([0]) + schema_id.to_bytes(4, "big") + body

    values = [
        v1,
        v2,
        v3,
        empty_shop,
        too_early,
        None,
        b'{"order_id": "o-6"}',
        b"\x00\x00\x01",
        framed(unknown_id, v1[5:]),
        framed(ids[0], b"\xff\xff\xff\xff"),
        text_time,
        framed(proto_id, b"\x0a\x01x"),
    ]
    bronze = spark.createDataFrame(
        [(topic, 0, offset, value) for offset, value in enumerate(values)],
        "topic string, partition int, offset long, value binary",
    )
    found = schema_ids(bronze)
    assert found == sorted({*ids, text_id, unknown_id, proto_id})
    writers = WriterSchemas(schema_registry).lookup(found)
    assert writers[unknown_id] is None and writers[proto_id].schema_type == "PROTOBUF"

    parsed = parse_avro(bronze, ORDERS, writers)

    assert parsed.columns == [*bronze.columns, *ORDERS.names, "reason"]
    valid = parsed.where("reason IS NULL").select(
        "offset", "order_id", F.unix_micros("ordered_at").alias("at"), "shop", "quantity", "total", "coupon"
    )
    expected = spark.createDataFrame(
        [
            (0, "o-1", micros(AT) // 1000 * 1000, "north", 2, Decimal("10.50"), None),
            (1, "o-2", micros(AT), "north", 5_000_000_000, Decimal("10.50"), "C10"),
            (2, "o-3", micros(AT), "north", 2, Decimal("10.50"), None),
        ],
        valid.schema,
    )
    assert_df_equality(valid, expected, ignore_row_order=True, ignore_nullable=True)
    reasons = {row.offset: row.reason for row in parsed.where("reason IS NOT NULL").collect()}
    unresolvable = reasons.pop(10)
    assert unresolvable.startswith(f"{wire.UNRESOLVABLE}{text_id}: "), unresolvable
    assert "ordered_at" in unresolvable or "string" in unresolvable, unresolvable
    assert reasons == {
        3: "field shop must not be empty",
        4: "field ordered_at is outside the supported range [1583-01-01T00:00:00Z, 9999-01-01T00:00:00Z)",
        5: "null value (tombstone)",
        6: wire.NOT_WIRE_FORMAT,
        7: wire.NOT_WIRE_FORMAT,
        8: f"{wire.UNKNOWN_SCHEMA}{unknown_id}",
        9: f"{wire.UNREADABLE}{ids[0]}",
        11: f"writer schema is not Avro, id {proto_id}",
    }
    # Every reason is one of the dataset's labels once its id (and why) is taken out: a bounded set.
    labels = {quarantine_label(reason) for reason in [*reasons.values(), unresolvable]}
    assert labels <= set(quarantine_reasons(ORDERS)) and f"{wire.UNKNOWN_SCHEMA}<id>" in labels, labels
    rejected = parsed.where("reason IS NOT NULL")
    labelled = rejected.select("reason", quarantine_label_column(F.col("reason")).alias("label")).collect()
    assert {row.reason: row.label for row in labelled} == {row.reason: quarantine_label(row.reason) for row in labelled}


def test_writer_schemas_are_fetched_once_and_a_registry_that_does_not_answer_names_the_setting(schema_registry):
    client = SchemaRegistryClient(client_conf(schema_registry))
    schema_id = client.register_schema("cache-check-value", Schema(V1, "AVRO"))

    class Counting(SchemaRegistryClient):
        asked: list[int] = []

        def get_schema(self, schema_id, *args, **kwargs):
            self.asked.append(schema_id)
            return super().get_schema(schema_id, *args, **kwargs)

    counting = Counting(client_conf(schema_registry))
    schemas = WriterSchemas(schema_registry, client=counting, cache_size=1)
    first = schemas.lookup([schema_id, schema_id])[schema_id]
    assert first == WriterSchema(schema_id, "AVRO", first.text) and json.loads(first.text)["name"] == "Order"
    assert schemas.lookup([schema_id]) == {schema_id: first}
    assert counting.asked == [schema_id]
    # An id the registry does not hold is remembered as missing for missing_ttl_s: a replay soon after
    # does not ask for it again (records of random bytes name thousands); later it is asked again, and
    # a schema registered by then is found.
    missing = schema_id + 100_000
    assert schemas.lookup([missing, missing]) == {missing: None}
    assert schemas.lookup([missing]) == {missing: None}
    assert counting.asked == [schema_id, missing]
    forgetful = WriterSchemas(schema_registry, client=counting, missing_ttl_s=0)
    assert forgetful.lookup([missing]) == forgetful.lookup([missing]) == {missing: None}
    assert counting.asked == [schema_id, missing, missing, missing]
    # Many unknown ids in one batch (random bytes that look like the wire format) are asked several at a
    # time, each once; the found one among them is kept, in the order asked.
    counting.asked.clear()
    many = [schema_id, *range(missing + 1, missing + 200)]
    assert schemas.lookup(many) == {number: (first if number == schema_id else None) for number in many}
    assert schemas.lookup(many[1:]) == dict.fromkeys(many[1:])
    assert sorted(counting.asked) == many[1:]
    with pytest.raises(ValueError, match="missing_ttl_s must be seconds >= 0"):
        WriterSchemas(schema_registry, missing_ttl_s=-1)

    closed = "http://user:secret@127.0.0.1:1/apis/ccompat/v7"
    with pytest.raises(
        RegistryUnavailable, match=r"^schema_registry\.url: the registry at http://127\.0\.0\.1:1/"
    ) as refused:
        WriterSchemas(closed, client=SchemaRegistryClient({"url": closed, "max.retries": 0})).lookup([1])
    assert "secret" not in str(refused.value)
    with pytest.raises(ValueError, match="url must be"):
        WriterSchemas("127.0.0.1:8081")
    with pytest.raises(TypeError, match="schema ids are ints"):
        schemas.lookup(["1"])


def test_describe_schema_prints_fields_that_read_the_subjects_latest_schema(schema_registry, capsys) -> None:
    client = SchemaRegistryClient(client_conf(schema_registry))
    subject = f"described-{uuid.uuid4().hex[:6]}-value"
    with_odd_fields = json.loads(V2)
    with_odd_fields["fields"].append({"name": "weight", "type": "double"})
    schema_id = client.register_schema(subject, Schema(json.dumps(with_odd_fields), "AVRO"))
    config = load_config("local", environ={"SCHEMA_REGISTRY_URL": schema_registry})

    assert describe_schema(config, argparse.Namespace(subject=subject)) == ExitCode.OK
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        f"# The fields that read subject {subject}'s latest schema (id {schema_id}):",
        'Field("order_id", Kind.STRING),',
        'Field("ordered_at", Kind.TIMESTAMP),',
        'Field("shop", Kind.STRING),',
        'Field("quantity", Kind.LONG),',
        'Field("total", Kind.DECIMAL, precision=12, scale=2),',
        'Field("note", Kind.STRING),',
        'Field("coupon", Kind.STRING, required=False),',
        "# weight: double has no exact kind: write a decimal (bytes, logicalType decimal) to read it",
    ]
    # Pasted into a contract, they read that very schema.
    fields = eval("(" + " ".join(line for line in printed if not line.startswith("#")) + ")")  # noqa: S307
    pasted = Contract(fields=fields, event_time="ordered_at", dimensions=("shop",), measures=("total",))
    latest = WriterSchemas(schema_registry).latest(subject)
    assert latest.schema_id == schema_id and resolve(pasted, latest).problem is None
    # An unknown subject exits 1 naming it.
    assert describe_schema(config, argparse.Namespace(subject="nobody-value")) == ExitCode.FAILED
    assert "subject nobody-value has no schema" in capsys.readouterr().err


def test_a_sample_written_in_avro_reads_into_silver_as_the_producer_meant_and_as_the_oracle_reads_it(
    spark, schema_registry
) -> None:
    # The sample producer's Avro (confluent-kafka's AvroSerializer, a schema of its own making), read three ways:
    # by silver, by the oracle (AvroDeserializer), and by what the producer drew.
    dataset = Dataset(
        "avro_sample",
        SAMPLED,
        (Gold.of("windows", SAMPLED),),
        dedup_key=("order_id",),
        format=Format.AVRO,
        expectations=(in_range("total_positive", "total", minimum="0.01"),),
    )
    registry = {"url": schema_registry}
    write = value_writer(dataset, registry, f"avro-sample-{uuid.uuid4().hex[:6]}")
    drawn = contract_records(
        dataset, 240, seed=4, malformed_ratio=0.08, retry_ratio=0.08, unexpected_ratio=0.08, write=write
    )
    records = list(drawn)
    rows = [bronze_row(offset, value) for offset, (_, value) in enumerate(records)]
    parsed = without_duplicates(
        parse_records(bronze(spark, rows), dataset, WriterSchemas(schema_registry)), None, dataset
    )
    found = {row.offset: row for row in parsed.collect()}

    read = record_reader(dataset, registry)
    first_of: dict[bytes, int] = {}
    bad_reasons, unmet, duplicates, kept = Counter(), 0, 0, 0
    for offset, (_, value) in enumerate(records):
        row = found[offset]
        if value is None or not value.startswith(b"\x00") or value == value[:6]:
            bad_reasons[quarantine_label(row.reason)] += 1
            continue
        if int.from_bytes(value[1:5], "big") == UNKNOWN_SCHEMA_ID:
            assert row.reason == f"{wire.UNKNOWN_SCHEMA}{UNKNOWN_SCHEMA_ID}"
            bad_reasons[quarantine_label(row.reason)] += 1
            continue
        # A record the registry's schema reads: its reason is the oracle's, its values the oracle's too.
        reason = unmet_reason(dataset, value, registry)
        if reason is not None:
            assert row.reason == reason, (offset, row.reason)
            unmet += 1
            continue
        if first_of.setdefault(value, offset) != offset:
            assert row.reason.startswith(f"duplicate of events/0/{first_of[value]}"), row.reason
            duplicates += 1
            continue
        assert row.reason is None, (offset, row.reason)
        expected = read(value)
        assert row.order_id == expected["order_id"] and row.shop == expected["shop"]
        assert row.customer == expected["customer"] and row.total == expected["total"]
        assert row.ordered_at.astimezone(UTC) == datetime.fromisoformat(expected["ordered_at"])
        kept += 1
    # Each way the wire format is bad, each broken expectation and each retry came up, and most records are kept.
    assert set(bad_reasons) == {TOMBSTONE, wire.NOT_WIRE_FORMAT, f"{wire.UNKNOWN_SCHEMA}<id>", f"{wire.UNREADABLE}<id>"}
    assert unmet >= 5 and duplicates >= 5 and kept >= 150, (bad_reasons, unmet, duplicates, kept)
