"""Hostile quantized checkpoints (issue 24): poisoned scales and group sizes no kernel takes are bad input at
inspect (exit 2 naming the tensor) and at export, never an engine; property-based over the values and sizes."""

from __future__ import annotations

import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from edgellm import BUNDLED_TEXT_FILE
from edgellm.cli import main
from edgellm.quant.base import scale_value_problem
from edgellm.synth import make_checkpoint
from edgellm.synth_quant import quantize_rtn

ST = "model.safetensors"
Q = "model.layers.0.self_attn.q_proj"
QWEN3_128 = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                 num_hidden_layers=1)


@pytest.fixture(scope="module")
def rtn(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Qwen3 (every width a multiple of 128) and its int4_awq and int8_sq checkpoints (synthetic RTN,
    laid out as ModelOpt's)."""
    root = tmp_path_factory.mktemp("rtn")
    src = make_checkpoint(root / "src", "qwen3", **QWEN3_128)
    ids = Tokenizer.from_file(str(src / "tokenizer.json")).encode(BUNDLED_TEXT_FILE.read_text()).ids[:64]
    return {"src": src, **{m: quantize_rtn(src, root / m, m, ids) for m in ("int4_awq", "int8_sq")}}


def _poisoned(rtn: dict[str, Path], method: str, suffix: str, value: float, dest: Path) -> Path:
    shutil.copytree(rtn[method], dest)
    tensors = load_file(dest / ST)
    tensors[f"{Q}.{suffix}"].view(-1)[1] = value
    save_file(tensors, dest / ST, metadata={"format": "pt"})
    return dest


POISONS = [("int4_awq", "weight_scale", math.nan), ("int4_awq", "weight_scale", math.inf),
           ("int4_awq", "weight_scale", 0.0), ("int4_awq", "weight_scale", -0.5),
           ("int4_awq", "pre_quant_scale", math.nan), ("int8_sq", "input_scale", math.nan),
           ("int8_sq", "input_scale", math.inf), ("int8_sq", "input_scale", 0.0),
           ("int8_sq", "weight_scale", -1.0)]
WORD = {"nan": "NaN", "inf": "infinite", "0.0": "zero"}


@pytest.mark.parametrize(("method", "suffix", "value"), POISONS, ids=lambda v: str(v))
def test_poisoned_scale_is_refused_by_inspect_and_export(rtn: dict[str, Path], tmp_path: Path, method: str,
                                                         suffix: str, value: float,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    if suffix == "input_scale":  # a scalar: poison its only value
        d = tmp_path / "ck"
        shutil.copytree(rtn[method], d)
        tensors = load_file(d / ST)
        tensors[f"{Q}.{suffix}"] = torch.tensor(value, dtype=torch.float32)
        save_file(tensors, d / ST, metadata={"format": "pt"})
    else:
        d = _poisoned(rtn, method, suffix, value, tmp_path / "ck")
    word = WORD.get(str(value), "negative")
    assert main(["inspect", str(d)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"problem: {ST}: tensor '{Q}.{suffix}': {method} {suffix} holds 1 {word}" in err, err
    assert "a scale must be finite and > 0" in err
    assert main(["export", str(d), str(tmp_path / "onnx")]) == 2
    err = capsys.readouterr().err
    assert f"tensor '{Q}.{suffix}'" in err and word in err and "Traceback" not in err, err
    assert not (tmp_path / "onnx" / "model.onnx").exists()


def test_clean_synthetic_checkpoints_still_pass_inspect(rtn: dict[str, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    for method in ("int4_awq", "int8_sq"):
        assert main(["inspect", str(rtn[method])]) == 0, capsys.readouterr().err


FLOAT_DTYPES = {"F32": "<f4", "F16": "<f2"}


def _bf16(values: np.ndarray) -> bytes:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(["F32", "F16", "BF16"]),
       values=st.lists(st.floats(width=16, allow_nan=True, allow_infinity=True), min_size=1, max_size=40),
       split=st.integers(min_value=0, max_value=40))
def test_scale_values_refused_exactly_when_not_finite_and_positive(dtype: str, values: list[float],
                                                                   split: int) -> None:
    arr = np.asarray(values, dtype=np.float32)  # width 16: every value exact in F16 and BF16 too
    data = _bf16(arr) if dtype == "BF16" else arr.astype(FLOAT_DTYPES[dtype]).tobytes()
    size = len(data) // len(values)
    cut = min(split, len(values)) * size  # chunks of whole elements, anywhere
    problem = scale_value_problem(dtype, [data[:cut], data[cut:]])
    bad = [i for i, v in enumerate(values) if not (math.isfinite(v) and v > 0)]
    if not bad:
        assert problem is None
    else:
        assert problem is not None and f"of its {len(values)} values (the first at flat index {bad[0]})" in problem


@given(st.binary(min_size=1, max_size=64))
def test_fp8_e4m3_scale_bits(data: bytes) -> None:
    bad = [i for i, b in enumerate(data) if b & 0x7F in (0, 0x7F) or b & 0x80]
    problem = scale_value_problem("F8_E4M3", [data])
    assert (problem is None) == (not bad)
    if bad:
        assert f"(the first at flat index {bad[0]})" in problem  # type: ignore[operator]


def test_scale_value_words() -> None:
    data = struct.pack("<4f", math.nan, math.inf, 0.0, -2.0)
    assert scale_value_problem("F32", [data]) == ("holds 1 NaN, 1 infinite, 1 zero, 1 negative of its 4 values "
                                                 "(the first at flat index 0); a scale must be finite and > 0")
    assert scale_value_problem("U8", [bytes([0x7F, 0xFF])]) is not None  # e8m0: 0xFF is NaN
    assert scale_value_problem("U8", [bytes([0x00, 0x7F, 0xFE])]) is None  # 2^-127 .. 2^127: all positive


def _regrouped(rtn: dict[str, Path], group: int, dest: Path) -> Path:
    """The int4_awq checkpoint declaring ``group`` with weight_scale shaped for it (ones): consistent on disk."""
    import json

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(rtn["int4_awq"], dest)
    tensors = load_file(dest / ST)
    for name, t in list(tensors.items()):
        if name.endswith(".weight_scale"):
            inp = tensors[name.removesuffix("_scale")].shape[1]
            tensors[name] = torch.ones(t.shape[0], math.ceil(inp / group))
    save_file(tensors, dest / ST, metadata={"format": "pt"})
    cfg = json.loads((dest / "hf_quant_config.json").read_text())
    cfg["quantization"]["group_size"] = group
    (dest / "hf_quant_config.json").write_text(json.dumps(cfg))
    return dest


def _matmulnbits_block(group: int) -> bool:
    """ONNX Runtime's MatMulNBits block_size: a power of two and >= 16 (its schema; what its CPU kernel asserts)."""
    return group >= 16 and group & (group - 1) == 0


@pytest.mark.parametrize("group", [7, 8, 48, 100])
def test_int4_awq_group_size_no_kernel_takes_is_refused_at_inspect(rtn: dict[str, Path], tmp_path: Path,
                                                                  group: int,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """7 was a crash in export (exit 4), 8 / 48 / 100 passed inspect and export and failed in the build on ONNX
    Runtime's kernel assertion: each is bad input at inspect, naming the value and what is valid."""
    d = _regrouped(rtn, group, tmp_path / "ck")
    assert main(["inspect", str(d)]) == 2
    err = capsys.readouterr().err
    assert f"group_size {group}" in err and "a power of two >= 16" in err and "Traceback" not in err, err
    assert main(["export", str(d), str(tmp_path / "onnx")]) == 2
    err = capsys.readouterr().err
    assert f"group_size {group}" in err and "Traceback" not in err, err


@settings(max_examples=25, deadline=None)
@given(group=st.one_of(st.integers(min_value=1, max_value=600), st.sampled_from([16, 32, 64, 128, 256, 512])))
def test_int4_awq_group_sizes_inspect_as_the_kernel_takes_them(rtn: dict[str, Path], tmp_path_factory:
                                                               pytest.TempPathFactory, group: int) -> None:
    d = _regrouped(rtn, group, tmp_path_factory.getbasetemp() / "regrouped")
    assert (main(["inspect", str(d)]) == 0) is _matmulnbits_block(group)


def test_int4_awq_group_16_builds(rtn: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The smallest block inspect accepts is one ONNX Runtime builds."""
    d = _regrouped(rtn, 16, tmp_path / "ck")
    assert main(["export", str(d), str(tmp_path / "onnx")]) == 0, capsys.readouterr().err
    assert main(["build", str(tmp_path / "onnx"), str(tmp_path / "engine"), "--backend", "ort"]) == 0, \
        capsys.readouterr().err


BLOCKS = {"int4_awq": _matmulnbits_block, "nvfp4": lambda g: g == 16, "mxfp8": lambda g: g == 32}


@given(name=st.sampled_from(sorted(BLOCKS)), group=st.integers(min_value=1, max_value=1 << 20))
def test_each_method_takes_the_group_sizes_of_its_kernel(name: str, group: int) -> None:
    from edgellm.quant import method

    problem = method(name).group_size_problem(group)
    assert (problem is None) is BLOCKS[name](group)
    if problem is not None:
        assert f"group_size {group} " in problem


SCALE_DTYPE = {torch.float32: "F32", torch.float16: "F16"}


@settings(max_examples=60, deadline=None)
@given(method=st.sampled_from(["int4_awq", "int8_sq"]),
       w=st.lists(st.floats(min_value=-1e4, max_value=1e4, width=32), min_size=64, max_size=64),
       act=st.lists(st.one_of(st.just(0.0), st.floats(min_value=2.0**-20, max_value=1e4, width=32)), min_size=16,
                    max_size=16))
def test_synthetic_quantizer_writes_only_scales_inspect_accepts(method: str, w: list[float], act: list[float]) -> None:
    """Whatever the weights and activation statistics (dead channels, zero rows, wide ranges), the RTN writer's
    scales are finite and > 0 in their stored dtype: its checkpoints pass the check it is tested against."""
    from edgellm.synth_quant import _quantize_linear

    weight = torch.tensor(w).reshape(4, 16)
    act_amax = torch.tensor(act)
    out = _quantize_linear("m", weight, act_amax, weight.abs().amax(dim=0), method, 16)
    for name, t in out.items():
        if name != "m.weight":
            problem = scale_value_problem(SCALE_DTYPE[t.dtype], [t.contiguous().numpy().tobytes()])
            assert problem is None, (name, problem, t)
