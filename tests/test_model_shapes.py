"""A model's shape against a toolchain's kernels: the catalog reads each model's attention shape without its weights
(``ModelSource.shape``), TensorRT Edge-LLM says which shapes its attention kernels take on which SM
(``toolchains/tensorrt_edgellm/kernels.py``), and the plan records a model they refuse as not applicable with that
reason: the tiny models (head sizes 8-32) on Orin and Thor, while the layout models (real head sizes, random
weights, 1-2 layers) are planned there."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from edgefarm import stages
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import DEFAULT_MATRIX, Decision, plan_matrix, plan_test_list
from edgefarm.test_lists import load_list, validate_paths
from edgefarm.test_lists.capability import capability
from edgefarm.test_lists.catalog import Catalog, ModelSource
from edgefarm.toolchains.base import ModelShape, Variant, driver
from edgefarm.toolchains.tensorrt_edgellm import kernels
from edgellm.types import KVCachePrecision, Precision

HEADS = "TensorRT Edge-LLM's attention kernels take head sizes 64, 128, 256, 512 (prefill and decode); this model's is"
LAYOUTS = {"qwen2.5-0.5b-layout": ModelShape(896, 14, 2, 64, 2, 512),
           "llama-3.2-1b-layout": ModelShape(2048, 32, 8, 64, 1, 512),
           "qwen3-0.6b-layout": ModelShape(1024, 16, 8, 128, 2, 512),
           "gemma-3-1b-layout": ModelShape(1152, 4, 1, 256, 2, 512),
           "phi-4-mini-layout": ModelShape(3072, 24, 8, 128, 1, 512)}
LIMITS = {"max_seq_len": 256, "max_batch_size": 1, "max_input_len": 128}


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data-dir"
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return data


# ------------------------------------------------------------------------- the catalog's shapes

def test_each_catalog_kind_gives_its_shape_without_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog = Catalog.load()
    # bundled: its config.json (stories260K: 8 heads of 8)
    assert catalog.get("stories260K").shape() == ModelShape(64, 8, 4, 8, 5, 512)
    # synthetic: the family's tiny_config with the entry's overrides (head_dim: hidden // heads unless given)
    assert catalog.get("tiny-llama").shape() == ModelShape(64, 4, 2, 16, 2, 512)
    assert catalog.get("tiny-qwen3").shape() == ModelShape(64, 4, 2, 32, 2, 512)  # qwen3's tiny_config names 32
    assert catalog.get("tiny-qwen3-128").shape() == ModelShape(128, 4, 2, 64, 2, 512)
    for name, shape in LAYOUTS.items():
        assert catalog.get(name).shape() == shape
    assert not (tmp_path / "checkpoints").exists()  # nothing materialized

    # path: the checkpoint's config.json; absent (or its variable unset) -> None, decided as before
    monkeypatch.delenv("EDGEFARM_MODELS_DIR", raising=False)
    assert catalog.get("Qwen/Qwen2.5-0.5B-Instruct").shape() is None
    models = tmp_path / "models"
    monkeypatch.setenv("EDGEFARM_MODELS_DIR", str(models))
    assert catalog.get("Qwen/Qwen2.5-0.5B-Instruct").shape() is None  # no such directory
    ckpt = models / "Qwen2.5-0.5B-Instruct"
    ckpt.mkdir(parents=True)
    real = {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24,
            "vocab_size": 151936}
    (ckpt / "config.json").write_text(json.dumps(real))
    assert catalog.get("Qwen/Qwen2.5-0.5B-Instruct").shape() == ModelShape(896, 14, 2, 64, 24, 151936)

    def path_shape(config: object) -> ModelShape | None:
        directory = tmp_path / "one"
        directory.mkdir(exist_ok=True)
        (directory / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
        return ModelSource("one", "path", {"path": str(directory)}).shape()

    # a multimodal checkpoint's text model; no num_key_value_heads: one per query head; an explicit head_dim
    assert path_shape({"model_type": "x", "text_config": {**real, "num_key_value_heads": None, "head_dim": 128}}) \
        == ModelShape(896, 14, 14, 128, 24, 151936)
    assert path_shape({k: v for k, v in real.items() if k != "vocab_size"}) is None  # lacks a key
    assert path_shape("{not json") is None
    assert path_shape([1, 2]) is None


# ------------------------------------------------------------------------- the kernels' limits

def _shape(heads: int, kv: int, head_dim: int) -> ModelShape:
    return ModelShape(heads * head_dim, heads, kv, head_dim, 2, 512)


@pytest.mark.parametrize(("shape", "sm", "kv_cache", "expected"), [
    (_shape(8, 4, 8), 87, None, f"{HEADS} 8"),  # stories260K on Orin
    (_shape(8, 4, 8), 110, None, f"{HEADS} 8"),  # and on Thor
    (_shape(4, 2, 16), 110, None, f"{HEADS} 16"),  # the tiny models
    (_shape(4, 2, 32), 87, None, f"{HEADS} 32 (a decode kernel, but no prefill kernel)"),  # tiny-qwen3
    (_shape(14, 2, 64), 87, None, None),  # Qwen2.5-0.5B: 7 query heads per KV head
    (_shape(14, 2, 64), 110, None, None),
    (_shape(32, 8, 64), 87, None, None),  # Llama-3.2-1B
    (_shape(16, 8, 128), 110, None, None),  # Qwen3-0.6B
    (_shape(32, 2, 128), 110, None, None),  # 16 per KV head: 128 only
    (_shape(32, 2, 64), 87, None, "take head size 64 with 1, 2, 3, 4, 5, 6, 7, 8 query heads per KV head; this "
                                  "model has 16 (32 query, 2 KV heads)"),
    (_shape(12, 4, 256), 110, None, "TensorRT Edge-LLM's decode attention kernels (XQA) take head size 256 with 2, "
                                    "4, 6, 8 query heads per KV head; this model has 3 (12 query, 4 KV heads)"),
    (_shape(8, 4, 256), 110, None, None),
    (_shape(4, 1, 256), 87, None, None),  # Gemma-3 1B: 4 query heads per KV head of 256
    (_shape(24, 8, 128), 87, None, None),  # Phi-4-mini: 3 per KV head of 128
    (_shape(32, 2, 512), 110, None, None),
    (_shape(12, 2, 512), 110, None, "take head size 512 with 2, 4, 8, 16 query heads per KV head; this model has 6"),
    (_shape(14, 4, 64), 87, None, "need the query heads to be a multiple of the KV heads; this model has 14 query "
                                  "and 4 KV heads"),
    (_shape(14, 2, 64), 75, None, "prefill attention kernels exist for SM80, SM86, SM87, SM89, SM100, SM101, SM110, "
                                  "SM120, SM121; this GPU is SM75"),
    (_shape(14, 2, 64), 90, None, "prefill attention kernels exist for SM80, SM86, SM87, SM89, SM100, SM101, SM110, "
                                  "SM120, SM121; this GPU is SM90"),  # Hopper (x86-h200): no kernel at all
    (_shape(14, 2, 64), None, None, "attention kernels need an NVIDIA GPU"),
    (_shape(14, 2, 64), 87, KVCachePrecision.FP8, "TensorRT Edge-LLM's FP8 KV cache runs only on SM89, SM100, SM101, "
                                                  "SM110, SM120, SM121; this GPU is SM87"),
    (_shape(14, 2, 64), 110, KVCachePrecision.FP8, None),
    (_shape(14, 2, 64), 87, KVCachePrecision.FP16, None),
])
def test_the_kernels_take_what_nvidia_built(shape: ModelShape, sm: int | None, kv_cache: KVCachePrecision | None,
                                            expected: str | None) -> None:
    found = kernels.problem(shape, sm, kv_cache)
    if expected is None:
        assert found is None
    else:
        assert found is not None and expected in found, found
        assert driver("tensorrt-edgellm").model_problem(shape, sm, Variant(Precision.FP8, kv_cache=kv_cache)) \
            == found  # the driver's answer is the table's


def test_capability_asks_the_model_only_when_its_shape_is_known() -> None:
    stories = Catalog.load().get("stories260K").shape()
    assert capability("orin", None, Variant(Precision.FP16))
    refused = capability("orin", None, Variant(Precision.FP16), stories)
    assert not refused and refused.reason == f"{HEADS} 8"
    assert capability("thor", "tensorrt-edgellm", Variant(Precision.NVFP4), LAYOUTS["qwen3-0.6b-layout"])
    assert capability("x86-cpu", None, Variant(Precision.FP32), stories)  # ONNX Runtime's CPU takes any head size
    # the hardware answers first: fp8 on Orin is refused for its SM whatever the model
    assert capability("orin", None, Variant(Precision.FP8), stories).reason == "orin (SM87) does not support fp8 " \
                                                                                "(needs SM89+)"


# ------------------------------------------------------------------------- the plan

def test_the_tiny_models_are_not_applicable_on_orin_and_thor_but_run_on_the_cpu(_own_data_dir: Path) -> None:
    inventory = load_inventory(data_dir=_own_data_dir)
    plan = plan_matrix(DEFAULT_MATRIX, inventory, Catalog.load(), data_dir=_own_data_dir)
    # the matrix's own rows (not the export list's host-only share, which no device kernel takes part in, nor a
    # variant row: the CPU's LoRA row is not applicable for its toolchain's reason)
    main = [j for j in plan.jobs if j.entry.toolchain is None and not set(j.entry.stages) <= stages.host_stages()
            and j.entry.features.plain]
    for job in main:
        if job.platform == "x86-cpu":
            assert HEADS not in job.reason
            if job.precision.value in ("fp32", "fp16"):
                assert job.decision is Decision.RUN, job
            continue
        assert job.decision is Decision.NOT_APPLICABLE, job
        if capability(job.platform, None, Variant(job.precision)):  # else the hardware refuses first (fp32, fp8)
            assert job.reason.startswith(HEADS), job
    by = {(j.model, j.precision.value, j.platform): j for j in main}
    assert by[("stories260K", "fp16", "orin")].reason == f"{HEADS} 8"
    assert by[("tiny-qwen3-bf16", "fp8", "thor")].reason == f"{HEADS} 32 (a decode kernel, but no prefill kernel)"
    assert by[("tiny-qwen2-bf16", "fp16", "thor")].reason == f"{HEADS} 16"


def test_the_layout_models_are_planned_on_orin_and_thor(tmp_path: Path, _own_data_dir: Path) -> None:
    """With the pinned environment (a planning stand-in) and an Orin and a Thor whose inventory has a TensorRT
    Edge-LLM install, every layout row of the hardware lists runs; the real models' rows beside them are skipped
    (their checkpoints are not here)."""
    from tests.helpers.toolchain_env import stand_in_toolchain_env

    stand_in_toolchain_env(_own_data_dir)
    directory = tmp_path / "inventory"
    directory.mkdir()
    install = {"build_dir": "/opt/edge-llm/build", "trt_package_dir": "/opt/trt",
               "plugin_path": "/opt/edge-llm/build/libNvInfer_edgellm_plugin.so", "version": "0.11.0"}
    for platform in ("orin", "thor"):
        (directory / f"{platform}-1.yaml").write_text(yaml.safe_dump(
            {"type": platform, "transport": "local", "work_dir": f"d/{platform}",
             "toolchains": {"tensorrt-edgellm": install}}))
    inventory, catalog = load_inventory(directory, data_dir=_own_data_dir), Catalog.load()
    issue35 = {"gemma-3-1b-layout", "phi-4-mini-layout"}
    for name, models in [("l0_pipeline_orin", {"qwen2.5-0.5b-layout", "llama-3.2-1b-layout", *issue35}),
                         ("l0_pipeline_thor", {"qwen2.5-0.5b-layout", "qwen3-0.6b-layout", *issue35})]:
        plan = plan_test_list(load_list(name), inventory, catalog, data_dir=_own_data_dir)
        layout = [j for j in plan.jobs if j.model in LAYOUTS]
        assert {j.model for j in layout} == models
        assert all((j.decision, j.toolchain) == (Decision.RUN, "tensorrt-edgellm") for j in layout), layout
        real = [j for j in plan.jobs if j.model not in LAYOUTS]
        assert real and all(j.decision in (Decision.SKIPPED, Decision.WAIVED) for j in real)
    thor = {(j.model, j.precision.value): j for j in plan.jobs}
    assert thor[("qwen2.5-0.5b-layout", "fp8")].entry.kv_cache_precision is KVCachePrecision.FP8
    # the kernels' limits bind where a stage runs on the device: host-only rows (quantize, export) still plan
    exports = plan_test_list(load_list("l0_checkpoint_export"), inventory, catalog, data_dir=_own_data_dir)
    stories = [j for j in exports.jobs if j.model == "stories260K"]
    assert stories and all(j.decision is Decision.RUN and j.devices == () for j in stories)


def test_a_list_naming_a_model_the_kernels_refuse_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "mine.yml"
    path.write_text(yaml.safe_dump({
        "name": "mine", "stage": "l0", "description": "kernels", "platforms": {"terms": ["orin", "x86-cpu"]},
        "defaults": LIMITS,
        "tests": [{"model": "stories260K", "precision": "fp16"},
                  {"model": "qwen2.5-0.5b-layout", "precision": "fp16"},
                  {"model": "tiny-llama", "precision": "fp16", "stages": ["export"]}]}))
    report = validate_paths([path])
    assert [str(p).split(": ", 1)[1] for p in report.errors] == [
        f"tests[0] stories260K-fp16-mxsl256-mxbs1-mxil128: model: {HEADS} 8"]


# ------------------------------------------------------------------------- NVIDIA's quantizer on a layout checkpoint

def test_the_qwen2_layout_checkpoint_quantizes_with_nvidias_quantizer(trt_env: Path, tmp_path: Path,
                                                                     shared_toolchain_runs: object) -> None:
    """The layout checkpoint names the bundled tokenizer's <unk> as pad token: transformers' Qwen2 tokenizer (what
    the quantizer's AutoTokenizer picks for model_type qwen2) would otherwise add <|endoftext|> as pad id 512, outside
    the 512-token vocabulary, and calibration fails with "IndexError: index out of range in self".

    tests/test_board_pipeline.py's l0_pipeline_orin makes the same run (its int4_awq row, at 2 calibration rows), so
    a session that ran that list shares it (``shared_toolchain_runs``)."""
    from edgefarm.toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE
    from edgefarm.toolchains.tensorrt_edgellm.quantize import quantize

    ckpt = Catalog.load().get("qwen2.5-0.5b-layout").locate(tmp_path / "data")
    assert json.loads((ckpt / "tokenizer_config.json").read_text())["pad_token"] == "<unk>"
    probe = ("import sys; from transformers import AutoTokenizer; "
             "print(AutoTokenizer.from_pretrained(sys.argv[1]).pad_token_id)")
    python = str(trt_env / "bin" / "python")
    assert subprocess.run([python, "-c", probe, str(ckpt)], capture_output=True, text=True,
                          check=True).stdout.split()[-1] == "0"  # <unk>, inside the vocabulary

    result = quantize(trt_env, ckpt, tmp_path / "q", "int4_awq", chat_template=DEFAULT_CHAT_TEMPLATE, num_samples=2)
    assert result.report.quant_algo == "W4A16_AWQ"
    assert len(result.report.quantized) == 14 and result.report.unquantized == []  # 2 layers x 7 linears
