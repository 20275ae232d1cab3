"""Config files, environment overrides and the errors that name the bad key."""

from importlib import resources
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.cli import resolve_local_bootstrap
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.pipeline.kafka_io import spark_source_options

PACKAGED_LOCAL = resources.files("{{ cookiecutter.package_name }}").joinpath("conf", "local.toml").read_text()


def config_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_local_config_loads_with_its_defaults(tmp_path):
    config = load_config("local", environ={})

    assert config.kafka.bootstrap_servers == "local"
    assert config.kafka.topics == tuple(t.strip() for t in {{ cookiecutter.kafka_topics | tojson }}.split(","))
    assert config.gold_window == {{ cookiecutter.gold_window_duration | tojson }}
    assert Path(config.lakehouse_root).is_absolute()


def test_environment_overrides_the_file():
    config = load_config(
        "local",
        environ={
            "KAFKA_BOOTSTRAP_SERVERS": "broker-a:9092,broker-b:9092",
            "LAKEHOUSE_ROOT": "s3a://bucket/lake/",
            "KAFKA_TOPICS": "one, two",
            "SPARK_MASTER": "local[1]",
        },
    )

    assert config.kafka.bootstrap_servers == "broker-a:9092,broker-b:9092"
    assert config.lakehouse_root == "s3a://bucket/lake"
    assert config.kafka.topics == ("one", "two")
    assert config.spark_master == "local[1]"


def test_pipeline_env_selects_the_file():
    credentials = {"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}
    config = load_config(environ={"PIPELINE_ENV": "prod", **credentials})

    # Values only conf/prod.toml holds.
    assert config.spark_master == "spark://spark-master.example.internal:7077"
    assert config.kafka.max_offsets_per_trigger == 500000
    assert config.lakehouse_root == "/data/lakehouse"


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ('root = "lakehouse"', 'root = "lakehouse"\nroots = "typo"', "lakehouse.roots: unknown key"),
        ('master = "local[2]"\n', "", "spark.master: missing"),
        ("shuffle_partitions = 4", 'shuffle_partitions = "4"', "spark.shuffle_partitions: expected int"),
        ("fail_on_data_loss = true", "fail_on_data_loss = 1", "kafka.fail_on_data_loss: expected bool"),
        ("max_offsets_per_trigger = 100000", "max_offsets_per_trigger = 0", "kafka.max_offsets_per_trigger"),
        ('starting_offsets = "earliest"', 'starting_offsets = "beginning"', "kafka.starting_offsets"),
        ('security_protocol = "PLAINTEXT"', 'security_protocol = "TLS"', "kafka.security_protocol"),
        ('gold_window = "', 'gold_window = "every ', "pipeline.gold_window"),
        ("[spark]", "[sparks]", "sparks: unknown section"),
    ],
)
def test_bad_value_fails_at_start_naming_the_key(tmp_path, old, new, named):
    assert old in PACKAGED_LOCAL
    path = config_file(tmp_path, PACKAGED_LOCAL.replace(old, new, 1))

    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        load_config(config_file=path, environ={})


def test_bad_topic_from_the_environment_names_the_key():
    with pytest.raises(ConfigError, match="kafka.topics"):
        load_config("local", environ={"KAFKA_TOPICS": "ok,not ok"})


def test_unknown_environment_names_pipeline_env():
    with pytest.raises(ConfigError, match="PIPELINE_ENV: no config for environment 'staging'"):
        load_config(environ={"PIPELINE_ENV": "staging"})


def test_not_a_toml_file_is_reported_with_its_name(tmp_path):
    path = config_file(tmp_path, "[kafka\n")
    with pytest.raises(ConfigError, match="pipeline.toml: not valid TOML"):
        load_config(config_file=path, environ={})


def test_sasl_credentials_come_from_the_environment_and_are_never_shown(tmp_path):
    text = PACKAGED_LOCAL.replace(
        'security_protocol = "PLAINTEXT"', 'security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"'
    )
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigError, match="KAFKA_SASL_USERNAME/KAFKA_SASL_PASSWORD"):
        load_config(config_file=path, environ={"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})

    secret = "s3cr3t-Pa55"
    config = load_config(
        config_file=path,
        environ={"KAFKA_BOOTSTRAP_SERVERS": "b:9092", "KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": secret},
    )
    assert secret not in repr(config)
    assert secret in spark_source_options(config)["kafka.sasl.jaas.config"]


def test_local_bootstrap_without_a_running_broker_names_the_key(tmp_path):
    config = load_config("local", environ={"KAFKA_LOCAL_HOME": str(tmp_path / "no-broker")})
    with pytest.raises(ConfigError, match="kafka.bootstrap_servers: is 'local' but no local broker runs"):
        resolve_local_bootstrap(config)


def test_the_pipeline_refuses_an_unresolved_local_bootstrap():
    config = load_config("local", environ={})
    with pytest.raises(ConfigError, match="kafka.bootstrap_servers: 'local' names the development broker"):
        spark_source_options(config)


def test_a_numeric_override_that_is_not_a_number_names_the_variable():
    with pytest.raises(ConfigError, match="KAFKA_MAX_OFFSETS_PER_TRIGGER: 'lots' is not a whole number"):
        load_config("local", environ={"KAFKA_MAX_OFFSETS_PER_TRIGGER": "lots"})
