"""Writer schemas, looked up by id in a schema registry with Confluent's REST API.

confluent-kafka's own ``SchemaRegistryClient`` speaks to the registry; this module asks it for the
ids a batch names and keeps each schema it found, once per process, in a bounded cache (a schema
never changes under its id). An id the registry does not hold is remembered as missing for a few minutes
only: records of random bytes that happen to look like the wire format name a new id each, and a batch
read again soon (a failed batch's replay) asks the registry once for them, not twice; a schema
registered after the records that name it is found when they are read again later (a reset of silver).
A registry that does not answer fails the batch with ``RegistryUnavailable``, naming
``schema_registry.url``: that is not a record's fault, and the batch replays once it answers.

The client runs in the driver alone; nothing of it (its credentials least of all) is shipped to the
executors. ``RegistryAccess`` is where to reach the registry and how to prove who is asking: a CA for
https, a user and password or a bearer token, the secrets held as ``SecretStr`` (never printed).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar
from urllib.parse import urlsplit

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from pydantic import SecretStr

# Schemas kept per process: far more than the writer versions of a project's topics.
CACHE_SIZE = 1000
# Ids found missing, kept this long (seconds) and at most this many (a few MB).
MISSING_TTL_S = 300.0
MISSING_CACHE_SIZE = 100_000
# Requests to the registry at once, when a batch names ids neither cache holds (its client is thread-safe).
LOOKUP_THREADS = 8
# Seconds a request to the registry may take: its client waits for ever by default, and a registry that
# accepts a connection without answering would hang the batch instead of failing it.
REQUEST_TIMEOUT_S = 30
NOT_FOUND = 404
# A schema the subject's compatibility rule refuses (409), or one the registry finds invalid (422).
REFUSALS = frozenset({409, 422})
# The answers of a registry that will not take these credentials (or none): a setting to fix, not an outage.
REFUSED = {401: "refused the credentials", 403: "refused access with these credentials"}
T = TypeVar("T")


@dataclass(frozen=True)
class RegistryAccess:
    """How to reach a registry: its URL, the CA of its https certificate, and one kind of credentials.

    Example::

        RegistryAccess("https://registry:8081", ca_location="/etc/ca.pem", username="lake", password=SecretStr("..."))
        RegistryAccess.of(config.schema_registry)  # from [schema_registry]
    """

    url: str
    ca_location: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    bearer_token: SecretStr | None = None
    bearer_logical_cluster: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must be the registry's http(s):// URL, not {self.url!r}")
        for name in ("password", "bearer_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, SecretStr):
                raise TypeError(f"{name} must be a SecretStr, not {type(value).__name__}")
        if (self.username is None) != (self.password is None):
            raise ValueError("username and password come together")
        if self.username is not None and self.bearer_token is not None:
            raise ValueError("one kind of credentials: a user and password, or a bearer token")

    @classmethod
    def of(cls, section: Any) -> RegistryAccess:
        """The access ``[schema_registry]`` (a ``config.SchemaRegistrySection``, its url resolved) describes."""
        return cls(
            section.url,
            ca_location=section.ssl_ca_location,
            username=section.basic_auth_username,
            password=section.basic_auth_password,
            bearer_token=section.bearer_token,
            bearer_logical_cluster=section.bearer_logical_cluster,
        )

    def __repr__(self) -> str:
        # The URL never carries credentials (the config refuses them there); SecretStr prints stars.
        kind = "basic auth" if self.username else "bearer token" if self.bearer_token else "no credentials"
        return f"RegistryAccess({self.url!r}, {kind})"


def client_conf(access: RegistryAccess | str) -> dict:
    """The configuration of confluent-kafka's SchemaRegistryClient for a registry (its access, or a URL).

    Example::

        SchemaRegistryClient(client_conf("http://127.0.0.1:8081"))
    """
    if isinstance(access, str):
        access = RegistryAccess(access)
    if not isinstance(access, RegistryAccess):
        raise TypeError(f"access must be a RegistryAccess or a URL, not {type(access).__name__}")
    conf: dict[str, Any] = {"url": access.url, "timeout": REQUEST_TIMEOUT_S}
    if access.ca_location is not None:
        conf["ssl.ca.location"] = access.ca_location
    if access.username is not None:
        conf["basic.auth.user.info"] = f"{access.username}:{access.password.get_secret_value()}"
    if access.bearer_token is not None:
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf["bearer.auth.token"] = access.bearer_token.get_secret_value()
        conf["bearer.auth.logical.cluster"] = access.bearer_logical_cluster
    return conf


class RegistryUnavailable(RuntimeError):
    """The registry did not answer (or answered with a server error): the batch fails, and replays."""


class RegistryRefused(RegistryUnavailable):
    """The registry answered 401 or 403: the credentials (or their absence) are what to fix."""


class SchemaRefused(ValueError):
    """The registry refused to register a schema under a subject: its compatibility rule, or an invalid schema."""


@dataclass(frozen=True)
class WriterSchema:
    """A schema as the registry holds it: its id, type (``AVRO``, ``PROTOBUF``, ``JSON``) and text."""

    schema_id: int
    schema_type: str
    text: str


class WriterSchemas:
    """The writer schemas of ids, from the registry at ``url``, each fetched once per process.

    Example::

        schemas = WriterSchemas("http://127.0.0.1:8081")  # or WriterSchemas(RegistryAccess.of(config.schema_registry))
        schemas.lookup([1, 2])  # {1: WriterSchema(1, "AVRO", "{...}"), 2: None}  (2: not in the registry)
    """

    def __init__(
        self,
        access: RegistryAccess | str,
        client: SchemaRegistryClient | None = None,
        cache_size: int = CACHE_SIZE,
        missing_ttl_s: float = MISSING_TTL_S,
    ) -> None:
        if isinstance(access, str):
            access = RegistryAccess(access)
        if not isinstance(access, RegistryAccess):
            raise TypeError(f"access must be a RegistryAccess or a URL, not {type(access).__name__}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, not {cache_size!r}")
        if isinstance(missing_ttl_s, bool) or not isinstance(missing_ttl_s, int | float) or missing_ttl_s < 0:
            raise ValueError(f"missing_ttl_s must be seconds >= 0, not {missing_ttl_s!r}")
        self.access = access
        self.url = access.url
        self._client = client or SchemaRegistryClient(client_conf(access))
        self._cache_size = cache_size
        self._found: OrderedDict[int, WriterSchema] = OrderedDict()
        self._missing_ttl_s = float(missing_ttl_s)
        # Id -> when the registry said it does not hold it (time.monotonic()), oldest first.
        self._missing: OrderedDict[int, float] = OrderedDict()

    def check(self) -> None:
        """Ask the registry for its subjects: RegistryUnavailable, naming schema_registry.url, when it does not
        answer; RegistryRefused, naming the credentials' setting, when it refuses them. A command checks it
        before Spark starts.

        Example::

            WriterSchemas(url).check()
        """
        self._ask(self._client.get_subjects)

    def latest(self, subject: str) -> WriterSchema | None:
        """The latest schema registered under ``subject``, None when the subject has none (never cached: a
        producer may register another at any time).

        Example::

            WriterSchemas(url).latest("orders-value")  # WriterSchema(7, "AVRO", "{...}")
        """
        if not isinstance(subject, str) or not subject:
            raise ValueError(f"subject must name a subject, not {subject!r}")
        # A client of its own: confluent-kafka's keeps a subject's latest version for the process's life.
        found = self._ask(lambda: SchemaRegistryClient(client_conf(self.access)).get_latest_version(subject), True)
        if found is None:
            return None
        schema = found.schema
        return WriterSchema(found.schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str)

    def register(self, subject: str, text: str, schema_type: str = "AVRO") -> int:
        """The id of schema ``text`` under ``subject``: registered now, or found there already (the registry
        answers with the existing id). SchemaRefused, naming the subject and the registry's words, when the
        subject's compatibility rule refuses it.

        Example::

            WriterSchemas(access).register("orders-by-shop-changes-value", record_schema(schema, "by_shop"))  # 12
        """
        if not isinstance(subject, str) or not subject:
            raise ValueError(f"subject must name a subject, not {subject!r}")
        if not isinstance(text, str) or not text:
            raise ValueError("text must be the schema to register")
        try:
            return self._ask(lambda: self._client.register_schema(subject, Schema(text, schema_type)), keep=REFUSALS)
        except SchemaRegistryError as error:
            compatibility = self._ask(lambda: self._compatibility(subject))
            raise SchemaRefused(
                f"subject {subject} ({compatibility} compatibility) refuses the schema "
                f"(HTTP {error.http_status_code}: {error.error_message})"
            ) from None

    def _compatibility(self, subject: str) -> str:
        try:
            return self._client.get_compatibility(subject)
        except SchemaRegistryError as error:
            if error.http_status_code != NOT_FOUND:
                raise
            return f"{self._client.get_compatibility()}, the registry's default"

    def lookup(self, schema_ids: Iterable[int]) -> dict[int, WriterSchema | None]:
        """Each id's writer schema, None for an id the registry does not hold. The ids neither cache holds
        are asked ``LOOKUP_THREADS`` at a time: a batch of random bytes may name thousands.

        Raises RegistryUnavailable naming schema_registry.url when the registry does not answer.
        """
        ids = list(dict.fromkeys(schema_ids))
        for schema_id in ids:
            if isinstance(schema_id, bool) or not isinstance(schema_id, int):
                raise TypeError(f"schema ids are ints, not {schema_id!r}")
        now = time.monotonic()
        while self._missing and next(iter(self._missing.values())) <= now - self._missing_ttl_s:
            self._missing.popitem(last=False)
        found: dict[int, WriterSchema | None] = {}
        asked = []
        for schema_id in ids:
            if schema_id in self._found:
                self._found.move_to_end(schema_id)
                found[schema_id] = self._found[schema_id]
            elif schema_id in self._missing:
                found[schema_id] = None
            else:
                asked.append(schema_id)
        if len(asked) > 1:
            with ThreadPoolExecutor(LOOKUP_THREADS, thread_name_prefix="schema-lookup") as pool:
                answers = list(pool.map(self._fetch, asked))
        else:
            answers = [self._fetch(schema_id) for schema_id in asked]
        for schema_id, writer in zip(asked, answers, strict=True):
            found[schema_id] = writer
            if writer is not None:
                self._found[schema_id] = writer
                if len(self._found) > self._cache_size:
                    self._found.popitem(last=False)
            elif self._missing_ttl_s > 0:
                self._missing[schema_id] = now
                if len(self._missing) > MISSING_CACHE_SIZE:
                    self._missing.popitem(last=False)
        return {schema_id: found[schema_id] for schema_id in ids}

    def _fetch(self, schema_id: int) -> WriterSchema | None:
        schema = self._ask(lambda: self._client.get_schema(schema_id), True)
        if schema is None:
            return None
        return WriterSchema(schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str)

    def _ask(
        self, request: Callable[[], T], missing_is_none: bool = False, keep: frozenset[int] = frozenset()
    ) -> T | None:
        """``request``'s answer; with ``missing_is_none``, None for a 404; the SchemaRegistryError itself for a
        status in ``keep``. RegistryRefused for a 401 or 403 (or a certificate not trusted), and
        RegistryUnavailable for any other error, of HTTP or of the transport (connection, timeout, TLS),
        whose classes differ by version."""
        try:
            return request()
        except SchemaRegistryError as error:
            if missing_is_none and error.http_status_code == NOT_FOUND:
                return None
            if error.http_status_code in keep:
                raise
            if error.http_status_code in REFUSED:
                raise self._refused(error.http_status_code) from None
            raise self._unavailable(f"HTTP {error.http_status_code}: {error.error_message}") from None
        except Exception as error:  # noqa: BLE001 - see above
            if "CERTIFICATE_VERIFY_FAILED" in str(error):
                raise self._untrusted(str(error)) from None
            raise self._unavailable(f"{type(error).__name__}: {error}") from None

    def _refused(self, status: int) -> RegistryRefused:
        access = self.access
        if access.username is not None:
            setting = f"schema_registry.basic_auth_username ({access.username}) and basic_auth_password_file"
        elif access.bearer_token is not None:
            setting = "schema_registry.bearer_token_file"
        else:
            setting = "schema_registry.basic_auth_username and basic_auth_password_file, or bearer_token_file"
        return RegistryRefused(
            f"{setting}: the registry at {self._shown()} {REFUSED[status]} (HTTP {status}); set or correct them "
            "and start again: no record is lost or quarantined for it"
        )

    def _untrusted(self, what: str) -> RegistryRefused:
        ca = self.access.ca_location
        trusted = f"the CA in {ca}" if ca else "the system's CAs (none is named)"
        return RegistryRefused(
            f"schema_registry.ssl_ca_location: the certificate of the registry at {self._shown()} is not signed by "
            f"{trusted} ({what.strip()[:300]}); name the PEM file of the CA that signed it"
        )

    def _shown(self) -> str:
        parts = urlsplit(self.url)
        # Never a user or password a URL may carry.
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"

    def _unavailable(self, what: str) -> RegistryUnavailable:
        parts = urlsplit(self.url)
        shown = self._shown()
        # The client's own words may quote the URL it was given; never a secret of the access.
        what = what.replace(self.url, shown).replace(parts.netloc, parts.netloc.rpartition("@")[2])
        for secret in (self.access.password, self.access.bearer_token):
            if secret is not None and secret.get_secret_value():
                what = what.replace(secret.get_secret_value(), "**********")
        return RegistryUnavailable(
            f"schema_registry.url: the registry at {shown} did not answer ({what}); the batch fails and is "
            "read again once it answers: no record is lost or quarantined for it"
        )


@cache
def writer_schemas(access: RegistryAccess) -> WriterSchemas:
    """The process's one ``WriterSchemas`` of a registry: its cache serves every stream.

    Example::

        writer_schemas(RegistryAccess.of(config.schema_registry)).lookup([1])
    """
    return WriterSchemas(access)
