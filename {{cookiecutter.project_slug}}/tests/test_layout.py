"""The package layout holds: production code loads no development tool, and no module imports itself back."""

import ast
import subprocess
import sys
from pathlib import Path

import {{ cookiecutter.package_name }}

PACKAGE = "{{ cookiecutter.package_name }}"
ROOT = Path({{ cookiecutter.package_name }}.__file__).parent
# Import cycles tolerated: none, and none may appear.
KNOWN_CYCLES: list[set[str]] = []

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

    assert f"{PACKAGE}.pipeline.streams" in loaded and f"{PACKAGE}.pipeline.audit.reconcile" in loaded
    assert [name for name in loaded if not name.startswith(f"{PACKAGE}.pipeline")] == [PACKAGE]


def test_the_command_line_loads_development_tools_only_in_their_commands():
    loaded = modules_loaded_by(f"import {PACKAGE}.cli")

    assert f"{PACKAGE}.cli" in loaded
    assert not [name for name in loaded if name.startswith((f"{PACKAGE}.devtools", f"{PACKAGE}.bench"))]


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its code, inside functions too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            # `from package import module` imports the module; `from module import name` the module.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target in known and target != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_package_imports_itself_back_through_others():
    modules = module_names()
    graph = {name: imports_of(name, path, set(modules)) for name, path in modules.items()}

    assert len(graph) > 40 and graph[f"{PACKAGE}.pipeline.streams"]
    # The refusal catalogue and the event contract sit below everything: any module may use them.
    assert graph[f"{PACKAGE}.pipeline.refusals"] == graph[f"{PACKAGE}.pipeline.contract"] == set()
    assert [cycle for cycle in cycles(graph) if cycle not in KNOWN_CYCLES] == []
    # Each egress parses its own table (pipeline.egress.configure): config knows none of them.
    assert f"{PACKAGE}.pipeline.config" in graph[f"{PACKAGE}.pipeline.egress"]
    assert not [name for name in graph[f"{PACKAGE}.pipeline.config"] if name.startswith(f"{PACKAGE}.pipeline.egress")]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_the_pipeline_is_laid_out_along_the_path_of_a_record():
    pipeline = ROOT / "pipeline"

    assert {"bronze.py", "silver.py", "gold.py", "streams.py", "contract.py"} <= {p.name for p in pipeline.iterdir()}
    assert {"delta", "kafka", "recovery", "audit", "egress"} <= {p.name for p in pipeline.iterdir() if p.is_dir()}
