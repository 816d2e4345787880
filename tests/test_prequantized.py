"""Pre-quantized checkpoints (issue 21, item 2): a catalog model whose checkpoint already carries a quantization
(ModelOpt's ``hf_quant_config.json``, or a ``quantization_config`` in config.json: GPTQ's too) runs at the precision
read from it, never a requested one; its rows run no quantizer; a row that asks another precision is refused by
``edgefarm lists validate`` and by the plan, naming the model and both precisions. int4_gptq rows run where a
toolchain's export reads a GPTQ checkpoint (tensorrt-edgellm), and elsewhere are not applicable with the driver's
reason (edgellm's export reads no GPTQ layout).
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import Decision, plan_matrix
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import load_list
from edgefarm.toolchains import base as toolchains
from edgellm.config import QuantConfig
from edgellm.errors import ConfigurationError
from edgellm.types import Precision, QuantMethod
from tests.helpers.registries import registries_with

REPO = Path(__file__).resolve().parents[1]
SHIPPED = Catalog.load()
PREQUANTIZED = "tiny-qwen3-128-int4-awq"  # the shipped catalog's: int4_awq written by edgellm.synth_quant
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
# a Qwen2.5-0.5B-shaped config (head size 64: TensorRT Edge-LLM's kernels take it); no weights are read to plan
LAYOUT = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
          "intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 2,
          "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
          "torch_dtype": "float16"}
runner = CliRunner()


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data-dir"
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(data))
    return data


def _config_only(directory: Path, quantization: dict[str, Any] | None = None,
                 hf_quant: dict[str, Any] | None = None) -> Path:
    """A checkpoint directory as far as planning reads it: config.json (and hf_quant_config.json)."""
    directory.mkdir(parents=True)
    config = dict(LAYOUT, **({"quantization_config": quantization} if quantization else {}))
    (directory / "config.json").write_text(json.dumps(config))
    if hf_quant is not None:
        (directory / "hf_quant_config.json").write_text(json.dumps({"quantization": hf_quant}))
    return directory


def _catalog(tmp_path: Path, models: dict[str, Any]) -> Path:
    """A catalog beside the lists in ``tmp_path``: the shipped one's models plus ``models``."""
    shipped = yaml.safe_load((REPO / "test_lists" / "models.yml").read_text())["models"]
    path = tmp_path / "models.yml"
    path.write_text(yaml.safe_dump({"models": {**shipped, **models}}))
    return path


def _list(tmp_path: Path, rows: str, platforms: str = "[x86-cpu]") -> Path:
    path = tmp_path / "mine.yml"
    path.write_text(textwrap.dedent("""\
        name: mine
        stage: l0
        description: pre-quantized rows
        platforms:
          terms: {platforms}
        defaults:
          max_seq_len: 256
          max_batch_size: 2
          max_input_len: 128
        tests:
        """).format(platforms=platforms) + textwrap.indent(textwrap.dedent(rows), "  "))
    return path


# --- the catalog reads the checkpoint's own quantization --------------------------------------------------------


def test_the_catalog_reads_a_checkpoints_quantization_without_its_weights(tmp_path: Path) -> None:
    modelopt = _config_only(tmp_path / "fp8", hf_quant={"quant_algo": "FP8", "kv_cache_quant_algo": None})
    gptq = _config_only(tmp_path / "gptq", quantization=GPTQ)
    catalog = Catalog.load(_catalog(tmp_path, {"org/m-FP8": {"path": str(modelopt)},
                                               "org/m-GPTQ": {"path": str(gptq)}}))
    assert catalog.get("org/m-FP8").checkpoint_precision() is Precision.FP8
    found = catalog.get("org/m-GPTQ").quantization()
    assert found is not None and (found.method, found.modelopt) == (QuantMethod.INT4_GPTQ, False)
    assert catalog.get("stories260K").checkpoint_precision() is None  # float
    # a synth_quant entry's is known before it is written, and its shape is its base's
    source = SHIPPED.get(PREQUANTIZED)
    assert source.checkpoint_precision() is Precision.INT4_AWQ and source.base is not None
    assert source.base.name == "tiny-qwen3-128" and source.shape() == source.base.shape()


def test_a_synth_quant_entry_needs_a_float_base_and_a_method_it_writes(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        Catalog.load(_catalog(tmp_path, {"a": {"synth_quant": {"method": "int4_awq"}},
                                         "b": {"base": "nowhere", "synth_quant": {"method": "int4_awq"}},
                                         "c": {"base": PREQUANTIZED, "synth_quant": {"method": "int4_awq"}},
                                         "d": {"base": "tiny-qwen3-128", "synth_quant": {"method": "nvfp4"}}}))
    text = str(caught.value)
    assert "model 'a': Value error, synth_quant quantizes the entry's base: give base (a float catalog model)" in text
    assert "model 'b' base: unknown model 'nowhere'; known:" in text
    assert f"model 'c' base: '{PREQUANTIZED}' must be a float model without a base of its own" in text
    assert ("model 'd' synth_quant.method: 'nvfp4' is not written by edgellm.synth_quant; valid: int4_awq, "
            "int8_sq") in text


# --- lists validate: the row's precision is the checkpoint's ------------------------------------------------------


def test_lists_validate_refuses_a_precision_the_checkpoint_disagrees_with(tmp_path: Path) -> None:
    _catalog(tmp_path, {})
    _list(tmp_path, f"""\
        - model: {PREQUANTIZED}
          precision: fp16
        - model: {PREQUANTIZED}
          precision: int4_awq
          stages: [quantize, export]
        """)
    result = runner.invoke(app, ["lists", "validate", str(tmp_path), "--today", "2026-11-30"])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    assert (f"precision: model '{PREQUANTIZED}': its checkpoint is already quantized at precision int4_awq "
            f"(hf_quant_config.json (edgellm.synth_quant of tiny-qwen3-128)), but the row asks for precision fp16: a "
            f"pre-quantized checkpoint's precision is read from it, never requested (give precision int4_awq, or "
            f"leave it out)") in out
    assert "stages: model" in out and "stage quantize would quantize it again: leave quantize out of stages" in out


def test_a_row_without_precision_takes_the_checkpoints(tmp_path: Path) -> None:
    _catalog(tmp_path, {})
    tlist = load_list(_list(tmp_path, f"- model: {PREQUANTIZED}\n- {{model: {PREQUANTIZED}, precision: int4_awq, "
                                      f"case: given}}\n"))
    assert [(e.precision, e.test_id) for e in tlist.entries] == [
        (Precision.INT4_AWQ, f"{PREQUANTIZED}-int4_awq-mxsl256-mxbs2-mxil128"),
        (Precision.INT4_AWQ, f"{PREQUANTIZED}-int4_awq-mxsl256-mxbs2-mxil128-given")]
    shipped = {e.model: e for e in load_list("l0_pipeline_x86cpu").entries}
    assert shipped[PREQUANTIZED].precision is Precision.INT4_AWQ  # the shipped list's row gives none


# --- the plan: no quantizer; a disagreeing precision is refused; int4_gptq per toolchain -------------------------


def _matrix(tmp_path: Path, models: list[str], precisions: list[str], platforms: list[str]) -> Path:
    path = tmp_path / "m.yml"
    path.write_text(yaml.safe_dump({"name": "m", "models": models, "precisions": precisions, "platforms": platforms,
                                    "defaults": {**LIMITS, "stages": ["export", "build", "infer", "accuracy"]}}))
    return path


def test_the_plan_runs_a_prequantized_row_without_a_quantizer(tmp_path: Path, _own_data_dir: Path) -> None:
    """No toolchain quantizes it (tensorrt-edgellm, not installed here, would be int4_awq's quantizer otherwise: the
    float model's row is skipped for that), and the plan says where its precision was read."""
    plan = plan_matrix(_matrix(tmp_path, [PREQUANTIZED, "tiny-qwen3-128"], ["int4_awq"], ["x86-cpu"]),
                       load_inventory(data_dir=_own_data_dir), SHIPPED, data_dir=_own_data_dir)
    by = {j.model: j for j in plan.jobs}
    job = by[PREQUANTIZED]
    assert (job.decision, job.toolchain, job.quantizer) == (Decision.RUN, "edgellm-ort", None)
    assert job.to_json()["prequantized"] == ("pre-quantized checkpoint: precision int4_awq read from "
                                             "hf_quant_config.json (edgellm.synth_quant of tiny-qwen3-128)")
    assert by["tiny-qwen3-128"].decision is Decision.SKIPPED and "quantized by toolchain tensorrt-edgellm" in by[
        "tiny-qwen3-128"].reason
    assert plan.sources[PREQUANTIZED].base is plan.sources["tiny-qwen3-128"]  # its reference's model is located too


def test_the_plan_refuses_a_precision_the_checkpoint_disagrees_with(tmp_path: Path, _own_data_dir: Path) -> None:
    with pytest.raises(ConfigurationError) as caught:
        plan_matrix(_matrix(tmp_path, [PREQUANTIZED], ["int4_awq", "fp16", "int8_sq"], ["x86-cpu"]),
                    load_inventory(data_dir=_own_data_dir), SHIPPED, data_dir=_own_data_dir)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and all(f"model '{PREQUANTIZED}': its checkpoint is already quantized at precision "
                                   f"int4_awq" in line for line in lines)
    assert ["the row asks for precision fp16" in lines[0], "the row asks for precision int8_sq" in lines[1]] == [
        True, True]


def test_a_prequantized_row_is_no_job_of_a_quantizers_chosen_versions(tmp_path: Path,
                                                                       _own_data_dir: Path) -> None:
    """A matrix comparing quantizer versions multiplies the rows that quantize, not a pre-quantized one's."""
    path = _matrix(tmp_path, [PREQUANTIZED, "tiny-qwen3-128"], ["int4_awq"], ["x86-cpu"])
    path.write_text(path.read_text() + "toolchain_versions: {tensorrt-edgellm: ['0.11.0']}\n")
    plan = plan_matrix(path, load_inventory(data_dir=_own_data_dir), SHIPPED, data_dir=_own_data_dir)
    assert {j.model: j.entry.toolchain_versions for j in plan.jobs} == {
        PREQUANTIZED: (), "tiny-qwen3-128": (("tensorrt-edgellm", "0.11.0"),)}


def test_int4_gptq_is_not_applicable_on_the_cpu_with_the_drivers_reason(tmp_path: Path,
                                                                         _own_data_dir: Path) -> None:
    """A GPTQ checkpoint's rows on x86-cpu: edgellm's export reads no GPTQ layout (its reason, not the hardware's),
    nor does onnxruntime-genai's; a float model's int4_gptq row there likewise."""
    catalog = Catalog.load(_catalog(tmp_path, {"org/m-GPTQ": {"path": str(_config_only(tmp_path / "g", GPTQ))}}))
    plan = plan_matrix(_matrix(tmp_path, ["org/m-GPTQ", "tiny-qwen3-128"], ["int4_gptq"], ["x86-cpu"]),
                       load_inventory(data_dir=_own_data_dir), catalog, data_dir=_own_data_dir)
    reason = ("toolchain edgellm-ort cannot produce int4_gptq (produces: fp32, fp16, int4_awq, int8_sq, fp8): "
              "edgellm's export reads no int4_gptq checkpoint (edgellm/quant/int4_gptq.py declares no stored layout)")
    assert [(j.model, j.decision, j.reason) for j in plan.jobs] == [
        ("org/m-GPTQ", Decision.NOT_APPLICABLE, reason), ("tiny-qwen3-128", Decision.NOT_APPLICABLE, reason)]


@pytest.fixture
def standin_trt() -> Iterator[None]:
    """tensorrt-edgellm as installed, driving any device (planning only: nothing runs)."""
    from edgefarm.toolchains.tensorrt_edgellm.device_stages import TrtDeviceStages
    from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm, TrtEnvironment

    class StandInEnvironment(TrtEnvironment):
        def available(self) -> toolchains.Availability:
            return toolchains.Availability(True)

        def host_version(self) -> str:
            return "stand-in"

    class StandInDevice(TrtDeviceStages):
        def drives(self, device: Any) -> bool:
            return True

        def devices_problem(self, platform: str, devices: Any) -> str | None:
            return None

    class StandIn(TensorrtEdgellm):
        ENVIRONMENT = StandInEnvironment
        DEVICE_STAGES = StandInDevice

    with registries_with(replaced=[StandIn]):
        yield


@pytest.mark.usefixtures("standin_trt")
def test_int4_gptq_runs_with_tensorrt_edgellm_from_a_gptq_checkpoint(tmp_path: Path) -> None:
    """Its exporter reads Hugging Face GPTQ checkpoints: the row runs with no quantizer. A ModelOpt W4A16_GPTQ one it
    would export as fp16 without a word: not applicable, saying so. A float model's int4_gptq row is skipped: no
    toolchain of the farm quantizes to it."""
    gptq = _config_only(tmp_path / "g", GPTQ)
    modelopt_gptq = _config_only(tmp_path / "mg", hf_quant={"quant_algo": "W4A16_GPTQ", "group_size": 128})
    catalog = Catalog.load(_catalog(tmp_path, {"org/m-GPTQ": {"path": str(gptq)},
                                               "org/m-MO-GPTQ": {"path": str(modelopt_gptq)}}))
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "thor-1.yaml").write_text("type: thor\ntransport: local\nwork_dir: devices/x\n")
    plan = plan_matrix(_matrix(tmp_path, ["org/m-GPTQ", "org/m-MO-GPTQ", "qwen2.5-0.5b-layout"], ["int4_gptq"],
                               ["thor"]), load_inventory(inventory, data_dir=tmp_path), catalog, data_dir=tmp_path)
    by = {j.model: j for j in plan.jobs}
    job = by["org/m-GPTQ"]
    assert (job.decision, job.toolchain, job.quantizer, job.devices) == (Decision.RUN, "tensorrt-edgellm", None,
                                                                         ("thor-1",))
    assert job.prequantized == (f"pre-quantized checkpoint: precision int4_gptq read from {gptq}/config.json: "
                                f"quantization_config")
    refused = by["org/m-MO-GPTQ"]
    assert refused.decision is Decision.NOT_APPLICABLE
    assert refused.reason.startswith(f"toolchain tensorrt-edgellm: its exporter (0.11.0) reads ModelOpt int4_gptq "
                                     f"({modelopt_gptq}/hf_quant_config.json) as fp16 without a word")
    floating = by["qwen2.5-0.5b-layout"]
    assert floating.decision is Decision.SKIPPED
    assert floating.reason == ("no device/toolchain can run it here: toolchain tensorrt-edgellm builds int4_gptq "
                               "from a quantized checkpoint, and no toolchain of this farm quantizes int4_gptq")


def test_each_driver_says_which_prequantized_checkpoints_its_export_reads() -> None:
    def q(method: QuantMethod, modelopt: bool, kv: str | None = None) -> QuantConfig:
        return QuantConfig(method=method, source="S", modelopt=modelopt, kv_cache=kv)

    ort, trt = toolchains.driver("edgellm-ort"), toolchains.driver("tensorrt-edgellm")
    assert ort.prequantized_problem(q(QuantMethod.INT4_AWQ, True)) is None
    assert ort.prequantized_problem(q(QuantMethod.INT8_SQ, True)) is None
    assert ort.prequantized_problem(q(QuantMethod.INT4_GPTQ, False)) == (
        "toolchain edgellm-ort: edgellm's export reads ModelOpt unified checkpoints only (hf_quant_config.json, or "
        "quantization_config with quant_method modelopt); this checkpoint's int4_gptq is declared by S")
    assert "the checkpoint's fp8 KV cache (S) is not exported" in str(
        ort.prequantized_problem(q(QuantMethod.INT4_AWQ, True, "fp8")))
    assert trt.prequantized_problem(q(QuantMethod.INT4_GPTQ, False)) is None
    assert trt.prequantized_problem(q(QuantMethod.NVFP4, True)) is None
    assert "reads a Hugging Face fp8 checkpoint (S) as fp16 without a word: refused" in str(
        trt.prequantized_problem(q(QuantMethod.FP8, False)))
    genai = toolchains.driver("onnxruntime-genai")
    assert genai.prequantized_problem(q(QuantMethod.INT4_AWQ, True)) == (
        "toolchain onnxruntime-genai exports from float checkpoints only; this checkpoint is already quantized "
        "(int4_awq, S)")


# --- the stages: quantize never re-quantizes; the reference is the float base's ---------------------------------


def _job(checkpoint: CheckpointRef, **fields: Any) -> JobSpec:
    return JobSpec(**{"model": "m", "precision": Precision.INT4_AWQ, "platform": "x86-cpu", "toolchain": "edgellm-ort",
                      "test_id": "t", "checkpoint": checkpoint, "stages": ("export",), **LIMITS, **fields})


def test_the_quantize_stage_refuses_to_quantize_an_already_quantized_checkpoint(tmp_path: Path) -> None:
    from edgefarm.tasks.quantize import quantize_key

    ckpt = _config_only(tmp_path / "awq", hf_quant={"quant_algo": "W4A16_AWQ", "group_size": 128})
    job = _job(CheckpointRef("m", str(ckpt), "0" * 64), quantizer="tensorrt-edgellm")
    with pytest.raises(ConfigurationError, match=(
            rf"model 'm': checkpoint {ckpt} is already quantized \(int4_awq, {ckpt}/hf_quant_config.json\); "
            r"toolchain tensorrt-edgellm would quantize it again for int4_awq: refused")):
        quantize_key(SimpleNamespace(data_dir=str(tmp_path)), job)  # type: ignore[arg-type]


def test_a_prequantized_checkpoints_reference_is_its_float_base(tmp_path: Path) -> None:
    from edgefarm.tasks.reference import reference_key

    ckpt, base = CheckpointRef("m", "/q", "1" * 64), CheckpointRef("b", "/b", "2" * 64)
    line = "pre-quantized checkpoint: precision int4_awq read from hf_quant_config.json"
    keyed = reference_key(None, _job(ckpt, prequantized=line, reference_checkpoint=base))  # type: ignore[arg-type]
    assert keyed.inputs["checkpoint_sha256"] == "2" * 64
    with pytest.raises(ConfigurationError, match="name it in the model catalog \\(base: MODEL\\)"):
        reference_key(None, _job(ckpt, prequantized=line))  # type: ignore[arg-type]


# --- through the farm: export, build, infer and accuracy on x86-cpu with edgellm-ort ----------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_a_prequantized_row_runs_on_the_cpu_without_quantize(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from edgefarm.results.db import make_engine
    from edgefarm.results.models import CacheEntry, Result

    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"), "max_jobs": 2,
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    matrix = _matrix(tmp_path, [PREQUANTIZED], ["int4_awq"], ["x86-cpu"])
    result = runner.invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory),
                                 "--data-dir", str(data), "--docs-dir", str(tmp_path / "docs")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert result.exit_code == 0 and summary["failed"] == [] and summary["plan"] == {"run": 1}, summary
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    with Session(engine) as s:
        rows = {r.stage.value: r for r in s.scalars(select(Result).where(Result.run_id == summary["run_id"]))}
        keys = [e for e in s.scalars(select(CacheEntry.inputs))]
    engine.dispose()
    assert {st: r.status.value for st, r in rows.items()} == dict.fromkeys(
        ("export", "build", "infer", "accuracy"), "pass")  # quantize is not a stage of the row
    assert rows["export"].reason.startswith("pre-quantized checkpoint: precision int4_awq read from "
                                            "hf_quant_config.json")
    assert rows["build"].reason.startswith("engine precision int4_awq (read back from the built graph)")
    assert not [k for k in keys if k["stage"] == "quantize"]  # nothing quantized, nothing cached for it
    # the export read the pre-quantized checkpoint; the reference was computed from its float base
    [export_key] = [k for k in keys if k["stage"] == "export"]
    [reference_key] = [k for k in keys if k["stage"] == "reference"]
    checkpoints = data / "checkpoints"
    from edgellm.reference import checkpoint_digest

    assert export_key["checkpoint_sha256"] == checkpoint_digest(checkpoints / PREQUANTIZED)
    assert reference_key["checkpoint_sha256"] == checkpoint_digest(checkpoints / "tiny-qwen3-128")
    assert rows["export"].model_revision == export_key["checkpoint_sha256"]


# --- int4_gptq for real: a GPTQ checkpoint, exported by NVIDIA's exporter for Thor --------------------------------


def test_synth_quant_writes_hugging_faces_gptq_layout(tmp_path: Path) -> None:
    """What NVIDIA's exporter reads as int4_gptq: qweight/qzeros/scales/g_idx, config.json's quantization_config;
    the stored nibbles dequantize to the float weights within half a step."""
    import torch
    from safetensors.torch import load_file

    from edgellm.checkpoint.modelopt import quantized_linear_count
    from edgellm.synth import make_checkpoint
    from edgellm.synth_quant import quantize_rtn

    src = make_checkpoint(tmp_path / "src", "qwen3", seed=0, hidden_size=128, intermediate_size=256,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    out = quantize_rtn(src, tmp_path / "gptq", "int4_gptq", [])
    assert not (out / "hf_quant_config.json").exists()
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert {k: config[k] for k in ("quant_method", "bits", "group_size", "sym", "desc_act")} == {
        "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    found = QuantConfig.load(out)
    assert (found.method, found.modelopt, found.group_size) == (QuantMethod.INT4_GPTQ, False, 128)
    assert quantized_linear_count(out) == 14  # 7 linears x 2 layers; lm_head stays float
    stored, float_ = load_file(str(out / "model.safetensors")), load_file(str(src / "model.safetensors"))
    module = "model.layers.1.mlp.down_proj"  # [128, 256]: two groups along the input
    layout = {s: (stored[f"{module}.{s}"].dtype, tuple(stored[f"{module}.{s}"].shape))
              for s in ("qweight", "qzeros", "scales", "g_idx")}
    assert layout == {"qweight": (torch.int32, (32, 128)), "qzeros": (torch.int32, (2, 16)),
                      "scales": (torch.float16, (2, 128)), "g_idx": (torch.int32, (256,))}
    assert f"{module}.weight" not in stored and stored["lm_head.weight"].dtype == torch.float16
    assert set(stored[f"{module}.qzeros"].flatten().tolist()) == {0x77777777}  # zero 8, stored as 7
    packed = stored[f"{module}.qweight"].to(torch.int64)
    nibbles = torch.stack([(packed >> (4 * i)) & 0xF for i in range(8)], dim=1).reshape(256, 128)  # [in, out]
    scales = stored[f"{module}.scales"].float()[stored[f"{module}.g_idx"].long()]  # [in, out]
    weight = ((nibbles - 8).float() * scales).t()
    assert torch.all((weight - float_[f"{module}.weight"]).abs() <= scales.t() / 2 + 1e-6)


def test_int4_gptq_exports_for_thor_and_is_not_applicable_on_the_cpu(trt_env: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      prefect_harness: Path) -> None:
    """Through the farm: the shipped export list's GPTQ row runs tensorrt-edgellm's exporter on the checkpoint as it
    is (no quantizer; its 14 int4 linears checked in the graph); the nightly's CPU row of it is not applicable with
    edgellm-ort's reason."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from edgefarm.results.db import make_engine
    from edgefarm.results.models import CacheEntry, Result
    from tests.helpers.toolchain_env import link_real_toolchain

    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"), "max_jobs": 2,
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    link_real_toolchain(data, trt_env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    model = "tiny-qwen3-128-int4-gptq"
    matrix = tmp_path / "gptq.yml"
    matrix.write_text(yaml.safe_dump({"name": "gptq", "models": [model], "precisions": ["int4_gptq"],
                                      "platforms": ["x86-cpu"], "defaults": LIMITS,
                                      "lists": [{"name": "l0_checkpoint_export", "models": [model]}]}))
    result = runner.invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory),
                                 "--data-dir", str(data), "--docs-dir", str(tmp_path / "docs")])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert result.exit_code == 0 and summary["failed"] == [], summary
    assert summary["plan"] == {"run": 1, "not_applicable": 1}, summary
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    with Session(engine) as s:
        rows = {(r.platform, r.stage.value): r for r in s.scalars(select(Result).where(
            Result.run_id == summary["run_id"]))}
        keys = [e for e in s.scalars(select(CacheEntry.inputs))]
    engine.dispose()
    export = rows[("thor", "export")]
    assert (export.status.value, export.toolchain.value, export.precision.value) == ("pass", "tensorrt-edgellm",
                                                                                    "int4_gptq")
    assert export.reason.startswith("pre-quantized checkpoint: precision int4_gptq read from config.json: "
                                    "quantization_config; 2 attention plugins for 2 layers, 14 quantized GEMMs "
                                    "(report: 14)"), export.reason
    assert not [k for k in keys if k["stage"] == "quantize"]
    cpu = [r for (platform, _), r in rows.items() if platform == "x86-cpu"]
    assert cpu and {r.status.value for r in cpu} == {"not_applicable"}
    assert all("edgellm's export reads no int4_gptq checkpoint" in r.reason for r in cpu)
