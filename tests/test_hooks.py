"""Hook logic, called directly with answer dictionaries."""

import json

import pytest
from conftest import TEMPLATE

VALID = {
    "project_name": "Clickstream Lakehouse",
    "project_slug": "clickstream-lakehouse",
    "package_name": "clickstream_lakehouse",
    "kafka_topics": "events",
    "gold_window_duration": "1 minute",
    "kafka_security_protocol": "PLAINTEXT",
    "kafka_sasl_mechanism": "none",
    "egress": "both",
    "storage": "local",
    "example_dataset": "orders",
    "include_docker_compose": "yes",
    "include_github_actions": "yes",
}
EGRESS_CHOICES = json.loads((TEMPLATE / "cookiecutter.json").read_text())["egress"]
STORAGE_CHOICES = json.loads((TEMPLATE / "cookiecutter.json").read_text())["storage"]
EXAMPLE_DATASET_CHOICES = json.loads((TEMPLATE / "cookiecutter.json").read_text())["example_dataset"]


def test_default_answers_are_valid(pre_gen):
    assert pre_gen.validate(VALID) == []


@pytest.mark.parametrize(
    ("answers", "named"),
    [
        ({"project_name": " "}, "project_name"),
        ({"project_slug": "Click Stream"}, "project_slug"),
        ({"project_slug": "9lives"}, "project_slug"),
        ({"project_slug": "double--hyphen"}, "project_slug"),
        ({"package_name": "click-stream"}, "package_name"),
        ({"package_name": "class"}, "package_name: 'class' is a Python keyword"),
        ({"package_name": "json"}, "would shadow"),
        ({"package_name": "pyspark"}, "would shadow"),
        ({"package_name": "pydantic"}, "would shadow"),
        ({"package_name": "psycopg"}, "would shadow"),
        ({"package_name": "prometheus_client"}, "would shadow"),
        ({"kafka_topics": "bad topic"}, "kafka_topics: 'bad topic' has characters Kafka refuses"),
        ({"kafka_topics": "t" * 250}, "at most 249"),
        ({"kafka_topics": ".."}, "not allowed"),
        ({"kafka_topics": "events,"}, "empty topic"),
        ({"kafka_topics": "events, events"}, "more than once"),
        ({"kafka_topics": "a.b,a_b"}, "collide"),
        ({"kafka_topics": "événements"}, "characters Kafka refuses"),
        ({"gold_window_duration": "fortnight"}, "gold_window_duration: 'fortnight' does not parse"),
        ({"gold_window_duration": "1 minutes please"}, "does not parse"),
        ({"gold_window_duration": "0 seconds"}, "between 1 second and 7 days"),
        ({"gold_window_duration": "8 days"}, "between 1 second and 7 days"),
        ({"kafka_security_protocol": "SASL_SSL"}, "needs a SASL mechanism"),
        ({"kafka_sasl_mechanism": "PLAIN"}, "only applies to SASL_SSL"),
        ({"kafka_security_protocol": "SSL", "kafka_sasl_mechanism": "SCRAM-SHA-256"}, "only applies to SASL_SSL"),
        ({"egress": "s3"}, "egress: 's3' is not one of both, kafka, postgres, none"),
        ({"kafka_topics": "events, orders"}, "kafka_topics: orders is the example dataset orders's topic"),
    ],
)
def test_bad_answer_is_rejected_with_a_message_naming_it(pre_gen, answers, named):
    errors = pre_gen.validate({**VALID, **answers})
    assert errors, answers
    assert any(named in error for error in errors), errors


@pytest.mark.parametrize(
    ("duration", "seconds"), [("1 minute", 60), ("30 seconds", 30), ("2 hours", 7200), ("1 day", 86400)]
)
def test_window_durations_parse_to_seconds(pre_gen, duration, seconds):
    assert pre_gen.window_seconds(duration) == seconds


def test_several_topics_and_sasl_are_accepted(pre_gen):
    answers = {
        **VALID,
        "kafka_topics": "payments.v1, refunds-v1",
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "SCRAM-SHA-512",
    }
    assert pre_gen.validate(answers) == []


def test_main_prints_errors_and_exits_nonzero(pre_gen, capsys):
    assert pre_gen.main(json.dumps({**VALID, "kafka_topics": "no spaces"})) == 1
    assert "ERROR: kafka_topics" in capsys.readouterr().err


def test_post_gen_records_public_answers_and_prunes_optional_files(post_gen, tmp_path):
    (tmp_path / "docker-compose.yml").write_text("services: {}\n")
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    (tmp_path / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    answers = {**VALID, "include_docker_compose": "no", "include_github_actions": "no", "_output_dir": "/home/me"}

    assert post_gen.main(json.dumps(answers), tmp_path) == 0

    recorded = json.loads((tmp_path / ".cookiecutter.json").read_text())
    assert recorded == {key: value for key, value in answers.items() if not key.startswith("_")}
    assert not (tmp_path / "docker-compose.yml").exists()
    assert not (tmp_path / ".github").exists()


def test_post_gen_keeps_optional_files_when_asked(post_gen, tmp_path):
    (tmp_path / "docker-compose.yml").write_text("services: {}\n")
    (tmp_path / ".github").mkdir()
    answers = {**VALID, "include_docker_compose": "yes", "include_github_actions": "yes"}

    post_gen.main(json.dumps(answers), tmp_path)

    assert (tmp_path / "docker-compose.yml").exists()
    assert (tmp_path / ".github").exists()


# The choice answers the hook re-checks (post_gen_project.py and the Makefile branch on them):
# answer name -> its options in cookiecutter.json, in the order the prompt offers them.
CHECKED_CHOICES = {"egress": EGRESS_CHOICES, "storage": STORAGE_CHOICES, "example_dataset": EXAMPLE_DATASET_CHOICES}


@pytest.mark.parametrize(("answer", "value"), [(a, v) for a, options in CHECKED_CHOICES.items() for v in options])
def test_every_option_of_a_checked_choice_is_accepted(pre_gen, answer, value):
    assert getattr(pre_gen, f"check_{answer}")(value) == []
    assert pre_gen.validate({**VALID, answer: value}) == []


# --no-input and extra_context hand the hook any string, not one of the choices.
@pytest.mark.parametrize(
    ("answer", "value"),
    [("egress", value) for value in ("", "Kafka", "kafka,postgres", "both ", "postgresql")]
    + [("storage", value) for value in ("", "S3", "s3a", "local ", "minio")]
    + [("example_dataset", value) for value in ("", "Orders", "yes")],
)
def test_a_checked_choice_outside_its_options_is_refused_listing_them(pre_gen, answer, value):
    listed = ", ".join(CHECKED_CHOICES[answer])
    assert getattr(pre_gen, f"check_{answer}")(value) == [f"{answer}: {value!r} is not one of {listed}"]


@pytest.mark.parametrize("answer", CHECKED_CHOICES)
def test_the_hook_offers_the_choices_of_cookiecutter_json_in_their_order(pre_gen, answer):
    assert list(getattr(pre_gen, f"{answer.upper()}_CHOICES")) == CHECKED_CHOICES[answer]


PKG = "src/clickstream_lakehouse"
KAFKA_EGRESS = {f"{PKG}/pipeline/egress/kafka.py", "tests/test_egress_kafka.py"}
POSTGRES_EGRESS = {
    f"{PKG}/pipeline/egress/postgres.py",
    f"{PKG}/devtools/postgres_local.py",
    f"{PKG}/cli/postgres_local.py",
    "tests/test_egress_postgres.py",
    "tests/test_postgres_local.py",
}
# Shared by both streams: the change feed they read.
SHARED_EGRESS = {f"{PKG}/pipeline/egress/changes.py"}
# The package's __init__ finds the egresses a bake kept (none after "none"), so it always stays.
EGRESS_PACKAGE = {f"{PKG}/pipeline/egress/__init__.py"}
# Neighbours of the pruned files that no answer removes.
ALWAYS_KEPT = {f"{PKG}/pipeline/streams.py", f"{PKG}/devtools/kafka_local.py", "tests/test_sinks.py", *EGRESS_PACKAGE}


def write_files(root, names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("# dummy\n")


def files_under(root):
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


@pytest.mark.parametrize(
    ("egress", "kept"),
    [
        ("both", KAFKA_EGRESS | POSTGRES_EGRESS | SHARED_EGRESS),
        ("kafka", KAFKA_EGRESS | SHARED_EGRESS),
        ("postgres", POSTGRES_EGRESS | SHARED_EGRESS),
        ("none", set()),
    ],
)
def test_post_gen_keeps_the_egress_streams_chosen_and_nothing_else(post_gen, tmp_path, egress, kept):
    write_files(tmp_path, KAFKA_EGRESS | POSTGRES_EGRESS | SHARED_EGRESS | ALWAYS_KEPT)

    assert post_gen.main(json.dumps({**VALID, "egress": egress}), tmp_path) == 0

    assert files_under(tmp_path) == kept | ALWAYS_KEPT | {".cookiecutter.json"}


@pytest.mark.parametrize("egress", ["kafka", "postgres", "none"])
def test_post_gen_fails_loudly_when_a_file_it_prunes_is_missing(post_gen, tmp_path, egress):
    write_files(tmp_path, ALWAYS_KEPT)

    with pytest.raises(FileNotFoundError):
        post_gen.main(json.dumps({**VALID, "egress": egress}), tmp_path)


def test_post_gen_fails_loudly_when_a_file_it_always_ships_is_gone(post_gen, tmp_path):
    with pytest.raises(FileNotFoundError):
        post_gen.main(json.dumps({**VALID, "include_docker_compose": "no"}), tmp_path)
