"""Storage: each layer's rate and one-record batch on a local-disk lakehouse against an S3 one, on the
bench's private S3 server (SeaweedFS, started with the bench: ``Bench.s3_root``).

Everything but the storage is the same: the records (one backlog of ``Sizes.storage_records``, produced
alike into a topic for each storage, so the one-record batches of one never reach the other's streams),
the batch size, the trigger, the Spark session, the project's streams. The turns alternate: each drains
its storage's topic (availableNow, layer after layer, ``Bench.run_layers``) into a fresh lakehouse on
local disk and into one on S3, local first on even turns, S3 first on odd ones, so neither always runs
on the warmer JVM; a layer's rate is its records over its batch time (stream starts excluded), the
median of the turns. Then the last lakehouse of each storage carries one-record transactions (as
many as turns) through the pipeline's running streams, fixed overhead's way (``fixed_overhead.run_steps``,
its trigger), local disk first; a layer's one-record batch is the median of its batches' time.

The server runs on this machine: S3 / local is what the object store's protocol costs the pipeline (a
request for every listing, read, write and commit), not a network's latency.
"""

from __future__ import annotations

import statistics
import uuid
from enum import StrEnum

from ..pipeline.delta.tables import LAYERS, Lakehouse, ensure_tables
from .fixed_overhead import run_steps, step_batches
from .harness import Bench, median_durations, rate, rows_and_ms, say, summary
from .load import produce_backlog


class Storage(StrEnum):
    """Where a lakehouse of this phase lives."""

    LOCAL = "local"
    S3 = "s3"


STORAGE_NAMES = {Storage.LOCAL: "local disk", Storage.S3: "S3"}


def turn_order(turn: int) -> tuple[Storage, Storage]:
    """Local disk first on even turns, S3 first on odd ones."""
    if turn < 0:
        raise ValueError(f"turn must not be negative, got {turn}")
    return (Storage.LOCAL, Storage.S3) if turn % 2 == 0 else (Storage.S3, Storage.LOCAL)


def lakehouse_root(bench: Bench, storage: Storage, name: str) -> str:
    """A lakehouse of ``storage`` named ``name``: under the work directory, or under the bench's S3 root."""
    if not isinstance(storage, Storage):
        raise TypeError(f"storage must be a Storage, not {storage!r}")
    if not name:
        raise ValueError("lakehouse_root needs a name")
    if storage is Storage.S3:
        if bench.s3_root is None:
            raise RuntimeError("Bench.start() first: it starts the S3 server")
        return f"{bench.s3_root}/storage/{name}"
    return str(bench.work / "storage" / name)


def warm_up_s3(bench: Bench) -> None:
    """The pipeline's tables in an S3 lakehouse of its own, left empty: the first S3 access of a JVM loads
    S3A and the AWS SDK (seconds), which no S3 figure should pay and which the bench's warm-up can hide."""
    ensure_tables(bench.spark, Lakehouse(lakehouse_root(bench, Storage.S3, "warm-up")))


def layer_rates(runs: dict[str, dict]) -> dict[str, float]:
    """Records per second of batch time of each layer of one ``Bench.run_layers``."""
    return {layer: rate(run["rows"], rows_and_ms(run["progress"])[1]) for layer, run in runs.items()}


def measure(bench: Bench) -> None:
    """Every layer's rate and one-record batch on local disk and on S3, turn about; the ratios S3 / local."""
    sizes = bench.sizes
    records = sizes.storage_records
    run_id = uuid.uuid4().hex[:8]
    topics = {}
    for storage in Storage:
        topic = bench.create_topic(f"bench-storage-{storage}-{run_id}")
        say(f"storage: producing {records:,} records for the {STORAGE_NAMES[storage]} lakehouses")
        produce_backlog(bench.phase_config(bench.work / "storage", topic), topic, records, seed=11)
        topics[storage] = topic
    drains: dict[Storage, list[dict]] = {storage: [] for storage in Storage}
    configs = {}
    for turn in range(sizes.storage_turns):
        for storage in turn_order(turn):
            say(
                f"storage: bronze -> silver -> gold on {STORAGE_NAMES[storage]} (availableNow, "
                f"turn {turn + 1}/{sizes.storage_turns})"
            )
            configs[storage] = bench.phase_config(
                lakehouse_root(bench, storage, f"{run_id}-{turn}"), topics[storage], trigger=sizes.overhead_trigger
            )
            drains[storage].append(bench.run_layers(configs[storage]))
    rates = {
        storage: {layer: statistics.median(layer_rates(runs)[layer] for runs in drains[storage]) for layer in LAYERS}
        for storage in Storage
    }
    one_record, input_rows = {}, {}
    for storage in Storage:
        per_step = run_steps(
            bench,
            configs[storage],
            topics[storage],
            [1] * sizes.storage_turns,
            seed=3000,
            label=f"storage, {STORAGE_NAMES[storage]}",
            bronze_rows=drains[storage][-1]["bronze"]["rows"],
        )
        carried = {layer: step_batches(per_step, 1, layer) for layer in LAYERS}
        one_record[storage] = {layer: median_durations(batches) for layer, batches in carried.items()}
        input_rows[storage] = {layer: [p["numInputRows"] for p in batches] for layer, batches in carried.items()}

    for layer in LAYERS:
        local, s3 = rates[Storage.LOCAL][layer], rates[Storage.S3][layer]
        bench.add(f"storage_{layer}_local_rps", f"{layer}, local-disk lakehouse", local, "records/s")
        bench.add(f"storage_{layer}_s3_rps", f"{layer}, S3 lakehouse", s3, "records/s")
        bench.add(f"storage_{layer}_s3_vs_local", f"{layer}: S3 / local disk (records/s)", s3 / local, "ratio")
    for layer in LAYERS:
        local = one_record[Storage.LOCAL][layer]["triggerExecution"]
        s3 = one_record[Storage.S3][layer]["triggerExecution"]
        bench.add(f"storage_{layer}_local_one_record_ms", f"{layer}: one-record batch, local disk", local, "ms")
        bench.add(f"storage_{layer}_s3_one_record_ms", f"{layer}: one-record batch, S3", s3, "ms")
        name = f"{layer}: one-record batch, S3 / local disk"
        bench.add(f"storage_{layer}_one_record_s3_vs_local", name, s3 / local, "ratio")
    bench.details["storage"] = {
        "records": records,
        "lakehouses": {str(storage): configs[storage].lakehouse_root for storage in Storage},
        "turns": [[str(storage) for storage in turn_order(turn)] for turn in range(sizes.storage_turns)],
        "trigger": sizes.overhead_trigger,
        "drains": {
            str(storage): [{layer: summary(run) for layer, run in runs.items()} for runs in drains[storage]]
            for storage in Storage
        },
        "one_record_ms": {str(storage): one_record[storage] for storage in Storage},
        "one_record_input_rows": {str(storage): input_rows[storage] for storage in Storage},
    }
