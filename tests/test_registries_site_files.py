"""A site directory's files reach the farm only through the registries built from it (``registries.Registries``):
two registries of two site directories, in one process, give their own test lists, catalog, nightly matrix, device
types and inventory. Nothing but the registries asks the process which site directory it has (``devices.site``), and
no test changes the registered toolchains but through ``tests/helpers/registries.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgefarm import registries
from edgefarm.devices.inventory import PACKAGED_INVENTORY_DIR, load_inventory
from edgefarm.devices.types import DEVICE_TYPES_DIR
from edgefarm.flows.plan import DEFAULT_MATRIX, default_matrix
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import LISTS_DIR, list_names, load_list, validate_paths

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("edgellm", "vocabulary", "devices", "artifacts", "results", "stages", "toolchains", "registries", "tasks",
           "pages", "flows", "cli", "test_lists", "benchmarks", "scripts", "tests")
SITE_READERS = {"registries/__init__.py", "devices/site.py"}  # the one reader of the process's site directory
TOOLCHAIN_REGISTRY = {"register_toolchain", "unregister_toolchain", "_DRIVERS"}

BOARD = """\
name: {name}
description: a small x86-64 CPU board
arch: x86_64
sm: null
memory_gb: 4
os_reserve_gb: 1
toolchains: [edgellm-ort]
precisions: [fp32, fp16]
kv_cache_precisions: [fp32, fp16]
lm_head_precisions: [fp32, fp16]
"""
MODEL = """\
models:
  {name}:
    synthetic: {{family: llama, seed: 0, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
                num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 512}}
"""
LIST = """\
name: {name}
stage: l0
description: the lab's own list
platforms:
  terms: [{board}]
defaults: {{max_seq_len: 64, max_batch_size: 1, max_input_len: 32, stages: [export, build, infer]}}
tests:
  - model: {model}
    precision: fp32
"""
MATRIX = """\
name: {name}
models: [{model}]
precisions: [fp32]
platforms: [{board}]
defaults: {{max_seq_len: 64, max_batch_size: 1, max_input_len: 32, stages: [export, build, infer]}}
"""


def _site(root: Path, lab: str) -> Path:
    """A site directory of one lab: its board type, one device of it, a model, a list and a nightly matrix."""
    board, model = f"{lab}-board", f"{lab}-model"
    for kind, name, text in (("device_types", f"{board}.yaml", BOARD.format(name=board)),
                             ("inventory", f"{board}-1.yaml", f"type: {board}\ntransport: local\nwork_dir: d/1\n"),
                             ("catalog", f"{lab}.yml", MODEL.format(name=model)),
                             ("lists", f"{lab}_list.yml", LIST.format(name=f"{lab}_list", board=board, model=model)),
                             ("matrices", "nightly.yml", MATRIX.format(name=f"{lab}-nightly", board=board,
                                                                       model=model))):
        (root / lab / kind).mkdir(parents=True, exist_ok=True)
        (root / lab / kind / name).write_text(text)
    return root / lab


@pytest.fixture(scope="module")
def two_labs(tmp_path_factory: pytest.TempPathFactory) -> tuple[registries.Registries, registries.Registries]:
    root = tmp_path_factory.mktemp("sites")
    return registries.build(_site(root, "lab-a")), registries.build(_site(root, "lab-b"))


def test_two_registries_of_two_site_directories_give_their_own_files(
        two_labs: tuple[registries.Registries, registries.Registries], tmp_path: Path) -> None:
    for mine, other in (("lab-a", "lab-b"), ("lab-b", "lab-a")):
        regs = two_labs[0] if mine == "lab-a" else two_labs[1]
        assert regs.site_dir is not None and regs.site_dir.name == mine
        names = list_names(registries=regs)
        assert f"{mine}_list" in names and f"{other}_list" not in names
        assert set(list_names(registries=regs)) - {f"{mine}_list"} == set(list_names(LISTS_DIR))
        catalog = Catalog.load(registries=regs)
        assert f"{mine}-model" in catalog and f"{other}-model" not in catalog and "stories260K" in catalog
        assert catalog.get(f"{mine}-model").kind == "synthetic"
        loaded = load_list(f"{mine}_list", registries=regs)
        assert [e.model for e in loaded.entries] == [f"{mine}-model"] and loaded.platforms == (f"{mine}-board",)
        assert default_matrix(regs) == regs.site_dir / "matrices" / "nightly.yml"
        assert f"{mine}-board" in regs.device_types and f"{other}-board" not in regs.device_types
        devices = load_inventory(PACKAGED_INVENTORY_DIR, data_dir=tmp_path, registries=regs).devices
        assert f"{mine}-board-1" in devices and f"{other}-board-1" not in devices
        report = validate_paths(registries=regs)
        assert report.errors == [], report.errors
        site_files = {f.name for f in report.files if regs.origin(f) == "site"}
        assert site_files == {f"{mine}_list.yml"}
        assert regs.origin(regs.files("device_types", DEVICE_TYPES_DIR)["orin"]) == "packaged"
        assert regs.origin(regs.files("device_types", DEVICE_TYPES_DIR)[f"{mine}-board"]) == "site"


def test_registries_without_a_site_directory_give_the_packaged_files_alone() -> None:
    packaged = registries.build(None)
    assert default_matrix(packaged) == DEFAULT_MATRIX
    assert list_names(registries=packaged) == list_names(LISTS_DIR)
    assert packaged.files("catalog", None) == {}
    assert all(packaged.origin(f) == "packaged" for f in packaged.files("lists", LISTS_DIR).values())


def _sources(*packages: str) -> dict[str, ast.Module]:
    return {p.relative_to(ROOT).as_posix(): ast.parse(p.read_text(encoding="utf-8"), str(p))
            for package in packages for p in sorted((ROOT / package).rglob("*.py"))}


def test_only_the_registries_ask_the_process_for_its_site_directory() -> None:
    """``devices.site.current()`` (and the overlay of a kind's files) has one caller: what the registries are built
    from; every loader takes the site directory's files from the registries it is handed."""
    found = []
    for path, tree in _sources(*SCANNED).items():
        if path in SITE_READERS:
            continue
        for node in ast.walk(tree):
            imported = isinstance(node, ast.ImportFrom) and node.module == "edgefarm.devices.site" and any(
                a.name in ("current", "overlay") for a in node.names)
            called = isinstance(node, ast.Attribute) and node.attr in ("current", "overlay") and (
                (isinstance(node.value, ast.Name) and node.value.id == "site")
                or (isinstance(node.value, ast.Attribute) and node.value.attr == "site"))
            if imported or called:
                found.append(f"{path}:{node.lineno}")
    allowed = {"devices/types.py"}  # the device types' loader, handed the site directory by the registries
    assert [f for f in found if f.split(":")[0] not in allowed] == []
    assert any(f.startswith("devices/types.py:") for f in found), "the scan sees devices/types.py's import"


def test_no_test_changes_the_registered_toolchains_but_through_the_registries_helper() -> None:
    """Registering, unregistering or swapping a driver (``monkeypatch.setattr(base, "_DRIVERS", ...)`` too) is
    ``registries_with``'s: one way, undone after the block."""
    mine = Path(__file__).relative_to(ROOT).as_posix()
    found = [f"{path}:{getattr(node, 'lineno', '?')}" for path, tree in _sources("tests").items()
             if path not in ("tests/helpers/registries.py", mine) for node in ast.walk(tree)
             if (isinstance(node, ast.Attribute) and node.attr in TOOLCHAIN_REGISTRY)
             or (isinstance(node, ast.Name) and node.id in TOOLCHAIN_REGISTRY)
             or (isinstance(node, ast.alias) and node.name in TOOLCHAIN_REGISTRY)
             or (isinstance(node, ast.Constant) and node.value in TOOLCHAIN_REGISTRY)]
    assert found == [], f"the toolchain registry changed outside tests/helpers/registries.py: {found}"
