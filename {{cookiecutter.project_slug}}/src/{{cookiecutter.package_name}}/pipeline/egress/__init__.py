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

An egress publishes the golds its section names, each a ``Target`` with a stream of its own: the first
dataset's first gold to the section's ``topic`` (``table``) by the stream ``<name>_egress``, and each gold
its ``golds`` table names (``"<dataset>.<gold>" = "<topic or table>"``) by the stream
``<the gold's stream>_<name>_egress``, such as ``orders_gold_by_shop_kafka_egress``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

from ..config import Config, ConfigError, Section, load_section
from ..dataset import Dataset, Gold

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

    from ..delta.tables import Lakehouse

S = TypeVar("S", bound=Section)

EGRESS_MODULES = ("kafka", "postgres")
SWITCH_VAR = "PIPELINE_EGRESS"
# The gold table version an egress row was written from: in every sink, and read by the audit.
GOLD_VERSION = "gold_version"


@dataclass(frozen=True)
class Target:
    """One gold an egress publishes: the stream that publishes it (its own checkpoint, stream id, lease
    and marker), the gold, and where it goes (``destination``: a topic, a table)."""

    stream: str
    dataset: Dataset
    gold: Gold
    destination: str

    @property
    def gold_table(self) -> str:
        return self.dataset.gold_table(self.gold)


class Egress(Protocol):
    """What an egress module provides (``kafka.py``, ``postgres.py``); the command line and the streams use no more."""

    SECTION: str  # its config table, "egress_<name>"
    STREAM: str  # the stream of the first dataset's first gold, "<name>_egress"
    DESTINATION: str  # the key of its section naming where that gold goes ("topic", "table")
    Settings: type[Section]  # the model of its table; env_prefix EGRESS_<NAME>_; ``golds`` maps others
    FINDINGS: tuple[str, ...]  # the keys of what audit_errors counts (docs/runbook.md explains each)

    def check_connection(self, config: Config) -> None: ...

    def provision_local(self, config: Config) -> None: ...
    def fence(self, config: Config, stream_id: str) -> None: ...

    def start(
        self, spark: SparkSession, config: Config, lakehouse: Lakehouse, stream_id: str, target: Target = ...
    ) -> DataStreamWriter: ...

    def describe(self, config: Config, target: Target | None = None) -> dict: ...

    def read_back(self, spark: SparkSession, config: Config, target: Target | None = None) -> DataFrame: ...

    def audit_errors(self, spark: SparkSession, config: Config, target: Target | None = None) -> dict[str, int]: ...


def installed_names() -> tuple[str, ...]:
    """The egresses this project has, each by its first stream's name, without importing them.

    Example::

        installed_names()  # ("kafka_egress", "postgres_egress") in a bake with both
    """
    return tuple(f"{name}_egress" for name in EGRESS_MODULES if importlib.util.find_spec(f"{__name__}.{name}"))


def installed_streams() -> tuple[str, ...]:
    """Every egress stream this project can run, one per egress and declared gold: each egress's first
    stream, then one per other gold (for the command line's choices).

    Example::

        installed_streams()  # ("kafka_egress", "gold_hourly_kafka_egress", "orders_gold_by_shop_kafka_egress", ...)
    """
    from ..datasets import DATASETS

    streams = []
    for egress in installed_names():
        streams += [target_stream(egress, each, gold) for each in DATASETS for gold in each.golds]
    return tuple(streams)


def target_stream(egress: str, dataset: Dataset, gold: Gold) -> str:
    """The name of the stream by which egress ``egress`` (its first stream, "<name>_egress") publishes ``gold``
    of ``dataset``: ``egress`` itself for the first dataset's first gold.

    Example::

        target_stream("kafka_egress", dataset("orders"), dataset("orders").golds[0])
        # "orders_gold_by_shop_kafka_egress"
    """
    from ..datasets import DATASETS

    if not isinstance(egress, str) or not egress.endswith("_egress"):
        raise ValueError(f"egress must be an egress's first stream, <name>_egress, not {egress!r}")
    if dataset == DATASETS[0] and gold == dataset.golds[0]:
        return egress
    return f"{dataset.gold_stream(gold)}_{egress}"


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
    configured_config = config.model_copy(update={"egress": settings})
    targets(configured_config)  # a gold or a destination named wrong fails here, naming the key
    return configured_config


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
    """The egress module of each stream the config's egresses run (one per gold each publishes), by stream
    name, in a fixed order: egress by egress, its first stream, then those of its other golds.

    Example::

        for stream, module in configured(config).items():
            module.check_connection(config)
    """
    modules = installed()
    return {stream: modules[target_egress(stream)] for stream in targets(config)}


def targets(config: Config) -> dict[str, Target]:
    """Every gold the config's egresses publish, by the name of the stream that publishes it; ConfigError
    names a ``golds`` key that is not a declared gold, or a destination two golds share.

    Example::

        [target.destination for target in targets(config).values()]  # ["gold-changes", "orders-by-shop"]
    """
    modules = installed()
    found: dict[str, Target] = {}
    for egress, settings in settings_of(config).items():
        module = modules[egress]
        own = [first_target(egress, getattr(settings, module.DESTINATION))]
        for reference, destination in getattr(settings, "golds", {}).items():
            dataset, gold = _declared_gold(module, reference)
            own.append(Target(target_stream(egress, dataset, gold), dataset, gold, destination))
        destinations: dict[str, str] = {}
        for target in own:
            if target.stream in found:
                raise ConfigError(
                    f"{module.SECTION}.golds: {target.dataset.name}.{target.gold.name} is the gold "
                    f"{module.SECTION}.{module.DESTINATION} publishes already"
                )
            taken = destinations.setdefault(target.destination, target.stream)
            if taken != target.stream:
                raise ConfigError(
                    f"{module.SECTION}.golds: {target.destination!r} is where stream {taken} publishes already: "
                    "each gold needs a destination of its own"
                )
            found[target.stream] = target
    return found


def target(config: Config, stream: str) -> Target:
    """The gold egress stream ``stream`` publishes, and where; ValueError when the config runs no such stream.

    Example::

        target(config, "kafka_egress").destination  # "gold-changes"
    """
    found = targets(config)
    if stream not in found:
        raise ValueError(
            f"stream must be an egress stream the config runs ({', '.join(found) or 'none'}), not {stream!r}"
        )
    return found[stream]


def published(config: Config, dataset: Dataset) -> tuple[Gold, ...]:
    """The golds of ``dataset`` some egress of ``config`` publishes: each records its change data feed.

    Example::

        [gold.name for gold in published(config, dataset("orders"))]  # ["by_shop"]
    """
    if not isinstance(dataset, Dataset):
        raise TypeError(f"dataset must be a Dataset, not {type(dataset).__name__}")
    golds = {each.gold.name: each.gold for each in targets(config).values() if each.dataset.name == dataset.name}
    return tuple(gold for gold in dataset.golds if gold.name in golds)


def target_egress(stream: str) -> str:
    """The egress (its first stream's name) that runs egress stream ``stream``.

    Example::

        target_egress("orders_gold_by_shop_kafka_egress")  # "kafka_egress"
    """
    for name in EGRESS_MODULES:
        if stream == f"{name}_egress" or stream.endswith(f"_{name}_egress"):
            return f"{name}_egress"
    raise ValueError(f"stream must be an egress stream (..._<egress>_egress), not {stream!r}")


def first_target(egress: str, destination: str) -> Target:
    """What egress ``egress`` (its first stream, "<name>_egress") publishes to ``destination``: the first
    dataset's first gold, by the stream ``egress``.

    Example::

        first_target("kafka_egress", "gold-changes").gold_table  # "gold_event_windows"
    """
    from ..datasets import DATASETS

    if target_egress(egress) != egress:
        raise ValueError(f"egress must be an egress's first stream, <name>_egress, not {egress!r}")
    if not isinstance(destination, str) or not destination:
        raise ValueError(f"destination must name a topic or a table, not {destination!r}")
    return Target(egress, DATASETS[0], DATASETS[0].golds[0], destination)


def first_gold(gold: Gold | None = None) -> Gold:
    """``gold``, or the first dataset's first gold when it is None: what an egress publishes by default.

    Example::

        first_gold().values  # ("event_count", "amount_sum")
    """
    from ..datasets import DATASETS

    if gold is not None and not isinstance(gold, Gold):
        raise TypeError(f"gold must be a Gold, not {type(gold).__name__}")
    return DATASETS[0].golds[0] if gold is None else gold


def destination_key(section: str, key: str, target: Target) -> str:
    """The config key that names where ``target`` goes: ``<section>.<key>`` for its egress's first gold, the
    gold's entry of ``<section>.golds`` for another.

    Example::

        destination_key("egress_kafka", "topic", target)  # 'egress_kafka.golds."orders.by_shop"'
    """
    if not isinstance(target, Target):
        raise TypeError(f"target must be a Target, not {type(target).__name__}")
    if target_egress(target.stream) == target.stream:
        return f"{section}.{key}"
    return f'{section}.golds."{target.dataset.name}.{target.gold.name}"'


def _declared_gold(module: Egress, reference: str) -> tuple[Dataset, Gold]:
    """The dataset and gold "<dataset>.<gold>" names; ConfigError naming the key otherwise."""
    from ..datasets import DATASETS

    dataset_name, _, gold_name = reference.partition(".")
    for dataset in DATASETS:
        for gold in dataset.golds:
            if (dataset.name, gold.name) == (dataset_name, gold_name):
                return dataset, gold
    declared = ", ".join(f"{each.name}.{gold.name}" for each in DATASETS for gold in each.golds)
    raise ConfigError(f"{module.SECTION}.golds: {reference!r} is no declared gold (declared: {declared})")


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
    """The egress stream ``name`` as a pipeline Stream: the gold it publishes is its source; its sink is
    outside the lakehouse.

    Example::

        checkpoints.prepare(spark, lakehouse, stream("kafka_egress"))
    """
    from ..datasets import DATASETS
    from ..delta.tables import Layer, Stream

    if name not in installed_streams():
        raise ValueError(f"name must be an egress stream of this project ({', '.join(installed_streams()) or 'none'})")
    egress = target_egress(name)
    for dataset in DATASETS:
        for gold in dataset.golds:
            if target_stream(egress, dataset, gold) == name:
                source = dataset.gold_table(gold)
                return Stream(
                    name,
                    source,
                    sinks=(),
                    downstream=(),
                    reads_changes=True,
                    layer=Layer.EGRESS,
                    dataset=dataset,
                    gold=gold,
                )
    raise AssertionError(f"{name} is an installed egress stream of no declared gold")
