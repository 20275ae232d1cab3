"""How a stream's batch evaluates its expressions: interpreted when the batch is small, compiled when it is large.

Spark compiles Java code for each query it runs: one class per stage of whole-stage code generation
and one per projection or predicate outside them. A stream plans every batch anew, and a batch's
queries differ in their literals (offset ranges, versions, windows), so nothing is reused from one
batch to the next. For a batch of a few records that compiling is most of the work: in a profile of
one-record fused batches it was 44 % of the driver's CPU (the projections over Delta's log actions
above all). Interpreted, one-record batches took a quarter to a third less time: silver 1,678 ->
1,162 ms, gold 1,929 -> 1,462 ms, bronze 567 -> 433 ms, the fused stream 3.9 s for 5.6 s in a
profiling run. But interpreting also turns off whole-stage code generation, where a large batch
spends its time: a 1,000,000-record backlog took silver 33 s against 21 s compiled, gold 4.1 s
against 3.1 s (benchmarks.md). So each stream sets the mode for the batch at hand before it plans
anything, from what the batch will read, known without a Spark job: its Kafka offsets, or the size
of the Delta files its micro-batch reads.

Spark's own setting, ``spark.sql.codegen.factoryMode``, internal: its suites run both modes to the
same results, and it interprets anyway when compiling fails. Set on the stream's own session (the
one Spark clones for the stream at its start), so the process's other queries keep theirs.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

FACTORY_MODE = "spark.sql.codegen.factoryMode"
INTERPRETED = "NO_CODEGEN"
# Where compiling starts to pay, from the figures above: compiling costs a batch about half a
# second; interpreting costs silver about 12 us a record more, gold about 1 us a row. Silver breaks
# even near 40,000 records; gold's smaller batches gain either way.
SMALL_BATCH_RECORDS = 40_000
# The same for a Delta source, in bytes of the files it reads: the benchmark's bronze holds about
# 35 bytes a record, its silver about 25 a row; real events compress less, so this errs on compiling.
SMALL_BATCH_BYTES = 1_500_000


def evaluate_for(session: SparkSession, small: bool) -> None:
    """Interpret the expressions of the session's next queries if ``small``; else compile them, as by default.

    "As by default" is the mode the process started with (its Spark configuration), so
    a process started interpreted stays interpreted.

    Example::

        evaluate_for(batch.sparkSession, small=planned_bytes(batch) < SMALL_BATCH_BYTES)
    """
    if not isinstance(session, SparkSession):
        raise TypeError(f"session must be a SparkSession, not {type(session).__name__}")
    if not isinstance(small, bool):
        raise TypeError(f"small must be a bool, not {type(small).__name__}")
    started_with = session.sparkContext.getConf().get(FACTORY_MODE, "FALLBACK")
    session.conf.set(FACTORY_MODE, INTERPRETED if small else started_with)


def evaluate_for_delta_batch(batch: DataFrame) -> None:
    """Interpret or compile the expressions of ``batch``'s queries (a Delta source's micro-batch) by its files' size.

    Example::

        evaluate_for_delta_batch(bronze_batch)  # interpreted for a one-record batch
    """
    small = planned_bytes(batch) < SMALL_BATCH_BYTES
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
