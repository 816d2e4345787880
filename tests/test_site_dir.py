"""A lab's site directory (``EDGEFARM_SITE_DIR`` / ``edgefarm --site-dir``): its device types, lists, inventory and
catalog join the packaged ones without a file of the package changing, and the plan refuses what cannot fit.

Device types are read when the farm's packages are imported, so each case runs ``edgefarm`` in its own process."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGED = [REPO / "devices" / "types", REPO / "devices" / "inventory", REPO / "test_lists",
            REPO / "flows" / "matrices"]

TINY_CPU = """\
# a CPU board with too little memory for a 140M-parameter model at fp32, enough for stories260K
name: tiny-cpu
description: a small x86-64 CPU board
arch: x86_64
sm: null
memory_gb: 0.35
os_reserve_gb: 0.25
toolchains: [edgellm-ort]
precisions: [fp32, fp16]
kv_cache_precisions: [fp32, fp16]
lm_head_precisions: [fp32, fp16]
"""
BIG = """\
models:
  site-llama-big:  # ~140M parameters: 0.5 GB of fp32 weights
    synthetic: {family: llama, seed: 0, hidden_size: 1024, intermediate_size: 2816, num_hidden_layers: 12,
                num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 512}
"""
LIST = """\
name: site_fit
stage: l0
description: what fits on the lab's tiny CPU board
platforms:
  terms: [tiny-cpu]
defaults:
  max_seq_len: 256
  max_batch_size: 2
  max_input_len: 128
  stages: [export, build, infer]
tests:
  - model: stories260K
    precision: fp32
  - model: site-llama-big
    precision: fp32
"""


def _package_digest() -> str:
    h = hashlib.sha256()
    for root in PACKAGED:
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(path).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for kind, name, text in (("device_types", "tiny-cpu.yaml", TINY_CPU), ("catalog", "lab.yml", BIG),
                             ("lists", "site_fit.yml", LIST),
                             ("inventory", "tiny-cpu-1.yaml",
                              "type: tiny-cpu\ntransport: local\nwork_dir: devices/tiny-cpu-1\n")):
        (root / kind).mkdir(parents=True, exist_ok=True)
        (root / kind / name).write_text(text)
    return root


def _edgefarm(*args: str, site: Path | None, data: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGEFARM_DATA_DIR": str(data), "PYTHONPATH": str(REPO)}
    env.pop("EDGEFARM_SITE_DIR", None)
    env.pop("EDGEFARM_INVENTORY", None)
    if site is not None:
        env["EDGEFARM_SITE_DIR"] = str(site)
    return subprocess.run([sys.executable, "-m", "edgefarm.cli", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def test_a_site_device_type_too_small_marks_what_cannot_fit_not_applicable(site: Path, tmp_path: Path) -> None:
    before = _package_digest()
    done = _edgefarm("run", "--priority", "site_fit", "--dry-run", "--format", "json", site=site,
                     data=tmp_path / "data")
    assert done.returncode == 0, done.stderr
    jobs = {j["model"]: j for j in json.loads(done.stdout)["jobs"]}
    big, small = jobs["site-llama-big"], jobs["stories260K"]
    assert big["platform"] == "tiny-cpu" and big["decision"] == "not_applicable"
    needs = big["memory"]["estimate_gb"]
    assert needs > 0.5
    assert big["reason"].startswith(f"needs {needs:.1f} GB; tiny-cpu has 0.1 GB usable (0.35 GB less 0.25 GB")
    assert small["decision"] == "run" and small["devices"] == ["tiny-cpu-1"], small
    assert 0 < small["memory"]["estimate_gb"] < 0.1
    assert set(small["memory"]["parts"]) == {"weights", "embeddings", "lm_head", "kv_cache", "activations",
                                             "runtime_reserve"}
    assert _package_digest() == before


def test_lists_validate_says_the_same_and_names_the_site_files(site: Path, tmp_path: Path) -> None:
    """A row too big for one of its platforms is a warning naming the figures (the plan marks it not applicable
    there; a list may name several platforms); --strict makes it an error."""
    done = _edgefarm("lists", "validate", site=site, data=tmp_path / "data")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"site: {site / 'lists' / 'site_fit.yml'}" in done.stdout
    warned = [line for line in done.stdout.splitlines() if line.startswith("WARNING")]
    assert len(warned) == 1 and "site-llama-big" in warned[0], done.stdout
    assert "memory: not applicable on tiny-cpu: needs 0.6 GB; tiny-cpu has 0.1 GB usable" in warned[0]
    assert _edgefarm("lists", "validate", "--strict", site=site, data=tmp_path / "data").returncode == 2


def test_devices_types_shows_where_each_came_from_and_a_site_file_replaces_its_namesake(
        site: Path, tmp_path: Path) -> None:
    orin = (REPO / "devices" / "types" / "orin.yaml").read_text().replace("memory_gb: 64", "memory_gb: 32")
    (site / "device_types" / "orin.yaml").write_text(orin)
    done = _edgefarm("--site-dir", str(site), "devices", "types", "--json", site=None, data=tmp_path / "data")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["orin"]["origin"] == "site" and rows["orin"]["memory_gb"] == 32
    assert rows["tiny-cpu"]["origin"] == "site" and rows["tiny-cpu"]["usable_memory_gb"] == 0.1
    assert rows["thor"]["origin"] == "packaged" and rows["orin-nano-8gb"]["usable_memory_gb"] == 6.9
    assert {"orin-nano-8gb", "orin-nx-16gb", "agx-orin-32gb"} <= set(rows)


def test_a_bad_site_is_a_configuration_error_naming_it(site: Path, tmp_path: Path) -> None:
    done = _edgefarm("devices", "types", site=tmp_path / "nowhere", data=tmp_path / "data")
    assert done.returncode == 2 and "nowhere" in done.stderr and "is not a directory" in done.stderr
    (site / "device_types" / "broken.yaml").write_text(TINY_CPU.replace("name: tiny-cpu", "name: other"))
    done = _edgefarm("devices", "types", site=site, data=tmp_path / "data")
    assert done.returncode == 2
    assert f"{site / 'device_types' / 'broken.yaml'}: name: 'other' must equal the file name 'broken'" in done.stderr
    (site / "device_types" / "broken.yaml").unlink()
    (site / "stuff").mkdir()
    done = _edgefarm("devices", "types", site=site, data=tmp_path / "data")
    assert done.returncode == 2 and "unknown subdirectory stuff; valid: device_types, lists" in done.stderr


def test_a_bad_site_path_cannot_drive_the_terminal(site: Path, tmp_path: Path) -> None:
    (site / "st\x1b[2Juff").mkdir()
    done = _edgefarm("devices", "types", site=site, data=tmp_path / "data")
    assert done.returncode == 2 and "error (configuration)" in done.stderr
    assert "\x1b" not in done.stderr and "st\\x1b[2Juff" in done.stderr


def test_a_site_matrix_replaces_the_shipped_nightly(site: Path, tmp_path: Path) -> None:
    (site / "matrices").mkdir()
    (site / "matrices" / "nightly.yml").write_text(
        "name: lab-nightly\nmodels: [stories260K, site-llama-big]\nprecisions: [fp32]\nplatforms: [tiny-cpu]\n"
        "defaults: {max_seq_len: 256, max_batch_size: 2, max_input_len: 128, stages: [export, build, infer]}\n")
    done = _edgefarm("nightly", "--dry-run", "--format", "json", site=site, data=tmp_path / "data")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["name"] == "lab-nightly"
    decided = {j["model"]: j["decision"] for j in plan["jobs"]}
    assert decided == {"stories260K": "run", "site-llama-big": "not_applicable"}


def test_the_settings_of_a_process_without_the_command_line_resolve(tmp_path: Path) -> None:
    """A Prefect worker or any process that never imported the command line resolves its settings (it raised
    KeyError: 'set' before the site directory was configured by the CLI's import)."""
    import subprocess
    import sys

    code = ("import sys; from edgefarm.flows.settings import Settings; from edgefarm.devices.site import current; "
            "Settings.resolve(data_dir=sys.argv[1]); print(current())")
    env = {k: v for k, v in os.environ.items() if k != "EDGEFARM_SITE_DIR"}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
