"""Bake every supported combination of answers and check what comes out."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import tomllib
import urllib.request
from pathlib import Path

import pytest
from conftest import TEMPLATE, load_hook
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter
from project_imports import unresolved_imports
from prometheus_client.parser import text_string_to_metric_families

TEMPLATE_ROOT = TEMPLATE / "{{cookiecutter.project_slug}}"
ANSWERS = json.loads((TEMPLATE / "cookiecutter.json").read_text())
CHOICES = {name: options for name, options in ANSWERS.items() if isinstance(options, list)}
PACKAGE_DIR = "src/{{cookiecutter.package_name}}"
# What post_gen_project.py removes for an answer, as paths of the template tree; a
# trailing '/' prunes a whole directory. Written out here rather than read from the
# hook, so that a test can compare the two.
KAFKA_EGRESS = (f"{PACKAGE_DIR}/pipeline/egress/kafka.py", "tests/test_egress_kafka.py")
POSTGRES_EGRESS = (
    f"{PACKAGE_DIR}/pipeline/egress/postgres.py",
    f"{PACKAGE_DIR}/devtools/postgres_local.py",
    f"{PACKAGE_DIR}/cli/postgres_local.py",
    "tests/test_egress_postgres.py",
    "tests/test_postgres_local.py",
)
PRUNED = {
    ("include_docker_compose", "no"): ("docker-compose.yml",),
    ("include_github_actions", "no"): (".github/",),
    ("egress", "kafka"): POSTGRES_EGRESS,
    ("egress", "postgres"): KAFKA_EGRESS,
    ("egress", "none"): (*KAFKA_EGRESS, *POSTGRES_EGRESS, f"{PACKAGE_DIR}/pipeline/egress/changes.py"),
    ("example_dataset", "none"): (f"{PACKAGE_DIR}/pipeline/datasets/orders.py",),
}
# A leftover of ours, not GitHub Actions' own ${{ ... }} expressions.
LEFTOVER = re.compile(r"\{\{\s*cookiecutter|\{%|%\}|\{#")
PRE_GEN = load_hook("pre_gen_project")
RENDERED_DEFAULTS = {
    "project_name": "Clickstream Lakehouse",
    "project_slug": "clickstream-lakehouse",
    "package_name": "clickstream_lakehouse",
    "kafka_topics": ANSWERS["kafka_topics"],
    "gold_window_duration": ANSWERS["gold_window_duration"],
    **{name: options[0] for name, options in CHOICES.items()},
}


def _valid(answers: dict) -> bool:
    return not PRE_GEN.validate({**RENDERED_DEFAULTS, **answers})


def choice_combinations() -> list[dict]:
    """Every option of every choice in cookiecutter.json at least once.

    An option that is only valid together with another (a SASL mechanism needs
    SASL_SSL) is paired with the first option of another choice that makes it valid.
    """
    combinations = [{}]
    for name, options in CHOICES.items():
        for option in options[1:]:
            answers = {name: option}
            if not _valid(answers):
                partners = [
                    {**answers, other: choice}
                    for other, choices in CHOICES.items()
                    if other != name
                    for choice in choices
                ]
                answers = next(partner for partner in partners if _valid(partner))
            if answers not in combinations:
                combinations.append(answers)
    return combinations


def combination_id(answers: dict) -> str:
    return "-".join(f"{key}={value}" for key, value in answers.items()) or "defaults"


SUPPORTED = [
    *(pytest.param(answers, id=combination_id(answers)) for answers in choice_combinations()),
    pytest.param(
        {
            "project_name": "Payments Stream",
            "kafka_topics": "payments.v1, refunds.v1",
            "gold_window_duration": "30 seconds",
        },
        id="custom-name-two-topics-30s-window",
    ),
]


def template_files() -> set[str]:
    """Every file of the project template, relative to its root, names unrendered."""
    return {
        path.relative_to(TEMPLATE_ROOT).as_posix()
        for path in TEMPLATE_ROOT.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def is_pruned(name: str, pruned: tuple[str, ...]) -> bool:
    return any(name == path or (path.endswith("/") and name.startswith(path)) for path in pruned)


def kept_files(files: set[str], answers: dict) -> set[str]:
    """``files`` (template names) less what the post-gen hook prunes for ``answers``."""
    for (answer, value), pruned in PRUNED.items():
        if answers.get(answer, CHOICES[answer][0]) == value:
            files = {name for name in files if not is_pruned(name, pruned)}
    return files


def render(files: set[str], package: str) -> set[str]:
    return {name.replace("{{cookiecutter.package_name}}", package) for name in files}


def expected_files(package: str, answers: dict) -> set[str]:
    """The template's files as a bake with ``answers`` must write them."""
    return render(kept_files(template_files(), answers), package) | {".cookiecutter.json"}


def bake(cookies, answers: dict) -> Path:
    result = cookies.bake(extra_context=answers)
    assert result.exception is None, result.exception
    assert result.exit_code == 0
    return Path(result.project_path)


@pytest.mark.parametrize("answers", SUPPORTED)
def test_supported_combination_bakes_a_clean_project(cookies, answers):
    project = bake(cookies, answers)
    recorded = json.loads((project / ".cookiecutter.json").read_text())
    package = recorded["package_name"]

    files = {path.relative_to(project).as_posix() for path in project.rglob("*") if path.is_file()}
    assert files == expected_files(package, answers)
    for name in files:
        if name.endswith(".png"):  # copied as it is, never rendered
            assert (project / name).read_bytes() == (TEMPLATE_ROOT / name).read_bytes()
            continue
        text = (project / name).read_text()
        assert not LEFTOVER.search(text), f"unrendered template syntax in {name}"

    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == recorded["project_slug"]
    assert pyproject["project"]["scripts"] == {recorded["project_slug"]: f"{package}.cli:main"}
    for key, value in answers.items():
        assert recorded[key] == value

    topics = [topic.strip() for topic in recorded["kafka_topics"].split(",")]
    for env in ("local", "prod"):
        conf = tomllib.loads((project / "src" / package / "conf" / f"{env}.toml").read_text())
        assert conf["kafka"]["topics"] == topics
        assert conf["pipeline"]["gold_window"] == recorded["gold_window_duration"]
    prod = tomllib.loads((project / "src" / package / "conf" / "prod.toml").read_text())["kafka"]
    assert prod["security_protocol"] == recorded["kafka_security_protocol"]
    assert prod.get("sasl_mechanism", "none") == recorded["kafka_sasl_mechanism"]

    lint = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."],
        check=False,
        cwd=project,
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # A kept module that imports a pruned one still bakes and lints clean; it fails when run.
    dangling = unresolved_imports(project, package)
    assert not dangling, "imports of what this bake does not have:\n" + "\n".join(dangling)


def test_every_option_of_every_choice_is_baked():
    baked = {(name, param.values[0].get(name, options[0])) for param in SUPPORTED for name, options in CHOICES.items()}
    assert {(name, option) for name, options in CHOICES.items() for option in options} <= baked


def hook_prunable_paths(post_gen) -> set[str]:
    """Every path post_gen_project.py may remove, as a path of the template tree."""
    return {
        path.format(package="{{cookiecutter.package_name}}") for paths in post_gen.PARTS.values() for path in paths
    }


@pytest.mark.parametrize("answers", choice_combinations(), ids=combination_id)
def test_the_hook_prunes_exactly_what_the_expected_file_set_leaves_out(post_gen, tmp_path, answers):
    """Run the hook on a stand-in of the tree, with a file for every path either table names.

    Empty files suffice: the hook only removes them. The paths not yet in the template
    are added, so the two tables are compared even before those files land.
    """
    tree = template_files() | {path for paths in PRUNED.values() for path in paths} | hook_prunable_paths(post_gen)
    tree = {f"{name}__init__.py" if name.endswith("/") else name for name in tree}
    package = RENDERED_DEFAULTS["package_name"]
    for name in render(tree, package):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()

    assert post_gen.main(json.dumps({**RENDERED_DEFAULTS, **answers}), tmp_path) == 0

    left = {path.relative_to(tmp_path).as_posix() for path in tmp_path.rglob("*") if path.is_file()}
    assert left == render(kept_files(tree, answers), package) | {".cookiecutter.json"}


def test_every_path_the_hook_or_this_test_prunes_is_in_the_template(post_gen):
    tree = template_files()
    named = hook_prunable_paths(post_gen) | {path for paths in PRUNED.values() for path in paths}

    missing = sorted(path for path in named if not any(is_pruned(name, (path,)) for name in tree))

    assert not missing, "pruned by answer but not in the template:\n" + "\n".join(missing)


UNSUPPORTED = [
    pytest.param({"project_slug": "Not A Slug"}, "project_slug", id="slug-with-spaces"),
    pytest.param({"package_name": "import"}, "package_name", id="package-is-keyword"),
    pytest.param({"package_name": "delta"}, "package_name", id="package-shadows-dependency"),
    pytest.param({"kafka_topics": "orders;drop"}, "kafka_topics", id="topic-illegal-characters"),
    pytest.param({"kafka_topics": "x" * 250}, "kafka_topics", id="topic-too-long"),
    pytest.param({"kafka_topics": "a.b, a_b"}, "kafka_topics", id="topics-collide"),
    pytest.param({"gold_window_duration": "soon"}, "gold_window_duration", id="window-unparseable"),
    pytest.param({"gold_window_duration": "0 minutes"}, "gold_window_duration", id="window-zero"),
    pytest.param({"kafka_security_protocol": "SASL_SSL"}, "kafka_sasl_mechanism", id="sasl-without-mechanism"),
    pytest.param({"kafka_sasl_mechanism": "PLAIN"}, "kafka_sasl_mechanism", id="mechanism-without-sasl"),
]


@pytest.mark.parametrize(("answers", "named"), UNSUPPORTED)
def test_unsupported_answers_fail_the_bake_naming_the_answer(cookies, capfd, answers, named):
    result = cookies.bake(extra_context=answers)

    assert isinstance(result.exception, FailedHookException)
    assert result.exit_code != 0
    assert f"ERROR: {named}" in capfd.readouterr().err


def test_an_answer_outside_its_choices_is_refused_by_the_hook_when_replayed(tmp_path, capfd):
    # cookiecutter itself refuses such an extra_context, but reads a replay file (edited
    # by hand, or saved by another version of this template) as it is: only the hook stands.
    answers = {name: value for name, value in ANSWERS.items() if isinstance(value, str)}
    replay = tmp_path / "answers.json"
    replay.write_text(json.dumps({"cookiecutter": {**answers, **RENDERED_DEFAULTS, "egress": "kafka,postgres"}}))
    config = tmp_path / "config.yaml"
    config.write_text(f"cookiecutters_dir: {tmp_path / 'templates'}\nreplay_dir: {tmp_path / 'replay'}\n")

    with pytest.raises(FailedHookException):
        cookiecutter(str(TEMPLATE), replay=str(replay), output_dir=str(tmp_path / "out"), config_file=str(config))

    assert "ERROR: egress: 'kafka,postgres' is not one of both, kafka, postgres, none" in capfd.readouterr().err
    assert not (tmp_path / "out" / RENDERED_DEFAULTS["project_slug"]).exists()


def test_answers_with_code_in_them_stay_data(cookies, tmp_path):
    marker = tmp_path / "PWNED"
    payload = f'x"; import os; os.mknod("{marker}"); "\'\'\' """ \\ '
    project = bake(cookies, {"description": payload, "author_name": payload})

    assert not marker.exists()
    recorded = json.loads((project / ".cookiecutter.json").read_text())
    assert recorded["description"] == payload
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["description"] == payload
    assert pyproject["project"]["authors"] == [{"name": payload}]


def test_code_in_a_validated_answer_cannot_run_in_the_hook(cookies, capfd, tmp_path):
    marker = tmp_path / "PWNED"
    result = cookies.bake(extra_context={"kafka_topics": f"'); import os; os.mknod('{marker}'); ('"})

    assert isinstance(result.exception, FailedHookException)
    assert "ERROR: kafka_topics" in capfd.readouterr().err
    assert not marker.exists()


def run_logged(
    command: list[str], cwd: Path, env: dict, log: Path, timeout_s: float, while_running=None
) -> tuple[int | None, str]:
    """Run ``command`` with its output in ``log``; (exit code, output), exit code None when it timed out.

    It runs in a session of its own: on a time-out the whole tree (make, pytest, their JVMs) is killed,
    and what it printed until then is still there to read. ``while_running``, if given, is called
    every second until the command ends (in a thread of its own).
    """
    ended = threading.Event()

    def poll() -> None:
        while not ended.wait(1):
            while_running()

    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        poller = threading.Thread(target=poll, daemon=True)
        if while_running is not None:
            poller.start()
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
        finally:
            ended.set()
            if while_running is not None:
                poller.join()
    return code, log.read_text(errors="replace")


class Scrapes:
    """What a Prometheus server would have scraped from ``url``: the newest answer, kept after the server is gone."""

    def __init__(self, url: str):
        self.url, self.last = url, ""

    def __call__(self) -> None:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as response:
                self.last = response.read().decode()
        except OSError:  # not serving yet, or no longer
            pass

    def value(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` whose labels include ``labels``, in the newest answer (parsed by prometheus-client)."""
        for family in text_string_to_metric_families(self.last):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(key) == text for key, text in labels.items()):
                    return sample.value
        return None


@pytest.mark.slow
def test_a_bake_on_s3_passes_its_whole_suite_and_runs_its_demo(tmp_path, pre_gen):
    """The slow tier: a default bake but for ``storage=s3`` installs itself and runs `make test-all`,
    its storage tests (crash points, kills, lost and restored checkpoints) on the local S3 server and
    the rest on a local disk, then `make demo` on the S3 server."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cookiecutter",
            "--no-input",
            "--output-dir",
            str(tmp_path),
            str(TEMPLATE),
            "storage=s3",
        ],
        check=True,
    )
    project = tmp_path / "clickstream-lakehouse"
    # As from a fresh shell: not this venv, nor the PYTEST_* variables pytest and pytest-xdist set here.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH"} and not key.startswith("PYTEST_")
    }

    code, tests = run_logged(["make", "test-all"], project, env, tmp_path / "test-all.log", timeout_s=4200)
    # Every module the installed project can import but its own: a package named after one is refused.
    listing = "import importlib.metadata as m; print(*m.packages_distributions())"
    importable = subprocess.run(
        [str(project / ".venv" / "bin" / "python"), "-c", listing], capture_output=True, text=True, check=True
    ).stdout.split()
    candidates = [name for name in importable if name != "clickstream_lakehouse"]
    not_refused = [name for name in candidates if pre_gen.PACKAGE_PATTERN.fullmatch(name) and not pre_gen.check_package(name)]
    assert not not_refused, f"hooks/pre_gen_project.py: DEPENDENCY_MODULES lacks {not_refused}"
    # pytest's closing line; make may print more after it.
    summary = re.findall(r"^=+ (.+) in [\d.]+s", tests, re.MULTILINE)
    assert code == 0, f"make test-all {'timed out' if code is None else f'exited {code}'}:\n{tests[-30000:]}"
    assert summary and re.search(r"\d+ passed", summary[-1]), "the generated suite ran no tests"
    assert " failed" not in summary[-1] and " skipped" not in summary[-1], summary[-1]

    # Scraped while the demo runs, as Prometheus would: each stream's batch duration and lag.
    scrapes = Scrapes("http://127.0.0.1:9108/metrics")
    code, demo = run_logged(["make", "demo"], project, env, tmp_path / "demo.log", timeout_s=900, while_running=scrapes)
    assert code == 0, f"make demo {'timed out' if code is None else f'exited {code}'}:\n{demo[-20000:]}"
    # The default bake's two datasets: the events, and the example orders with its two golds.
    orders = ("orders_bronze", "orders_silver", "orders_gold_by_shop", "orders_gold_hourly")
    for stream in ("bronze", "silver", "gold", *orders, "kafka_egress", "postgres_egress"):
        batches = scrapes.value("lakehouse_batch_duration_seconds_count", stream=stream) or 0
        assert batches >= 1, (stream, scrapes.last[-5000:])
    assert scrapes.value("lakehouse_kafka_lag_records", partition="0") == 0, scrapes.last  # bronze read all
    assert scrapes.value("lakehouse_delta_version_lag", stream="silver", table="bronze_events") is not None
    assert scrapes.value("lakehouse_delta_version_lag", stream="gold", table="silver_events") is not None
    assert "gold_event_windows:" in demo
    # The default bake has both egresses: each sink is printed and compared with gold by the audit.
    gold_rows = int(re.search(r"^gold_event_windows: (\d+) rows", demo, re.MULTILINE).group(1))
    for stream in ("kafka_egress", "postgres_egress"):
        assert re.search(rf"^{stream} \(.*\): {gold_rows} rows", demo, re.MULTILINE), stream
        assert re.search(rf"^    {stream}_rows_not_matching_gold +0$", demo, re.MULTILINE), stream
    for table in ("gold_orders_by_shop", "gold_orders_hourly"):
        assert re.search(rf"^{table}: [1-9]\d* rows", demo, re.MULTILINE), table
    # The orders the sample sent again, and the malformed ones, went to quarantine; the audit judged them again.
    orders_report = demo[demo.index("\ndataset orders\n") :]
    assert int(re.search(r"^    quarantine_rows +(\d+)$", orders_report, re.MULTILINE).group(1)) > 0
    # The orders' expectations, one of each action: the quarantining one names its records' reason, in the
    # audit and on the metrics endpoint; the warning one's records stay in silver, counted there.
    assert re.search(r"^    expectation total_positive not met +[1-9]\d*$", orders_report, re.MULTILINE), orders_report
    # The orders are Avro, read through the demo's own registry: their bad records are bad in the wire format's
    # ways, and the registry client's requests stay out of the output.
    unknown_id = r"^    writer schema is not in the registry, id <id> +[1-9]\d*$"
    assert re.search(unknown_id, orders_report, re.MULTILINE), orders_report
    assert "httpx2" not in demo
    unmet = {"stream": "orders_silver", "reason": "expectation total_positive not met"}
    assert (scrapes.value("lakehouse_quarantined_records_total", **unmet) or 0) > 0, scrapes.last
    warned = {"stream": "orders_silver", "expectation": "large_total"}
    assert (scrapes.value("lakehouse_expectation_failures_total", **warned) or 0) > 0, scrapes.last
    failing = {"stream": "orders_silver", "expectation": "ordered_at_not_ahead"}
    assert scrapes.value("lakehouse_expectation_failures_total", **failing) == 0, scrapes.last
    assert re.search(r"^  events: clean$", demo, re.MULTILINE) and re.search(r"^  orders: clean$", demo, re.MULTILINE)
    assert "audit verdict: clean" in demo
    assert "metrics: http://127.0.0.1:9108/metrics" in demo
    # On the S3 server the demo started (`s3-local start` prints where its credentials are).
    assert re.search(r"^credentials file: .*/\.demo/s3/credentials$", demo, re.MULTILINE), demo[-5000:]


def prerequisites(readme: str) -> str:
    """A README's one sentence of prerequisites, joined onto one line."""
    found = re.search(r"Prerequisites: (.+?\.)(?:\s|$)", " ".join(readme.split()))
    assert found, "no 'Prerequisites: ...' sentence"
    return found.group(1)


def test_the_generated_readme_states_the_templates_prerequisites_and_pyproject_agrees(cookies):
    project = bake(cookies, {})
    stated = prerequisites((TEMPLATE / "README.md").read_text())

    assert prerequisites((project / "README.md").read_text()) == stated
    low, high = re.search(r"python3` (3\.\d+) to (3\.\d+)", stated).groups()
    requires = tomllib.loads((project / "pyproject.toml").read_text())["project"]["requires-python"]
    newest = int(high.split(".")[1])
    assert requires == f">={low},<3.{newest + 1}"
