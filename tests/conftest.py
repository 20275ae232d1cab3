import importlib.util
from pathlib import Path

import pytest

TEMPLATE = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items):
    # The slow tier first: with two workers (`make test`) it starts at once, and the fast
    # tests run beside it instead of before it.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config):
    # pytest-cookies bakes the template at --template, "." by default: the working
    # directory. Point it at this template wherever pytest is started from.
    config.option.template = str(TEMPLATE)


def load_hook(name: str):
    """Import a hook script as a module: its logic is plain functions, its Jinja only in __main__."""
    spec = importlib.util.spec_from_file_location(name, TEMPLATE / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def pre_gen():
    return load_hook("pre_gen_project")


@pytest.fixture(scope="session")
def post_gen():
    return load_hook("post_gen_project")
