"""A config that disagrees with its tensors (issue 24): refused from the tensor names, before any per-layer
structure is built from the config's numbers."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgellm import BUNDLED_MODEL_DIR
from edgellm.cli import main

MEMORY_CAP = 512 * 2**20  # inspect of the bundled stories260K needs ~40 MB


def _with_layers(tmp_path: Path, layers: int) -> Path:
    d = tmp_path / "ck"
    shutil.copytree(BUNDLED_MODEL_DIR, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_a_million_layers_is_bad_input_in_a_second(tmp_path: Path) -> None:
    """num_hidden_layers 1000000 over stories260K's 5 layers took 29 s and 2.9 GB to end in exit 3 (out of memory)."""
    d = _with_layers(tmp_path, 1_000_000)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "edgellm", "inspect", str(d)], capture_output=True, text=True,
                          timeout=60, preexec_fn=_capped)
    took = time.monotonic() - t0
    assert done.returncode == 2, done.stderr
    assert "num_hidden_layers 1000000" in done.stderr and "5 layers (0..4)" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert took < 10, took  # the interpreter's start included; the check itself is on names


@pytest.mark.parametrize("layers", [6, 1000])
def test_more_layers_than_the_tensors_hold_is_one_problem(tmp_path: Path, layers: int,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    d = _with_layers(tmp_path, layers)
    assert main(["inspect", str(d)]) == 2
    err = capsys.readouterr().err
    problems = [ln for ln in err.splitlines() if ln.startswith("problem: ")]
    assert len(problems) == 1, err
    assert (f"config.json: num_hidden_layers {layers} disagrees with the tensors: they hold 5 layers (0..4)"
            in problems[0]), err
    assert main(["export", str(d), str(tmp_path / "onnx")]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err


def test_export_refuses_a_declared_20_gib_tensor_before_hashing_it(tmp_path: Path) -> None:
    """A tensor no family has, declared 20 GiB (the file sparse): inspect refused it in 0.7 s, export hashed the
    whole file for a minute first (the digest ran beside loading, and the interpreter waited for it)."""
    from tests.st_helpers import pack, split

    d = tmp_path / "ck"
    shutil.copytree(BUNDLED_MODEL_DIR, d)
    st = d / "model.safetensors"
    header, data = split(st.read_bytes())
    size = 20 * 2**30
    header["extra.weight"] = {"dtype": "F32", "shape": [size // 4], "data_offsets": [len(data), len(data) + size]}
    st.write_bytes(pack(header, data))
    with st.open("r+b") as fp:
        fp.truncate(st.stat().st_size + size)  # sparse: no disk spent
    for command in ("inspect", "export"):
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "edgellm", command, str(d), *([str(tmp_path / "onnx")]
                                                                                  if command == "export" else [])],
                              capture_output=True, text=True, timeout=30)
        took = time.monotonic() - t0
        assert done.returncode == 2, done.stderr
        assert "extra.weight" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert took < 15, (command, took)
