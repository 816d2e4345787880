"""``edgefarm bring-up``: the add-model ladder as a Prefect flow (flows/bringup.py). A registered family climbs every
rung on x86-cpu (the pipeline included); a renamed tensor stops at reconciliation naming it; a model_type only the
toolchain's default model would take stops at the registry check (NVIDIA's real tensorrt-edgellm 0.11.0, asked in
its own environment); an unregistered family is inventoried (a finding) and stops at the closest family; bad input
is exit 2 before any run is recorded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.pages.docs import publish_bringup, write_docs
from edgefarm.results.models import BringupRung, Run
from edgellm import ASSETS_DIR
from tests.helpers.foreign import make_granite
from tests.helpers.toolchain_env import link_real_toolchain

pytestmark = pytest.mark.usefixtures("prefect_harness")
RUNG_NAMES = ["inventory", "closest_family", "registry", "reconciliation", "reference", "few_layers", "pipeline"]
RENAMED = ("model.layers.2.mlp.up_proj.weight", "model.layers.2.mlp.upp_proj.weight")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, trt_env: Path) -> Path:
    """One data dir for the module (caches carry across its tests), holding the real tensorrt-edgellm environment."""
    data = tmp_path_factory.mktemp("bringup") / "data"
    data.mkdir()
    link_real_toolchain(data, trt_env)
    return data


def _bring_up(data_dir: Path, inventory: Path, db: Path, checkpoint: str, *args: str) -> tuple[int, str, Any]:
    result = CliRunner().invoke(app, ["bring-up", checkpoint, "--json", "--data-dir", str(data_dir),
                                      "--inventory", str(inventory), "--db", f"sqlite:///{db}", *args],
                                env={"HF_HUB_OFFLINE": "1", "EDGEFARM_DB_URL": None})
    text = result.output
    found = None
    start = text.find("{\n")
    if start >= 0:
        found = json.loads(text[start:])
    return result.exit_code, text, found


def _rungs(db: Path, run_id: int) -> list[tuple[str, str, str | None]]:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as s:
            return [(g.name, g.status, g.reason) for g in s.scalars(
                select(BringupRung).where(BringupRung.run_id == run_id).order_by(BringupRung.position))]
    finally:
        engine.dispose()


def _copy(src: Path, dest: Path, **config: object) -> Path:
    shutil.copytree(src, dest)
    if config:
        data = json.loads((dest / "config.json").read_text())
        data.update(config)
        (dest / "config.json").write_text(json.dumps(data))
    return dest


def test_a_registered_family_climbs_every_rung_on_x86_cpu(data_dir: Path, farm_dirs: dict[str, Path],
                                                          tmp_path: Path) -> None:
    db, report_dir = tmp_path / "results.db", tmp_path / "report"
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], db, "stories260K", "--platforms", "x86-cpu",
                                   "--layers", "2", "--report", str(report_dir))
    assert code == 0, text
    assert [r["name"] for r in report["rungs"]] == RUNG_NAMES
    assert {r["name"]: r["status"] for r in report["rungs"]} == dict.fromkeys(RUNG_NAMES, "pass"), text
    assert report["result"] == "passed" and report["stopped_at"] is None and report["exit_code"] == 0
    on_disk = json.loads((report_dir / "report.json").read_text())
    assert on_disk["schema"] == "edgefarm.bringup/1" and on_disk["rungs"] == report["rungs"]
    assert on_disk["checkpoint"]["sha256"] == report["rungs"][4]["evidence"]["checkpoint_sha256"]
    assert on_disk["route"] == [{"platform": "x86-cpu", "precision": "fp32", "toolchain": "edgellm-ort",
                                 "route": "ONNX", "decision": "run"}]
    assert on_disk["reconciliation"]["edgellm-ort"]["matched"] == on_disk["reconciliation"]["edgellm-ort"]["expected"]
    numeric = report["rungs"][5]["evidence"]["numeric"]
    assert numeric["passed"] is True and json.loads((report_dir / numeric["file"]).read_text())["layers"] == 2
    pipeline = report["rungs"][6]["evidence"]["rows"][0]["stages"]
    assert set(pipeline) == {"export", "build", "infer", "accuracy", "bench"}
    assert all(s["status"] == "pass" for s in pipeline.values())
    md = (report_dir / "report.md").read_text()
    assert "**Passed**" in md and "| 7 | Export, build, infer, accuracy, bench | ✓ pass |" in md
    fit = on_disk["memory_fit"]  # issue 37: the estimate against the platform's usable memory
    assert [(f["platform"], f["toolchain"], f["fits"]) for f in fit] == [("x86-cpu", "edgellm-ort", True)]
    assert 0 < fit[0]["estimate_gb"] < fit[0]["usable_gb"] < fit[0]["memory_gb"]
    assert "## Memory fit" in md and "| x86-cpu | edgellm-ort | fp32 |" in md and "✓ fits: needs" in md
    own_page = Path(report["run_page"])  # the flow published its run page, which links the report back
    assert own_page == data_dir / "docs" / "runs" / f"run-{report['run_id']}.md" and "report.md" in own_page.read_text()
    assert _rungs(db, report["run_id"]) == [(r["name"], "pass", r["reason"]) for r in report["rungs"]]
    page = publish_bringup(f"sqlite:///{db}", tmp_path / "docs", report["run_id"], data_dir).read_text()
    assert "## Bring-up rungs" in page and "../../report/report.md" in page
    write_docs(f"sqlite:///{db}", tmp_path / "docs", data_dir)  # a bring-up is never support (issue 41)
    assert "stories260K" not in (tmp_path / "docs" / "supported-models.md").read_text()


def test_a_tiny_qwen3_climbs_every_rung(data_dir: Path, farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], tmp_path / "r.db", "tiny-qwen3",
                                   "--report", str(tmp_path / "report"))
    assert code == 0, text
    assert [r["status"] for r in report["rungs"]] == ["pass"] * 7, text
    assert report["platforms"] == ["x86-cpu"]  # the inventory's platforms by default


@pytest.mark.parametrize(("model", "layers", "trt_loads_every_tensor"), [
    ("tiny-gemma2-bf16", 2, False), ("tiny-gemma3-bf16", 3, False), ("tiny-phi3-bf16", 2, True)])
def test_the_families_edge_teams_ship_climb_every_rung_with_tensorrt_edgellms_answer_as_advice(
        data_dir: Path, farm_dirs: dict[str, Path], tmp_path: Path, model: str, layers: int,
        trt_loads_every_tensor: bool) -> None:
    """Issue 35: Gemma-2, Gemma-3 text and Phi-3 from their bf16 sharded checkpoints up every rung on x86-cpu (the
    few-layer test through the family's own final norm and logits). Rungs 3 and 4 also ask TensorRT Edge-LLM, a
    toolchain of no requested platform: 0.11.0 registers none of the three model_types, so its default model would
    take them (and its loader would skip Gemma's sandwich norms without a word) — advice, deciding nothing."""
    report_dir = tmp_path / "report"
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], tmp_path / "r.db", model, "--platforms",
                                   "x86-cpu", "--layers", str(layers), "--report", str(report_dir))
    assert code == 0, text
    assert [r["status"] for r in report["rungs"]] == ["pass"] * 7, text
    registry, reconciliation = report["rungs"][2], report["rungs"][3]
    assert set(registry["evidence"]["toolchains"]) == {"edgellm-ort", "onnxruntime-genai"}
    trt = registry["evidence"]["advice"]["tensorrt-edgellm"]
    assert (trt["advice"], trt["status"], trt["ok"], trt["layout_family"]) == (True, "default-fallback", False, None)
    assert trt["model_class"] == trt["default_class"] == "tensorrt_edgellm.models.default.modeling_default.CausalLM"
    assert "advice, deciding nothing" in registry["reason"] and "tensorrt-edgellm 0.11.0 does not support model_type"\
        in registry["reason"]
    assert report["registries"]["tensorrt-edgellm"]["advice"] is True
    assert report["registries"]["edgellm-ort"]["status"] == "registered"
    skipped = reconciliation["evidence"]["advice"]["tensorrt-edgellm"]["unexpected"]
    assert (not skipped) is trt_loads_every_tensor
    assert trt_loads_every_tensor or all("feedforward_layernorm" in name for name in skipped)
    md = (report_dir / "report.md").read_text()
    assert "## Registries" in md and "| tensorrt-edgellm (advice) | 0.11.0 |" in md and "default-fallback ✗" in md


def test_a_renamed_tensor_stops_at_reconciliation_naming_it(data_dir: Path, farm_dirs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    ckpt = _copy(ASSETS_DIR / "stories260K", tmp_path / "renamed")
    tensors = load_file(ckpt / "model.safetensors")
    tensors[RENAMED[1]] = tensors.pop(RENAMED[0])
    save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
    db = tmp_path / "r.db"
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], db, str(ckpt), "--report",
                                   str(tmp_path / "report"))
    assert code == 1, text
    statuses = [r["status"] for r in report["rungs"]]
    assert statuses == ["pass", "pass", "pass", "fail", "skipped", "skipped", "skipped"], text
    assert report["stopped_at"]["name"] == "reconciliation" and report["stopped_at"]["rung"] == 4
    assert RENAMED[0] in report["stopped_at"]["reason"] and RENAMED[1] in report["stopped_at"]["reason"]
    assert report["model"] == "bringup-renamed"
    assert report["reconciliation"]["edgellm-ort"]["missing"] == [RENAMED[0]]
    assert report["reconciliation"]["edgellm-ort"]["unexpected"] == [RENAMED[1]]
    assert "**Failed** at rung 4" in (tmp_path / "report" / "report.md").read_text()
    engine = create_engine(f"sqlite:///{db}")
    with Session(engine) as s:
        run = s.get(Run, report["run_id"])
        assert run is not None and run.status.value == "failed" and run.published_at is None
        assert run.report == str((tmp_path / "report").resolve())
    engine.dispose()
    assert [g[1] for g in _rungs(db, report["run_id"])] == statuses


def test_a_model_type_only_the_default_model_would_take_stops_at_the_registry_check(
        data_dir: Path, farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = _copy(ASSETS_DIR / "stories260K", tmp_path / "mollama", model_type="mollama",
                 architectures=["MollamaForCausalLM"])
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], tmp_path / "r.db", str(ckpt), "--platforms",
                                   "thor", "--report", str(tmp_path / "report"))
    assert code == 1, text
    assert [r["status"] for r in report["rungs"]][:4] == ["pass", "pass", "fail", "skipped"], text
    registry = report["rungs"][2]
    found = registry["evidence"]["toolchains"]["tensorrt-edgellm"]
    assert found["status"] == "default-fallback" and found["ok"] is False and found["layout_family"] is None
    assert "'mollama'" in registry["reason"] and "tensorrt-edgellm 0.11.0" in registry["reason"]


def test_an_unregistered_family_is_inventoried_and_stops_at_the_closest_family(
        data_dir: Path, farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    ckpt = make_granite(tmp_path / "granite")
    code, text, report = _bring_up(data_dir, farm_dirs["inventory"], tmp_path / "r.db", str(ckpt), "--report",
                                   str(tmp_path / "report"))
    assert code == 1, text
    first, second = report["rungs"][:2]
    assert first["status"] == "pass" and "granite" in first["reason"]
    assert [f["kind"] for f in first["evidence"]["findings"]] == ["no_registered_family"]
    assert second["status"] == "fail" and "new structure" in second["reason"]
    assert report["stopped_at"]["name"] == "closest_family"


@pytest.mark.parametrize(("args", "named"), [
    (["/no/such/checkpoint"], "'/no/such/checkpoint': not a directory and not a catalog model"),
    (["stories260K", "--layers", "0"], "--layers 0"),
    (["stories260K", "--platforms", "x86-cpu,mars"], "--platforms mars: unknown; valid:"),
    (["stories260K", "--name", "other"], "--name 'other'"),
])
def test_bad_input_is_exit_2_before_any_run(data_dir: Path, farm_dirs: dict[str, Path], tmp_path: Path,
                                            args: list[str], named: str) -> None:
    db = tmp_path / "r.db"
    code, text, _ = _bring_up(data_dir, farm_dirs["inventory"], db, *args)
    assert code == 2, text
    assert named in text and "Traceback" not in text
    assert not db.exists()  # nothing recorded


def test_a_deployment_writes_its_report_under_the_data_dir_only(data_dir: Path, farm_dirs: dict[str, Path],
                                                               tmp_path: Path) -> None:
    from edgefarm.flows.bringup import bring_up
    from edgellm.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="a deployment writes reports under"):
        bring_up.fn("stories260K", report_dir=str(tmp_path / "elsewhere"), data_dir=str(data_dir),
                    inventory=str(farm_dirs["inventory"]), db_url=f"sqlite:///{tmp_path / 'r.db'}")
    assert not (tmp_path / "elsewhere").exists()


def test_the_bring_up_deployment_loads_from_prefect_yaml() -> None:
    from edgefarm.flows.serve import _to_deployment, load_deployment_specs

    spec = {d["name"]: d for d in load_deployment_specs()}["bring-up"]
    deployment = _to_deployment(spec)
    assert (deployment.name, deployment.flow_name, deployment.parameters) == ("bring-up", "bring-up", {"layers": 1})
    assert spec["work_pool"]["name"] == "orchestrator"


def test_on_a_temporary_server_the_flow_s_logs_reach_it_before_it_stops(
        farm_dirs: dict[str, Path], tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> None:
    """Without PREFECT_API_URL a command runs its flow on a temporary server of its own; the logs queued when the
    flow ends are sent before that server stops (they failed at exit: 'Error logging to API')."""
    import os
    import subprocess
    import sys

    ckpt = make_granite(tmp_path / "granite")  # stops at rung 2: a short flow
    migrated_prefect_home(tmp_path / "data" / "prefect")  # the temporary server's home: a database already migrated
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    env.pop("EDGEFARM_DB_URL", None)
    done = subprocess.run([sys.executable, "-m", "edgefarm.cli", "bring-up", str(ckpt), "--data-dir",
                           str(tmp_path / "data"), "--inventory", str(farm_dirs["inventory"]), "--report",
                           str(tmp_path / "report")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "closest_family" in json.loads((tmp_path / "report" / "report.json").read_text())["stopped_at"]["name"]
    assert "Error logging to API" not in done.stdout + done.stderr
    assert "All connection attempts failed" not in done.stdout + done.stderr


def test_a_row_that_ran_on_stand_in_tools_is_a_gap_never_a_passed_row() -> None:
    from types import SimpleNamespace

    from edgefarm.flows.bringup import judge_pipeline
    from edgefarm.flows.plan import Decision
    from edgefarm.results.models import ResultStatus
    from edgefarm.stages.outcome import StageOutcome
    from edgellm.types import Precision

    job = SimpleNamespace(decision=Decision.RUN, key="k", platform="orin", precision=Precision.FP16,
                          toolchain="tensorrt-edgellm", reason="")
    outcomes = {s: StageOutcome(stage=s, status=ResultStatus.PASS, standin=s != "export")
                for s in ("export", "build", "infer")}
    rung = judge_pipeline(SimpleNamespace(jobs=[job]), SimpleNamespace(run_id=7, outcomes={"k": outcomes}))
    assert rung.status is ResultStatus.FAIL and "no row ran to its end" in (rung.reason or "")
    assert rung.evidence["gaps"] == ["orin fp16: ran on stand-in tools (test only, not evidence)"]
