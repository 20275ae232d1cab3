"""Static check that a baked project imports only modules of its own package that it has.

The post-gen hook prunes modules by answer; a kept module that still imports a pruned
one bakes fine and fails only when it runs. Parsing every file with ``ast`` finds that
in milliseconds, without installing the project or its dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

# Blocks whose top-level statements still bind names of the module.
NESTED_BODIES = (ast.If, ast.Try, ast.With, ast.For, ast.While)


def module_name(path: Path) -> tuple[Path, list[str]]:
    """The directory ``path`` is imported from, and its dotted name's parts there.

    The root is the nearest ancestor without ``__init__.py``: ``src/`` for the
    package, the ``tests/`` directory itself for test modules (not a package).
    """
    parts = [] if path.name == "__init__.py" else [path.stem]
    directory = path.parent
    while (directory / "__init__.py").is_file():
        parts.insert(0, directory.name)
        directory = directory.parent
    return directory, parts


def module_file(root: Path, parts: list[str]) -> Path | None:
    """The file that defines module ``parts`` under ``root``; None if any level is missing.

    Only regular packages count: a directory left without ``__init__.py`` (or left
    empty by the hook) would import as a namespace package that has none of the code.
    """
    if not parts:
        return None
    for depth in range(1, len(parts)):
        if not (root.joinpath(*parts[:depth]) / "__init__.py").is_file():
            return None
    package = root.joinpath(*parts) / "__init__.py"
    module = root.joinpath(*parts[:-1]) / f"{parts[-1]}.py"
    return package if package.is_file() else module if module.is_file() else None


def bound_targets(node: ast.stmt) -> list[ast.expr]:
    """The expressions a statement assigns to (names, tuples of names, attributes...)."""
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.For)):
        return [node.target]
    if isinstance(node, ast.With):
        return [item.optional_vars for item in node.items if item.optional_vars is not None]
    return []


def bound_names(tree: ast.Module) -> set[str] | None:
    """Names a module binds at import time; None when it cannot tell (star import, __getattr__)."""
    names: set[str] = set()
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        for target in bound_targets(node):
            names.update(name.id for name in ast.walk(target) if isinstance(name, ast.Name))
        if isinstance(node, NESTED_BODIES):
            for field in ("body", "orelse", "finalbody"):
                statements.extend(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                statements.extend(handler.body)
    return names


def imported_module(path: Path, node: ast.ImportFrom) -> list[str] | None:
    """Dotted parts of the module a ``from ... import`` names; None if it climbs out of its package."""
    if not node.level:
        return (node.module or "").split(".")
    _, parts = module_name(path)
    package = parts if path.name == "__init__.py" else parts[:-1]
    if node.level > len(package):
        return None
    base = package[: len(package) - node.level + 1]
    return base + (node.module.split(".") if node.module else [])


def unresolved_imports(project: Path, package: str) -> list[str]:
    """Every import of ``package`` under ``src/`` and ``tests/`` that names a module or name it lacks."""
    source_root = project / "src"
    problems = []
    for path in sorted([*(source_root / package).rglob("*.py"), *(project / "tests").rglob("*.py")]):
        where = path.relative_to(project).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == package and module_file(source_root, parts) is None:
                        problems.append(f"{where}:{node.lineno}: import {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                problems.extend(f"{where}:{node.lineno}: {problem}" for problem in unresolved_from(path, node, source_root, package))
    return problems


def unresolved_from(path: Path, node: ast.ImportFrom, source_root: Path, package: str) -> list[str]:
    """What a ``from ... import`` of the project's package names that is not there."""
    shown = f"from {'.' * node.level}{node.module or ''}"
    parts = imported_module(path, node)
    if parts is None:
        return [f"{shown}: climbs out of its package"]
    # Relative imports always name the file's own package; absolute ones count only if they name ours.
    if not node.level and parts[0] != package:
        return []
    root = module_name(path)[0] if node.level else source_root
    defining = module_file(root, parts)
    if defining is None:
        return [f"{shown}: no module {'.'.join(parts)}"]
    names = bound_names(ast.parse(defining.read_text()))
    in_package = defining.name == "__init__.py"
    return [
        f"{shown} import {alias.name}: {'.'.join(parts)} has no {alias.name}"
        for alias in node.names
        if alias.name != "*"
        and not (in_package and module_file(root, [*parts, alias.name]))
        and names is not None
        and alias.name not in names
    ]
