"""The driver's cost of its datasets: 1, 2 and 4 datasets' streams in one driver, as `run --layer all` runs them.

The datasets are the project's, in declaration order (``pipeline/datasets/``), then copies of its second dataset
(of its first, in a project of one) under names of their own (``orders2``, ``orders3``), declared here as a
project declares one: a ``Dataset`` with its own tables and streams, its topic named in a ``[dataset_<name>]``
table of its config (``dataset_sections``), resolved by the pipeline (``datasets.config_of``). Each dataset has
a topic of its own with a backlog (``Sizes.datasets_records`` records drawn from its contract,
``contract_records``, 1 % malformed) produced before the first run.

For each count, on a fresh lakehouse: every stream of each dataset (``stream_names``: its bronze, silver and
one stream per gold) started continuously with ``start_stream`` in one driver, as `run --layer all` starts
them, at ``Sizes.overhead_trigger``: the silver and gold streams first, then the bronze streams, so that the
backlogs start draining together (``DatasetsRun.start``). Figures:

* each dataset's records/s, end to end: its backlog over the span from its bronze's first batch to the end of
  the last batch of its streams that carried rows (stream starts excluded); the driver's records/s in all
  over the span of every dataset's batches;
* the driver's memory once every dataset has caught up: the JVM's heap in use after a garbage collection
  (the driver holds the executors' too in `local` mode), and in ``details`` its non-heap and the
  resident sizes of the JVM and of this Python process;
* a one-record latency: one record of the first dataset, in a transaction of its own, from before it is
  produced to the end of the last of that dataset's batches carrying it (each of its streams runs one), while
  the other datasets' streams run without new records: what they cost a dataset's latency; the median of
  ``Sizes.overhead_repeats``.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
import uuid
from datetime import datetime
from pathlib import Path

from confluent_kafka import Producer

from ..devtools.chaos import send_transaction
from ..devtools.sample import contract_records, dataset_writer, produce
from ..pipeline.config import DATASET_PREFIX, Config
from ..pipeline.dataset import AggregateKind, Dataset, Gold, Naming
from ..pipeline.datasets import DATASETS, SWITCH_VAR, check_apart
from ..pipeline.delta.tables import Lakehouse
from ..pipeline.formats import Format
from ..pipeline.kafka.clients import client_config
from ..pipeline.session.spark import java_class
from ..pipeline.streams import start_stream, stream_names
from .harness import Bench, ProgressLog, say, stop_all

MALFORMED_RATIO = 0.01
MEBIBYTE = 2**20


def cost_datasets(count: int) -> tuple[Dataset, ...]:
    """The ``count`` datasets of a run: the project's in declaration order, then copies of its second (its
    first, in a project of one) named ``<name>2``, ``<name>3``, ... with tables and streams of their own.

    Example::

        [each.name for each in cost_datasets(4)]  # ["events", "orders", "orders2", "orders3"]
    """
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive number of datasets, got {count!r}")
    chosen = list(DATASETS[:count])
    model = DATASETS[1] if len(DATASETS) > 1 else DATASETS[0]
    taken = {each.name for each in DATASETS}
    number = 2
    while len(chosen) < count:
        name = f"{model.name}{number}"
        if name not in taken:
            chosen.append(dataclasses.replace(model, name=name, naming=Naming.DATASET))
        number += 1
    check_apart(tuple(chosen))
    for each in chosen:
        uncounted = [gold.name for gold in each.golds if not counted_column(gold)]
        if uncounted:
            raise RuntimeError(
                f"datasets cost: dataset {each.name}'s golds {uncounted} count no events: the phase checks that "
                "each gold caught up with silver by its count"
            )
    return tuple(chosen)


def counted_column(gold: Gold) -> str | None:
    """The column of ``gold``'s event count; None when it declares none.

    Example::

        counted_column(DATASETS[0].golds[0])  # "event_count"
    """
    if not isinstance(gold, Gold):
        raise TypeError(f"gold must be a Gold, not {type(gold).__name__}")
    return next((a.column for a in gold.aggregates if a.kind is AggregateKind.COUNT), None)


def dataset_config(base: Config, dataset: Dataset, topic: str) -> Config:
    """``base`` (the run's config: its lakehouse and the first dataset's topic as ``kafka.topics``) with the
    ``[dataset_<name>]`` table naming ``topic`` for ``dataset`` beside the first, as a project's config names it.

    Example::

        dataset_config(config, cost_datasets(2)[1], "bench-orders").dataset_sections  # {"dataset_orders": ...}
    """
    if not isinstance(base, Config) or not isinstance(dataset, Dataset) or not topic:
        raise ValueError(f"dataset_config needs a Config, a Dataset and a topic, got {base!r}, {dataset!r}, {topic!r}")
    if dataset.naming is Naming.SOLE:
        return base
    section = {"topics": [topic]}
    return base.model_copy(update={"dataset_sections": {DATASET_PREFIX + dataset.name: section}})


def driver_memory(bench: Bench) -> dict[str, float | None]:
    """The driver's memory now: the JVM's heap in use right after a garbage collection and its non-heap in use
    (MiB), and the resident sizes of the JVM's process and of this one (MiB; None where /proc is not).

    Example::

        driver_memory(bench)["heap_mb"]  # 207.4
    """
    if bench.spark is None:
        raise RuntimeError("Bench.start() first")
    factory = java_class(bench.spark, "java.lang.management.ManagementFactory")
    memory = factory.getMemoryMXBean()
    memory.gc()
    return {
        "heap_mb": memory.getHeapMemoryUsage().getUsed() / MEBIBYTE,
        "non_heap_mb": memory.getNonHeapMemoryUsage().getUsed() / MEBIBYTE,
        "jvm_rss_mb": resident_mb(str(factory.getRuntimeMXBean().getPid())),
        "python_rss_mb": resident_mb("self"),
    }


def resident_mb(pid: str) -> float | None:
    """The resident size of process ``pid`` ("self": this one) in MiB, from /proc; None where it cannot be read.

    Example::

        resident_mb("self")  # 120.3
    """
    if not pid:
        raise ValueError("pid must name a process, or be 'self'")
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def batch_span(batch: dict) -> tuple[float, float]:
    """A batch's start and end, seconds since the epoch, from its progress (the JVM's clock).

    Example::

        batch_span({"timestamp": "2026-12-06T16:18:20.000Z", "durationMs": {"triggerExecution": 1500}})
        # (1796573900.0, 1796573901.5)
    """
    if "timestamp" not in batch or "durationMs" not in batch:
        raise ValueError(f"batch must be a batch's progress, with its timestamp and durations, not {batch!r}")
    started = datetime.fromisoformat(batch["timestamp"]).timestamp()
    return started, started + batch["durationMs"].get("triggerExecution", 0) / 1000


class DatasetsRun:
    """The streams of ``datasets`` running in this driver on a fresh lakehouse under ``root``, each dataset
    reading its topic of ``topics``."""

    def __init__(
        self, bench: Bench, root: Path, datasets: tuple[Dataset, ...], topics: dict[str, str], registry: str = ""
    ):
        self.bench = bench
        self.datasets = datasets
        first = datasets[0]
        base = with_registry(
            bench.phase_config(root, topics[first.name], trigger=bench.sizes.overhead_trigger), registry
        )
        self.configs = {each.name: dataset_config(base, each, topics[each.name]) for each in datasets}
        self.streams = {each.name: stream_names(self.configs[each.name], each) for each in datasets}
        self.queries: dict = {}
        self.log: ProgressLog | None = None

    def start(self) -> float:
        """Start every stream with ``start_stream``, as `run --layer all` does; returns the seconds the starts
        took. The streams that read a table first (each dataset's silver and golds, idle on its empty bronze),
        then every dataset's bronze, one after the other: each backlog starts draining within the few seconds
        of the bronze starts, not after every stream of the datasets before it has started."""
        started = time.perf_counter()
        bronze = {each.name: each.stream("bronze") for each in self.datasets}
        for reads_kafka in (False, True):
            for each in self.datasets:
                for name in self.streams[each.name]:
                    if (name == bronze[each.name]) is reads_kafka:
                        self.queries[name] = start_stream(
                            self.bench.spark, self.configs[each.name], name, available_now=False, dataset=each
                        )
        self.log = ProgressLog(self.queries)
        return time.perf_counter() - started

    def stop(self) -> None:
        stop_all(self.queries.values())

    def batches(self, dataset: Dataset) -> dict[str, list[dict]]:
        """The batches that carried rows of each of ``dataset``'s streams so far, in order."""
        self.log.poll()
        return {
            name: sorted(self.log.batches[name].values(), key=lambda batch: batch["timestamp"])
            for name in self.streams[dataset.name]
        }

    def caught_up(self, dataset: Dataset, bronze_rows: int) -> bool:
        """Whether bronze holds ``bronze_rows``, silver and quarantine all of bronze, and each gold counts all
        of silver. Read only while none of the dataset's streams runs a batch."""
        from pyspark.sql import functions as F

        if any(self.queries[name].status["isTriggerActive"] for name in self.streams[dataset.name]):
            return False
        spark = self.bench.spark
        lakehouse = Lakehouse(self.configs[dataset.name].lakehouse_root)

        def table(name: str):
            return spark.read.format("delta").load(lakehouse.table(name))

        bronze = table(dataset.bronze).count()
        if bronze < bronze_rows:
            return False
        silver = table(dataset.silver).count()
        if silver + table(dataset.quarantine).count() < bronze:
            return False
        for gold in dataset.golds:
            counted = table(dataset.gold_table(gold)).agg(F.sum(counted_column(gold))).first()[0] or 0
            if counted < silver:
                return False
        return True

    def drain(self, produced: dict[str, int]) -> dict[str, dict]:
        """Until every dataset's tables hold its topic's ``produced`` records; each dataset's span and rate."""
        deadline = time.monotonic() + self.bench.sizes.timeout_s
        pending = list(self.datasets)
        while pending:
            if time.monotonic() > deadline:
                raise RuntimeError(f"datasets cost: {[each.name for each in pending]} did not catch up in time")
            time.sleep(0.5)
            for each in list(pending):
                carried = self.batches(each)
                bronze = carried[each.stream("bronze")]
                # Cheap signs first: bronze read the backlog (numInputRows may count a batch twice) and
                # every stream of the dataset ran; the tables are read only then.
                if sum(batch["numInputRows"] for batch in bronze) < produced[each.name]:
                    continue
                if all(carried.values()) and self.caught_up(each, produced[each.name]):
                    pending.remove(each)
        spans = {}
        for each in self.datasets:
            carried = self.batches(each)
            first = min(batch_span(batch)[0] for batch in carried[each.stream("bronze")])
            last = max(batch_span(batch)[1] for batches in carried.values() for batch in batches)
            spans[each.name] = {
                "records": produced[each.name],
                "first_batch_at": first,
                "last_batch_end": last,
                "seconds": last - first,
                "rows_per_s": produced[each.name] / (last - first),
                "batches": {name: len(batches) for name, batches in carried.items()},
            }
        return spans

    def one_record(self, dataset: Dataset, topic: str, producer, seed: int, write) -> dict:
        """One record of ``dataset`` through its running streams, sent by ``producer`` (transactional, its
        transactions initialised): from before it is produced to the end of the last of its streams' batches
        carrying it, and each of those batches' time."""
        self.log.poll()
        before = {name: set(self.log.batches[name]) for name in self.streams[dataset.name]}
        records = list(contract_records(dataset, 1, seed, prefix=f"bench-cost-one-{seed}", write=write))
        sent_at = time.time()
        send_transaction(producer, topic, records, commit=True)
        deadline = time.monotonic() + self.bench.sizes.timeout_s
        while True:
            self.log.poll()
            new = {
                name: sorted(
                    (batch for key, batch in self.log.batches[name].items() if key not in before[name]),
                    key=lambda batch: batch["timestamp"],
                )
                for name in self.streams[dataset.name]
            }
            if all(new.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"datasets cost: one record of {dataset.name} did not reach every stream in time")
            time.sleep(0.05)
        ends = {name: batch_span(batches[0])[1] for name, batches in new.items()}
        return {
            "seconds": max(ends.values()) - sent_at,
            "batch_ms": {name: batches[0]["durationMs"].get("triggerExecution", 0) for name, batches in new.items()},
        }


def measure(bench: Bench) -> None:
    sizes = bench.sizes
    everyone = cost_datasets(max(sizes.dataset_counts))
    run_id = uuid.uuid4().hex[:8]
    topics = {each.name: bench.create_topic(f"bench-datasets-{each.name}-{run_id}") for each in everyone}
    # A dataset in Avro (the orders example) is written and read through the bench's registry.
    url = bench.registry_url() if any(each.format is not Format.JSON for each in everyone) else ""
    _measure(bench, everyone, topics, run_id, url)


def _measure(bench: Bench, everyone: tuple[Dataset, ...], topics: dict[str, str], run_id: str, url: str) -> None:
    """The phase's runs on the topics ``topics`` of ``everyone``, each Avro dataset through the registry ``url``."""
    sizes = bench.sizes
    records = sizes.datasets_records
    # Each dataset written as its producers write it; an Avro one through the registry ``url``.
    writers = {
        each.name: dataset_writer(
            with_registry(bench.phase_config(bench.work / "datasets-produce", topics[each.name]), url),
            each,
            topics[each.name],
        )
        for each in everyone
    }
    produced = {}
    for index, each in enumerate(everyone):
        say(f"datasets cost: producing {records:,} {each.name} records")
        config = bench.phase_config(bench.work / "datasets-produce", topics[each.name])
        sample = contract_records(
            each,
            records,
            seed=300 + index,
            malformed_ratio=MALFORMED_RATIO,
            prefix=f"bench-cost-{each.name}",
            write=writers[each.name],
        )
        produce(client_config(config, **{"queue.buffering.max.messages": 1_000_000}), topics[each.name], sample)
        produced[each.name] = records
    # One producer for the one-record transactions, its transactions initialised before any is timed.
    producer = Producer(
        {
            **client_config(bench.phase_config(bench.work / "datasets-produce", topics[everyone[0].name])),
            "transactional.id": f"bench-datasets-{run_id}",
            "enable.idempotence": True,
        }
    )
    producer.init_transactions(30)
    # A project's PIPELINE_DATASETS may leave datasets out: each run's config names exactly its own.
    switch = os.environ.pop(SWITCH_VAR, None)
    runs = {}
    try:
        for count in sizes.dataset_counts:
            datasets = everyone[:count]
            names = ", ".join(each.name for each in datasets)
            say(f"datasets cost: {count} dataset(s) in one driver ({names}): starting their streams")
            memory_before = driver_memory(bench)
            run = DatasetsRun(bench, bench.work / f"datasets-{count}", datasets, topics, url)
            try:
                start_s = run.start()
                say(f"datasets cost: {count} dataset(s): draining {records:,} records each")
                spans = run.drain({each.name: produced[each.name] for each in datasets})
                memory = driver_memory(bench)
                latencies = []
                for repeat in range(sizes.overhead_repeats):
                    step = f"{repeat + 1}/{sizes.overhead_repeats}"
                    say(f"datasets cost: {count} dataset(s): one record of {datasets[0].name} ({step})")
                    topic = topics[datasets[0].name]
                    seed = 900 + 10 * count + repeat
                    latencies.append(run.one_record(datasets[0], topic, producer, seed, writers[datasets[0].name]))
                    produced[datasets[0].name] += 1
            finally:
                run.stop()
            first = min(span["first_batch_at"] for span in spans.values())
            last = max(span["last_batch_end"] for span in spans.values())
            runs[count] = {
                "datasets": [each.name for each in datasets],
                "streams": sum(len(run.streams[each.name]) for each in datasets),
                "start_s": start_s,
                "spans": spans,
                "total_rows_per_s": sum(span["records"] for span in spans.values()) / (last - first),
                "memory_before": memory_before,
                "memory": memory,
                "one_record": latencies,
                "one_record_s": statistics.median(each["seconds"] for each in latencies),
            }
    finally:
        if switch is not None:
            os.environ[SWITCH_VAR] = switch
    record(bench, runs)


def with_registry(config: Config, url: str) -> Config:
    """``config`` with ``url`` as its schema registry's (unchanged without one)."""
    if not url:
        return config
    return config.model_copy(update={"schema_registry": config.schema_registry.model_copy(update={"url": url})})


def record(bench: Bench, runs: dict[int, dict]) -> None:
    """The figures of each run, in the order of ``report.METRIC_KEYS``."""
    for count, run in runs.items():
        where = f"{count} dataset{'s' if count > 1 else ''} in one driver"
        for position, name in enumerate(run["datasets"], 1):
            rate = run["spans"][name]["rows_per_s"]
            bench.add(f"datasets_{count}_{position}_rps", f"{where}: {name}, end to end", rate, "records/s")
        if count > 1:
            bench.add(
                f"datasets_{count}_total_rps",
                f"{where}: all datasets, end to end",
                run["total_rows_per_s"],
                "records/s",
            )
        first = run["datasets"][0]
        bench.add(
            f"datasets_{count}_one_record_s", f"{where}: one record of {first}, Kafka -> gold", run["one_record_s"], "s"
        )
        bench.add(f"datasets_{count}_heap_mb", f"{where}: driver heap after a GC", run["memory"]["heap_mb"], "MB")
    fewest, most = runs[min(runs)], runs[max(runs)]
    first = fewest["datasets"][0]
    bench.add(
        "datasets_first_rps_most_vs_one",
        f"{first}, records/s end to end: {max(runs)} datasets / alone",
        most["spans"][first]["rows_per_s"] / fewest["spans"][first]["rows_per_s"],
        "ratio",
    )
    bench.add(
        "datasets_one_record_most_vs_one",
        f"{first}, one record Kafka -> gold: {max(runs)} datasets / alone",
        most["one_record_s"] / fewest["one_record_s"],
        "ratio",
    )
    bench.add(
        "datasets_heap_most_vs_one",
        f"driver heap after a GC: {max(runs)} datasets / 1",
        most["memory"]["heap_mb"] / fewest["memory"]["heap_mb"],
        "ratio",
    )
    bench.details["datasets_cost"] = {
        "records_per_dataset": bench.sizes.datasets_records,
        "malformed_ratio": MALFORMED_RATIO,
        "trigger": bench.sizes.overhead_trigger,
        "runs": {str(count): run for count, run in runs.items()},
    }
