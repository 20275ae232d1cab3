"""The contract's rules on values a writer schema typed (Avro, Protobuf): the ones typing does not settle.

A schema types every field, so the contract's rules on JSON types cannot fail; these remain: a string
not empty and without U+0000, an event time within the supported range.

Example::

    parsed.where(failed(Rule.EMPTY, field))
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

from ..contract import EVENT_TIME_RANGE, Field, Rule
from ..instants import to_micros

RULES = (Rule.EMPTY, Rule.OUT_OF_RANGE, Rule.CONTAINS_NUL)


def failed(rule: Rule, field: Field) -> Column:
    """True when column ``field.name``, as its schema typed it, holds a value that fails ``rule`` (one of
    ``RULES``); null values pass (a required field's absence is the reader's to tell).

    Example::

        parsed.withColumn("bad_shop", failed(Rule.EMPTY, shop_field))
    """
    if not isinstance(field, Field):
        raise TypeError(f"field must be a contract Field, not {type(field).__name__}")
    value = F.col(field.name)
    match rule:
        case Rule.EMPTY:
            failing = F.length(F.trim(value)) == 0
        case Rule.CONTAINS_NUL:
            failing = F.instr(value, "\u0000") > 0
        case Rule.OUT_OF_RANGE:
            # Compared as microseconds: a TIMESTAMP literal before 1582 would be rebased (``instants``).
            earliest, end = (to_micros(instant) for instant in EVENT_TIME_RANGE)
            failing = ~F.unix_micros(value).between(earliest, end - 1)
        case _:
            raise ValueError(f"{rule} is not one of the rules on typed values {[each.name for each in RULES]}")
    return value.isNotNull() & failing
