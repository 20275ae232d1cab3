"""The Confluent wire format: a magic byte 0, the writer schema's id (4 bytes, big-endian), the body.

The reasons a record in this format goes to quarantine before any field is read, and the columns that
take a value apart. A reason that names a schema id ends with ``, id <n>`` (and, for a writer schema
the contract cannot read, ``: <why>``); its label (``contract.quarantine_label``) has ``<id>`` in
place of the rest, so that metrics get a bounded set of labels.

Example::

    rows.select(schema_id(F.col("value")), body(F.col("value")))
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..contract import SCHEMA_ID_FOLLOWS, SCHEMA_ID_PLACEHOLDER, TOMBSTONE
from .registry import WriterSchema

MAGIC_BYTE = 0
HEADER_BYTES = 5
# Protobuf's message indexes read (message_path): nesting this deep, each index below 64.
MAX_MESSAGE_DEPTH = 4
NOT_WIRE_FORMAT = "value is not in the Confluent wire format (magic byte 0, then a 4-byte schema id)"
UNKNOWN_SCHEMA = "writer schema is not in the registry" + SCHEMA_ID_FOLLOWS
NOT_THE_FORMAT = "writer schema is not {format}" + SCHEMA_ID_FOLLOWS
UNRESOLVABLE = "writer schema cannot be read into the contract" + SCHEMA_ID_FOLLOWS
UNREADABLE = "value cannot be read with its writer schema" + SCHEMA_ID_FOLLOWS
NO_MESSAGE = "message indexes name no message of the writer schema" + SCHEMA_ID_FOLLOWS


def header_ok(value: Column) -> Column:
    """True for a value that starts with the magic byte and holds a whole schema id.

    Example::

        rows.where(header_ok(F.col("value")))
    """
    _check_column(value)
    return (F.length(value) >= HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(bytes([MAGIC_BYTE])))


def schema_id(value: Column) -> Column:
    """The writer schema's id a value names (a BIGINT), null for a value not in the wire format.

    Example::

        rows.select(schema_id(F.col("value")).alias("schema_id")).distinct()
    """
    _check_column(value)
    return F.when(header_ok(value), F.conv(F.hex(F.substring(value, 2, 4)), 16, 10).cast("bigint"))


def body(value: Column) -> Column:
    """The value without its header: what the writer schema wrote.

    Example::

        from_avro(body(F.col("value")), writer_schema)
    """
    _check_column(value)
    return F.substring(value, HEADER_BYTES + 1, 2**31 - 1)


def framed(schema_id: int, body: Column) -> Column:
    """``body`` behind the header naming ``schema_id``: a value in the wire format, as a serializer writes it.

    Example::

        framed(7, to_avro(F.struct(*columns), schema_text))
    """
    _check_column(body)
    if isinstance(schema_id, bool) or not isinstance(schema_id, int) or not 0 <= schema_id < 2**32:
        raise ValueError(f"a schema id is an int of 4 bytes, not {schema_id!r}")
    return F.concat(F.lit(bytes([MAGIC_BYTE]) + schema_id.to_bytes(4, "big")), body)


def message_path(value: Column) -> Column:
    """For Protobuf: the message indexes after the header, as a path string (``"0"`` for the file's first
    message, ``"1.2"`` for the third message nested in its second), null when they cannot be read.

    Confluent's serializers write them as a zigzag varint count then each index, or a single byte 0 for
    ``[0]``; paths of up to ``MAX_MESSAGE_DEPTH`` indexes below 64 (one byte each) are read.

    Example::

        rows.select(message_path(F.col("value")))  # "0"
    """
    _check_column(value)
    first = _byte(value, HEADER_BYTES + 1)
    by_count = F.lit(None).cast("string")
    for count in range(MAX_MESSAGE_DEPTH, 0, -1):
        indexes = [_byte(value, HEADER_BYTES + 2 + place) for place in range(count)]
        readable = reduce(lambda both, index: both & _small_even(index), indexes, F.lit(True))
        path = F.concat_ws(".", *[(index / 2).cast("int").cast("string") for index in indexes])
        by_count = F.when((first == 2 * count) & readable, path).otherwise(by_count)
    return F.when(header_ok(value), F.when(first == 0, F.lit("0")).otherwise(by_count))


def protobuf_body(value: Column) -> Column:
    """For Protobuf: the value without its header and message indexes (``message_path`` reads them).

    Example::

        rows.select(protobuf_body(F.col("value")))  # what Order.ParseFromString reads
    """
    _check_column(value)
    first = _byte(value, HEADER_BYTES + 1)
    index_bytes = F.when(first == 0, F.lit(1)).otherwise((first / 2).cast("int") + 1)
    return F.substring(value, F.lit(HEADER_BYTES + 1) + index_bytes, F.lit(2**31 - 1))


def header_checks(
    schema_id: Column, writers: Mapping[int, WriterSchema | None], schema_type: str, format_name: str
) -> list[tuple[Column, Column]]:
    """The (failed, reason) checks of a record before its body, in order: a tombstone, a value not in the
    wire format, an id the registry does not hold (None in ``writers``), a writer schema of another type
    than ``schema_type``. ``schema_id`` is ``schema_id(F.col("value"))``.

    Example::

        checks = header_checks(F.col("_schema_id"), writers, "AVRO", "Avro")
    """
    _check_column(schema_id)
    known = [number for number, writer in writers.items() if writer is not None]
    other_type = [number for number in known if writers[number].schema_type != schema_type]
    with_id = schema_id.cast("string")
    return [
        (F.col("value").isNull(), F.lit(TOMBSTONE)),
        (schema_id.isNull(), F.lit(NOT_WIRE_FORMAT)),
        (~schema_id.isin(known) if known else F.lit(True), F.concat(F.lit(UNKNOWN_SCHEMA), with_id)),
        (
            schema_id.isin(other_type) if other_type else F.lit(False),
            F.concat(F.lit(NOT_THE_FORMAT.format(format=format_name)), with_id),
        ),
    ]


def _byte(value: Column, position: int) -> Column:
    """The unsigned byte at ``position`` (from 1) of a binary value; null past its end."""
    return F.when(F.length(value) >= position, F.conv(F.hex(F.substring(value, position, 1)), 16, 10).cast("int"))


def _small_even(index: Column) -> Column:
    # A zigzag varint of one byte holding a non-negative index below 64.
    return index.isNotNull() & (index < 128) & (index % 2 == 0)


def reasons(format_name: str) -> tuple[str, ...]:
    """The labels of the reasons a record of ``format_name`` goes to quarantine with before its fields.

    Example::

        reasons("Avro")  # (NOT_WIRE_FORMAT, "writer schema is not in the registry, id <id>", ...)
    """
    if not isinstance(format_name, str) or not format_name:
        raise TypeError(f"format_name must name a format, not {format_name!r}")
    with_id = (UNKNOWN_SCHEMA, NOT_THE_FORMAT.format(format=format_name), UNRESOLVABLE, UNREADABLE)
    return (NOT_WIRE_FORMAT, *(reason + SCHEMA_ID_PLACEHOLDER for reason in with_id))


def _check_column(column: object) -> None:
    if not isinstance(column, Column):
        raise TypeError(f"expected a Column, not {type(column).__name__}")
