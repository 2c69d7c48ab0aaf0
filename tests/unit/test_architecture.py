"""The shape of the house, checked from the source: layers import only downwards, the
production server imports nothing from the simulator, no import cycles, short files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedcore", "sdk_device", "export", "server_toolkit")  # bottom to top
MAX_LINES = 400


def _modules(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _bindings(name: str, path: Path) -> dict[str, tuple[str, str | None]]:
    """What the module level of ``name`` binds by importing: bound name -> (module it comes
    from, the name there; None: the module itself)."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            base = _absolute(package, node)
            for alias in node.names:
                out[alias.asname or alias.name] = (base, alias.name)
    return out


def _absolute(package: str, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        anchor = package.split(".")
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _resolve(base: str, attr: str, modules: dict[str, Path], depth: int = 0) -> str | None:
    """The project module ``from base import attr`` depends on: the submodule ``base.attr``; a
    name a package's ``__init__`` re-exports: the module it comes from (followed down); else
    ``base`` itself (None: not a project module)."""
    if f"{base}.{attr}" in modules:
        return f"{base}.{attr}"
    while base and base not in modules:  # "pkg.mod.Name" -> "pkg.mod"
        base = base.rpartition(".")[0]
    if not base:
        return None
    if _is_package(modules[base]) and depth < 10:
        source = _bindings(base, modules[base]).get(attr)
        if source is not None:
            return _resolve(*source, modules, depth + 1) or base
    return base


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (module level or inside functions), each resolved to
    the module that defines what is imported: ``from . import x`` and ``from .pkg import f``
    point at ``x`` and at the module ``pkg/__init__`` took ``f`` from, so a package's
    re-exports cannot hide a loop between two of its modules."""
    package = name if _is_package(path) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [_resolve(alias.name, "", modules) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node)
            targets = [_resolve(base, alias.name, modules) for alias in node.names]
        else:
            continue
        found |= {target for target in targets if target and target != name}
    return found


def _graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    modules = _modules(root, packages)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return _graph()


def test_every_package_imports_only_the_packages_below_it(graph):
    rank = {package: i for i, package in enumerate(PACKAGES)}
    upward = [(a, b) for a, targets in graph.items() for b in targets
              if rank[b.split(".")[0]] > rank[a.split(".")[0]]]
    assert not upward, upward


def test_the_production_server_imports_nothing_from_the_simulator(graph):
    simulator = "server_toolkit.sim"
    allowed = {"server_toolkit.cli.simulate"}  # the `simulate` command is the simulator's front door
    leaks = [(a, b) for a, targets in graph.items() for b in targets
             if (b == simulator or b.startswith(simulator + ".")) and not a.startswith(simulator)
             and a not in allowed]
    assert not leaks, leaks


def test_the_round_loop_imports_no_aggregation_feature(graph):
    """Features are layers of the aggregation stack (``rounds/aggregator.py``), built by the
    assembly: ``rounds/`` names none of edges, privacy or secure aggregation."""
    features = ("server_toolkit.edge", "server_toolkit.privacy", "server_toolkit.secagg")
    leaks = [(a, b) for a, targets in graph.items() if a.startswith("server_toolkit.rounds")
             for b in targets if any(b == f or b.startswith(f + ".") for f in features)]
    assert not leaks, leaks


def test_no_module_is_part_of_an_import_cycle(graph):
    assert _cycles(graph) == []


def test_the_cycle_check_sees_a_loop_through_a_packages_re_exports(tmp_path):
    """pkg.a imports pkg.b's g; pkg.b takes f from the package, which re-exports it from pkg.a."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from .a import f\n")
    (package / "a.py").write_text("from .b import g\n\n\ndef f():\n    return g()\n")
    (package / "b.py").write_text("def g():\n    from . import f\n    return f\n")
    (package / "c.py").write_text("from pkg import f\nfrom . import a\n")  # depends, no loop
    looped = _graph(tmp_path, ("pkg",))
    assert looped["pkg.b"] == {"pkg.a"} and looped["pkg.c"] == {"pkg.a"}
    assert _cycles(looped) == [["pkg.a", "pkg.b"]]
    (package / "b.py").write_text("def g():\n    return 1\n")
    assert _cycles(_graph(tmp_path, ("pkg",))) == []


def test_no_python_file_of_the_project_is_longer_than_400_lines():
    long = []
    for folder in (*PACKAGES, "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                long.append((str(path.relative_to(ROOT)), lines))
    assert not long, long
