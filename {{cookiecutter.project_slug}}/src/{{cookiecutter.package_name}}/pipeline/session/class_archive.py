"""A class-data archive for the Spark driver JVM: the same process starts in about 4 seconds less.

A Spark driver loads some 15,000 classes from pyspark's jars before its first query, and the JVM
parses and verifies each one on every start. Java's application class-data sharing (AppCDS, JDK 13
and later) keeps them, already parsed, in an archive file that a JVM maps at start-up. On 2 cores,
a session start and a small query take 6.4 s with it against 10.4 s without, 9 CPU-seconds against 14.
Every CLI command, stream process and test session pays that start.

``setup`` (``make install``) writes the archive once per installation into the user's cache directory,
from a child process that runs a small Delta and streaming workload and dumps what it loaded when its
JVM exits (``-XX:ArchiveClassesAtExit``). ``build_spark`` then starts the driver with it
(``-XX:SharedArchiveFile``) when the file exists (``spark.py`` says where it lives and when a driver
uses it). The file's name carries a key of the Java runtime
and pyspark's jars, so a new JDK or pyspark simply finds no archive until ``setup`` runs again; a JVM
that cannot use an archive (another classpath, other JVM flags) ignores it and starts without it.

Only a driver this process launches itself gets the archive (not one started by spark-submit, whose
JVM is already running): executors on a cluster are not affected.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .spark import DRIVER_JAVA_OPTIONS, archive_dir, archive_name, build_spark


def write_archive(cache_dir: Path | None = None, timeout_s: float = 600.0) -> Path:
    """Write the archive for this runtime (replacing an older one) and return its path.

    A child Python process starts a Spark session, runs the workload, and stops its JVM, which
    writes the classes it loaded; the file is moved into place whole, so a driver starting meanwhile
    sees the old archive or the new one, never half of one. An archive this installation had for an
    older runtime is removed.

    Example::

        path = write_archive()
    """
    directory = archive_dir(cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="class-archive-") as workdir:
        dump = Path(workdir) / "driver.jsa"
        child = subprocess.run(
            [sys.executable, "-m", __name__, str(dump), workdir],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if child.returncode != 0 or not dump.is_file():
            raise RuntimeError(
                f"writing the Spark driver's class archive failed (exit {child.returncode}):\n"
                f"{(child.stdout + child.stderr)[-3000:]}"
            )
        target = directory / archive_name(dump.stat().st_size)
        # Copied beside the target first (the cache may be on another file system), then renamed.
        staged = directory / f".{target.name}.{os.getpid()}.tmp"
        shutil.copyfile(dump, staged)
        os.replace(staged, target)
    for stale in directory.glob("driver-*.jsa"):
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def _exercise(spark, workdir: Path) -> None:
    """A small run of what the pipeline does, so that the classes it needs are the ones archived."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    table = str(workdir / "table")
    rows = spark.range(200).select(
        F.col("id"),
        (F.col("id") % 7).cast("string").alias("page"),
        F.timestamp_seconds(F.col("id") * 30).alias("event_time"),
        F.to_json(F.struct(F.col("id").alias("n"))).alias("payload"),
    )
    rows.write.format("delta").option("txnAppId", "archive").option("txnVersion", 0).save(table)
    parsed = rows.select("id", "page", "event_time", F.from_json("payload", "n BIGINT").alias("body"))
    windows = parsed.groupBy(F.window("event_time", "5 minutes"), "page").agg(F.count("*").alias("events"))
    windows.collect()
    target = DeltaTable.forPath(spark, table)
    target.alias("t").merge(rows.alias("s"), "t.id = s.id").whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()
    target.history().collect()
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')")

    def each_batch(batch, batch_id):
        batch.dropDuplicates(["id"]).count()

    query = (
        spark.readStream.format("delta")
        .load(table)
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # Planned only, never started: the Kafka source's classes, without a broker.
    kafka = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "localhost:9")
    assert kafka.option("subscribe", "archive").load().isStreaming


def _main(dump: str, workdir: str) -> None:
    from pyspark import SparkContext

    spark = build_spark(
        "class-archive",
        master="local[2]",
        shuffle_partitions=2,
        extra_conf={DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={dump}"},
    )
    _exercise(spark, Path(workdir))
    spark.stop()
    # The JVM writes the archive when it exits normally: the gateway exits once its stdin closes.
    gateway = SparkContext._gateway
    gateway.shutdown()
    process = gateway.proc
    process.stdin.close()
    if process.wait(timeout=300) != 0:
        sys.exit(f"the driver JVM exited with {process.returncode} while writing {dump}")


if __name__ == "__main__":
    _main(*sys.argv[1:3])
