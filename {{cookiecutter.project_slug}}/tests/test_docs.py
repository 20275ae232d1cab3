"""The docs held to the code: what the runbook says a command takes is what its parser takes."""

import argparse
import re
from pathlib import Path

from {{ cookiecutter.package_name }}.cli import build_parser
from {{ cookiecutter.package_name }}.pipeline.egress import installed_names
from {{ cookiecutter.package_name }}.pipeline.recovery import crash_points

DOCS = Path(__file__).resolve().parent.parent / "docs"


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of a Markdown text."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for every command that runs (a leaf of the subcommand tree)."""
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from commands(sub, (*path, name))


def runbook_entries() -> dict[tuple[str, ...], str]:
    """The runbook's command list: {command path: its entry}, the path read off the entry's synopsis."""
    text = section((DOCS / "runbook.md").read_text(), "Commands")
    leaves = dict(commands(build_parser()))
    entries: dict[tuple[str, ...], str] = {}
    for entry in re.split(r"\n- (?=\*\*`)", text)[1:]:
        synopsis = re.match(r"\*\*`(.+?)`\*\*", entry, re.DOTALL).group(1)
        words = synopsis.split()
        path = tuple(words[: max(n for n in range(len(words) + 1) if tuple(words[:n]) in leaves or n == 0)])
        assert path in leaves, f"runbook.md lists `{synopsis}`, which is no command"
        entries[path] = entries.get(path, "") + "\n" + entry
    return entries


def test_the_runbook_lists_every_command_with_every_flag_and_choice_and_no_other():
    entries = runbook_entries()
    for path, parser in commands(build_parser()):
        name = " ".join(path)
        assert path in entries, f"runbook.md: the command `{name}` is not listed"
        synopses = " ".join(re.findall(r"\*\*`(.+?)`\*\*", entries[path], re.DOTALL))
        flags = {flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")}
        flags.discard("--help")
        for flag in flags:
            assert re.search(rf"{flag}(?![\w-])", synopses), f"runbook.md: `{name}` takes {flag}, not listed"
        for flag in set(re.findall(r"--[a-z][a-z-]*", synopses)):
            assert flag in flags, f"runbook.md: `{name}` is listed with {flag}, which it does not take"
        for action in parser._actions:
            for choice in action.choices or ():
                assert f"{choice}" in entries[path], f"runbook.md: `{name}` takes {choice!r}, not listed"


def test_the_runbook_names_the_options_every_command_takes():
    text = section((DOCS / "runbook.md").read_text(), "Commands")
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in text, f"runbook.md: the option {flag} before the command is not listed"


def test_the_runbook_lists_every_crash_point():
    text = (DOCS / "runbook.md").read_text()
    listed = text[text.index("\n### Crash points\n") :]
    listed = listed[: listed.find("\n## ") if "\n## " in listed else len(listed)]
    egresses = installed_names()
    # The egresses' points where the bake has them: staging is the PostgreSQL egress's alone.
    expected = [*crash_points.POINTS, crash_points.BETWEEN_SINK_COMMITS, *crash_points.FUSED_POINTS]
    expected += [crash_points.AFTER_PRE_COMMIT] if egresses else []
    expected += [crash_points.AFTER_STAGING] if "postgres_egress" in egresses else []
    assert set(crash_points.INNER_POINTS) <= {*expected, *crash_points.EGRESS_POINTS}
    for point in expected:
        assert f"`{point}`" in listed, f"runbook.md: the crash point {point} is not listed"
