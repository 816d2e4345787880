"""Who may import whom, and who reads or writes the farm's environment, checked on the source (no imports run)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FARM = ("tasks", "flows", "pages", "cli", "registries", "devices", "test_lists", "artifacts", "results", "toolchains")
INSTALLED = "edgefarm"  # the farm's folders are installed as edgefarm.<folder>
PREFECT_SETTINGS = {"flows/prefect_env.py", "flows/serve.py"}  # Prefect reads its settings from the environment


def _modules(*packages: str) -> dict[str, ast.Module]:
    return {p.relative_to(REPO).as_posix(): ast.parse(p.read_text(), str(p))
            for package in packages for p in sorted((REPO / package).rglob("*.py"))}


def _folder(module: str) -> str:
    """A farm module by its folder (``edgefarm.flows.plan``: ``flows.plan``), others as they are."""
    return module.removeprefix(f"{INSTALLED}.")


def _imports(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_folder(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == INSTALLED:
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(_folder(node.module))
    return found


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name) \
        and node.value.id == "os"


def test_cli_code_lives_in_one_package() -> None:
    outside = {path for path, tree in _modules(*FARM).items()
               if not path.startswith("cli/") and any(m.split(".")[0] == "typer" for m in _imports(tree))}
    assert outside == set(), f"typer (edgefarm CLI code) outside cli/: {sorted(outside)}"
    users = {path for path, tree in _modules(*FARM).items()
             if not path.startswith("cli/") and any(m.split(".")[0] == "cli" for m in _imports(tree))}
    assert users == set(), f"the CLI is the top layer; imported by {sorted(users)}"


def test_lower_layers_import_no_higher_one() -> None:
    rules = {"devices": ("tasks", "flows", "pages", "cli", "results", "registries"),
             "artifacts": ("tasks", "flows", "pages", "cli", "registries"),
             "results": ("tasks", "flows", "pages", "cli", "registries"),
             "toolchains": ("tasks", "flows", "pages", "cli", "registries"),
             "tasks": ("flows", "pages", "cli"), "pages": ("tasks", "flows", "cli"), "flows": ("cli",)}
    broken = [f"{path} imports {module}" for package, banned in rules.items()
              for path, tree in _modules(package).items() for module in sorted(_imports(tree))
              if module.split(".")[0] in banned]
    assert broken == []


def test_only_the_settings_read_the_farm_environment_and_nothing_writes_it() -> None:
    readers, writers = [], []
    for path, tree in _modules(*FARM).items():
        names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        uses_environ = any(_is_environ(n) for n in ast.walk(tree)) or "getenv" in {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        if uses_environ and any(v.startswith("EDGEFARM_") for v in names) and path != "flows/settings.py":
            readers.append(path)
        for node in ast.walk(tree):
            stored = isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Store)
            mutated = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                (_is_environ(node.func.value) and node.func.attr in ("setdefault", "update", "pop", "clear"))
                or node.func.attr in ("putenv", "unsetenv"))
            if (stored or mutated) and path not in PREFECT_SETTINGS:
                writers.append(f"{path}:{node.lineno}")
    assert readers == [], f"EDGEFARM_* read outside flows/settings.py: {readers}"
    assert writers == [], f"the environment written (settings are passed, not exported): {writers}"


def _imported_names(path: str, tree: ast.Module) -> set[str]:
    """Every module a file imports, TYPE_CHECKING blocks and imports inside functions included: ``from a import b``
    gives ``a`` and ``a.b`` (b may be a module), relative imports resolved against the file's package."""
    package = path.removesuffix(".py").replace("/", ".").removesuffix(".__init__").split(".")
    if not path.endswith("__init__.py"):
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {_folder(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            found.add(_folder(base))
            found |= {_folder(f"{base}.{a.name}") for a in node.names}
    return found


def test_edgellm_imports_nothing_from_the_farm() -> None:
    broken = [f"{path} imports {m}" for path, tree in _modules("edgellm").items()
              for m in sorted(_imported_names(path, tree)) if m.split(".")[0] in (*FARM, "stages")]
    assert broken == []


def test_edgellm_backends_never_import_the_runtime() -> None:
    """edgellm.runtime (the engine) sits on edgellm.backends (each session owns its KV cache strategy): the
    dependency goes one way."""
    broken = [f"{path} imports {m}" for path, tree in _modules("edgellm/backends").items()
              for m in sorted(_imported_names(path, tree)) if m.split(".")[:2] == ["edgellm", "runtime"]]
    assert broken == []
    # the walk sees imports of every form (so the rule above cannot pass by missing one)
    probe = ("from edgellm import runtime\nfrom ..runtime import engine\nif TYPE_CHECKING:\n"
             "    from edgellm.runtime.engine import Engine\ndef f():\n    import edgellm.runtime.requests\n")
    seen = _imported_names("edgellm/backends/probe.py", ast.parse(probe))
    assert {"edgellm.runtime", "edgellm.runtime.engine", "edgellm.runtime.requests"} <= seen


# -- every read and write of the results database is results/'s (it returns typed rows; nothing else builds SQL) --
PRODUCT = ("devices", "artifacts", "stages", "toolchains", "registries", "tasks", "flows", "pages", "cli", "test_lists",
           "edgellm")
DB_LIBRARIES = ("sqlalchemy", "alembic", "sqlite3", "psycopg", "psycopg2")


def _tables() -> set[str]:
    """The mapped classes of results/models.py (a subclass of ``Base``, at any depth): what a query is built from."""
    classes = [n for n in ast.parse((REPO / "results" / "models.py").read_text()).body if isinstance(n, ast.ClassDef)]
    mapped = {"Base"}
    while True:
        more = {c.name for c in classes if any(isinstance(b, ast.Name) and b.id in mapped for b in c.bases)}
        if more <= mapped:
            return mapped
        mapped |= more


def _sql_builders(path: str, tree: ast.Module, tables: set[str]) -> list[str]:
    """Where a module imports a database library (sqlalchemy, a driver) or a mapped class of results.models, in any
    form: at the top, inside a function, under TYPE_CHECKING, or the module ``results.models`` itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"{path}:{node.lineno} imports {a.name}" for a in node.names
                      if a.name.split(".")[0] in DB_LIBRARIES or a.name == "edgefarm.results.models"]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in DB_LIBRARIES:
                found.append(f"{path}:{node.lineno} imports {node.module}")
            elif node.module == "edgefarm.results.models":
                found += [f"{path}:{node.lineno} imports the table {a.name}" for a in node.names if a.name in tables]
            elif node.module == "edgefarm.results":
                found += [f"{path}:{node.lineno} imports results.models" for a in node.names if a.name == "models"]
    return found


def test_only_results_builds_sql() -> None:
    """results/ owns every read and write of the database: no product module outside it imports SQLAlchemy (an
    Engine passed along is ``results.db.Engine``; a session held across reads is ``results.db.reading``'s), a
    database driver, or a table of results.models (its enums and vocabularies are free to use)."""
    tables = _tables()
    assert {"Run", "Result", "Metric", "RowLatest", "RunWorker", "ArtifactRecord"} <= tables
    broken = [line for path, tree in _modules(*PRODUCT).items() for line in _sql_builders(path, tree, tables)]
    assert broken == []
    # the walk sees every form (so the rule above cannot pass by missing one)
    probe = ("from sqlalchemy import select\nif TYPE_CHECKING:\n    from sqlalchemy.orm import Session\n"
             "def f():\n    import sqlalchemy\n    from edgefarm.results.models import Result, ResultStatus\n"
             "import edgefarm.results.models\nfrom edgefarm.results import models\nimport sqlite3\n")
    seen = _sql_builders("flows/probe.py", ast.parse(probe), tables)
    assert len(seen) == 7 and not any("ResultStatus" in s for s in seen), seen
