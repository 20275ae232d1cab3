"""How a stream's batch evaluates its expressions: interpreted when the batch is small, compiled when it is large.

Spark compiles Java code for each query it runs: one class per stage of whole-stage code generation
and one per projection or predicate outside them. A stream plans every batch anew, and a batch's
queries differ in their literals (offset ranges, versions, windows), so nothing is reused from one
batch to the next. For a batch of a few records that compiling is most of the work: in a profile of
one-record fused batches, compiling takes 44 % of the driver's CPU (the projections over Delta's log
actions above all). Interpreted, a one-record batch takes a quarter to a third less time (in a
profiling run: silver 1,678 -> 1,162 ms, gold 1,929 -> 1,462 ms, bronze 567 -> 433 ms, the fused
stream 5.6 -> 3.9 s). But interpreting also turns off whole-stage code generation, where a large
batch spends its time: a 1,000,000-record backlog takes silver 33 s interpreted against 21 s
compiled, gold 4.1 s against 3.1 s (benchmarks.md). So each stream sets the mode for the batch at
hand before it plans anything, from what the batch will read, known without a Spark job: its Kafka
offsets, or the size of the Delta files its micro-batch reads.

Spark's own setting, ``spark.sql.codegen.factoryMode``, internal: its suites run both modes to the
same results, and it interprets anyway when compiling fails. Set on the stream's own session (the
one Spark clones for the stream at its start), so the process's other queries keep theirs. A process
started in one of Spark's fixed modes keeps it for every batch: ``NO_CODEGEN`` interprets the large
ones too (the test suite's JVMs), ``CODEGEN_ONLY`` compiles the small ones too and fails rather than
interpret (the crash chain of tests/test_faults.py, so that the compiled path meets the crash points
with a few records).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

FACTORY_MODE = "spark.sql.codegen.factoryMode"
INTERPRETED = "NO_CODEGEN"
COMPILED = "CODEGEN_ONLY"
# Where compiling starts to pay: where the time interpreting adds per record (measured over large
# batches) reaches the time compiling adds per batch (measured over one-record batches). Each
# stream's crossover, from the figures above and benchmarks.md:
# - bronze and the fused stream, in Kafka records: bronze adds about 0.75 us a record interpreted
#   and saves 0.13 s of compiling a batch, so about 170,000; a fused batch of 100,000 records takes
#   6.8 s interpreted against 7.6 s compiled (medians, runs alternated), its many queries costing
#   more to compile. Bronze's default batch (`kafka.max_offsets_per_trigger`, 100,000) stays
#   interpreted; a larger one is compiled.
SMALL_KAFKA_BATCH = 150_000
# - silver, in bytes of the bronze files it reads: 12 us a record against 0.5 s, so about 40,000
#   records, 1.4 MB of the benchmark's bronze (35 bytes a record; real events compress less, so the
#   crossover in records comes sooner and this errs on compiling).
SMALL_BRONZE_BATCH = 1_500_000
# - gold, in bytes of the silver files it reads: 1 us a row against 0.47 s, about 470,000 rows,
#   12 MB of the benchmark's silver (25 bytes a row).
SMALL_SILVER_BATCH = 12_000_000


def evaluate_for(session: SparkSession, small: bool) -> None:
    """Interpret the expressions of the session's next queries if ``small``; else compile them, as by default.

    "As by default" is the mode the process started with (its Spark configuration), so
    a process started interpreted stays interpreted, and one started compiled-only
    (``CODEGEN_ONLY``) compiles even a small batch.

    Example::

        evaluate_for(batch.sparkSession, small=planned_bytes(batch) < SMALL_BRONZE_BATCH)
    """
    if not isinstance(session, SparkSession):
        raise TypeError(f"session must be a SparkSession, not {type(session).__name__}")
    if not isinstance(small, bool):
        raise TypeError(f"small must be a bool, not {type(small).__name__}")
    # The context's own configuration: getConf() copies every entry, one JVM call each, 13 ms a
    # batch on this path; one lookup here is 0.1 ms.
    started_with = session.sparkContext._conf.get(FACTORY_MODE, "FALLBACK")
    fixed = started_with in (INTERPRETED, COMPILED)
    session.conf.set(FACTORY_MODE, INTERPRETED if small and not fixed else started_with)


def evaluate_for_kafka_batch(session: SparkSession, records: int | None) -> None:
    """Interpret or compile the expressions of a Kafka batch's queries by its records (None: unknown, so large).

    Example::

        evaluate_for_kafka_batch(rows.sparkSession, records=1)  # interpreted
    """
    if records is not None and (not isinstance(records, int) or records < 0):
        raise ValueError(f"records must be a count (an int >= 0) or None, not {records!r}")
    evaluate_for(session, small=records is not None and records < SMALL_KAFKA_BATCH)


def evaluate_for_delta_batch(batch: DataFrame, small_bytes: int) -> None:
    """Interpret or compile the expressions of ``batch``'s queries (a Delta source's micro-batch) by its files' size.

    ``small_bytes``: the size below which the batch is small, ``SMALL_BRONZE_BATCH`` for silver's
    source, ``SMALL_SILVER_BATCH`` for gold's.

    Example::

        evaluate_for_delta_batch(bronze_batch, SMALL_BRONZE_BATCH)  # interpreted for a one-record batch
    """
    if not isinstance(small_bytes, int) or small_bytes <= 0:
        raise ValueError(f"small_bytes must be a size in bytes (an int > 0), not {small_bytes!r}")
    small = planned_bytes(batch) < small_bytes
    evaluate_for(batch.sparkSession, small=small)


def planned_bytes(batch: DataFrame) -> int:
    """The bytes of the files ``batch`` reads, as its optimized plan's statistics put them (no Spark job).

    For a Delta source's micro-batch, the sizes of the data files the batch reads, from the Delta
    log. A source without statistics (Kafka) reports Spark's default, ``spark.sql.defaultSizeInBytes``:
    larger than any threshold, so such a batch counts as large.

    Example::

        planned_bytes(bronze_batch)  # 2502 for a one-record batch of bronze
    """
    if not isinstance(batch, DataFrame):
        raise TypeError(f"batch must be a DataFrame, not {type(batch).__name__}")
    return int(str(batch._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()))
