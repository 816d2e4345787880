"""Device types: YAML schema, the registries' device types read from the files, and the one capability function's
reasons."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edgefarm.devices.types import DEVICE_TYPES_DIR, load_device_types
from edgefarm.registries import build, current
from edgefarm.test_lists.capability import capability
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.base import Variant
from edgellm.errors import ConfigurationError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


def test_the_platforms_are_the_yaml_files() -> None:
    registries = current()
    stems = sorted(p.stem for p in DEVICE_TYPES_DIR.glob("*.yaml"))
    assert list(registries.device_types) == stems
    assert registries.platform("Thor") == "thor" and registries.platform(" x86-CPU") == "x86-cpu"
    assert registries.device_type("X86-H200").sm == 90
    with pytest.raises(ConfigurationError,
                       match=r"unknown device type 'jetson'; valid: agx-orin-32gb, orin, orin-nano-8gb, orin-nx-16gb, "
                             r"thor"):
        registries.device_type("jetson")
    with pytest.raises(ConfigurationError, match=r"unknown platform 'jetson'; valid: agx-orin-32gb, orin"):
        registries.platform("jetson")


@pytest.mark.parametrize(
    ("name", "precision", "toolchain", "ok", "reason"),
    [
        ("orin", "fp8", None, False, "orin (SM87) does not support fp8 (needs SM89+)"),
        ("orin", "nvfp4", None, False, "orin (SM87) does not support nvfp4 (needs SM100+)"),
        ("x86-a30", "fp8", None, False, "x86-a30 (SM80) does not support fp8 (needs SM89+)"),
        ("thor", "nvfp4", "tensorrt-edgellm", True, ""),
        ("orin", "fp16", "edgellm-ort", False,
         "orin (SM87) does not run toolchain edgellm-ort (runs: tensorrt-edgellm)"),
        ("x86-cpu", "fp32", "edgellm-ort", True, ""),
        ("x86-cpu", "bf16", None, False,
         "x86-cpu (CPU) does not support bf16 (supported: fp32, fp16, int8_sq, int4_awq, int4_gptq, int4_wo)"),
        ("x86-cpu", "int4_awq", None, True, ""),
        # decided once, in x86-cpu.yaml: ONNX Runtime builds fp8 engines, but only emulated
        ("x86-cpu", "fp8", "edgellm-ort", False, "fp8 is emulated on x86-cpu (no fp8 GEMM kernel)"),
        ("x86-h200", "nvfp4", None, False, "x86-h200 (SM90) does not support nvfp4 (needs SM100+)"),
        ("x86-h200", "bf16", "tensorrt-edgellm", False,
         "toolchain tensorrt-edgellm cannot produce bf16 (produces: fp16, fp8, int4_awq, int8_sq, nvfp4, mxfp8, "
         "int4_gptq)"),
        # the CPU runs int4 group GEMMs, but no toolchain there reads a GPTQ checkpoint: its driver says why
        ("x86-cpu", "int4_gptq", None, False,
         "toolchain edgellm-ort cannot produce int4_gptq (produces: fp32, fp16, int4_awq, int8_sq, fp8): edgellm's "
         "export reads no int4_gptq checkpoint (edgellm/quant/int4_gptq.py declares no stored layout)"),
        ("orin", "int4_gptq", "tensorrt-edgellm", True, ""),  # its exporter reads Hugging Face GPTQ checkpoints
        ("x86-h200", "bf16", None, True, ""),  # edgellm-torch-cuda, the type's second toolchain, makes bf16
    ],
)
def test_capability_gives_the_reason(name: str, precision: str, toolchain: str | None, ok: bool,
                                     reason: str) -> None:
    found = capability(name, toolchain, Variant(Precision.parse(precision)))
    assert (found.ok, found.reason) == (ok, reason)


def test_capability_holds_the_device_types_kv_cache_and_lm_head_limits() -> None:
    """One function for plan, list validation and matrices: Orin's hardware has no fp8 (KV cache or LM head), so
    int4_awq with an fp8 KV cache is refused there though the toolchain could make it."""
    orin_fp8_kv = Variant(Precision.INT4_AWQ, kv_cache=KVCachePrecision.FP8)
    assert toolchains.driver("tensorrt-edgellm").variant_problem(orin_fp8_kv) is None
    found = capability("orin", "tensorrt-edgellm", orin_fp8_kv)
    assert (found.ok, found.reason) == (False, "orin (SM87) does not support a fp8 KV cache (needs SM89+)")
    head = capability("orin", None, Variant(Precision.INT4_AWQ, lm_head=LMHeadPrecision.FP8))
    assert head.reason == "orin (SM87) does not support a fp8 LM head (needs SM89+)"
    assert capability("thor", None, Variant(Precision.INT4_AWQ, LMHeadPrecision.FP8, KVCachePrecision.FP8)).ok


def test_every_precision_a_device_type_lists_is_produced_by_one_of_its_toolchains() -> None:
    """No stub precisions: a type lists only what one of its toolchains makes, except x86-cpu's int4_gptq (its
    hardware runs int4 GEMMs; no toolchain there reads a GPTQ checkpoint, and its rows say so: the case above).
    tensorrt-edgellm makes int4_gptq on every NVIDIA type, from a Hugging Face GPTQ checkpoint."""
    for name, dtype in current().device_types.items():
        made = {p for chain in dtype.toolchains for p in toolchains.driver(chain).precisions()}
        unmade = set(dtype.precisions) - made
        assert unmade <= ({Precision.INT4_GPTQ} if name == "x86-cpu" else set()), f"{name}: {sorted(unmade)}"
    assert all(Precision.INT4_GPTQ in t.precisions for t in current().device_types.values())


def test_supports_rejects_unknown_names() -> None:
    with pytest.raises(ConfigurationError, match="unknown precision 'fp9'; valid: fp32"):
        current().device_types["thor"].supports("fp9")


def _types_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "types"
    shutil.copytree(DEVICE_TYPES_DIR, directory)
    return directory


def test_every_problem_of_every_type_file_at_once(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    orin = directory / "orin.yaml"
    orin.write_text(orin.read_text().replace("int4_gptq]", "int4_gptq, fp9]")
                    .replace("[tensorrt-edgellm]", "[tensorrt-edgellm, cuda]"))
    (directory / "x86-new.yaml").write_text(
        "name: x86-newer\ndescription: d\narch: x86_64\nsm: 90\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16]\nkv_cache_precisions: [fp16]\nlm_head_precisions: [fp16]\n"
    )
    (directory / "bad-sm.yaml").write_text(
        "name: bad-sm\ndescription: d\narch: riscv\nsm: 75\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16]\nlm_head_precisions: [fp16]\ncolour: green\n"
    )
    (directory / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigurationError) as caught:
        build(device_types_dir=directory)  # the registries': names checked by the registered toolchains
    message = str(caught.value)
    lines = message.splitlines()
    valid_precisions = ", ".join(Precision)
    assert f"{orin}: precisions: unknown precision 'fp9'; valid: {valid_precisions}" in lines
    assert f"{orin}: toolchains: unknown toolchain 'cuda'; registered: {', '.join(toolchains.names())}" in lines
    assert f"{directory / 'x86-new.yaml'}: name: 'x86-newer' must equal the file name 'x86-new'" in lines
    assert f"{directory / 'bad-sm.yaml'}: arch: unknown arch 'riscv'; valid: x86_64, aarch64" in lines
    assert any(line.startswith(f"{directory / 'bad-sm.yaml'}: unknown key 'colour'") for line in lines)
    assert any("broken.yaml:2: invalid YAML: while parsing a flow sequence" in line for line in lines)
    assert len(lines) == 1 + 6


def test_precision_inconsistent_with_sm_is_refused(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    (directory / "old-gpu.yaml").write_text(
        "name: old-gpu\ndescription: d\narch: x86_64\nsm: 75\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16]\nlm_head_precisions: [fp16]\n"
    )
    with pytest.raises(ConfigurationError, match="precision fp8 needs SM89\\+ but sm is 75"):
        load_device_types(directory)


def test_a_new_device_type_is_one_yaml_file(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    (directory / "x86-l4.yaml").write_text(
        "name: x86-l4\ndescription: NVIDIA L4\narch: x86_64\nsm: 89\nmemory_gb: 24\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16, fp8]\nlm_head_precisions: [fp16, fp8]\n"
    )
    types = load_device_types(directory)
    assert types["x86-l4"].supports("fp8") == (True, "x86-l4 (SM89) supports fp8")


def test_a_refused_precision_needs_its_reason_and_cannot_also_be_listed(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    cpu = directory / "x86-cpu.yaml"
    text = cpu.read_text()
    cpu.write_text(text.replace("\nprecisions: [fp32,", "\nprecisions: [fp8, fp32,").replace(
        "fp8: fp8 is emulated on x86-cpu (no fp8 GEMM kernel)", "fp8: fp8 is emulated on x86-cpu (no fp8 GEMM kernel)\n"
        "  int8_wo: ''"))
    with pytest.raises(ConfigurationError) as err:
        load_device_types(directory)
    assert "refuses: give a reason for int8_wo" in str(err.value)
    cpu.write_text(text.replace("\nprecisions: [fp32,", "\nprecisions: [fp8, fp32,"))
    with pytest.raises(ConfigurationError, match=r"precision\(s\) fp8 both listed in precisions and refused"):
        load_device_types(directory)
