"""Egress streams: gold leaves the lakehouse exactly once.

Each module here is one egress, a stream of its own (checkpoint, stream id, lease,
crash points) that follows gold's change data feed:

* ``kafka.py``: a Kafka topic, one transaction per batch with the batch id committed
  inside it (two-phase commit: produce = pre-commit, commit once the batch is complete);
* ``postgres.py``: a PostgreSQL table, each batch applied in one database transaction
  together with a (stream id, batch id) marker row.

A bake keeps the egresses it was asked for; this package finds the ones that are
there, and a config section (``[egress_kafka]``, ``[egress_postgres]``) turns one on. Each module
is an ``Egress`` (the protocol below); ``configure`` parses each section that counts with that
egress's own ``Settings``, so that the config module needs to know no egress.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from ..config import Config, ConfigError, Section, load_section

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from ..contract import Contract
    from ..delta.tables import Lakehouse

S = TypeVar("S", bound=Section)

EGRESS_MODULES = ("kafka", "postgres")
SWITCH_VAR = "PIPELINE_EGRESS"
# The gold table version an egress row was written from: in every sink, and read by the audit.
GOLD_VERSION = "gold_version"


class Egress(Protocol):
    """What an egress module provides (``kafka.py``, ``postgres.py``); the command line and the streams use no more."""

    SECTION: str  # its config table, "egress_<name>"
    STREAM: str  # its stream's name, "<name>_egress"
    Settings: type[Section]  # the model of its table; env_prefix EGRESS_<NAME>_
    FINDINGS: tuple[str, ...]  # the keys of what audit_errors counts (docs/runbook.md explains each)

    def check_connection(self, config: Config) -> None: ...

    def provision_local(self, config: Config) -> None: ...
    def fence(self, config: Config, stream_id: str) -> None: ...

    def start(
        self, spark: SparkSession, config: Config, lakehouse: Lakehouse, stream_id: str, contract: Contract = ...
    ) -> DataStreamWriter: ...

    def describe(self, config: Config) -> dict: ...

    def read_back(self, spark: SparkSession, config: Config, contract: Contract = ...) -> DataFrame: ...

    def audit_errors(self, spark: SparkSession, config: Config) -> dict[str, int]: ...


def installed_names() -> tuple[str, ...]:
    """The stream names of the egresses this project has, without importing them (for the command line)."""
    return tuple(f"{name}_egress" for name in EGRESS_MODULES if importlib.util.find_spec(f"{__name__}.{name}"))


def installed() -> dict[str, Egress]:
    """The egress modules this project has, by stream name (a bake prunes the others).

    Example::

        sorted(installed())  # ["kafka_egress", "postgres_egress"] in a bake with both
    """
    found = {}
    for name in EGRESS_MODULES:
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            module = cast(Egress, importlib.import_module(f"{__name__}.{name}"))
            found[module.STREAM] = module
    return found


def configure(config: Config, environ: Mapping[str, str] | None = None) -> Config:
    """``config`` with the settings of every egress it turns on, by stream name; ConfigError names a bad key.

    Each ``[egress_<name>]`` table is parsed by its egress's ``Settings`` with the overrides ``environ``
    holds (default os.environ, like load_config): a variable alone turns no egress on. A table of an
    egress this project does not have is refused. PIPELINE_EGRESS narrows the tables that count:
    ``none``, or a comma-separated list of table names (a backfill without egress, or tests of one layer).

    Example::

        config = configure(load_config())
        sorted(config.egress)  # ["kafka_egress", "postgres_egress"] with both tables in the config
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    environ = os.environ if environ is None else environ
    modules = {module.SECTION: module for module in installed().values()}
    for section in config.egress_sections:
        if section not in modules:
            raise ConfigError(
                f"{section}: unknown section: this project has no such egress "
                f"(its egress sections: {', '.join(modules) or 'none'})"
            )
    chosen = _chosen_sections(set(config.egress_sections), environ)
    settings = {
        module.STREAM: load_section(module.Settings, config.egress_sections[section], environ, section)
        for section, module in modules.items()
        if section in chosen
    }
    return config.model_copy(update={"egress": settings})


def _chosen_sections(present: set[str], environ: Mapping[str, str]) -> set[str]:
    value = environ.get(SWITCH_VAR, "").strip()
    if not value:
        return present
    if value == "none":
        return set()
    chosen = {name.strip() for name in value.split(",")}
    unknown = chosen - present
    if unknown:
        raise ConfigError(
            f"{SWITCH_VAR}: {', '.join(sorted(unknown))} is not an egress section of this config "
            f"(present: {', '.join(sorted(present)) or 'none'}); use 'none' or a list of present sections"
        )
    return chosen


def configured(config: Config) -> dict[str, Egress]:
    """The egress modules the config turns on, by stream name, in a fixed order.

    Example::

        for stream, module in configured(config).items():
            module.check_connection(config)
    """
    modules = installed()
    return {stream: modules[stream] for stream in modules if stream in settings_of(config)}


def settings_of(config: Config) -> Mapping[str, Section]:
    """The parsed settings of each egress the config turns on, by stream name.

    Raises RuntimeError for a config whose egress tables ``configure`` has not parsed: an egress
    must not go quietly off because a caller skipped that step.

    Example::

        settings_of(configure(load_config()))["kafka_egress"].topic  # "gold-changes"
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    if config.egress is None:
        raise RuntimeError("the config's egress tables are not parsed yet: pass it through egress.configure first")
    return config.egress


def section_settings(config: Config, stream: str, model: type[S]) -> S:
    """The settings of egress ``stream`` in ``config``, a ``model``; ValueError when the config leaves it off.

    Example::

        section_settings(config, "kafka_egress", KafkaEgressSettings).topic  # "gold-changes"
    """
    found = settings_of(config).get(stream)
    if not isinstance(found, model):
        raise ValueError(f"config must turn on the egress {stream} (its [egress_...] section, and PIPELINE_EGRESS)")
    return found


def stream(name: str):
    """The egress stream ``name`` as a pipeline Stream: gold is its source; its sink is outside the lakehouse.

    Example::

        checkpoints.prepare(spark, lakehouse, stream("kafka_egress"))
    """
    from ..datasets.events import DATASET
    from ..delta.tables import GOLD, Layer, Stream

    if name not in installed():
        raise ValueError(f"name must be an egress stream of this project ({', '.join(installed()) or 'none'})")
    return Stream(name, GOLD, sinks=(), downstream=(), reads_changes=True, layer=Layer.EGRESS, dataset=DATASET)
