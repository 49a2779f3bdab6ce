"""The package's modules import one way: no import cycle, at module level or inside functions.

The graph is read from the source with `ast`, so a cycle hidden in a function body (imported
late to dodge the circular import at load time) counts as much as a top-level one, and so does
`importlib.import_module("literal")`. Importing `opwarden.ops.conv` also runs
`opwarden/ops/__init__.py`, so that package is an edge too, unless it is one of the importer's
own packages (already being initialised) or the top package `opwarden` (the facade, which
imports everything and is imported by nothing inside).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "opwarden"
PACKAGE = "opwarden"


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _targets(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The package modules that module `name` (at `path`) imports anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def owner(dotted: str) -> str | None:
        # `import a.b.c` or `from a.b import c` reaches the longest prefix that is a module.
        while dotted:
            if dotted in mods:
                return dotted
            dotted = dotted.rpartition(".")[0]
        return None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and (m := owner(alias.name)):
                    found.add(m)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if src.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                # `from pkg import sub` imports the submodule; `from mod import name` the module.
                m = f"{src}.{alias.name}" if f"{src}.{alias.name}" in mods else owner(src)
                if m:
                    found.add(m)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
        ):
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if m := owner(arg.value):
                    found.add(m)
            elif (
                is_pkg
                and isinstance(arg, ast.JoinedStr)
                and isinstance(arg.values[0], ast.FormattedValue)
                and isinstance(arg.values[0].value, ast.Name)
                and arg.values[0].value.id == "__name__"
            ):
                # f"{__name__}.{x}" in a package: taken as importing each of its submodules.
                found.update(m for m in mods if m.rpartition(".")[0] == name)
    # The packages each target's import initialises on the way, if not the importer's own.
    for m in list(found):
        parent = m.rpartition(".")[0]
        while parent != PACKAGE and "." in parent:
            if not (name == parent or name.startswith(parent + ".")):
                found.add(parent)
            parent = parent.rpartition(".")[0]
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _targets(name, path, mods) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a module path back to its start) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        # Tarjan's algorithm; the package has ~200 modules, recursion depth is no concern.
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    cycles = []
    for comp in components:
        start = min(comp)
        # Shortest path from start back to itself inside the component (BFS).
        prev: dict[str, str] = {}
        frontier = [start]
        seen = {start}
        end = None
        while frontier and end is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & comp):
                    if w == start:
                        end = v
                        break
                    if w not in seen:
                        seen.add(w)
                        prev[w] = v
                        nxt.append(w)
                if end is not None:
                    break
            frontier = nxt
        path = [end]
        while path[-1] != start:
            path.append(prev[path[-1]])
        cycle = [*reversed(path), start]
        others = sorted(comp - set(cycle))
        # The other modules of the same knot, so a fix of one cycle does not hide the next.
        cycles.append(cycle + ([f"(also tangled: {', '.join(others)})"] if others else []))
    return cycles


def test_graph_sees_function_level_and_importlib_imports():
    graph = import_graph()
    # Sanity: the reader finds imports that only a function body makes.
    assert "opwarden.session" in graph["opwarden.cli.run"]
    assert "opwarden.ops.conv" in graph["opwarden.ops"]  # f"{__name__}.{family}"
    # ... and the package `opwarden.ops` that importing `opwarden.ops.conv` runs first.
    assert "opwarden.ops" in graph["opwarden.kernels.cpu.conv"]
    assert "opwarden.ops" not in graph["opwarden.ops.conv"]


def test_no_import_cycles():
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_report_names_the_path():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": {"b"}, "e": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a", "(also tangled: d)"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_builtin_kernels_register_in_a_fresh_process():
    # Registration runs from opwarden/__init__.py (kernels.registry), not from `ops`: importing
    # any opwarden module must still give every operator its fast variants.
    import subprocess
    import sys

    code = ("import opwarden.ops as o; print(sorted(v.name for v in "
            "o.REGISTRY.latest('Conv').variants))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    assert "conv.cpu.nhwc" in out.stdout and "conv.ref" in out.stdout, out.stdout


def _private_crossings() -> list[str]:
    """`from opwarden.a.x import _name` (or of a private module) where the importer is not in
    package `opwarden.a`: a private name is its own package's business."""
    found = []
    for name, path in _modules().items():
        mine = name.split(".")[1] if "." in name else ""
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0
                    and (node.module or "").startswith(PACKAGE + ".")):
                continue
            theirs = node.module.split(".")[1]
            if theirs == mine:
                continue
            private_module = any(s.startswith("_") and not s.startswith("__")
                                 for s in node.module.split("."))
            for alias in node.names:
                if private_module or alias.name.startswith("_"):
                    found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}: "
                                 f"{node.module}.{alias.name}")
    return found


def test_no_private_names_cross_packages():
    found = _private_crossings()
    assert not found, "private names imported across packages:\n" + "\n".join(found)


def test_import_linter_layers_hold():
    # The layer contract itself lives in pyproject.toml ([tool.importlinter]); CI runs
    # `lint-imports` too, this keeps a plain pytest run honest.
    import shutil
    import subprocess
    import sys

    import pytest

    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (the test extra)")
    out = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT.parent, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
