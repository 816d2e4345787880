"""Planning: the matrix and test lists expand into jobs with decisions and reasons; bad input lists every problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import DEFAULT_MATRIX, Decision, plan_matrix, plan_test_list
from edgefarm.registries import current
from edgefarm.stages import Stage
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import load_list
from edgefarm.test_lists.schema import DEFAULT_STAGES
from edgellm.errors import ConfigurationError
from tests.helpers.registries import registries_with

DATA = Path(__file__).parent / "data"
INSTALL = "edgefarm toolchains install tensorrt-edgellm==0.11.0"


@pytest.fixture(autouse=True)
def _own_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Plans depend on the toolchains installed in the data dir: each test has its own (none installed)."""
    data = tmp_path / "data-dir"
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(data))
    return data


def test_default_matrix_plan_decides_every_cell_with_a_reason(_own_data_dir: Path) -> None:
    inventory = load_inventory(data_dir=_own_data_dir)
    plan = plan_matrix(DEFAULT_MATRIX, inventory, Catalog.load(), data_dir=_own_data_dir)
    by = {(j.model, j.precision.value, j.platform): j for j in plan.jobs if j.entry.toolchain is None}
    genai = {(j.model, j.precision.value): j for j in plan.jobs if j.entry.toolchain is not None}
    assert {j.toolchain for j in genai.values()} == {"onnxruntime-genai"}  # the block that asks for it, side by side
    assert genai[("tiny-llama", "int4_wo")].decision is Decision.RUN  # quantized by its own export: no quantizer
    assert genai[("tiny-llama", "int4_wo")].quantizer is None
    assert by[("stories260K", "fp32", "x86-cpu")].decision is Decision.RUN
    assert by[("stories260K", "fp32", "x86-cpu")].devices == ("local-cpu",)
    orin_fp8 = by[("stories260K", "fp8", "orin")]
    assert orin_fp8.decision is Decision.NOT_APPLICABLE and "needs SM89+" in orin_fp8.reason
    # no tiny model's head size (8-32) has a TensorRT Edge-LLM attention kernel: not applicable on Orin and Thor
    thor_fp16 = by[("tiny-qwen3-bf16", "fp16", "thor")]
    assert (thor_fp16.decision, thor_fp16.toolchain) == (Decision.NOT_APPLICABLE, "tensorrt-edgellm")
    assert thor_fp16.reason == ("TensorRT Edge-LLM's attention kernels take head sizes 64, 128, 256, 512 (prefill "
                                "and decode); this model's is 32 (a decode kernel, but no prefill kernel)")
    thor_fp8 = by[("tiny-qwen2-bf16", "fp8", "thor")]
    assert thor_fp8.decision is Decision.NOT_APPLICABLE and "this model's is 16" in thor_fp8.reason
    cpu_fp8 = by[("tiny-qwen2-bf16", "fp8", "x86-cpu")]
    assert (cpu_fp8.decision, cpu_fp8.reason) == (Decision.NOT_APPLICABLE,
                                                  "fp8 is emulated on x86-cpu (no fp8 GEMM kernel)")
    cpu_int4 = by[("tiny-qwen3-128", "int4_awq", "x86-cpu")]  # its quantizer is missing: skipped, saying so
    assert cpu_int4.decision is Decision.SKIPPED and cpu_int4.toolchain == "edgellm-ort"
    assert cpu_int4.reason == ("no device/toolchain can run it here: int4_awq is quantized by toolchain "
                               "tensorrt-edgellm, which is not available: tensorrt-edgellm 0.11.0 is not installed "
                               f"in the farm's data dir (run: {INSTALL})")
    assert by[("stories260K", "fp32", "x86-cpu")].toolchain == "edgellm-ort"
    # export once per (model, precision, toolchain), whatever the number of platforms
    assert len(plan.exports()) == len({(j.model, j.precision, j.toolchain) for j in plan.runnable()})
    assert all(j.decision is not Decision.RUN or j.platform == "x86-cpu" for j in plan.jobs)


def test_dry_run_prints_the_plan_and_touches_nothing(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "plan nightly (nightly)" in result.output
    assert "not_applicable orin" in result.output
    assert "(orin (SM87) does not support fp8 (needs SM89+))" in result.output
    assert not (tmp_path / "edgefarm.db").exists()
    assert not (tmp_path / "checkpoints").exists()  # synthetic checkpoints are not even materialized


def test_broken_matrix_exits_2_listing_every_problem(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--matrix", str(DATA / "matrices" / "broken.yml"),
                                      "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    text = result.output
    for expected in ("unknown model 'no-such-model'", "unknown precision 'fp9'", "unknown precision 'int3'",
                     "unknown platform 'jetson-nano'"):
        assert expected in text, text
    assert "Traceback" not in text


def test_matrix_with_inconsistent_limits_and_stage_order_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "m.yml"
    bad.write_text(yaml.safe_dump({"name": "m", "models": ["stories260K"], "precisions": ["fp32"],
                                   "platforms": ["x86-cpu"], "defaults": {"max_seq_len": 64, "max_batch_size": 1,
                                                                          "max_input_len": 128,
                                                                          "stages": ["build", "export"]}}))
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--matrix", str(bad), "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "max_input_len 128 > max_seq_len 64" in result.output
    assert "not in pipeline order" in result.output


def test_l0_list_plan_runs_on_local_cpu_and_hardware_lists_wait_for_devices(_own_data_dir: Path) -> None:
    inventory, catalog = load_inventory(data_dir=_own_data_dir), Catalog.load()
    l0 = plan_test_list(load_list("l0_pipeline_x86cpu"), inventory, catalog, data_dir=_own_data_dir)
    assert l0.kind == "l0" and l0.runnable() and all(j.platform == "x86-cpu" for j in l0.jobs)
    orin = plan_test_list(load_list("l0_pipeline_orin"), inventory, catalog, data_dir=_own_data_dir)
    assert orin.jobs and not orin.runnable()
    reasons = {j.decision for j in orin.jobs}
    assert reasons <= {Decision.SKIPPED, Decision.WAIVED, Decision.NOT_APPLICABLE}


def _inventory_with(tmp_path: Path, platform: str) -> Path:
    """The shipped local CPU device plus a stand-in device of ``platform`` (planning only: nothing is run)."""
    directory = tmp_path / "inventory"
    directory.mkdir()
    (directory / "local-cpu.yaml").write_text("type: x86-cpu\ntransport: local\nwork_dir: devices/local-cpu\n")
    (directory / f"{platform}-1.yaml").write_text(f"type: {platform}\ntransport: local\nwork_dir: devices/x\n")
    return directory


def test_an_orin_in_the_inventory_is_never_planned_with_onnx_runtime(tmp_path: Path) -> None:
    inventory = load_inventory(_inventory_with(tmp_path, "orin"), data_dir=tmp_path)
    plan = plan_matrix(DEFAULT_MATRIX, inventory, Catalog.load(), data_dir=tmp_path)
    orin = [j for j in plan.jobs if j.platform == "orin"]
    assert orin and all(j.toolchain == "tensorrt-edgellm" for j in orin)
    assert not [j for j in orin if j.decision is Decision.RUN]
    fp16 = next(j for j in orin if j.precision.value == "fp16")  # the nightly's tiny models: no kernel on Orin
    assert fp16.decision is Decision.NOT_APPLICABLE and "attention kernels take head sizes" in fp16.reason
    layout = plan_test_list(load_list("l0_pipeline_orin"), inventory, Catalog.load(), data_dir=tmp_path)
    fp16 = next(j for j in layout.jobs if j.model == "qwen2.5-0.5b-layout" and j.precision.value == "fp16")
    assert fp16.decision is Decision.SKIPPED and fp16.devices == ("orin-1",)
    assert fp16.reason == ("no device/toolchain can run it here: toolchain tensorrt-edgellm is not available: "
                           f"tensorrt-edgellm 0.11.0 is not installed in the farm's data dir (run: {INSTALL})")
    assert all(j.toolchain == ("edgellm-ort" if j.entry.toolchain is None else j.entry.toolchain)
               for j in plan.jobs if j.platform == "x86-cpu")


def test_a_precision_the_asked_toolchain_cannot_produce_is_not_applicable_naming_it(tmp_path: Path) -> None:
    matrix = tmp_path / "m.yml"
    matrix.write_text(yaml.safe_dump({"name": "m", "models": ["stories260K"], "precisions": ["int4_wo"],
                                      "platforms": ["x86-cpu"], "toolchains": ["edgellm-ort"],
                                      "defaults": {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}}))
    [job] = plan_matrix(matrix, load_inventory(data_dir=tmp_path), Catalog.load(), data_dir=tmp_path).jobs
    assert (job.decision, job.toolchain) == (Decision.NOT_APPLICABLE, "edgellm-ort")
    assert job.reason == ("toolchain edgellm-ort cannot produce int4_wo (produces: fp32, fp16, int4_awq, int8_sq, "
                          "fp8): edgellm's export reads no int4_wo checkpoint (edgellm/quant/int4_wo.py declares no "
                          "stored layout)")
    assert job.test_id.endswith("-by.edgellm.ort")  # a toolchain a block asks for is part of the test's id


def test_with_a_tensorrt_edgellm_driver_orin_fp16_is_planned_with_it(tmp_path: Path) -> None:
    """The choice is the registry's answer: a stand-in driver (planning only, it never builds anything) makes
    orin fp16 runnable, and still with tensorrt-edgellm, never ONNX Runtime."""
    import edgefarm.toolchains.base as base
    from edgefarm.toolchains.tensorrt_edgellm.device_stages import TrtDeviceStages
    from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm, TrtEnvironment

    class StandInEnvironment(TrtEnvironment):
        def available(self) -> base.Availability:
            return base.Availability(True)

        def host_version(self) -> str:
            return "stand-in"

    class StandInDevice(TrtDeviceStages):
        def drives(self, device: Any) -> bool:
            return True

        def devices_problem(self, platform: str, devices: Any) -> str | None:
            return None

    class StandInTensorrtEdgellm(TensorrtEdgellm):
        ENVIRONMENT = StandInEnvironment
        DEVICE_STAGES = StandInDevice

    matrix = tmp_path / "m.yml"
    matrix.write_text(yaml.safe_dump({"name": "m", "models": ["stories260K", "qwen2.5-0.5b-layout"],
                                      "precisions": ["fp16", "fp8"], "platforms": ["orin"],
                                      "defaults": {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}}))
    with registries_with(replaced=[StandInTensorrtEdgellm]):  # the real drivers, but this stand-in
        inventory = load_inventory(_inventory_with(tmp_path, "orin"), data_dir=tmp_path)
        plan = plan_matrix(matrix, inventory, Catalog.load(), data_dir=tmp_path)
    by = {(j.model, j.precision.value, j.platform): j for j in plan.jobs}
    fp16 = by[("qwen2.5-0.5b-layout", "fp16", "orin")]
    assert (fp16.decision, fp16.toolchain, fp16.devices) == (Decision.RUN, "tensorrt-edgellm", ("orin-1",))
    assert fp16.toolchain_version == "stand-in"  # resolved once by the plan, handed to the stages
    assert by[("qwen2.5-0.5b-layout", "fp8", "orin")].decision is Decision.NOT_APPLICABLE
    assert by[("stories260K", "fp16", "orin")].decision is Decision.NOT_APPLICABLE  # head size 8: no kernel


def test_orin_with_an_fp8_kv_cache_is_not_applicable_for_its_hardware(tmp_path: Path) -> None:
    """The device type's KV-cache and LM-head limits hold for matrices too (the one capability function): Orin's
    KV cache is fp16 or int8, whatever a toolchain could make."""
    matrix = tmp_path / "m.yml"
    limits = {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}
    matrix.write_text(yaml.safe_dump({
        "name": "m", "models": ["tiny-qwen3-128"], "precisions": ["int4_awq"], "platforms": ["orin"],
        "defaults": limits,
        "extra": [{"models": ["tiny-qwen3-128"], "precisions": ["int4_awq"], "platforms": ["orin"],
                   "defaults": {"kv_cache_precision": "fp8"}},
                  {"models": ["tiny-qwen3-128"], "precisions": ["int4_awq"], "platforms": ["orin"],
                   "defaults": {"lm_head_precision": "nvfp4"}}]}))
    by = {j.test_id: j for j in plan_matrix(matrix, load_inventory(data_dir=tmp_path), Catalog.load(),
                                             data_dir=tmp_path).jobs}
    kv = next(j for i, j in by.items() if "fp8kv" in i)
    assert kv.decision is Decision.NOT_APPLICABLE
    assert kv.reason == "orin (SM87) does not support a fp8 KV cache (needs SM89+)"
    head = next(j for i, j in by.items() if "lmnvfp4" in i)
    assert (head.decision, head.reason) == (Decision.NOT_APPLICABLE,
                                            "orin (SM87) does not support a nvfp4 LM head (needs SM100+)")


def test_an_lm_head_or_kv_cache_the_toolchain_cannot_give_is_not_applicable_with_the_reason(tmp_path: Path) -> None:
    matrix = tmp_path / "m.yml"
    defaults = {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}
    matrix.write_text(yaml.safe_dump({"name": "m", "models": ["stories260K"], "precisions": ["fp16", "fp32"],
                                      "platforms": ["x86-cpu"],
                                      "defaults": {**defaults, "lm_head_precision": "fp32"}}))
    plan = plan_matrix(matrix, load_inventory(data_dir=tmp_path), Catalog.load(), data_dir=tmp_path)
    by = {j.precision.value: j for j in plan.jobs}
    assert by["fp32"].decision is Decision.RUN  # fp32 exports hold an fp32 LM head: it reaches export
    assert by["fp16"].decision is Decision.NOT_APPLICABLE
    assert by["fp16"].reason == ("toolchain edgellm-ort: LM-head precision 'fp32' is not supported by export at "
                                 "fp16; supported: fp16")


def test_dry_run_json_lists_every_job_with_its_decision(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--format", "json", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    # the main block (6 models x 3 precisions x 3 platforms), the CPU's quantized rows, the GPTQ checkpoint's CPU row,
    # onnxruntime-genai's rows (3 models x 2 precisions), the CPU's LoRA row (not applicable), the export list's share,
    # the variant list's share (the EAGLE3 pair, a merged LoRA, a reduced vocabulary), the fp16 checkpoints as
    # published (4 families at fp32 on the CPU), and issue 35's families as published in bf16 (3 models x 3
    # precisions x 3 platforms, the main block's cells)
    assert plan["name"] == "nightly" and sum(plan["counts"].values()) == len(plan["jobs"]) == \
        6 * 3 * 3 + 3 + 1 + 6 + 1 + 2 + 4 + 4 + 3 * 3 * 3
    for job in plan["jobs"]:
        assert {"model", "precision", "platform", "toolchain", "decision", "reason", "test_id"} <= set(job)
        assert job["decision"] in ("run", "not_applicable", "skipped")
        assert (job["decision"] == "run") == (job["reason"] == "")
    assert not (tmp_path / "edgefarm.db").exists()
    bad = CliRunner().invoke(app, ["nightly", "--dry-run", "--format", "yaml", "--data-dir", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown --format 'yaml'; valid: text, json" in bad.output


def test_host_only_jobs_need_no_device_and_device_stages_wait_for_the_driver(_own_data_dir: Path) -> None:
    """With the pinned tensorrt-edgellm environment (a planning stand-in) and no Thor in the inventory: the export
    list's quantize+export jobs run on the host; a Thor job that needs the device is skipped, naming both gaps."""
    from tests.helpers.toolchain_env import stand_in_toolchain_env

    stand_in_toolchain_env(_own_data_dir)
    inventory, catalog = load_inventory(data_dir=_own_data_dir), Catalog.load()
    exports = plan_test_list(load_list("l0_checkpoint_export"), inventory, catalog, data_dir=_own_data_dir)
    tiny = {j.precision.value: j for j in exports.jobs if j.model == "tiny-qwen3-128"}
    assert set(tiny) == {"fp16", "fp8", "int4_awq", "int8_sq", "nvfp4"}
    assert all((j.decision, j.toolchain, j.devices, j.platform) == (Decision.RUN, "tensorrt-edgellm", (), "thor")
               for j in tiny.values())
    assert tiny["fp16"].entry.stages == (Stage.EXPORT,)  # nothing to quantize at fp16
    by = {(j.model, j.precision.value, j.platform): j for j in plan_matrix(DEFAULT_MATRIX, inventory, catalog,
                                                                              data_dir=_own_data_dir).jobs}
    assert by[("tiny-qwen3-bf16", "fp16", "thor")].decision is Decision.NOT_APPLICABLE  # no kernel for its head size
    thor = next(j for j in plan_test_list(load_list("l0_pipeline_thor"), inventory, catalog,
                                          data_dir=_own_data_dir).jobs
                if (j.model, j.precision.value) == ("qwen3-0.6b-layout", "nvfp4"))
    assert thor.decision is Decision.SKIPPED
    assert "no device of platform thor in the inventory" in thor.reason
    assert ("no device of platform thor has a TensorRT Edge-LLM install (add a toolchains: {tensorrt-edgellm: "
            "{...}} block") in thor.reason
    assert by[("tiny-qwen3-128", "int4_awq", "x86-cpu")].decision is Decision.RUN


def test_a_tensorrt_row_runs_only_where_a_device_of_its_platform_has_an_install(_own_data_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """Orin fp16 with the real driver: skipped while the Orin's inventory file has no tensorrt-edgellm block (the
    reason names the key to add), run on that device once it has one; a bad block is refused naming file and keys."""
    from tests.helpers.toolchain_env import stand_in_toolchain_env

    stand_in_toolchain_env(_own_data_dir)
    directory = _inventory_with(tmp_path, "orin")
    matrix = tmp_path / "m.yml"
    matrix.write_text(yaml.safe_dump({"name": "m", "models": ["qwen2.5-0.5b-layout"], "precisions": ["fp16"],
                                      "platforms": ["orin"],
                                      "defaults": {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}}))
    job = plan_matrix(matrix, load_inventory(directory, data_dir=_own_data_dir), Catalog.load(),
                      data_dir=_own_data_dir).jobs[0]
    assert (job.decision, job.toolchain) == (Decision.SKIPPED, "tensorrt-edgellm")
    assert job.reason == ("no device/toolchain can run it here: no device of platform orin has a TensorRT Edge-LLM "
                          "install (add a toolchains: {tensorrt-edgellm: {...}} block with build_dir, "
                          "trt_package_dir, plugin_path to its inventory file)")
    install = {"build_dir": "/opt/edge-llm/build", "trt_package_dir": "/opt/trt",
               "plugin_path": "/opt/edge-llm/build/libNvInfer_edgellm_plugin.so", "version": "0.11.0"}
    (directory / "orin-2.yaml").write_text(yaml.safe_dump({"type": "orin", "transport": "local", "work_dir": "d/y",
                                                           "toolchains": {"tensorrt-edgellm": install}}))
    job = plan_matrix(matrix, load_inventory(directory, data_dir=_own_data_dir), Catalog.load(),
                      data_dir=_own_data_dir).jobs[0]
    assert (job.decision, job.toolchain, job.devices) == (Decision.RUN, "tensorrt-edgellm", ("orin-2",))
    (directory / "orin-2.yaml").write_text(yaml.safe_dump({"type": "orin", "transport": "local", "work_dir": "d/y",
                                                           "toolchains": {"tensorrt-edgellm": {**install,
                                                                                               "pluginPath": "/x"}}}))
    with pytest.raises(ConfigurationError, match=r"orin-2.yaml: toolchains.tensorrt-edgellm: device 'orin-2': "
                                                 r".*unknown "
                                                 r"pluginPath \(valid keys: build_dir, trt_package_dir, plugin_path, "
                                                 r"version, standin, direct_builder, or builds:\)"):
        load_inventory(directory, data_dir=_own_data_dir, registries=current())  # the toolchains check their blocks
    (directory / "orin-2.yaml").write_text(yaml.safe_dump({"type": "orin", "transport": "local", "work_dir": "d/y",
                                                           "tensorrt_edgellm": install}))
    with pytest.raises(ConfigurationError, match=r"orin-2.yaml: tensorrt_edgellm: a toolchain's block goes under "
                                                 r"toolchains: \{tensorrt-edgellm: \{...\}\}"):
        load_inventory(directory, data_dir=_own_data_dir, registries=current())


def test_a_matrix_takes_extra_blocks_and_shares_of_test_lists(tmp_path: Path) -> None:
    matrix = tmp_path / "m.yml"
    limits = {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}
    matrix.write_text(yaml.safe_dump({
        "name": "m", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"], "defaults": limits,
        "extra": [{"models": ["tiny-qwen3-128"], "precisions": ["int8_sq"], "platforms": ["x86-cpu"],
                   "defaults": {"stages": ["quantize", "export"]}}],
        "lists": [{"name": "l0_checkpoint_export", "models": ["stories260K"], "precisions": ["nvfp4", "int8_sq"]}]}))
    plan = plan_matrix(matrix, load_inventory(data_dir=tmp_path), Catalog.load(), data_dir=tmp_path)
    assert sorted((j.model, j.precision.value, j.platform, j.entry.stages) for j in plan.jobs) == [
        ("stories260K", "fp32", "x86-cpu", tuple(DEFAULT_STAGES)),
        ("stories260K", "int8_sq", "thor", (Stage.QUANTIZE, Stage.EXPORT)),
        ("stories260K", "nvfp4", "thor", (Stage.QUANTIZE, Stage.EXPORT)),
        ("tiny-qwen3-128", "int8_sq", "x86-cpu", (Stage.QUANTIZE, Stage.EXPORT)),
    ]
    extra = next(j for j in plan.jobs if j.model == "tiny-qwen3-128")
    assert extra.entry.max_seq_len == 64  # an extra block takes the matrix's defaults under its own
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump({
        "name": "bad", "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        "defaults": limits, "extra": [{"models": ["nope"], "precisions": ["fp9"], "platforms": ["x86-cpu"]}],
        "lists": [{"name": "l9_nothing"}, {"name": "l0_checkpoint_export", "models": ["nope"]}]}))
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--matrix", str(bad), "--data-dir", str(tmp_path)])
    assert result.exit_code == 2
    for expected in ("extra[0].models: unknown model 'nope'", "extra[0].precisions: unknown precision 'fp9'",
                     "lists[0]: unknown test list 'l9_nothing'", "lists[1].models: unknown model 'nope'"):
        assert expected in result.output, result.output


def test_planning_installs_the_toolchain_only_when_a_job_would_then_run(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Orin rows without an Orin would stay skipped anyway: nothing is installed for them."""
    import edgefarm.toolchains.tensorrt_edgellm.driver as driver
    from edgefarm.flows.plan import installing_toolchains

    calls: list[Path | None] = []
    monkeypatch.setattr(driver, "ensure_installed", lambda data_dir, wheels=None: calls.append(data_dir))
    matrix = tmp_path / "m.yml"
    matrix.write_text(yaml.safe_dump({"name": "m", "models": ["qwen2.5-0.5b-layout"], "precisions": ["fp16"],
                                      "platforms": ["orin"], "defaults": {"max_seq_len": 64, "max_batch_size": 1,
                                                                          "max_input_len": 32}}))
    inventory, catalog = load_inventory(data_dir=tmp_path), Catalog.load()
    plan = installing_toolchains(lambda: plan_matrix(matrix, inventory, catalog, data_dir=tmp_path), tmp_path)
    assert calls == [] and [j.decision for j in plan.jobs] == [Decision.SKIPPED]
    plan = installing_toolchains(lambda: plan_test_list(load_list("l0_checkpoint_export"), inventory, catalog,
                                                        data_dir=tmp_path), tmp_path)
    assert calls == [tmp_path]  # host-only jobs would run with it: installed (here: recorded), then planned again
