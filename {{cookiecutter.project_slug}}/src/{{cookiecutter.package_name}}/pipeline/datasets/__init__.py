"""The project's datasets, one module each: where a dataset is declared (see ``dataset.py``).

To add one, write its module beside ``events.py``, list its ``DATASET`` in ``DATASETS`` and name
its topics in a ``[dataset_<name>]`` table of each environment's config (docs/datasets.md walks
it through). The first dataset reads ``kafka.topics``.
"""

import os
from collections.abc import Mapping

from ..config import DATASET_PREFIX, Config, ConfigError, KafkaConfig, dataset_kafka
from ..dataset import Dataset, Naming
{%- if cookiecutter.example_dataset == "orders" %}
from . import events, orders

DATASETS: tuple[Dataset, ...] = (events.DATASET, orders.DATASET)
{%- else %}
from . import events

DATASETS: tuple[Dataset, ...] = (events.DATASET,)
{%- endif %}


def dataset(name: str) -> Dataset:
    """The dataset called ``name``; ValueError naming the datasets there are.

    Example::

        dataset("events").silver  # "silver_events"
    """
    for declared in DATASETS:
        if declared.name == name:
            return declared
    raise ValueError(f"dataset must be one of {', '.join(d.name for d in DATASETS)}, not {name!r}")


def owner(stream: str, datasets: tuple[Dataset, ...] = DATASETS) -> Dataset | None:
    """The dataset of ``datasets`` that declares stream ``stream`` (a layer's, a gold's or its fused stream);
    None for an egress's or an unknown name. Stream names are the project's own: no two datasets share one.

    Example::

        owner("orders_silver").name  # "orders"
    """
    if not isinstance(stream, str) or not stream:
        raise ValueError("stream must be a stream name, e.g. 'silver'")
    for declared in datasets:
        if stream in declared.streams or stream == declared.stream("fused"):
            return declared
    return None


def check_apart(datasets: tuple[Dataset, ...]) -> None:
    """ValueError when two of ``datasets`` share a name, a table or a stream.

    Example::

        check_apart((*DATASETS, returns.DATASET))  # a module of a dataset being added
    """
    if not all(isinstance(declared, Dataset) for declared in datasets):
        raise ValueError(f"datasets must all be Datasets, got {[type(d).__name__ for d in datasets]}")
    names = [declared.name for declared in datasets]
    owners: dict[str, str] = {}
    for declared in datasets:
        if names.count(declared.name) > 1:
            raise ValueError(f"dataset {declared.name}: declared twice")
        for name in (*declared.tables, *declared.streams, declared.stream("fused")):
            if owners.setdefault(name, declared.name) != declared.name:
                raise ValueError(f"dataset {declared.name}: table or stream {name} is dataset {owners[name]}'s too")


check_apart(DATASETS)


def topics_key(declared: Dataset) -> str:
    """The config key that names ``declared``'s topics, as a refusal names it.

    Example::

        topics_key(dataset("orders"))  # "dataset_orders.topics"
    """
    if not isinstance(declared, Dataset):
        raise TypeError(f"declared must be a Dataset, not {type(declared).__name__}")
    return "kafka.topics" if declared.naming is Naming.SOLE else f"{DATASET_PREFIX}{declared.name}.topics"


def config_of(config: Config, declared: Dataset, environ: Mapping[str, str] | None = None) -> Config:
    """``config`` as the streams of ``declared`` read it: its ``kafka`` the section ``kafka_of`` gives.

    A dataset not among ``DATASETS`` (one a test declares) is checked beside the project's. Resolve a
    config once: the one returned reads the dataset's topics as ``kafka.topics``.

    Example::

        config_of(config, dataset("orders")).kafka.topics  # ("orders",) from [dataset_orders]
    """
    if not isinstance(config, Config):
        raise TypeError(f"config must be a Config, not {type(config).__name__}")
    if not isinstance(declared, Dataset):
        raise TypeError(f"declared must be a Dataset, not {type(declared).__name__}")
    if declared.naming is Naming.SOLE:
        return config
    datasets = DATASETS if declared in DATASETS else (*DATASETS, declared)
    return config.model_copy(update={"kafka": kafka_of(config, declared, environ, datasets)})


def kafka_of(
    config: Config,
    declared: Dataset,
    environ: Mapping[str, str] | None = None,
    datasets: tuple[Dataset, ...] = DATASETS,
) -> KafkaConfig:
    """The Kafka section as ``declared``, one of ``datasets``, reads it (``datasets_kafka``); ConfigError
    when the config does not run it.

    Example::

        kafka_of(config, DATASETS[0]).topics  # kafka.topics
    """
    if not isinstance(declared, Dataset):
        raise TypeError(f"declared must be a Dataset, not {type(declared).__name__}")
    found = datasets_kafka(config, environ, datasets)
    if declared.name not in found:
        section = DATASET_PREFIX + declared.name
        if section not in config.dataset_sections:
            raise ConfigError(f"{section}: missing: dataset {declared.name} runs where this table names its topics")
        raise ConfigError(f"{SWITCH_VAR}: leaves dataset {declared.name} out")
    return found[declared.name]


def running(config: Config, environ: Mapping[str, str] | None = None) -> tuple[Dataset, ...]:
    """The project's datasets ``config`` runs, in declaration order (``datasets_kafka``).

    Example::

        [each.name for each in running(config)]  # ["events", "orders"]
    """
    found = datasets_kafka(config, environ)
    return tuple(each for each in DATASETS if each.name in found)


def datasets_kafka(
    config: Config, environ: Mapping[str, str] | None = None, datasets: tuple[Dataset, ...] = DATASETS
) -> dict[str, KafkaConfig]:
    """The Kafka section as each of ``datasets`` the config runs reads it, by name: ``[kafka]`` itself for
    the dataset of the lakehouse's first names (``Naming.SOLE``), which always runs; another runs where
    the config has its ``[dataset_<name>]`` table, read with the overrides ``environ`` holds (default
    os.environ). ``PIPELINE_DATASETS`` narrows the tables that count: ``none``, or a comma-separated list
    of dataset names. ConfigError names a table of no dataset, a dataset named there without its table,
    or a topic two datasets read: every command checks them before it starts.

    Example::

        sorted(datasets_kafka(config))  # ["events", "orders"]
    """
    check_apart(datasets)
    environ = os.environ if environ is None else environ
    tables = {DATASET_PREFIX + each.name: each for each in datasets if each.naming is not Naming.SOLE}
    for section in config.dataset_sections:
        if section not in tables:
            raise ConfigError(
                f"{section}: unknown section: no dataset of this project reads its topics from it "
                f"(its dataset sections: {', '.join(tables) or 'none'})"
            )
    chosen = _chosen(datasets, environ)
    readers: dict[str, str] = {}
    found = {}
    for each in datasets:
        if each.naming is Naming.SOLE:
            kafka = config.kafka
        elif DATASET_PREFIX + each.name in config.dataset_sections and (chosen is None or each.name in chosen):
            kafka = dataset_kafka(config, each.name, environ)
        elif chosen is not None and each.name in chosen:
            raise ConfigError(f"{DATASET_PREFIX}{each.name}: missing: {SWITCH_VAR} names dataset {each.name}")
        else:
            continue
        for topic in kafka.topics:
            if readers.setdefault(topic, each.name) != each.name:
                shared = f"topic {topic} is dataset {readers[topic]}'s already: a topic feeds one dataset"
                raise ConfigError(f"{topics_key(each)}: {shared}")
        found[each.name] = kafka
    return found


# Narrows the datasets a config runs (``datasets_kafka``), as PIPELINE_EGRESS narrows the egresses.
SWITCH_VAR = "PIPELINE_DATASETS"


def _chosen(datasets: tuple[Dataset, ...], environ: Mapping[str, str]) -> set[str] | None:
    """The dataset names PIPELINE_DATASETS lets run besides the first's; None when it is unset."""
    value = environ.get(SWITCH_VAR, "").strip()
    if not value:
        return None
    if value == "none":
        return set()
    names = {name.strip() for name in value.split(",") if name.strip()}
    unknown = sorted(names - {each.name for each in datasets})
    if unknown:
        known = ", ".join(each.name for each in datasets)
        raise ConfigError(f"{SWITCH_VAR}: {', '.join(unknown)}: no such dataset (the project's: {known}; or none)")
    return names
