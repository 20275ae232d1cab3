"""Egress streams: gold leaves the lakehouse exactly once.

Each module here is one egress, a stream of its own (checkpoint, stream id, lease,
crash points) that follows gold's change data feed:

* ``kafka.py``: a Kafka topic, one transaction per batch with the batch id committed
  inside it (two-phase commit: produce = pre-commit, commit once the batch is complete);
* ``postgres.py``: a PostgreSQL table, each batch applied in one database transaction
  together with a (stream id, batch id) marker row.

A bake keeps the egresses it was asked for; this package finds the ones that are
there, and a config section (``[egress_kafka]``, ``[egress_postgres]``) turns one on.
Each module provides: ``SECTION``, ``STREAM``, ``ENV_OVERRIDES``, ``parse_settings``,
``check_connection``, ``provision_local``, ``start``, ``describe``, and for the audit and
``show``: ``read_back`` (the sink as its readers see it) and ``audit_errors``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping
from types import ModuleType

EGRESS_MODULES = ("kafka", "postgres")
SWITCH_VAR = "PIPELINE_EGRESS"
# The gold table version an egress row was written from: in every sink, and read by the audit.
GOLD_VERSION = "gold_version"


def installed_names() -> tuple[str, ...]:
    """The stream names of the egresses this project has, without importing them (for the command line)."""
    return tuple(f"{name}_egress" for name in EGRESS_MODULES if importlib.util.find_spec(f"{__name__}.{name}"))


def installed() -> dict[str, ModuleType]:
    """The egress modules this project has, by stream name (a bake prunes the others).

    Example::

        sorted(installed())  # ["kafka_egress", "postgres_egress"] in a bake with both
    """
    found = {}
    for name in EGRESS_MODULES:
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            module = importlib.import_module(f"{__name__}.{name}")
            found[module.STREAM] = module
    return found


def sections() -> dict[str, ModuleType]:
    """The config sections the installed egresses read, by section name."""
    return {module.SECTION: module for module in installed().values()}


def parse_sections(raw: dict, environ: Mapping[str, str]) -> dict[str, object]:
    """Settings of every egress whose section is in the config, by stream name; ConfigError names a bad key.

    Environment overrides apply to a section that is there: a variable alone turns no egress on.
    PIPELINE_EGRESS narrows the sections that count: ``none``, or a comma-separated list of
    section names (a backfill without egress, or tests of one layer).

    Example::

        parse_sections({"egress_kafka": {"topic": "gold-changes"}}, {})  # {"kafka_egress": KafkaEgressSettings(...)}
    """
    from ..config import ConfigError

    chosen = _chosen_sections(raw, environ)
    settings = {}
    for section, module in sections().items():
        if section not in chosen:
            continue
        values = raw[section]
        if not isinstance(values, dict):
            raise ConfigError(f"{section}: must be a table of keys")
        values = dict(values)
        for key, var in module.ENV_OVERRIDES.items():
            if environ.get(var):
                values[key] = environ[var]
        settings[module.STREAM] = module.parse_settings(values, environ)
    return settings


def _chosen_sections(raw: dict, environ: Mapping[str, str]) -> set[str]:
    from ..config import ConfigError

    present = {section for section in sections() if section in raw}
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


def configured(config) -> dict[str, ModuleType]:
    """The egress modules the config turns on, by stream name, in a fixed order.

    Example::

        for stream, module in configured(config).items():
            module.check_connection(config)
    """
    modules = installed()
    return {stream: modules[stream] for stream in modules if stream in config.egress}


def stream(name: str):
    """The egress stream ``name`` as a pipeline Stream: gold is its source; its sink is outside the lakehouse.

    Example::

        checkpoints.prepare(spark, lakehouse, stream("kafka_egress"))
    """
    from ..delta.tables import GOLD, Stream

    if name not in installed():
        raise ValueError(f"name must be an egress stream of this project ({', '.join(installed()) or 'none'})")
    return Stream(name, GOLD, sinks=(), downstream=())
