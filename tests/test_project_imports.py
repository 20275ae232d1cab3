"""The static import check flags what a pruned module leaves dangling, and only that."""

import textwrap

import pytest
from project_imports import unresolved_imports

PKG = "lake"
BASE = {
    f"src/{PKG}/__init__.py": "",
    f"src/{PKG}/cli.py": "from .pipeline import egress, streams\nfrom .pipeline.streams import run\n",
    f"src/{PKG}/pipeline/__init__.py": "",
    f"src/{PKG}/pipeline/streams.py": "import json\nfrom pyspark.sql import DataFrame\n\ndef run():\n    pass\n",
    f"src/{PKG}/pipeline/egress/__init__.py": "from .kafka import KafkaEgress\n\nSTREAMS = ('kafka',)\n",
    f"src/{PKG}/pipeline/egress/kafka.py": "from ..streams import run\n\nclass KafkaEgress:\n    pass\n",
    f"src/{PKG}/conf/local.toml": "",
    "tests/conftest.py": "import pytest\n",
    "tests/test_egress.py": f"import {PKG}.pipeline.egress\nfrom {PKG}.pipeline.egress import STREAMS, kafka\n",
}


def bake_tree(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_a_tree_whose_imports_all_resolve_passes(tmp_path):
    assert unresolved_imports(bake_tree(tmp_path, BASE), PKG) == []


@pytest.mark.parametrize(
    ("change", "flagged"),
    [
        (
            {f"src/{PKG}/pipeline/egress/kafka.py": None},
            [
                f"src/{PKG}/pipeline/egress/__init__.py:1: from .kafka: no module {PKG}.pipeline.egress.kafka",
                f"tests/test_egress.py:2: from {PKG}.pipeline.egress import kafka: {PKG}.pipeline.egress has no kafka",
            ],
        ),
        (
            {f"src/{PKG}/pipeline/egress/__init__.py": None, f"src/{PKG}/pipeline/egress/kafka.py": None},
            [
                f"src/{PKG}/cli.py:1: from .pipeline import egress: {PKG}.pipeline has no egress",
                f"tests/test_egress.py:1: import {PKG}.pipeline.egress",
                f"tests/test_egress.py:2: from {PKG}.pipeline.egress: no module {PKG}.pipeline.egress",
            ],
        ),
        (
            {f"src/{PKG}/pipeline/streams.py": "def start():\n    pass\n"},
            [
                f"src/{PKG}/cli.py:2: from .pipeline.streams import run: {PKG}.pipeline.streams has no run",
                f"src/{PKG}/pipeline/egress/kafka.py:1: from ..streams import run: {PKG}.pipeline.streams has no run",
            ],
        ),
        (
            {"tests/test_sinks.py": "def test():\n    from .conftest import x\n"},
            ["tests/test_sinks.py:2: from .conftest: climbs out of its package"],
        ),
        (
            {f"src/{PKG}/bench.py": "from ...elsewhere import thing\n"},
            [f"src/{PKG}/bench.py:1: from ...elsewhere: climbs out of its package"],
        ),
    ],
    ids=["pruned-module", "pruned-package", "removed-name", "relative-import-in-tests", "beyond-top-package"],
)
def test_an_import_of_something_missing_is_flagged_where_it_is(tmp_path, change, flagged):
    # None in ``change`` deletes the file: what the post-gen hook does to a pruned one.
    files = {name: text for name, text in {**BASE, **change}.items() if text is not None}

    assert unresolved_imports(bake_tree(tmp_path, files), PKG) == flagged


def test_names_a_module_may_provide_dynamically_are_not_guessed_at(tmp_path):
    files = {
        **BASE,
        f"src/{PKG}/pipeline/egress/__init__.py": "def __getattr__(name):\n    raise AttributeError(name)\n",
        f"src/{PKG}/pipeline/streams.py": "from json import *\n",
        "tests/test_egress.py": f"from {PKG}.pipeline.egress import anything\nfrom {PKG}.pipeline.streams import dumps\n",
    }

    assert unresolved_imports(bake_tree(tmp_path, files), PKG) == []


def test_a_directory_without_init_does_not_count_as_the_package(tmp_path):
    files = {name: text for name, text in BASE.items() if name != f"src/{PKG}/pipeline/__init__.py"}

    problems = unresolved_imports(bake_tree(tmp_path, files), PKG)

    assert f"src/{PKG}/cli.py:2: from .pipeline.streams: no module {PKG}.pipeline.streams" in problems


def test_names_bound_in_conditional_and_guarded_blocks_count(tmp_path):
    files = {
        **BASE,
        f"src/{PKG}/pipeline/streams.py": textwrap.dedent(
            """\
            try:
                import tomllib as toml
            except ImportError:
                toml = None
            if toml:
                def run():
                    pass
            else:
                run = None
            for LIMIT in (1, 2):
                pass
            """
        ),
        "tests/test_egress.py": f"from {PKG}.pipeline.streams import LIMIT, run, toml\n",
    }

    assert unresolved_imports(bake_tree(tmp_path, files), PKG) == []
