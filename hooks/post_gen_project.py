"""Prune optional parts of the freshly baked project and record the answers.

One small function per optional feature; ``main`` reads as a decision table.
Answers arrive as JSON data (``tojson``), never pasted into code.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

# What each optional part adds to the project, relative to its root; ``{package}`` is
# the package_name answer and a trailing '/' marks a directory. The template's tests
# read this table to check that every path in it exists in the template tree.
PARTS = {
    "docker_compose": ("docker-compose.yml",),
    "github_actions": (".github/",),
    "kafka_egress": ("src/{package}/pipeline/egress/kafka.py", "tests/test_egress_kafka.py"),
    "postgres_egress": (
        "src/{package}/pipeline/egress/postgres.py",
        "src/{package}/devtools/postgres_local.py",
        "src/{package}/cli/postgres_local.py",
        "tests/test_egress_postgres.py",
        "tests/test_postgres_local.py",
    ),
    # Shared by both egress streams, so it goes only when neither is chosen; the package's
    # __init__ stays: it finds the egresses a bake kept, none here.
    "egress": ("src/{package}/pipeline/egress/changes.py",),
    # datasets/__init__.py lists it, and conf/*.toml names its topics, only when it is chosen.
    "example_dataset": ("src/{package}/pipeline/datasets/orders.py",),
}
KAFKA_EGRESS_ANSWERS = {"both", "kafka"}
POSTGRES_EGRESS_ANSWERS = {"both", "postgres"}


def remove(project: Path, paths: tuple[str, ...], package: str) -> None:
    """Delete ``paths``; a path that is not there raises: the table and the tree disagree."""
    for relative in paths:
        path = project / relative.format(package=package)
        if relative.endswith("/"):
            shutil.rmtree(path)
        else:
            path.unlink()


def record_answers(project: Path, answers: dict) -> None:
    # Private keys (_template, _output_dir, ...) hold paths of the baking machine.
    public = {key: value for key, value in answers.items() if not key.startswith("_")}
    (project / ".cookiecutter.json").write_text(json.dumps(public, indent=2) + "\n")


def remove_docker_compose(project: Path, package: str) -> None:
    remove(project, PARTS["docker_compose"], package)


def remove_github_actions(project: Path, package: str) -> None:
    remove(project, PARTS["github_actions"], package)


def remove_kafka_egress(project: Path, package: str) -> None:
    remove(project, PARTS["kafka_egress"], package)


def remove_postgres_egress(project: Path, package: str) -> None:
    remove(project, PARTS["postgres_egress"], package)


def remove_egress(project: Path, package: str) -> None:
    remove(project, PARTS["egress"], package)


def remove_example_dataset(project: Path, package: str) -> None:
    remove(project, PARTS["example_dataset"], package)


def main(answers_json: str, project: Path) -> int:
    answers = json.loads(answers_json)
    package = answers["package_name"]
    record_answers(project, answers)
    if answers["include_docker_compose"] != "yes":
        remove_docker_compose(project, package)
    if answers["include_github_actions"] != "yes":
        remove_github_actions(project, package)
    if answers["egress"] not in KAFKA_EGRESS_ANSWERS:
        remove_kafka_egress(project, package)
    if answers["egress"] not in POSTGRES_EGRESS_ANSWERS:
        remove_postgres_egress(project, package)
    if answers["egress"] == "none":
        remove_egress(project, package)
    if answers["example_dataset"] != "orders":
        remove_example_dataset(project, package)
    return 0


if __name__ == "__main__":
    # tojson escapes quotes (including ') so the rendered JSON cannot end this raw string.
    sys.exit(main(r'{{ cookiecutter | tojson }}', Path.cwd()))
