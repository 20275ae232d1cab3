"""Sample records for the demo and tests, produced with a transactional producer.

``sample_records`` are the events dataset's: key = user_id (UTF-8); value = JSON
{"event_id", "event_time" (ISO-8601 with offset), "user_id", "event_type", "amount"}.
``contract_records`` are any dataset's, drawn from its declaration, written as the dataset's format
says (``value_writer``): a JSON object, or Avro in the Confluent wire format by confluent-kafka's own
``AvroSerializer`` through a schema registry.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient, topic_subject_name_strategy
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from ..pipeline.contract import Contract, Field, Kind
from ..pipeline.dataset import Dataset
from ..pipeline.expectations import Action, Expectation, Rule
from ..pipeline.formats import Format
from ..pipeline.formats.registry import REQUEST_TIMEOUT_S, RegistryAccess, client_conf

EVENT_TYPES = ("page_view", "add_to_cart", "purchase", "refund")
# One of each way a record can be bad; the silver layer must quarantine every one.
MALFORMED_VALUES: tuple[bytes | None, ...] = (
    b"{not json",
    b'["an", "array"]',
    b'{"event_id": "x", "event_time": "2024-01-01T00:00:00Z", "user_id": "u", "event_type": "t"}',
    b'{"event_id": "x", "event_time": "2024-01-01T00:00:00Z", "user_id": "u", "event_type": "t", "amount": "1.5"}',
    b'{"event_id": "x", "event_time": "yesterday", "user_id": "u", "event_type": "t", "amount": 1.5}',
    b'{"event_id": "x", "event_time": "2024-01-01T00:00:00Z", "user_id": "u", "event_type": "t", "amount": 1.005}',
    b"\xff\xfe not utf-8",
    None,
)

Record = tuple[bytes, bytes | None]
# A producer's writing of one record's values (a dict of field names to values) as a Kafka value.
ValueWriter = Callable[[dict], bytes]
# The Avro type a producer writes each kind of field in (a decimal: bytes with its precision and scale).
AVRO_TYPES: dict[Kind, object] = {
    Kind.STRING: "string",
    Kind.TIMESTAMP: {"type": "long", "logicalType": "timestamp-micros"},
    Kind.INTEGER: "int",
    Kind.LONG: "long",
    Kind.BOOLEAN: "boolean",
}
# A schema id no registry has handed out yet: a record naming it is unreadable.
UNKNOWN_SCHEMA_ID = 2**31 - 1


def sample_event(index: int, rng: random.Random, start: datetime, prefix: str) -> dict:
    user_id = f"user-{rng.randrange(50):03d}"
    return {
        "event_id": f"{prefix}-{index:09d}",
        "event_time": (start + timedelta(milliseconds=rng.randrange(600_000))).isoformat(),
        "user_id": user_id,
        "event_type": rng.choice(EVENT_TYPES),
        # Two-decimal amounts written as JSON numbers: exact as DECIMAL(18,2).
        "amount": float(Decimal(rng.randrange(1, 100_000)) / 100),
    }


def contract_records(
    dataset: Dataset,
    count: int,
    seed: int = 7,
    malformed_ratio: float = 0.0,
    retry_ratio: float = 0.0,
    start: datetime | None = None,
    prefix: str | None = None,
    unexpected_ratio: float = 0.0,
    write: ValueWriter | None = None,
) -> Iterator[Record]:
    """``count`` records of ``dataset``, their values drawn from its contract, reproducible for a seed.

    Each field gets a value of its kind: a business-key string unique per record (``<prefix>-<n>``), a
    dimension one of four values, any other string one of fifty, an event time within ten minutes of
    ``start``, a decimal that fits its precision and scale written as a JSON number, an optional field left
    out now and then. About ``malformed_ratio`` of the records are bad in one of the ways silver quarantines
    (not JSON, not an object, a required field missing, a field of the wrong kind, not UTF-8, no value), and
    about ``retry_ratio`` are an application-level retry: an earlier record's key and value sent again. About
    ``unexpected_ratio`` are records the contract reads that break the dataset's first quarantining
    expectation a producer can break from its declaration (``breakable``): a number out of its range, a
    value out of its set, an optional field left out.

    Each value is written by ``write``: a JSON dataset's by default; a dataset in another format needs
    its ``value_writer``. An Avro dataset's bad records are bad in the wire format's ways instead (no
    magic byte, a schema id the registry never gave, a body cut short, no value).

    Example::

        produce(client_config(config), "orders", contract_records(ORDERS, 1000, retry_ratio=0.02))
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    if write is None and dataset.format is not Format.JSON:
        raise ValueError(
            f"dataset {dataset.name} is written in {dataset.format}: pass write=value_writer(dataset, registry, topic)"
        )
    write = write or _json_object
    ratios = (
        ("malformed_ratio", malformed_ratio),
        ("retry_ratio", retry_ratio),
        ("unexpected_ratio", unexpected_ratio),
    )
    for name, ratio in ratios:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {ratio}")
    broken_rule = breakable(dataset) if unexpected_ratio else None
    if unexpected_ratio and broken_rule is None:
        raise ValueError(f"dataset {dataset.name} has no quarantining expectation a producer can break on purpose")
    rng = random.Random(seed)
    start = start or datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    prefix = prefix or f"{dataset.name}-{seed}"
    contract = dataset.contract
    keyed_by = (*dataset.dedup_key, *contract.dimensions, contract.fields[0].name)[0]
    sent: list[Record] = []
    for index in range(count):
        if sent and rng.random() < retry_ratio:
            yield rng.choice(sent)
            continue
        values = {
            field.name: _sample_value(field, index, rng, start, prefix, dataset)
            for field in contract.fields
            if field.required or rng.random() >= 0.1
        }
        key = str(values.get(keyed_by, "")).encode() or None
        if rng.random() < malformed_ratio:
            if dataset.format is Format.JSON:
                yield key, _malformed(contract, values, index)
            else:
                yield key, _malformed_wire(write(values), index)
            continue
        if broken_rule is not None and rng.random() < unexpected_ratio:
            yield key, write(_breaking(broken_rule, dataset, values))
            continue
        record = (key, write(values))
        sent.append(record)
        yield record


def breakable(dataset: Dataset) -> Expectation | None:
    """The first of ``dataset``'s quarantining expectations a record of its contract can break on purpose:
    a range, a set of strings or numbers, an optional field's presence. None when it has none.

    Example::

        breakable(ORDERS_DATASET).name  # "total_positive"
    """
    for expectation in dataset.expectations:
        if expectation.action is not Action.QUARANTINE:
            continue
        if expectation.rule is Rule.IN_RANGE:
            return expectation
        if expectation.rule is Rule.ONE_OF and not isinstance(expectation.argument("values")[0], bool):
            return expectation
        if expectation.rule is Rule.NOT_NULL and not dataset.contract.field(expectation.argument("field")).required:
            return expectation
    return None


def _breaking(expectation: Expectation, dataset: Dataset, values: dict) -> dict:
    """``values`` with ``expectation``'s field changed so that the record fails it, still of its kind."""
    name = expectation.argument("field")
    if expectation.rule is Rule.NOT_NULL:
        return {key: value for key, value in values.items() if key != name}
    field = dataset.contract.field(name)
    if expectation.rule is Rule.ONE_OF:
        allowed = expectation.argument("values")
        outside = f"{name}-unexpected" if isinstance(allowed[0], str) else max(Decimal(each) for each in allowed) + 1
    elif expectation.argument("minimum") is not None:
        outside = expectation.argument("minimum") - 1
    else:
        outside = expectation.argument("maximum") + 1
    if field.kind is Kind.DECIMAL:
        outside = Decimal(outside).quantize(Decimal(1).scaleb(-field.scale))
    elif field.kind in (Kind.INTEGER, Kind.LONG):
        outside = int(outside)
    return dict(values, **{name: outside})


def _sample_value(field: Field, index: int, rng: random.Random, start: datetime, prefix: str, dataset: Dataset):
    if field.kind is Kind.STRING:
        if field.name in dataset.dedup_key:
            return f"{prefix}-{index:09d}"
        choices = 4 if field.name in dataset.contract.dimensions else 50
        return f"{field.name}-{rng.randrange(choices):03d}"
    if field.kind is Kind.TIMESTAMP:
        return (start + timedelta(milliseconds=rng.randrange(600_000))).isoformat()
    if field.kind is Kind.DECIMAL:
        digits = min(field.precision, 7)
        return Decimal(rng.randrange(1, 10**digits)).scaleb(-min(field.scale, digits))
    if field.kind is Kind.INTEGER:
        return rng.randrange(-1000, 1000)
    if field.kind is Kind.LONG:
        return rng.randrange(2**40)
    return rng.random() < 0.5


def _json_object(values: dict) -> bytes:
    # A decimal is written as its exact text in fixed point, a JSON number: json.dumps would go through a float.
    members = (
        f"{json.dumps(name)}: {f'{value:f}' if isinstance(value, Decimal) else json.dumps(value)}"
        for name, value in values.items()
    )
    return ("{" + ", ".join(members) + "}").encode()


def _malformed(contract: Contract, values: dict, index: int) -> bytes | None:
    """One of the ways a record is bad, in turn by ``index``."""
    first = next(field for field in contract.fields if field.required)
    wrong_kind = dict(values, **{first.name: 1 if first.kind is Kind.STRING else "not a " + first.kind.value})
    missing = {name: value for name, value in values.items() if name != first.name}
    ways = (
        b"{not json",
        b'["an", "array"]',
        _json_object(missing),
        _json_object(wrong_kind),
        b"\xff\xfe not utf-8",
        None,
    )
    return ways[index % len(ways)]


def _malformed_wire(written: bytes, index: int) -> bytes | None:
    """One of the ways a record in the Confluent wire format is bad, in turn by ``index``: ``written`` (a good
    record's bytes) without its magic byte, naming a schema id the registry never gave, cut short, or no value."""
    ways = (
        b"{not in the wire format}",
        b"\x00" + UNKNOWN_SCHEMA_ID.to_bytes(4, "big") + written[5:],
        written[:6],
        None,
    )
    return ways[index % len(ways)]


def value_writer(dataset: Dataset, registry: dict | None = None, topic: str | None = None) -> ValueWriter:
    """How a producer writes ``dataset``'s values (dicts of its fields, as ``contract_records`` draws them):
    a JSON object; or, for an Avro dataset, confluent-kafka's ``AvroSerializer`` with a writer schema made
    from the contract (``writer_schema``), registered under ``<topic>-value`` in the registry that
    ``registry`` (SchemaRegistryClient's configuration) names, in the Confluent wire format.

    Example::

        write = value_writer(ORDERS, {"url": "http://127.0.0.1:8081"}, "orders")
        produce(client_config(config), "orders", contract_records(ORDERS, 100, write=write))
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    if dataset.format is Format.JSON:
        return _json_object
    if dataset.format is not Format.AVRO:
        raise ValueError(f"dataset {dataset.name}: sample values are written in JSON or Avro, not {dataset.format}")
    if not isinstance(registry, dict) or not registry.get("url"):
        raise ValueError(f"dataset {dataset.name} is in Avro: registry must configure a schema registry client")
    if not topic:
        raise ValueError(f"dataset {dataset.name} is in Avro: name the topic its schema's subject is named after")
    # The subject is the topic's, `<topic>-value`, named outright: left to its default, the serializer first
    # asks the registry which subject the topic is associated with.
    serializer = AvroSerializer(
        SchemaRegistryClient({"timeout": REQUEST_TIMEOUT_S, **registry}),
        writer_schema(dataset),
        conf={"subject.name.strategy": topic_subject_name_strategy},
    )
    context = SerializationContext(topic, MessageField.VALUE)
    timestamps = {field.name for field in dataset.contract.fields if field.kind is Kind.TIMESTAMP}

    def write(values: dict) -> bytes:
        record = {name: None for name in dataset.contract.names}
        for name, value in values.items():
            record[name] = datetime.fromisoformat(value) if name in timestamps else value
        return serializer(record, context)

    return write


def registry_client(config, dataset: Dataset) -> dict | None:
    """confluent-kafka's SchemaRegistryClient configuration for ``config``'s registry, where ``dataset`` names
    its writer schemas there (not JSON); None for a JSON dataset. ValueError naming schema_registry.url when
    the config names no registry for it.

    Example::

        registry_client(config, ORDERS)["url"]  # "http://127.0.0.1:8081/apis/ccompat/v7"
    """
    if dataset.format is Format.JSON:
        return None
    if not config.schema_registry.url.startswith(("http://", "https://")):
        raise ValueError(f"schema_registry.url: dataset {dataset.name} is in {dataset.format}: name a running registry")
    return client_conf(RegistryAccess.of(config.schema_registry))


def dataset_writer(config, dataset: Dataset, topic: str) -> ValueWriter:
    """How a producer of ``config``'s writes ``dataset``'s values to ``topic`` (``value_writer``): an Avro
    dataset's through ``config``'s schema registry.

    Example::

        write = dataset_writer(config, ORDERS, "orders")
    """
    return value_writer(dataset, registry_client(config, dataset), topic)


def writer_schema(dataset: Dataset) -> str:
    """The Avro schema a producer of ``dataset`` writes with: a record of its contract's fields, each of the
    kind's Avro type (``AVRO_TYPES``; a decimal with its precision and scale), an optional one a union with
    null that defaults to it.

    Example::

        writer_schema(ORDERS)  # '{"type": "record", "name": "orders", "namespace": "sample", ...}'
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    fields = []
    for field in dataset.contract.fields:
        if field.kind is Kind.DECIMAL:
            avro_type = {"type": "bytes", "logicalType": "decimal", "precision": field.precision, "scale": field.scale}
        else:
            avro_type = AVRO_TYPES[field.kind]
        if field.required:
            fields.append({"name": field.name, "type": avro_type})
        else:
            fields.append({"name": field.name, "type": ["null", avro_type], "default": None})
    return json.dumps({"type": "record", "name": dataset.name, "namespace": "sample", "fields": fields})


def sample_records(
    count: int,
    seed: int = 7,
    malformed_ratio: float = 0.0,
    start: datetime | None = None,
    prefix: str | None = None,
) -> Iterator[Record]:
    """``count`` records, about ``malformed_ratio`` of them malformed, reproducible for a seed."""
    if not 0.0 <= malformed_ratio <= 1.0:
        raise ValueError(f"malformed_ratio must be between 0 and 1, got {malformed_ratio}")
    rng = random.Random(seed)
    start = start or datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    prefix = prefix or f"evt-{seed}"
    for index in range(count):
        event = sample_event(index, rng, start, prefix)
        key = event["user_id"].encode()
        if rng.random() < malformed_ratio:
            yield key, MALFORMED_VALUES[index % len(MALFORMED_VALUES)]
        else:
            yield key, json.dumps(event).encode()


# Event times at both ends of the calendar, as producers send them, and whether the contract
# accepts each (``contract.EVENT_TIME_RANGE``).
CALENDAR_EDGES: dict[str, bool] = {
    "0001-01-01T00:00:00Z": False,  # Go's zero time, .NET's DateTime.MinValue
    "0001-01-01T00:30:00+01:00": False,  # 0000-12-31T23:30Z: before year 1
    "1500-06-01T10:00:30Z": False,  # before the Gregorian calendar
    "1582-10-10T12:00:00+02:00": False,  # a day the Julian reckoning skips
    "1582-12-31T23:30:00-01:00": True,  # 1583-01-01T00:30Z
    "2024-02-29T23:59:59.999999Z": True,
    "9998-12-31T23:59:59.999999Z": True,
    "9999-01-01T00:00:00Z": False,
    "9999-12-31T23:59:59.9999999Z": False,  # .NET's DateTime.MaxValue
}


def calendar_edge_records(prefix: str, event_type: str = "edge", amount: float = 1.25) -> list[Record]:
    """One event for each of ``CALENDAR_EDGES``, ids ``<prefix>-<n>``: the same ids for the same prefix.

    Example::

        produce(client_config(config), "events", calendar_edge_records("edge"))
    """
    if not prefix:
        raise ValueError("prefix must name the events' ids")
    return [
        (
            b"user-edge",
            json.dumps(
                {
                    "event_id": f"{prefix}-{index}",
                    "event_time": text,
                    "user_id": "user-edge",
                    "event_type": event_type,
                    "amount": amount,
                }
            ).encode(),
        )
        for index, text in enumerate(CALENDAR_EDGES)
    ]


def produce(
    producer_config: dict,
    topic: str,
    records: Iterable[Record],
    transaction_size: int = 1000,
    abort: bool = False,
) -> int:
    """Produce in transactions of ``transaction_size``; with ``abort`` every transaction is aborted.

    Returns the number of records sent.
    """
    producer = Producer(
        {
            **producer_config,
            "transactional.id": f"sample-{uuid.uuid4()}",
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    sent = 0
    in_transaction = 0
    for key, value in records:
        if in_transaction == 0:
            producer.begin_transaction()
        producer.produce(topic, key=key, value=value)
        sent += 1
        in_transaction += 1
        if in_transaction == transaction_size:
            _finish(producer, abort)
            in_transaction = 0
    if in_transaction:
        _finish(producer, abort)
    return sent


def _finish(producer: Producer, abort: bool) -> None:
    if abort:
        producer.abort_transaction(30)
    else:
        producer.commit_transaction(30)
