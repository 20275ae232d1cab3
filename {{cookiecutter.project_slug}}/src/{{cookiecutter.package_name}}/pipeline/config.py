"""Pipeline configuration: one TOML file per environment plus environment overrides, typed by pydantic.

Each table of the file is a settings model (a ``Section``): ``kafka``, ``kafka_local``, ``lakehouse``,
``s3``, ``s3_local``, ``schema_registry``, ``registry_local``, ``spark``, ``pipeline``, ``metrics``. Two
settings sources feed it, the file's table and the environment, where ``<env_prefix><KEY>`` overrides a
key (``KAFKA_BOOTSTRAP_SERVERS`` overrides ``kafka.bootstrap_servers``; a list is comma-separated). Every
key is checked at start-up; a bad value stops the program with a ``ConfigError`` that names the key (and
the variable, when one set it), before Spark or Kafka are touched.

Secrets (the SASL password, a client key's password, the schema registry's password or token) come
from the environment or from files the config names, never from the config itself (a secret written
there is refused); they are ``SecretStr`` and never printed. ``[egress_<name>]`` tables are kept as
written on ``Config.egress_sections``: each egress parses its own with its own ``Section`` through
``load_section`` (``pipeline.egress.configure``).
"""

from __future__ import annotations

import base64
import os
import re
import tomllib
from collections.abc import Mapping
from enum import Enum
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource, SettingsConfigDict

ENV_VAR = "PIPELINE_ENV"
CONFIG_FILE_VAR = "PIPELINE_CONFIG"
DEFAULT_ENV = "local"
LOCAL_BOOTSTRAP = "local"
# s3.endpoint naming the server of `s3-local start`.
LOCAL_ENDPOINT = "local"
# schema_registry.url naming the development registry of `registry-local start`.
LOCAL_REGISTRY = "local"
# conf/ sits at the top of the package, where a team looks for it.
CONF_PACKAGE = __package__.rpartition(".")[0]
# Tables named so are an egress's (see pipeline/egress/): kept as written, parsed by that egress.
EGRESS_PREFIX = "egress_"
# Tables named so are a dataset's (``[dataset_<name>]``, see pipeline/datasets/): kept as written,
# parsed by ``dataset_kafka`` for the dataset of that name.
DATASET_PREFIX = "dataset_"

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
DEFAULT_DOWNSTREAM_TRIGGER = "1 second"
DEFAULT_LEASE_TTL = "60 seconds"
# Kafka's own default is 500 ms: see KafkaConfig.fetch_max_wait_ms.
DEFAULT_FETCH_MAX_WAIT_MS = 100


class Mode(Enum):
    """Which streams carry records from Kafka to gold (``pipeline.mode``)."""

    # Three streams, one per layer, each reading the table above it.
    LAYERED = "layered"
    # One stream writing bronze, silver, quarantine and gold in each batch (fused.py): seconds less per record.
    FUSED = "fused"


# A value of the wrong TOML type, in the words of the file: "expected int, got str '4'".
TYPE_ERRORS = {
    "int_type": "int",
    "bool_type": "bool",
    "string_type": "str",
    "tuple_type": "list",
    "list_type": "list",
    "model_type": "table",
    "dict_type": "table",
}


class ConfigError(ValueError):
    """A configuration value is missing or wrong; the message names the key."""


class Invalid(ValueError):
    """Raised by a validator to name ``key`` (of the same table) as the one to fix, rather than the field checked.

    Example::

        raise Invalid("sasl_password_file", "security_protocol SASL_SSL needs a password")
    """

    def __init__(self, key: str, reason: str) -> None:
        if not key or not reason:
            raise ValueError("Invalid needs the key to name and the reason")
        super().__init__(reason)
        self.key, self.reason = key, reason


def duration_seconds(value: str, key: str) -> int:
    """Seconds of a duration such as '1 minute' or '30 seconds'; ConfigError names ``key``.

    Example::

        duration_seconds("2 minutes", "pipeline.gold_window")  # 120
    """
    try:
        return _duration(value)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def _duration(value: str) -> int:
    match = DURATION_PATTERN.fullmatch(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration like '1 minute' or '30 seconds'")
    seconds = int(match.group(1)) * {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"{value!r} must be longer than zero")
    return seconds


def _text(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value.strip()


def _topic(value: str) -> str:
    if not TOPIC_PATTERN.fullmatch(value) or value in {".", ".."}:
        raise ValueError(f"{value!r} is not a valid Kafka topic name")
    return value


def _some_topics(topics: tuple[str, ...]) -> tuple[str, ...]:
    if not topics:
        raise ValueError("at least one topic is needed")
    return topics


def _compacted_unread(compacted: tuple[str, ...], topics: tuple[str, ...], read_by: str) -> None:
    # A compacted topic is one of the topics read: anything else names a topic no stream reads.
    unread = [topic for topic in compacted if topic not in topics]
    if unread:
        raise Invalid("compacted_topics", f"{unread} not {read_by} {list(topics)}")


def _checked_duration(value: str) -> str:
    _duration(value)
    return value.strip()


# Field types shared by the sections and the egresses' settings: one rule each.
Text = Annotated[str, AfterValidator(_text)]
TopicName = Annotated[str, AfterValidator(_topic)]
Topics = Annotated[tuple[TopicName, ...], AfterValidator(_some_topics)]
Duration = Annotated[str, AfterValidator(_checked_duration)]


class Section(BaseModel):
    """One table of the config: its keys typed as TOML has them, unknown keys refused, values frozen.

    ``env_prefix`` (pydantic-settings' key) names the environment variables that override its keys:
    prefix + KEY in capitals; an upper-case alias of a field names one more. Sections are built by
    ``load_section`` from a table and an environment mapping, both given, through the two settings
    sources below; constructing one directly validates its arguments only. A section is not a
    BaseSettings: that would read os.environ on its own, and its __init__ (which validation of a
    BaseSettings goes through) drops the validation context that tells a key's origin.
    """

    # strict: a number written as a string in the file is a mistake worth stopping for; values from the
    # environment are text and are parsed by EnvironmentSource before they reach the model.
    model_config = SettingsConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)

    @classmethod
    def variables(cls, key: str) -> tuple[str, ...]:
        """The environment variables that set ``key``, the first one found wins.

        Example::

            KafkaConfig.variables("topics")  # ("KAFKA_TOPICS",)
        """
        field = cls.model_fields.get(key)
        if field is None:
            raise ValueError(f"{cls.__name__} has no key {key!r}")
        alias = field.validation_alias
        aliases = alias.choices if isinstance(alias, AliasChoices) else [alias]
        upper = [name for name in aliases if isinstance(name, str) and name.isupper()]
        return (f"{cls.model_config.get('env_prefix', '')}{key}".upper(), *upper)

    @classmethod
    def from_environment(cls, key: str, info: ValidationInfo) -> bool:
        """Whether the environment, not the file, set ``key`` in the load being validated (a validator's ``info``).

        Example::

            if cls.from_environment("sasl_username", info): ...  # in a field validator of KafkaConfig
        """
        return bool(set(cls.variables(key)) & (info.context or {}).get("variables", set()))

    @classmethod
    def secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        """The secret of field ``info.field_name``: its variable's value, or the file named by ``<field>_file``.

        Both set is refused: which one is meant cannot be known. Use from a field validator of the
        secret, declared after its ``_file`` key and with validate_default (the variable may be unset).

        Example::

            @field_validator("password")
            @classmethod
            def _password(cls, password, info):
                return cls.secret(password, info)  # EGRESS_POSTGRES_PASSWORD, or the file in password_file
        """
        file_key = f"{info.field_name}_file"
        path = info.data.get(file_key)
        if path is None:
            return value
        if value is not None:
            raise Invalid(file_key, f"set together with {cls.variables(info.field_name)[0]}; use one of them")
        return SecretStr(read_secret(path, file_key))


def read_secret(path: str, key: str) -> str:
    """The secret held by the file at ``path`` (one trailing newline dropped); ``key`` is the key that names it.

    Example::

        read_secret("/run/secrets/kafka-password", "sasl_password_file")
    """
    if not key:
        raise ValueError("key must name the setting that holds the path")
    file = Path(path).expanduser()
    try:
        # One trailing newline is how editors and `echo` end a file, not part of the secret.
        secret = file.read_text().removesuffix("\n").removesuffix("\r")
    except FileNotFoundError:
        raise Invalid(key, f"{str(file)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise Invalid(key, f"{str(file)!r} cannot be read: {error.__class__.__name__}") from None
    if not secret:
        raise Invalid(key, f"{str(file)!r} is empty")
    return secret


class KafkaConfig(Section):
    """``[kafka]``: the cluster, the topics and how bronze reads them; TLS and SASL settings resolved."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_")

    bootstrap_servers: Text
    # Not strict as a whole: the file's list becomes the tuple; each name is still text.
    topics: Topics = Field(strict=False)
    # Those of ``topics`` that are compacted by design (the newest record of a key is what counts): Kafka
    # may remove a superseded record before bronze reads it. Any other compacted topic is refused.
    compacted_topics: tuple[TopicName, ...] = Field((), strict=False)
    security_protocol: str
    starting_offsets: str
    max_offsets_per_trigger: int = Field(gt=0)
    fail_on_data_loss: bool
    # The Kafka source's consumers (fetch.max.wait.ms): how long the broker holds a fetch that finds
    # nothing new. Reading a batch up to its end offset, a consumer's last fetch comes back empty
    # (past a transaction's commit marker, no record is left to return), so a batch waits this long
    # once: at Kafka's default 500 ms, that wait is most of a small batch's read.
    fetch_max_wait_ms: int = Field(DEFAULT_FETCH_MAX_WAIT_MS, gt=0, le=60_000)
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password_file: str | None = None
    # Validated when absent too: read from the file named by sasl_password_file (see Section.secret).
    sasl_password: SecretStr | None = Field(None, validate_default=True)
    # Absolute paths of PEM files, read again by each client that needs them.
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password_file: str | None = None
    ssl_key_password: SecretStr | None = Field(None, validate_default=True)
    # Off only for a broker whose certificate does not name the host it is reached by.
    ssl_endpoint_identification: bool = True

    @field_validator("security_protocol")
    @classmethod
    def _known_protocol(cls, protocol: str) -> str:
        if protocol not in SECURITY_PROTOCOLS:
            raise ValueError(f"{protocol!r} is not one of {sorted(SECURITY_PROTOCOLS)}")
        return protocol

    @field_validator("starting_offsets")
    @classmethod
    def _known_start(cls, start: str) -> str:
        if start not in {"earliest", "latest"}:
            raise ValueError(f"{start!r} is not 'earliest' or 'latest'")
        return start

    @field_validator("sasl_username")
    @classmethod
    def _username(cls, username: str | None, info: ValidationInfo) -> str | None:
        # Credentials left in the environment for another cluster are ignored; keys in the
        # config that cannot apply are a mistake worth stopping for (see _fits_the_protocol).
        if info.data.get("security_protocol") != "SASL_SSL" and cls.from_environment("sasl_username", info):
            return None
        return username.strip() if username is not None else None

    @field_validator("sasl_password")
    @classmethod
    def _sasl_password(cls, password: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if info.data.get("security_protocol") != "SASL_SSL":
            return None  # a password file is refused by _fits_the_protocol, unread
        return cls.secret(password, info)

    @field_validator("ssl_ca_location", "ssl_certificate_location")
    @classmethod
    def _certificate(cls, location: str | None, info: ValidationInfo) -> str | None:
        return None if location is None else _pem_file(location, info.field_name, "CERTIFICATE")

    @field_validator("ssl_key_location")
    @classmethod
    def _key(cls, location: str | None) -> str | None:
        if location is None:
            return None
        path = _pem_file(location, "ssl_key_location", "PRIVATE KEY")
        key_pem = Path(path).read_text()
        if "-----BEGIN RSA PRIVATE KEY-----" in key_pem or "-----BEGIN EC PRIVATE KEY-----" in key_pem:
            # Spark's JVM client reads PKCS#8 only; librdkafka reads both.
            raise ValueError(
                f"{path!r} is a PKCS#1/SEC1 key; convert it to PKCS#8 with "
                "`openssl pkcs8 -topk8 -in key.pem -out key-pkcs8.pem` (add -nocrypt to leave it unencrypted)"
            )
        if _is_encrypted(key_pem) and _PBES2_OID in _pem_der(key_pem):
            # Java 17's PEM reader knows the older PBES1 schemes only; found here, not mid-stream.
            raise ValueError(
                f"{path!r} is encrypted with PBES2, which Spark's JVM Kafka client cannot read; re-encrypt it "
                "with `openssl pkcs8 -topk8 -v1 PBE-SHA1-3DES -in key.pem -out key-v1.pem` or leave it "
                "unencrypted (-nocrypt) and readable by the pipeline's user only"
            )
        return path

    @field_validator("ssl_key_password")
    @classmethod
    def _key_password(cls, password: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if info.data.get("security_protocol") not in TLS_PROTOCOLS or info.data.get("ssl_key_location") is None:
            return None  # a password file without a key is refused by _fits_the_protocol
        return cls.secret(password, info)

    @model_validator(mode="after")
    def _compacted_are_read(self) -> KafkaConfig:
        _compacted_unread(self.compacted_topics, self.topics, "in kafka.topics")
        return self

    @model_validator(mode="after")
    def _fits_the_protocol(self) -> KafkaConfig:
        protocol = self.security_protocol
        if protocol == "SASL_SSL":
            self._check_sasl()
        else:
            for key in SASL_KEYS:
                if getattr(self, key) is not None:
                    raise Invalid(key, f"only valid with security_protocol SASL_SSL, not {protocol}")
        if protocol in TLS_PROTOCOLS:
            self._check_tls()
        else:
            for key in TLS_KEYS:
                if getattr(self, key) is not None and key in self.model_fields_set:
                    raise Invalid(key, f"only valid with security_protocol SSL or SASL_SSL, not {protocol}")
        return self

    def _check_sasl(self) -> None:
        if self.sasl_mechanism not in SASL_MECHANISMS:
            raise Invalid("sasl_mechanism", f"{self.sasl_mechanism!r} is not one of {sorted(SASL_MECHANISMS)}")
        if not self.sasl_username:
            raise Invalid("sasl_username", f"security_protocol SASL_SSL needs a user; set it or {SASL_USERNAME_VAR}")
        if self.sasl_password is None:
            raise Invalid(
                "sasl_password_file",
                "security_protocol SASL_SSL needs a password; name a file holding it (kafka.sasl_password_file "
                f"or KAFKA_SASL_PASSWORD_FILE) or set {SASL_PASSWORD_VAR}",
            )

    def _check_tls(self) -> None:
        certificate, key = self.ssl_certificate_location, self.ssl_key_location
        if (certificate is None) != (key is None):
            present, missing = ("ssl_certificate_location", "ssl_key_location")[:: 1 if certificate else -1]
            raise Invalid(missing, f"kafka.{present} is set, so mutual TLS needs both the certificate and key")
        if key is None:
            if self.ssl_key_password_file is not None:
                raise Invalid("ssl_key_password_file", "set without kafka.ssl_key_location")
            return
        encrypted = _is_encrypted(Path(key).read_text())
        if encrypted and self.ssl_key_password is None:
            raise Invalid(
                "ssl_key_password_file",
                "the key in kafka.ssl_key_location is encrypted; name a file holding its password "
                f"(or KAFKA_SSL_KEY_PASSWORD_FILE) or set {SSL_KEY_PASSWORD_VAR}",
            )
        if not encrypted and self.ssl_key_password is not None:
            raise Invalid("ssl_key_password_file", "the key in kafka.ssl_key_location is not encrypted")


SASL_USERNAME_VAR = KafkaConfig.variables("sasl_username")[0]
SASL_PASSWORD_VAR = KafkaConfig.variables("sasl_password")[0]
SSL_KEY_PASSWORD_VAR = KafkaConfig.variables("ssl_key_password")[0]


class DatasetSection(Section):
    """``[dataset_<name>]``: the Kafka topics of one dataset beside the first (whose are ``kafka.topics``).

    Its variables are ``DATASET_<NAME>_<KEY>`` (``dataset_kafka`` builds the section for the name).
    """

    topics: Topics = Field(strict=False)
    compacted_topics: tuple[TopicName, ...] = Field((), strict=False)

    @model_validator(mode="after")
    def _compacted_are_read(self) -> DatasetSection:
        _compacted_unread(self.compacted_topics, self.topics, "among its topics")
        return self


def dataset_kafka(config: Config, name: str, environ: Mapping[str, str] | None = None) -> KafkaConfig:
    """The Kafka section as dataset ``name`` reads it: the cluster of ``[kafka]`` and the topics of
    ``[dataset_<name>]``, with the overrides ``environ`` holds (default os.environ); ConfigError names
    the table when there is none, or a bad key.

    Example::

        dataset_kafka(config, "orders").topics  # ("orders",) from [dataset_orders] topics = ["orders"]
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError("name must name a dataset")
    section = DATASET_PREFIX + name
    if section not in config.dataset_sections:
        raise ConfigError(f"{section}: missing: dataset {name} reads the topics this table names")
    settings = SettingsConfigDict(**DatasetSection.model_config, env_prefix=f"{section.upper()}_")
    model = type(f"DatasetSection_{name}", (DatasetSection,), {"model_config": settings})
    environ = os.environ if environ is None else environ
    found = load_section(model, config.dataset_sections[section], environ, section)
    return config.kafka.model_copy(update={"topics": found.topics, "compacted_topics": found.compacted_topics})


class KafkaLocalSection(Section):
    """``[kafka_local]``: where `kafka-local start` keeps the development broker (optional)."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_LOCAL_")

    home: Text = ".kafka-local"


class LakehouseSection(Section):
    """``[lakehouse]``: the root of the tables and checkpoints, a path or a Hadoop-compatible URI."""

    model_config = SettingsConfigDict(env_prefix="LAKEHOUSE_")

    root: Text


class S3Section(Section):
    """``[s3]``: how to reach a lakehouse root on S3 (``s3a://bucket/prefix``); unused for any other root.

    The credentials never sit in the config: AWS's default chain finds them (the variables
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, an instance or pod role), or ``credentials_file``
    names a file in AWS's shared-credentials format whose ``[default]`` profile holds them.
    """

    model_config = SettingsConfigDict(env_prefix="S3_")

    # Empty: AWS itself, in ``region``. "local": the server of `s3-local start`. Otherwise the URL
    # of an S3-compatible store, which must honour conditional writes (If-None-Match).
    endpoint: str = ""
    region: Text = "us-east-1"
    # Most S3-compatible stores want https://host/bucket/key rather than https://bucket.host/key.
    path_style_access: bool = False
    credentials_file: str = ""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_is_a_url(cls, value: str) -> str:
        value = value.strip()
        if value and value != LOCAL_ENDPOINT and not re.fullmatch(r"https?://[^/\s]+/?", value):
            raise ValueError(f"{value!r} is not an http(s)://host[:port] URL, 'local' or empty (AWS)")
        return value.rstrip("/")


class S3LocalSection(Section):
    """``[s3_local]``: where `s3-local start` keeps the development S3 server (optional)."""

    model_config = SettingsConfigDict(env_prefix="S3_LOCAL_")

    home: Text = ".s3-local"


class SchemaRegistrySection(Section):
    """``[schema_registry]``: the registry of the writer schemas of the Avro and Protobuf datasets (optional).

    Any registry with Confluent's REST API: Confluent Schema Registry, Apicurio's ``/apis/ccompat/v7``,
    Redpanda, Karapace. Credentials are a user and password (HTTP basic) or a bearer token, each secret
    from its variable or from the file its ``_file`` key names; never from the URL or the config itself.
    """

    model_config = SettingsConfigDict(env_prefix="SCHEMA_REGISTRY_")

    # Empty: no registry (every dataset is JSON). "local": the registry of `registry-local start`.
    url: str = ""
    # The PEM file of the CA that signed an https:// registry's certificate (default: the system's CAs).
    ssl_ca_location: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    # Validated when absent too: read from the file named by basic_auth_password_file (see Section.secret).
    basic_auth_password: SecretStr | None = Field(None, validate_default=True)
    bearer_token_file: str | None = None
    bearer_token: SecretStr | None = Field(None, validate_default=True)
    # Confluent Cloud's `target-sr-cluster` header (the registry's logical cluster, lsrc-...); others ignore it.
    bearer_logical_cluster: str = ""

    @field_validator("url")
    @classmethod
    def _url_is_a_url(cls, value: str) -> str:
        value = value.strip()
        if value and value != LOCAL_REGISTRY and not re.fullmatch(r"https?://[^\s]+", value):
            raise ValueError(f"{value!r} is not an http(s):// URL, 'local' or empty (no registry)")
        if "@" in value.partition("://")[2].partition("/")[0]:
            # Never echo it: the part before @ is a secret.
            raise ValueError(
                "holds credentials (user:password@); set schema_registry.basic_auth_username and "
                "basic_auth_password_file (or SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD) instead"
            )
        return value.rstrip("/")

    @field_validator("ssl_ca_location")
    @classmethod
    def _ca(cls, location: str | None, info: ValidationInfo) -> str | None:
        return None if location is None else _pem_file(location, info.field_name, "CERTIFICATE")

    @field_validator("basic_auth_password", "bearer_token")
    @classmethod
    def _secret(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return cls.secret(value, info)

    @model_validator(mode="after")
    def _credentials_fit(self) -> SchemaRegistrySection:
        user, password, token = self.basic_auth_username, self.basic_auth_password, self.bearer_token
        if password is not None and not user:
            raise Invalid("basic_auth_username", "a password is set for HTTP basic auth but no user")
        if user and password is None:
            variable = self.variables("basic_auth_password")[0]
            raise Invalid(
                "basic_auth_password_file",
                f"basic_auth_username is set; name a file holding its password (or set {variable})",
            )
        if user and token is not None:
            raise Invalid("bearer_token_file", "set together with basic_auth_username: use one of them")
        plain = self.url.startswith("http://")
        if plain and self.ssl_ca_location is not None:
            raise Invalid("ssl_ca_location", f"set for a plain http:// registry ({self.url})")
        if plain and (user or token is not None) and not _loopback(self.url):
            # As Kafka's SASL_PLAINTEXT is refused: a password sent unencrypted over a network.
            raise Invalid(
                "basic_auth_username" if user else "bearer_token_file",
                f"credentials would travel unencrypted to {self.url}: use its https:// URL",
            )
        return self


class RegistryLocalSection(Section):
    """``[registry_local]``: where `registry-local start` keeps the development schema registry (optional)."""

    model_config = SettingsConfigDict(env_prefix="REGISTRY_LOCAL_")

    home: Text = ".registry-local"


class SparkSection(Section):
    """``[spark]``: the master the pipeline's own session uses, and its shuffle width."""

    model_config = SettingsConfigDict(env_prefix="SPARK_")

    master: Text
    shuffle_partitions: int = Field(gt=0)
    ui_enabled: bool


class PipelineSection(Section):
    """``[pipeline]``: gold's window and how often the streams look for new data."""

    model_config = SettingsConfigDict(env_prefix="PIPELINE_")

    gold_window: Duration
    trigger_interval: Duration
    # Silver and gold: how often they look for a new commit upstream (see streams.trigger_for).
    downstream_trigger_interval: Duration = DEFAULT_DOWNSTREAM_TRIGGER
    # How long a stream's lease lives without renewal (recovery/lease.py): a holder writes for
    # three quarters of it after its last renewal; a crashed holder's stream is free after it.
    lease_ttl: Duration = DEFAULT_LEASE_TTL
    # The layered streams, or the one fused stream (see Mode); `checkpoints switch` hands a lakehouse over.
    mode: Literal["layered", "fused"] = Mode.LAYERED.value


class MetricsSection(Section):
    """``[metrics]``: where `run` serves its Prometheus metrics (optional; port 0, the default, serves none)."""

    model_config = SettingsConfigDict(env_prefix="METRICS_")

    port: int = Field(0, ge=0, le=65535)
    # The loopback interface by default: metrics name topics and hosts; open it up on purpose.
    address: Text = "127.0.0.1"


class Settings(Section):
    """The config file's tables, each a section; ``[egress_<name>]`` tables are taken out before (see module)."""

    kafka: KafkaConfig
    kafka_local: KafkaLocalSection = KafkaLocalSection()
    lakehouse: LakehouseSection
    s3: S3Section = S3Section()
    s3_local: S3LocalSection = S3LocalSection()
    schema_registry: SchemaRegistrySection = SchemaRegistrySection()
    registry_local: RegistryLocalSection = RegistryLocalSection()
    spark: SparkSection
    pipeline: PipelineSection
    metrics: MetricsSection = MetricsSection()


class Config(BaseModel):
    """The configuration as the pipeline uses it, built by ``load_config``; change it with ``model_copy(update=...)``.

    ``egress_sections`` holds every ``[egress_<name>]`` table as written; ``egress`` the settings of each
    egress turned on, by stream name, once ``pipeline.egress.configure`` parsed them (None before).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: str
    kafka: KafkaConfig
    kafka_local_home: Path
    lakehouse_root: str
    s3: S3Section = S3Section()
    s3_local_home: Path = Path(".s3-local")
    schema_registry: SchemaRegistrySection = SchemaRegistrySection()
    registry_local_home: Path = Path(".registry-local")
    spark_master: str
    shuffle_partitions: int
    spark_ui_enabled: bool
    gold_window: str
    trigger_interval: str
    downstream_trigger_interval: str = DEFAULT_DOWNSTREAM_TRIGGER
    lease_ttl: str = DEFAULT_LEASE_TTL
    mode: Mode = Mode.LAYERED
    metrics_port: int = 0
    metrics_address: str = "127.0.0.1"
    egress_sections: Mapping[str, Any] = Field(default_factory=dict)
    egress: Mapping[str, Section] | None = None
    dataset_sections: Mapping[str, Any] = Field(default_factory=dict)


def load_config(
    env: str | None = None,
    config_file: str | os.PathLike | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Load the config for ``env`` (default: $PIPELINE_ENV or 'local'); ConfigError names a bad key.

    ``config_file`` (or $PIPELINE_CONFIG) replaces the packaged file for that env; ``environ``
    (default os.environ) holds the overrides. The egress tables are parsed by
    ``pipeline.egress.configure``, which the command line calls right after this.

    Example::

        config = load_config("prod", environ={"KAFKA_SASL_USERNAME": "svc", "KAFKA_SASL_PASSWORD": "..."})
    """
    environ = os.environ if environ is None else environ
    env = env or environ.get(ENV_VAR) or DEFAULT_ENV
    tables = _read_toml(env, config_file or environ.get(CONFIG_FILE_VAR))
    egress = {name: tables.pop(name) for name in list(tables) if name.startswith(EGRESS_PREFIX)}
    datasets = {name: tables.pop(name) for name in list(tables) if name.startswith(DATASET_PREFIX)}
    settings = load_section(Settings, tables, environ)
    return Config(
        env=env,
        kafka=settings.kafka,
        kafka_local_home=Path(settings.kafka_local.home).expanduser(),
        lakehouse_root=_lakehouse_root(settings.lakehouse.root),
        s3=settings.s3,
        s3_local_home=Path(settings.s3_local.home).expanduser(),
        schema_registry=settings.schema_registry,
        registry_local_home=Path(settings.registry_local.home).expanduser(),
        spark_master=settings.spark.master,
        shuffle_partitions=settings.spark.shuffle_partitions,
        spark_ui_enabled=settings.spark.ui_enabled,
        gold_window=settings.pipeline.gold_window,
        trigger_interval=settings.pipeline.trigger_interval,
        downstream_trigger_interval=settings.pipeline.downstream_trigger_interval,
        lease_ttl=settings.pipeline.lease_ttl,
        mode=Mode(settings.pipeline.mode),
        metrics_port=settings.metrics.port,
        metrics_address=settings.metrics.address,
        egress_sections=egress,
        dataset_sections=datasets,
    )


S = TypeVar("S", bound=Section)


def load_section(model: type[S], table: object, environ: Mapping[str, str], section: str = "") -> S:
    """``model`` from a config ``table`` with the overrides ``environ`` holds; ConfigError names the bad key.

    ``section`` is the table's name in the file, the first part of every key named ('' for the whole file).

    Example::

        load_section(KafkaEgressSettings, config.egress_sections["egress_kafka"], os.environ, "egress_kafka")
    """
    if not isinstance(model, type) or not issubclass(model, Section):
        raise TypeError(f"model must be a Section, not {model!r}")
    if not isinstance(table, Mapping):
        raise ConfigError(f"{section or 'config'}: expected table, got {type(table).__name__} {table!r}")
    where = (section,) if section else ()
    overrides = EnvironmentSource(model, environ, where)
    values = _merged(TableSource(model, table, where)(), overrides())
    try:
        return model.model_validate(values, context={"variables": set(overrides.variables.values())})
    except ValidationError as error:
        # Built here, raised outside: the ValidationError (with the inputs) is not chained to it.
        message = "\n".join(_describe(problem, model, where, overrides.variables) for problem in error.errors())
    raise ConfigError(message)


class TableSource(PydanticBaseSettingsSource):
    """A settings source over a table of the config file (nested tables for nested sections); secrets refused.

    Example::

        TableSource(KafkaConfig, {"topics": ["events"]}, ("kafka",))()  # {"topics": ["events"]}
    """

    def __init__(self, settings_cls: type[Section], table: Mapping[str, Any], where: tuple[str, ...] = ()) -> None:
        super().__init__(settings_cls)
        self.table, self.where = table, where

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.table.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            section = _section_of(field)
            if value is None:
                continue
            if _plain(field.annotation) is SecretStr:
                key = ".".join((*self.where, name))
                raise ConfigError(
                    f"{key}: a secret never goes in a config file; set {self.settings_cls.variables(name)[0]} "
                    f"or name a file holding it in {key}_file"
                )
            if section is not None and isinstance(value, Mapping):
                TableSource(section, value, (*self.where, name))()
        return dict(self.table)


class EnvironmentSource(PydanticBaseSettingsSource):
    """A settings source over an environment mapping: ``<env_prefix><KEY>`` (or a field's upper-case alias).

    An empty variable counts as unset. Values are text: a number or a flag is parsed here (ConfigError
    names the variable), a list is comma-separated (a table too, as key=value). ``variables`` records
    which variable set which key.

    Example::

        EnvironmentSource(Settings, {"KAFKA_TOPICS": "a, b"})()  # {"kafka": {"topics": ["a", "b"]}}
    """

    def __init__(self, settings_cls: type[Section], environ: Mapping[str, str], where: tuple[str, ...] = ()) -> None:
        super().__init__(settings_cls)
        self.environ, self.where = environ, where
        self.variables: dict[tuple[str, ...], str] = {}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        for variable in self.settings_cls.variables(field_name):
            if self.environ.get(variable):
                return self.environ[variable], variable, False
        return None, field_name, False

    def prepare_field_value(self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool) -> Any:
        annotation, variable = _plain(field.annotation), self.variables[(*self.where, field_name)]
        if get_origin(annotation) in (tuple, list):
            return [item.strip() for item in value.split(",")]
        if get_origin(annotation) is dict:
            # "key=value, key=value": a table's entries on one line.
            entries = {}
            for entry in filter(None, (item.strip() for item in value.split(","))):
                key, equals, item = entry.partition("=")
                if not equals:
                    where = ".".join((*self.where, field_name))
                    raise ConfigError(f"{variable}: {entry!r} is not key=value ({where})")
                entries[key.strip()] = item.strip()
            return entries
        if annotation in (int, bool):
            try:
                return TypeAdapter(annotation).validate_python(value)  # lax: "100" and "true" parse
            except ValidationError:
                kind = "a whole number" if annotation is int else "true or false"
                key = ".".join((*self.where, field_name))
                raise ConfigError(f"{variable}: {value!r} is not {kind} ({key})") from None
        return value

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            section = _section_of(field)
            if section is not None:
                nested = EnvironmentSource(section, self.environ, (*self.where, name))
                if found := nested():
                    values[name] = found
                self.variables |= nested.variables
                continue
            value, variable, _ = self.get_field_value(field, name)
            if value is not None:
                self.variables[(*self.where, name)] = variable
                values[name] = self.prepare_field_value(name, field, value, False)
        return values


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    # Table by table: a variable overrides one key, not the table that holds it.
    # A table the file got wrong (`kafka = 3`) stays wrong, to be named as such.
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = _merged(below, value)
        elif below is None or not isinstance(value, Mapping):
            merged[key] = value
    return merged


def _describe(problem: Mapping[str, Any], model: type[Section], where: tuple[str, ...], variables: Mapping) -> str:
    """One pydantic error as the project says it: '<dotted key>: <what is wrong>' (and the variable that set it)."""
    path = (*where, *(part for part in problem["loc"] if isinstance(part, str)))
    kind, error = problem["type"], problem.get("ctx", {}).get("error")
    owner = _model_at(model, path[len(where) : -1])
    if isinstance(error, Invalid):
        # A field validator names a key beside its field; a model validator a key of its own table.
        field = owner.model_fields.get(path[-1]) if owner is not None and len(path) > len(where) else None
        beside = field is not None and _section_of(field) is None
        path, reason = ((*path[:-1], error.key) if beside else (*path, error.key)), error.reason
    elif kind == "missing":
        reason = "missing"
    elif kind == "extra_forbidden":
        known = list(owner.model_fields) if owner is not None else []
        if owner is Settings:
            extra = [EGRESS_PREFIX + "<name>", DATASET_PREFIX + "<name>"]
            return f"{path[-1]}: unknown section (known: {', '.join([*known, *extra])})"
        reason = f"unknown key (known: {', '.join(known)})"
    elif kind in TYPE_ERRORS:
        value = problem["input"]
        reason = f"expected {TYPE_ERRORS[kind]}, got {type(value).__name__} {value!r}"
    elif error is not None:
        reason = str(error)
    else:
        reason = f"{problem['msg']}, not {problem['input']!r}"
    variable = variables.get(path)
    return f"{'.'.join(path)}: {reason}" + (f" (set by {variable})" if variable else "")


def _model_at(model: type[Section], path: tuple[str, ...]) -> type[Section] | None:
    for name in path:
        field = model.model_fields.get(name)
        model = _section_of(field) if field is not None else None
        if model is None:
            return None
    return model


def _plain(annotation: Any) -> Any:
    """The type under Annotated and Optional: ``str | None`` -> str."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _section_of(field: FieldInfo) -> type[Section] | None:
    annotation = _plain(field.annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, Section) else None


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


_PBES2_OID = bytes.fromhex("06092a864886f70d01050d")  # DER of PBES2's object identifier, 1.2.840.113549.1.5.13


def _is_encrypted(key_pem: str) -> bool:
    return "-----BEGIN ENCRYPTED PRIVATE KEY-----" in key_pem


def _pem_der(pem: str) -> bytes:
    body = re.search(r"-----BEGIN [A-Z ]+-----(.*?)-----END", pem, re.S)
    try:
        return base64.b64decode("".join(body.group(1).split())) if body else b""
    except ValueError:
        return b""


def _loopback(url: str) -> bool:
    return urlsplit(url).hostname in {"127.0.0.1", "localhost", "::1"}


def _pem_file(location: str, key: str, kind: str) -> str:
    path = Path(location).expanduser().resolve()
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise Invalid(key, f"{str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as error:
        raise Invalid(key, f"{str(path)!r} cannot be read: {error.__class__.__name__}") from None
    if not re.search(rf"-----BEGIN [A-Z ]*{kind}-----", text):
        raise Invalid(key, f"{str(path)!r} holds no PEM {kind.lower()} (-----BEGIN ...{kind}-----)")
    return str(path)


def _lakehouse_root(root: str) -> str:
    # URIs pass through; a plain path is made absolute: tables must not move with the working directory.
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*):", root)
    if scheme is None:
        return str(Path(root).expanduser().resolve())
    if scheme.group(1).lower() in {"s3", "s3n"}:
        # Only Hadoop's S3A connector is configured (and its conditional writes keep commits safe).
        raise ConfigError(f"lakehouse.root: {root!r}: write s3a://{root.partition('://')[2]} (Hadoop's S3A connector)")
    if scheme.group(1).lower() == "s3a" and not re.fullmatch(r"s3a://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?", root):
        raise ConfigError(f"lakehouse.root: {root!r} is not s3a://<bucket>/<prefix> with a valid bucket name")
    return root.rstrip("/")
