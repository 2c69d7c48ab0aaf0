"""The shape of the house, checked from the source: layers import only downwards, the
production server imports nothing from the simulator, no import cycles, short files."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fedcore", "sdk_device", "export", "server_toolkit")  # bottom to top
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the four packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:  # "pkg.mod.Name" -> "pkg.mod"
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


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


def test_no_module_is_part_of_an_import_cycle(graph):
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
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
    # a package's __init__ re-exporting its modules is not a cycle of concepts
    cycles = [c for c in cycles if not all(m == c[0] or m.startswith(c[0] + ".") for m in c)]
    assert not cycles, cycles


def test_no_python_file_of_the_project_is_longer_than_400_lines():
    long = []
    for folder in (*PACKAGES, "bench", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > MAX_LINES:
                long.append((str(path.relative_to(ROOT)), lines))
    assert not long, long
