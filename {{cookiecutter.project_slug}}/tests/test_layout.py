"""The package layout holds: production code loads no development tool, and no module outgrows a read."""

import subprocess
import sys
from pathlib import Path

import {{ cookiecutter.package_name }}

PACKAGE = "{{ cookiecutter.package_name }}"
MAX_MODULE_LINES = 400

LOADED_AFTER = """
import importlib, pkgutil, sys
{imports}
print("\\n".join(sorted(name for name in sys.modules if name == "{package}" or name.startswith("{package}."))))
"""


def modules_loaded_by(imports: str) -> list[str]:
    """The project's modules in sys.modules after running ``imports`` in a fresh interpreter."""
    code = LOADED_AFTER.format(imports=imports, package=PACKAGE)
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()


def test_importing_every_pipeline_module_loads_no_development_module():
    loaded = modules_loaded_by(
        f"import {PACKAGE}.pipeline as pipeline\n"
        "for module in pkgutil.walk_packages(pipeline.__path__, pipeline.__name__ + '.'):\n"
        "    importlib.import_module(module.name)"
    )

    assert f"{PACKAGE}.pipeline.streams" in loaded and f"{PACKAGE}.pipeline.audit" in loaded
    assert [name for name in loaded if not name.startswith(f"{PACKAGE}.pipeline")] == [PACKAGE]


def test_the_command_line_loads_development_tools_only_in_their_commands():
    loaded = modules_loaded_by(f"import {PACKAGE}.cli")

    assert f"{PACKAGE}.cli" in loaded
    assert not [name for name in loaded if name.startswith((f"{PACKAGE}.devtools", f"{PACKAGE}.bench"))]


def test_no_module_is_longer_than_a_reader_can_hold():
    root = Path({{ cookiecutter.package_name }}.__file__).parent
    lengths = {path.relative_to(root).as_posix(): len(path.read_text().splitlines()) for path in root.rglob("*.py")}

    assert len(lengths) > 20
    assert {name: lines for name, lines in lengths.items() if lines > MAX_MODULE_LINES} == {}
