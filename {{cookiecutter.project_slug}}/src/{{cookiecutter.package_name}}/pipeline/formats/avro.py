"""Avro values in the Confluent wire format, read into the contract's fields.

The contract is the reader schema (``reader_schema``): a required field is a plain Avro type, an
optional one a union with null (default null); a TIMESTAMP is a ``long`` with a timestamp logical
type, a DECIMAL ``bytes`` with the decimal logical type at the contract's precision and scale. Each
record is read with the writer schema its id names, resolved into that reader schema by Avro's rules
(a field added with a default, a field removed, an int promoted to long or a float to double): Spark's
``from_avro`` with the writer schema and the reader schema as its ``avroSchema``. Whether a writer
schema resolves is asked before Spark runs (Apache Avro's compatibility checker, and the logical
types, which it does not compare): a record of one that does not goes to quarantine naming the id and
why. Records of every writer schema of a batch are read in one pass: one ``CASE`` over the ids.

After reading, the contract's rules on values apply as they do to JSON (a required field present, a
string not empty and without U+0000, an event time within the supported range); the rules on JSON
types do not, since the schema types every field.

Example::

    writers = WriterSchemas(url).lookup(schema_ids(bronze))
    parsed = parse_avro(bronze, ORDERS_CONTRACT, writers)  # bronze's columns, the fields, `reason`
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import reduce

import avro.errors
import avro.schema
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.types import StructField, StructType

from ..contract import TOMBSTONE, Contract, Field, Kind, Rule
from . import typed, wire
from .registry import WriterSchema

AVRO = "AVRO"
FORMAT_NAME = "Avro"
TIMESTAMP_TYPES = ("timestamp-micros", "timestamp-millis")
PLAIN_TYPES = {Kind.STRING: "string", Kind.INTEGER: "int", Kind.LONG: "long", Kind.BOOLEAN: "boolean"}
# The contract's rules that apply to a value Avro typed. The others check JSON types, or cannot fail: a
# required field is never null in a record read (the reader schema's type is not a union), and a
# decimal the contract's precision cannot hold makes the whole record unreadable.
VALUE_RULES = typed.RULES
DECODED = "_decoded"
SCHEMA_ID = "_schema_id"


@dataclass(frozen=True)
class Resolution:
    """How the records of one writer schema are read: its reader schema, or why they cannot be."""

    writer: WriterSchema
    reader: str | None = None
    problem: str | None = None


def reader_schema(contract: Contract, writer: dict | None = None) -> dict:
    """The contract as an Avro record schema; with ``writer`` (a parsed writer schema), named as it is and
    with its timestamp units, which Avro resolution would otherwise mix up (millis read as micros).

    Example::

        reader_schema(ORDERS)  # {"type": "record", "name": "Contract", "fields": [...]}
    """
    if not isinstance(contract, Contract):
        raise TypeError(f"contract must be a Contract, not {type(contract).__name__}")
    writer_types = {field["name"]: _plain(field["type"]) for field in (writer or {}).get("fields", [])}
    fields = []
    for field in contract.fields:
        avro_type = _avro_type(field, writer_types.get(field.name))
        if field.required:
            fields.append({"name": field.name, "type": avro_type})
        else:
            fields.append({"name": field.name, "type": ["null", avro_type], "default": None})
    named = {"name": "Contract"}
    if writer:
        named = {"name": writer["name"], **({"namespace": writer["namespace"]} if writer.get("namespace") else {})}
    return {"type": "record", **named, "fields": fields}


def _avro_type(field: Field, writer_type: object) -> object:
    if field.kind is Kind.TIMESTAMP:
        unit = _logical(writer_type)
        return {"type": "long", "logicalType": unit if unit in TIMESTAMP_TYPES else "timestamp-micros"}
    if field.kind is Kind.DECIMAL:
        return {"type": "bytes", "logicalType": "decimal", "precision": field.precision, "scale": field.scale}
    return PLAIN_TYPES[field.kind]


def _plain(avro_type: object) -> object:
    """A union with null reduced to its other branch."""
    if isinstance(avro_type, list):
        others = [branch for branch in avro_type if branch != "null"]
        return others[0] if len(others) == 1 else avro_type
    return avro_type


def _logical(avro_type: object) -> str | None:
    return avro_type.get("logicalType") if isinstance(avro_type, dict) else None


def resolve(contract: Contract, writer: WriterSchema) -> Resolution:
    """Whether records of ``writer`` can be read into ``contract``, and the reader schema to read them with.

    Example::

        resolve(ORDERS, WriterSchema(3, "AVRO", text)).problem  # None, or why not
    """
    if not isinstance(writer, WriterSchema):
        raise TypeError(f"writer must be a WriterSchema, not {type(writer).__name__}")
    if writer.schema_type != AVRO:
        return Resolution(writer, problem=f"{writer.schema_type}")
    try:
        parsed = json.loads(writer.text)
        writer_avro = avro.schema.parse(writer.text)
    except (ValueError, avro.errors.AvroException) as error:
        return Resolution(writer, problem=f"not a valid Avro schema ({error})")
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        return Resolution(writer, problem="not an Avro record")
    reader = reader_schema(contract, parsed)
    found = ReaderWriterCompatibilityChecker().get_compatibility(avro.schema.parse(json.dumps(reader)), writer_avro)
    if found.compatibility is not SchemaCompatibilityType.compatible:
        return Resolution(writer, problem="; ".join(sorted(found.messages)))
    writer_types = {field["name"]: _plain(field["type"]) for field in parsed["fields"]}
    for field in contract.fields:
        if field.name in writer_types and field.kind is Kind.DECIMAL:
            written = writer_types[field.name]
            if _logical(written) != "decimal" or written.get("scale", 0) != field.scale:
                return Resolution(writer, problem=f"field {field.name} is not a decimal of scale {field.scale}")
        if field.name in writer_types and field.kind is Kind.TIMESTAMP:
            if _logical(writer_types[field.name]) not in TIMESTAMP_TYPES:
                return Resolution(writer, problem=f"field {field.name} is not a timestamp-micros or -millis long")
    return Resolution(writer, reader=json.dumps(reader))


def contract_fields(writer: WriterSchema) -> list[str]:
    """The contract fields that read ``writer`` (an Avro record schema), as Python lines to paste into a
    dataset's module; a field no kind can read, as a comment saying why.

    Example::

        contract_fields(WriterSchemas(url).latest("orders-value"))
        # ['Field("order_id", Kind.STRING),', 'Field("ordered_at", Kind.TIMESTAMP),', ...]
    """
    if not isinstance(writer, WriterSchema):
        raise TypeError(f"writer must be a WriterSchema, not {type(writer).__name__}")
    if writer.schema_type != AVRO:
        raise ValueError(f"schema {writer.schema_id} is {writer.schema_type}, not Avro")
    parsed = json.loads(writer.text)
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise ValueError(f"schema {writer.schema_id} is not an Avro record")
    lines = []
    for field in parsed["fields"]:
        written = field["type"]
        optional = isinstance(written, list) and "null" in written
        kind, extra = _kind_of(_plain(written))
        if kind is None:
            lines.append(f"# {field['name']}: {extra}")
            continue
        options = extra + (", required=False" if optional else "")
        lines.append(f'Field("{field["name"]}", Kind.{kind.name}{options}),')
    return lines


def _kind_of(avro_type: object) -> tuple[Kind | None, str]:
    """The kind that reads ``avro_type``, with the Field options it needs; or None and why none does."""
    logical = _logical(avro_type)
    base = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if logical in TIMESTAMP_TYPES:
        return Kind.TIMESTAMP, ""
    if logical == "decimal" and base == "bytes":
        return Kind.DECIMAL, f", precision={avro_type['precision']}, scale={avro_type.get('scale', 0)}"
    kinds = {kind_type: kind for kind, kind_type in PLAIN_TYPES.items()}
    if isinstance(base, str) and base in kinds:
        return kinds[base], ""
    if base in ("float", "double"):
        return None, f"{base} has no exact kind: write a decimal (bytes, logicalType decimal) to read it"
    return None, f"{json.dumps(avro_type)} has no kind: nested records, arrays, maps and enums are not read"


def parse_avro(bronze: DataFrame, contract: Contract, writers: Mapping[int, WriterSchema | None]) -> DataFrame:
    """Bronze rows plus one typed column per contract field and ``reason`` (null when the record is valid).

    ``writers`` holds the writer schema of every id the batch names (None for one the registry does
    not hold): ``schema_ids`` lists them, ``WriterSchemas.lookup`` finds them.

    Example::

        parse_avro(bronze, ORDERS, WriterSchemas(url).lookup(schema_ids(bronze)))
    """
    if not isinstance(bronze, DataFrame):
        raise TypeError(f"bronze must be a DataFrame, not {type(bronze).__name__}")
    if not isinstance(contract, Contract):
        raise TypeError(f"contract must be a Contract, not {type(contract).__name__}")
    resolutions = {schema_id: resolve(contract, writer) for schema_id, writer in writers.items() if writer}
    readable = {schema_id: found for schema_id, found in resolutions.items() if found.reader}
    value, schema_id = F.col("value"), F.col(SCHEMA_ID)
    decoded = _decoded(contract, readable, schema_id)
    parsed = (
        bronze.withColumn(SCHEMA_ID, wire.schema_id(value))
        .withColumn(DECODED, decoded)
        .withColumns({field.name: F.col(f"{DECODED}.{field.name}") for field in contract.fields})
    )
    reason = _record_reason(contract, writers, resolutions, schema_id)
    checks = [(typed.failed(rule, field), F.lit(rule.message(field))) for rule, field in value_checks(contract)]
    field_reason = F.coalesce(*[F.when(failed, message) for failed, message in checks]) if checks else F.lit(None)
    return parsed.withColumn("reason", F.coalesce(reason, field_reason)).select(
        *bronze.columns, *contract.names, "reason"
    )


def schema_ids(bronze: DataFrame) -> list[int]:
    """The ids of the writer schemas a batch names (one small job).

    Example::

        WriterSchemas(url).lookup(schema_ids(bronze))
    """
    rows = bronze.select(wire.schema_id(F.col("value")).alias("id")).where("id IS NOT NULL").distinct().collect()
    return sorted(row.id for row in rows)


def value_checks(contract: Contract) -> list[tuple[Rule, Field]]:
    """The contract's checks that apply to a value Avro typed, in the contract's order of precedence."""
    return [(rule, field) for rule, field in contract.checks() if rule in VALUE_RULES]


def quarantine_reasons(contract: Contract) -> list[str]:
    """Every reason (as its label) a record of an Avro dataset can be quarantined with, in order."""
    return [TOMBSTONE, *wire.reasons(FORMAT_NAME), *(rule.message(field) for rule, field in value_checks(contract))]


def _decoded(contract: Contract, readable: Mapping[int, Resolution], schema_id: Column) -> Column:
    """The record read with its writer schema into the reader schema: one CASE over the batch's ids.

    ``from_avro`` in PERMISSIVE mode gives a record of nulls for a body it cannot read; the reader
    schema's required fields are never null otherwise, so a null event time tells it.
    """
    body = wire.body(F.col("value"))
    branches = [
        (
            schema_id == F.lit(number),
            from_avro(body, found.writer.text, {"mode": "PERMISSIVE", "avroSchema": found.reader}),
        )
        for number, found in sorted(readable.items())
    ]
    if not branches:
        return F.lit(None).cast(_struct(contract))
    first, *others = branches
    return reduce(lambda case, branch: case.when(*branch), others, F.when(*first))


def _struct(contract: Contract) -> StructType:
    return StructType([StructField(field.name, field.spark_type, True) for field in contract.fields])


def _record_reason(
    contract: Contract,
    writers: Mapping[int, WriterSchema | None],
    resolutions: Mapping[int, Resolution],
    schema_id: Column,
) -> Column:
    """Why a record cannot be read at all, before its fields: null when it can."""
    with_id = schema_id.cast("string")
    problems = {
        number: found.problem
        for number, found in resolutions.items()
        if found.problem and found.writer.schema_type == AVRO
    }
    checks = wire.header_checks(schema_id, writers, AVRO, FORMAT_NAME)
    for number, problem in sorted(problems.items()):
        checks.append((schema_id == F.lit(number), F.lit(f"{wire.UNRESOLVABLE}{number}: {problem}")))
    event_time = F.col(contract.event_time)
    checks.append((event_time.isNull(), F.concat(F.lit(wire.UNREADABLE), with_id)))
    return F.coalesce(*[F.when(failed, reason) for failed, reason in checks])
