"""`edgellm reference` + `edgellm eval --reference`: same verdicts and values as `--checkpoint`, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edgellm.accuracy import greedy_compare
from edgellm.cli import main
from edgellm.reference import FORMAT, GREEDY_TOP_K, load_reference, top_logits

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--max-tokens", "1024", "--greedy-tokens", "16"]


@pytest.fixture(scope="session")
def stories_reference(ckpts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "stories.npz"
    assert main(["reference", str(ckpts.stories), "--output", str(out)]) == 0
    return out


def _eval(engine: Path, source: list[str], out: Path, *extra: str) -> tuple[int, dict]:
    rc = main(["eval", "--engine-dir", str(engine), *source, "--output", str(out), *extra])
    return rc, json.loads(out.read_text()) if out.exists() else {}


def _same_report(a: dict, b: dict) -> None:
    assert a["passed"] == b["passed"] and a["failed_checks"] == b["failed_checks"]
    assert set(a["checks"]) == set(b["checks"])
    for name, c in a["checks"].items():
        d = b["checks"][name]
        assert (c["passed"], c["threshold"], c["op"]) == (d["passed"], d["threshold"], d["op"]), name
        if isinstance(c["value"], float):
            assert c["value"] == pytest.approx(d["value"], rel=1e-5, abs=1e-6), name
        else:
            assert c["value"] == d["value"], name
    for k in ("reference_perplexity", "engine_perplexity"):
        assert a[k] == pytest.approx(b[k], rel=1e-6)
    for k in ("perplexity_tokens", "perplexity_windows", "window_tokens", "greedy_tokens", "auto_tokenizer",
              "checkpoint_sha256"):
        assert a[k] == b[k], k
    assert [g["matched"] for g in a["greedy"]] == [g["matched"] for g in b["greedy"]]


@pytest.mark.parametrize("which", ["fp32", "fp16"])
def test_reference_mode_matches_checkpoint_mode(which, stories_engine, stories_engine_fp16, stories_reference,
                                                tmp_path, capsys) -> None:
    built = stories_engine if which == "fp32" else stories_engine_fp16
    rc_ref, by_ref = _eval(built.engine_dir, ["--reference", str(stories_reference)], tmp_path / "r.json")
    rc_ckpt, by_ckpt = _eval(built.engine_dir, ["--checkpoint", str(built.ckpt_dir)], tmp_path / "c.json")
    err = capsys.readouterr().err
    assert rc_ref == rc_ckpt == 0, err
    _same_report(by_ref, by_ckpt)
    assert by_ref["precision"] == which and by_ref["window_tokens"] == 128 and by_ref["greedy_tokens"] == 64
    assert by_ref["reference_file"] == str(stories_reference) and by_ckpt["reference_file"] is None
    assert by_ref["reference_device"]["device"] == by_ckpt["reference_device"]["device"] == "cpu"
    assert 1.5 < by_ref["reference_perplexity"] < 20 and by_ref["perplexity_tokens"] > 3000
    if which == "fp32":
        assert by_ref["checks"]["logits_max_abs_diff"]["value"] <= 1e-3
        assert all(g["matched"] == g["total"] for g in by_ref["greedy"])
    else:
        assert 0 < max(p["max_abs_diff"] for p in by_ref["logits"]) < 0.5
        assert by_ref["checks"]["greedy_divergence_margin"]["passed"]


def test_reference_thresholds_still_apply(stories_engine, stories_reference, tmp_path, capsys) -> None:
    rc, report = _eval(stories_engine.engine_dir, ["--reference", str(stories_reference)], tmp_path / "r.json",
                       "--max-logits-diff", "1e-12")
    err = capsys.readouterr().err
    assert rc == 1 and "error (test_failure)" in err and "logits_max_abs_diff" in err
    assert report["failed_checks"] == ["logits_max_abs_diff"]
    assert report["checks"]["logits_max_abs_diff"]["threshold"] == 1e-12


def test_eval_reference_imports_no_torch_or_transformers(stories_engine, stories_reference, tmp_path) -> None:
    out = tmp_path / "r.json"
    code = ("import sys; from edgellm.cli import main; "
            f"rc = main(['eval', '--engine-dir', {str(stories_engine.engine_dir)!r}, '--reference', "
            f"{str(stories_reference)!r}, '--output', {str(out)!r}]); "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "assert rc == 0 and not bad, (rc, bad); print('CLEAN')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert res.returncode == 0 and "CLEAN" in res.stdout, res.stderr[-2000:]
    assert json.loads(out.read_text())["passed"] is True


def test_reference_of_another_checkpoint_exits_2(stories_engine, ckpts, tmp_path, capsys) -> None:
    """Same vocabulary and tokenizer, other weights: the engine's recorded checkpoint digest says no."""
    other = tmp_path / "qwen2.npz"
    assert main(["reference", str(ckpts.qwen2), "--output", str(other), *FAST]) == 0
    capsys.readouterr()
    rc, report = _eval(stories_engine.engine_dir, ["--reference", str(other)], tmp_path / "r.json")
    err = capsys.readouterr().err
    assert rc == 2 and report == {}
    assert f"reference file {other} was made from checkpoint sha256" in err and "error (configuration)" in err
    # an engine manifest without the digest (older builds) still falls back to the config comparison
    engine = tmp_path / "engine"
    import shutil

    shutil.copytree(stories_engine.engine_dir, engine)
    manifest = json.loads((engine / "engine_manifest.json").read_text())
    manifest["source_export"]["checkpoint_sha256"] = None
    (engine / "engine_manifest.json").write_text(json.dumps(manifest))
    rc, _ = _eval(engine, ["--reference", str(other)], tmp_path / "r2.json")
    err = capsys.readouterr().err
    assert rc == 2 and "model_type llama (engine) vs qwen2 (reference)" in err


def test_reference_window_over_engine_input_len_exits_2(stories_engine, ckpts, tmp_path, capsys) -> None:
    big = tmp_path / "w600.npz"
    assert main(["reference", str(ckpts.stories), "--output", str(big), "--window", "600", *FAST]) == 0
    capsys.readouterr()
    rc, _ = _eval(stories_engine.engine_dir, ["--reference", str(big)], tmp_path / "r.json")
    err = capsys.readouterr().err
    assert rc == 2 and "perplexity window 600 tokens" in err and "max_input_len 512" in err
    rc, _ = _eval(stories_engine.engine_dir, ["--checkpoint", str(ckpts.stories)], tmp_path / "c.json",
                  "--window", "600", *FAST)
    assert rc == 2 and "perplexity window 600 tokens (--window)" in capsys.readouterr().err


def _corrupt(src: Path, dest: Path, how: str) -> Path:
    data = src.read_bytes()
    if how == "truncated":
        dest.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        with zipfile.ZipFile(src) as z:
            info = z.getinfo("prompt0_logits.npy")
        pos = info.header_offset + 30 + len(info.filename) + 200  # inside the member's data
        dest.write_bytes(data[:pos] + bytes([data[pos] ^ 0xFF]) + data[pos + 1:])
    elif how == "npy":
        np.save(dest.open("wb"), np.zeros(3))
    elif how == "pickle":
        np.savez(dest, header=np.array([{"format": FORMAT}], dtype=object))
    elif how == "foreign":
        np.savez(dest, header=np.frombuffer(b'{"format": "something-else/1"}', dtype=np.uint8))
    elif how == "missing_array":
        with np.load(src, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k != "window0_top1"}
        np.savez(dest, **arrays)
    elif how == "text":
        dest.write_text("not a reference\n")
    return dest


@pytest.mark.parametrize("how", ["truncated", "flipped", "npy", "pickle", "foreign", "missing_array", "text"])
def test_corrupt_reference_exits_2_naming_the_file(how, stories_engine, stories_reference, tmp_path, capsys) -> None:
    bad = _corrupt(stories_reference, tmp_path / f"{how}.npz", how)
    rc, _ = _eval(stories_engine.engine_dir, ["--reference", str(bad)], tmp_path / "r.json")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"reference file {bad}" in err and "error (configuration)" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_eval_source_and_settings_are_validated(stories_engine, stories_reference, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--engine-dir", str(stories_engine.engine_dir)])
    assert exc.value.code == 2 and "one of the arguments --checkpoint --reference is required" in \
        capsys.readouterr().err
    rc, _ = _eval(stories_engine.engine_dir, ["--reference", str(stories_reference)], tmp_path / "r.json",
                  "--max-tokens", "100")
    err = capsys.readouterr().err
    assert rc == 2 and "--max-tokens: the reference file" in err
    rc, _ = _eval(stories_engine.engine_dir, ["--reference", str(tmp_path / "none.npz")], tmp_path / "r.json")
    assert rc == 2 and "none.npz not found" in capsys.readouterr().err
    assert main(["reference", str(tmp_path), "--output", str(tmp_path / "x.npz")]) == 2
    assert "has no config.json" in capsys.readouterr().err and not (tmp_path / "x.npz").exists()


def test_reference_file_contents(stories_reference, ckpts) -> None:
    ref = load_reference(stories_reference)
    h = ref.header
    assert h["format"] == FORMAT and h["settings"]["window"] == 128 and h["settings"]["max_tokens"] == 4096
    assert set(h["versions"]) == {"transformers", "torch"}
    assert len(h["checkpoint"]["sha256"]) == 64 and h["checkpoint"]["config"]["vocab_size"] == 512
    assert [len(lg) for lg in ref.prompt_logits] == [len(i) for i in ref.prompt_ids]
    assert all(lg.dtype == np.float32 and lg.shape[1] == 512 for lg in ref.prompt_logits)
    windows = ref.windows()
    assert all(len(w) <= 128 for w in windows) and sum(len(w) - 1 for w in windows) == h["perplexity_tokens"]
    assert all(s.exact for steps in ref.greedy_steps for s in steps)  # 512-token vocab < top-K: stored whole
    assert ref.device == {"device": "cpu", "name": None, "dtype": "fp32"}  # `edgellm reference` default
    del h["device"]  # a file made before the header said where: it ran on the CPU
    assert ref.device == {"device": "cpu", "name": None, "dtype": "fp32"}


def test_reference_on_an_absent_gpu_is_refused_not_moved_to_the_cpu(ckpts, tmp_path, capsys, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "ref.npz"
    assert main(["reference", str(ckpts.stories), "--output", str(out), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "reference device cuda is not available here (needs" in err and "Traceback" not in err
    assert not out.exists()


def test_sparse_greedy_margin_is_exact_in_top_k_and_a_lower_bound_outside() -> None:
    rng = np.random.default_rng(0)
    row = rng.normal(0, 3, 5000).astype(np.float32)
    eos = (7,)
    sparse = top_logits(row, GREEDY_TOP_K, eos)
    assert not sparse.exact and sparse.top() == int(np.argmax(row))
    order = np.argsort(-row)
    inside, outside = int(order[10]), int(order[4000])
    for tok, exact in ((inside, True), (outside, False), (7, True)):
        full = greedy_compare([int(order[0])], [row], [tok], "length", set())
        part = greedy_compare([int(order[0])], [sparse], [tok], "length", set())
        assert part["margin_exact"] is exact
        if exact:
            assert part["divergence_margin"] == pytest.approx(full["divergence_margin"], rel=1e-6)
        else:
            assert 0 < part["divergence_margin"] <= full["divergence_margin"]
            assert part["divergence_margin"] == pytest.approx(float(row[order[0]] - row[order[GREEDY_TOP_K - 1]]))


def test_a_checkpoint_cloned_with_git_has_the_identity_of_its_files(ckpts, tmp_path) -> None:
    """A Hugging Face repository cloned with git carries ``.git/``, which git rewrites on every checkout: the
    checkpoint's identity (what caches and bisection compare) is its files'."""
    from edgellm.reference import checkpoint_digest

    src = ckpts.copy("stories", tmp_path / "ckpt")
    plain = checkpoint_digest(src)
    (src / ".git" / "objects").mkdir(parents=True)
    (src / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (src / ".git" / "index").write_bytes(os.urandom(64))
    assert checkpoint_digest(src) == plain
    from edgellm.compiler.export import export_checkpoint

    manifest = export_checkpoint(src, tmp_path / "onnx")  # the export records the same identity
    assert json.loads((tmp_path / "onnx" / "export_manifest.json").read_text())["checkpoint"]["sha256"] == plain, (
        manifest)
    (src / "notes.txt").write_text("a file of the checkpoint counts\n")
    assert checkpoint_digest(src) != plain
