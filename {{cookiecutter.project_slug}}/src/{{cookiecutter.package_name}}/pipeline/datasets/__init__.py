"""The project's datasets, one module each: where a dataset is declared (see ``dataset.py``).

To add one, write its module beside ``events.py`` and list its ``DATASET`` in ``DATASETS``
(docs/datasets.md walks it through).
"""

from ..dataset import Dataset
from . import events

DATASETS: tuple[Dataset, ...] = (events.DATASET,)


def dataset(name: str) -> Dataset:
    """The dataset called ``name``; ValueError naming the datasets there are.

    Example::

        dataset("events").silver  # "silver_events"
    """
    for declared in DATASETS:
        if declared.name == name:
            return declared
    raise ValueError(f"dataset must be one of {', '.join(d.name for d in DATASETS)}, not {name!r}")


def check_apart(datasets: tuple[Dataset, ...]) -> None:
    """ValueError when two of ``datasets`` share a name, a table or a stream.

    Example::

        check_apart((*DATASETS, orders.DATASET))
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
