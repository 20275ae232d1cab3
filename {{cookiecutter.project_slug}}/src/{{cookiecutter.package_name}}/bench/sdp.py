"""Whether the peer can run here: the `spark-pipelines` command of this environment and its extra.

Apart from ``peer.py`` so that ``report.py`` can list the peer's figures only when the peer runs,
without importing the peer (which imports the harness, which imports the report). Stdlib only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# The project's extra that brings them: `make bench` installs it (pyproject.toml, the Makefile).
EXTRA = "peer"
# What `pyspark[connect,pipelines]` adds to pyspark: the CLI is a Spark Connect client.
MODULES = ("grpc", "grpc_status", "google.rpc", "yaml", "pandas", "pyarrow", "zstandard")


def command(python: str | Path | None = None) -> Path:
    """The `spark-pipelines` script beside ``python`` (this interpreter by default): pyspark installs it there.

    Example::

        command()  # .venv/bin/spark-pipelines
    """
    if python is not None and not isinstance(python, (str, Path)):
        raise TypeError(f"python must be a path to an interpreter, not {type(python).__name__}")
    # Not resolved: a virtual environment's python is often a link to the system's.
    return Path(python or sys.executable).parent / "spark-pipelines"


def missing() -> list[str]:
    """What the peer lacks here: the command, or modules of the extra; empty when it can run.

    Example::

        missing()  # [] after `pip install -e '.[peer]'`, else e.g. ["grpc", "grpc_status", ...]
    """
    absent = [] if command().is_file() else [str(command())]
    for name in MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package (google) is missing
            found = False
        if not found:
            absent.append(name)
    return absent


def installed() -> bool:
    """True when the peer can run in this environment (see ``missing``)."""
    return not missing()
