"""Pipeline configuration: one TOML file per environment plus environment overrides.

Every key is checked at start-up; a bad value stops the program with a message
that names the key, before Spark or Kafka are touched. Secrets (the SASL password,
a client key's password) come from the environment or from files the config names,
never from the config itself, and are never printed.
"""

from __future__ import annotations

import base64
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
    ("pipeline", "downstream_trigger_interval"): "PIPELINE_DOWNSTREAM_TRIGGER_INTERVAL",
    ("kafka", "security_protocol"): "KAFKA_SECURITY_PROTOCOL",
    ("kafka", "sasl_mechanism"): "KAFKA_SASL_MECHANISM",
    ("kafka", "sasl_password_file"): "KAFKA_SASL_PASSWORD_FILE",
    ("kafka", "ssl_ca_location"): "KAFKA_SSL_CA_LOCATION",
    ("kafka", "ssl_certificate_location"): "KAFKA_SSL_CERTIFICATE_LOCATION",
    ("kafka", "ssl_key_location"): "KAFKA_SSL_KEY_LOCATION",
    ("kafka", "ssl_key_password_file"): "KAFKA_SSL_KEY_PASSWORD_FILE",
}
SASL_USERNAME_VAR = "KAFKA_SASL_USERNAME"  # secrets: the alternative to the *_file keys
SASL_PASSWORD_VAR = "KAFKA_SASL_PASSWORD"
SSL_KEY_PASSWORD_VAR = "KAFKA_SSL_KEY_PASSWORD"

TOPIC_PATTERN = re.compile(r"[a-zA-Z0-9._-]{1,249}")
DURATION_PATTERN = re.compile(r"(\d+) (second|minute|hour|day)s?")
# The same sets as the template's kafka_security_protocol and kafka_sasl_mechanism answers
# (a template test compares them). No SASL_PLAINTEXT: it sends the password unencrypted.
SECURITY_PROTOCOLS = {"PLAINTEXT", "SSL", "SASL_SSL"}
SASL_MECHANISMS = {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
TLS_PROTOCOLS = {"SSL", "SASL_SSL"}
SASL_KEYS = ("sasl_mechanism", "sasl_username", "sasl_password_file")
TLS_KEYS = (
    "ssl_ca_location",
    "ssl_certificate_location",
    "ssl_key_location",
    "ssl_key_password_file",
    "ssl_endpoint_identification",
)


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
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    # Absolute paths of PEM files, read again by each client that needs them.
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = field(default=None, repr=False)
    # Off only for a broker whose certificate does not name the host it is reached by.
    ssl_endpoint_identification: bool = True


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
    # Silver and gold: how often they look for a new commit upstream (see streams.trigger_for).
    downstream_trigger_interval: str = "1 second"
    egress: Mapping[str, object] = field(default_factory=dict)  # by stream name (see egress/)


SCHEMA: dict[str, dict[str, type | tuple[type, ...]]] = {
    "kafka": {
        "bootstrap_servers": str,
        "topics": list,
        "security_protocol": str,
        "sasl_mechanism": str,
        "starting_offsets": str,
        "max_offsets_per_trigger": int,
        "fail_on_data_loss": bool,
        "sasl_username": str,
        "sasl_password_file": str,
        "ssl_ca_location": str,
        "ssl_certificate_location": str,
        "ssl_key_location": str,
        "ssl_key_password_file": str,
        "ssl_endpoint_identification": bool,
    },
    "kafka_local": {"home": str},
    "lakehouse": {"root": str},
    "spark": {"master": str, "shuffle_partitions": int, "ui_enabled": bool},
    "pipeline": {"gold_window": str, "trigger_interval": str, "downstream_trigger_interval": str},
}
OPTIONAL_KEYS = {("kafka", key) for key in (*SASL_KEYS, *TLS_KEYS)} | {("pipeline", "downstream_trigger_interval")}
DEFAULT_DOWNSTREAM_TRIGGER = "1 second"


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
    from .egress import sections

    known = [*SCHEMA, *sections()]
    for section in raw:
        if section not in known:
            raise ConfigError(f"{section}: unknown section (known: {', '.join(known)})")
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
    from .egress import parse_sections

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
    security = {**_sasl_settings(kafka, protocol, environ), **_tls_settings(kafka, protocol, environ)}
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
    downstream_trigger = pipeline.get("downstream_trigger_interval", DEFAULT_DOWNSTREAM_TRIGGER).strip()
    duration_seconds(downstream_trigger, "pipeline.downstream_trigger_interval")
    return Config(
        env=env,
        kafka=KafkaConfig(
            bootstrap_servers=kafka["bootstrap_servers"].strip(),
            topics=topics,
            security_protocol=protocol,
            sasl_mechanism=security.pop("sasl_mechanism", None),
            starting_offsets=kafka["starting_offsets"],
            max_offsets_per_trigger=kafka["max_offsets_per_trigger"],
            fail_on_data_loss=kafka["fail_on_data_loss"],
            **security,
        ),
        kafka_local_home=Path(raw["kafka_local"]["home"]).expanduser(),
        lakehouse_root=_absolute_root(raw["lakehouse"]["root"]),
        spark_master=raw["spark"]["master"],
        shuffle_partitions=raw["spark"]["shuffle_partitions"],
        spark_ui_enabled=raw["spark"]["ui_enabled"],
        gold_window=pipeline["gold_window"].strip(),
        trigger_interval=pipeline["trigger_interval"].strip(),
        downstream_trigger_interval=downstream_trigger,
        egress=parse_sections(raw, environ),
    )


def _sasl_settings(kafka: dict, protocol: str, environ: Mapping[str, str]) -> dict:
    if protocol != "SASL_SSL":
        # Credentials left in the environment for another cluster are ignored; keys in the
        # config that cannot apply are a mistake worth stopping for.
        for key in SASL_KEYS:
            if key in kafka:
                raise ConfigError(f"kafka.{key}: only valid with security_protocol SASL_SSL, not {protocol}")
        return {}
    mechanism = kafka.get("sasl_mechanism")
    if mechanism not in SASL_MECHANISMS:
        raise ConfigError(f"kafka.sasl_mechanism: {mechanism!r} is not one of {sorted(SASL_MECHANISMS)}")
    username = environ.get(SASL_USERNAME_VAR) or kafka.get("sasl_username")
    if not username or not username.strip():
        raise ConfigError(
            f"kafka.sasl_username: security_protocol SASL_SSL needs a user; set it or {SASL_USERNAME_VAR}"
        )
    password = secret(kafka, "sasl_password_file", environ, SASL_PASSWORD_VAR)
    if password is None:
        raise ConfigError(
            f"kafka.sasl_password_file: security_protocol SASL_SSL needs a password; name a file holding it "
            f"(kafka.sasl_password_file or KAFKA_SASL_PASSWORD_FILE) or set {SASL_PASSWORD_VAR}"
        )
    return {"sasl_mechanism": mechanism, "sasl_username": username.strip(), "sasl_password": password}


def _tls_settings(kafka: dict, protocol: str, environ: Mapping[str, str]) -> dict:
    if protocol not in TLS_PROTOCOLS:
        for key in TLS_KEYS:
            if key in kafka:
                raise ConfigError(f"kafka.{key}: only valid with security_protocol SSL or SASL_SSL, not {protocol}")
        return {}
    settings: dict = {"ssl_endpoint_identification": kafka.get("ssl_endpoint_identification", True)}
    if "ssl_ca_location" in kafka:
        settings["ssl_ca_location"] = _pem_file(kafka, "ssl_ca_location", "CERTIFICATE")
    certificate, key = kafka.get("ssl_certificate_location"), kafka.get("ssl_key_location")
    if (certificate is None) != (key is None):
        present, missing = ("ssl_certificate_location", "ssl_key_location")[:: 1 if certificate else -1]
        raise ConfigError(f"kafka.{missing}: kafka.{present} is set, so mutual TLS needs both the certificate and key")
    key_password = secret(kafka, "ssl_key_password_file", environ, SSL_KEY_PASSWORD_VAR)
    if certificate is None:
        if "ssl_key_password_file" in kafka:
            raise ConfigError("kafka.ssl_key_password_file: set without kafka.ssl_key_location")
        return settings
    settings["ssl_certificate_location"] = _pem_file(kafka, "ssl_certificate_location", "CERTIFICATE")
    settings["ssl_key_location"] = key_path = _pem_file(kafka, "ssl_key_location", "PRIVATE KEY")
    key_pem = Path(key_path).read_text()
    if "-----BEGIN RSA PRIVATE KEY-----" in key_pem or "-----BEGIN EC PRIVATE KEY-----" in key_pem:
        # Spark's JVM client reads PKCS#8 only; librdkafka reads both.
        raise ConfigError(
            f"kafka.ssl_key_location: {key_path!r} is a PKCS#1/SEC1 key; convert it to PKCS#8 with "
            "`openssl pkcs8 -topk8 -in key.pem -out key-pkcs8.pem` (add -nocrypt to leave it unencrypted)"
        )
    encrypted = "-----BEGIN ENCRYPTED PRIVATE KEY-----" in key_pem
    if encrypted and _PBES2_OID in _pem_der(key_pem):
        # Java 17's PEM reader knows the older PBES1 schemes only; found here, not mid-stream.
        raise ConfigError(
            f"kafka.ssl_key_location: {key_path!r} is encrypted with PBES2, which Spark's JVM Kafka client "
            "cannot read; re-encrypt it with `openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES -in key.pem -out key-v1.pem` "
            "or leave it unencrypted (-nocrypt) and readable by the pipeline's user only"
        )
    if encrypted and key_password is None:
        raise ConfigError(
            f"kafka.ssl_key_password_file: the key in kafka.ssl_key_location is encrypted; name a file holding "
            f"its password (or KAFKA_SSL_KEY_PASSWORD_FILE) or set {SSL_KEY_PASSWORD_VAR}"
        )
    if not encrypted and key_password is not None:
        raise ConfigError("kafka.ssl_key_password_file: the key in kafka.ssl_key_location is not encrypted")
    settings["ssl_key_password"] = key_password
    return settings


_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")  # DER of PBES2's object identifier, 1.2.840.113549.1.5.13


def _pem_der(pem: str) -> bytes:
    body = re.search(r"-----BEGIN [A-Z ]+-----(.*?)-----END", pem, re.S)
    try:
        return base64.b64decode("".join(body.group(1).split())) if body else b""
    except ValueError:
        return b""


def _pem_file(kafka: dict, key: str, kind: str) -> str:
    path = Path(kafka[key]).expanduser().resolve()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"kafka.{key}: {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"kafka.{key}: {str(path)!r} cannot be read: {error.__class__.__name__}") from None
    if not re.search(rf"-----BEGIN [A-Z ]*{kind}-----", text):
        raise ConfigError(f"kafka.{key}: {str(path)!r} holds no PEM {kind.lower()} (-----BEGIN ...{kind}-----)")
    return str(path)


def secret(values: dict, key: str, environ: Mapping[str, str], var: str, section: str = "kafka") -> str | None:
    """A secret from the file named by ``values[key]`` or from ``var``; never both, never shown.

    Example::

        secret({"password_file": "/run/pg"}, "password_file", os.environ, "POSTGRES_PASSWORD", "egress_postgres")
    """
    from_env = environ.get(var) or None
    if key not in values:
        return from_env
    if from_env is not None:
        raise ConfigError(f"{section}.{key}: set together with {var}; use one of them")
    path = Path(values[key]).expanduser()
    try:
        # One trailing newline is how editors and `echo` end a file, not part of the secret.
        secret = path.read_text().removesuffix("\n").removesuffix("\r")
    except FileNotFoundError:
        raise ConfigError(f"{section}.{key}: {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{section}.{key}: {str(path)!r} cannot be read: {error.__class__.__name__}") from None
    if not secret:
        raise ConfigError(f"{section}.{key}: {str(path)!r} is empty")
    return secret


def _absolute_root(root: str) -> str:
    # URIs pass through; a plain path is made absolute: tables must not move with the working directory.
    if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", root):
        return root.rstrip("/")
    return str(Path(root).expanduser().resolve())
