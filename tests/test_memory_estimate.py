"""Does it fit: ``edgellm.memory``'s estimate, its parts, its data file, the ``edgellm memory`` command, and the
estimate against the peak memory an engine really took on this CPU (``edgellm bench``'s ``peak_memory_bytes``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.cli import main
from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.config import ModelConfig
from edgellm.errors import ConfigurationError
from edgellm.memory import (
    GB,
    Reserve,
    compute_dtype,
    estimate,
    estimate_checkpoint,
    load_reserves,
    missing_reserve,
    reserve_for,
    weight_bytes_per_value,
)

MIB = 2**20


def _cfg(**over: object) -> ModelConfig:
    raw = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 1000, "tie_word_embeddings": False, "torch_dtype": "float32", **over}
    return ModelConfig.from_dict(raw)


def test_kv_cache_is_layers_heads_dim_length_batch_bytes() -> None:
    found = estimate(_cfg(), "fp16", max_seq_len=300, max_batch_size=3)
    assert found.parts["kv_cache"] == 4 * 2 * 2 * 64 * 300 * 3 * 2  # layers x (K,V) x kv heads x dim x len x B x 2
    eight = estimate(_cfg(), "fp16", max_seq_len=300, max_batch_size=3, kv_cache_precision="fp8")
    assert eight.parts["kv_cache"] * 2 == found.parts["kv_cache"]


def test_sliding_window_layers_hold_at_most_their_window() -> None:
    full = estimate(_cfg(model_type="mistral", architectures=["MistralForCausalLM"]), "fp16", max_seq_len=4096,
                    max_batch_size=1)
    windowed = estimate(_cfg(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=1024),
                        "fp16", max_seq_len=4096, max_batch_size=1)
    assert windowed.parts["kv_cache"] * 4 == full.parts["kv_cache"]
    short = estimate(_cfg(model_type="mistral", architectures=["MistralForCausalLM"], sliding_window=1024),
                     "fp16", max_seq_len=512, max_batch_size=1)
    assert short.parts["kv_cache"] * 8 == full.parts["kv_cache"]  # a window longer than max_seq_len binds nothing


def test_the_windowed_layers_are_the_familys_reading_of_the_config() -> None:
    """Which layers hold their window only is what the family reads from the config (``layer_windows``): Qwen2's
    max_window_layers (layers from it on windowed), Gemma-2's own pattern (every other layer), not every layer."""
    per_layer = 2 * 2 * 64 * 2  # (K, V) x kv heads x dim x fp16 bytes, per position
    qwen = estimate(_cfg(model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=True,
                         sliding_window=1024, max_window_layers=3), "fp16", max_seq_len=4096, max_batch_size=1)
    assert qwen.parts["kv_cache"] == (3 * 4096 + 1024) * per_layer
    gemma = estimate(_cfg(model_type="gemma2", architectures=["Gemma2ForCausalLM"], sliding_window=1024,
                          hidden_activation="gelu_pytorch_tanh"), "fp16", max_seq_len=4096, max_batch_size=1)
    assert not gemma.notes
    assert gemma.parts["kv_cache"] == (2 * 4096 + 2 * 1024) * per_layer


def test_embeddings_and_lm_head_by_their_own_precision_tied_counted_once() -> None:
    untied = estimate(_cfg(), "int4_awq", max_seq_len=64, max_batch_size=1, lm_head_precision="int8_wo")
    assert untied.parts["embeddings"] == 1000 * 256 * 2  # fp16: the float format of a quantized row
    assert untied.parts["lm_head"] == 1000 * 256 * 1
    tied = estimate(_cfg(tie_word_embeddings=True), "int4_awq", max_seq_len=64, max_batch_size=1)
    assert tied.parts["lm_head"] == 0 and tied.parts["embeddings"] == 1000 * 256 * 2
    assert "tied" in " ".join(tied.notes)
    float32 = estimate(_cfg(), "fp32", max_seq_len=64, max_batch_size=1)
    linears = 4 * (256 * 256 * 2 + 2 * 128 * 256 + 3 * 256 * 512)
    assert float32.parts["weights"] == linears * 4 + 4 * 2 * 256 * 4 + 256 * 4  # linears + norms, fp32


def test_quantized_weights_are_sized_from_the_methods_stored_layout() -> None:
    assert weight_bytes_per_value("fp16") == 2
    assert weight_bytes_per_value("int4_awq", 128) == pytest.approx(0.5 + 4 / 128, rel=1e-2)  # fp32 group scales
    assert weight_bytes_per_value("int8_sq") == pytest.approx(1.0, rel=1e-2)
    assert weight_bytes_per_value("nvfp4") == pytest.approx(0.5 + 1 / 16, rel=1e-3)
    assert weight_bytes_per_value("int4_wo") == pytest.approx(4.25 / 8)  # no stored layout: its bits_per_weight
    with pytest.raises(ConfigurationError, match="unknown precision 'int3'; valid: fp32"):
        weight_bytes_per_value("int3")


def test_reserve_comes_from_the_stored_measurements_with_its_source() -> None:
    table = load_reserves()
    measured = table[("edgellm-ort", "x86-cpu")]
    assert measured.bytes > 10 * MIB and "measured" in measured.source and "edgellm bench" in measured.source
    assert reserve_for("edgellm-ort", None, table) == measured
    assert reserve_for("tensorrt-edgellm", "orin", table) is None
    note = missing_reserve("tensorrt-edgellm", "orin", table)
    assert note == "no reserve measured for tensorrt-edgellm on orin: none added (measured: edgellm-ort on x86-cpu)"
    found = estimate(_cfg(), "fp16", max_seq_len=64, max_batch_size=1, reserve=None, no_reserve=note)
    assert found.parts["runtime_reserve"] == 0 and found.reserve_source == note
    assert compute_dtype("edgellm-ort") == "fp32" and compute_dtype("tensorrt-edgellm") is None


def test_a_reserve_row_without_its_source_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "r.yaml"
    bad.write_text("reserves:\n  - {toolchain: t, device_type: d, reserve_mb: 10, source: guess}\n")
    with pytest.raises(ConfigurationError, match=r"reserves\[0\]: source must say where the number came from"):
        load_reserves(bad)
    bad.write_text("reserves:\n  - {toolchain: t, device_type: d, reserve_mb: -1, source: measured somewhere}\n")
    with pytest.raises(ConfigurationError, match="reserve_mb -1 must be a number >= 0"):
        load_reserves(bad)


def test_memory_command_prints_json_and_refuses_bad_input(ckpts, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(ckpts.stories), "--precision", "fp32", "--max-seq-len", "256",
                 "--max-batch-size", "2", "--toolchain", "edgellm-ort"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["device_type"] == "x86-cpu" and set(out["parts"]) == {
        "weights", "embeddings", "lm_head", "kv_cache", "activations", "runtime_reserve"}
    assert out["estimate_gb"] == pytest.approx(out["total_bytes"] / GB, abs=1e-3)
    assert main(["memory", str(ckpts.stories), "--precision", "fp99", "--max-seq-len", "256",
                 "--max-batch-size", "2"]) == 2
    assert "unknown precision 'fp99'; valid: fp32" in capsys.readouterr().err
    assert main(["memory", str(ckpts.stories), "--precision", "fp32", "--max-seq-len", "0",
                 "--max-batch-size", "2"]) == 2
    assert "max_seq_len 0 must be an integer >= 1" in capsys.readouterr().err


def test_a_quantized_checkpoint_is_estimated_at_its_own_precision(quant_ckpt: Path) -> None:
    found = estimate_checkpoint(quant_ckpt, None, max_seq_len=64, max_batch_size=1)
    fp16 = estimate_checkpoint(quant_ckpt.parent / "src", "fp16", max_seq_len=64, max_batch_size=1)
    # its group (16) read from the checkpoint: 4 bits + an fp32 scale per 16 values = 0.75 bytes against fp16's 2
    assert found.parts["weights"] == pytest.approx(fp16.parts["weights"] * 0.75 / 2, rel=0.03)
    with pytest.raises(ConfigurationError, match=r"quantized at int4_awq.*give int4_awq"):
        estimate_checkpoint(quant_ckpt, "fp16", max_seq_len=64, max_batch_size=1)


# --- estimate against measurement -------------------------------------------------------------------------------
# Build shapes of every engine below; the bench fills the KV cache to max_seq_len with a full-width prefill on top.
SHAPES = {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 256}
MID = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "num_attention_heads": 8,
       "num_key_value_heads": 4, "vocab_size": 512}  # ~25M parameters: the weights dominate the runtime's reserve


@pytest.fixture(scope="module")
def mid_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgellm.synth import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("mid") / "src", "llama", **MID)


@pytest.fixture(scope="module")
def quant_ckpt(ckpts, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from edgellm.synth_quant import calibration_ids, quantize_rtn

    root = tmp_path_factory.mktemp("stories_awq")
    src = ckpts.copy("stories", root / "src")
    return quantize_rtn(src, root / "int4_awq", "int4_awq", calibration_ids(src, 8), group_size=16)


def _measured_peak(engine_dir: Path) -> int:
    """``edgellm bench``'s peak memory of the engine, in a fresh process (its peak RSS is the engine's alone)."""
    done = subprocess.run([sys.executable, "-m", "edgellm", "bench", "--engine-dir", str(engine_dir), "--mode",
                           "prefill", "--batch-size", "2", "--input-len", "64", "--past-len", "192", "--warmup", "1",
                           "--iterations", "1", "--threads", "1"], capture_output=True, text=True, check=True)
    return int(json.loads(done.stdout)["peak_memory_bytes"])


@pytest.mark.parametrize("model,precision", [("stories", "fp32"), ("stories", "int4_awq"), ("mid", "fp32"),
                                             ("mid", "fp16"), ("mid", "int4_awq")])
def test_estimate_within_15_percent_of_the_measured_peak_on_the_cpu(
        model: str, precision: str, ckpts, mid_ckpt: Path, quant_ckpt: Path,
        tmp_path: Path) -> None:
    src = ckpts.stories if model == "stories" else mid_ckpt
    if precision == "int4_awq":
        from edgellm.synth_quant import calibration_ids, quantize_rtn

        src = quant_ckpt if model == "stories" else quantize_rtn(
            mid_ckpt, tmp_path / "int4_awq", "int4_awq", calibration_ids(mid_ckpt, 8), group_size=64)
    cfg_precision = None if precision == "int4_awq" else precision  # a quantized checkpoint's is its own
    export_checkpoint(src, tmp_path / "onnx", cfg_precision)
    build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", **SHAPES)
    reserve = reserve_for("edgellm-ort", "x86-cpu")
    assert isinstance(reserve, Reserve)
    found = estimate_checkpoint(src, cfg_precision, max_seq_len=SHAPES["max_seq_len"],
                                max_batch_size=SHAPES["max_batch_size"], max_input_len=SHAPES["max_input_len"],
                                float_dtype=compute_dtype("edgellm-ort"), reserve=reserve)
    measured = _measured_peak(tmp_path / "engine")
    assert abs(found.total_bytes - measured) <= 0.15 * measured, (
        f"{model} {precision}: estimate {found.total_bytes / MIB:.1f} MiB, measured {measured / MIB:.1f} MiB "
        f"({found.parts})")


def test_bench_peak_memory_is_a_judged_metric() -> None:
    """The engine's peak memory from ``edgellm bench`` becomes a farm metric, judged like speed (lower is better)."""
    from edgefarm.results.regressions import RULES, Direction
    from edgefarm.toolchains.edgellm.driver import bench_metrics
    from edgellm.types import BenchMode

    report = {"tokens_per_s": 10.0, "ms_per_token": {"median": 100.0, "p90": 120.0}, "peak_rss_bytes": 300 * MIB,
              "peak_memory_bytes": 60 * MIB, "cuda_peak_allocated_bytes": 2 * MIB}
    metrics = bench_metrics(BenchMode.DECODE, report)
    assert metrics["decode_peak_memory_mb"] == (60.0, "MiB")
    assert metrics["decode_cuda_peak_allocated_mb"] == (2.0, "MiB") and "decode_cuda_peak_reserved_mb" not in metrics
    for name in ("decode_peak_memory_mb", "prefill_peak_memory_mb", "decode_cuda_peak_allocated_mb"):
        assert RULES[name].direction is Direction.LOWER_IS_BETTER


def test_a_supported_rows_cell_shows_the_measured_peak_memory() -> None:
    from edgefarm.pages.docs_render import metrics_text

    assert metrics_text({"decode_tokens_per_s": 12.34, "decode_peak_memory_mb": 160.3}, "; ") == (
        "decode tok/s 12.3; peak memory MiB 160")


def test_a_config_the_runtime_refuses_is_still_sized_and_says_how() -> None:
    """Sizing needs the shapes only: a family that refuses to run a config (here its activation) does not stop the
    estimate, which falls back to the generic decoder's parameters and full attention, and says so."""
    refused = estimate(_cfg(hidden_act="gelu_new"), "fp16", max_seq_len=64, max_batch_size=1)
    plain = estimate(_cfg(), "fp16", max_seq_len=64, max_batch_size=1)
    assert refused.parts == plain.parts
    assert any("generic decoder shape" in n and "gelu_new" in n for n in refused.notes)


def test_infer_writes_the_engines_peak_memory_beside_its_responses(stories_engine, tmp_path: Path) -> None:
    """``edgellm infer``'s output file carries the run's peak memory, which the farm's infer stage records as the
    judged metric ``infer_peak_memory_mb``."""
    from edgefarm.results.regressions import RULES, Direction

    requests = tmp_path / "req.json"
    requests.write_text(json.dumps({"requests": [{"id": "a", "prompt": "Once upon a time", "max_new_tokens": 8}]}))
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-m", "edgellm", "infer", "--engine-dir", str(stories_engine.engine_dir),
                    "--input-file", str(requests), "--output-file", str(out), "--threads", "1"],
                   capture_output=True, text=True, check=True)
    written = json.loads(out.read_text())
    assert len(written["responses"]) == 1
    assert 10 * MIB < written["peak_memory_bytes"] < 500 * MIB  # the ONNX Runtime session and a 1 MiB model
    assert RULES["infer_peak_memory_mb"].direction is Direction.LOWER_IS_BETTER


def test_a_runtime_that_lays_out_each_layer_at_load_holds_one_layer_twice() -> None:
    """edgellm-torch-cuda copies a layer's linears into its column layout, freeing the loaded ones layer by layer:
    its estimate counts one layer's linears once more (the data file's load_copies); ONNX Runtime's does not."""
    from edgellm.memory import load_copy

    assert load_copy("edgellm-torch-cuda") and not load_copy("edgellm-ort") and not load_copy(None)
    cfg = _cfg()
    plain = estimate(cfg, "bf16", max_seq_len=64, max_batch_size=1)
    copied = estimate(cfg, "bf16", max_seq_len=64, max_batch_size=1, load_copy=True)
    layer_linears = (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 512) * 2  # q, o, k, v, gate, up, down in bf16
    assert copied.total_bytes - plain.total_bytes == copied.parts["load_copy"] == layer_linears
