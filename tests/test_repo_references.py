"""Comments and docs name only what is in the repository (issue 38 item 6).

Every file path a product package, ``docs/``, ``infra/``, ``scripts/`` or README cites (``dir/name.py``, ``.md``,
``.yaml`` ...: at least one directory, so a bare file name is not taken for a path) must exist, relative to the
repository's root or to the citing file. Not checked: URLs; placeholders (``E/engine.json``, ``<out_dir>/x.json``);
what the farm writes at run time under its data directory (``.data/...``, however reached). Paths of other projects
and of files the farm writes elsewhere at run time are listed below, each with its reason; nothing else is excused.
An absolute path of a machine's home or work directory (``/work/...``, ``/root/...``, ``/home/...``) never is.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# every top-level package of the repository (a new one is scanned without being listed), and the folders of docs
PACKAGES = (*sorted(p.parent.name for p in REPO.glob("*/__init__.py") if p.parent.name != "tests"),
            "docs", "infra", "scripts")
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".sql", ".jinja", ".txt", ".cfg")
EXTENSIONS = "py|md|yaml|yml|json|toml|sh|sql|jinja|txt|html|png|cfg|csv|npz|safetensors"
# a relative path: directories then a file with a known extension, not inside a longer path or a word
REFERENCE = re.compile(rf"(?<![\w./@:~$<>-])((?:\.\.?/)*(?:[A-Za-z_.][\w.-]*/)+[\w.-]+\.(?:{EXTENSIONS}))(?![\w/-])")
URL = re.compile(r"[a-z][\w+.-]*://\S+")
ABSOLUTE = re.compile(r"(?<![\w.~$-])/(?:work|root|home|Users)/[\w./-]+")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")  # E/engine.json, OUT/env.json: a directory the text names by letter
DATA_DIR = ".data"  # settings' data directory: the farm creates everything under it at run time

FOREIGN = {  # files of another project, named as that project names them
    "scripts/export.py": "TensorRT Edge-LLM's exporter script (its Python package, 0.11.0)",
    "tensorrt_edgellm/scripts/export.py": "TensorRT Edge-LLM's exporter script as installed in its environment",
    "tensorrt_edgellm/config.py": "TensorRT Edge-LLM's exporter config reader (0.11.0)",
    "experimental/builder/cli.py": "TensorRT Edge-LLM's engine builder command line (0.11.0)",
    "cpp/CMakeLists.txt": "TensorRT Edge-LLM's C++ build (where its plugin library is named)",
    "vocab_reduction/constants.py": "TensorRT Edge-LLM's reduced-vocabulary file names",
}
RUNTIME = {  # files the farm writes at run time outside the repository's tree, named relative to where they land
    "runs/run-N.md": "a run's page, written under the docs directory by `edgefarm docs`",
    "runs/run-N.html": "a run's page, written under the docs directory by `edgefarm docs`",
    "../supported-models.md": "the supported-models page as a run page (docs/runs/) links it",
    "../support-matrix.html": "the support matrix as a run page (docs/runs/) links it",
    "compare/index.json": "the comparisons' index, written under the docs directory by `edgefarm compare`",
    "compare/index.md": "the comparisons' index page, written under the docs directory by `edgefarm compare`",
    "compare/index.html": "the comparisons' index page, written under the docs directory by `edgefarm compare`",
    "edge-llm/supported-models.md": "TensorRT Edge-LLM's layout of the pages, written by `edgefarm docs`",
    "edge-llm/support-matrix.md": "TensorRT Edge-LLM's layout of the pages, written by `edgefarm docs`",
    "llm/config.json": "an Edge-LLM export's own layout (its LLM part's config), written by the exporter",
    "../../docs/runs/run-4.md": "README quotes a bring-up report.md, written in .data/bringup/<model>/: its link",
}


def cited_files() -> list[Path]:
    files = [REPO / "README.md"]
    for package in PACKAGES:
        files += [p for p in sorted((REPO / package).rglob("*")) if p.is_file() and p.suffix in SUFFIXES
                  and "__pycache__" not in p.parts]
    return files


def references(text: str) -> list[tuple[int, str]]:
    """(line, path) of every relative file path ``text`` cites, URLs left out."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in REFERENCE.finditer(URL.sub(" ", line)):
            found.append((number, match.group(1)))
    return found


def missing(citing: Path, ref: str) -> bool:
    """Whether ``ref`` (cited by ``citing``) names nothing of the repository and is no excused path."""
    if ref in FOREIGN or ref in RUNTIME or PLACEHOLDER.fullmatch(ref.split("/")[0]):
        return False
    for base in (REPO, citing.parent):
        target = (base / ref).resolve()
        if target.exists():
            return False
        if target.is_relative_to(REPO) and target.relative_to(REPO).parts[:1] == (DATA_DIR,):
            return False
    return True


def test_the_reference_pattern_finds_paths_and_only_paths() -> None:
    text = ("see research/notes.md sections 1-2; toolchains/base.py, ``E/engine.json`` and <out_dir>/export.json;\n"
            "https://github.com/NVIDIA/x/blob/main/docs/a.md and 0.11.0 and a/b and model.py and ../../up/x.yaml")
    assert references(text) == [(1, "research/notes.md"), (1, "toolchains/base.py"), (1, "E/engine.json"),
                                (2, "../../up/x.yaml")]
    readme = REPO / "README.md"
    assert missing(readme, "research/notes.md") and missing(readme, "../../up/x.yaml")
    assert not missing(readme, "toolchains/base.py") and not missing(readme, "E/engine.json")
    assert not missing(readme, ".data/docs/runs/run-1.md")
    assert not missing(REPO / "docs" / "bringup" / "gemma2" / "report.md", "../../../.data/docs/runs/run-1.md")
    assert ABSOLUTE.findall("see /work/research/x.md, /root/.cache and /home/me/y; /tmp/z and ~/work/ok") == [
        "/work/research/x.md", "/root/.cache", "/home/me/y"]


def test_every_cited_repository_path_exists() -> None:
    files = cited_files()
    assert len(files) > 200  # the scan reads the packages, not an empty list
    bad = [f"{f.relative_to(REPO)}:{line}: {ref}" for f in files
           for line, ref in references(f.read_text(encoding="utf-8", errors="replace")) if missing(f, ref)]
    assert bad == [], "cited paths that are not in the repository:\n" + "\n".join(bad)


def test_no_absolute_home_or_work_path_is_cited() -> None:
    bad = [f"{f.relative_to(REPO)}:{n}: {m}" for f in cited_files()
           for n, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
           for m in ABSOLUTE.findall(line)]
    assert bad == [], "absolute paths of a machine:\n" + "\n".join(bad)


def test_every_excused_path_is_still_cited() -> None:
    """An excuse outliving its citation would excuse the next wrong one: each is cited somewhere still."""
    cited = {ref for f in cited_files() for _, ref in references(f.read_text(encoding="utf-8", errors="replace"))}
    assert sorted((set(FOREIGN) | set(RUNTIME)) - cited) == []
