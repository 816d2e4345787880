"""onnxruntime-genai's parts, really run: its model builder on a tiny synthetic Llama (head_dim 16) at fp32 and
int4_wo, the read-back check, the device runner's infer / bench / logits as subprocesses of this interpreter, the
host's accuracy report against the float reference made as the farm makes it, and the refusals (stories260K's
head_dim 8, a missing onnxruntime_genai). Each export and the reference are made once per module (the builder runs
twice, 7-20 s each on 2 cores; the reference runs alongside them)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgefarm.toolchains.onnxruntime_genai import export as export_mod
from edgefarm.toolchains.onnxruntime_genai.accuracy import report
from edgefarm.toolchains.onnxruntime_genai.bench import bench_metrics
from edgefarm.toolchains.onnxruntime_genai.check import check_export
from edgefarm.toolchains.onnxruntime_genai.device import (
    RUNNER,
    bench_argv,
    exit_kind,
    infer_argv,
    logits_argv,
)
from edgefarm.toolchains.onnxruntime_genai.export import (
    INT4_BLOCK_SIZE,
    BuilderFailed,
    ExportResult,
    applicability,
    export,
)
from edgellm import BUNDLED_MODEL_DIR
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError, TestFailure, UnsupportedError
from edgellm.models.base import family_named
from edgellm.reference import DEFAULT_GREEDY_TOKENS, DEFAULT_WINDOW, load_reference
from edgellm.synth import make_checkpoint

EVAL_MAX_TOKENS = 1024  # tasks/reference.py's perplexity tokens: the reference is made as the farm makes it
LINEARS = 14  # 2 layers x (q, k, v, o, gate, up, down)
PY = sys.executable


def _runner_env(**extra: str) -> dict[str, str]:
    """The runner's environment on a device: no PYTHONPATH (it must need nothing of this repository)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return {**env, "HF_HUB_OFFLINE": "1", **extra}


def _run(argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_runner_env(**extra), check=False)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("genai-ckpt") / "tiny-llama", "llama")


@pytest.fixture(scope="module")
def made(ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Both exports and the float reference (``edgellm reference`` with the farm's settings, in parallel)."""
    root = tmp_path_factory.mktemp("genai")
    reference = root / "reference.npz"
    repo = Path(__file__).resolve().parents[1]
    ref_proc = subprocess.Popen(
        [PY, "-m", "edgellm", "reference", str(ckpt), "--output", str(reference), "--max-tokens",
         str(EVAL_MAX_TOKENS), "--greedy-tokens", str(DEFAULT_GREEDY_TOKENS), "--window", str(DEFAULT_WINDOW)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(repo), "HF_HUB_OFFLINE": "1"})
    try:
        exports = {p: export(ckpt, root / f"export-{p}", p, timeout=300, log=root / f"export-{p}.log")
                   for p in ("fp32", "int4_wo")}
        _, err = ref_proc.communicate(timeout=300)
        assert ref_proc.returncode == 0, err
        yield {"exports": exports, "reference": reference, "root": root}
    finally:
        if ref_proc.poll() is None:
            ref_proc.kill()
            ref_proc.wait()


# --- applicability and export ----------------------------------------------------------------------------------
def test_applicability_refuses_stories260k_by_its_head_dim_before_anything_runs(tmp_path: Path) -> None:
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    reason = applicability(config, "fp32")
    assert reason is not None and "head_dim 8" in reason and "multiple of 16" in reason
    assert "GroupQueryAttention" in reason
    with pytest.raises(UnsupportedError, match="head_dim 8"):
        export(BUNDLED_MODEL_DIR, tmp_path / "out", "fp32", timeout=60, log=tmp_path / "export.log")
    assert not (tmp_path / "export.log").exists() and not (tmp_path / "out").exists()  # the builder never ran


def test_applicability_names_bad_precision_and_architecture() -> None:
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "hidden_size": 64,
              "num_attention_heads": 4}
    reason = applicability(config, "int4_awq")
    assert reason is not None
    assert "precision 'int4_awq'" in reason and "fp32, int4_wo" in reason
    assert "GPT2LMHeadModel" in reason and "LlamaForCausalLM" in reason  # the valid ones are listed


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_tiny_family_is_applicable(family: str) -> None:
    cls = family_named(family)
    config = {"architectures": list(cls.architectures[:1]), "model_type": cls.model_types[0], **cls.tiny_config}
    assert applicability(config, "fp32") is None
    assert applicability(config, "int4_wo") is None


def test_exports_fp32_and_int4_read_back(made: dict, ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    exports: dict[str, ExportResult] = made["exports"]  # type: ignore[assignment]
    for precision, result in exports.items():
        assert (result.model_dir / "genai_config.json").is_file() and (result.model_dir / "model.onnx").is_file()
        assert result.wall_s > 0 and result.size_bytes > 0 and result.peak_rss_bytes and result.peak_rss_bytes > 2**20
        assert json.loads((result.out_dir / "export.json").read_text())["precision"] == precision
        assert not (result.out_dir / "model" / "cache").exists()
        assert result.argv[:3] == [PY, "-m", "onnxruntime_genai.models.builder"]
        check = check_export(result.out_dir, precision, config)
        assert check.passed, check.problems
        assert check.found == precision
    fp32 = check_export(exports["fp32"].out_dir, "fp32", config)
    assert fp32.matmulnbits == 0 and fp32.weight_dtypes == {"fp32": 11}  # 2 x (qkv, o, gate, up, down) + LM head
    assert len(fp32.float_linears) == LINEARS + 1 and fp32.lm_head_quantized is False
    int4 = check_export(exports["int4_wo"].model_dir, "int4_wo", config)
    assert exports["int4_wo"].quantization is not None
    assert exports["int4_wo"].quantization["block_size"] == INT4_BLOCK_SIZE
    assert "block_size=32" in exports["int4_wo"].argv and exports["int4_wo"].argv[7:9] == ["-p", "int4"]
    assert int4.quantization == {"bits": [4], "block_size": [INT4_BLOCK_SIZE], "accuracy_level": [4]}
    assert len(set(int4.quantized_linears) - {"lm_head"}) == LINEARS
    assert int4.lm_head_quantized is True and int4.embedding == "fp32"  # the builder's int4 takes the LM head too
    assert "14/14 decoder linears quantized, LM head int4" in int4.detail()


def test_check_fails_a_precision_that_was_not_applied(made: dict, ckpt: Path) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    exports: dict[str, ExportResult] = made["exports"]  # type: ignore[assignment]
    wrong = check_export(exports["int4_wo"].out_dir, "fp32", config)
    assert not wrong.passed and wrong.found == "int4_wo"
    assert "requested fp32 but the graph's weights are int4_wo" in wrong.problems
    with pytest.raises(TestFailure, match="requested fp32"):
        wrong.raise_problems()
    missing = check_export(exports["fp32"].out_dir, "int4_wo", config)
    assert not missing.passed and any("14 of 14 decoder linears are not MatMulNBits" in p for p in missing.problems)
    other = {**config, "num_hidden_layers": 3}
    assert any("num_hidden_layers 2, the checkpoint has 3" in p
               for p in check_export(exports["fp32"].out_dir, "fp32", other).problems)
    with pytest.raises(ConfigurationError, match="unknown precision 'int8_sq'"):
        check_export(exports["fp32"].out_dir, "int8_sq", config)


def test_builder_failure_carries_its_log_tail_and_leaves_nothing(ckpt: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    script = "import sys\nfor i in range(30): print(f'line {i}')\nsys.exit('ValueError: the builder broke')"
    monkeypatch.setattr(export_mod, "builder_argv", lambda *a: [PY, "-c", script])
    with pytest.raises(BuilderFailed) as info:
        export(ckpt, tmp_path / "out", "fp32", timeout=60, log=tmp_path / "b.log")
    assert info.value.kind is ErrorKind.TEST_FAILURE
    assert "exit 1" in str(info.value) and "line 29" in info.value.log_tail and "the builder broke" in str(info.value)
    assert "line 0\n" not in info.value.log_tail  # the tail, not the whole log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.log"]  # no output dir, no scratch dir
    monkeypatch.setattr(export_mod, "builder_argv", lambda *a: [PY, "-c", "import time; time.sleep(30)"])
    with pytest.raises(InfrastructureError, match="past its 1 s limit"):
        export(ckpt, tmp_path / "out", "fp32", timeout=1, log=tmp_path / "slow.log")


# --- the device runner -----------------------------------------------------------------------------------------
def test_runner_infer_writes_edgellm_infer_responses(made: dict, tmp_path: Path) -> None:
    ref = load_reference(made["reference"])  # type: ignore[arg-type]
    requests = {"requests": [
        {"id": "greedy", "prompt": ref.prompts[0], "max_new_tokens": DEFAULT_GREEDY_TOKENS, "temperature": 0.0},
        {"id": "ids", "input_ids": ref.prompt_ids[1], "max_new_tokens": 8, "temperature": 0.0},
        {"id": "sampled", "prompt": "Tom had a red ball. He", "max_new_tokens": 5, "temperature": 0.8, "seed": 1}]}
    (tmp_path / "req.json").write_text(json.dumps(requests))
    model_dir = str(made["exports"]["fp32"].model_dir)  # type: ignore[index]
    done = _run(infer_argv(PY, str(RUNNER), model_dir, str(tmp_path / "req.json"), str(tmp_path / "out.json")))
    assert done.returncode == 0, done.stderr
    out = json.loads((tmp_path / "out.json").read_text())["responses"]
    assert [r["id"] for r in out] == ["greedy", "ids", "sampled"]
    for r in out:
        assert set(r) == {"id", "output_ids", "text", "finish_reason", "timings"}
        assert r["output_ids"] and isinstance(r["text"], str) and r["finish_reason"] in ("length", "eos")
        assert r["timings"]["ttft_ms"] > 0 and r["timings"]["ms_per_token"] >= 0
    # the prompt is tokenized as the checkpoint's tokenizer.json does (BOS added): greedy text = the reference's
    assert out[0]["output_ids"] == ref.greedy_ids[0]
    assert out[1]["output_ids"] == ref.greedy_ids[1][:8]
    assert len(out[2]["output_ids"]) == 5


def test_runner_bench_gives_edgellm_bench_fields(made: dict, tmp_path: Path) -> None:
    model_dir = str(made["exports"]["int4_wo"].model_dir)  # type: ignore[index]
    for mode in ("prefill", "decode"):
        output = tmp_path / f"{mode}.json"
        done = _run(bench_argv(PY, str(RUNNER), model_dir, mode, str(output), prompt_len=32, past_len=64, warmup=2,
                               iterations=5, threads=1))
        assert done.returncode == 0, done.stderr
        data = json.loads(output.read_text())
        assert data["mode"] == mode and data["step_latency"]["count"] == 5
        assert data["tokens_per_step"] == (32 if mode == "prefill" else 1)
        assert data["parameters"]["past_len"] == (0 if mode == "prefill" else 64)
        metrics = bench_metrics(output, mode)
        assert set(metrics) == {f"{mode}_tokens_per_s", f"{mode}_ms_per_token", f"{mode}_ms_per_token_p90",
                                f"{mode}_peak_rss_mb"}
        assert all(v > 0 for v, _ in metrics.values())
        assert metrics[f"{mode}_ms_per_token"][0] <= metrics[f"{mode}_ms_per_token_p90"][0]
    with pytest.raises(TestFailure, match="mode 'decode', expected 'prefill'"):
        bench_metrics(tmp_path / "decode.json", "prefill")
    with pytest.raises(TestFailure, match="tokens_per_s is 0"):
        bench_metrics({"mode": "decode", "tokens_per_s": 0, "ms_per_token": {"median": 1, "p90": 1}}, "decode")


def test_fp32_logits_pass_edgellm_eval_checks_against_the_float_reference(made: dict, tmp_path: Path) -> None:
    model_dir = str(made["exports"]["fp32"].model_dir)  # type: ignore[index]
    reference: Path = made["reference"]  # type: ignore[assignment]
    full, reduced = tmp_path / "full.npz", tmp_path / "reduced.npz"
    done = _run(logits_argv(PY, str(RUNNER), model_dir, str(reference), str(full)))
    assert done.returncode == 0, done.stderr
    assert full.stat().st_size < 3 * 2**20  # tiny model: every logit fits in ~2.4 MB
    rep = report(full, reference, "fp32", {})
    assert rep["passed"], rep["failed_checks"]
    assert set(rep["checks"]) == {"outputs_finite", "tokenizer_match", "logits_max_abs_diff", "logits_min_cosine",
                                  "greedy_match_fraction", "perplexity_rel_diff", "top1_agreement"}
    assert rep["checks"]["logits_max_abs_diff"]["value"] < 1e-4
    assert rep["perplexity_from"] == "logits" and abs(rep["perplexity_ratio"] - 1) < 1e-6
    assert rep["engine_backend"] == "onnxruntime-genai" and rep["auto_tokenizer"]["matches_engine"]
    # large vocabularies: the device ships per-window reductions instead; same numbers
    done = _run([*logits_argv(PY, str(RUNNER), model_dir, str(reference), str(reduced)),
                 "--max-window-logits-mb", "0"])
    assert done.returncode == 0, done.stderr
    small = report(reduced, reference, "fp32", {})
    assert small["passed"] and small["perplexity_from"] == "device reductions"
    assert small["engine_perplexity"] == pytest.approx(rep["engine_perplexity"], rel=1e-9)
    assert small["checks"]["top1_agreement"]["value"] == rep["checks"]["top1_agreement"]["value"]
    assert reduced.stat().st_size < full.stat().st_size / 4


def test_int4_logits_need_thresholds_and_are_scored_against_the_float_source(made: dict, tmp_path: Path) -> None:
    model_dir = str(made["exports"]["int4_wo"].model_dir)  # type: ignore[index]
    reference: Path = made["reference"]  # type: ignore[assignment]
    fetched = tmp_path / "int4.npz"
    done = _run(logits_argv(PY, str(RUNNER), model_dir, str(reference), str(fetched)))
    assert done.returncode == 0, done.stderr
    with pytest.raises(ConfigurationError, match="no default accuracy thresholds for precision 'int4_wo'"):
        report(fetched, reference, "int4_wo", {})
    rep = report(fetched, reference, "int4_wo", {"ppl_max_rel_diff": 0.05, "top1_min_agreement": 0.5})
    assert rep["passed"], rep["checks"]
    assert 1.0 < rep["perplexity_ratio"] < 1.02  # measured 1.0035 (random weights, every linear and the LM head)
    strict = report(fetched, reference, "int4_wo", {"ppl_max_rel_diff": 1e-6})
    assert not strict["passed"] and strict["failed_checks"] == ["perplexity_rel_diff"]


def test_accuracy_refuses_a_file_made_against_another_reference(made: dict, tmp_path: Path) -> None:
    model_dir = str(made["exports"]["fp32"].model_dir)  # type: ignore[index]
    reference: Path = made["reference"]  # type: ignore[assignment]
    fetched = tmp_path / "f.npz"
    assert _run(logits_argv(PY, str(RUNNER), model_dir, str(reference), str(fetched))).returncode == 0
    ref = load_reference(reference)
    ref.header["created_unix"] += 1
    other = tmp_path / "other.npz"
    ref.save(other)
    with pytest.raises(ConfigurationError, match="computed against reference sha256"):
        report(fetched, other, "fp32", {})


def test_runner_refuses_bad_input_with_exit_2(made: dict, tmp_path: Path) -> None:
    model_dir = str(made["exports"]["fp32"].model_dir)  # type: ignore[index]
    (tmp_path / "bad.json").write_text(json.dumps({"requests": [
        {"id": "a", "prompt": "x", "temperature": -1, "colour": 1}, {"prompt": "y", "max_new_tokens": 0}]}))
    done = _run(infer_argv(PY, str(RUNNER), model_dir, str(tmp_path / "bad.json"), str(tmp_path / "o.json")))
    assert done.returncode == 2 and exit_kind(done.returncode) is ErrorKind.CONFIGURATION
    line = done.stderr.strip().splitlines()[-1]
    assert "temperature -1" in line and "unknown field 'colour'" in line and "max_new_tokens 0" in line
    (tmp_path / "long.json").write_text(json.dumps({"requests": [{"id": "a", "prompt": "x", "max_new_tokens": 999}]}))
    done = _run(infer_argv(PY, str(RUNNER), model_dir, str(tmp_path / "long.json"), str(tmp_path / "o.json")))
    assert done.returncode == 2 and "context_length 256" in done.stderr
    done = _run(infer_argv(PY, str(RUNNER), str(tmp_path), str(tmp_path / "long.json"), str(tmp_path / "o.json")))
    assert done.returncode == 2 and "genai_config.json is missing" in done.stderr
    done = _run([PY, str(RUNNER), "bench", "--model-dir", model_dir, "--mode", "sideways", "--batch-size", "4",
                 "--output", str(tmp_path / "b.json")])
    assert done.returncode == 2 and "'sideways'" in done.stderr and "--batch-size 4" in done.stderr
    assert not (tmp_path / "o.json").exists() and not (tmp_path / "b.json").exists()


def test_runner_exits_3_when_onnxruntime_genai_is_not_importable(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "onnxruntime_genai"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    done = _run([PY, str(RUNNER), "env"], PYTHONPATH=str(shim.parent))
    assert done.returncode == 3 and exit_kind(done.returncode) is ErrorKind.INFRASTRUCTURE
    assert "infrastructure: onnxruntime_genai is not importable" in done.stderr and "hidden by the test" in done.stderr
    bare = _run([PY, "-I", "-S", str(RUNNER), "env"])  # no site-packages at all: numpy goes first
    assert bare.returncode == 3 and "numpy is not importable" in bare.stderr
    assert exit_kind(-6) is ErrorKind.INFRASTRUCTURE  # a native abort while loading onnxruntime's library
    env = _run([PY, str(RUNNER), "env"])
    assert env.returncode == 0, env.stderr
    assert json.loads(env.stdout)["onnxruntime_genai"] and json.loads(env.stdout)["onnxruntime"]


def test_runner_is_python38_and_imports_only_stdlib_numpy_and_onnxruntime_genai() -> None:
    tree = ast.parse(RUNNER.read_text(), str(RUNNER), feature_version=(3, 8))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"numpy", "onnxruntime_genai"}
    # annotations are strings (from __future__); a type union evaluated at run time needs Python 3.10
    annotations = {id(a) for n in ast.walk(tree)
                   for ann in (getattr(n, "annotation", None), getattr(n, "returns", None))
                   if isinstance(ann, ast.AST) for a in ast.walk(ann)}
    unions = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)
              and id(n) not in annotations]
    assert unions == []
    assert not any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "zip"
                   and any(k.arg == "strict" for k in n.keywords) for n in ast.walk(tree))  # zip(strict=): 3.10


def test_logits_file_is_small_and_plain(made: dict, tmp_path: Path) -> None:
    """No pickles, and every array named in the runner's documented format."""
    model_dir = str(made["exports"]["int4_wo"].model_dir)  # type: ignore[index]
    out = tmp_path / "l.npz"
    assert _run(logits_argv(PY, str(RUNNER), model_dir, str(made["reference"]), str(out))).returncode == 0
    with np.load(out, allow_pickle=False) as npz:
        names = set(npz.files)
        header = json.loads(npz["header"].tobytes())
        assert npz["prompt0_logits"].dtype == np.float32 and npz["window0_logits"].shape == (DEFAULT_WINDOW, 512)
    assert header["format"] == "onnxruntime-genai-logits/1" and header["window_logits"] == "full"
    assert header["add_special_tokens"] == "true" and header["tokenizer_errors"] == []
    assert {"header", "engine_text_ids", "prompt0_ids", "greedy0_ids", "greedy0_engine_text", "window0_ids"} <= names
