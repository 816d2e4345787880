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
INSTALLED = "edgefarm"  # the farm's packages are installed as edgefarm.<folder> (edgefarm/ links each folder)
Edges = dict[str, dict[str, list[str]]]  # package -> package it imports -> "file:line: import ..." lines


def _written(node: ast.AST, module: str) -> list[str]:
    """The absolute module names one import statement names, as written (a relative one resolved against
    ``module``); ``from edgefarm import flows`` names ``edgefarm.flows``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")[:-node.level]
            return [".".join([*base, node.module] if node.module else base)]
        if node.module == INSTALLED:
            return [f"{INSTALLED}.{alias.name}" for alias in node.names]
        return [node.module] if node.module else []
    return []


def _imported(node: ast.AST, module: str) -> list[str]:
    """The modules one import statement names, a farm module by its folder (``edgefarm.flows.plan``: ``flows.plan``)."""
    return [name.removeprefix(f"{INSTALLED}.") for name in _written(node, module)]


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
                                               "    from edgefarm.toolchains.base import Route\n")
    (tmp_path / "toolchains" / "b.py").write_text("def f():\n    import devices.a\n")
    edges = import_graph(tmp_path)
    assert edges["devices"]["toolchains"] == ["devices/a.py:3: from edgefarm.toolchains.base import Route"]
    cycle = _cycle(edges)
    assert cycle == ["devices", "toolchains", "devices"]
    assert "toolchains/b.py:2: import devices.a" in _shown(edges, cycle)


def test_every_package_is_read_here_counted_in_the_code_revision_and_logged_to_prefect() -> None:
    """A top-level package of the repository is one of PACKAGES (so its imports are checked), part of the source
    digest a worker must match (``flows.revision.SOURCE_PACKAGES``) and a farm logger whose records reach the flow
    run (``flows.prefect_env.FARM_LOGGERS``): a package added or split off is none of these by default."""
    from edgefarm.flows.prefect_env import FARM_LOGGERS
    from edgefarm.flows.revision import SOURCE_PACKAGES

    found = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", INSTALLED}
    assert found == set(PACKAGES)
    assert set(PACKAGES) - set(SOURCE_PACKAGES) == set()
    assert set(FARM_LOGGERS) == {INSTALLED, "edgellm"}  # edgefarm.* loggers are the farm's, edgellm its library's
    # every farm folder is installed as edgefarm.<folder>: edgefarm/ links it (else it is neither installed nor
    # importable by the name every import uses)
    linked = {p.name for p in (ROOT / INSTALLED).iterdir() if p.is_symlink()}
    assert linked == set(PACKAGES) - {"edgellm"}
    assert all((ROOT / INSTALLED / p).resolve() == ROOT / p for p in linked)


def test_every_import_of_the_farm_uses_its_installed_name() -> None:
    """Code, tests, benchmarks and scripts import the farm as ``edgefarm.<folder>``: a bare ``from flows import x``
    would load a second copy of the module beside ``edgefarm.flows`` (two registries, two settings) in a checkout,
    and fail in an installed farm, where no top-level ``flows`` exists."""
    farm = set(PACKAGES) - {"edgellm"}
    wrong = []
    folders = (*PACKAGES, "tests", "benchmarks", "scripts")
    for path in sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py")):
        relative = path.relative_to(ROOT)
        module = ".".join(relative.with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # relative: inside its own package
            wrong += [f"{relative}:{node.lineno}: {ast.unparse(node)}" for name in _written(node, module)
                      if name.split(".")[0] in farm]
    assert not wrong, "imports of a farm package by its bare folder name (use edgefarm.<folder>):\n" + "\n".join(wrong)


def test_the_bare_import_check_can_fail(tmp_path: Path) -> None:
    assert _written(ast.parse("from flows.plan import x").body[0], "tests.t") == ["flows.plan"]
    assert _written(ast.parse("from edgefarm import flows").body[0], "tests.t") == ["edgefarm.flows"]
    assert _imported(ast.parse("import edgefarm.flows.plan").body[0], "tests.t") == ["flows.plan"]
