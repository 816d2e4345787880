"""Golden plans: what the shipped matrix and test lists decide against a few inventories, pinned as JSON.

A change to device types, toolchains, capabilities, lists or the planner shows up here as a diff of decisions and
reasons. After an intended change, regenerate with ``EDGEFARM_UPDATE_GOLDEN=1 pytest tests/test_golden_plans.py``
and review the diff of ``tests/data/golden_plans/``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

import pytest

from edgefarm.devices.inventory import PACKAGED_INVENTORY_DIR, load_inventory
from edgefarm.flows.plan import DEFAULT_MATRIX, plan_matrix, plan_test_list
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import list_names, load_list
from tests.helpers.toolchain_env import stand_in_toolchain_env

GOLDEN = Path(__file__).parent / "data" / "golden_plans"
TODAY = dt.date(2026, 11, 30)  # waivers are judged against a fixed day
# golden name -> (the stand-in device added beside the shipped local CPU, whether the pinned tensorrt-edgellm
# environment is in the data dir); planning only: nothing runs
INVENTORIES = {"local": (None, False), "orin": ("orin", False), "x86-h200": ("x86-h200", False),
               "local-trt": (None, True)}


def _inventory(tmp_path: Path, extra: str | None) -> Path:
    if extra is None:
        return PACKAGED_INVENTORY_DIR
    directory = tmp_path / "inventory"
    directory.mkdir()
    (directory / "local-cpu.yaml").write_text((PACKAGED_INVENTORY_DIR / "local-cpu.yaml").read_text())
    (directory / f"{extra}-1.yaml").write_text(f"type: {extra}\ntransport: local\nwork_dir: devices/{extra}-1\n")
    return directory


def shipped_plans(inventory_dir: Path, data_dir: Path) -> dict[str, Any]:
    inventory, catalog = load_inventory(inventory_dir, data_dir=data_dir), Catalog.load()
    plans = {f"matrix {DEFAULT_MATRIX.stem}": plan_matrix(DEFAULT_MATRIX, inventory, catalog, data_dir=data_dir,
                                                          today=TODAY).to_json()}
    for name in list_names():
        plans[f"list {name}"] = plan_test_list(load_list(name, today=TODAY), inventory, catalog, data_dir=data_dir,
                                               today=TODAY).to_json()
    # the inventory's place on this machine is not part of the decision
    return json.loads(json.dumps(plans).replace(str(inventory.directory), "<inventory>"))


@pytest.mark.parametrize("name", sorted(INVENTORIES))
def test_shipped_plans_match_the_golden_files(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEFARM_MODELS_DIR", raising=False)  # real checkpoints: absent here, and said so
    device, installed = INVENTORIES[name]
    data_dir = tmp_path / "data"  # its toolchains: exactly the ones pinned here
    if installed:
        stand_in_toolchain_env(data_dir)
    plans = shipped_plans(_inventory(tmp_path, device), data_dir)
    golden = GOLDEN / f"{name}.json"
    if os.environ.get("EDGEFARM_UPDATE_GOLDEN") == "1":
        golden.write_text(json.dumps(plans, indent=1, sort_keys=True) + "\n")
    assert plans == json.loads(golden.read_text())


def test_golden_plans_keep_the_evidence_rules() -> None:
    """Read from the pinned files: no Orin or GPU job ever runs on ONNX Runtime (the CPU's toolchains), and with an
    x86-h200 in the inventory its fp16 jobs go to a GPU toolchain (tensorrt-edgellm, or edgellm-torch-cuda while
    TensorRT is not installed): run by it, or skipped saying what it lacks."""
    cpu = {"edgellm-ort", "onnxruntime-genai"}
    for name in INVENTORIES:
        for plan in json.loads((GOLDEN / f"{name}.json").read_text()).values():
            for job in plan["jobs"]:
                assert (job["toolchain"] in cpu) == (job["platform"] == "x86-cpu"), job
    h200 = json.loads((GOLDEN / "x86-h200.json").read_text())["list l0_pipeline_h200"]["jobs"]
    fp16 = [j for j in h200 if j["precision"] == "fp16"]
    assert fp16 and all(j["devices"] == ["x86-h200-1"] for j in fp16)
    assert all(j["toolchain"] in ("tensorrt-edgellm", "edgellm-torch-cuda") for j in fp16)
    assert all(j["decision"] == "run" or "not available" in j["reason"] or "toolchain" in j["reason"] for j in fp16)
    local = json.loads((GOLDEN / "local.json").read_text())["matrix nightly"]
    assert {(j["platform"], j["decision"]) for j in local["jobs"] if j["decision"] == "run"} == {("x86-cpu", "run")}
    assert all("edgefarm toolchains install tensorrt-edgellm==0.11.0" in j["reason"] for j in local["jobs"]
               if j["precision"] in ("int4_awq", "int8_sq") and j["decision"] == "skipped")
    # with the pinned toolchain: the CPU's quantized rows run end to end, the export rows run on the host alone
    trt = json.loads((GOLDEN / "local-trt.json").read_text())
    cpu = [j for j in trt["matrix nightly"]["jobs"] if j["platform"] == "x86-cpu" and j["precision"] != "fp8"]
    gptq = [j for j in cpu if j["precision"] == "int4_gptq"]  # no CPU toolchain reads a GPTQ checkpoint: it says so
    assert gptq and all(j["decision"] == "not_applicable" and "edgellm's export reads no int4_gptq" in j["reason"]
                        for j in gptq)
    variant = [j for j in cpu if j["variant"]["key"]]  # no CPU toolchain runs a LoRA adapter: it says so
    assert variant and all(j["decision"] == "not_applicable" and "does not run lora" in j["reason"] for j in variant)
    cpu = [j for j in cpu if j not in gptq and j not in variant]
    assert all(j["decision"] == "run" and j["devices"] == ["local-cpu"] for j in cpu)
    assert {j["precision"] for j in cpu} >= {"int4_awq", "int8_sq"}
    exports = trt["list l0_checkpoint_export"]["jobs"]
    assert exports and all(j["platform"] == "thor" and set(j["stages"]) <= {"quantize", "export"} for j in exports)
    assert all(j["decision"] == "run" and j["devices"] == [] for j in exports if j["model"] == "stories260K")
