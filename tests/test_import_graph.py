"""The layering of the top-level packages, read from every import statement of every module (module level, inside
functions and under ``TYPE_CHECKING`` alike): no cycle between packages, the vocabulary a leaf over ``edgellm``,
``edgellm`` free of the farm, and ``devices`` asking no toolchain and nothing of Prefect's layers."""

from __future__ import annotations

import ast
import functools
import itertools
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("edgellm", "vocabulary", "devices", "artifacts", "results", "stages", "toolchains", "registries", "tasks",
            "pages", "flows", "cli", "test_lists")
Edges = dict[str, dict[str, list[str]]]  # package -> package it imports -> "file:line: import ..." lines


def _imported(node: ast.AST, module: str) -> list[str]:
    """The absolute module names one import statement names (a relative one resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[:-node.level]
            return [".".join([*base, node.module] if node.module else base)]
        return [node.module] if node.module else []
    return []


@functools.cache
def import_graph(root: Path = ROOT) -> Edges:
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            module = ".".join(relative.with_suffix("").parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                for name in _imported(node, module):
                    top = name.split(".")[0]
                    line = f"{relative}:{node.lineno}: {ast.unparse(node)}"
                    edges[package][top].append(line)
    return edges


def _cycle(edges: Edges) -> list[str] | None:
    """One cycle between distinct packages, as the packages along it (first == last), or None."""
    graph = {p: sorted(t for t in edges.get(p, {}) if t in PACKAGES and t != p) for p in PACKAGES}
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in PACKAGES:
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def _shown(edges: Edges, cycle: list[str]) -> str:
    lines = []
    for src, dst in itertools.pairwise(cycle):
        lines.append(f"{src} -> {dst}:")
        lines += [f"    {line}" for line in edges[src][dst]]
    return "\n".join(lines)


def test_the_packages_import_each_other_without_a_cycle() -> None:
    edges = import_graph()
    cycle = _cycle(edges)
    assert cycle is None, "package import cycle " + " -> ".join(cycle) + ":\n" + _shown(edges, cycle)


def test_the_vocabulary_imports_only_the_standard_library_and_edgellm() -> None:
    edges = import_graph()
    assert "edgellm" in edges["vocabulary"], "vocabulary/ is missing (or names nothing of edgellm)"
    stdlib = sys.stdlib_module_names | {"__future__"}
    wrong = [line for top, lines in edges["vocabulary"].items() if top not in stdlib | {"edgellm", "vocabulary"}
             for line in lines]
    assert not wrong, "vocabulary/ imports beyond the standard library and edgellm:\n" + "\n".join(wrong)


def test_edgellm_imports_no_farm_package() -> None:
    edges = import_graph()
    wrong = [line for top, lines in edges["edgellm"].items() if top in PACKAGES and top != "edgellm"
             for line in lines]
    assert not wrong, "edgellm/ imports the farm:\n" + "\n".join(wrong)


def test_devices_ask_no_toolchain_task_or_flow() -> None:
    edges = import_graph()
    wrong = [line for top in ("toolchains", "tasks", "flows") for line in edges["devices"].get(top, [])]
    assert not wrong, "devices/ imports what it must not (toolchains, tasks, flows):\n" + "\n".join(wrong)


def test_the_graph_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    """The reader itself: an import inside a function or under TYPE_CHECKING is an edge, and a cycle is named with
    the lines that make it."""
    for package in PACKAGES:
        (tmp_path / package).mkdir()
    (tmp_path / "devices" / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from toolchains.base import Route\n")
    (tmp_path / "toolchains" / "b.py").write_text("def f():\n    import devices.a\n")
    edges = import_graph(tmp_path)
    assert edges["devices"]["toolchains"] == ["devices/a.py:3: from toolchains.base import Route"]
    cycle = _cycle(edges)
    assert cycle == ["devices", "toolchains", "devices"]
    assert "toolchains/b.py:2: import devices.a" in _shown(edges, cycle)


def test_every_package_is_read_here_counted_in_the_code_revision_and_logged_to_prefect() -> None:
    """A top-level package of the repository is one of PACKAGES (so its imports are checked), part of the source
    digest a worker must match (``flows.revision.SOURCE_PACKAGES``) and a farm logger whose records reach the flow
    run (``flows.prefect_env.FARM_LOGGERS``): a package added or split off is none of these by default."""
    from flows.prefect_env import FARM_LOGGERS
    from flows.revision import SOURCE_PACKAGES

    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert found == set(PACKAGES)
    assert set(PACKAGES) - set(SOURCE_PACKAGES) == set()
    assert set(PACKAGES) - set(FARM_LOGGERS) == set()
