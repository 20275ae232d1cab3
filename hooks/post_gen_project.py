"""Prune optional parts of the freshly baked project and record the answers.

One small function per optional feature; ``main`` reads as a decision table.
Answers arrive as JSON data (``tojson``), never pasted into code.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path


def record_answers(project: Path, answers: dict) -> None:
    # Private keys (_template, _output_dir, ...) hold paths of the baking machine.
    public = {key: value for key, value in answers.items() if not key.startswith("_")}
    (project / ".cookiecutter.json").write_text(json.dumps(public, indent=2) + "\n")


def remove_docker_compose(project: Path) -> None:
    (project / "docker-compose.yml").unlink()


def remove_github_actions(project: Path) -> None:
    shutil.rmtree(project / ".github")


def main(answers_json: str, project: Path) -> int:
    answers = json.loads(answers_json)
    record_answers(project, answers)
    if answers["include_docker_compose"] != "yes":
        remove_docker_compose(project)
    if answers["include_github_actions"] != "yes":
        remove_github_actions(project)
    return 0


if __name__ == "__main__":
    # tojson escapes quotes (including ') so the rendered JSON cannot end this raw string.
    sys.exit(main(r'{{ cookiecutter | tojson }}', Path.cwd()))
