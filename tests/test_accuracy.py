"""`edgellm eval`: real engines (the session fixtures) against real transformers on the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from edgellm.accuracy import EvalOptions, greedy_compare, make_windows, reference_device, window_nll
from edgellm.cli import main
from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.synth import make_checkpoint
from edgellm.thresholds import DEFAULTS, Thresholds, resolve_thresholds
from edgellm.types import Precision

FAST = ["--max-tokens", "1024", "--greedy-tokens", "16"]


def _eval(capsys: pytest.CaptureFixture[str], engine: Path, ckpt: Path, out: Path, *extra: str) -> tuple[int, str]:
    rc = main(["eval", "--engine-dir", str(engine), "--checkpoint", str(ckpt), "--output", str(out), *extra])
    return rc, capsys.readouterr().err


def test_eval_fp32_passes_with_every_check_reported(stories_engine, tmp_path, capsys) -> None:
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine.engine_dir, stories_engine.ckpt_dir, out)
    report = json.loads(out.read_text())
    assert rc == 0, err
    assert report["passed"] is True and report["failed_checks"] == []
    assert report["precision"] == "fp32"
    checks = report["checks"]
    assert set(checks) == {"outputs_finite", "tokenizer_match", "logits_max_abs_diff", "logits_min_cosine",
                           "greedy_match_fraction", "perplexity_rel_diff", "top1_agreement"}
    for c in checks.values():
        assert {"value", "threshold", "op", "passed"} <= set(c) and c["passed"] is True
    assert checks["logits_max_abs_diff"]["threshold"] == 1e-3
    assert 0 <= checks["logits_max_abs_diff"]["value"] <= 1e-3
    assert checks["greedy_match_fraction"] == {**checks["greedy_match_fraction"], "value": 1.0, "threshold": 1.0}
    assert report["greedy_tokens"] == 64
    assert all(g["matched"] == g["total"] for g in report["greedy"])
    # stories260K is really trained: its perplexity on TinyStories is low, and the engine's equals the reference's
    assert 1.5 < report["reference_perplexity"] < 20
    assert report["engine_perplexity"] == pytest.approx(report["reference_perplexity"], rel=1e-4)
    assert report["perplexity_tokens"] > 2000
    assert report["timings"]["reference_load_s"] > 0
    assert report["auto_tokenizer"] == {"class": "LlamaTokenizer", "matches_engine": True}
    # transformers ran where the ORT engine runs, in fp32
    assert report["engine_backend"] == "ort"
    assert report["reference_device"] == {"device": "cpu", "name": None, "dtype": "fp32",
                                          "chosen_as": "where the ort engine runs"}


def test_eval_fp16_perplexity_within_one_percent(stories_engine_fp16, tmp_path, capsys) -> None:
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine_fp16.engine_dir, stories_engine_fp16.ckpt_dir, out,
                    "--max-tokens", "2048")
    report = json.loads(out.read_text())
    assert rc == 0, err
    assert report["precision"] == "fp16"  # from the engine, not from a flag
    ppl = report["checks"]["perplexity_rel_diff"]
    assert ppl["threshold"] == 0.01 and ppl["value"] <= 0.01 and ppl["passed"]
    assert "greedy_match_fraction" not in report["checks"]  # fp16 is not held to exact greedy agreement...
    assert report["checks"]["greedy_divergence_margin"]["passed"]  # ...only to diverging at near-ties
    # fp16 rounding is visible but small
    assert 0 < max(p["max_abs_diff"] for p in report["logits"]) < 0.5


def test_eval_fails_on_an_engine_of_another_checkpoint(stories_engine, ckpts, tmp_path, capsys) -> None:
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine.engine_dir, ckpts.qwen2, out, *FAST)
    report = json.loads(out.read_text())
    assert rc == 1
    assert "error (test_failure)" in err and "logits_max_abs_diff" in err and len(err.strip().splitlines()) == 1
    assert report["passed"] is False
    assert {"logits_max_abs_diff", "perplexity_rel_diff", "greedy_match_fraction"} <= set(report["failed_checks"])
    assert report["config_differences"]["model_type"] == ["llama", "qwen2"]
    # same tokenizer.json, so the enforced check passes; transformers 5's AutoTokenizer swaps in its own Qwen2
    # class for model_type qwen2 and tokenizes this Llama vocabulary differently: reported, not enforced
    assert report["checks"]["tokenizer_match"]["passed"] is True
    assert report["auto_tokenizer"] == {"class": "Qwen2Tokenizer", "matches_engine": False}


def test_eval_catches_a_small_weight_perturbation(stories_engine, ckpts, tmp_path, capsys) -> None:
    """Same shapes, same tokenizer, one tensor nudged: the logits check must notice."""
    ckpt = ckpts.copy("stories", tmp_path / "nudged")
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.4.mlp.down_proj.weight"
    rng = np.random.default_rng(0)
    tensors[name] = tensors[name] + rng.normal(0, 0.01, tensors[name].shape).astype(np.float32)
    save_file(tensors, ckpt / "model.safetensors")
    out = tmp_path / "eval.json"
    rc, _ = _eval(capsys, stories_engine.engine_dir, ckpt, out, *FAST)
    report = json.loads(out.read_text())
    assert rc == 1 and report["passed"] is False
    assert report["checks"]["logits_max_abs_diff"]["value"] > 1e-3
    assert "logits_max_abs_diff" in report["failed_checks"]


def test_eval_vocab_mismatch_is_a_configuration_error(stories_engine, tmp_path, capsys) -> None:
    ckpt = make_checkpoint(tmp_path / "big_vocab", "llama", vocab_size=640)
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine.engine_dir, ckpt, out)
    assert rc == 2
    assert "vocab_size 512" in err and "640" in err
    assert not out.exists()


def test_eval_thresholds_file_per_precision_takes_effect(stories_engine, tmp_path, capsys) -> None:
    file = tmp_path / "t.yaml"
    file.write_text("fp32:\n  logits_max_abs_diff: 1.0e-12\nfp16:\n  ppl_max_rel_diff: 0.5\n")
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine.engine_dir, stories_engine.ckpt_dir, out, "--thresholds", str(file),
                    "--min-top1-agreement", "0.5", *FAST)
    report = json.loads(out.read_text())
    assert rc == 1, err
    assert report["failed_checks"] == ["logits_max_abs_diff"]
    assert report["checks"]["logits_max_abs_diff"]["threshold"] == 1e-12
    assert report["checks"]["top1_agreement"]["threshold"] == 0.5


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--engine-dir", "/nonexistent/engine"], "engine dir /nonexistent/engine not found"),
        (["--text", "/nonexistent/text.txt"], "text file /nonexistent/text.txt not found"),
        (["--max-tokens", "1"], "--max-tokens 1: must be >= 2"),
        (["--greedy-tokens", "600"], "over the engine's max_seq_len 512"),
        (["--thresholds", "{bad_thresholds}"], "unknown threshold(s) 'logit_diff'"),
        (["--min-cosine", "1.5"], "logits_min_cosine=1.5: expected a fraction in [0, 1]"),
        (["--reference-device", "cuda"], "reference device cuda is not available here (needs"),
    ],
)
def test_eval_bad_input_exits_2(stories_engine, tmp_path, capsys, args, needle) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"logit_diff": 0.1}')
    flags = {"--engine-dir": str(stories_engine.engine_dir), "--checkpoint": str(stories_engine.ckpt_dir),
             "--output": str(tmp_path / "o.json")}
    flags.update({k: v.format(bad_thresholds=bad) for k, v in zip(args[::2], args[1::2], strict=True)})
    assert main(["eval", *[x for kv in flags.items() for x in kv]]) == 2
    err = capsys.readouterr().err
    assert "error (configuration)" in err and needle in err
    assert not (tmp_path / "o.json").exists()


# --- the pieces, on hand-made numbers -----------------------------------------------------------------------
def test_reference_device_is_where_the_engine_runs_or_the_flag_never_a_fallback(tmp_path, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a GPU machine
    assert reference_device("ort", None) == ("cpu", "where the ort engine runs")
    assert reference_device("torch-cuda", "cpu") == ("cpu", "--reference-device")
    with pytest.raises(UnsupportedError, match="reference device cuda is not available here") as err:
        reference_device("torch-cuda", None)
    assert "chosen as where the torch-cuda engine runs; pass --reference-device cpu" in str(err.value)
    with pytest.raises(UnsupportedError, match="chosen as --reference-device"):
        reference_device("ort", "cuda")
    with pytest.raises(ConfigurationError, match="unknown backend 'tpu'"):
        reference_device("tpu", None)
    # a stored reference fixed its device when it was made
    with pytest.raises(ConfigurationError, match="--reference-device: the reference file"):
        EvalOptions(engine_dir=tmp_path, reference=tmp_path / "ref.npz", reference_device="cpu").validate()
    with pytest.raises(ConfigurationError, match="--reference-device 'gpu': valid: cpu, cuda"):
        EvalOptions(engine_dir=tmp_path, checkpoint=tmp_path, reference_device="gpu").validate()


def test_bf16_has_its_own_default_thresholds_with_the_fp16_checks() -> None:
    bf16, fp16 = resolve_thresholds(Precision.BF16), DEFAULTS[Precision.FP16]
    assert set(bf16.enabled()) == set(fp16.enabled())
    assert bf16.top1_min_agreement < fp16.top1_min_agreement  # bf16 rounds 8x coarser than fp16
    assert bf16.greedy_max_divergence_margin > fp16.greedy_max_divergence_margin


def test_thresholds_defaults_overrides_and_errors(tmp_path) -> None:
    assert resolve_thresholds(Precision.FP32) == DEFAULTS[Precision.FP32]
    assert resolve_thresholds(Precision.FP16, overrides={"ppl_max_rel_diff": 0.02}).ppl_max_rel_diff == 0.02
    flat = tmp_path / "flat.json"
    flat.write_text('{"logits_min_cosine": 0.9, "top1_min_agreement": null}')
    t = resolve_thresholds(Precision.FP32, flat)
    assert t.logits_min_cosine == 0.9 and t.top1_min_agreement is None and t.logits_max_abs_diff == 1e-3
    mixed = tmp_path / "mixed.json"
    mixed.write_text('{"fp32": {}, "logits_min_cosine": 0.9}')
    with pytest.raises(ConfigurationError, match="mixes precision keys"):
        resolve_thresholds(Precision.FP32, mixed)
    with pytest.raises(ConfigurationError, match="no default accuracy thresholds for precision 'int4_gptq'"):
        resolve_thresholds(Precision.INT4_GPTQ)
    assert resolve_thresholds(Precision.INT4_GPTQ, overrides={"ppl_max_rel_diff": 0.1}).ppl_max_rel_diff == 0.1
    assert resolve_thresholds(Precision.INT4_AWQ).enabled() == {"ppl_max_rel_diff": 0.05, "top1_min_agreement": 0.85,
                                                                "tokenizer_match": True}
    with pytest.raises(ConfigurationError, match="every check is disabled"):
        Thresholds(tokenizer_match=None)
    txt = tmp_path / "t.txt"
    txt.write_text("logits_min_cosine: 0.9")
    with pytest.raises(ConfigurationError, match="unknown suffix '\\.txt'"):
        resolve_thresholds(Precision.FP32, txt)


def test_greedy_compare_prefix_margin_and_eos() -> None:
    steps = [np.array([0.0, 5.0, 1.0, 4.9]), np.array([3.0, 0.0, 1.0, 0.0]), np.array([0.0, 0.0, 9.0, 0.0])]
    # identical, both end with EOS (2): the engine's output holds the EOS id, finish_reason "eos"
    same = greedy_compare([1, 0, 2], steps, [1, 0, 2], "eos", {2})
    assert (same["matched"], same["total"], same["fraction"], same["divergence_margin"]) == (3, 3, 1.0, 0.0)
    # diverges at step 0 where the reference's lead of token 1 over token 3 is 0.1: a near-tie
    tie = greedy_compare([1, 0, 2], steps, [3, 3, 3], "length", {2})
    assert tie["matched"] == 0 and tie["fraction"] == 0.0 and tie["divergence_margin"] == pytest.approx(0.1)
    # diverges at step 1 by stopping early with EOS where the reference (3.0 vs 1.0) went on: margin 2
    early = greedy_compare([1, 0, 2], steps, [1, 2], "eos", {2})
    assert early["matched"] == 1 and early["total"] == 3 and early["divergence_margin"] == pytest.approx(2.0)


def test_windows_and_nll() -> None:
    assert make_windows(list(range(10)), 4, 9) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # a 1-token tail predicts nothing
    assert make_windows(list(range(10)), 4, 100) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8], [1, 1, 1]], dtype=np.float32))
    nll, n = window_nll(logits, [0, 1, 2])
    assert n == 2 and nll == pytest.approx(-np.log(0.25) - np.log(0.8), rel=1e-6)


def test_checkpoint_eos_ids_include_generation_config(ckpts, tmp_path) -> None:
    from edgellm.accuracy import checkpoint_eos_ids
    from edgellm.config import ModelConfig

    ckpt = ckpts.copy("llama", tmp_path / "llama")
    (ckpt / "generation_config.json").write_text('{"eos_token_id": [2, 7]}')
    assert checkpoint_eos_ids(ckpt, ModelConfig.load(ckpt)) == {2, 7}


def test_eval_fails_when_the_checkpoint_tokenizes_differently(stories_engine, ckpts, tmp_path, capsys) -> None:
    """Same weights, but the checkpoint's tokenizer adds no BOS: only the tokenizer check may fail, and it does."""
    ckpt = ckpts.copy("stories", tmp_path / "no_bos")
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok["post_processor"]["single"] = [{"Sequence": {"id": "A", "type_id": 0}}]
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    (ckpt / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": False}))
    out = tmp_path / "eval.json"
    rc, err = _eval(capsys, stories_engine.engine_dir, ckpt, out, *FAST)
    report = json.loads(out.read_text())
    assert rc == 1, err
    assert report["failed_checks"] == ["tokenizer_match"]
    assert "differs on 4 prompt(s) and on the text file" in report["checks"]["tokenizer_match"]["detail"]
