"""The event contract: what a valid event is, declared once.

The contract lists the fields of an event (JSON object in the Kafka value), each
with a kind and whether it is required; it names the event-time field, the
fields gold groups by (dimensions) and the fields gold sums (measures). Every
layer reads it:

* silver parses each declared field out of the JSON and types it; the silver
  table has one column per field, in declaration order, NOT NULL when required;
* a record failing a field's rules goes to quarantine with the reason of the
  first rule it fails (see ``Rule`` for the order);
* gold counts events (``event_count``) and sums each measure (``<measure>_sum``)
  per tumbling event-time window and dimension values; the gold MERGE and the
  audit's recomputation key on ``window_start, window_end, *dimensions``.

A dataset (``dataset.py``) declares its contract; ``datasets/events.py`` holds the project's first.

Example::

    from .contract import Contract, Field, Kind

    ORDERS = Contract(
        fields=(
            Field("order_id", Kind.STRING),
            Field("ordered_at", Kind.TIMESTAMP),
            Field("shop", Kind.STRING),
            Field("quantity", Kind.INTEGER),
            Field("total", Kind.DECIMAL, precision=12, scale=2),
            Field("coupon", Kind.STRING, required=False),
            Field("gift", Kind.BOOLEAN, required=False),
        ),
        event_time="ordered_at",
        dimensions=("shop",),
        measures=("quantity", "total"),
    )
    # silver: order_id, ordered_at, shop, quantity, total, coupon, gift + Kafka columns
    # gold:   window_start, window_end, shop, event_count, quantity_sum, total_sum
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, DataType, DecimalType, IntegerType, LongType, StringType, TimestampType


class Kind(Enum):
    """What a field holds in JSON, and the type it gets in silver.

    The order of the members matters: within one rule, fields are checked kind by
    kind in this order (then in declaration order), see ``Contract.checks``.
    """

    STRING = "string"  # JSON string, not empty, without U+0000 -> STRING
    TIMESTAMP = "timestamp"  # JSON string, ISO-8601 with an explicit offset -> TIMESTAMP
    DECIMAL = "decimal"  # JSON number that fits DECIMAL(precision, scale) without rounding
    INTEGER = "integer"  # JSON number without a fraction (3 or 3.0, not 1e3), within 32 bits -> INT
    LONG = "long"  # the same within 64 bits -> BIGINT
    BOOLEAN = "boolean"  # JSON true or false -> BOOLEAN


NUMERIC_KINDS = frozenset({Kind.DECIMAL, Kind.INTEGER, Kind.LONG})


class Rule(Enum):
    """The checks a field can fail, in order of precedence: a record is quarantined with
    the reason of the first check it fails. ``{type}`` is the field's silver type; the
    reasons of the ``... got`` rules end with the JSON type that was found instead.
    """

    MISSING = "missing required field {name}"
    NOT_A_STRING = "field {name} must be a string, got "
    EMPTY = "field {name} must not be empty"
    NOT_A_TIMESTAMP = "field {name} is not an ISO-8601 timestamp with offset"
    NOT_A_NUMBER = "field {name} must be a number, got "
    NOT_AN_INTEGER = "field {name} must be an integer, got "
    DOES_NOT_FIT = "field {name} does not fit {type} exactly"
    NOT_A_BOOLEAN = "field {name} must be a boolean, got "
    # Last, so that adding them moved no other reason's precedence.
    OUT_OF_RANGE = "field {name} is outside the supported range [{earliest}, {end})"
    # PostgreSQL's text cannot hold U+0000, nor can many a reader downstream: a dimension holding it
    # would stop the PostgreSQL egress on every replay.
    CONTAINS_NUL = "field {name} contains the character U+0000"

    @property
    def appends_json_type(self) -> bool:
        return self.value.endswith(JSON_TYPE_FOLLOWS)

    def message(self, field: Field) -> str:
        """The reason, without the JSON type the ``... got`` rules append."""
        earliest, end = (_iso(instant) for instant in EVENT_TIME_RANGE)
        return self.value.format(name=field.name, type=field.type_label, earliest=earliest, end=end)


JSON_TYPE_FOLLOWS = ", got "
JSON_TYPE_PLACEHOLDER = "<type>"
# A reason about a record's writer schema (formats/wire.py) ends with the schema id, and perhaps why.
SCHEMA_ID_FOLLOWS = ", id "
SCHEMA_ID_PLACEHOLDER = "<id>"
# A valid record whose business key a record silver keeps has (a dataset's dedup_key, dedup.py):
# the reason names that record, ``<topic>/<partition>/<offset>``; its label does not.
DUPLICATE_OF = "duplicate of "
DUPLICATE_LABEL = DUPLICATE_OF + "<record>"

# The instants a TIMESTAMP field may hold, [earliest, end): the whole years of the Gregorian
# calendar that Python's datetime holds. Before 1583 some of the JVM's paths still go through
# java.sql.Timestamp and its Julian calendar: Delta's change feed reads a window of 1582-10-10 as
# 1582-10-15, so an egress would publish a window gold does not hold. Window bounds reach the
# driver as datetimes (years 1 to 9999), and a year of margin at the end keeps every window of up
# to 7 days inside them. Go's zero time and .NET's MinValue (0001-01-01T00:00:00Z) and MaxValue
# fall outside: the defaults of an unset time, quarantined rather than counted.
EVENT_TIME_RANGE = (datetime(1583, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))


def _iso(instant: datetime) -> str:
    return instant.isoformat().replace("+00:00", "Z")


def quarantine_label(reason: str) -> str:
    """``reason`` with the JSON type a ``... got`` rule appends replaced by ``<type>``, the record a
    duplicate is of by ``<record>`` and the schema id a wire-format reason names (and what follows) by
    ``<id>``: one of the dataset's reasons or ``DUPLICATE_LABEL``,
    a bounded set, where the reasons themselves are not (a JSON type names the keys of the object the
    producer sent).

    Example::

        quarantine_label("field amount must be a number, got OBJECT<a: BIGINT>")  # "... got <type>"
    """
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, not {type(reason).__name__}")
    if reason.startswith(DUPLICATE_OF):
        return DUPLICATE_LABEL
    head, found, _ = reason.partition(JSON_TYPE_FOLLOWS)
    if found:
        return head + found + JSON_TYPE_PLACEHOLDER
    head, found, _ = reason.partition(SCHEMA_ID_FOLLOWS)
    return head + found + SCHEMA_ID_PLACEHOLDER if found else reason


def quarantine_label_column(reason: Column) -> Column:
    """``quarantine_label`` of a column of reasons, in Spark: the same label for the same reason.

    Example::

        parsed.groupBy(quarantine_label_column(F.col("reason"))).count()
    """
    if not isinstance(reason, Column):
        raise TypeError(f"reason must be a Column, not {type(reason).__name__}")
    head = F.substring_index(reason, JSON_TYPE_FOLLOWS, 1)
    labelled = F.concat(head, F.lit(JSON_TYPE_FOLLOWS + JSON_TYPE_PLACEHOLDER))
    schema = F.concat(F.substring_index(reason, SCHEMA_ID_FOLLOWS, 1), F.lit(SCHEMA_ID_FOLLOWS + SCHEMA_ID_PLACEHOLDER))
    return (
        F.when(reason.startswith(DUPLICATE_OF), F.lit(DUPLICATE_LABEL))
        .when(F.instr(reason, JSON_TYPE_FOLLOWS) > 0, labelled)
        .when(F.instr(reason, SCHEMA_ID_FOLLOWS) > 0, schema)
        .otherwise(reason)
    )


# The record-level reasons, checked before any field.
TOMBSTONE = "null value (tombstone)"
NOT_UTF8 = "value is not valid UTF-8"
NOT_JSON = "value is not valid JSON"
NOT_AN_OBJECT = "value is not a JSON object"
RECORD_REASONS = (TOMBSTONE, NOT_UTF8, NOT_JSON, NOT_AN_OBJECT)

# Rules every present value of a kind is checked against (MISSING applies to required fields).
KIND_RULES: dict[Kind, tuple[Rule, ...]] = {
    Kind.STRING: (Rule.NOT_A_STRING, Rule.EMPTY, Rule.CONTAINS_NUL),
    Kind.TIMESTAMP: (Rule.NOT_A_STRING, Rule.NOT_A_TIMESTAMP, Rule.OUT_OF_RANGE),
    Kind.DECIMAL: (Rule.NOT_A_NUMBER, Rule.DOES_NOT_FIT),
    Kind.INTEGER: (Rule.NOT_AN_INTEGER, Rule.DOES_NOT_FIT),
    Kind.LONG: (Rule.NOT_AN_INTEGER, Rule.DOES_NOT_FIT),
    Kind.BOOLEAN: (Rule.NOT_A_BOOLEAN,),
}

# Gold's own columns, and every column bronze, silver and quarantine add around the fields.
EVENT_COUNT = "event_count"
WINDOW_START, WINDOW_END = "window_start", "window_end"
RESERVED_NAMES = frozenset(
    {
        "key",
        "value",
        "headers",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestamp_type",
        "ingest_time",
        "kafka_timestamp",
        "reason",
        WINDOW_START,
        WINDOW_END,
        EVENT_COUNT,
    }
)
# Also a plain JSON key and column name: no quoting needed anywhere, and a leading
# underscore stays free for the parser's working columns.
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
MAX_DECIMAL_PRECISION = 38


@dataclass(frozen=True)
class Field:
    """One JSON field of the event; ``precision`` and ``scale`` only for DECIMAL."""

    name: str
    kind: Kind
    required: bool = True
    precision: int | None = None
    scale: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"field {self.name!r}: a name is a letter followed by letters, digits or underscores")
        if self.name.lower() in RESERVED_NAMES:
            raise ValueError(
                f"field {self.name}: the name is taken by a column the pipeline adds "
                f"({', '.join(sorted(RESERVED_NAMES))})"
            )
        if not isinstance(self.kind, Kind):
            raise ValueError(f"field {self.name}: kind must be a Kind ({', '.join(k.name for k in Kind)})")
        if not isinstance(self.required, bool):
            raise ValueError(f"field {self.name}: required must be True or False")
        if self.kind is Kind.DECIMAL:
            if not isinstance(self.precision, int) or not 1 <= self.precision <= MAX_DECIMAL_PRECISION:
                raise ValueError(
                    f"field {self.name}: DECIMAL needs a precision from 1 to {MAX_DECIMAL_PRECISION}, "
                    f"got {self.precision!r}"
                )
            if not isinstance(self.scale, int) or not 0 <= self.scale <= self.precision:
                raise ValueError(
                    f"field {self.name}: DECIMAL needs a scale from 0 to its precision {self.precision}, "
                    f"got {self.scale!r}"
                )
        elif self.precision is not None or self.scale is not None:
            raise ValueError(f"field {self.name}: precision and scale are for DECIMAL fields, not {self.kind.name}")

    @property
    def spark_type(self) -> DataType:
        """The field's type in silver."""
        if self.kind is Kind.DECIMAL:
            return DecimalType(self.precision, self.scale)
        return {
            Kind.STRING: StringType(),
            Kind.TIMESTAMP: TimestampType(),
            Kind.INTEGER: IntegerType(),
            Kind.LONG: LongType(),
            Kind.BOOLEAN: BooleanType(),
        }[self.kind]

    @property
    def type_label(self) -> str:
        """The silver type as SQL writes it, e.g. DECIMAL(18,2)."""
        return self.spark_type.simpleString().upper()

    @property
    def sum_type(self) -> DataType:
        """The type of the field's sum in gold: what Spark's sum() returns for it."""
        if self.kind is Kind.DECIMAL:
            # Ten more integer digits: exact for any realistic total.
            return DecimalType(min(MAX_DECIMAL_PRECISION, self.precision + 10), self.scale)
        if self.kind in (Kind.INTEGER, Kind.LONG):
            return LongType()
        raise ValueError(f"field {self.name}: a {self.kind.name} field has no sum")

    @property
    def rules(self) -> tuple[Rule, ...]:
        return ((Rule.MISSING,) if self.required else ()) + KIND_RULES[self.kind]


@dataclass(frozen=True)
class Contract:
    """The fields of an event and how gold aggregates them; checked when it is built."""

    fields: tuple[Field, ...]
    event_time: str
    dimensions: tuple[str, ...] = ()
    measures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Lists are accepted and frozen, so a contract is hashable and cannot change.
        for name in ("fields", "dimensions", "measures"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ValueError(f"contract: {name} must be a sequence, not the string {value!r}")
            object.__setattr__(self, name, tuple(value))
        self._check()

    def _check(self) -> None:
        if not self.fields:
            raise ValueError("contract: declare at least one field")
        seen: dict[str, str] = {}
        for field in self.fields:
            if not isinstance(field, Field):
                raise ValueError(f"contract: {field!r} is not a Field")
            # Spark and Delta resolve column names case-insensitively.
            if field.name.lower() in seen:
                raise ValueError(f"field {field.name}: declared twice (also as {seen[field.name.lower()]})")
            seen[field.name.lower()] = field.name
        time_field = self._declared(self.event_time, "event time")
        if time_field.kind is not Kind.TIMESTAMP:
            raise ValueError(f"field {time_field.name}: the event time must be a TIMESTAMP, not {time_field.kind.name}")
        if not time_field.required:
            raise ValueError(f"field {time_field.name}: the event time must be required: gold windows need it")
        for role, names in (("dimension", self.dimensions), ("measure", self.measures)):
            for position, name in enumerate(names):
                if name in names[:position]:
                    raise ValueError(f"field {name}: listed twice as a {role}")
        for name in self.dimensions:
            self._declared(name, "dimension")
            if name == self.event_time:
                raise ValueError(f"field {name}: the event time is gold's window already, not a dimension")
        for name in self.measures:
            field = self._declared(name, "measure")
            if field.kind not in NUMERIC_KINDS:
                raise ValueError(
                    f"field {name}: a measure is summed, so it must be DECIMAL, INTEGER or LONG, not {field.kind.name}"
                )
            if not field.required:
                raise ValueError(f"field {name}: a measure must be required: a missing value has no sum")
            if name in self.dimensions:
                raise ValueError(f"field {name}: a field is a dimension or a measure, not both")
            column = self.measure_column(name)
            for dimension in self.dimensions:
                if dimension.lower() == column.lower():
                    raise ValueError(f"field {name}: its gold column {column} is the dimension {dimension}")

    def _declared(self, name: str, role: str) -> Field:
        for field in self.fields:
            if field.name == name:
                return field
        raise ValueError(f"field {name}: named as the {role} but not declared (fields: {', '.join(self.names)})")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    def field(self, name: str) -> Field:
        for field in self.fields:
            if field.name == name:
                return field
        raise KeyError(name)

    @staticmethod
    def measure_column(measure: str) -> str:
        return f"{measure}_sum"

    @property
    def gold_key(self) -> tuple[str, ...]:
        """The columns identifying one gold row."""
        return (WINDOW_START, WINDOW_END, *self.dimensions)

    @property
    def gold_values(self) -> tuple[str, ...]:
        """The columns gold adds up."""
        return (EVENT_COUNT, *(self.measure_column(m) for m in self.measures))

    def checks(self) -> list[tuple[Rule, Field]]:
        """Every (rule, field) check in order of precedence.

        Rule by rule in ``Rule``'s order; within a rule, by kind in ``Kind``'s order,
        then in declaration order. (For the default contract this is the order
        the pipeline has always checked in.)
        """
        kinds = list(Kind)
        rules = list(Rule)
        ranked = [
            ((rules.index(rule), kinds.index(field.kind), position), rule, field)
            for position, field in enumerate(self.fields)
            for rule in field.rules
        ]
        return [(rule, field) for _, rule, field in sorted(ranked, key=lambda item: item[0])]

    def quarantine_reasons(self) -> list[str]:
        """Every reason a record can be quarantined with, in order of precedence."""
        return [
            *RECORD_REASONS,
            *(
                rule.message(field) + (JSON_TYPE_PLACEHOLDER if rule.appends_json_type else "")
                for rule, field in self.checks()
            ),
        ]
