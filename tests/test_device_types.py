"""Device types: YAML schema, the Platform enum built from the files, supports() reasons."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from devices.types import DEVICE_TYPES, DEVICE_TYPES_DIR, Platform, device_type, load_device_types
from edgellm.errors import ConfigurationError
from edgellm.types import Precision
from toolchains.base import Toolchain


def test_platform_enum_is_the_yaml_files() -> None:
    stems = sorted(p.stem for p in DEVICE_TYPES_DIR.glob("*.yaml"))
    assert sorted(p.value for p in Platform) == stems
    assert Platform.ORIN == "orin" and Platform.X86_CPU == "x86-cpu"
    assert Platform.parse("Thor") is Platform.THOR
    assert device_type(Platform.X86_H200).sm == 90
    with pytest.raises(ConfigurationError, match=r"unknown device type 'jetson'; valid: orin, thor"):
        device_type("jetson")


@pytest.mark.parametrize(
    ("name", "precision", "toolchain", "ok", "reason"),
    [
        ("orin", "fp8", None, False, "orin (SM87) does not support fp8 (needs SM89+)"),
        ("orin", "nvfp4", None, False, "orin (SM87) does not support nvfp4 (needs SM100+)"),
        ("x86-a30", Precision.FP8, None, False, "x86-a30 (SM80) does not support fp8 (needs SM89+)"),
        ("thor", "nvfp4", "tensorrt-edgellm", True, "thor (SM110) supports nvfp4 with tensorrt-edgellm"),
        ("orin", "fp16", "edgellm-ort", False,
         "orin (SM87) does not run toolchain edgellm-ort (runs: tensorrt-edgellm)"),
        ("x86-cpu", "fp32", Toolchain.EDGELLM_ORT, True, "x86-cpu (CPU) supports fp32 with edgellm-ort"),
        (
            "x86-cpu",
            "bf16",
            None,
            False,
            "x86-cpu (CPU) does not support bf16 (supported: fp32, fp16, int8_sq, int8_wo, int4_awq, int4_wo)",
        ),
        ("x86-cpu", "int4_awq", None, True, "x86-cpu (CPU) supports int4_awq"),
        # decided once, in x86-cpu.yaml: ONNX Runtime builds fp8 engines, but only emulated
        ("x86-cpu", "fp8", Toolchain.EDGELLM_ORT, False, "fp8 is emulated on x86-cpu (no fp8 GEMM kernel)"),
        ("x86-h200", "nvfp4", None, False, "x86-h200 (SM90) does not support nvfp4 (needs SM100+)"),
    ],
)
def test_supports_gives_the_reason(name: str, precision: str, toolchain: str | None, ok: bool, reason: str) -> None:
    assert DEVICE_TYPES[name].supports(precision, toolchain) == (ok, reason)


def test_supports_rejects_unknown_names() -> None:
    with pytest.raises(ConfigurationError, match="unknown precision 'fp9'; valid: fp32"):
        DEVICE_TYPES["thor"].supports("fp9")


def _types_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "types"
    shutil.copytree(DEVICE_TYPES_DIR, directory)
    return directory


def test_every_problem_of_every_type_file_at_once(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    orin = directory / "orin.yaml"
    orin.write_text(orin.read_text().replace("int4_wo]", "int4_wo, fp9]")
                    .replace("[tensorrt-edgellm]", "[tensorrt-edgellm, cuda]"))
    (directory / "x86-new.yaml").write_text(
        "name: x86-newer\ndescription: d\narch: x86_64\nsm: 90\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16]\nkv_cache_precisions: [fp16]\n"
    )
    (directory / "bad-sm.yaml").write_text(
        "name: bad-sm\ndescription: d\narch: riscv\nsm: 75\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16]\ncolour: green\n"
    )
    (directory / "broken.yaml").write_text("name: [unclosed\n")
    with pytest.raises(ConfigurationError) as caught:
        load_device_types(directory)
    message = str(caught.value)
    lines = message.splitlines()
    valid_precisions = ", ".join(Precision)
    assert f"{orin}: precisions: unknown precision 'fp9'; valid: {valid_precisions}" in lines
    assert f"{orin}: toolchains: unknown toolchain 'cuda'; valid: {', '.join(Toolchain)}" in lines
    assert f"{directory / 'x86-new.yaml'}: name: 'x86-newer' must equal the file name 'x86-new'" in lines
    assert f"{directory / 'bad-sm.yaml'}: arch: unknown arch 'riscv'; valid: x86_64, aarch64" in lines
    assert any(line.startswith(f"{directory / 'bad-sm.yaml'}: unknown key 'colour'") for line in lines)
    assert any("broken.yaml:2: invalid YAML: while parsing a flow sequence" in line for line in lines)
    assert len(lines) == 1 + 6


def test_precision_inconsistent_with_sm_is_refused(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    (directory / "old-gpu.yaml").write_text(
        "name: old-gpu\ndescription: d\narch: x86_64\nsm: 75\nmemory_gb: 8\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16]\n"
    )
    with pytest.raises(ConfigurationError, match="precision fp8 needs SM89\\+ but sm is 75"):
        load_device_types(directory)


def test_a_new_device_type_is_one_yaml_file(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    (directory / "x86-l4.yaml").write_text(
        "name: x86-l4\ndescription: NVIDIA L4\narch: x86_64\nsm: 89\nmemory_gb: 24\ntoolchains: [tensorrt-edgellm]\n"
        "precisions: [fp16, fp8]\nkv_cache_precisions: [fp16, fp8]\n"
    )
    types = load_device_types(directory)
    assert types["x86-l4"].supports("fp8") == (True, "x86-l4 (SM89) supports fp8")


def test_a_refused_precision_needs_its_reason_and_cannot_also_be_listed(tmp_path: Path) -> None:
    directory = _types_dir(tmp_path)
    cpu = directory / "x86-cpu.yaml"
    text = cpu.read_text()
    cpu.write_text(text.replace("precisions: [fp32,", "precisions: [fp8, fp32,").replace(
        "fp8: fp8 is emulated on x86-cpu (no fp8 GEMM kernel)", "fp8: fp8 is emulated on x86-cpu (no fp8 GEMM kernel)\n"
        "  int8_wo: ''"))
    with pytest.raises(ConfigurationError) as err:
        load_device_types(directory)
    assert "refuses: give a reason for int8_wo" in str(err.value)
    cpu.write_text(text.replace("precisions: [fp32,", "precisions: [fp8, fp32,"))
    with pytest.raises(ConfigurationError, match=r"precision\(s\) fp8 both listed in precisions and refused"):
        load_device_types(directory)
