"""The nemesis's schedule: recorded with its draws, saved, played again, and shortened when it fails;
and what it predicts the pipeline must refuse after the faults it played.

The schedule's runs themselves (servers, the pipeline's processes, the oracle) are in test_faults.py.
"""

import random

import pytest

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.devtools.nemesis import (
    CHECKPOINT_LOST,
    MARKER_AHEAD,
    MARKER_MISMATCH,
    SOURCE_LOST,
    TABLE_AHEAD,
    Draws,
    NemesisReport,
    Predictions,
    Schedule,
    Step,
    compiled_java_options,
    copy_directory,
    reset_by,
    reset_cascade,
    shortest_failing,
)
from {{ cookiecutter.package_name }}.pipeline.config import Mode
from {{ cookiecutter.package_name }}.pipeline.session.spark import java_class


def draw_a_step(rng: random.Random) -> list:
    """What an action asks of its random numbers: each kind of call the actions make."""
    return [
        rng.choice(["bronze", "silver", "gold"]),
        rng.random(),
        rng.uniform(1.0, 8.0),
        rng.randint(1, 40),
        rng.randrange(6),
        rng.randrange(1, 50_000),
        rng.choice([("events", 0), ("events", 1)]),
    ]


def test_recording_the_draws_changes_none_of_them():
    # A seed's schedule must stay what it was before its draws were recorded: soaks stay comparable.
    plain, recording = random.Random("7:actions"), Draws("7:actions")

    for _ in range(50):
        recording.pin([])
        drawn = draw_a_step(recording)
        assert drawn == draw_a_step(plain)
        assert recording.take() == drawn


def test_a_step_played_again_draws_what_was_recorded_whatever_the_seed():
    recorded = Draws("1:actions")
    first = draw_a_step(recorded)
    draws = recorded.take()

    replay = Draws("a different seed")
    replay.pin(draws)

    assert draw_a_step(replay) == first
    assert replay.take() == draws


def test_a_draw_that_names_the_run_answers_the_same_call_in_another_run():
    # Topics and records are named after the run, and each run draws its name afresh.
    first = Draws("4:actions", run="nemesis4-aaaaaa")
    topic = first.choice(["nemesis4-aaaaaa", "nemesis4-aaaaaa-2"])
    partition = first.choice([("nemesis4-aaaaaa", 0), ("nemesis4-aaaaaa", 1)])
    draws = first.take()
    assert "aaaaaa" not in repr(draws)

    second = Draws("another seed", run="nemesis4-bbbbbb")
    second.pin(draws)

    assert second.choice(["nemesis4-bbbbbb", "nemesis4-bbbbbb-2"]) == topic.replace("aaaaaa", "bbbbbb")
    assert second.choice([("nemesis4-bbbbbb", 0), ("nemesis4-bbbbbb", 1)]) == ("nemesis4-bbbbbb", partition[1])


def test_a_recorded_draw_that_no_longer_answers_the_call_leaves_the_rest_of_the_step_to_chance():
    replay = Draws("2:actions")
    replay.pin(["gone-stream", 0.5])

    stream = replay.choice(["bronze", "silver"])
    share = replay.random()

    # "gone-stream" is not among the options, so it and the draws after it are dropped, not misplaced.
    assert stream in ("bronze", "silver")
    assert share != 0.5
    assert replay.take() == [stream, share]


def test_a_draw_made_inside_another_is_neither_recorded_nor_pinned():
    # randint calls randrange: only the call the action made is its draw.
    replay = Draws("3:actions")
    replay.pin([17])

    assert replay.randint(1, 40) == 17
    assert replay.take() == [17]


def test_a_saved_schedule_ends_at_its_first_anomaly_and_reads_back_with_its_tuples(tmp_path):
    report = NemesisReport(
        steps=[
            Step(1, "produce", "12 records committed", 0.1, draws=[12, 3, "topic-a"]),
            Step(2, "retention", "deleted", 1.0, draws=[("topic-a", 1), 5]),
            Step(3, "drain", "oracle wrong", 30.0, anomalies={"bronze_duplicates": 2}),
            Step(4, "kill", "killed", 20.0, draws=["all"]),
            Step(5, "drain", "oracle clean", 30.0, final=True),
        ]
    )
    path = tmp_path / "schedule.json"

    Schedule.of(seed=5, report=report, mode=Mode.FUSED, compiled=True).save(path)
    schedule = Schedule.load(path)

    assert schedule.seed == 5
    assert schedule.mode is Mode.FUSED and schedule.compiled
    shortened = schedule.without(schedule.actions[:1])
    assert shortened.mode is Mode.FUSED and shortened.compiled
    assert schedule.names() == ["produce", "retention", "drain"]
    assert schedule.actions[1]["draws"] == [("topic-a", 1), 5]
    assert schedule.anomalies == ["bronze_duplicates"]


def test_a_clean_runs_schedule_keeps_every_action_but_the_final_drain(tmp_path):
    report = NemesisReport(
        steps=[
            Step(1, "produce", "committed", 0.1, draws=[1]),
            Step(2, "drain", "oracle clean", 30.0),
            Step(3, "drain", "oracle clean", 30.0, final=True),
        ]
    )

    schedule = Schedule.of(seed=1, report=report)

    assert schedule.names() == ["produce", "drain"]
    assert schedule.anomalies == []


@pytest.mark.parametrize(
    "text, problem",
    [
        ("not json", "not a nemesis schedule"),
        ('{"actions": []}', "'seed'"),
        ('{"seed": 1, "actions": [{"action": "teleport", "draws": []}]}', "unknown action 'teleport'"),
        ('{"seed": 1, "mode": "sideways", "actions": []}', "'sideways' is not a valid Mode"),
        ('{"seed": 1, "compiled": "yes", "actions": []}', "compiled is 'yes', not true or false"),
    ],
)
def test_a_file_that_is_not_a_schedule_is_refused_naming_what_is_wrong(tmp_path, text, problem):
    path = tmp_path / "schedule.json"
    path.write_text(text)

    with pytest.raises(ValueError, match=problem):
        Schedule.load(path)


def test_a_schedule_saved_before_modes_were_recorded_plays_in_the_layered_mode(tmp_path):
    path = tmp_path / "schedule.json"
    path.write_text('{"seed": 3, "anomalies": [], "actions": [{"action": "produce", "draws": [5]}]}')

    assert Schedule.load(path).mode is Mode.LAYERED
    assert not Schedule.load(path).compiled


def test_compiled_java_options_replace_the_suites_interpreted_mode_and_keep_the_rest():
    options = compiled_java_options("-Xss4m -Dspark.sql.codegen.factoryMode=NO_CODEGEN -Dfile.encoding=UTF-8")

    assert options == "-Xss4m -Dfile.encoding=UTF-8 -Dspark.sql.codegen.factoryMode=CODEGEN_ONLY"
    assert compiled_java_options("") == "-Dspark.sql.codegen.factoryMode=CODEGEN_ONLY"


def test_shortening_keeps_only_the_actions_the_failure_needs_in_their_order():
    tried = []

    def fails(actions: list) -> bool:
        tried.append(list(actions))
        # Fails when a checkpoint is lost and a later drain runs: the other actions are noise.
        return "lose" in actions and "drain" in actions[actions.index("lose") :]

    schedule = ["produce", "step", "produce", "lose", "kill", "produce", "snapshot", "drain", "produce", "reset"]

    assert shortest_failing(schedule, fails) == ["lose", "drain"]
    # Delta debugging, not every subset: far fewer replays than 2^10.
    assert len(tried) < 40


def test_a_schedule_that_fails_on_one_action_shortens_to_it():
    assert shortest_failing(list("abcdefgh"), lambda actions: "f" in actions) == ["f"]


def test_nemesis_refuses_shrink_without_a_schedule_and_a_schedule_it_cannot_read(tmp_path, capsys):
    assert main(["nemesis", "--shrink"]) == 2
    assert "--shrink shortens a saved schedule" in capsys.readouterr().err

    assert main(["nemesis", "--replay", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: not a nemesis schedule" in capsys.readouterr().err


def test_shrinking_a_schedule_that_found_nothing_is_refused(tmp_path, capsys):
    path = tmp_path / "schedule.json"
    Schedule(seed=1, actions=[{"action": "produce", "draws": []}]).save(path)

    assert main(["nemesis", "--replay", str(path), "--shrink"]) == 2
    assert "found no anomaly" in capsys.readouterr().err


def test_a_lost_checkpoint_takes_the_certainty_of_what_its_copy_was_bound_to_meet():
    # A soak found it: an egress's checkpoint put back behind its marker (certain to be refused), then
    # lost before the egress ran: the egress starts as a new stream, and no refusal is owed.
    predictions = Predictions()
    predictions.expect("postgres_egress", {MARKER_MISMATCH}, certain=True)
    predictions.checkpoint_lost("postgres_egress")
    assert predictions.pending(["postgres_egress"]) == {MARKER_MISMATCH}
    assert not predictions.certain(["postgres_egress"])


def test_a_lost_checkpoint_leaves_a_loss_in_kafka_certain():
    # Bronze without a checkpoint resumes after the offsets it holds, and finds the records gone all the same.
    predictions = Predictions()
    predictions.expect("bronze", {SOURCE_LOST}, certain=True)
    predictions.expect("bronze", {TABLE_AHEAD}, certain=True)
    predictions.checkpoint_lost("bronze")
    assert predictions.pending(["bronze"]) == {SOURCE_LOST, TABLE_AHEAD}
    assert predictions.certain(["bronze"])


def test_a_reset_clears_what_was_predicted_but_a_loss_in_kafka():
    predictions = Predictions()
    predictions.expect("bronze", {SOURCE_LOST, TABLE_AHEAD}, certain=True)
    predictions.expect("gold", {CHECKPOINT_LOST}, certain=True)
    predictions.cleared(["bronze", "silver", "gold"], reset=True)
    assert predictions.pending(["bronze", "silver", "gold"]) == {SOURCE_LOST}
    assert predictions.certain(["bronze"]) and not predictions.certain(["gold"])
    predictions.cleared(["bronze"])
    assert predictions.pending(["bronze"]) == set()


def test_a_way_out_that_resets_a_stream_clears_what_was_predicted_below_it_unless_only():
    # Silver's way out `checkpoints reset silver` rebuilds gold too, with a new checkpoint: a refusal
    # predicted for gold's lost checkpoint no longer comes.
    assert reset_by(["checkpoints", "reset", "silver"]) == ("silver", True)
    assert reset_by(["checkpoints", "reset", "bronze", "--only", "--yes"]) == ("bronze", False)
    assert reset_by(["checkpoints", "accept-loss"]) is None
    with pytest.raises(TypeError):
        reset_by("checkpoints reset silver")


def test_a_reset_of_a_layer_starts_the_layers_above_anew_and_leaves_every_egress_as_it_was():
    # In seed 1, a Kafka egress checkpoint put back behind its topic was bound to be refused; gold's reset
    # (the way out of a changed window) left that checkpoint as it was, and the refusal came, unpredicted.
    layers = ("bronze", "silver", "gold")
    assert reset_cascade(layers, "silver") == ("silver", "gold")
    assert reset_cascade(layers, "gold") == ("gold",)
    assert reset_cascade(layers, "kafka_egress") == ("kafka_egress",)
    assert reset_cascade(("fused",), "fused") == ("fused",)
    predictions = Predictions()
    predictions.expect("kafka_egress", {MARKER_AHEAD}, certain=True)
    predictions.cleared(reset_cascade(layers, "gold"), reset=True)
    assert predictions.pending(["kafka_egress"]) == {MARKER_AHEAD} and predictions.certain(["kafka_egress"])


@pytest.mark.storage
def test_a_table_copied_over_a_directory_the_store_still_reports_reads_as_its_source(spark, lakehouse_root):
    source, target = f"{lakehouse_root}/tables/source", f"{lakehouse_root}/tables/target"
    spark.range(12).selectExpr("id", "id % 3 AS part").write.format("delta").partitionBy("part").save(source)
    # What a store may report after a delete: the table's directories, and a file of a newer version.
    hadoop_path = java_class(spark, "org.apache.hadoop.fs.Path")
    filesystem = hadoop_path(target).getFileSystem(spark._jsc.hadoopConfiguration())
    for directory in ("_delta_log", "part=1"):
        filesystem.mkdirs(hadoop_path(f"{target}/{directory}"))
    filesystem.create(hadoop_path(f"{target}/_delta_log/00000000000000000001.json")).close()

    assert copy_directory(spark, source, target)

    rows = sorted(spark.read.format("delta").load(target).collect())
    assert rows == sorted(spark.read.format("delta").load(source).collect()) and len(rows) == 12
    assert not filesystem.exists(hadoop_path(f"{target}/_delta_log/_delta_log"))
    assert not filesystem.exists(hadoop_path(f"{target}/part=1/part=1"))
