"""Config files, environment overrides and the errors that name the bad key."""

import pickle
import re
from importlib import resources
from pathlib import Path

import pytest

from {{ cookiecutter.package_name }}.cli.local_servers import resolve_local_bootstrap
from {{ cookiecutter.package_name }}.devtools.kafka_secure import SecureFiles, create_certificates
from {{ cookiecutter.package_name }}.pipeline.config import ConfigError, load_config
from {{ cookiecutter.package_name }}.pipeline.contract import Contract, Field, Kind
from {{ cookiecutter.package_name }}.pipeline.dataset import Aggregate, AggregateKind, Dataset, Gold
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS, datasets_kafka, kafka_of
from {{ cookiecutter.package_name }}.pipeline.egress import configure, installed, installed_names, settings_of, targets
from {{ cookiecutter.package_name }}.pipeline.kafka.clients import client_config, spark_source_options

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
{%- if cookiecutter.storage == "s3" %}
    assert config.lakehouse_root == "s3a://lakehouse/{{ cookiecutter.project_slug }}"
    assert config.s3.endpoint == "local"
{%- else %}
    assert Path(config.lakehouse_root).is_absolute()
{%- endif %}


def test_the_local_config_turns_on_every_egress_of_the_project_and_pipeline_egress_narrows_them():
    config = load_config("local", environ={})
    assert config.egress is None, "parsed by the egress package, not by config"
    assert set(configure(config, environ={}).egress) == set(installed_names())
    assert configure(config, environ={"PIPELINE_EGRESS": "none"}).egress == {}
    with pytest.raises(ConfigError, match="PIPELINE_EGRESS: egress_nowhere is not an egress section"):
        configure(config, environ={"PIPELINE_EGRESS": "egress_nowhere"})


# A dataset of this test's own, beside the project's: its name is none a bake ships.
RETURNS = Dataset(
    "returns",
    Contract(fields=(Field("return_id", Kind.STRING), Field("returned_at", Kind.TIMESTAMP)), event_time="returned_at"),
    (Gold("by_minute", (Aggregate(AggregateKind.COUNT),)),),
)


def test_a_second_dataset_reads_the_topics_of_its_own_table_and_a_topic_feeds_one_dataset(tmp_path):
    both = (*DATASETS, RETURNS)
    returns_table = '\n[dataset_returns]\ntopics = ["returns", "recalls"]\ncompacted_topics = ["recalls"]\n'
    config = load_config(config_file=config_file(tmp_path, PACKAGED_LOCAL + returns_table), environ={})

    first = kafka_of(config, DATASETS[0], {}, both)
    returns = kafka_of(config, RETURNS, {}, both)
    assert first == config.kafka
    assert (returns.topics, returns.compacted_topics) == (("returns", "recalls"), ("recalls",))
    assert returns.bootstrap_servers == config.kafka.bootstrap_servers
    # Overridden per environment by DATASET_<NAME>_<KEY>.
    overridden = kafka_of(config, RETURNS, {"DATASET_RETURNS_TOPICS": "returns-v2, recalls"}, both)
    assert (overridden.topics, overridden.compacted_topics) == (("returns-v2", "recalls"), ("recalls",))

    with pytest.raises(ConfigError, match="dataset_returns: unknown section: no dataset of this project"):
        kafka_of(config, DATASETS[0], {}, DATASETS)
    taken = config.kafka.topics[0]
    shared = config_file(tmp_path, PACKAGED_LOCAL + f'\n[dataset_returns]\ntopics = ["{taken}"]\n')
    with pytest.raises(ConfigError, match=f"dataset_returns.topics: topic {taken} is dataset events's already"):
        kafka_of(load_config(config_file=shared, environ={}), RETURNS, {}, both)
    unread_table = '\n[dataset_returns]\ntopics = ["returns"]\ncompacted_topics = ["x"]\n'
    unread = config_file(tmp_path, PACKAGED_LOCAL + unread_table)
    with pytest.raises(ConfigError, match=r"dataset_returns.compacted_topics: \['x'\] not among its topics"):
        kafka_of(load_config(config_file=unread, environ={}), RETURNS, {}, both)


def test_a_dataset_runs_where_the_config_names_its_topics_and_pipeline_datasets_narrows_them(tmp_path):
    both = (*DATASETS, RETURNS)
    with_table = config_file(tmp_path, PACKAGED_LOCAL + '\n[dataset_returns]\ntopics = ["returns"]\n')
    config = load_config(config_file=with_table, environ={})
    # The packaged config's own second datasets, if any, run too: only this test's is counted here.
    assert "returns" in datasets_kafka(config, {}, both)
    assert "returns" not in datasets_kafka(load_config(environ={}), {}, both), "no table: off here"
    with pytest.raises(ConfigError, match="dataset_returns: missing: dataset returns runs where this table"):
        kafka_of(load_config(environ={}), RETURNS, {}, both)

    assert set(datasets_kafka(config, {"PIPELINE_DATASETS": "none"}, both)) == {DATASETS[0].name}
    assert set(datasets_kafka(config, {"PIPELINE_DATASETS": "returns"}, both)) == {DATASETS[0].name, "returns"}
    with pytest.raises(ConfigError, match="PIPELINE_DATASETS: leaves dataset returns out"):
        kafka_of(config, RETURNS, {"PIPELINE_DATASETS": "none"}, both)
    with pytest.raises(ConfigError, match="PIPELINE_DATASETS: nowhere: no such dataset"):
        datasets_kafka(config, {"PIPELINE_DATASETS": "nowhere"}, both)
    with pytest.raises(ConfigError, match="dataset_returns: missing: PIPELINE_DATASETS names dataset returns"):
        datasets_kafka(load_config(environ={}), {"PIPELINE_DATASETS": "returns"}, both)


def test_an_egress_table_of_an_egress_the_project_lacks_is_refused_naming_it(tmp_path):
    path = config_file(tmp_path, PACKAGED_LOCAL + '\n[egress_nowhere]\ntopic = "x"\n')
    config = load_config(config_file=path, environ={})

    assert config.egress_sections["egress_nowhere"] == {"topic": "x"}
    with pytest.raises(ConfigError, match="^egress_nowhere: unknown section: this project has no such egress"):
        configure(config, environ={"PIPELINE_EGRESS": "none"})


@pytest.mark.skipif(not installed_names(), reason="a bake without an egress has no egress section")
def test_each_gold_an_egress_names_has_a_stream_of_its_own_and_a_wrong_name_stops_at_start_up():
    egress = installed_names()[0]
    module = installed()[egress]
    section, variable = module.SECTION, module.Settings.variables("golds")[0]
    config = load_config("local", environ={})
    first = getattr(settings_of(configure(config, environ={}))[egress], module.DESTINATION)
    others = [(dataset, gold) for dataset in DATASETS for gold in dataset.golds][1:]
    entries = {f"{dataset.name}.{gold.name}": f"out_{dataset.name}_{gold.name}" for dataset, gold in others}
    environ = {variable: ", ".join(f"{name}={out}" for name, out in entries.items())}

    published = [each for each in targets(configure(config, environ)).values() if each.stream.endswith(egress)]
    assert [(each.stream, each.destination) for each in published] == [
        (egress, first),
        *((f"{dataset.gold_stream(gold)}_{egress}", f"out_{dataset.name}_{gold.name}") for dataset, gold in others),
    ]
    assert [(each.dataset, each.gold) for each in published] == [(DATASETS[0], DATASETS[0].golds[0]), *others]
    refusals = {
        f"{DATASETS[0].name}.nowhere=x": rf"^{section}\.golds: '{DATASETS[0].name}\.nowhere' is no declared gold",
        f"{DATASETS[0].name}.{DATASETS[0].golds[0].name}=x": rf"^{section}\.golds: .* publishes already$",
        "no-equals-sign": rf"^{variable}: 'no-equals-sign' is not key=value \({section}\.golds\)",
    }
    if others:
        shared = f"{others[0][0].name}.{others[0][1].name}={first}"
        refusals[shared] = rf"^{section}\.golds: '{first}' is where stream {egress} publishes already"
    for value, refusal in refusals.items():
        with pytest.raises(ConfigError, match=refusal):
            configure(config, environ={variable: value})


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


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"LAKEHOUSE_ROOT": "s3://bucket/lake"}, "lakehouse.root: 's3://bucket/lake': write s3a://bucket/lake"),
        ({"LAKEHOUSE_ROOT": "s3a://Bad_Bucket/lake"}, "lakehouse.root: 's3a://Bad_Bucket/lake' is not s3a://<bucket>"),
        ({"S3_ENDPOINT": "127.0.0.1:9000"}, "'127.0.0.1:9000' is not an http(s)://host[:port] URL"),
        ({"S3_ENDPOINT": "http://host:9000/bucket"}, "is not an http(s)://host[:port] URL"),
        ({"S3_PATH_STYLE_ACCESS": "sometimes"}, "S3_PATH_STYLE_ACCESS: 'sometimes' is not true or false"),
    ],
)
def test_a_bad_s3_setting_is_refused_naming_it(environ, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config("local", environ=environ)


def test_s3_settings_come_from_the_environment():
    environ = {
        "LAKEHOUSE_ROOT": "s3a://lake-bucket/clicks/",
        "S3_ENDPOINT": "https://minio.example.internal:9000/",
        "S3_PATH_STYLE_ACCESS": "true",
        "S3_REGION": "eu-west-1",
    }
    config = load_config("local", environ=environ)
    assert config.lakehouse_root == "s3a://lake-bucket/clicks"
    assert (config.s3.endpoint, config.s3.path_style_access, config.s3.region) == (
        "https://minio.example.internal:9000",
        True,
        "eu-west-1",
    )


def test_pipeline_env_selects_the_file():
    credentials = {"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}
    config = load_config(environ={"PIPELINE_ENV": "prod", **credentials})

    # Values only conf/prod.toml holds.
    assert config.spark_master == "spark://spark-master.example.internal:7077"
    assert config.kafka.max_offsets_per_trigger == 500000
{%- if cookiecutter.storage == "s3" %}
    assert config.lakehouse_root == "s3a://example-lakehouse/{{ cookiecutter.project_slug }}"
{%- else %}
    assert config.lakehouse_root == "/data/lakehouse"
{%- endif %}
    # Production has no development broker: [kafka_local] is left out and takes its default.
    assert "[kafka_local]" not in resources.files("{{ cookiecutter.package_name }}").joinpath("conf", "prod.toml").read_text()
    assert config.kafka_local_home == Path(".kafka-local")


def test_every_key_has_a_variable_named_after_its_section_and_key():
    config = load_config(
        "local",
        environ={
            "SPARK_SHUFFLE_PARTITIONS": "7",
            "SPARK_UI_ENABLED": "true",
            "KAFKA_FAIL_ON_DATA_LOSS": "false",
            "PIPELINE_GOLD_WINDOW": "5 minutes",
            "KAFKA_LOCAL_HOME": "",  # empty: unset
        },
    )

    assert (config.shuffle_partitions, config.spark_ui_enabled) == (7, True)
    assert config.kafka.fail_on_data_loss is False and config.gold_window == "5 minutes"
    assert config.kafka_local_home == Path(".kafka-local")
    with pytest.raises(ConfigError, match=r"^SPARK_UI_ENABLED: 'maybe' is not true or false \(spark.ui_enabled\)"):
        load_config("local", environ={"SPARK_UI_ENABLED": "maybe"})


def test_every_error_is_named_at_once_and_a_value_from_the_environment_names_its_variable(tmp_path):
    path = config_file(tmp_path, PACKAGED_LOCAL.replace("shuffle_partitions = 4", "shuffle_partitions = 0"))

    with pytest.raises(ConfigError) as error:
        load_config(config_file=path, environ={"KAFKA_STARTING_OFFSETS": "beginning"})

    assert str(error.value).splitlines() == [
        "kafka.starting_offsets: 'beginning' is not 'earliest' or 'latest' (set by KAFKA_STARTING_OFFSETS)",
        "spark.shuffle_partitions: Input should be greater than 0, not 0",
    ]


def test_a_table_written_as_a_value_is_named_even_when_a_variable_sets_one_of_its_keys(tmp_path):
    spark = '[spark]\nmaster = "local[2]"\nshuffle_partitions = 4\nui_enabled = false\n'
    assert spark in PACKAGED_LOCAL
    path = config_file(tmp_path, "spark = 3\n" + PACKAGED_LOCAL.replace(spark, ""))

    with pytest.raises(ConfigError, match=r"(?m)^spark: expected table, got int 3$"):
        load_config(config_file=path, environ={"SPARK_MASTER": "local[1]"})


def test_a_secret_in_the_config_file_is_refused_naming_its_variable(tmp_path):
    path = secure_config_file(tmp_path, 'security_protocol = "SASL_SSL"\nsasl_password = "x"')

    with pytest.raises(ConfigError, match="^kafka.sasl_password: a secret never goes in a config file; set KAFKA_SASL"):
        load_config(config_file=path, environ={})


def test_a_config_pickles_with_its_secrets_hidden_from_its_repr(tmp_path):
    path = secure_config_file(tmp_path, 'security_protocol = "SASL_SSL"\nsasl_mechanism = "PLAIN"')
    environ = {"KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": "s3cr3t-Pa55"}
    config = configure(load_config(config_file=path, environ=environ), environ={})

    copy = pickle.loads(pickle.dumps(config))

    assert copy == config and copy.kafka.sasl_password.get_secret_value() == "s3cr3t-Pa55"
    assert "s3cr3t-Pa55" not in repr(copy) and "s3cr3t-Pa55" not in str(copy.model_dump())


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ('root = "', 'roots = "typo"\nroot = "', "lakehouse.roots: unknown key"),
        ('master = "local[2]"\n', "", "spark.master: missing"),
        ("shuffle_partitions = 4", 'shuffle_partitions = "4"', "spark.shuffle_partitions: expected int"),
        ("fail_on_data_loss = true", "fail_on_data_loss = 1", "kafka.fail_on_data_loss: expected bool"),
        ("max_offsets_per_trigger = 100000", "max_offsets_per_trigger = 0", "kafka.max_offsets_per_trigger"),
        ('starting_offsets = "earliest"', 'starting_offsets = "beginning"', "kafka.starting_offsets"),
        ('security_protocol = "PLAINTEXT"', 'security_protocol = "TLS"', "kafka.security_protocol"),
        ('gold_window = "', 'gold_window = "every ', "pipeline.gold_window"),
        ("[spark]", "[sparks]", "sparks: unknown section"),
        ("[lakehouse]", "[lakehouses]", "lakehouse: missing"),
        ('topics = ["', 'topics = [1, "', "kafka.topics: expected str, got int 1"),
    ],
)
def test_bad_value_fails_at_start_naming_the_key(tmp_path, old, new, named):
    assert old in PACKAGED_LOCAL
    path = config_file(tmp_path, PACKAGED_LOCAL.replace(old, new, 1))

    with pytest.raises(ConfigError, match=named.replace("[", r"\[")):
        load_config(config_file=path, environ={})


def test_the_kafka_source_holds_an_empty_fetch_as_long_as_fetch_max_wait_ms_says():
    environ = {"KAFKA_BOOTSTRAP_SERVERS": "broker:9092"}
    default = load_config("local", environ=environ)
    shortened = load_config("local", environ={**environ, "KAFKA_FETCH_MAX_WAIT_MS": "40"})

    assert spark_source_options(default)["kafka.fetch.max.wait.ms"] == "100"
    assert spark_source_options(shortened)["kafka.fetch.max.wait.ms"] == "40"
    with pytest.raises(ConfigError, match=r"^kafka.fetch_max_wait_ms: .* \(set by KAFKA_FETCH_MAX_WAIT_MS\)"):
        load_config("local", environ={**environ, "KAFKA_FETCH_MAX_WAIT_MS": "0"})


def test_bad_topic_from_the_environment_names_the_key():
    with pytest.raises(ConfigError, match="kafka.topics"):
        load_config("local", environ={"KAFKA_TOPICS": "ok,not ok"})


def test_compacted_topics_must_be_topics_bronze_reads():
    config = load_config("local", environ={"KAFKA_TOPICS": "events,customers", "KAFKA_COMPACTED_TOPICS": "customers"})
    assert config.kafka.compacted_topics == ("customers",)
    assert load_config("local", environ={}).kafka.compacted_topics == ()
    with pytest.raises(ConfigError, match=r"kafka.compacted_topics.*\['orders'\] not in kafka.topics"):
        load_config("local", environ={"KAFKA_TOPICS": "events", "KAFKA_COMPACTED_TOPICS": "orders"})


def test_metrics_are_off_unless_a_port_is_set_and_a_bad_port_names_the_key():
    credentials = {"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}
    assert load_config("local", environ={}).metrics_port == 0
    assert load_config("prod", environ=credentials).metrics_port == 0
    assert load_config("local", environ={"METRICS_PORT": "9108"}).metrics_port == 9108
    with pytest.raises(ConfigError, match="metrics.port"):
        load_config("local", environ={"METRICS_PORT": "70000"})


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
    with pytest.raises(ConfigError, match="kafka.sasl_username: .* KAFKA_SASL_USERNAME"):
        load_config(config_file=path, environ={"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})
    with pytest.raises(ConfigError, match="kafka.sasl_password_file: .* KAFKA_SASL_PASSWORD"):
        load_config(config_file=path, environ={"KAFKA_BOOTSTRAP_SERVERS": "b:9092", "KAFKA_SASL_USERNAME": "svc"})

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


# --- TLS and SASL settings ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pems(tmp_path_factory) -> SecureFiles:
    return create_certificates(tmp_path_factory.mktemp("pems"))


def secure_config_file(tmp_path: Path, settings: str) -> Path:
    """The packaged local config with its security_protocol line replaced by ``settings``."""
    return config_file(tmp_path, PACKAGED_LOCAL.replace('security_protocol = "PLAINTEXT"', settings, 1))


def test_sasl_plaintext_is_refused_like_the_bake_refuses_it(tmp_path):
    path = secure_config_file(tmp_path, 'security_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"')
    with pytest.raises(ConfigError, match="kafka.security_protocol: 'SASL_PLAINTEXT' is not one of"):
        load_config(config_file=path, environ={"KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"})


def test_tls_and_sasl_settings_reach_both_kinds_of_client_alike(tmp_path, pems):
    password_file = tmp_path / "sasl.password"
    password_file.write_text("from-a-file-0815\n")
    path = secure_config_file(
        tmp_path,
        f"""security_protocol = "SASL_SSL"
sasl_mechanism = "SCRAM-SHA-256"
sasl_username = "svc-pipeline"
sasl_password_file = "{password_file}"
ssl_ca_location = "{pems.ca}"
ssl_certificate_location = "{pems.client_certificate}"
ssl_key_location = "{pems.client_key}"
""",
    )
    config = load_config(config_file=path, environ={"KAFKA_BOOTSTRAP_SERVERS": "broker:9093"})

    librdkafka = client_config(config)
    assert librdkafka["security.protocol"] == "SASL_SSL"
    assert librdkafka["sasl.password"] == "from-a-file-0815"  # one trailing newline is not part of it
    assert librdkafka["ssl.ca.location"] == str(pems.ca)
    assert librdkafka["ssl.certificate.location"] == str(pems.client_certificate)
    assert librdkafka["ssl.key.location"] == str(pems.client_key)
    assert librdkafka["ssl.endpoint.identification.algorithm"] == "https"
    jvm = spark_source_options(config)
    assert jvm["kafka.security.protocol"] == "SASL_SSL"
    assert jvm["kafka.sasl.mechanism"] == "SCRAM-SHA-256"
    assert 'username="svc-pipeline" password="from-a-file-0815"' in jvm["kafka.sasl.jaas.config"]
    assert (jvm["kafka.ssl.truststore.type"], jvm["kafka.ssl.truststore.location"]) == ("PEM", str(pems.ca))
    assert jvm["kafka.ssl.keystore.type"] == "PEM"
    assert jvm["kafka.ssl.keystore.certificate.chain"] == pems.client_certificate.read_text()
    assert jvm["kafka.ssl.keystore.key"] == pems.client_key.read_text()
    assert jvm["kafka.ssl.endpoint.identification.algorithm"] == "https"
    assert "from-a-file-0815" not in repr(config)

    relaxed = load_config(
        config_file=secure_config_file(
            tmp_path, f'security_protocol = "SSL"\nssl_ca_location = "{pems.ca}"\nssl_endpoint_identification = false'
        ),
        environ={"KAFKA_BOOTSTRAP_SERVERS": "broker:9093"},
    )
    assert client_config(relaxed)["ssl.endpoint.identification.algorithm"] == "none"
    assert spark_source_options(relaxed)["kafka.ssl.endpoint.identification.algorithm"] == ""
    # Without a CA file the system's CAs are used, by librdkafka too.
    system = load_config(
        config_file=secure_config_file(tmp_path, 'security_protocol = "SSL"'),
        environ={"KAFKA_BOOTSTRAP_SERVERS": "broker:9093"},
    )
    assert client_config(system)["ssl.ca.location"] == "probe"
    assert "kafka.ssl.truststore.location" not in spark_source_options(system)


def _pkcs1_key(tmp_path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = tmp_path / "sec1.pem"
    key = ec.generate_private_key(ec.SECP256R1())
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
        )
    )
    return path


def _pbes2_key(tmp_path: Path, pems: SecureFiles) -> Path:
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(pems.client_key.read_bytes(), None)
    path = tmp_path / "pbes2.pem"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
        )
    )
    return path


@pytest.mark.parametrize(
    ("settings", "environ", "named"),
    [
        ('security_protocol = "SSL"\nssl_ca_location = "{tmp}/nowhere.pem"', {}, "ssl_ca_location: .* does not exist"),
        ('security_protocol = "SSL"\nssl_ca_location = "{tmp}/pipeline.toml"', {}, "ssl_ca_location: .* holds no PEM"),
        (
            'security_protocol = "SSL"\nssl_certificate_location = "{cert}"',
            {},
            "kafka.ssl_key_location: kafka.ssl_certificate_location is set",
        ),
        (
            'security_protocol = "SSL"\nssl_key_location = "{key}"',
            {},
            "kafka.ssl_certificate_location: kafka.ssl_key_location is set",
        ),
        (
            'security_protocol = "SSL"\nssl_certificate_location = "{cert}"\nssl_key_location = "{cert}"',
            {},
            "kafka.ssl_key_location: .* holds no PEM private key",
        ),
        (
            'security_protocol = "SSL"\nssl_certificate_location = "{cert}"\nssl_key_location = "{sec1}"',
            {},
            "kafka.ssl_key_location: .* PKCS#1/SEC1 key; convert it",
        ),
        (
            'security_protocol = "SSL"\nssl_certificate_location = "{cert}"\nssl_key_location = "{pbes2}"',
            {"KAFKA_SSL_KEY_PASSWORD": "pw"},
            "kafka.ssl_key_location: .* PBES2",
        ),
        (
            'security_protocol = "SSL"\nssl_certificate_location = "{cert}"\nssl_key_location = "{key}"',
            {"KAFKA_SSL_KEY_PASSWORD": "pw"},
            "kafka.ssl_key_password_file: the key in kafka.ssl_key_location is not encrypted",
        ),
        ('security_protocol = "SSL"\nssl_key_password_file = "{cert}"', {}, "kafka.ssl_key_password_file: set without"),
        ('security_protocol = "SSL"\nssl_endpoint_identification = "no"', {}, "ssl_endpoint_identification: expected"),
        ('security_protocol = "PLAINTEXT"\nssl_ca_location = "{ca}"', {}, "kafka.ssl_ca_location: only valid with"),
        ('security_protocol = "SSL"\nsasl_username = "svc"', {}, "kafka.sasl_username: only valid with .* SASL_SSL,"),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\nsasl_password_file = "{tmp}/empty"',
            {"KAFKA_SASL_USERNAME": "svc"},
            "kafka.sasl_password_file: .* is empty",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\nsasl_password_file = "{tmp}/empty"',
            {"KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": "p"},
            "kafka.sasl_password_file: set together with KAFKA_SASL_PASSWORD",
        ),
        (
            'security_protocol = "SASL_SSL"\nsasl_mechanism = "GSSAPI"',
            {"KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": "p"},
            "kafka.sasl_mechanism: 'GSSAPI' is not one of",
        ),
    ],
)
def test_a_bad_security_setting_fails_at_start_naming_the_key(tmp_path, pems, settings, environ, named):
    (tmp_path / "empty").write_text("")
    text = settings.format(
        tmp=tmp_path,
        ca=pems.ca,
        cert=pems.client_certificate,
        key=pems.client_key,
        sec1=_pkcs1_key(tmp_path),
        pbes2=_pbes2_key(tmp_path, pems),
    )
    path = secure_config_file(tmp_path, text)

    with pytest.raises(ConfigError, match=named):
        load_config(config_file=path, environ={"KAFKA_BOOTSTRAP_SERVERS": "broker:9093", **environ})


def test_security_settings_come_from_the_environment_too(pems):
    config = load_config(
        "local",
        environ={
            "KAFKA_BOOTSTRAP_SERVERS": "broker:9093",
            "KAFKA_SECURITY_PROTOCOL": "SSL",
            "KAFKA_SSL_CA_LOCATION": str(pems.ca),
            "KAFKA_SSL_CERTIFICATE_LOCATION": str(pems.client_certificate),
            "KAFKA_SSL_KEY_LOCATION": str(pems.client_key),
        },
    )
    assert config.kafka.security_protocol == "SSL"
    assert config.kafka.ssl_ca_location == str(pems.ca)
    assert config.kafka.ssl_key_location == str(pems.client_key)


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        (
            {"SCHEMA_REGISTRY_URL": "https://lake:pa55word@registry.example.com"},
            r"^schema_registry\.url: holds credentials \(user:password@\); set",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "https://registry.example.com", "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME": "lake"},
            r"^schema_registry\.basic_auth_password_file: basic_auth_username is set; .*SCHEMA_REGISTRY_BASIC_AUTH_",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "https://registry.example.com", "SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD": "pa55word"},
            r"^schema_registry\.basic_auth_username: a password is set for HTTP basic auth but no user",
        ),
        (
            {
                "SCHEMA_REGISTRY_URL": "https://registry.example.com",
                "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME": "lake",
                "SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD": "pa55word",
                "SCHEMA_REGISTRY_BEARER_TOKEN": "t0ken",
            },
            r"^schema_registry\.bearer_token_file: set together with basic_auth_username",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "http://registry.example.com", "SCHEMA_REGISTRY_BEARER_TOKEN": "t0ken"},
            r"^schema_registry\.bearer_token_file: credentials would travel unencrypted to http://registry",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "http://registry.example.com", "SCHEMA_REGISTRY_SSL_CA_LOCATION": "{ca}"},
            r"^schema_registry\.ssl_ca_location: set for a plain http:// registry",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "https://registry.example.com", "SCHEMA_REGISTRY_SSL_CA_LOCATION": "{key}"},
            r"^schema_registry\.ssl_ca_location: .* holds no PEM certificate",
        ),
        (
            {"SCHEMA_REGISTRY_URL": "https://registry.example.com", "SCHEMA_REGISTRY_BEARER_TOKEN_FILE": "{missing}"},
            r"^schema_registry\.bearer_token_file: .* does not exist",
        ),
    ],
    ids=[
        "url-with-userinfo",
        "user-without-password",
        "password-without-user",
        "two-kinds",
        "plain-http",
        "ca-on-http",
        "ca-not-a-certificate",
        "token-file-missing",
    ],
)
def test_a_bad_schema_registry_setting_fails_at_start_naming_it_never_echoing_a_secret(tmp_path, pems, environ, named):
    paths = {"ca": str(pems.ca), "key": str(pems.client_key), "missing": str(tmp_path / "none")}
    environ = {name: value.format(**paths) for name, value in environ.items()}

    with pytest.raises(ConfigError, match=named) as refused:
        load_config("local", environ=environ)

    assert "pa55word" not in str(refused.value) and "t0ken" not in str(refused.value)


def test_schema_registry_credentials_come_from_a_file_or_the_environment_and_are_never_shown(tmp_path, pems):
    from {{ cookiecutter.package_name }}.pipeline.formats.registry import RegistryAccess, client_conf

    token_file = tmp_path / "token"
    token_file.write_text("t0ken-from-a-file\n")
    url = "https://registry.example.com/apis/ccompat/v7"
    by_file = load_config(
        "local",
        environ={
            "SCHEMA_REGISTRY_URL": url,
            "SCHEMA_REGISTRY_SSL_CA_LOCATION": str(pems.ca),
            "SCHEMA_REGISTRY_BEARER_TOKEN_FILE": str(token_file),
        },
    )
    access = RegistryAccess.of(by_file.schema_registry)
    conf = client_conf(access)
    assert conf["bearer.auth.token"] == "t0ken-from-a-file" and conf["ssl.ca.location"] == str(pems.ca)
    by_variable = load_config(
        "local",
        environ={
            "SCHEMA_REGISTRY_URL": url,
            "SCHEMA_REGISTRY_BASIC_AUTH_USERNAME": "lake",
            "SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD": "pa55word",
        },
    )
    assert client_conf(RegistryAccess.of(by_variable.schema_registry))["basic.auth.user.info"] == "lake:pa55word"
    for config in (by_file, by_variable):
        shown = repr(config) + repr(RegistryAccess.of(config.schema_registry)) + str(config.model_dump())
        assert "t0ken" not in shown and "pa55word" not in shown
        assert pickle.loads(pickle.dumps(config)) == config
    password = 'basic_auth_password = "x"\n'
    if "[schema_registry]\n" in PACKAGED_LOCAL:
        with_password = PACKAGED_LOCAL.replace("[schema_registry]\n", "[schema_registry]\n" + password)
    else:
        with_password = PACKAGED_LOCAL + "\n[schema_registry]\n" + password
    with pytest.raises(ConfigError, match=r"^schema_registry\.basic_auth_password: a secret never goes in a config"):
        load_config(config_file=config_file(tmp_path, with_password), environ={})
