"""The egresses against what a team would write instead: rows per second, and the cost of a batch.

Each egress this project has publishes a gold table of the phase's own, built the way the gold scaling
phase builds one: a small first version (each stream's first batch, gold's snapshot, which also warms
the JIT), then a version of ``sizes.egress_rows`` rows (a rebuild or a backfill arriving), published in
one batch, then ``sizes.overhead_repeats`` versions of one new row each, one batch each.
The same change feed goes, on the same Spark and the same servers, through what a team would write
without this project, at-least-once, into a sink of its own:

* Kafka: ``foreachBatch`` of gold's change feed into Spark's Kafka writer (``df.write.format("kafka")``):
  no transaction, no marker, no stream id header; a replayed batch is published twice;
* PostgreSQL: ``foreachBatch`` into Spark's JDBC writer (``df.write.jdbc``, append): no staging table,
  no marker row, no upsert; a replayed batch is inserted twice.

The ratios are the egress's batch time over the baseline's in one run: what exactly-once costs on the
way out. The baselines get the change rows as Delta gives them; each egress folds them to one row per
key first (``latest_per_window``), which it needs to stay exact.
"""

from __future__ import annotations

import importlib
import statistics
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from pyspark.sql.streaming import StreamingQuery

from ..devtools.chaos import KAFKA_EGRESS, POSTGRES_EGRESS
from ..devtools.sample import EVENT_TYPES
from ..pipeline.config import Config
from ..pipeline.datasets.events import DATASET as EVENTS_DATASET
from ..pipeline.datasets.events import EVENTS
from ..pipeline.delta.tables import GOLD, Lakehouse, ensure_tables
from ..pipeline.egress import configure, installed_names
from ..pipeline.kafka.clients import bootstrap_servers, spark_security_options
from ..pipeline.streams import start_stream
from .gold_scaling import gold_rows
from .harness import Bench, await_query, batches, progress_of, say

ROWS_PER_FILE = 50_000
# Gold's first version, published before anything is measured: one row per event type of each window.
WARM_UP_WINDOWS = 25


def measure(bench: Bench) -> None:
    """Each egress and its baseline over one gold: a version of many rows in one batch, then one-row batches."""
    names = installed_names()
    if not names:
        return
    say(f"egress: {', '.join(names)} against Spark's own writers")
    root = bench.work / "egress"
    with ExitStack() as servers:
        config, sinks = _phase_config(bench, root, servers)
        lakehouse = Lakehouse(config.lakehouse_root)
        ensure_tables(bench.spark, lakehouse, change_feed=EVENTS_DATASET.golds[:1])
        gold = lakehouse.table(GOLD)

        def add_version(first_window: int, end_window: int, files: int = 1, limit: int | None = None) -> None:
            rows = gold_rows(bench, first_window, end_window, files)
            (rows if limit is None else rows.limit(limit)).write.format("delta").mode("append").save(gold)

        runners = {}
        for name in names:
            runners[name] = lambda name=name: start_stream(bench.spark, config, name, available_now=True)
            runners[f"{name}_baseline"] = _baseline(bench, config, name, gold, sinks, root)
        # A first version for every stream's first batch (gold's snapshot) and the JIT: the version measured
        # next is the same batch for every runner, whichever runs first.
        add_version(0, WARM_UP_WINDOWS)
        for start in runners.values():
            _run(bench, start)
        windows = -(-bench.sizes.egress_rows // len(EVENT_TYPES))
        rows = windows * len(EVENT_TYPES)
        files = max(1, rows // ROWS_PER_FILE)
        add_version(WARM_UP_WINDOWS, WARM_UP_WINDOWS + windows, files)
        bulk = {runner: _run(bench, start) for runner, start in runners.items()}
        one_row: dict[str, list[float]] = {runner: [] for runner in runners}
        for repeat in range(bench.sizes.overhead_repeats):
            window = WARM_UP_WINDOWS + windows + repeat
            add_version(window, window + 1, limit=1)
            for runner, start in runners.items():
                one_row[runner].append(_run(bench, start)["batch_ms"])
    details = {"gold_rows": rows, "gold_files": files, "bulk": bulk, "one_row_batch_ms": one_row}
    for name in names:
        own, baseline = bulk[name], bulk[f"{name}_baseline"]
        what = "Kafka" if name == KAFKA_EGRESS else "PostgreSQL"
        writer = "Spark's Kafka writer" if name == KAFKA_EGRESS else "Spark's JDBC writer"
        bench.add(
            f"{name}_rows_per_s", f"{what} egress, a gold version of {rows:,} rows", rows / own["batch_s"], "rows/s"
        )
        bench.add(f"{name}_baseline_rows_per_s", f"{writer}, same rows", rows / baseline["batch_s"], "rows/s")
        bench.add(
            f"{name}_bulk_cost",
            f"{what} egress / {writer} (that version)",
            own["batch_s"] / baseline["batch_s"],
            "ratio",
        )
        own_ms = statistics.median(one_row[name])
        baseline_ms = statistics.median(one_row[f"{name}_baseline"])
        bench.add(f"{name}_one_row_batch_ms", f"{what} egress, one-row batch", own_ms, "ms")
        bench.add(f"{name}_baseline_one_row_batch_ms", f"{writer}, one-row batch", baseline_ms, "ms")
        bench.add(f"{name}_batch_cost", f"{what} egress / {writer} (one-row batch)", own_ms / baseline_ms, "ratio")
    bench.details["egress"] = details


def _run(bench: Bench, start: Callable[[], StreamingQuery]) -> dict:
    """One availableNow run of a started query to its end: the time its batches took."""
    started = time.perf_counter()
    query = start()
    await_query(query, bench.sizes.timeout_s)
    ran = batches(progress_of(query))
    batch_ms = sum(progress["durationMs"].get("triggerExecution", 0) for progress in ran)
    return {
        "batches": len(ran),
        "batch_ms": batch_ms,
        "batch_s": batch_ms / 1000,
        "wall_s": time.perf_counter() - started,
    }


def _phase_config(bench: Bench, root: Path, servers: ExitStack) -> tuple[Config, dict]:
    """The phase's config, every installed egress on with a sink of its own, and the baselines' sinks."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from ..pipeline.kafka.clients import client_config

    run = uuid.uuid4().hex[:8]
    base = bench.phase_config(root, f"bench-egress-{run}")
    sections, sinks = {}, {}
    names = installed_names()
    if KAFKA_EGRESS in names:
        admin = AdminClient(client_config(base))
        topics = {"egress": f"bench-egress-{run}", "baseline": f"bench-egress-baseline-{run}"}
        new = [
            NewTopic(topic, num_partitions=bench.sizes.partitions, config={"cleanup.policy": "compact"})
            for topic in topics.values()
        ]
        for future in admin.create_topics(new).values():
            future.result(timeout=30)
        bench.topics.extend(topics.values())
        sections["egress_kafka"] = {"topic": topics["egress"]}
        sinks[KAFKA_EGRESS] = topics["baseline"]
    if POSTGRES_EGRESS in names:
        # Imported by name: a bake without the PostgreSQL egress has no such module (and never gets here).
        postgres_local = importlib.import_module(f"{__package__.rpartition('.')[0]}.devtools.postgres_local")
        server = postgres_local.LocalPostgres(bench.work / "postgres")
        dsn = server.start()
        servers.callback(server.stop)
        sections["egress_postgres"] = {
            "dsn": dsn,
            "table": f"bench_gold_{run}",
            "password_file": str(server.password_file),
        }
        sinks[POSTGRES_EGRESS] = {"dsn": dsn, "password": server.password_file.read_text().strip()}
    # No environment: the user's PIPELINE_EGRESS or EGRESS_* variables do not reach the phase's sinks.
    config = configure(base.model_copy(update={"egress_sections": sections}), environ={})
    return config, sinks


def _baseline(bench: Bench, config: Config, name: str, gold: str, sinks: dict, root: Path):
    """What a team writes without this project: gold's change feed through Spark's own writer, at-least-once."""
    from pyspark.sql import functions as F

    spark = bench.spark
    checkpoint = str(root / "baseline-checkpoints" / name)
    key = list(EVENTS.gold_key)
    if name == KAFKA_EGRESS:
        options = {"kafka.bootstrap.servers": bootstrap_servers(config), **spark_security_options(config)}
        topic = sinks[KAFKA_EGRESS]

        def write(changes, batch_id: int) -> None:
            rows = changes.select(
                F.to_json(F.struct(*key)).alias("key"),
                F.to_json(F.struct(*[column for column in changes.columns if not column.startswith("_")])).alias(
                    "value"
                ),
            )
            rows.write.format("kafka").options(**options).option("topic", topic).save()

    else:
        sink = sinks[POSTGRES_EGRESS]
        parts = dict(part.split("=", 1) for part in sink["dsn"].split())
        url = f"jdbc:postgresql://{parts['host']}:{parts['port']}/{parts['dbname']}"
        properties = {"user": parts["user"], "password": sink["password"], "driver": "org.postgresql.Driver"}
        table = f"bench_baseline_{uuid.uuid4().hex[:8]}"

        def write(changes, batch_id: int) -> None:
            rows = changes.select(*[column for column in changes.columns if not column.startswith("_")])
            rows.write.jdbc(url, table, mode="append", properties=properties)

    def start():
        changes = spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 0)
        return (
            changes.load(gold)
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    return start
