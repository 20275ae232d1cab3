"""A dataset in Avro through a real schema registry: records written by confluent-kafka's own AvroSerializer
in three writer versions, bad ones mixed in, through bronze, silver and gold on real Delta tables; the
registry stopped while silver reads a batch of a version it has not seen, and started again; a reset; the
fused stream.

Every expectation is computed here from the records as they were produced, with none of the pipeline's code.
"""

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import fresh_topic
from test_formats_avro import ORDERS

from {{ cookiecutter.package_name }}.devtools.registry_local import LocalRegistry
from {{ cookiecutter.package_name }}.pipeline.audit.reconcile import run_audit
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, Mode
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.delta.tables import Lakehouse, with_downstream
from {{ cookiecutter.package_name }}.pipeline.formats import Format, wire
from {{ cookiecutter.package_name }}.pipeline.formats.registry import client_conf
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config
from {{ cookiecutter.package_name }}.pipeline.recovery.crash_points import CRASH_POINT_VAR, FUSED_POINTS
from {{ cookiecutter.package_name }}.pipeline.streams import reset, run_available_now, switch_mode

# The contract of test_formats_avro's records: the same orders, read here through every layer.
CONTRACT = ORDERS
BY_SHOP = Gold(
    "by_shop",
    (Aggregate(AggregateKind.COUNT), Aggregate(AggregateKind.SUM, "total"), Aggregate(AggregateKind.MAX, "quantity")),
    dimensions=("shop",),
    window="10 minutes",
)
# Named apart from any dataset a bake ships.
SALES = Dataset("avro_sales", CONTRACT, (BY_SHOP,), format=Format.AVRO)
AFTER_SILVER_COMMIT = FUSED_POINTS[1]
T0 = datetime(2024, 5, 1, 9, 0, tzinfo=UTC)


def schema(*fields: dict) -> str:
    return json.dumps({"type": "record", "name": "Sale", "namespace": "shop", "fields": list(fields)})


TOTAL = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
COMMON = [{"name": "order_id", "type": "string"}, {"name": "shop", "type": "string"}, {"name": "total", "type": TOTAL}]
# v2 adds coupon with a default and widens quantity; v3 writes microseconds and drops channel.
V1 = schema(
    *COMMON,
    {"name": "ordered_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "quantity", "type": "int"},
    {"name": "channel", "type": "string"},
)
V2 = schema(
    *COMMON,
    {"name": "ordered_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "quantity", "type": "long"},
    {"name": "channel", "type": "string"},
    {"name": "coupon", "type": ["null", "string"], "default": None},
)
V3 = schema(
    *COMMON,
    {"name": "ordered_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "quantity", "type": "long"},
    {"name": "coupon", "type": ["null", "string"], "default": None},
)


def sale(order_id: str, minutes: int, shop: str, quantity: int, total: str, **extra) -> dict:
    return {
        "order_id": order_id,
        "ordered_at": T0 + timedelta(minutes=minutes),
        "shop": shop,
        "quantity": quantity,
        "total": Decimal(total),
        **extra,
    }


class Producing:
    """Records to the topic, each also kept here as the oracle's: a valid sale, or the reason it must get."""

    def __init__(self, config, topic: str, registry_url: str):
        self.topic, self.config = topic, config
        self.client = SchemaRegistryClient(client_conf(registry_url))
        self.client.set_compatibility(f"{topic}-value", "BACKWARD")
        self.producer = Producer(client_config(config, **{"enable.idempotence": True}))
        self.sales: list[dict] = []
        self.rejected: list[str] = []

    def value(self, writer: str, record: dict) -> bytes:
        return AvroSerializer(self.client, writer)(record, SerializationContext(self.topic, MessageField.VALUE))

    def send(self, values: list[tuple[bytes | None, dict | str]]) -> None:
        """``values``: (the value, the sale it holds or the reason it must be quarantined with)."""
        for value, meant in values:
            self.producer.produce(self.topic, value)
            (self.sales if isinstance(meant, dict) else self.rejected).append(meant)
        assert self.producer.flush(30) == 0

    def expected(self) -> tuple[list, list, dict]:
        silver = sorted((s["order_id"], s["shop"], s["quantity"], s["total"], s.get("coupon")) for s in self.sales)
        by_shop: dict = defaultdict(lambda: [0, Decimal(0), 0])
        for s in self.sales:
            at = s["ordered_at"]
            row = by_shop[(at.replace(minute=at.minute - at.minute % 10), s["shop"])]
            row[0], row[1], row[2] = row[0] + 1, row[1] + s["total"], max(row[2], s["quantity"])
        return silver, sorted(self.rejected), {key: tuple(row) for key, row in by_shop.items()}


def found(spark, lakehouse: Lakehouse) -> tuple[list, list, dict]:
    def read(table):
        return spark.read.format("delta").load(lakehouse.table(table)).collect()

    silver = sorted((r.order_id, r.shop, r.quantity, r.total, r.coupon) for r in read(SALES.silver))
    quarantine = sorted(r.reason for r in read(SALES.quarantine))
    by_shop = {
        (r.window_start.astimezone(UTC), r.shop): (r.event_count, r.total_sum, r.quantity_max)
        for r in read(SALES.gold_table(BY_SHOP))
    }
    return silver, quarantine, by_shop


@pytest.fixture
def sales_topic(kafka_bootstrap) -> str:
    return fresh_topic(kafka_bootstrap, "sales")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_an_avro_dataset_is_exact_across_writer_versions_a_silent_registry_a_reset_and_a_killed_fused_batch(
    spark, config, sales_topic, tmp_path, monkeypatch
):
    registry = LocalRegistry(tmp_path / "registry")
    url = registry.start()
    monkeypatch.setenv("PIPELINE_DATASETS", SALES.name)
    schema_registry = config.schema_registry.model_copy(update={"url": url})
    config = config.model_copy(
        update={
            "dataset_sections": {"dataset_avro_sales": {"topics": [sales_topic]}},
            "schema_registry": schema_registry,
        }
    )
    lakehouse = Lakehouse(config.lakehouse_root)
    producing = Producing(config, sales_topic, url)
    v1 = producing.value(V1, {**sale("s1", 1, "north", 2, "10.00"), "channel": "web"})
    v1_id = int.from_bytes(v1[1:5], "big")
    try:
        producing.send(
            [
                (v1, sale("s1", 1, "north", 2, "10.00")),
                (
                    producing.value(V2, {**sale("s2", 3, "north", 7, "25.50"), "channel": "app", "coupon": "C"}),
                    sale("s2", 3, "north", 7, "25.50", coupon="C"),
                ),
                (
                    producing.value(V2, {**sale("s3", 14, "south", 1, "7.25"), "channel": "app"}),
                    sale("s3", 14, "south", 1, "7.25"),
                ),
                (b'{"order_id": "s4"}', wire.NOT_WIRE_FORMAT),
                (bytes([0]) + v1_id.to_bytes(4, "big") + b"\xff\xff", f"{wire.UNREADABLE}{v1_id}"),
                (
                    producing.value(V2, {**sale("s5", 4, "", 1, "1.00"), "channel": "app"}),
                    "field shop must not be empty",
                ),
            ]
        )
        run_available_now(spark, config, SALES.streams, SALES)
        assert found(spark, lakehouse) == producing.expected()

        # A third writer version, registered before the registry goes silent: a silver stream running on
        # (a process of its own) meets its id with no registry to ask. Bronze takes the batch (it reads no
        # schema); silver's batch fails naming the setting and writes nothing; a start is refused with
        # the same words; once the registry is back every record lands once.
        v3 = [
            (producing.value(V3, sale("s6", 5, "north", 3, "4.00")), sale("s6", 5, "north", 3, "4.00")),
            (
                producing.value(V3, sale("s7", 61, "south", 9, "8.00", coupon="D")),
                sale("s7", 61, "south", 9, "8.00", coupon="D"),
            ),
        ]
        before = found(spark, lakehouse)
        leases = Path(lakehouse.checkpoint(SALES.stream("silver")) + ".leases")
        taken = len(list(leases.iterdir()))
        silver_running = run_alone(config, SALES.stream("silver"), tmp_path / "silver.log")
        try:
            # Its lease taken: its start-up checks, which ask the registry, are behind it.
            deadline = time.monotonic() + 300
            while len(list(leases.iterdir())) == taken and silver_running.poll() is None:
                assert time.monotonic() < deadline, "the silver stream did not start"
                time.sleep(0.5)
            time.sleep(3)
            assert silver_running.poll() is None, (tmp_path / "silver.log").read_text()[-3000:]
            registry.stop()
            producing.send(v3)
            run_available_now(spark, config, (SALES.stream("bronze"),), SALES)
            assert silver_running.wait(timeout=300) != 0
        finally:
            silver_running.kill()
        failed = (tmp_path / "silver.log").read_text()
        # In a batch, not at the start.
        assert "schema_registry.url: the registry at http" in failed and "in write_batch" in failed, failed[-3000:]
        assert found(spark, lakehouse) == before
        with pytest.raises(ConfigError, match=r"^schema_registry\.url: the registry at http"):
            run_available_now(spark, config, (SALES.stream("silver"),), SALES)
        assert registry.start() == url
        run_available_now(spark, config, SALES.streams, SALES)
        expected = producing.expected()
        assert found(spark, lakehouse) == expected
        silver, quarantine, by_shop = expected
        assert len(silver) == 5 and len(quarantine) == 3 and by_shop[(T0, "north")] == (3, Decimal("39.50"), 7)
        assert {name: count for name, count in run_audit(spark, config, SALES).errors.items() if count} == {}

        # A reset of silver reads bronze again, each record with its writer schema: the same rows.
        reset(spark, lakehouse, with_downstream(SALES.stream("silver"), SALES), config.gold_window, SALES, config)
        assert found(spark, lakehouse) == expected

        # The fused stream reads the same format. Its first batch (an order, and a record naming an id the
        # registry never gave) dies after silver's commit, in a process of its own; the replay, in this
        # one, decodes the batch again and lands each record once, in silver or in quarantine.
        switch_mode(spark, config, Mode.FUSED, SALES)
        unknown_id = 999_999
        producing.send(
            [
                (producing.value(V3, sale("s8", 6, "north", 4, "2.50")), sale("s8", 6, "north", 4, "2.50")),
                (bytes([0]) + unknown_id.to_bytes(4, "big") + b"\x02", f"{wire.UNKNOWN_SCHEMA}{unknown_id}"),
            ]
        )
        crash = f"{SALES.stream('fused')}:{AFTER_SILVER_COMMIT}:0"
        killed = run_alone(config, SALES.stream("fused"), tmp_path / "fused.log", crash=crash)
        assert killed.wait(timeout=600) == -signal.SIGKILL, (tmp_path / "fused.log").read_text()[-3000:]
        assert f"crash point {crash}: killing the driver" in (tmp_path / "fused.log").read_text()
        run_available_now(spark, config, (SALES.stream("fused"),), SALES)
        assert found(spark, lakehouse) == producing.expected()
        assert {name: count for name, count in run_audit(spark, config, SALES).errors.items() if count} == {}

        # A producer's newest schema the contract cannot read stops the stream at its start, naming it.
        producing.client.set_compatibility(f"{sales_topic}-value", "NONE")
        text_time = schema(*COMMON, {"name": "ordered_at", "type": "string"}, {"name": "quantity", "type": "long"})
        producing.value(text_time, {**sale("s9", 7, "north", 1, "1.00"), "ordered_at": "2024-05-01T09:07:00Z"})
        with pytest.raises(ConfigError, match=rf"dataset avro_sales: the latest schema of subject {sales_topic}-value"):
            run_available_now(spark, config, (SALES.stream("fused"),), SALES)
    finally:
        registry.stop()


# One stream of SALES running on (not availableNow) in a process of its own.
STREAM_ALONE = """
import sys
sys.path.insert(0, sys.argv[1])
from test_avro_dataset import SALES
from {{ cookiecutter.package_name }}.cli.connect import spark_session
from {{ cookiecutter.package_name }}.pipeline.config import load_config
from {{ cookiecutter.package_name }}.pipeline.egress import configure
from {{ cookiecutter.package_name }}.pipeline.streams import start_stream
config = configure(load_config("local"))
config = config.model_copy(update={"dataset_sections": {"dataset_avro_sales": {"topics": [sys.argv[3]]}}})
spark = spark_session(config, sys.argv[2])
start_stream(spark, config, sys.argv[2], available_now=False, dataset=SALES).awaitTermination()
"""


def run_alone(config, stream: str, log: Path, crash: str | None = None) -> subprocess.Popen:
    """``stream`` of SALES running on in a process of its own, its output in ``log``; killed at the
    crash point ``crash``, if one is given."""
    [topic] = config.dataset_sections["dataset_avro_sales"]["topics"]
    environ = {
        "KAFKA_BOOTSTRAP_SERVERS": config.kafka.bootstrap_servers,
        "LAKEHOUSE_ROOT": config.lakehouse_root,
        "SCHEMA_REGISTRY_URL": config.schema_registry.url,
        "PIPELINE_DOWNSTREAM_TRIGGER_INTERVAL": "1 second",
        **({CRASH_POINT_VAR: crash} if crash else {}),
    }
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-c", STREAM_ALONE, str(Path(__file__).parent), stream, topic],
            env={**os.environ, **environ},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
