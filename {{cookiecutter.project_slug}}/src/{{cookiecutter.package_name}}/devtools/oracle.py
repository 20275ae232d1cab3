"""An oracle for any dataset: its tables judged against the records committed to its topics, in plain Python.

It knows the dataset only by its declaration (fields, event time, business key, golds: what a reader of
``datasets/<name>.py`` knows) and the records only by their bytes, as the producer committed them; it
uses none of the pipeline's code. The producer marks the records it breaks (``BROKEN_PREFIX``), so which
records belong in quarantine is the producer's word, not a second parser's. A record the contract reads
may still fail one of the dataset's quarantining expectations: the oracle judges those from the
declaration's own terms (an expectation's rule and arguments) in Python, not with the SQL silver runs.
A business key's copies are the producer's retries, each the same bytes, so whichever copy silver keeps,
every gold is the same. A JSON dataset's values are read with ``json``; an Avro dataset's with
confluent-kafka's own ``AvroDeserializer``, each by the writer schema its id names in the registry
(``registry``: SchemaRegistryClient's configuration).

What it finds, by kind:

* ``bronze``: a committed record bronze lacks or holds twice, or a record no one committed;
* ``silver``: a business key silver lacks or holds twice, or a row of no committed record;
* ``quarantine``: a broken record not quarantined, a record failing an expectation not quarantined
  with its first failed expectation's name, a copy quarantined without naming the kept record of its
  key, or a record both kept and quarantined;
* ``gold``: per gold, a window whose aggregates differ from the committed records' (an approximate
  distinct count may differ from the exact one by its documented error).

Example::

    findings = judge_dataset(spark, lakehouse, ORDERS, committed_values, "1 minute")
    assert not any(findings.values()), findings
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer

from ..pipeline.contract import Kind
from ..pipeline.dataset import AggregateKind, Dataset, Gold
from ..pipeline.expectations import Action, Expectation, Rule
from ..pipeline.formats import Format
from ..pipeline.formats.registry import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..pipeline.delta.tables import Lakehouse

BROKEN_PREFIX = b"{broken record "
DUPLICATE_OF = "duplicate of "
# The reason of a record quarantined by an expectation (docs/datasets.md).
UNMET = "expectation {name} not met"
UNMET_PREFIX = "expectation "
# The rules a record's own JSON decides; another quarantining rule the oracle cannot judge.
JUDGED_RULES = (Rule.NOT_NULL, Rule.IN_RANGE, Rule.ONE_OF, Rule.MATCHES)
# An approximate distinct count is right within this share of the exact count (three standard errors of a
# HyperLogLog sketch at lgConfigK 12), and within one value of a small count.
APPROX_TOLERANCE = 0.05
_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def window_seconds(duration: str) -> int:
    """The seconds of a window such as '10 minutes' or '1 hour'.

    Example::

        window_seconds("10 minutes")  # 600
    """
    match = re.fullmatch(r"\s*(\d+)\s+(second|minute|hour|day|week)s?\s*", duration or "")
    if match is None:
        raise ValueError(f"duration must be a number and a unit such as '10 minutes', not {duration!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _window_start(at: datetime, seconds: int) -> datetime:
    # Tumbling windows aligned to the epoch, as an event-time window of that duration is.
    elapsed = (at - _EPOCH) // timedelta(microseconds=1)
    return _EPOCH + timedelta(microseconds=elapsed - elapsed % (seconds * 1_000_000))


def record_reader(dataset: Dataset, registry: dict | None = None) -> Callable[[bytes], dict]:
    """How the oracle reads a committed value of ``dataset`` into a dict of its fields, as its JSON would
    hold them (a timestamp as ISO text, a decimal as a Decimal): ``json``, or for an Avro dataset
    ``AvroDeserializer`` through the registry ``registry`` configures.

    Example::

        record_reader(ORDERS, {"url": "http://127.0.0.1:8081"})(value)["order_id"]
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    if dataset.format is Format.JSON:
        return _json
    if dataset.format is not Format.AVRO:
        raise ValueError(f"dataset {dataset.name}: the oracle reads JSON and Avro values, not {dataset.format}")
    if not isinstance(registry, dict) or not registry.get("url"):
        raise ValueError(f"dataset {dataset.name} is in Avro: registry must configure a schema registry client")
    deserializer = _avro_deserializer(tuple(sorted(registry.items())))

    def read(value: bytes) -> dict:
        # No serialization context: the value's schema id is all the oracle reads it by (a context makes
        # the deserializer ask the registry which subject a topic is associated with, at every call).
        record = deserializer(value, None)
        return {
            name: item.astimezone(UTC).isoformat() if isinstance(item, datetime) else item
            for name, item in record.items()
        }

    return read


@lru_cache(maxsize=8)
def _avro_deserializer(registry: tuple) -> AvroDeserializer:
    """One deserializer, and so one registry client and its cache of schemas, per registry configuration:
    a client per record would open a connection per record and never close it."""
    return AvroDeserializer(SchemaRegistryClient({"timeout": REQUEST_TIMEOUT_S, **dict(registry)}))


def _json(value: bytes) -> dict:
    return json.loads(value, parse_float=Decimal)


def _key(dataset: Dataset, record: dict) -> tuple:
    """A record's business key; without one, the record itself (its fields, in the contract's order)."""
    names = dataset.dedup_key or tuple(field.name for field in dataset.contract.fields)
    return tuple(_canonical(record.get(name)) for name in names)


def _canonical(value):
    """A field's value, the same whether the producer's JSON or silver's column gave it: numbers by value."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float | Decimal):
        return str(Decimal(str(value)).normalize())
    return str(value)


def expected_golds(dataset: Dataset, kept: list[dict], gold: Gold, gold_window: str) -> dict[tuple, dict]:
    """``gold``'s rows from ``kept`` (silver's records, parsed): {(window start, *dimensions): {column: value}}.

    Example::

        expected_golds(ORDERS, [{"ordered_at": "2024-06-01T12:00:00+00:00", ...}], by_shop, "1 minute")
    """
    seconds = window_seconds(gold.window or gold_window)
    instants = {field.name for field in dataset.contract.fields if field.kind is Kind.TIMESTAMP}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for record in kept:
        at = datetime.fromisoformat(record[dataset.contract.event_time]).astimezone(UTC)
        groups[(_window_start(at, seconds), *(record.get(name) for name in gold.dimensions))].append(record)
    rows = {}
    for key, records in groups.items():
        row = {}
        for aggregate in gold.aggregates:
            values = [record.get(aggregate.field) for record in records] if aggregate.field else []
            present = [value for value in values if value is not None]
            if aggregate.field in instants:
                present = [datetime.fromisoformat(value).astimezone(UTC) for value in present]
            if aggregate.kind is AggregateKind.COUNT:
                row[aggregate.column] = len(records)
            elif aggregate.kind is AggregateKind.SUM:
                row[aggregate.column] = sum(present) if present else None
            elif aggregate.kind is AggregateKind.MIN:
                row[aggregate.column] = min(present) if present else None
            elif aggregate.kind is AggregateKind.MAX:
                row[aggregate.column] = max(present) if present else None
            else:  # an exact or approximate distinct count
                row[aggregate.column] = len(set(present))
        rows[key] = row
    return rows


def _same(found, expected, kind: AggregateKind) -> bool:
    if kind is AggregateKind.APPROX_DISTINCT:
        return found is not None and abs(found - expected) <= max(1, math.ceil(expected * APPROX_TOLERANCE))
    if isinstance(expected, float) or isinstance(found, float):
        return found is not None and math.isclose(float(found), float(expected), rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(expected, datetime):
        return found is not None and _instant(found) == expected
    return found == expected


def judge_dataset(
    spark,
    lakehouse: Lakehouse,
    dataset: Dataset,
    committed: list[bytes],
    gold_window: str,
    registry: dict | None = None,
) -> dict:
    """What ``dataset``'s tables in ``lakehouse`` hold that ``committed`` (every record value committed to
    its topics, in any order) does not warrant, by kind (module docstring): {kind: count}, all 0 when exact.
    Spark only reads the tables; ``judge_rows`` judges them (an Avro dataset's values read through
    ``registry``, ``record_reader``).

    Example::

        judge_dataset(spark, Lakehouse("/tmp/lake"), ORDERS, values, "1 minute")  # {"bronze": 0, ...}
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")

    def rows(table: str) -> list[dict]:
        return [row.asDict() for row in spark.read.format("delta").load(lakehouse.table(table)).collect()]

    golds = {gold.name: rows(dataset.gold_table(gold)) for gold in dataset.golds}
    tables = (rows(dataset.bronze), rows(dataset.silver), rows(dataset.quarantine))
    return judge_rows(dataset, committed, *tables, golds, gold_window, registry)


def judge_rows(
    dataset: Dataset,
    committed: list[bytes],
    bronze: list[dict],
    silver: list[dict],
    quarantine: list[dict],
    golds: dict[str, list[dict]],
    gold_window: str,
    registry: dict | None = None,
) -> dict[str, int]:
    """``judge_dataset`` on the tables' rows, each a dict of its columns; ``golds`` by gold name.

    Example::

        judge_rows(ORDERS, values, bronze, silver, quarantine, {"by_shop": rows}, "1 minute")["gold"]  # 0
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    window_seconds(gold_window)
    read = record_reader(dataset, registry)
    findings = Counter({"bronze": 0, "silver": 0, "quarantine": 0, "gold": 0})
    held_values = Counter(bytes(row["value"]) for row in bronze if row["value"] is not None)
    expected_values = Counter(committed)
    findings["bronze"] = sum(((held_values - expected_values) + (expected_values - held_values)).values())

    broken = [value for value in committed if value.startswith(BROKEN_PREFIX)]
    unmet = Counter((value, reason) for value in committed if (reason := _unmet(dataset, read, value)) is not None)
    valid, first_of_key = _valid_records(dataset, read, committed)
    copies = len(valid) - len(first_of_key) if dataset.dedup_key else 0
    names = [each.name for each in dataset.contract.fields]

    def key_of_row(row: dict) -> tuple:
        return _key(dataset, {name: _plain(row.get(name)) for name in names})

    held_keys = Counter(key_of_row(row) for row in silver)
    if dataset.dedup_key:
        expected_keys = Counter(list(first_of_key))
    else:
        expected_keys = Counter(_key(dataset, record) for record in valid)
    findings["silver"] = sum(((held_keys - expected_keys) + (expected_keys - held_keys)).values())

    silver_at = {(row["topic"], row["partition"], row["offset"]): row for row in silver}
    duplicates, others, failed = [], [], Counter()
    for row in quarantine:
        reason = row["reason"] or ""
        if reason.startswith(DUPLICATE_OF):
            duplicates.append(row)
        elif reason.startswith(UNMET_PREFIX) and row["value"] is not None:
            failed[(bytes(row["value"]), reason)] += 1
        else:
            others.append(row)
    findings["quarantine"] += abs(len(others) - len(broken)) + abs(len(duplicates) - copies)
    findings["quarantine"] += sum(((failed - unmet) + (unmet - failed)).values())
    findings["quarantine"] += sum(
        1 for row in others if row["value"] is None or not bytes(row["value"]).startswith(BROKEN_PREFIX)
    )
    for row in duplicates:
        # "duplicate of <topic>/<partition>/<offset>": the record silver keeps, of the same key.
        topic, partition, offset = row["reason"].removeprefix(DUPLICATE_OF).rsplit("/", 2)
        kept = silver_at.get((topic, int(partition), int(offset)))
        copy = read(bytes(row["value"])) if row["value"] is not None else {}
        if kept is None or key_of_row(kept) != _key(dataset, copy):
            findings["quarantine"] += 1
    in_both = {(row["topic"], row["partition"], row["offset"]) for row in quarantine} & set(silver_at)
    findings["quarantine"] += len(in_both)

    kept_records = _kept(dataset, valid, first_of_key)
    for gold in dataset.golds:
        findings["gold"] += _rows_wrong(dataset, kept_records, gold, golds.get(gold.name, []), gold_window)
    return dict(findings)


def judge_published(
    dataset: Dataset,
    committed: list[bytes],
    gold: Gold,
    rows: list[dict],
    gold_window: str,
    registry: dict | None = None,
) -> int:
    """The rows of ``gold`` an egress's sink holds (``rows``: each a dict of the gold's columns, its window
    start an instant or its ISO text) that ``committed`` does not warrant: missing, unexpected or wrong.

    Example::

        judge_published(ORDERS, values, by_shop, [json.loads(value) for value in folded_topic], "1 minute")  # 0
    """
    if not isinstance(dataset, Dataset) or gold not in dataset.golds:
        raise ValueError(f"gold must be one of the golds of dataset {getattr(dataset, 'name', dataset)!r}")
    window_seconds(gold_window)
    valid, first_of_key = _valid_records(dataset, record_reader(dataset, registry), committed)
    return _rows_wrong(dataset, _kept(dataset, valid, first_of_key), gold, rows, gold_window)


def _valid_records(
    dataset: Dataset, read: Callable[[bytes], dict], committed: list[bytes]
) -> tuple[list[dict], dict[tuple, dict]]:
    """The committed records neither broken nor failing a quarantining expectation, read, and the first of
    each business key among them (an expectation judges a record before its key is looked up)."""
    valid = [
        read(value)
        for value in committed
        if not value.startswith(BROKEN_PREFIX) and _unmet(dataset, read, value) is None
    ]
    first_of_key: dict[tuple, dict] = {}
    for record in valid:
        first_of_key.setdefault(_key(dataset, record), record)
    return valid, first_of_key


def unmet_reason(dataset: Dataset, value: bytes, registry: dict | None = None) -> str | None:
    """The quarantine reason of a record the contract reads that fails one of ``dataset``'s quarantining
    expectations: the first it fails, in declaration order; None when it meets them all or is broken.
    An Avro dataset's value is read through ``registry`` (``record_reader``).

    Example::

        unmet_reason(ORDERS, b'{"order_id": "o1", ..., "total": -0.99}')  # "expectation total_positive not met"
    """
    return _unmet(dataset, record_reader(dataset, registry), value)


def _unmet(dataset: Dataset, read: Callable[[bytes], dict], value: bytes) -> str | None:
    if value.startswith(BROKEN_PREFIX):
        return None
    record = None
    for expectation in dataset.expectations:
        if expectation.action is not Action.QUARANTINE:
            continue
        if expectation.rule not in JUDGED_RULES:
            raise ValueError(
                f"dataset {dataset.name}: expectation {expectation.name} is a {expectation.rule} rule, which this "
                f"oracle cannot judge from a record's JSON alone ({', '.join(JUDGED_RULES)} it can)"
            )
        record = record if record is not None else read(value)
        if not _meets(expectation, record.get(expectation.argument("field"))):
            return UNMET.format(name=expectation.name)
    return None


def _meets(expectation: Expectation, value) -> bool:
    """Whether a field's JSON ``value`` meets ``expectation``; an absent value meets all but NOT_NULL, as an
    SQL condition that is NULL does."""
    if expectation.rule is Rule.NOT_NULL:
        return value is not None
    if value is None:
        return True
    if expectation.rule is Rule.MATCHES:
        # Python's regular expressions read the simple patterns of an example as Java's do.
        return re.search(expectation.argument("pattern"), value) is not None
    if expectation.rule is Rule.ONE_OF:
        allowed = expectation.argument("values")
        if isinstance(allowed[0], str | bool):
            return value in allowed
        return Decimal(str(value)) in {Decimal(str(each)) for each in allowed}
    number = Decimal(str(value))
    minimum, maximum = expectation.argument("minimum"), expectation.argument("maximum")
    return (minimum is None or number >= minimum) and (maximum is None or number <= maximum)


def _kept(dataset: Dataset, valid: list[dict], first_of_key: dict[tuple, dict]) -> list[dict]:
    """The records silver keeps: the first of each business key, or every valid record without a key."""
    return list(first_of_key.values()) if dataset.dedup_key else valid


def _rows_wrong(dataset: Dataset, kept: list[dict], gold: Gold, rows: list[dict], gold_window: str) -> int:
    """Rows of ``gold`` missing from ``rows``, unexpected there, or with another value than ``kept`` gives."""
    expected = expected_golds(dataset, kept, gold, gold_window)
    found = {(_instant(row["window_start"]), *(row[name] for name in gold.dimensions)): row for row in rows}
    wrong = len(set(found) ^ set(expected))
    for key in set(found) & set(expected):
        if not all(
            _same(found[key][aggregate.column], expected[key][aggregate.column], aggregate.kind)
            for aggregate in gold.aggregates
        ):
            wrong += 1
    return wrong


def _instant(value: datetime | str) -> datetime:
    # A collected timestamp comes back naive, in the session's time zone: this process's. A published one is
    # ISO text with its offset.
    return (datetime.fromisoformat(value) if isinstance(value, str) else value).astimezone(UTC)


def _plain(value):
    """A silver value as the producer's JSON wrote it: a timestamp in ISO form is compared as an instant."""
    if isinstance(value, datetime):
        return _instant(value).isoformat()
    return value
