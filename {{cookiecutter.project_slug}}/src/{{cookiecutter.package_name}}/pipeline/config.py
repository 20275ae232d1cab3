"""Pipeline configuration: one TOML file per environment plus environment overrides.

Every key is checked at start-up; a bad value stops the program with a message
that names the key, before Spark or Kafka are touched. Secrets (SASL credentials)
are read from the environment only and never printed.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

ENV_VAR = "PIPELINE_ENV"
CONFIG_FILE_VAR = "PIPELINE_CONFIG"
DEFAULT_ENV = "local"
LOCAL_BOOTSTRAP = "local"
# conf/ sits at the top of the package, where a team looks for it.
CONF_PACKAGE = __package__.rpartition(".")[0]

# (section, key) <- environment variable. Lists are comma-separated.
ENV_OVERRIDES = {
    ("kafka", "bootstrap_servers"): "KAFKA_BOOTSTRAP_SERVERS",
    ("kafka", "topics"): "KAFKA_TOPICS",
    ("lakehouse", "root"): "LAKEHOUSE_ROOT",
    ("spark", "master"): "SPARK_MASTER",
    ("kafka_local", "home"): "KAFKA_LOCAL_HOME",
    ("kafka", "max_offsets_per_trigger"): "KAFKA_MAX_OFFSETS_PER_TRIGGER",
    ("pipeline", "trigger_interval"): "PIPELINE_TRIGGER_INTERVAL",
}
SASL_USERNAME_VAR = "KAFKA_SASL_USERNAME"
SASL_PASSWORD_VAR = "KAFKA_SASL_PASSWORD"

TOPIC_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
DURATION_PATTERN = re.compile(r"(\d+) (second|minute|hour|day)s?")
SECURITY_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_SSL", "SASL_PLAINTEXT"}
SASL_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message names the key."""


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str
    topics: tuple[str, ...]
    security_protocol: str
    sasl_mechanism: str | None
    starting_offsets: str
    max_offsets_per_trigger: int
    fail_on_data_loss: bool
    sasl_username: str | None = field(default=None, repr=False)
    sasl_password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Config:
    env: str
    kafka: KafkaConfig
    kafka_local_home: Path
    lakehouse_root: str
    spark_master: str
    shuffle_partitions: int
    spark_ui_enabled: bool
    gold_window: str
    trigger_interval: str


SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "kafka": {
        "bootstrap_servers": str,
        "topics": list,
        "security_protocol": str,
        "sasl_mechanism": str,
        "starting_offsets": str,
        "max_offsets_per_trigger": int,
        "fail_on_data_loss": bool,
    },
    "kafka_local": {"home": str},
    "lakehouse": {"root": str},
    "spark": {"master": str, "shuffle_partitions": int, "ui_enabled": bool},
    "pipeline": {"gold_window": str, "trigger_interval": str},
}
OPTIONAL_KEYS = {("kafka", "sasl_mechanism")}


def load_config(
    env: str | None = None,
    config_file: str | os.PathLike | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the config for ``env`` (default: $PIPELINE_ENV or 'local').

    ``config_file`` (or $PIPELINE_CONFIG) replaces the packaged file for that env.
    """
    environ = os.environ if environ is None else environ
    env = env or environ.get(ENV_VAR) or DEFAULT_ENV
    config_file = config_file or environ.get(CONFIG_FILE_VAR)
    raw = _read_toml(env, config_file)
    _apply_env_overrides(raw, environ)
    _check_shape(raw)
    return _build(env, raw, environ)


def duration_seconds(value: str, key: str) -> int:
    match = DURATION_PATTERN.fullmatch(value.strip())
    if not match:
        raise ConfigError(f"{key}: {value!r} is not a duration like '1 minute' or '30 seconds'")
    seconds = int(match.group(1)) * {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[match.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{key}: {value!r} must be longer than zero")
    return seconds


def _read_toml(env: str, config_file: str | os.PathLike | None) -> dict:
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_FILE_VAR}: config file {str(path)!r} does not exist")
        text, source = path.read_text(), str(path)
    else:
        packaged = resources.files(CONF_PACKAGE).joinpath("conf", f"{env}.toml")
        if not packaged.is_file():
            raise ConfigError(f"{ENV_VAR}: no config for environment {env!r} (looked for conf/{env}.toml)")
        text, source = packaged.read_text(), f"conf/{env}.toml"
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML: {error}") from None


def _apply_env_overrides(raw: dict, environ: Mapping[str, str]) -> None:
    for (section, key), var in ENV_OVERRIDES.items():
        value = environ.get(var)
        if value is None or value == "":
            continue
        expected = SCHEMA[section][key]
        if expected is list:
            parsed: object = [item.strip() for item in value.split(",")]
        elif expected is int:
            try:
                parsed = int(value)
            except ValueError:
                raise ConfigError(f"{var}: {value!r} is not a whole number ({section}.{key})") from None
        else:
            parsed = value
        raw.setdefault(section, {})[key] = parsed


def _check_shape(raw: dict) -> None:
    for section in raw:
        if section not in SCHEMA:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(SCHEMA)})")
    for section, keys in SCHEMA.items():
        values = raw.get(section, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: must be a table of keys")
        for key in values:
            if key not in keys:
                raise ConfigError(f"{section}.{key}: unknown key (known: {', '.join(keys)})")
        for key, expected in keys.items():
            if key not in values:
                if (section, key) in OPTIONAL_KEYS:
                    continue
                raise ConfigError(f"{section}.{key}: missing")
            value = values[key]
            # bool is an int in Python; a flag must not pass as a number or back.
            if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
                raise ConfigError(
                    f"{section}.{key}: expected {expected.__name__}, got {type(value).__name__} {value!r}"
                )


def _build(env: str, raw: dict, environ: Mapping[str, str]) -> Config:
    kafka = raw["kafka"]
    topics = tuple(kafka["topics"])
    if not topics:
        raise ConfigError("kafka.topics: at least one topic is needed")
    for topic in topics:
        if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic) or topic in {".", ".."}:
            raise ConfigError(f"kafka.topics: {topic!r} is not a valid Kafka topic name")
    if not kafka["bootstrap_servers"].strip():
        raise ConfigError("kafka.bootstrap_servers: must not be empty")
    protocol = kafka["security_protocol"]
    if protocol not in SECURITY_PROTOCOLS:
        raise ConfigError(f"kafka.security_protocol: {protocol!r} is not one of {sorted(SECURITY_PROTOCOLS)}")
    mechanism = kafka.get("sasl_mechanism")
    username = password = None
    if protocol.startswith("SASL_"):
        if mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"kafka.sasl_mechanism: {mechanism!r} is not one of {sorted(SASL_MECHANISMS)}")
        username, password = environ.get(SASL_USERNAME_VAR), environ.get(SASL_PASSWORD_VAR)
        if not username or not password:
            raise ConfigError(
                f"{SASL_USERNAME_VAR}/{SASL_PASSWORD_VAR}: kafka.security_protocol {protocol} "
                "needs both set in the environment"
            )
    elif mechanism is not None:
        raise ConfigError(f"kafka.sasl_mechanism: only valid with a SASL security_protocol, not {protocol}")
    if kafka["starting_offsets"] not in {"earliest", "latest"}:
        raise ConfigError(f"kafka.starting_offsets: {kafka['starting_offsets']!r} is not 'earliest' or 'latest'")
    if kafka["max_offsets_per_trigger"] <= 0:
        raise ConfigError("kafka.max_offsets_per_trigger: must be a positive number")
    if raw["spark"]["shuffle_partitions"] <= 0:
        raise ConfigError("spark.shuffle_partitions: must be a positive number")
    if not raw["lakehouse"]["root"].strip():
        raise ConfigError("lakehouse.root: must not be empty")
    pipeline = raw["pipeline"]
    duration_seconds(pipeline["gold_window"], "pipeline.gold_window")
    duration_seconds(pipeline["trigger_interval"], "pipeline.trigger_interval")
    return Config(
        env=env,
        kafka=KafkaConfig(
            bootstrap_servers=kafka["bootstrap_servers"].strip(),
            topics=topics,
            security_protocol=protocol,
            sasl_mechanism=mechanism,
            starting_offsets=kafka["starting_offsets"],
            max_offsets_per_trigger=kafka["max_offsets_per_trigger"],
            fail_on_data_loss=kafka["fail_on_data_loss"],
            sasl_username=username,
            sasl_password=password,
        ),
        kafka_local_home=Path(raw["kafka_local"]["home"]).expanduser(),
        lakehouse_root=_absolute_root(raw["lakehouse"]["root"]),
        spark_master=raw["spark"]["master"],
        shuffle_partitions=raw["spark"]["shuffle_partitions"],
        spark_ui_enabled=raw["spark"]["ui_enabled"],
        gold_window=pipeline["gold_window"].strip(),
        trigger_interval=pipeline["trigger_interval"].strip(),
    )


def _absolute_root(root: str) -> str:
    # URIs (s3a://, hdfs://, file:/) pass through; a plain path is made absolute so
    # tables and checkpoints do not move with the working directory of a later run.
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", root):
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())
