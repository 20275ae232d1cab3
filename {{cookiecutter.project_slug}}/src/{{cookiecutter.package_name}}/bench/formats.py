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
  wire format checked, no resolution, no quarantine;
* JSON with ten expectations: silver's ``parse_records`` of the JSON with ten expectations every record
  meets (``ten_expectations``), against the JSON parse without: what a team's rules cost silver.
"""

from __future__ import annotations

import dataclasses
import io
import json
import statistics
import time
from datetime import datetime
from decimal import Decimal

from ..devtools.sample import contract_records
from ..pipeline.contract import Kind
from ..pipeline.datasets import DATASETS
from ..pipeline.expectations import Expectation, condition, in_range, matches, not_after, not_null
from ..pipeline.formats import Format, wire
from ..pipeline.formats.avro import reader_schema
from ..pipeline.formats.registry import WriterSchemas, client_conf
from .harness import Bench, say

WAYS = ("json", "avro", "plain_avro", "json_ten_expectations")
# Beyond any value a sample record's number field holds (the contract's precision is at most 38 digits).
NUMBER_BOUND = 10**18


def ten_expectations(contract) -> tuple[Expectation, ...]:
    """Ten expectations over ``contract``'s fields that every valid record drawn from it meets, of the kinds
    a team declares: a pattern for each string (Java regex), a range for each number, an event time not
    far ahead of Kafka's, then each field present, then conditions, until there are ten.

    Example::

        ten_expectations(DATASETS[0].contract)  # (matches("event_id_shape", ...), ...)
    """
    by_kind = []
    for field in contract.fields:
        if field.kind is Kind.STRING:
            by_kind.append(matches(f"{field.name}_shape", field.name, r"^[^\x00]+$"))
        elif field.kind is Kind.TIMESTAMP:
            by_kind.append(not_after(f"{field.name}_not_ahead", field.name, "3650 days"))
        elif field.kind in (Kind.DECIMAL, Kind.INTEGER, Kind.LONG):
            by_kind.append(in_range(f"{field.name}_bounded", field.name, -NUMBER_BOUND, NUMBER_BOUND))
    present = [not_null(f"{field.name}_present", field.name) for field in contract.fields]
    first = contract.fields[0].name
    padding = [
        condition(f"rule_{number}", f"length(cast({first} AS STRING)) + {number} > 0") for number in range(1, 11)
    ]
    return tuple([*by_kind, *present, *padding][:10])


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
    ruled_dataset = dataclasses.replace(dataset, format=Format.JSON, expectations=ten_expectations(dataset.contract))
    url = bench.registry_url()
    schema = reader_schema(dataset.contract)
    writer_text = json.dumps(schema)
    schema_id = SchemaRegistryClient(client_conf(url)).register_schema(
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
        # Kafka's timestamp, which an expectation may read: a minute before now, as a recent record's.
        frame = frame.withColumn("timestamp", F.current_timestamp() - F.expr("INTERVAL 1 MINUTE"))
        frame.repartition(2).write.mode("overwrite").parquet(paths[name])
    del rows
    writers = WriterSchemas(url)
    body = wire.body(F.col("value"))

    def run(way: str) -> float:
        source = spark.read.parquet(paths["json" if way.startswith("json") else "avro"])
        started = time.perf_counter()
        if way == "json":
            parsed = parse_events(source, dataset.contract)
        elif way == "json_ten_expectations":
            parsed = parse_records(source, ruled_dataset)
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
    bench.add(
        "expectations_ten_vs_none",
        "silver parse, JSON: with ten expectations / without (records/s)",
        rates["json_ten_expectations"] / rates["json"],
        "ratio",
    )
    bench.details["formats"] = {"records": sizes.format_records, "seconds": seconds, "schema_id": schema_id}
