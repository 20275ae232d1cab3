"""The docs held to the code: what the runbook says a command takes is what its parser takes."""

import argparse
import ast
import json
import re
from enum import Enum
from pathlib import Path

from conftest import documented_layout, lakehouse_streams, layout_block, undocumented_paths
from PIL import Image
from pydantic import SecretStr

from {{ cookiecutter.package_name }}.bench import report
from {{ cookiecutter.package_name }}.cli import build_parser
from {{ cookiecutter.package_name }}.pipeline.audit import findings
from {{ cookiecutter.package_name }}.pipeline.config import Settings
from {{ cookiecutter.package_name }}.pipeline.dataset import Dataset
from {{ cookiecutter.package_name }}.pipeline.datasets import DATASETS
from {{ cookiecutter.package_name }}.pipeline.delta.tables import Lakehouse
from {{ cookiecutter.package_name }}.pipeline.egress import installed, installed_names, installed_streams
from {{ cookiecutter.package_name }}.pipeline.kafka.identity import compacted_records
from {{ cookiecutter.package_name }}.pipeline.kafka.retention import lost_records
from {{ cookiecutter.package_name }}.pipeline.recovery import crash_points
from {{ cookiecutter.package_name }}.pipeline.recovery.lease import lease_path
from {{ cookiecutter.package_name }}.pipeline.recovery.sink_progress import SINK_VERSIONS

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
        # Datasets are the project's own (datasets/): `--dataset NAME` stands for their names, a later
        # dataset's streams are listed as `<dataset>_<layer>`, and an egress stream of a gold beyond the
        # first as `<the gold's stream>_<egress>`.
        later = {name for each in DATASETS[1:] for name in (*each.streams, each.stream("fused"))}
        others = set(installed_streams()) - set(installed_names())
        if others & {choice for action in parser._actions for choice in action.choices or ()}:
            assert "`<the gold's stream>_<egress>`" in entries[path], f"runbook.md: `{name}`: other golds' egresses"
        later |= others
        for action in (action for action in parser._actions if action.dest != "dataset"):
            for choice in set(action.choices or ()) - later:
                assert f"{choice}" in entries[path], f"runbook.md: `{name}` takes {choice!r}, not listed"


def test_the_runbook_names_the_options_every_command_takes():
    text = section((DOCS / "runbook.md").read_text(), "Commands")
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--") and flag != "--help":
                assert f"`{flag}" in text, f"runbook.md: the option {flag} before the command is not listed"


def subsection(text: str, heading: str) -> str:
    """The body of the ``### heading`` section of a Markdown text, up to the next heading."""
    start = text.index(f"\n### {heading}\n")
    end = re.compile(r"\n#{1,3} ").search(text, start + 1)
    return text[start : end.start() if end else len(text)]


def test_the_runbook_explains_every_audit_finding_as_error_or_warning_and_no_other():
    text = subsection((DOCS / "runbook.md").read_text(), "What the audit reports, and what to do")
    egresses = installed_names()
    documented: dict[str, bool] = {}
    # Each entry leads with its keys in bold, "warning" before a warning's.
    for entry in re.split(r"\n- ", text)[1:]:
        leads = re.match(r"(?:\*\*[^*]+\*\*,?\s*)*", entry).group(0)
        for lead in re.findall(r"\*\*([^*]+)\*\*", leads):
            for key in re.findall(r"`([a-z<>_]+)`", lead):
                names = [key.replace("<egress>", egress) for egress in egresses] if "<egress>" in key else [key]
                documented.update(dict.fromkeys(names, lead.startswith("warning ")))
    declared = findings.keys(egresses)
    assert sorted(set(declared) - set(documented)) == [], "runbook.md: audit findings not explained"
    assert sorted(set(documented) - set(declared)) == [], "runbook.md: explains audit findings the audit never reports"
    for key, warning in declared.items():
        assert documented[key] == warning, f"runbook.md: {key} is {'not ' * documented[key]}a warning"


PACKAGE = Path(__file__).resolve().parent.parent / "src" / "{{ cookiecutter.package_name }}"


def keys_named_by_exit_2() -> set[str]:
    """The setting each exit-2 error of the code names first: the leading ``<key>:`` of every
    ``ConfigError`` message (module constants in it resolved), and the flags a command prints before
    it returns ``ExitCode.BAD_INPUT``. Messages whose key is only known at run time are left out."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for target in node.targets
            if isinstance(target, ast.Name) and isinstance(node.value.value, str)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ConfigError" and node.args:
                message = node.args[0]
                text = ""
                for part in message.values if isinstance(message, ast.JoinedStr) else [message]:
                    if isinstance(part, ast.Constant):
                        text += str(part.value)
                    elif isinstance(getattr(part, "value", None), ast.Name) and part.value.id in constants:
                        text += constants[part.value.id]
                    else:
                        text += "{}"
                    if ":" in text:
                        break
                key = text.partition(":")[0]
                if "{}" not in key:
                    found.add(key)
            if isinstance(node, ast.If) and ast.unparse(node.body[-1]) == "return ExitCode.BAD_INPUT":
                printed = " ".join(ast.unparse(statement) for statement in node.body[:-1])
                found.update(re.findall(r"--[a-z][a-z-]*", printed))
    return found


def test_the_runbook_explains_every_setting_an_exit_2_names_and_no_other():
    text = section((DOCS / "runbook.md").read_text(), "When a command exits 2")
    documented = set(re.findall(r"\*\*`([^`]+)`\*\*", text))
    named = keys_named_by_exit_2()
    assert {"kafka.bootstrap_servers", "s3.endpoint", "--since"} <= named  # the scan reads the code
    assert sorted(named - documented) == [], "runbook.md: exit-2 errors of these settings not explained"
    flags = {
        flag for _, parser in commands(build_parser()) for action in parser._actions for flag in action.option_strings
    }
    tables = config_tables()
    settings = {f"{table}.{key}" for table, model in tables.items() for key in model.model_fields}
    variables = {
        variable for model in tables.values() for key in model.model_fields for variable in model.variables(key)
    }
    for key in documented - named:
        known = key in flags | settings | variables | {"AWS_ACCESS_KEY_ID"} or "<" in key
        assert known, f"runbook.md: exit 2 explains {key}, which is no setting, variable or flag"


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


def config_tables() -> dict[str, type]:
    """{table name: its settings model} for every table a config file can hold in this bake."""
    tables = {name: field.annotation for name, field in Settings.model_fields.items()}
    return tables | {module.SECTION: module.Settings for module in installed().values()}


def toml_value(value) -> str:
    """A default as the docs write it: TOML."""
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, Path)):
        return json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return str(value)


def key_entries(text: str, table: str) -> dict[str, str]:
    """{key: its entry} of the ``[table]`` section of configuration.md."""
    start = re.search(rf"\n#+ `\[{table}\]`\n", text)
    assert start, f"configuration.md: no section for the table [{table}]"
    end = re.search(r"\n#+ ", text[start.end() :])
    body = text[start.end() : start.end() + end.start() if end else len(text)]
    entries = {}
    for entry in re.split(r"\n- (?=\*\*`)", "\n" + body)[1:]:
        for key in re.match(r"((?:\*\*`\w+`\*\*,? ?)+)", entry).group(1).replace("*", "").replace("`", "").split(","):
            entries[key.strip()] = entry
    return entries


def test_configuration_md_documents_every_key_with_its_default_and_variable_and_no_other():
    text = (DOCS / "configuration.md").read_text()
    for table, model in config_tables().items():
        entries = key_entries(text, table)
        for key, field in model.model_fields.items():
            if field.annotation == SecretStr | None:
                continue  # a secret is never a key of the file: its variable, beside its *_file key
            assert key in entries, f"configuration.md: [{table}] {key} is not documented"
            entry = entries[key]
            if field.is_required():
                assert "(required" in entry, f"configuration.md: [{table}] {key} is required: say so"
            elif field.get_default() is not None:
                default = toml_value(field.get_default(call_default_factory=True))
                assert f"(default `{default}`" in entry, f"configuration.md: [{table}] {key} defaults to {default}"
            for variable in model.variables(key):
                assert f"`{variable}`" in entry, f"configuration.md: [{table}] {key}: its variable {variable} not named"
        for key in entries:
            assert key in model.model_fields, f"configuration.md: [{table}] has no key {key}"


PROJECT = DOCS.parent
SCREEN = 120


def test_no_readme_or_doc_line_is_wider_than_a_screen():
    markdown = [PROJECT / "README.md", *DOCS.glob("*.md"), *PACKAGE.rglob("README.md")]
    wide = [
        f"{path.relative_to(PROJECT)}:{number} ({len(line)} characters)"
        for path in markdown
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if len(line) > SCREEN
    ]
    assert wide == [], f"lines wider than {SCREEN} characters"
{%- if cookiecutter.include_github_actions == "yes" %}


def test_the_ci_workflow_allows_twice_the_time_the_readme_gives_make_test_all():
    readme = (PROJECT / "README.md").read_text()
    minutes = int(re.search(r"\*\*`make test-all`\*\* \(about (\d+) minutes", readme).group(1))
    workflow = (PROJECT / ".github" / "workflows" / "ci.yml").read_text()
    assert re.search(r"timeout-minutes: (\d+)", workflow).group(1) == str(2 * minutes)
{%- endif %}


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_reaches_a_file_and_a_heading_it_has():
    markdown = [PROJECT / "README.md", *DOCS.glob("*.md"), *PACKAGE.rglob("README.md")]
    broken = []
    for path in markdown:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file, _, fragment = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            if not linked.exists():
                broken.append(f"{path.relative_to(PROJECT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), re.MULTILINE)
                if fragment not in {anchor(heading) for heading in headings}:
                    broken.append(f"{path.relative_to(PROJECT)}: {target} (no such heading)")
    assert broken == []


FIGURES_BEGIN = "<!-- the figures of docs/bench.json (bench.md of its run): begin -->"
FIGURES_END = "<!-- the figures of docs/bench.json: end -->"


def test_benchmarks_md_and_its_plot_show_the_one_committed_run_against_todays_targets():
    run = json.loads((DOCS / "bench.json").read_text())
    # The run is the default bake's: this project shows the rows of its own egresses.
    known = set(report.METRIC_KEYS) | set(report.PEER_METRIC_KEYS)
    shown = {**run, "metrics": [metric for metric in run["metrics"] if metric["key"] in known]}
    text = (DOCS / "benchmarks.md").read_text()
    assert text.count(FIGURES_BEGIN) == 1 and text.count(FIGURES_END) == 1
    section = text.split(FIGURES_BEGIN)[1].split(FIGURES_END)[0]
    assert section.strip() == report.figures_markdown(shown).strip(), (
        "docs/benchmarks.md: put bench-results/bench.md of the run in docs/bench.json between the markers"
    )
    plot = Image.open(DOCS / "bench.png")
    assert plot.text[report.PLOT_SOURCE_KEY] == f"bench.json sha256 {report.results_digest(run)}", (
        "docs/bench.png draws another run: copy bench-results/bench.png of the run in docs/bench.json"
    )

    def target_today(key: str) -> str | None:
        return str(report.TARGETS[key]) if key in report.TARGETS else None

    stale = {
        metric["key"]: (metric["target"], target_today(metric["key"]))
        for metric in run["metrics"]
        if metric["target"] != target_today(metric["key"])
    }
    assert stale == {}, "targets changed since the run in docs/bench.json (run's, today's): run `make bench` again"


def test_the_layout_check_finds_a_path_the_layout_does_not_name(tmp_path, undocumented_in_lakehouse):
    documented = [
        "tables/bronze_events/_delta_log",
        "checkpoints/silver/sink_versions/12",
        "checkpoints/gold.leases/3",
        "sources/lost/events",
        "rebuild/gold_event_windows",
    ]
    for path in [*documented, "stray", "checkpoints/silver_old", "tables/gold_copy"]:
        (tmp_path / path).mkdir(parents=True)
    assert sorted(undocumented_in_lakehouse(str(tmp_path))) == ["checkpoints/silver_old", "stray", "tables/gold_copy"]


def paths_the_code_makes() -> list[str]:
    """Every path under a lakehouse root that the pipeline's own path builders name, relative to the root.

    A placeholder file stands for what a directory holds (a lost gap, a compacted topic, a batch)."""
    root = "/root"
    lakehouse = Lakehouse(root)
    streams = lakehouse_streams()
    tables = [table for each in DATASETS for table in each.tables]
    # And a dataset beside the first, whichever the bake declares: where it keeps its sources.
    beside = Dataset("returns", DATASETS[0].contract, DATASETS[0].golds)
    paths = [
        *(lakehouse.table(table) for table in tables),
        *(lakehouse.aside(table) for table in tables),
        *(f"{lakehouse.checkpoint(stream)}/{SINK_VERSIONS}/0" for stream in streams),
        *(lease_path(lakehouse, stream, 1) for stream in streams),
        *(f"{lost_records(lakehouse, each)}/a-gap.json" for each in (*DATASETS, beside)),
        *(f"{compacted_records(lakehouse, each)}/a-topic" for each in (*DATASETS, beside)),
    ]
    return [path.removeprefix(f"{root}/") for path in paths]


def test_the_layout_names_every_path_the_code_makes_and_no_other():
    made = paths_the_code_makes()
    assert undocumented_paths(made) == [], "docs/configuration.md's layout misses these paths"

    def made_under(patterns: list[str]) -> bool:
        def under(parts: list[str]) -> bool:
            matched = zip(patterns, parts, strict=False)
            return len(parts) >= len(patterns) and all(re.fullmatch(pattern, part) for pattern, part in matched)

        return any(under(path.split("/")) for path in made)

    invented = ["/".join(patterns) for patterns in documented_layout() if not made_under(patterns)]
    assert invented == [], "docs/configuration.md's layout names paths no code makes"
    # The first dataset's streams by name; the others' as `<dataset>_<layer>`.
    listed = re.search(r"each stream's checkpoint: ([a-z_, ]+)", layout_block()).group(1).rstrip(", ").split(", ")
    first = DATASETS[0]
    assert sorted(listed) == sorted([*first.streams, first.stream("fused"), *installed_names()])
