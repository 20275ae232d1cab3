"""The one place a SparkSession is built: Delta Lake plus the Kafka connector (and S3A for a lakehouse on S3).

The driver JVM starts from a class-data archive when ``setup`` wrote one (``class_archive.py`` writes
it; here is where it lives and when a driver uses it). And it starts from the jar files that the
first start resolved its packages to: spark-submit otherwise runs Ivy at every start (a second of CPU
on a busy machine) to find the same files again (``resolved_jars``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

import pyspark
from delta import configure_spark_with_delta_pip
from py4j.java_gateway import JavaClass
from pyspark import SparkContext
from pyspark.sql import SparkSession

# The connector must match the running Spark exactly; taking the version from the
# installed pyspark makes a mismatch impossible.
KAFKA_CONNECTOR = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"
# from_avro, for datasets in Avro (formats/avro.py); Avro itself is one of pyspark's own jars.
AVRO_CONNECTOR = f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"

# Dependencies of the packages (Delta, the Kafka and Avro connectors, S3A and the AWS SDK) that pyspark's own
# jars already hold, most at another version. Spark loads its own copy first, so a resolved one is
# never used, yet Spark copies every package jar into each process's work directory and ships it to
# every executor: about 78 MB per process (83 MB with S3), 0.9 s of each start. tests/test_s3.py
# fails when a new duplicate appears.
PROVIDED_BY_SPARK = (
    "at.yawk.lz4:lz4-java",
    "com.fasterxml.jackson.core:jackson-annotations",
    "com.fasterxml.jackson.core:jackson-core",
    "com.fasterxml.jackson.core:jackson-databind",
    "com.github.luben:zstd-jni",
    "com.google.code.findbugs:jsr305",
    "commons-codec:commons-codec",
    "commons-pool:commons-pool",
    "io.airlift:aircompressor",
    *(
        f"io.netty:netty-{module}"
        for module in (
            "buffer",
            "codec",
            "codec-http",
            "codec-http2",
            "common",
            "handler",
            "resolver",
            "transport",
            "transport-classes-epoll",
            "transport-native-unix-common",
        )
    ),
    "org.apache.httpcomponents:httpclient",
    "org.apache.httpcomponents:httpcore",
    "org.apache.hadoop:hadoop-client-api",
    "org.apache.hadoop:hadoop-client-runtime",
    "org.apache.logging.log4j:log4j-api",
    "org.apache.logging.log4j:log4j-core",
    "org.apache.logging.log4j:log4j-slf4j2-impl",
    "org.apache.parquet:parquet-column",
    "org.apache.parquet:parquet-common",
    "org.apache.parquet:parquet-encoding",
    "org.apache.parquet:parquet-format-structures",
    "org.apache.parquet:parquet-hadoop",
    "org.apache.parquet:parquet-jackson",
    "org.locationtech.jts:jts-core",
    "org.roaringbitmap:RoaringBitmap",
    "org.scala-lang.modules:scala-parallel-collections_2.13",
    "org.slf4j:slf4j-api",
    "org.tukaani:xz",
    "org.xerial.snappy:snappy-java",
)
JAR_EXCLUDES = "spark.jars.excludes"
JARS = "spark.jars"
# Settings that change what Ivy resolves packages to: part of a resolved list's key.
_RESOLUTION_SETTINGS = ("spark.jars.repositories", "spark.jars.ivy", "spark.jars.ivySettings")
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"
# The JVM prints one warning line when it cannot use an archive (written for another JVM build or
# classpath) and starts without it: that is the intended fallback, not worth a line in a command's output.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_dir(cache_dir: Path | None = None) -> Path:
    """The directory of this pyspark installation's class-data archive, in the user's cache.

    One directory per installation (a JVM checks the paths of the jars an archive was written from):
    two virtual environments on one machine each keep their own.

    Example::

        archive_dir()  # ~/.cache/lakehouse-spark/5d41402abc4b
    """
    if cache_dir is not None and not isinstance(cache_dir, (str, Path)):
        raise TypeError(f"cache_dir must be a path, not {type(cache_dir).__name__}")
    base = Path(cache_dir or os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    installation = hashlib.sha256(str(_pyspark_jars().resolve()).encode()).hexdigest()[:12]
    return base / "lakehouse-spark" / installation


def archive_name(size: int) -> str:
    """An archive's file name: the runtime it was written for and its size in bytes.

    The size is in the name because a JVM that maps a truncated archive (a disk that filled up, a
    copy cut short) dies with SIGBUS before it can fall back: a file of another size is never used.

    Example::

        archive_name(203_976_704)  # "driver-036c44b5ee935bc6-203976704.jsa"
    """
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"size must be a positive number of bytes, not {size!r}")
    return f"driver-{_runtime_key()}-{size}.jsa"


def archive_path(cache_dir: Path | None = None) -> Path | None:
    """This runtime's archive, whole, or None when ``setup`` has not written one for it.

    Example::

        archive_path()  # ~/.cache/lakehouse-spark/5d41402abc4b/driver-036c...-203976704.jsa, or None
    """
    directory = archive_dir(cache_dir)
    for candidate in sorted(directory.glob(f"driver-{_runtime_key()}-*.jsa")):
        size = candidate.stem.rpartition("-")[2]
        if size.isdigit() and candidate.stat().st_size == int(size):
            return candidate
    return None


def driver_java_options(extra_conf: dict[str, str] | None = None, cache_dir: Path | None = None) -> str | None:
    """The driver's Java options with the archive added, or None when the driver should start as is.

    None when no archive was written for this runtime, when spark-submit started the driver JVM
    already (pyspark inside spark-submit), when the given options already choose class-data sharing,
    or when a ``spark-defaults.conf`` sets the driver's Java options (a builder value would replace
    them).

    Example::

        options = driver_java_options({"spark.driver.extraJavaOptions": "-Dlog4j.debug"})
    """
    if extra_conf is not None and not isinstance(extra_conf, dict):
        raise TypeError(f"extra_conf must be a dict of Spark settings, not {type(extra_conf).__name__}")
    conf = dict(extra_conf or {})
    archive = archive_path(cache_dir)
    if archive is None:
        return None
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        return None
    given = conf.get(DRIVER_JAVA_OPTIONS, "")
    if any(option in given for option in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")):
        return None
    if DRIVER_JAVA_OPTIONS in _spark_defaults():
        return None
    return " ".join(filter(None, [given, f"-XX:SharedArchiveFile={archive}", _QUIET]))


def resolved_jars_path(packages: list[str], conf: dict[str, str], cache_dir: Path | None = None) -> Path:
    """Where the jar files that ``packages`` resolve to under ``conf`` are listed, beside the archive.

    Keyed by Delta's version, the packages and every setting that changes the resolution (excludes,
    repositories, Ivy's settings): another list of packages is resolved, and listed, anew.

    Example::

        resolved_jars_path([KAFKA_CONNECTOR], {})  # ~/.cache/lakehouse-spark/5d41402abc4b/jars-1f0e3dad9990.txt
    """
    if not isinstance(packages, list) or not all(isinstance(package, str) for package in packages):
        raise TypeError(f"packages must be a list of Maven coordinates, not {packages!r}")
    if not isinstance(conf, dict):
        raise TypeError(f"conf must be a dict of Spark settings, not {type(conf).__name__}")
    parts = [importlib.metadata.version("delta-spark"), *sorted(packages)]
    parts += [f"{key}={conf.get(key, '')}" for key in (JAR_EXCLUDES, *_RESOLUTION_SETTINGS)]
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return archive_dir(cache_dir) / f"jars-{key}.txt"


def resolved_jars(packages: list[str], conf: dict[str, str], cache_dir: Path | None = None) -> list[str] | None:
    """The jar files a previous start resolved ``packages`` to, or None when they must be resolved.

    None when no start listed them yet, when a listed file is gone (an emptied Ivy cache), when
    spark-submit started the driver already, or when its settings come from elsewhere too
    (``PYSPARK_SUBMIT_ARGS``, or a ``spark-defaults.conf`` naming jars or packages, which a builder
    value would replace).

    Example::

        jars = resolved_jars([KAFKA_CONNECTOR], {JAR_EXCLUDES: ",".join(PROVIDED_BY_SPARK)})
    """
    listing = resolved_jars_path(packages, conf, cache_dir)
    if os.environ.get("PYSPARK_GATEWAY_PORT") or os.environ.get("PYSPARK_SUBMIT_ARGS"):
        return None
    if JARS in _spark_defaults() or not listing.is_file():
        return None
    jars = listing.read_text().split()
    if not jars or not all(Path(urlparse(jar).path).is_file() for jar in jars):
        return None
    return jars


def _list_resolved_jars(session: SparkSession, listing: Path, own_jars: str) -> None:
    """Write down the package jars spark-submit resolved for this session (its ``spark.jars``, less
    the session's own), for the next start; written whole or not at all."""
    merged = java_class(session, "java.lang.System").getProperty(JARS) or ""
    own = set(filter(None, own_jars.split(",")))
    jars = [jar for jar in filter(None, merged.split(",")) if jar not in own and urlparse(jar).path not in own]
    if not jars:
        return
    listing.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=listing.parent, prefix=".jars-", delete=False) as staged:
        staged.write("\n".join(jars) + "\n")
    os.replace(staged.name, listing)


def build_spark(
    app_name: str,
    master: str | None = "local[2]",
    shuffle_partitions: int = 4,
    ui_enabled: bool = False,
    extra_conf: dict[str, str] | None = None,
    extra_packages: list[str] | None = None,
) -> SparkSession:
    """The session (or the one already running in this process), with ``extra_conf`` and ``extra_packages``.

    A lakehouse on S3 needs both: see ``pipeline.s3.session_options``. A ``spark.jars.excludes`` in
    ``extra_conf`` adds to ``PROVIDED_BY_SPARK``; a ``spark.jars`` there adds to the package jars.

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
        .config("spark.databricks.delta.snapshotPartitions", str(snapshot_partitions(shuffle_partitions)))
        # Gold rebuilt from silver at version V goes on at V + 1, which may not exist yet: Delta
        # then waits for it instead of refusing (the only check this setting relaxes for a stream).
        .config("spark.databricks.delta.changeDataFeed.timestampOutOfRange.enabled", "true")
    )
    if master:
        builder = builder.master(master)
    # Python on the executors (the PostgreSQL egress stages rows there) is this interpreter, with the
    # project and its drivers installed, not the first python3 on the PATH; PySpark reads only this.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = dict(extra_conf or {})
    # The driver starts from the class-data archive that `setup` wrote, when there is one.
    java_options = driver_java_options(conf)
    if java_options:
        conf[DRIVER_JAVA_OPTIONS] = java_options
    excludes = [*PROVIDED_BY_SPARK, *filter(None, conf.pop(JAR_EXCLUDES, "").split(","))]
    conf[JAR_EXCLUDES] = ",".join(excludes)
    packages = [KAFKA_CONNECTOR, AVRO_CONNECTOR, *(extra_packages or [])]
    jars = resolved_jars(packages, conf)
    own_jars = conf.get(JARS, "")
    if jars:
        # The files a previous start resolved the same packages to: no Ivy run at this start.
        conf[JARS] = ",".join([*jars, *filter(None, own_jars.split(","))])
    for key, value in conf.items():
        builder = builder.config(key, value)
    if jars:
        return builder.getOrCreate()
    # A session already running in this process was started with packages of its own.
    launches = SparkContext._active_spark_context is None and not os.environ.get("PYSPARK_GATEWAY_PORT")
    # configure_spark_with_delta_pip overwrites spark.jars.packages: never set it above.
    session = configure_spark_with_delta_pip(builder, extra_packages=packages).getOrCreate()
    if own_jars:
        ship_package_jars(session)
    if launches:
        _list_resolved_jars(session, resolved_jars_path(packages, conf), own_jars)
    return session


def ship_package_jars(session: SparkSession) -> None:
    """Hand the executors the package jars that a ``spark.jars`` setting took out of the context.

    spark-submit resolves the packages and merges their jars into ``spark.jars`` (the driver loads them
    all at launch), but PySpark then applies the session's own settings over it: a ``spark.jars`` given
    to the builder (S3's log store jar) replaces that list in the SparkContext, and executors, which
    fetch exactly the context's jars, would run without Delta, the Kafka connector or S3A.
    """
    if not isinstance(session, SparkSession):
        raise TypeError(f"session must be a SparkSession, not {type(session).__name__}")
    context = session.sparkContext._jsc.sc()
    merged = java_class(session, "java.lang.System").getProperty(JARS) or ""
    shipped = {url.rpartition("/")[2] for url in context.listJars().mkString("\n").splitlines()}
    for jar in filter(None, merged.split(",")):
        if jar.rpartition("/")[2] not in shipped:
            context.addJar(jar)


def java_class(session: SparkSession, name: str) -> JavaClass:
    """The JVM class ``name``, named in full, for its constructors and static methods.

    Prefer it to ``session._jvm.org.apache.hadoop.fs.Path``: py4j resolves such a chain one dot at a
    time, asking the JVM whether ``org``, then ``org.apache``, ... is a class, and each miss is a
    lookup through every jar on the class path, once for each package pyspark imported into its view
    (nine): about 2,000 such walks per pipeline test when classes are reached that way. A class named
    in full costs no call until it is used.

    Example::

        path = java_class(spark, "org.apache.hadoop.fs.Path")("s3a://lake/checkpoints/gold")
        none = java_class(spark, "scala.Option").empty()
    """
    if not isinstance(session, SparkSession):
        raise TypeError(f"session must be a SparkSession, not {type(session).__name__}")
    if not isinstance(name, str) or "." not in name.strip("."):
        raise ValueError(f"name must be a class's full name, e.g. 'org.apache.hadoop.fs.Path', not {name!r}")
    return JavaClass(name, session._jvm._gateway_client)


def _runtime_key() -> str:
    """What an archive is only valid for: the Java runtime spark-submit starts and pyspark's jars."""
    java_home = os.environ.get("JAVA_HOME")
    java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
    parts = [pyspark.__version__]
    if java and Path(java).exists():
        real = Path(java).resolve()
        stat = real.stat()
        parts.append(f"{real}:{stat.st_size}:{stat.st_mtime_ns}")
    for jar in sorted(_pyspark_jars().glob("*.jar")):
        stat = jar.stat()
        parts.append(f"{jar.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def snapshot_partitions(shuffle_partitions: int) -> int:
    """Delta's ``snapshotPartitions`` for a session of ``shuffle_partitions``: small local tables want fewer
    tasks per snapshot read than Delta's default of 50.

    Example::

        snapshot_partitions(4)  # 4
    """
    if isinstance(shuffle_partitions, bool) or not isinstance(shuffle_partitions, int) or shuffle_partitions < 1:
        raise ValueError(f"shuffle_partitions must be a positive int, not {shuffle_partitions!r}")
    return max(shuffle_partitions, 2)


def _pyspark_jars() -> Path:
    return Path(pyspark.__file__).parent / "jars"


def _spark_defaults() -> str:
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        conf_dir = Path(os.environ.get("SPARK_HOME") or Path(pyspark.__file__).parent) / "conf"
    defaults = Path(conf_dir) / "spark-defaults.conf"
    return defaults.read_text(errors="replace") if defaults.is_file() else ""
