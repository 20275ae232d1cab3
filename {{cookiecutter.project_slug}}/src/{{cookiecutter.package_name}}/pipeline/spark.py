"""The one place a SparkSession is built: Delta Lake plus the Kafka connector (and S3A for a lakehouse on S3)."""

from __future__ import annotations

import os
import sys

import pyspark
from delta import configure_spark_with_delta_pip
from pyspark.sql import SparkSession

# The connector must match the running Spark exactly; taking the version from the
# installed pyspark makes a mismatch impossible.
KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def build_spark(
    app_name: str,
    master: str | None = "local[2]",
    shuffle_partitions: int = 4,
    ui_enabled: bool = False,
    extra_conf: dict[str, str] | None = None,
    extra_packages: list[str] | None = None,
) -> SparkSession:
    """The session (or the one already running in this process), with ``extra_conf`` and ``extra_packages``.

    A lakehouse on S3 needs both: see ``pipeline.s3.session_options``.

    Example::

        spark = build_spark("tests", master="local[2]", shuffle_partitions=2)
    """
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.ui.enabled", str(ui_enabled).lower())
        # The CLI reports progress itself; Spark's stage bar rewrites the same stderr line
        # and runs into the summaries and tables printed after it.
        .config("spark.ui.showConsoleProgress", "false")
        # Windows and event times are compared in UTC whatever the machine's zone.
        .config("spark.sql.session.timeZone", "UTC")
        # Small local tables: fewer tasks per Delta snapshot read.
        .config("spark.databricks.delta.snapshotPartitions", str(max(shuffle_partitions, 2)))
        # Gold rebuilt from silver at version V goes on at V + 1, which may not exist yet: Delta
        # then waits for it instead of refusing (the only check this setting relaxes for a stream).
        .config("spark.databricks.delta.changeDataFeed.timestampOutOfRange.enabled", "true")
    )
    if master:
        builder = builder.master(master)
    # Python on the executors (the PostgreSQL egress stages rows there) is this interpreter, with the
    # project and its drivers installed, not the first python3 on the PATH; PySpark reads only this.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    # configure_spark_with_delta_pip overwrites spark.jars.packages: never set it above.
    packages = [KAFKA_CONNECTOR, *(extra_packages or [])]
    return configure_spark_with_delta_pip(builder, extra_packages=packages).getOrCreate()
