"""How a Spark driver starts: from the class archive `setup` writes, and from the jar files the first
start resolved its packages to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from {{ cookiecutter.package_name }}.pipeline.session.class_archive import write_archive
from {{ cookiecutter.package_name }}.pipeline.session.spark import (
    DRIVER_JAVA_OPTIONS,
    KAFKA_CONNECTOR,
    archive_dir,
    archive_name,
    archive_path,
    driver_java_options,
    java_class,
    resolved_jars,
    resolved_jars_path,
)

# One of the first classes a driver loads from pyspark's jars.
SPARK_CONTEXT = "org.apache.spark.SparkContext "
# What spark-submit prints when Ivy resolved the packages.
IVY_RAN = ":: resolution report ::"


def test_a_driver_loads_sparks_classes_from_the_archive_that_setup_writes(tmp_path):
    # `make install` ran `setup`, which wrote it; write it here otherwise, so this never skips.
    archive = archive_path() or write_archive()
    classes = tmp_path / "classes.log"
    child = """
import sys
from {{ cookiecutter.package_name }}.pipeline.session.spark import build_spark
spark = build_spark("archive-check", extra_conf=dict([sys.argv[1:3]]))
assert spark.range(3).count() == 3
"""
    java_options = f"-Xlog:class+load=info:file={classes}"
    subprocess.run(
        [sys.executable, "-c", child, DRIVER_JAVA_OPTIONS, java_options], check=True, timeout=300, capture_output=True
    )

    loaded = [line for line in classes.read_text().splitlines() if SPARK_CONTEXT in line]
    assert loaded, f"the driver never logged loading {SPARK_CONTEXT.strip()}"
    # The JVM mapped the class from the dynamic archive ("top" layer) instead of reading the jar.
    assert "source: shared objects file (top)" in loaded[0], f"{archive}: {loaded[0]}"


def test_an_archive_of_another_size_than_its_name_says_is_never_used(tmp_path):
    # A JVM mapping a truncated archive dies with SIGBUS: such a file must never reach one.
    directory = archive_dir(tmp_path)
    directory.mkdir(parents=True)
    truncated = directory / archive_name(200_000_000)
    truncated.write_bytes(b"\0" * 4096)
    assert archive_path(tmp_path) is None
    assert driver_java_options(cache_dir=tmp_path) is None

    whole = directory / archive_name(4096)
    truncated.rename(whole)
    assert archive_path(tmp_path) == whole


def test_the_archive_adds_to_the_drivers_own_options_and_defers_to_a_chosen_one(tmp_path, monkeypatch):
    directory = archive_dir(tmp_path)
    directory.mkdir(parents=True)
    archive = directory / archive_name(16)
    archive.write_bytes(b"\0" * 16)

    options = driver_java_options({DRIVER_JAVA_OPTIONS: "-Dfoo=bar"}, cache_dir=tmp_path)
    assert options.startswith(f"-Dfoo=bar -XX:SharedArchiveFile={archive} ")
    # Options that choose class-data sharing themselves (as writing the archive does) are left alone.
    assert driver_java_options({DRIVER_JAVA_OPTIONS: "-XX:ArchiveClassesAtExit=x.jsa"}, cache_dir=tmp_path) is None
    assert driver_java_options({DRIVER_JAVA_OPTIONS: "-Xshare:off"}, cache_dir=tmp_path) is None
    # A spark-defaults.conf's driver options would be replaced by the builder's: leave the driver as is.
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Xmx8g\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    assert driver_java_options(cache_dir=tmp_path) is None
    # A driver spark-submit already started is not this process's to configure.
    monkeypatch.delenv("SPARK_CONF_DIR")
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert driver_java_options(cache_dir=tmp_path) is None


def test_a_second_start_takes_the_jars_the_first_resolved_and_runs_no_ivy(tmp_path):
    child = """
import sys
from {{ cookiecutter.package_name }}.pipeline.session.spark import build_spark
spark = build_spark("jars-check")
spark.range(3).write.format("delta").save(sys.argv[1])
assert spark.read.format("delta").load(sys.argv[1]).count() == 3
# The Kafka connector is there: the source resolves (no broker needed until a query runs).
kafka = spark.read.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9").option("subscribe", "t")
assert "offset" in kafka.load().columns
"""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}

    def start(table: str) -> str:
        finished = subprocess.run(
            [sys.executable, "-c", child, str(tmp_path / table)], env=env, timeout=300, capture_output=True, text=True
        )
        assert finished.returncode == 0, finished.stderr[-5000:]
        return finished.stderr

    assert IVY_RAN in start("first")
    listings = list((tmp_path / "cache").glob("lakehouse-spark/*/jars-*.txt"))
    assert len(listings) == 1
    assert any("delta-spark" in jar for jar in listings[0].read_text().split())
    assert IVY_RAN not in start("second")


def test_a_listing_is_used_only_while_every_jar_it_names_is_there(tmp_path, monkeypatch):
    packages = [KAFKA_CONNECTOR]
    listing = resolved_jars_path(packages, {}, cache_dir=tmp_path)
    listing.parent.mkdir(parents=True)
    jar = tmp_path / "connector.jar"
    jar.write_bytes(b"PK")
    listing.write_text(f"file://{jar}\n{tmp_path / 'gone.jar'}\n")
    assert resolved_jars(packages, {}, cache_dir=tmp_path) is None  # an emptied Ivy cache: resolve again

    listing.write_text(f"file://{jar}\n")
    assert resolved_jars(packages, {}, cache_dir=tmp_path) == [f"file://{jar}"]
    # Other packages or other resolution settings have a listing of their own.
    assert resolved_jars([*packages, "org.example:extra:1.0"], {}, cache_dir=tmp_path) is None
    assert resolved_jars(packages, {"spark.jars.repositories": "https://repo.example"}, cache_dir=tmp_path) is None
    # Packages given some other way are spark-submit's to resolve.
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--packages org.example:extra:1.0 pyspark-shell")
    assert resolved_jars(packages, {}, cache_dir=tmp_path) is None


@pytest.mark.parametrize("wrong", [42, ["spark.driver.extraJavaOptions"]])
def test_the_start_up_helpers_refuse_wrong_arguments_before_any_jvm(wrong):
    with pytest.raises(TypeError):
        archive_dir(wrong)
    with pytest.raises(TypeError):
        driver_java_options(wrong)
    with pytest.raises(TypeError):
        resolved_jars_path(wrong, wrong)
    with pytest.raises(TypeError):
        java_class(wrong, "org.apache.hadoop.fs.Path")


@pytest.mark.parametrize("name", ["", "Path", ".Path", 42])
def test_a_jvm_class_must_be_named_in_full(spark, name):
    with pytest.raises(ValueError, match="a class's full name"):
        java_class(spark, name)


def test_a_jvm_class_named_in_full_is_found_without_walking_its_packages(spark, monkeypatch):
    client = spark._jvm._gateway_client
    sent = []
    send = client.send_command

    def recorded(command, *args, **kwargs):
        sent.append(command)
        return send(command, *args, **kwargs)

    monkeypatch.setattr(client, "send_command", recorded)

    path_class = java_class(spark, "org.apache.hadoop.fs.Path")
    assert sent == []  # nothing asked of the JVM until the class is used
    assert path_class("/data/lake/checkpoints/gold").getName() == "gold"
    assert java_class(spark, "scala.Option").empty().isEmpty()
    # py4j's walk asks "is `org` a class? `org.apache`?" (reflection command "u"): each a search of every jar.
    assert sent and not [command for command in sent if command.startswith("r\nu\n")], sent
