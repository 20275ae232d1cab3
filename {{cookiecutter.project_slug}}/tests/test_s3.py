"""The lakehouse on S3: a real S3-compatible server (SeaweedFS), Spark's S3A connector and Delta.

What only S3 has: its settings refused at start-up, leases and Delta commits raced by two processes
with conditional uploads. Commands run in a child process, as an operator runs them, configured only
by the environment (``LAKEHOUSE_ROOT=s3a://...``, ``S3_ENDPOINT=local``). The pipeline itself, its
crash points, kills and lost checkpoints run on S3 in the tests marked ``storage`` (``--storage=s3``).
"""

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pyspark
import pytest

from {{ cookiecutter.package_name }}.devtools.kafka_local import pick_ports
from {{ cookiecutter.package_name }}.devtools.s3_local import BUCKET
from {{ cookiecutter.package_name }}.pipeline.delta import files
from {{ cookiecutter.package_name }}.pipeline.delta.tables import Lakehouse
from {{ cookiecutter.package_name }}.pipeline.recovery import lease
from {{ cookiecutter.package_name }}.pipeline.session.s3 import LOG_STORE_JAR, read_credentials_file

# One worker runs this file (make test uses two), beside the session's S3 server.
pytestmark = pytest.mark.xdist_group("s3")


@pytest.fixture
def lakehouse_root(s3_lakehouse) -> str:
    """Every lakehouse of this file is on the S3 server, whatever ``--storage`` says."""
    return s3_lakehouse


def test_the_session_ships_executors_every_package_jar_and_none_spark_already_has(spark):
    # The session of tests/conftest.py is built as `run` builds one on S3: packages plus the log
    # store's jar in spark.jars. Executors fetch exactly the context's jars.
    shipped = [url.rpartition("/")[2] for url in spark.sparkContext._jsc.sc().listJars().mkString("\n").splitlines()]
    for needed in ("delta-spark_", "spark-sql-kafka-0-10_", "hadoop-aws-", "awssdk_s3-", LOG_STORE_JAR):
        assert any(needed in jar for jar in shipped), f"no {needed} among the jars executors fetch: {shipped}"
    # Ivy names a jar <group>_<artifact>-<version>.jar; pyspark's own are <artifact>-<version>.jar.
    spark_jars = {jar.name.rpartition("-")[0] for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    duplicates = [jar for jar in shipped if "_" in jar and jar.partition("_")[2].rpartition("-")[0] in spark_jars]
    assert duplicates == [], "add these to pipeline.session.spark.PROVIDED_BY_SPARK: Spark has its own"


@pytest.mark.parametrize("wrong", ["secret", "bucket", "endpoint", "server"])
def test_a_wrong_credential_bucket_or_endpoint_exits_2_naming_the_setting(pipeline_env, s3_server, tmp_path, wrong):
    secret = "not-the-secret-" + uuid.uuid4().hex
    if wrong == "secret":
        bad = tmp_path / "credentials"
        access_key, _ = read_credentials_file(s3_server.credentials_file)
        bad.write_text(f"[default]\naws_access_key_id = {access_key}\naws_secret_access_key = {secret}\n")
        setting = {"S3_ENDPOINT": s3_server.endpoint, "S3_PATH_STYLE_ACCESS": "true", "S3_CREDENTIALS_FILE": str(bad)}
        named = "s3.credentials_file: the credentials in"
    elif wrong == "bucket":
        setting = {"LAKEHOUSE_ROOT": "s3a://no-such-bucket/lake"}
        named = "lakehouse.root: bucket 'no-such-bucket' does not exist"
    elif wrong == "endpoint":
        setting = {"S3_ENDPOINT": f"http://127.0.0.1:{pick_ports([None])[0]}", "S3_PATH_STYLE_ACCESS": "true"}
        named = "s3.endpoint: http://127.0.0.1:"
    else:
        setting = {"S3_LOCAL_HOME": str(tmp_path / "no-server")}
        named = "s3.endpoint: is 'local' but no local S3 server runs"
    result = subprocess.run(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "checkpoints", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **setting},
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert named in result.stderr
    assert secret not in result.stdout + result.stderr


def test_a_contender_with_a_stale_look_cannot_take_a_lease_on_s3_from_its_winner(
    s3_spark, s3_server, monkeypatch, contend_with_a_stale_look
):
    lakehouse = Lakehouse(f"s3a://{BUCKET}/{uuid.uuid4().hex[:12]}")
    directory = lease.lease_directory(lakehouse, "silver")
    # A contender that looked just before this process took the lease: no lease yet.
    stale_view = lease._current(s3_spark, directory)
    winner = lease.acquire(s3_spark, lakehouse, "silver")
    lease._HELD.pop(directory)  # from here on, this process plays the other contender
    contend_with_a_stale_look(stale_view)

    # Its create of generation 1 is a conditional upload that S3 refuses: not an overwrite.
    with pytest.raises(lease.LeaseHeld, match="took the lease .* at the same moment"):
        lease.acquire(s3_spark, lakehouse, "silver")
    monkeypatch.undo()
    assert json.loads(files.read_text(s3_spark, winner.path))["owner"] == winner.record.owner
    winner.check()
    winner.release()


# Each writer is a driver of its own (its own JVM and Delta log store), set up as `run` sets up its
# session, and commits blind appends to one table as fast as it can once both are ready.
RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from {{ cookiecutter.package_name }}.cli.connect import spark_session
    from {{ cookiecutter.package_name }}.pipeline.config import load_config

    writer, table, commits, ready, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])
    spark = spark_session(load_config("local"), "racer-" + writer)
    row = spark.createDataFrame([(writer, -1)], "writer string, commit int")
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    for commit in range(commits):
        row.selectExpr("writer", f"{commit} AS commit").write.format("delta").mode("append").save(table)
    """
)


@pytest.mark.slow
def test_two_drivers_racing_commits_to_one_table_lose_none(s3_lakehouse, s3_spark, tmp_path):
    table, commits = f"{s3_lakehouse}/raced", 15
    s3_spark.createDataFrame([("seed", 0)], "writer string, commit int").write.format("delta").save(table)
    go = tmp_path / "go"
    racers = {
        writer: subprocess.Popen(
            [sys.executable, "-c", RACER, writer, table, str(commits), str(tmp_path / writer), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for writer in ("a", "b")
    }
    for writer, racer in racers.items():
        while not (tmp_path / writer).exists():
            assert racer.poll() is None, racer.stdout.read()[-5000:]
            time.sleep(0.2)
    go.touch()
    for racer in racers.values():
        output = racer.communicate(timeout=600)[0]
        assert racer.returncode == 0, output[-5000:]

    rows = sorted(tuple(row) for row in s3_spark.read.format("delta").load(table).collect())
    expected = sorted([("seed", 0)] + [(writer, commit) for writer in ("a", "b") for commit in range(commits)])
    assert rows == expected
    # A commit whose version is not the one after the version it read lost a race and was retried:
    # the writers did collide, and no commit disappeared when they did.
    history = s3_spark.sql(f"DESCRIBE HISTORY delta.`{table}`").select("version", "readVersion").collect()
    assert len(history) == 2 * commits + 1
    retried = [entry for entry in history if entry.version > 0 and entry.version != entry.readVersion + 1]
    assert retried, "the two writers never collided: the race proved nothing"
