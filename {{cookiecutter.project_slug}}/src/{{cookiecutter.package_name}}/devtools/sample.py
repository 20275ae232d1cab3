"""Sample events for the demo and tests, produced with a transactional producer.

Record contract: key = user_id (UTF-8); value = JSON
{"event_id", "event_time" (ISO-8601 with offset), "user_id", "event_type", "amount"}.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from confluent_kafka import Producer

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
