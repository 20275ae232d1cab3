"""Data-quality expectations: a dataset's own rules for the records its contract can read.

The contract says what a record must be to be read at all (its fields' kinds, which are required). An
expectation says what a team requires of a record it can read: an amount not negative, an event type
from a known set, an id of a given shape, an event time not far ahead of the record's Kafka timestamp,
or any Spark SQL condition over the silver columns. Each has a name and an action:

* ``Action.QUARANTINE``: a record that fails it goes to quarantine with the reason
  ``expectation <name> not met``; when it fails several, the first in declaration order names it;
* ``Action.WARN``: the record stays in silver; the records failing it are counted, batch by batch;
* ``Action.FAIL``: a batch holding a record that fails it is not committed; the stream stops, naming
  the expectation, how many records failed it and the first of them.

Expectations judge a record after the contract's checks, and before the business key's deduplication
(a record quarantined by one does not hold its key). They read the record's own columns only, so that
a replay of a batch judges each record as the first attempt did: a condition cannot read the clock or
draw random numbers (``not_after`` compares the event time with the record's Kafka timestamp, not
with the time of the batch). A condition that is NULL, as a comparison with an optional field that is
absent is, is met, as a SQL CHECK constraint is: ``not_null`` is the expectation that a field is there.

Example::

    EXPECTATIONS = (
        in_range("amount_not_negative", "amount", minimum=0),
        one_of("known_event_type", "event_type", ("click", "view", "purchase"), Action.WARN),
        matches("user_id_shape", "user_id", r"^u[0-9]+$"),
        not_after("event_time_not_ahead", "event_time", "1 day"),
        condition("refund_names_an_order", "event_type <> 'refund' OR order_id IS NOT NULL", Action.FAIL),
    )
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructType

from .config import ConfigError, duration_seconds
from .contract import NUMERIC_KINDS, Contract, Kind

NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")
REASON = "expectation {name} not met"
# The silver column a record's Kafka timestamp is in (``not_after`` compares with it).
KAFKA_TIMESTAMP = "kafka_timestamp"
INGEST_TIME = "ingest_time"
# Functions whose answer depends on when or where a batch runs, not on the record: a replay would judge
# the same record differently.
UNREPEATABLE = (
    "current_date",
    "current_timestamp",
    "curdate",
    "now",
    "localtimestamp",
    "current_timezone",
    "rand",
    "randn",
    "random",
    "uniform",
    "randstr",
    "uuid",
    "shuffle",
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "input_file_block_start",
    "input_file_block_length",
    "unix_timestamp",
    "try_reflect",
    "reflect",
    "java_method",
)
_UNREPEATABLE_CALL = re.compile(r"(?i)(?<![\w.`])(" + "|".join(UNREPEATABLE) + r")\s*\(")


class Action(StrEnum):
    """What a record failing an expectation does to its batch."""

    QUARANTINE = "quarantine"  # the record goes to quarantine, naming the expectation
    WARN = "warn"  # the record stays in silver, counted
    FAIL = "fail"  # the batch is not committed: the stream stops


class Rule(StrEnum):
    """Which function built an expectation: what its ``arguments`` are."""

    NOT_NULL = "not_null"  # field
    IN_RANGE = "in_range"  # field, minimum, maximum (Decimal or None)
    ONE_OF = "one_of"  # field, values
    MATCHES = "matches"  # field, pattern
    NOT_AFTER = "not_after"  # field, ahead (a duration)
    CONDITION = "condition"  # sql


@dataclass(frozen=True)
class Expectation:
    """A condition a record of the dataset meets, in Spark SQL over silver's columns, and what failing it does.

    ``fields`` are the contract fields a built-in kind reads (checked against the contract when the
    dataset is declared); ``checks`` are SQL expressions evaluated once at a stream's start, that fail
    when the expectation cannot run (a pattern Java cannot compile). ``rule`` and ``arguments`` say what
    was declared, in the declaration's own terms, for a reader other than Spark (a test's oracle, a
    producer that breaks the rule on purpose). Build one with the functions below.
    """

    name: str
    sql: str
    action: Action = Action.QUARANTINE
    fields: tuple[str, ...] = ()
    # The kinds each of ``fields`` may have; empty for any.
    kinds: frozenset[Kind] = frozenset()
    checks: tuple[str, ...] = ()
    rule: Rule = Rule.CONDITION
    # (name, value) pairs: the arguments the function that built it took, other than name and action.
    arguments: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.fullmatch(self.name):
            raise ValueError(f"expectation {self.name!r}: a name is a lower-case letter followed by [a-z0-9_]")
        if not isinstance(self.action, Action):
            raise ValueError(f"expectation {self.name}: action must be an Action ({', '.join(Action)})")
        if not isinstance(self.sql, str) or not self.sql.strip():
            raise ValueError(f"expectation {self.name}: its condition must be a Spark SQL expression")
        code = _without_literals(self.sql)
        unrepeatable = _UNREPEATABLE_CALL.search(code)
        if unrepeatable:
            raise ValueError(
                f"expectation {self.name}: {unrepeatable.group(1)}() answers differently when a batch is replayed: "
                f"judge a record by its own columns ({KAFKA_TIMESTAMP} for the time Kafka took it)"
            )
        if re.search(rf"(?i)(?<![\w.]){INGEST_TIME}(?!\w)", code):
            raise ValueError(
                f"expectation {self.name}: {INGEST_TIME} is when a batch read the record, which a replay may do "
                f"later: judge a record by its own columns ({KAFKA_TIMESTAMP} for the time Kafka took it)"
            )
        for attribute in ("fields", "checks"):
            if isinstance(getattr(self, attribute), str):
                raise ValueError(f"expectation {self.name}: {attribute} must be a sequence, not a string")
            object.__setattr__(self, attribute, tuple(getattr(self, attribute)))
        object.__setattr__(self, "kinds", frozenset(self.kinds))
        if not isinstance(self.rule, Rule):
            raise ValueError(f"expectation {self.name}: rule must be a Rule ({', '.join(Rule)})")
        object.__setattr__(self, "arguments", tuple(tuple(pair) for pair in self.arguments))

    def argument(self, name: str):
        """The value the function that built this expectation took as ``name`` (KeyError when it took none).

        Example::

            in_range("total_positive", "total", minimum="0.01").argument("minimum")  # Decimal('0.01')
        """
        return dict(self.arguments)[name]

    @property
    def reason(self) -> str:
        """The quarantine reason of a record failing this expectation."""
        return REASON.format(name=self.name)

    @property
    def met(self) -> Column:
        """True when a record meets the condition or the condition is NULL."""
        return F.coalesce(F.expr(self.sql), F.lit(True))

    def check_against(self, contract: Contract) -> None:
        """ValueError naming the first field this expectation reads that ``contract`` does not have as it needs it."""
        for name in self.fields:
            if name not in contract.names:
                raise ValueError(f"expectation {self.name}: {name} is not a field of the contract")
            kind = contract.field(name).kind
            if self.kinds and kind not in self.kinds:
                wanted = " or ".join(sorted(each.name for each in self.kinds))
                raise ValueError(f"expectation {self.name}: {name} is {kind.name}, and this expectation needs {wanted}")


def not_null(name: str, field: str, action: Action = Action.QUARANTINE) -> Expectation:
    """``field`` (an optional one: a required field is never null in silver) is present.

    Example::

        not_null("coupon_given", "coupon", Action.WARN)
    """
    return Expectation(
        name, f"{_column(field)} IS NOT NULL", action, (field,), rule=Rule.NOT_NULL, arguments=(("field", field),)
    )


def in_range(
    name: str,
    field: str,
    minimum: int | Decimal | str | None = None,
    maximum: int | Decimal | str | None = None,
    action: Action = Action.QUARANTINE,
) -> Expectation:
    """A number ``field`` is at least ``minimum`` and at most ``maximum`` (either may be left out).

    Example::

        in_range("amount_not_negative", "amount", minimum=0)
    """
    if minimum is None and maximum is None:
        raise ValueError(f"expectation {name}: a range needs a minimum, a maximum or both")
    bounds = [_number(name, bound) for bound in (minimum, maximum)]
    if None not in bounds and bounds[0] > bounds[1]:
        raise ValueError(f"expectation {name}: minimum {minimum} is above maximum {maximum}")
    column = _column(field)
    limits = zip((">=", "<="), bounds, strict=True)
    parts = [f"{column} {operator} {format(bound, 'f')}" for operator, bound in limits if bound is not None]
    arguments = (("field", field), ("minimum", bounds[0]), ("maximum", bounds[1]))
    return Expectation(
        name, " AND ".join(parts), action, (field,), NUMERIC_KINDS, rule=Rule.IN_RANGE, arguments=arguments
    )


def one_of(name: str, field: str, values, action: Action = Action.QUARANTINE) -> Expectation:
    """``field`` holds one of ``values`` (strings for a STRING field, numbers for a number, True or False).

    Example::

        one_of("known_event_type", "event_type", ("click", "view", "purchase"), Action.WARN)
    """
    if isinstance(values, str) or not values:
        raise ValueError(f"expectation {name}: one_of needs a sequence of values, not {values!r}")
    values = tuple(values)
    kinds_of = {str: {Kind.STRING}, bool: {Kind.BOOLEAN}}
    kinds = {frozenset(kinds_of.get(type(value), NUMERIC_KINDS)) for value in values}
    if len(kinds) > 1:
        raise ValueError(f"expectation {name}: the values of one_of must all be strings, all numbers or all booleans")
    literals = ", ".join(_literal(name, value) for value in values)
    arguments = (("field", field), ("values", values))
    sql = f"{_column(field)} IN ({literals})"
    return Expectation(name, sql, action, (field,), kinds.pop(), rule=Rule.ONE_OF, arguments=arguments)


def matches(name: str, field: str, pattern: str, action: Action = Action.QUARANTINE) -> Expectation:
    """A STRING ``field`` matches ``pattern``, a Java regular expression (Spark's ``RLIKE``), anywhere in
    the value unless anchored with ``^`` and ``$``.

    Example::

        matches("user_id_shape", "user_id", r"^u[0-9]+$")
    """
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"expectation {name}: matches needs a regular expression")
    literal = _literal(name, pattern)
    return Expectation(
        name,
        f"{_column(field)} RLIKE {literal}",
        action,
        (field,),
        frozenset({Kind.STRING}),
        (f"regexp_like('', {literal})",),
        Rule.MATCHES,
        (("field", field), ("pattern", pattern)),
    )


def not_after(name: str, field: str, ahead: str, action: Action = Action.QUARANTINE) -> Expectation:
    """A TIMESTAMP ``field`` is at most ``ahead`` (a duration such as '1 day') after the record's Kafka
    timestamp: an event time from a producer's clock set in the future.

    Example::

        not_after("event_time_not_ahead", "event_time", "1 day")
    """
    seconds = duration_seconds(ahead, f"expectation {name}: ahead")
    # In microseconds since the epoch: a difference of two timestamps fits a BIGINT at every instant
    # Spark holds, where a timestamp plus an interval overflows at the calendar's end.
    sql = f"unix_micros({_column(field)}) - unix_micros({KAFKA_TIMESTAMP}) <= {seconds * 1_000_000}"
    arguments = (("field", field), ("ahead", ahead))
    return Expectation(
        name, sql, action, (field,), frozenset({Kind.TIMESTAMP}), rule=Rule.NOT_AFTER, arguments=arguments
    )


def condition(name: str, sql: str, action: Action = Action.QUARANTINE) -> Expectation:
    """Any Spark SQL boolean expression over silver's columns (the contract's fields and the Kafka
    columns ``topic``, ``partition``, ``offset``, ``kafka_timestamp``; not ``ingest_time``): cross-field rules.

    Example::

        condition("refund_names_an_order", "event_type <> 'refund' OR order_id IS NOT NULL", Action.FAIL)
    """
    return Expectation(name, sql, action, rule=Rule.CONDITION, arguments=(("sql", sql),))


def check_expectations(
    spark: SparkSession, dataset_name: str, expectations: tuple[Expectation, ...], silver: StructType
) -> None:
    """ConfigError naming the first expectation Spark cannot run on ``silver``'s columns: a condition that
    does not parse, names a column silver does not have, or is not a boolean; a check that fails. Run at a
    stream's start, on no rows: nothing is read.

    Example::

        check_expectations(spark, "orders", ORDERS_DATASET.expectations, silver_schema(ORDERS))
    """
    if not isinstance(silver, StructType):
        raise TypeError(f"silver must be a StructType, not {type(silver).__name__}")
    if not expectations:
        return  # nothing to ask Spark: a start without expectations costs nothing here
    empty = spark.createDataFrame([], silver)
    for expectation in expectations:
        where = f"dataset {dataset_name}: expectation {expectation.name}"
        try:
            met = empty.select(F.expr(expectation.sql).alias("met")).schema["met"].dataType
            for check in expectation.checks:
                spark.range(1).select(F.expr(check)).collect()
        except PySparkException as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"{where}: Spark cannot run {expectation.sql!r}: {first}") from None
        if not isinstance(met, BooleanType):
            raise ConfigError(f"{where}: {expectation.sql!r} is {met.simpleString()}, not a boolean")


def judged(parsed: DataFrame, expectations: tuple[Expectation, ...]) -> DataFrame:
    """``parsed`` (a batch as ``silver.parse_records`` reads it: typed fields, ``timestamp``, ``reason``) with
    the reason of the first QUARANTINE expectation each record without a reason fails. The columns stay
    as they are.

    Example::

        judged(parse_records(batch, ORDERS_DATASET), ORDERS_DATASET.expectations)
    """
    quarantining = [each for each in expectations if each.action is Action.QUARANTINE]
    if not quarantining:
        return parsed
    first_failed = F.lit(None).cast("string")
    for expectation in reversed(quarantining):
        first_failed = F.when(~expectation.met, F.lit(expectation.reason)).otherwise(first_failed)
    reason = F.when(F.col("reason").isNull(), first_failed).otherwise(F.col("reason"))
    return with_kafka_time(parsed).withColumn("reason", reason).select(*parsed.columns)


def _column(field: str) -> str:
    if not isinstance(field, str) or not field:
        raise ValueError(f"field must name a contract field, not {field!r}")
    return "`" + field.replace("`", "``") + "`"


def _number(name: str, bound) -> Decimal | None:
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, int | Decimal | str):
        raise ValueError(f"expectation {name}: a bound is an int, a Decimal or a numeric string, not {bound!r}")
    try:
        number = Decimal(bound)
    except ArithmeticError:
        raise ValueError(f"expectation {name}: {bound!r} is not a number") from None
    if not number.is_finite():
        raise ValueError(f"expectation {name}: a bound must be finite, not {bound!r}")
    return number


def _literal(name: str, value) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, int | Decimal):
        return format(_number(name, value), "f")
    if isinstance(value, datetime):
        raise ValueError(f"expectation {name}: compare timestamps with not_after or a condition")
    raise ValueError(f"expectation {name}: {value!r} is not a string, an int, a Decimal or a boolean")


def _without_literals(sql: str) -> str:
    """``sql`` with its string literals and quoted names blanked: a function's name inside them calls nothing."""
    return re.sub(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"|`(?:``|[^`])*`", "''", sql)


class ExpectationFailed(RuntimeError):
    """A batch holds a record that fails an expectation whose action is FAIL, or quarantines more of its
    records than its dataset's ``QuarantineLimit`` allows: nothing of it is committed."""


@dataclass(frozen=True)
class QuarantineLimit:
    """A guard against a producer gone wrong: a batch of at least ``min_records`` records of which more than
    ``share`` would go to quarantine (for any reason) fails, committing nothing. Smaller batches are not
    judged by it, so that one bad record in a batch of a few does not stop the stream.

    Example::

        QuarantineLimit(share=0.05)  # a batch of 1,000 records or more with over 5 % quarantined fails
    """

    share: float
    min_records: int = 1000

    def __post_init__(self) -> None:
        if isinstance(self.share, bool) or not isinstance(self.share, int | float) or not 0 <= self.share < 1:
            raise ValueError(f"quarantine limit: share must be a number from 0 to below 1, not {self.share!r}")
        if isinstance(self.min_records, bool) or not isinstance(self.min_records, int) or self.min_records < 1:
            raise ValueError(f"quarantine limit: min_records must be a positive int, not {self.min_records!r}")

    def check(self, stream: str, batch_id: int, records: int, quarantined: int, reasons: dict[str, int]) -> None:
        """ExpectationFailed when a batch of ``records`` quarantines ``quarantined`` over the limit.

        Example::

            QuarantineLimit(0.05).check("orders_silver", 7, 2000, 1500, {"value is not valid JSON": 1500})
        """
        if records < self.min_records or quarantined <= self.share * records:
            return
        raise ExpectationFailed(
            f"[{stream}] batch {batch_id}: {quarantined} of {records} records would go to quarantine "
            f"({format(quarantined / records, '.1%')}), over the dataset's quarantine limit of "
            f"{format(self.share, '.1%')}: nothing of the batch is committed. Reasons: {reasons}. "
            f"Those records are in Kafka already: once the producer "
            f"is fixed for the records to come, raise the limit (or take it out) in the dataset's module and "
            f"start the stream again, which writes the batch once, its records in quarantine"
        )


def counted(expectations: tuple[Expectation, ...]) -> tuple[Expectation, ...]:
    """The expectations a batch counts the failures of, in order: those that WARN or FAIL (a quarantining
    one's failures are counted as quarantine reasons)."""
    return tuple(each for each in expectations if each.action is not Action.QUARANTINE)


def failure_aggregates(expectations: tuple[Expectation, ...]) -> list[Column]:
    """Aggregates of a parsed batch, grouped by Kafka partition (``with_kafka_time`` of it): for each of
    ``counted(expectations)``, the records without a reason that fail it (``failed_<i>``) and, for one
    that FAILs, the first of their offsets (``first_<i>``).

    Example::

        kafka_key_ranges(with_kafka_time(parsed), *failure_aggregates(DATASET.expectations))
    """
    aggregates = []
    for index, expectation in enumerate(counted(expectations)):
        failing = F.col("reason").isNull() & ~expectation.met
        aggregates.append(F.count(F.when(failing, F.lit(1))).alias(f"failed_{index}"))
        if expectation.action is Action.FAIL:
            aggregates.append(F.min(F.when(failing, F.col("offset"))).alias(f"first_{index}"))
    return aggregates


def with_kafka_time(parsed: DataFrame) -> DataFrame:
    """A parsed batch with the column its Kafka timestamp has in silver, which expectations may read."""
    return parsed.withColumn(KAFKA_TIMESTAMP, F.col("timestamp"))


def failures(ranges: list, expectations: tuple[Expectation, ...]) -> dict[str, int]:
    """The records of a batch that failed each expectation that WARNs or FAILs, by name, from the rows of
    ``failure_aggregates`` (one per Kafka partition, with ``topic`` and ``partition``).

    Example::

        failures(ranges, DATASET.expectations)  # {"known_shop": 2}
    """
    found = {}
    for index, expectation in enumerate(counted(expectations)):
        found[expectation.name] = sum(row[f"failed_{index}"] for row in ranges)
    return found


def refuse_failed(where: str, ranges: list, expectations: tuple[Expectation, ...]) -> None:
    """ExpectationFailed naming the first expectation that FAILs which a record of ``where`` (a batch, a
    rebuild) failed: how many records failed it, the first of them, and the way out; ``ranges``: rows of
    ``failure_aggregates``.

    Example::

        refuse_failed("[orders_silver] batch 7", ranges, DATASET.expectations)
    """
    found = failures(ranges, expectations)
    for index, expectation in enumerate(counted(expectations)):
        count = found[expectation.name]
        if expectation.action is not Action.FAIL or not count:
            continue
        topic, partition, offset = min(
            (row.topic, row.partition, row[f"first_{index}"]) for row in ranges if row[f"first_{index}"] is not None
        )
        raise ExpectationFailed(
            f"{where}: expectation {expectation.name} (fail) is not met by {count} record(s), the first "
            f"{topic}/{partition}/{offset}; nothing of it is committed. Those records are in Kafka already: change "
            f"the expectation in the dataset's module (its condition, or its action to quarantine or warn) and run "
            f"again, which judges them again and writes them once; fix the producer for the records to come"
        )
