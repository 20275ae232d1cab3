"""Writer schemas, looked up by id in a schema registry with Confluent's REST API.

confluent-kafka's own ``SchemaRegistryClient`` speaks to the registry; this module asks it for the
ids a batch names and keeps each schema it found, once per process, in a bounded cache (a schema
never changes under its id). An id the registry does not hold is not kept: a schema registered after
the records that name it is found when they are read again (a reset of silver). A registry that does
not answer fails the batch with ``RegistryUnavailable``, naming ``schema_registry.url``: that is not a
record's fault, and the batch replays once it answers.

The client runs in the driver alone; nothing of it is shipped to the executors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import TypeVar
from urllib.parse import urlsplit

from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError

# Schemas kept per process: far more than the writer versions of a project's topics.
CACHE_SIZE = 1000
# Seconds a request to the registry may take: its client waits for ever by default, and a registry that
# accepts a connection without answering would hang the batch instead of failing it.
REQUEST_TIMEOUT_S = 30
NOT_FOUND = 404
T = TypeVar("T")


def client_conf(url: str) -> dict:
    """The configuration of confluent-kafka's SchemaRegistryClient for the registry at ``url``.

    Example::

        SchemaRegistryClient(client_conf("http://127.0.0.1:8081"))
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"url must be the registry's http(s):// URL, not {url!r}")
    return {"url": url, "timeout": REQUEST_TIMEOUT_S}


class RegistryUnavailable(RuntimeError):
    """The registry did not answer (or answered with a server error): the batch fails, and replays."""


@dataclass(frozen=True)
class WriterSchema:
    """A schema as the registry holds it: its id, type (``AVRO``, ``PROTOBUF``, ``JSON``) and text."""

    schema_id: int
    schema_type: str
    text: str


class WriterSchemas:
    """The writer schemas of ids, from the registry at ``url``, each fetched once per process.

    Example::

        schemas = WriterSchemas("http://127.0.0.1:8081")
        schemas.lookup([1, 2])  # {1: WriterSchema(1, "AVRO", "{...}"), 2: None}  (2: not in the registry)
    """

    def __init__(self, url: str, client: SchemaRegistryClient | None = None, cache_size: int = CACHE_SIZE) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be the registry's http(s):// URL, not {url!r}")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, not {cache_size!r}")
        self.url = url
        self._client = client or SchemaRegistryClient(client_conf(url))
        self._cache_size = cache_size
        self._found: OrderedDict[int, WriterSchema] = OrderedDict()

    def check(self) -> None:
        """Ask the registry for its subjects: RegistryUnavailable, naming schema_registry.url, when it does not
        answer. A command checks it before Spark starts.

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
        found = self._ask(lambda: SchemaRegistryClient(client_conf(self.url)).get_latest_version(subject), True)
        if found is None:
            return None
        schema = found.schema
        return WriterSchema(found.schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str)

    def lookup(self, schema_ids: Iterable[int]) -> dict[int, WriterSchema | None]:
        """Each id's writer schema, None for an id the registry does not hold.

        Raises RegistryUnavailable naming schema_registry.url when the registry does not answer.
        """
        found: dict[int, WriterSchema | None] = {}
        for schema_id in schema_ids:
            if isinstance(schema_id, bool) or not isinstance(schema_id, int):
                raise TypeError(f"schema ids are ints, not {schema_id!r}")
            found[schema_id] = self._schema(schema_id)
        return found

    def _schema(self, schema_id: int) -> WriterSchema | None:
        if schema_id in self._found:
            self._found.move_to_end(schema_id)
            return self._found[schema_id]
        schema = self._ask(lambda: self._client.get_schema(schema_id), True)
        if schema is None:
            return None
        writer = WriterSchema(schema_id, (schema.schema_type or "AVRO").upper(), schema.schema_str)
        self._found[schema_id] = writer
        if len(self._found) > self._cache_size:
            self._found.popitem(last=False)
        return writer

    def _ask(self, request: Callable[[], T], missing_is_none: bool = False) -> T | None:
        """``request``'s answer; with ``missing_is_none``, None for a 404. RegistryUnavailable for any other
        error, of HTTP or of the transport (connection, timeout, TLS), whose classes differ by version."""
        try:
            return request()
        except SchemaRegistryError as error:
            if missing_is_none and error.http_status_code == NOT_FOUND:
                return None
            raise self._unavailable(f"HTTP {error.http_status_code}: {error.error_message}") from None
        except Exception as error:  # noqa: BLE001 - see above
            raise self._unavailable(f"{type(error).__name__}: {error}") from None

    def _unavailable(self, what: str) -> RegistryUnavailable:
        parts = urlsplit(self.url)
        # Never a user or password a URL may carry.
        shown = f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"
        # The client's own words may quote the URL it was given.
        what = what.replace(self.url, shown).replace(parts.netloc, parts.netloc.rpartition("@")[2])
        return RegistryUnavailable(
            f"schema_registry.url: the registry at {shown} did not answer ({what}); the batch fails and is "
            "read again once it answers: no record is lost or quarantined for it"
        )


@cache
def writer_schemas(url: str) -> WriterSchemas:
    """The process's one ``WriterSchemas`` of the registry at ``url``: its cache serves every stream.

    Example::

        writer_schemas(config.schema_registry.url).lookup([1])
    """
    return WriterSchemas(url)
