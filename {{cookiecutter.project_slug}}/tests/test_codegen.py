"""How a stream's batch evaluates its expressions: interpreted when small, compiled when large."""

from __future__ import annotations

import pytest

from {{ cookiecutter.package_name }}.pipeline.bronze import offsets_spanned
from {{ cookiecutter.package_name }}.pipeline.session.codegen import (
    FACTORY_MODE,
    INTERPRETED,
    SMALL_KAFKA_BATCH,
    evaluate_for,
    evaluate_for_delta_batch,
    evaluate_for_kafka_batch,
    planned_bytes,
)


def test_a_kafka_batch_spans_its_end_offsets_less_the_batch_befores():
    before = '{"events":{"0":10,"1":4},"other":{"0":7}}'
    assert offsets_spanned(before, '{"events":{"0":12,"1":5}}') == 3
    assert offsets_spanned(before, '{"events":{"0":10,"1":4},"other":{"0":107}}') == 100


def test_a_kafka_batch_with_a_partition_the_batch_before_did_not_read_has_no_size():
    # A partition added since, or a topic subscribed since: where it starts is not in the log.
    assert offsets_spanned('{"events":{"0":10}}', '{"events":{"0":12,"1":5}}') is None
    assert offsets_spanned('{"events":{"0":10}}', '{"events":{"0":12},"clicks":{"0":1}}') is None


def test_offsets_that_are_not_kafkas_are_refused():
    with pytest.raises(ValueError, match="Kafka source offsets"):
        offsets_spanned("[1, 2]", '{"events":{"0":1}}')


@pytest.fixture
def started_compiled(spark):
    """The process's Spark configuration as a production driver's: no factory mode, so compiled.

    This suite's drivers start interpreted (conftest.py); the context's live configuration is
    what ``evaluate_for`` reads, restored afterwards.
    """
    conf = spark.sparkContext._conf
    started = conf.get(FACTORY_MODE)
    conf.set(FACTORY_MODE, "FALLBACK")
    yield
    if started is None:
        conf._jconf.remove(FACTORY_MODE)
    else:
        conf.set(FACTORY_MODE, started)


def test_a_small_batch_is_interpreted_and_a_large_one_compiled_in_its_own_session_only(spark, started_compiled):
    stream_session, other_session = spark.newSession(), spark.newSession()
    other_mode = other_session.conf.get(FACTORY_MODE)
    evaluate_for(stream_session, small=True)
    assert stream_session.conf.get(FACTORY_MODE) == INTERPRETED
    evaluate_for(stream_session, small=False)
    assert stream_session.conf.get(FACTORY_MODE) == "FALLBACK"
    evaluate_for(stream_session, small=True)
    assert stream_session.conf.get(FACTORY_MODE) == INTERPRETED
    assert other_session.conf.get(FACTORY_MODE) == other_mode


def test_a_process_started_interpreted_stays_interpreted_for_a_large_batch(spark, started_compiled):
    spark.sparkContext._conf.set(FACTORY_MODE, INTERPRETED)
    stream_session = spark.newSession()
    evaluate_for(stream_session, small=False)
    assert stream_session.conf.get(FACTORY_MODE) == INTERPRETED


def test_a_kafka_batch_under_the_crossover_is_interpreted_and_one_of_unknown_size_compiled(spark, started_compiled):
    stream_session = spark.newSession()
    evaluate_for_kafka_batch(stream_session, 1)
    assert stream_session.conf.get(FACTORY_MODE) == INTERPRETED
    evaluate_for_kafka_batch(stream_session, SMALL_KAFKA_BATCH)
    assert stream_session.conf.get(FACTORY_MODE) == "FALLBACK"
    evaluate_for_kafka_batch(stream_session, SMALL_KAFKA_BATCH - 1)
    assert stream_session.conf.get(FACTORY_MODE) == INTERPRETED
    evaluate_for_kafka_batch(stream_session, None)  # a first batch: its start is not in the offset log
    assert stream_session.conf.get(FACTORY_MODE) == "FALLBACK"


def test_a_delta_micro_batch_is_sized_by_its_files_without_a_spark_job(spark, tmp_path, started_compiled):
    table = tmp_path / "table"
    spark.range(0, 1000, numPartitions=2).write.format("delta").save(str(table))
    spark.range(1000, 1010, numPartitions=1).write.format("delta").mode("append").save(str(table))
    sizes = sorted(file.stat().st_size for file in table.glob("*.parquet"))
    seen = []

    def write_batch(batch, batch_id):
        group = batch.sparkSession.sparkContext.getLocalProperty("spark.jobGroup.id")
        status = batch.sparkSession.sparkContext.statusTracker()
        jobs_before = len(status.getJobIdsForGroup(group))
        evaluate_for_delta_batch(batch, sizes[0] + 1)  # one file a batch: only the smallest's is small
        jobs = len(status.getJobIdsForGroup(group)) - jobs_before
        seen.append((planned_bytes(batch), batch.sparkSession.conf.get(FACTORY_MODE), jobs, batch.count()))

    (
        spark.readStream.format("delta")
        .option("maxFilesPerTrigger", 1)
        .load(str(table))
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
        .awaitTermination()
    )

    assert sorted(bytes_read for bytes_read, _, _, _ in seen) == sizes
    modes = {rows: mode for _, mode, _, rows in seen}
    assert modes == {500: "FALLBACK", 10: INTERPRETED}
    assert [jobs for _, _, jobs, _ in seen] == [0, 0, 0]


@pytest.mark.parametrize("wrong", [None, "spark", 42])
def test_the_helpers_refuse_what_is_not_a_session_or_a_dataframe_before_any_jvm(wrong):
    with pytest.raises(TypeError):
        evaluate_for(wrong, small=True)
    with pytest.raises(TypeError):
        planned_bytes(wrong)
    with pytest.raises(TypeError):
        evaluate_for_delta_batch(wrong, 1)


@pytest.mark.parametrize("records", [-1, 1.5, "10"])
def test_a_kafka_batch_size_that_is_not_a_count_is_refused(spark, records):
    with pytest.raises(ValueError, match="records must be a count"):
        evaluate_for_kafka_batch(spark, records)


@pytest.mark.parametrize("small_bytes", [0, -5, 1.5, None])
def test_a_delta_threshold_that_is_not_a_size_is_refused(spark, small_bytes):
    with pytest.raises(ValueError, match="small_bytes must be a size"):
        evaluate_for_delta_batch(spark.range(1), small_bytes)
