"""Protobuf values in the Confluent wire format, read into the contract's fields.

After the header come the message indexes (``wire.message_path``: which message of the writer's file),
then the body. A registry holds a Protobuf writer schema as ``.proto`` text (Confluent's Java
serializer, a schema registered by hand) or as a base64 ``FileDescriptorProto`` (confluent-kafka's
Python serializer); ``descriptor_set`` turns either into a binary descriptor set, compiling text with
the ``protoc`` of the ``grpcio-tools`` wheel. The
well-known types (``google/protobuf/timestamp.proto`` and the others) are the imports followed; a
writer schema that imports another of the registry's schemas (a reference) is not read.

A contract field reads the writer's field of the same name (Protobuf itself resolves by field
number; a renamed field keeps its number, and here must keep its name): a STRING a ``string``; an
INTEGER an ``int32``, ``sint32`` or ``sfixed32``; a LONG those or their 64-bit forms; a BOOLEAN a
``bool``; a TIMESTAMP a ``google.protobuf.Timestamp``; a DECIMAL a ``string`` holding the number,
which must fit the contract's precision and scale exactly. A required field the writer lacks, or one
of another type, makes the writer schema unresolvable: its records go to quarantine naming the id
and why. Proto3 writes no field holding its default: a required string left unset reads as ``""``
and is quarantined as empty; a number left unset reads as 0, as every Protobuf reader reads it.

Records of every (writer schema, message) of a batch are read in one pass, by one Python function
(``Decoder``, the ``protobuf`` package's parser) where the rows are: Spark's own ``from_protobuf``
lives in the ``spark-protobuf`` package, which the Maven repository this project installs from does
not serve.

Example::

    writers = WriterSchemas(url).lookup(schema_ids(bronze))
    parsed = parse_protobuf(bronze, ORDERS_CONTRACT, writers, message_paths(bronze))
"""

from __future__ import annotations

import base64
import binascii
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC
from functools import lru_cache
from importlib import resources
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FieldDescriptorProto
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StringType, StructField, StructType

from ..contract import SCHEMA_ID_PLACEHOLDER, TOMBSTONE, Contract, Field, Kind, Rule
from . import typed, wire
from .registry import WriterSchema

PROTOBUF = "PROTOBUF"
FORMAT_NAME = "Protobuf"
TIMESTAMP_MESSAGE = ".google.protobuf.Timestamp"
WELL_KNOWN = "google/protobuf/"
_INTS = {FieldDescriptorProto.TYPE_INT32, FieldDescriptorProto.TYPE_SINT32, FieldDescriptorProto.TYPE_SFIXED32}
_LONGS = {FieldDescriptorProto.TYPE_INT64, FieldDescriptorProto.TYPE_SINT64, FieldDescriptorProto.TYPE_SFIXED64}
# The writer's field types each kind reads.
READS = {
    Kind.STRING: {FieldDescriptorProto.TYPE_STRING},
    Kind.INTEGER: _INTS,
    Kind.LONG: _INTS | _LONGS,
    Kind.BOOLEAN: {FieldDescriptorProto.TYPE_BOOL},
    Kind.DECIMAL: {FieldDescriptorProto.TYPE_STRING},
}
# The contract's rules that apply to a value Protobuf typed (see avro.VALUE_RULES); DOES_NOT_FIT for a
# decimal written as a string.
VALUE_RULES = (*typed.RULES, Rule.DOES_NOT_FIT)
# A decimal's string is read this wide first: if the contract's own precision and scale read it otherwise,
# it does not fit exactly.
WIDE = "decimal(38,18)"
DECODED = "_decoded"
SCHEMA_ID = "_schema_id"
MESSAGE_PATH = "_message_path"


@dataclass(frozen=True)
class Message:
    """How the records of one (writer schema, message path) are read: the message's full name and the
    descriptor set, or why they cannot be."""

    writer: WriterSchema
    path: str
    name: str | None = None
    descriptors: bytes | None = None
    problem: str | None = None


def descriptor_set(writer: WriterSchema) -> bytes:
    """The binary ``FileDescriptorSet`` of a Protobuf writer schema, with the well-known types it imports.
    ValueError saying why when it is neither valid ``.proto`` text nor a base64 ``FileDescriptorProto``,
    or imports a schema other than a well-known type.

    Example::

        message_name(descriptor_set(writer), "0")  # "shop.Order"
    """
    if not isinstance(writer, WriterSchema):
        raise TypeError(f"writer must be a WriterSchema, not {type(writer).__name__}")
    return _descriptor_set(writer.text)


@lru_cache(maxsize=256)
def _descriptor_set(text: str) -> bytes:
    file = _serialized(text)
    if file is None:
        return _compiled(text)
    found = descriptor_pb2.FileDescriptorSet()
    for dependency in file.dependency:
        if not dependency.startswith(WELL_KNOWN):
            raise ValueError(f"imports {dependency}, another schema of the registry, which is not followed")
        try:
            descriptor_pool.Default().FindFileByName(dependency).CopyToProto(found.file.add())
        except KeyError:
            raise ValueError(f"imports {dependency}, which is not a well-known type") from None
    found.file.append(file)
    return found.SerializeToString()


def _serialized(text: str) -> descriptor_pb2.FileDescriptorProto | None:
    """The FileDescriptorProto of base64 text, None for text that is not one (``.proto`` source)."""
    if "message" in text or "syntax" in text:
        return None
    try:
        file = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return None
    return file if file.message_type else None


def _compiled(text: str) -> bytes:
    """``.proto`` source compiled by protoc (the grpcio-tools wheel's), with the well-known types."""
    includes = resources.files("grpc_tools").joinpath("_proto")
    with tempfile.TemporaryDirectory(prefix="lakehouse-proto-") as directory:
        source, output = Path(directory) / "writer.proto", Path(directory) / "writer.desc"
        source.write_text(text)
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={directory}",
            f"--proto_path={includes}",
            "--include_imports",
            f"--descriptor_set_out={output}",
            str(source),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            words = " ".join(done.stderr.replace(str(source), "schema").split())
            raise ValueError(f"not valid .proto source ({words[:300]})")
        return output.read_bytes()


def message_name(descriptors: bytes, path: str) -> str:
    """The full name of the message ``path`` (``wire.message_path``) names in the last file of ``descriptors``.
    KeyError when it names none.

    Example::

        message_name(descriptor_set(writer), "0")  # "shop.Order"
    """
    found = descriptor_pb2.FileDescriptorSet.FromString(descriptors)
    file = found.file[-1]
    messages, names = file.message_type, [file.package] if file.package else []
    for index in (int(part) for part in path.split(".")):
        if index >= len(messages):
            raise KeyError(path)
        names.append(messages[index].name)
        messages = messages[index].nested_type
    return ".".join(names)


def message_descriptor(descriptors: bytes, name: str):
    """The descriptor of message ``name`` in a binary descriptor set, in a pool of its own.

    Example::

        message_descriptor(descriptor_set(writer), "shop.Order").fields
    """
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(descriptors).file:
        pool.Add(file)
    return pool.FindMessageTypeByName(name)


def resolve(contract: Contract, writer: WriterSchema, path: str) -> Message:
    """Whether records of ``writer``'s message ``path`` can be read into ``contract``, and how.

    Example::

        resolve(ORDERS, WriterSchema(3, "PROTOBUF", text), "0").problem  # None, or why not
    """
    if not isinstance(contract, Contract):
        raise TypeError(f"contract must be a Contract, not {type(contract).__name__}")
    if not isinstance(writer, WriterSchema):
        raise TypeError(f"writer must be a WriterSchema, not {type(writer).__name__}")
    if writer.schema_type != PROTOBUF:
        return Message(writer, path, problem=writer.schema_type)
    try:
        descriptors = descriptor_set(writer)
        name = message_name(descriptors, path)
    except KeyError:
        return Message(writer, path, problem=f"no message {path}")
    except ValueError as error:
        return Message(writer, path, problem=str(error))
    fields = {field.name: field for field in message_descriptor(descriptors, name).fields}
    for field in contract.fields:
        written = fields.get(field.name)
        if written is None:
            if field.required:
                return Message(writer, path, name, problem=f"message {name} has no field {field.name}")
            continue
        problem = _type_problem(field, written)
        if problem:
            return Message(writer, path, name, problem=f"field {field.name} {problem}")
    return Message(writer, path, name, descriptors)


def _type_problem(field: Field, written) -> str | None:
    if _repeated(written):
        return "is repeated"
    if field.kind is Kind.TIMESTAMP:
        named = written.message_type.full_name if written.message_type else None
        return None if f".{named}" == TIMESTAMP_MESSAGE else "is not a google.protobuf.Timestamp"
    if written.type not in READS[field.kind]:
        return f"is not a {'string' if field.kind is Kind.DECIMAL else field.kind.value} in Protobuf"
    return None


def _repeated(written) -> bool:
    # protobuf 5+ has is_repeated; older descriptors only the label.
    repeated = getattr(written, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    return written.label == FieldDescriptorProto.LABEL_REPEATED


def message_paths(bronze: DataFrame) -> list[tuple[int, str | None]]:
    """The (schema id, message path) pairs a batch names (one small job); the path None for indexes that
    cannot be read.

    Example::

        parse_protobuf(bronze, ORDERS, WriterSchemas(url).lookup(ids), message_paths(bronze))
    """
    value = F.col("value")
    rows = (
        bronze.select(wire.schema_id(value).alias("id"), wire.message_path(value).alias("path"))
        .where("id IS NOT NULL")
        .distinct()
        .collect()
    )
    return sorted(((row.id, row.path) for row in rows), key=lambda pair: (pair[0], pair[1] or ""))


def parse_protobuf(
    bronze: DataFrame,
    contract: Contract,
    writers: Mapping[int, WriterSchema | None],
    paths: Iterable[tuple[int, str]],
) -> DataFrame:
    """Bronze rows plus one typed column per contract field and ``reason`` (null when the record is valid).

    ``writers`` holds the writer schema of every id the batch names (None for one the registry does not
    hold), ``paths`` every (id, message path) it names (``message_paths``).

    Example::

        parse_protobuf(bronze, ORDERS, WriterSchemas(url).lookup(ids), message_paths(bronze))
    """
    if not isinstance(bronze, DataFrame):
        raise TypeError(f"bronze must be a DataFrame, not {type(bronze).__name__}")
    if not isinstance(contract, Contract):
        raise TypeError(f"contract must be a Contract, not {type(contract).__name__}")
    messages = [
        resolve(contract, writers[schema_id], path) for schema_id, path in paths if writers.get(schema_id) is not None
    ]
    value, schema_id, path = F.col("value"), F.col(SCHEMA_ID), F.col(MESSAGE_PATH)
    parsed = (
        bronze.withColumn(SCHEMA_ID, wire.schema_id(value))
        .withColumn(MESSAGE_PATH, wire.message_path(value))
        .withColumn(DECODED, _decoded(contract, [each for each in messages if each.descriptors], schema_id, path))
    )
    typed = {field.name: _typed(field, F.col(f"{DECODED}.{field.name}")) for field in contract.fields}
    parsed = parsed.withColumns(typed)
    reason = _record_reason(contract, writers, messages, schema_id, path)
    checks = [(_failed(rule, field), F.lit(rule.message(field))) for rule, field in value_checks(contract)]
    field_reason = F.coalesce(*[F.when(failed, message) for failed, message in checks]) if checks else F.lit(None)
    return parsed.withColumn("reason", F.coalesce(reason, field_reason)).select(
        *bronze.columns, *contract.names, "reason"
    )


def _decoded(contract: Contract, readable: list[Message], schema_id: Column, path: Column) -> Column:
    """Each record read with its writer's message into a struct of the contract's fields as written (a
    DECIMAL still its string), null for one that cannot be read: one Python function over the batch's
    (id, path) pairs, run where the rows are (Spark has no Protobuf reader of its own here)."""
    if not readable:
        return F.lit(None).cast(_raw_struct(contract))
    decoder = Decoder(
        {(message.writer.schema_id, message.path): (message.descriptors, message.name) for message in readable},
        tuple((field.name, field.kind.value) for field in contract.fields),
    )
    # Rows pickled one by one: Arrow's path needs pyarrow, which the project does not install.
    decode = F.udf(decoder, _raw_struct(contract), useArrow=False)
    return decode(schema_id, path, wire.protobuf_body(F.col("value")))


class Decoder:
    """Reads a Protobuf body with the message of its (schema id, path), into the contract's raw fields.

    Pickled to the executors: it holds descriptor sets and names only. Each process builds a message's
    class once, on its first record.
    """

    def __init__(self, messages: Mapping[tuple[int, str], tuple[bytes, str]], fields: tuple[tuple[str, str], ...]):
        self.messages, self.fields = dict(messages), fields
        self._classes: dict[tuple[int, str], type] = {}

    def __getstate__(self) -> dict:
        return {"messages": self.messages, "fields": self.fields}

    def __setstate__(self, state: dict) -> None:
        self.messages, self.fields, self._classes = state["messages"], state["fields"], {}

    def __call__(self, schema_id: int | None, path: str | None, body: bytes | None) -> tuple | None:
        if schema_id is None or path is None or body is None or (schema_id, path) not in self.messages:
            return None
        message = self._class(schema_id, path)()
        try:
            message.ParseFromString(bytes(body))
        except Exception:  # noqa: BLE001 - DecodeError, or what a corrupt body makes the parser raise
            return None
        present = {descriptor.name for descriptor in message.DESCRIPTOR.fields}
        values = []
        for name, kind in self.fields:
            if name not in present:
                values.append(None)
            elif kind == Kind.TIMESTAMP.value:
                stamp = getattr(message, name)
                written = message.HasField(name)
                values.append(stamp.ToDatetime(tzinfo=UTC) if written else None)
            else:
                field = message.DESCRIPTOR.fields_by_name[name]
                has_presence = getattr(field, "has_presence", False)
                values.append(getattr(message, name) if not has_presence or message.HasField(name) else None)
        return tuple(values)

    def _class(self, schema_id: int, path: str) -> type:
        key = (schema_id, path)
        if key not in self._classes:
            self._classes[key] = message_factory.GetMessageClass(message_descriptor(*self.messages[key]))
        return self._classes[key]


def _raw_type(field: Field) -> DataType:
    return StringType() if field.kind is Kind.DECIMAL else field.spark_type


def _raw_struct(contract: Contract) -> StructType:
    return StructType([StructField(field.name, _raw_type(field), True) for field in contract.fields])


def _typed(field: Field, raw: Column) -> Column:
    return raw.try_cast(field.spark_type) if field.kind is Kind.DECIMAL else raw


def value_checks(contract: Contract) -> list[tuple[Rule, Field]]:
    """The contract's checks that apply to a value Protobuf typed, in the contract's order of precedence."""
    return [
        (rule, field)
        for rule, field in contract.checks()
        if rule in VALUE_RULES and (rule is not Rule.DOES_NOT_FIT or field.kind is Kind.DECIMAL)
    ]


def quarantine_reasons(contract: Contract) -> list[str]:
    """Every reason (as its label) a record of a Protobuf dataset can be quarantined with, in order."""
    return [
        TOMBSTONE,
        *wire.reasons(FORMAT_NAME),
        wire.NO_MESSAGE + SCHEMA_ID_PLACEHOLDER,
        *(rule.message(field) for rule, field in value_checks(contract)),
    ]


def _record_reason(
    contract: Contract,
    writers: Mapping[int, WriterSchema | None],
    messages: list[Message],
    schema_id: Column,
    path: Column,
) -> Column:
    """Why a record cannot be read at all, before its fields: null when it can."""
    with_id = schema_id.cast("string")
    checks = [
        *wire.header_checks(schema_id, writers, PROTOBUF, FORMAT_NAME),
        (path.isNull(), F.concat(F.lit(wire.NO_MESSAGE), with_id)),
    ]
    for message in messages:
        if message.problem is None or message.writer.schema_type != PROTOBUF:
            continue
        chosen = (schema_id == F.lit(message.writer.schema_id)) & (path == F.lit(message.path))
        if message.name is None and message.problem.startswith("no message"):
            checks.append((chosen, F.concat(F.lit(wire.NO_MESSAGE), with_id)))
        else:
            number = message.writer.schema_id
            checks.append((chosen, F.lit(f"{wire.UNRESOLVABLE}{number}: {message.problem}")))
    readable = F.col(DECODED).isNotNull() & F.col(contract.event_time).isNotNull()
    checks.append((~readable, F.concat(F.lit(wire.UNREADABLE), with_id)))
    return F.coalesce(*[F.when(failed, reason) for failed, reason in checks])


def _failed(rule: Rule, field: Field) -> Column:
    """True when ``field``, as Protobuf typed it, fails ``rule``."""
    if rule is not Rule.DOES_NOT_FIT:
        return typed.failed(rule, field)
    # The string as written, read wide and at the contract's scale: unequal, or unreadable, it does not fit.
    value, raw = F.col(field.name), F.col(f"{DECODED}.{field.name}")
    wide = raw.try_cast(WIDE)
    return raw.isNotNull() & (value.isNull() | wide.isNull() | (wide != value.cast(WIDE)))
