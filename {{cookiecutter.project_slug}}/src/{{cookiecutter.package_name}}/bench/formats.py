"""What reading Avro costs silver: the same records parsed from JSON, from Avro in the Confluent wire format
through the registry, and with a plain ``from_avro`` of one fixed schema.

The records are the first dataset's, drawn from its contract (``devtools.sample.contract_records``), all
valid. Each is written twice: as the JSON the sample producer sends, and as Avro in the wire format (the
contract's reader schema as the writer's, registered in a private registry, the body written by fastavro
behind the magic byte and the id). Both sets are saved as bronze-shaped tables once; each run reads one
back and parses it to Spark's no-op sink, the three ways in turn, ``Sizes.format_repeats`` times:

* JSON: silver's own ``parse_events`` (a VARIANT, every field read and checked);
* Avro: silver's own ``parse_records``: the batch's schema ids asked of the registry (a small job), each
  record read with its writer schema resolved into the contract, then the rules on values;
* plain Avro: ``from_avro`` of the body with the one schema, as a user without a registry writes it: no
  wire format checked, no resolution, no quarantine.
"""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
import time
from datetime import datetime
from decimal import Decimal

from ..devtools.registry_local import LocalRegistry
from ..devtools.sample import contract_records
from ..pipeline.contract import Kind
from ..pipeline.datasets import DATASETS
from ..pipeline.formats import Format, wire
from ..pipeline.formats.avro import reader_schema
from ..pipeline.formats.registry import WriterSchemas
from .harness import Bench, say

WAYS = ("json", "avro", "plain_avro")


def avro_record(contract, value: bytes) -> dict:
    """A sample record's JSON value as the Python values fastavro writes for the contract's reader schema."""
    body = json.loads(value, parse_float=Decimal)
    record = {}
    for field in contract.fields:
        found = body.get(field.name)
        if found is not None and field.kind is Kind.TIMESTAMP:
            found = datetime.fromisoformat(found.replace("Z", "+00:00"))
        elif found is not None and field.kind is Kind.DECIMAL:
            found = Decimal(str(found))
        record[field.name] = found
    return record


def measure(bench: Bench) -> None:
    import fastavro
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from ..pipeline.silver import parse_events, parse_records

    spark, sizes = bench.spark, bench.sizes
    dataset = DATASETS[0]
    avro_dataset = dataclasses.replace(dataset, format=Format.AVRO)
    registry = LocalRegistry(bench.work / "registry")
    url = registry.start()
    try:
        schema = reader_schema(dataset.contract)
        writer_text = json.dumps(schema)
        schema_id = SchemaRegistryClient({"url": url}).register_schema(
            "bench-formats-value", Schema(writer_text, "AVRO")
        )
        parsed_schema = fastavro.parse_schema(schema)
        header = bytes([0]) + schema_id.to_bytes(4, "big")
        say(f"formats: writing {sizes.format_records:,} records as JSON and as Avro")
        rows = {"json": [], "avro": []}
        for offset, (_, value) in enumerate(contract_records(dataset, sizes.format_records, prefix="fmt")):
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed_schema, avro_record(dataset.contract, value))
            rows["json"].append(("bench-formats", 0, offset, value))
            rows["avro"].append(("bench-formats", 0, offset, header + out.getvalue()))
        paths = {}
        for name, values in rows.items():
            paths[name] = str(bench.work / f"formats-{name}")
            frame = spark.createDataFrame(values, "topic string, partition int, offset long, value binary")
            frame.repartition(2).write.mode("overwrite").parquet(paths[name])
        del rows
        writers = WriterSchemas(url)
        body = wire.body(F.col("value"))

        def run(way: str) -> float:
            source = spark.read.parquet(paths["json" if way == "json" else "avro"])
            started = time.perf_counter()
            if way == "json":
                parsed = parse_events(source, dataset.contract)
            elif way == "avro":
                parsed = parse_records(source, avro_dataset, writers)
            else:
                parsed = source.select(from_avro(body, writer_text).alias("record")).select("record.*")
            parsed.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        for repeat in range(sizes.format_repeats):
            for way in WAYS:  # interleaved, so drift on a shared machine hits each alike
                say(f"formats: {way} parse of {sizes.format_records:,} records ({repeat + 1}/{sizes.format_repeats})")
                seconds[way].append(run(way))
    finally:
        registry.stop()
    rates = {way: sizes.format_records / statistics.median(runs) for way, runs in seconds.items()}
    bench.add("format_json_rps", "silver parse, JSON", rates["json"], "records/s")
    bench.add("format_avro_rps", "silver parse, Avro through the registry", rates["avro"], "records/s")
    bench.add("format_plain_avro_rps", "plain from_avro, one fixed schema", rates["plain_avro"], "records/s")
    bench.add("format_avro_vs_json", "Avro / JSON silver parse (records/s)", rates["avro"] / rates["json"], "ratio")
    bench.add(
        "format_avro_vs_plain",
        "Avro through the registry / plain from_avro (records/s)",
        rates["avro"] / rates["plain_avro"],
        "ratio",
    )
    bench.details["formats"] = {"records": sizes.format_records, "seconds": seconds, "schema_id": schema_id}
