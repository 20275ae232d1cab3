"""Rows of a known Spark schema as Avro in the Confluent wire format: what the Kafka egress publishes.

``record_schema`` writes the Avro record schema of a Spark schema (a nullable column is a union with
null, default null; a TIMESTAMP a ``long`` of ``timestamp-micros``, a DECIMAL ``bytes`` of the
decimal logical type at its precision and scale); the egress registers it under ``<topic>-value``
and ``encode`` writes each row with it, behind the wire format's header, as Confluent's own
``AvroSerializer`` would. ``decode`` reads such values back into the Spark schema, each with the
writer schema its id names (a topic written over time by several versions of a gold's columns),
resolved by Avro's rules into the current one: one ``CASE`` over the ids, as silver reads.

Example::

    text = record_schema(published_schema(target), "gold_orders_by_shop")
    schema_id = WriterSchemas(access).register("orders-by-shop-changes-value", text)
    records.select(encode(F.struct(*columns), schema_id, text).alias("value"))
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import reduce

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructType,
    TimestampType,
)

from . import wire

# Spark's types with one Avro type each (to_avro's own mapping).
PLAIN = {
    StringType: "string",
    LongType: "long",
    IntegerType: "int",
    DoubleType: "double",
    FloatType: "float",
    BooleanType: "boolean",
}
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def record_schema(schema: StructType, name: str, namespace: str = "lakehouse") -> str:
    """The Avro record schema (JSON text) of rows of ``schema``, named ``namespace.name``.

    Example::

        record_schema(StructType().add("shop", "string").add("orders", "long", False), "by_shop")
        # '{"type": "record", "name": "by_shop", "namespace": "lakehouse", "fields": [...]}'
    """
    if not isinstance(schema, StructType) or not schema.fields:
        raise TypeError(f"schema must be a StructType with fields, not {schema!r}")
    for text, what in ((name, "name"), *((part, "namespace") for part in namespace.split("."))):
        if not isinstance(text, str) or not NAME.fullmatch(text):
            raise ValueError(f"{what} must be an Avro name ([A-Za-z_][A-Za-z0-9_]*), not {text!r}")
    fields = []
    for field in schema.fields:
        if not NAME.fullmatch(field.name):
            raise ValueError(f"column {field.name!r} is not a valid Avro field name")
        avro_type = _avro_type(field.dataType, field.name)
        if field.nullable:
            fields.append({"name": field.name, "type": ["null", avro_type], "default": None})
        else:
            fields.append({"name": field.name, "type": avro_type})
    return json.dumps({"type": "record", "name": name, "namespace": namespace, "fields": fields})


def _avro_type(data_type: DataType, column: str) -> object:
    for spark_type, avro_type in PLAIN.items():
        if isinstance(data_type, spark_type):
            return avro_type
    if isinstance(data_type, TimestampType):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(data_type, DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, DecimalType):
        return {"type": "bytes", "logicalType": "decimal", "precision": data_type.precision, "scale": data_type.scale}
    raise ValueError(f"column {column} is {data_type.simpleString()}, which has no Avro type here")


def encode(row: Column, schema_id: int, schema_text: str) -> Column:
    """``row`` (a struct of the schema's columns) written with ``schema_text``, behind the wire format's
    header naming ``schema_id``: the bytes Confluent's ``AvroSerializer`` writes.

    Example::

        records.select(encode(F.struct(*columns), 7, text).alias("value"))
    """
    if not isinstance(row, Column):
        raise TypeError(f"row must be a Column, not {type(row).__name__}")
    _check_id(schema_id)
    if not isinstance(schema_text, str) or not schema_text:
        raise ValueError("schema_text must be the Avro schema registered under schema_id")
    return wire.framed(schema_id, to_avro(row, schema_text))


def decode(value: Column, writers: Mapping[int, str], reader_text: str) -> Column:
    """Values in the wire format read into the struct of ``reader_text``: each with the writer schema its
    id names in ``writers`` (id -> schema text), resolved into the reader's. A value of an id not in
    ``writers``, or not in the wire format, is null: the caller looks its ids up first.

    Example::

        changelog.select(decode(F.col("value"), {7: text}, text).alias("row"))
    """
    if not isinstance(value, Column):
        raise TypeError(f"value must be a Column, not {type(value).__name__}")
    if not isinstance(reader_text, str) or not reader_text:
        raise ValueError("reader_text must be an Avro schema")
    for schema_id in writers:
        _check_id(schema_id)
    schema_id = wire.schema_id(value)
    branches = [
        (schema_id == F.lit(number), from_avro(wire.body(value), text, {"mode": "FAILFAST", "avroSchema": reader_text}))
        for number, text in sorted(writers.items())
    ]
    if not branches:
        raise ValueError("writers must hold the schema of at least one id")
    first, *others = branches
    return reduce(lambda case, branch: case.when(*branch), others, F.when(*first))


def _check_id(schema_id: object) -> None:
    if isinstance(schema_id, bool) or not isinstance(schema_id, int) or not 0 <= schema_id < 2**32:
        raise ValueError(f"a schema id is an int of 4 bytes, not {schema_id!r}")
