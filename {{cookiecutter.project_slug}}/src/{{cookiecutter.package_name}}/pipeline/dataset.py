"""A dataset, declared once: its contract, its golds and the business key silver deduplicates on.

A project holds any number of datasets, one module each under ``datasets/``. Each dataset has
tables, streams, checkpoints and leases of its own, named after it:

    tables   bronze_<dataset>, silver_<dataset>, quarantine_<dataset>, gold_<dataset>_<gold>
             (and gold_<dataset>_<gold>_<column>_values behind each exact distinct count)
    streams  <dataset>_bronze, <dataset>_silver, <dataset>_gold_<gold>, <dataset>_fused

A gold is a table of tumbling event-time windows: per window and dimension values, the
aggregates it declares (``AggregateKind``). A dataset declared with ``Naming.SOLE`` keeps the
names a lakehouse of one dataset has always had: its tables are ``bronze_<dataset>``,
``silver_<dataset>``, ``quarantine_<dataset>`` and ``gold_<gold>``, its streams ``bronze``,
``silver``, ``gold`` (its first gold; ``gold_<gold>`` for any other) and ``fused``.

Example::

    ORDERS = Dataset(
        name="orders",
        contract=ORDERS_CONTRACT,  # contract.py's example
        golds=(
            Gold(
                "by_shop",
                dimensions=("shop",),
                aggregates=(
                    Aggregate(AggregateKind.COUNT),
                    Aggregate(AggregateKind.SUM, "total"),
                    Aggregate(AggregateKind.MAX, "total"),
                    Aggregate(AggregateKind.DISTINCT, "coupon"),
                ),
            ),
        ),
        dedup_key=("order_id",),
        dedup_horizon="7 days",
    )
    ORDERS.tables
    # ('bronze_orders', 'silver_orders', 'quarantine_orders', 'gold_orders_by_shop',
    #  'gold_orders_by_shop_coupon_distinct_values')
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from .config import duration_seconds
from .contract import EVENT_COUNT, NAME_PATTERN, NUMERIC_KINDS, RESERVED_NAMES, WINDOW_END, WINDOW_START, Contract, Kind
from .expectations import Expectation, QuarantineLimit
from .formats import Format

# Table and stream names are built from these: lower case, so that they are the same on every store.
DATASET_NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]*")


class AggregateKind(StrEnum):
    """What a gold computes per window and dimension values."""

    COUNT = "count"  # the window's events
    SUM = "sum"  # a required numeric field, added up
    MIN = "min"  # the least value of a number or a timestamp
    MAX = "max"  # the greatest
    DISTINCT = "distinct"  # the exact number of distinct values of a field
    APPROX_DISTINCT = "approx_distinct"  # the same, estimated from a HyperLogLog sketch


# The kinds of field a min or a max is taken of.
ORDERED_KINDS = NUMERIC_KINDS | {Kind.TIMESTAMP}


@dataclass(frozen=True)
class Aggregate:
    """One gold column: ``kind`` of ``field`` (none for COUNT), in ``column``.

    ``column`` defaults to ``event_count`` for COUNT and to ``<field>_<kind>`` otherwise
    (``amount_sum``, ``user_id_distinct``).
    """

    kind: AggregateKind
    field: str | None = None
    column: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, AggregateKind):
            raise ValueError(
                f"aggregate: kind must be an AggregateKind ({', '.join(AggregateKind)}), not {self.kind!r}"
            )
        if self.kind is AggregateKind.COUNT:
            if self.field is not None:
                raise ValueError(f"aggregate count: counts events, so it takes no field (got {self.field!r})")
        elif not isinstance(self.field, str) or not self.field:
            raise ValueError(f"aggregate {self.kind}: needs the field it is taken of")
        if not self.column:
            default = EVENT_COUNT if self.kind is AggregateKind.COUNT else f"{self.field}_{self.kind}"
            object.__setattr__(self, "column", default)
        if not NAME_PATTERN.fullmatch(self.column):
            raise ValueError(f"aggregate {self.kind}: column {self.column!r} is not a plain column name")

    @property
    def sketch_column(self) -> str | None:
        """Where gold keeps an approximate distinct count's HyperLogLog sketch, merged batch by batch; None
        for the other kinds."""
        return f"{self.column}_sketch" if self.kind is AggregateKind.APPROX_DISTINCT else None


@dataclass(frozen=True)
class Gold:
    """A gold table: per tumbling ``window`` of event time and ``dimensions``, its ``aggregates``.

    ``window`` is a duration such as '1 minute'; None takes the pipeline's ``gold_window``.
    """

    name: str
    aggregates: tuple[Aggregate, ...]
    dimensions: tuple[str, ...] = ()
    window: str | None = None

    def __post_init__(self) -> None:
        _check_name_and_freeze(self, "gold", ("aggregates", "dimensions"))
        if not self.aggregates:
            raise ValueError(f"gold {self.name}: declare at least one aggregate")
        for aggregate in self.aggregates:
            if not isinstance(aggregate, Aggregate):
                raise ValueError(f"gold {self.name}: {aggregate!r} is not an Aggregate")
        if self.window is not None:
            duration_seconds(self.window, f"gold {self.name}: window")
        seen: dict[str, str] = {}
        for column in (*self.columns, *self.sketches):
            # Spark and Delta resolve column names case-insensitively.
            if column.lower() in seen:
                raise ValueError(f"gold {self.name}: column {column} is declared twice")
            seen[column.lower()] = column
        for aggregate in self.aggregates:
            taken = aggregate.column.lower() in RESERVED_NAMES - {EVENT_COUNT}
            if taken or (aggregate.column == EVENT_COUNT and aggregate.kind is not AggregateKind.COUNT):
                raise ValueError(f"gold {self.name}: column {aggregate.column} is taken by a column the pipeline adds")

    @classmethod
    def of(cls, name: str, contract: Contract) -> Gold:
        """The gold ``contract`` declares: its event count and the sum of each of its measures, by its dimensions.

        Example::

            Gold.of("event_windows", EVENTS).columns
            # ('window_start', 'window_end', 'event_type', 'event_count', 'amount_sum')
        """
        if not isinstance(contract, Contract):
            raise ValueError(f"contract must be a Contract, not {type(contract).__name__}")
        sums = (Aggregate(AggregateKind.SUM, m, contract.measure_column(m)) for m in contract.measures)
        return cls(name, (Aggregate(AggregateKind.COUNT), *sums), contract.dimensions)

    @property
    def key(self) -> tuple[str, ...]:
        """The columns identifying one gold row."""
        return (WINDOW_START, WINDOW_END, *self.dimensions)

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(aggregate.column for aggregate in self.aggregates)

    @property
    def columns(self) -> tuple[str, ...]:
        return (*self.key, *self.values)

    @property
    def sketches(self) -> tuple[str, ...]:
        """The columns gold keeps to merge its approximate distinct counts, after ``columns``."""
        return tuple(aggregate.sketch_column for aggregate in self.aggregates if aggregate.sketch_column)

    def check_against(self, contract: Contract) -> None:
        """ValueError naming the first field this gold uses that ``contract`` does not have as it needs it."""
        for name in self.dimensions:
            if name not in contract.names:
                raise ValueError(f"gold {self.name}: dimension {name} is not a field of the contract")
            if name == contract.event_time:
                raise ValueError(f"gold {self.name}: the event time {name} is the window already, not a dimension")
        for aggregate in self.aggregates:
            if aggregate.field is None:
                continue
            if aggregate.field not in contract.names:
                raise ValueError(
                    f"gold {self.name}: {aggregate.kind} of {aggregate.field}, not a field of the contract"
                )
            field = contract.field(aggregate.field)
            if aggregate.kind is AggregateKind.SUM and (field.kind not in NUMERIC_KINDS or not field.required):
                raise ValueError(
                    f"gold {self.name}: sum of {field.name} needs a required DECIMAL, INTEGER or LONG field, "
                    f"not {'an optional ' if not field.required else ''}{field.kind.name}"
                )
            if aggregate.kind in (AggregateKind.MIN, AggregateKind.MAX) and field.kind not in ORDERED_KINDS:
                raise ValueError(
                    f"gold {self.name}: {aggregate.kind} of {field.name} needs a number or a timestamp, "
                    f"not {field.kind.name}"
                )


class Naming(StrEnum):
    """How a dataset's tables and streams are named (see the module's opening)."""

    DATASET = "dataset"  # after the dataset: any number of datasets side by side
    SOLE = "sole"  # the names of a lakehouse written when it held one dataset


@dataclass(frozen=True)
class Dataset:
    """A dataset: its ``contract``, its ``golds`` and, optionally, the business key silver dedups on.

    A record whose ``dedup_key`` fields equal those of a record silver holds (one no older than
    ``dedup_horizon`` in event time, or any when it is None) goes to quarantine as a duplicate.
    """

    name: str
    contract: Contract
    golds: tuple[Gold, ...]
    dedup_key: tuple[str, ...] = ()
    dedup_horizon: str | None = None
    naming: Naming = Naming.DATASET
    # How its Kafka values are written: JSON objects, or Avro or Protobuf in the Confluent wire format (formats/).
    format: Format = Format.JSON
    # What a team requires of a record the contract can read, in order, and how much of a batch may go to
    # quarantine before the batch fails (expectations.py).
    expectations: tuple[Expectation, ...] = ()
    quarantine_limit: QuarantineLimit | None = None

    def __post_init__(self) -> None:
        _check_name_and_freeze(self, "dataset", ("golds", "dedup_key", "expectations"))
        if not isinstance(self.contract, Contract):
            raise ValueError(f"dataset {self.name}: contract must be a Contract, not {type(self.contract).__name__}")
        if not self.golds:
            raise ValueError(f"dataset {self.name}: declare at least one gold")
        names = [gold.name for gold in self.golds if isinstance(gold, Gold)]
        for gold in self.golds:
            if not isinstance(gold, Gold):
                raise ValueError(f"dataset {self.name}: {gold!r} is not a Gold")
            if names.count(gold.name) > 1:
                raise ValueError(f"dataset {self.name}: gold {gold.name} is declared twice")
            gold.check_against(self.contract)
        for name in self.dedup_key:
            if name not in self.contract.names:
                raise ValueError(f"dataset {self.name}: dedup key {name} is not a field of the contract")
            if not self.contract.field(name).required:
                raise ValueError(f"dataset {self.name}: dedup key {name} must be required: a missing key matches none")
        if len(set(self.dedup_key)) != len(self.dedup_key):
            raise ValueError(f"dataset {self.name}: the dedup key names a field twice")
        if self.dedup_horizon is not None:
            if not self.dedup_key:
                raise ValueError(f"dataset {self.name}: a dedup horizon needs a dedup key")
            duration_seconds(self.dedup_horizon, f"dataset {self.name}: dedup_horizon")
        if not isinstance(self.naming, Naming):
            raise ValueError(f"dataset {self.name}: naming must be a Naming ({', '.join(Naming)})")
        if not isinstance(self.format, Format):
            raise ValueError(f"dataset {self.name}: format must be a Format ({', '.join(Format)})")
        seen: set[str] = set()
        for expectation in self.expectations:
            if not isinstance(expectation, Expectation):
                raise ValueError(f"dataset {self.name}: {expectation!r} is not an Expectation")
            if expectation.name in seen:
                raise ValueError(f"dataset {self.name}: expectation {expectation.name} is declared twice")
            seen.add(expectation.name)
            try:
                expectation.check_against(self.contract)
            except ValueError as error:
                raise ValueError(f"dataset {self.name}: {error}") from None
        if self.quarantine_limit is not None and not isinstance(self.quarantine_limit, QuarantineLimit):
            raise ValueError(f"dataset {self.name}: quarantine_limit must be a QuarantineLimit or None")

    @property
    def bronze(self) -> str:
        return f"bronze_{self.name}"

    @property
    def silver(self) -> str:
        return f"silver_{self.name}"

    @property
    def quarantine(self) -> str:
        return f"quarantine_{self.name}"

    def gold_table(self, gold: Gold) -> str:
        """The table of ``gold``, one of this dataset's golds."""
        self._check_gold(gold)
        return f"gold_{gold.name}" if self.naming is Naming.SOLE else f"gold_{self.name}_{gold.name}"

    def values_table(self, gold: Gold, aggregate: Aggregate) -> str:
        """The table of the values behind ``gold``'s exact distinct count ``aggregate``."""
        if aggregate not in gold.aggregates or aggregate.kind is not AggregateKind.DISTINCT:
            column = getattr(aggregate, "column", aggregate)
            raise ValueError(f"gold {gold.name} has no exact distinct count {column!r}")
        return f"{self.gold_table(gold)}_{aggregate.column}_values"

    def gold_tables(self, gold: Gold) -> tuple[str, ...]:
        """What ``gold``'s stream writes: the gold table, then the table of values of each exact distinct count."""
        distinct = (a for a in gold.aggregates if a.kind is AggregateKind.DISTINCT)
        return (self.gold_table(gold), *(self.values_table(gold, aggregate) for aggregate in distinct))

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.bronze, self.silver, self.quarantine, *(t for gold in self.golds for t in self.gold_tables(gold)))

    def stream(self, layer: str) -> str:
        """The name of this dataset's ``layer`` stream: "bronze", "silver" or "fused"."""
        if layer not in ("bronze", "silver", "fused"):
            raise ValueError(f"layer must be bronze, silver or fused, not {layer!r} (a gold's stream: gold_stream)")
        return layer if self.naming is Naming.SOLE else f"{self.name}_{layer}"

    def gold_stream(self, gold: Gold) -> str:
        """The name of the stream that writes ``gold``."""
        self._check_gold(gold)
        if self.naming is Naming.SOLE:
            return "gold" if gold == self.golds[0] else f"gold_{gold.name}"
        return f"{self.name}_gold_{gold.name}"

    @property
    def streams(self) -> tuple[str, ...]:
        """The layered streams, bronze first: the fused stream runs instead of them."""
        return (self.stream("bronze"), self.stream("silver"), *(self.gold_stream(gold) for gold in self.golds))

    def _check_gold(self, gold: Gold) -> None:
        if gold not in self.golds:
            raise ValueError(f"dataset {self.name} has no gold {getattr(gold, 'name', gold)!r}")


def _is_name(name: str) -> bool:
    return DATASET_NAME_PATTERN.fullmatch(name) is not None


def _check_name_and_freeze(declared: Gold | Dataset, what: str, sequences: tuple[str, ...]) -> None:
    """ValueError on a bad name or a string given as a sequence; the sequences frozen as tuples."""
    if not isinstance(declared.name, str) or not _is_name(declared.name):
        raise ValueError(f"{what} {declared.name!r}: a name is a lower-case letter followed by [a-z0-9_]")
    for attribute in sequences:
        value = getattr(declared, attribute)
        if isinstance(value, str):
            raise ValueError(f"{what} {declared.name}: {attribute} must be a sequence, not the string {value!r}")
        object.__setattr__(declared, attribute, tuple(value))
