"""``edgellm`` CLI edges: bad sampling values and text, --threads bounds, hostile engine manifests, and the
exit codes of an infrastructure failure (3) and an internal bug (4) through the real command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgellm import BUNDLED_MODEL_DIR
from edgellm.cli import main
from edgellm.runtime.engine import max_threads


def _infer(tmp_path: Path, engine_dir: Path, payload: object, capsys: pytest.CaptureFixture[str],
           *extra: str) -> tuple[int, str]:
    req, out = tmp_path / "req.json", tmp_path / "out.json"
    req.write_text(payload if isinstance(payload, str) else json.dumps(payload))
    rc = main(["infer", "--engine-dir", str(engine_dir), "--input-file", str(req), "--output-file", str(out),
               *extra])
    return rc, capsys.readouterr().err


def _one_line(err: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_subnormal_temperature_is_bad_input(stories_engine, tmp_path, capsys) -> None:
    payload = {"requests": [{"id": "r", "prompt": "Once", "temperature": 1e-310, "seed": 1}]}
    rc, err = _infer(tmp_path, stories_engine.engine_dir, payload, capsys)
    assert rc == 2 and "temperature 1e-310 must be 0 (greedy) or a number in [0.001, 100]" in err
    _one_line(err)
    ok = {"requests": [{"id": "r", "prompt": "Once", "temperature": 0.001, "seed": 1, "max_new_tokens": 4}]}
    assert _infer(tmp_path, stories_engine.engine_dir, ok, capsys)[0] == 0


def test_lone_surrogate_is_bad_input(stories_engine, tmp_path, capsys) -> None:
    raw = '{"requests": [{"id": "r", "prompt": "Once \\ud800 upon"}, {"id": "s", "prompt": "x", "stop": ["\\udfff"]}]}'
    rc, err = _infer(tmp_path, stories_engine.engine_dir, raw, capsys)
    assert rc == 2, err
    assert "request 'r': prompt has a lone surrogate '\\ud800' at index 5: not valid Unicode text" in err
    assert "request 's': stop[0] has a lone surrogate" in err
    _one_line(err)


@pytest.mark.parametrize("threads", ["100000", "0", "-3"])
def test_threads_out_of_range_is_bad_input(stories_engine, tmp_path, capsys, threads: str) -> None:
    payload = {"requests": [{"id": "r", "prompt": "Once", "max_new_tokens": 2}]}
    rc, err = _infer(tmp_path, stories_engine.engine_dir, payload, capsys, "--threads", threads)
    assert rc == 2 and f"--threads {threads}: must be an integer in 1..{max_threads()}" in err, err
    _one_line(err)
    rc = main(["bench", "--engine-dir", str(stories_engine.engine_dir), "--mode", "decode", "--threads", threads])
    assert rc == 2 and f"--threads {threads}: must be an integer in 1..{max_threads()}" in capsys.readouterr().err


def _engine_copy(stories_engine, tmp_path: Path) -> tuple[Path, dict]:
    engine = tmp_path / "engine"
    shutil.copytree(stories_engine.engine_dir, engine)
    return engine, json.loads((engine / "engine_manifest.json").read_text())


def _save(engine: Path, manifest: dict) -> None:
    (engine / "engine_manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("listed", ["../secret.bin", "{abs}", "link/secret.bin", "./../secret.bin"])
def test_manifest_paths_outside_the_engine_are_refused_unread(stories_engine, tmp_path, capsys, listed) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"s" * 12345)  # a size that must not leak into the error
    engine, manifest = _engine_copy(stories_engine, tmp_path)
    (engine / "link").symlink_to(tmp_path)
    listed = listed.format(abs=secret)
    manifest["files"][listed] = {"sha256": "0" * 64, "bytes": 1}
    _save(engine, manifest)
    rc, err = _infer(tmp_path, engine, {"requests": [{"id": "r", "prompt": "x"}]}, capsys)
    assert rc == 2, err
    assert f"lists {listed!r}, which is not a file inside {engine}" in err
    assert "12345" not in err
    _one_line(err)


def test_manifest_omitting_the_tokenizer_is_refused(stories_engine, tmp_path, capsys) -> None:
    engine, manifest = _engine_copy(stories_engine, tmp_path)
    del manifest["files"]["tokenizer.json"]
    _save(engine, manifest)
    (engine / "tokenizer.json").write_text("{}")  # unverified: would be read as the tokenizer
    rc, err = _infer(tmp_path, engine, {"requests": [{"id": "r", "prompt": "x"}]}, capsys)
    assert rc == 2 and "does not list tokenizer.json, which the runtime reads" in err, err


# A model family plugin defined here, registered before the real CLI runs: its bug must be exit 4, one line.
PLUGIN = textwrap.dedent(
    """
    import sys
    from edgellm.errors import BugError
    from edgellm.models.base import ModelFamily, _load_builtin_families, register_family

    _load_builtin_families()

    @register_family
    class Broken(ModelFamily):
        name = "broken"
        model_types = ("broken-test",)
        architectures = ("BrokenForCausalLM",)

        @classmethod
        def expected_parameters(cls, cfg):
            if sys.argv[1] == "invariant":
                raise BugError("broken family: expected_parameters called before check_config")
            return {}["model.embed_tokens.weight"]  # an unexpected KeyError

    from edgellm.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.mark.parametrize(
    ("how", "needle"),
    [
        ("unexpected", "edgellm inspect: internal error (bug): KeyError: 'model.embed_tokens.weight'"),
        ("invariant", "edgellm inspect: error (bug): broken family: expected_parameters called before check_config"),
    ],
)
def test_a_bug_is_exit_4_in_one_line(tmp_path: Path, how: str, needle: str) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(BUNDLED_MODEL_DIR, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    config.update(model_type="broken-test", architectures=["BrokenForCausalLM"])
    (ckpt / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-c", PLUGIN, how, "inspect", str(ckpt)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    debug = subprocess.run([sys.executable, "-c", PLUGIN, how, "--debug", "inspect", str(ckpt)],
                           capture_output=True, text=True, timeout=300, check=False)
    assert debug.returncode == 4 and "Traceback" in debug.stderr  # the traceback is one flag away
