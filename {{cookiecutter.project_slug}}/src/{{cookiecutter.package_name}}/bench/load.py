"""What the benchmark produces: backlogs, single transactions, and paced records carrying latency markers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from ..devtools.sample import produce, sample_records
from ..pipeline.config import Config
from ..pipeline.kafka.clients import client_config

MARKER_PREFIX = "bench-marker-"


def produce_backlog(config: Config, topic: str, count: int, seed: int, malformed_ratio: float = 0.01) -> float:
    """``count`` sample records in the project's transactions of 1000; returns records/s."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    started = time.perf_counter()
    producer = client_config(config, **{"queue.buffering.max.messages": 1_000_000})
    produce(producer, topic, sample_records(count, seed, malformed_ratio, prefix=f"bench{seed}"))
    return count / (time.perf_counter() - started)


def produce_one_transaction(config: Config, topic: str, count: int, seed: int) -> None:
    """``count`` sample records committed together, so one batch can pick them all up."""
    if count <= 0:
        raise ValueError(f"count must be positive, got {count}")
    producer = client_config(config, **{"queue.buffering.max.messages": max(count * 2, 100_000)})
    produce(producer, topic, sample_records(count, seed, prefix=f"bench{seed}"), transaction_size=count)


def marker(index: int, run: str = "") -> tuple[bytes, bytes]:
    """A latency marker: an event_type of its own, so one gold commit inserts its row and no other.

    ``run`` names the latency run, so runs into the same tables never share a marker.
    """
    if index < 0:
        raise ValueError(f"marker index must not be negative, got {index}")
    name = f"{MARKER_PREFIX}{run}{index:06d}"
    event = {
        "event_id": name,
        "event_time": datetime.now(UTC).isoformat(),
        "user_id": "bench-marker",
        "event_type": name,
        "amount": 1.0,
    }
    return b"bench-marker", json.dumps(event).encode()


def paced_records(
    rate: int, seconds: float, transaction_size: int, marker_every: int, stop: threading.Event, run: str = ""
) -> Iterator[tuple[bytes, bytes | None]]:
    """Sample records at ``rate``/s for ``seconds``; every ``marker_every``-th transaction ends with a marker
    of the latency run ``run``."""
    if rate <= 0 or seconds <= 0 or transaction_size <= 0 or marker_every <= 0:
        raise ValueError(
            f"rate, seconds, transaction_size and marker_every must be positive, "
            f"got {rate}, {seconds}, {transaction_size}, {marker_every}"
        )
    total = int(rate * seconds)
    background = sample_records(total, seed=99, prefix=f"bench-live{run}")
    started = time.monotonic()
    markers = 0
    for index in range(total):
        if stop.is_set():
            return
        delay = started + index / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        position = index + 1
        if position % transaction_size == 0 and (position // transaction_size) % marker_every == 0:
            next(background)  # the marker takes this record's place: the rate stays as asked
            yield marker(markers, run)
            markers += 1
        else:
            yield next(background)
