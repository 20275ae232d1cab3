"""Hook logic, called directly with answer dictionaries."""

import json

import pytest

VALID = {
    "project_name": "Clickstream Lakehouse",
    "project_slug": "clickstream-lakehouse",
    "package_name": "clickstream_lakehouse",
    "kafka_topics": "events",
    "gold_window_duration": "1 minute",
    "kafka_security_protocol": "PLAINTEXT",
    "kafka_sasl_mechanism": "none",
}


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
