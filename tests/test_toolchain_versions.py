"""Two versions of a toolchain side by side in one matrix (``toolchain_versions:``), with real parts: Prefect, NVIDIA's
tensorrt-edgellm quantizer and exporter (the session's ``trt_env``), the results database and the docs.

The package registry has one release (0.11.0), so the second version is a STAND-IN: the same 0.11.0 release under
the version ``0.11.0+relabel`` (``tests.helpers.toolchain_env.relabelled_toolchain_env``: a thin environment that
reuses the release's packages with a relabelled dist-info; the tools that run are the real ones). One run of
tiny-qwen3-128 int8_sq for Thor (quantize and export only: export evidence) with both versions gives two rows of
its own per stage, each with its version, in the database, in ``edgefarm query`` and in the docs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import Decision, plan_matrix
from edgefarm.results.db import make_engine
from edgefarm.results.models import CacheEntry, Result
from edgefarm.test_lists.catalog import Catalog
from tests.helpers.toolchain_env import link_release, relabelled_toolchain_env, stand_in_toolchain_env
from tests.test_farm_quantized import LIMITS, _farm, _nightly

STANDIN = "0.11.0+relabel"  # the stand-in second version (the real 0.11.0 release, relabelled)
PINNED_ID = "tiny-qwen3-128-int8_sq-mxsl256-mxbs2-mxil128"
MATRIX = {
    "name": "versions", "models": ["tiny-qwen3-128"], "precisions": ["int8_sq", "fp32"],
    "platforms": ["thor", "x86-cpu"], "defaults": {**LIMITS, "stages": ["export"]},
    "toolchain_versions": {"tensorrt-edgellm": ["0.11.0", STANDIN]},
}


# the real runs use the session's Prefect harness, as every farm test does: a run on a temporary server of its own
# would leave Prefect's client and event workers pointed at a server that is gone (later tests then hang or miss it);
# the pinned version's quantizer run is test_farm_quantized.py's int8_sq, shared (tests/fixtures/toolchain_runs.py)
pytestmark = pytest.mark.usefixtures("prefect_harness", "shared_toolchain_runs")

def _write(root: Path, matrix: dict[str, object]) -> Path:
    path = root / f"{matrix['name']}.yml"
    path.write_text(yaml.safe_dump(matrix))
    return path


def test_the_plan_runs_each_job_using_the_toolchain_once_per_version(tmp_path: Path) -> None:
    data, inventory = _farm(tmp_path)
    stand_in_toolchain_env(data)  # planning only: the pinned version looks installed; the other one is not
    plan = plan_matrix(_write(tmp_path, {**MATRIX, "precisions": ["int8_sq", "fp32", "fp16"]}),
                       load_inventory(inventory, data_dir=data), Catalog.load(), data_dir=data)
    jobs = {(j.platform, j.precision.value, j.pins.get("tensorrt-edgellm")): j for j in plan.jobs}
    # thor runs tensorrt-edgellm (fp16, int8_sq); x86-cpu int8_sq takes its quantizer's checkpoint: expanded.
    # fp32 (tensorrt-edgellm does not make it) and x86-cpu fp16 use none of it: one job each, no versions.
    assert set(jobs) == {
        ("thor", "int8_sq", "0.11.0"), ("thor", "int8_sq", STANDIN), ("thor", "fp16", "0.11.0"),
        ("thor", "fp16", STANDIN), ("thor", "fp32", None), ("x86-cpu", "int8_sq", "0.11.0"),
        ("x86-cpu", "int8_sq", STANDIN), ("x86-cpu", "fp32", None), ("x86-cpu", "fp16", None)}
    pinned, other = jobs[("thor", "int8_sq", "0.11.0")], jobs[("thor", "int8_sq", STANDIN)]
    assert pinned.test_id == PINNED_ID  # the pinned version's test keeps the id every other run gives it
    assert other.test_id == f"{PINNED_ID}-tensorrt-edgellm=={STANDIN}" and other.key != pinned.key
    assert pinned.decision is Decision.RUN
    assert other.decision is Decision.SKIPPED
    assert (f"tensorrt-edgellm {STANDIN} is not installed in the farm's data dir (run: edgefarm toolchains install "
            f"tensorrt-edgellm=={STANDIN})") in other.reason
    assert jobs[("thor", "fp32", None)].decision is Decision.NOT_APPLICABLE
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--format", "json", "--matrix",
                                      str(tmp_path / "versions.yml"), "--inventory", str(inventory),
                                      "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    by_id = {(j["platform"], j["test_id"]): j for j in shown["jobs"]}
    assert by_id[("thor", PINNED_ID)]["toolchain_versions"] == {"tensorrt-edgellm": "0.11.0"}
    assert by_id[("x86-cpu", "tiny-qwen3-128-fp32-mxsl256-mxbs2-mxil128")].get("toolchain_versions") is None
    assert {"model": "tiny-qwen3-128", "precision": "int8_sq", "toolchain": "tensorrt-edgellm",
            "toolchain_versions": {"tensorrt-edgellm": "0.11.0"}} in shown["exports"]


@pytest.mark.parametrize(("versions", "expected"), [
    ({"tensorrt-edgellm": [">=0.11.0"]}, "bad tensorrt-edgellm version '>=0.11.0'; expected an exact version like "
                                         "0.11.0"),
    ({"tensorrt-edgellm": [0.12]}, "toolchain_versions.tensorrt-edgellm: 0.12 is not a version string; expected a "
                                   "list of exact versions, e.g. [\"0.11.0\"] (quote it)"),
    ({"tensorrt-edgellm": "0.11.0"}, "toolchain_versions.tensorrt-edgellm: expected a list of exact versions"),
    ({"tensorrt-edgellm": ["0.11.0", "0.11.0"]}, "version '0.11.0' is listed twice"),
    ({"edgellm-ort": ["1.0"]}, "toolchain edgellm-ort runs the farm's own version; no version of it can be chosen "
                               "(toolchains with versions: tensorrt-edgellm)"),
    ({"tensorrt-edge": ["0.11.0"]}, "unknown toolchain 'tensorrt-edge'"),
])
def test_bad_toolchain_versions_are_refused_naming_the_value_and_the_form(
        tmp_path: Path, versions: dict[str, object], expected: str) -> None:
    path = _write(tmp_path, {**MATRIX, "toolchain_versions": versions})
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--matrix", str(path), "--data-dir", str(tmp_path)])
    assert result.exit_code == 2 and expected in result.output, result.output


@pytest.fixture(scope="module")
def compared(trt_env: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """One real run of both versions (the module's), into a farm whose toolchains dir holds the real release and
    the stand-in relabelled one."""
    root = tmp_path_factory.mktemp("versions-farm")
    data, inventory = _farm(root)
    link_release(data, trt_env)
    version, _ = relabelled_toolchain_env(data, trt_env)
    assert version == STANDIN
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.delenv("EDGEFARM_DB_URL", raising=False)
    matrix = {**MATRIX, "precisions": ["int8_sq"], "platforms": ["thor"],
              "defaults": {**LIMITS, "stages": ["quantize", "export"]}}
    code, summary = _nightly(root, data, inventory, matrix)
    yield {"root": root, "code": code, "summary": summary, "db": f"sqlite:///{data / 'edgefarm.db'}"}
    mp.undo()


def test_two_versions_give_separate_rows_with_their_versions(compared: dict[str, object]) -> None:
    summary = compared["summary"]
    assert compared["code"] == 0 and summary["failed"] == [] and summary["plan"] == {"run": 2}, summary
    engine = make_engine(str(compared["db"]))
    with Session(engine) as s:
        rows = {(r.test_id, r.stage.value): r for r in s.scalars(select(Result))}
        quantized = [e for e in s.scalars(select(CacheEntry)) if e.inputs["stage"] == "quantize"]
        assert sorted(e.inputs["toolchain_version"] for e in quantized) == ["0.11.0", STANDIN]  # key names it
    engine.dispose()
    other_id = f"{PINNED_ID}-tensorrt-edgellm=={STANDIN}"
    assert sorted(rows) == sorted((t, st) for t in (PINNED_ID, other_id) for st in ("quantize", "export"))
    for test_id, version in ((PINNED_ID, "0.11.0"), (other_id, STANDIN)):
        for stage in ("quantize", "export"):
            row = rows[(test_id, stage)]
            assert (row.model, row.precision.value, row.platform) == ("tiny-qwen3-128", "int8_sq", "thor")
            assert row.status.value == "pass", row.reason
            assert (row.toolchain.value, row.toolchain_version) == ("tensorrt-edgellm", version)
            assert row.chosen_versions == f"tensorrt-edgellm=={version}"
        assert rows[(test_id, "quantize")].reason.startswith(f"tensorrt-edgellm {version} int8_sq (")


def test_query_and_docs_show_the_versions_side_by_side(compared: dict[str, object]) -> None:
    result = CliRunner().invoke(app, ["query", "--platform", "thor", "--format", "json", "--db", str(compared["db"])])
    assert result.exit_code == 0, result.output
    shown = sorted((r["chosen_versions"], r["toolchain_version"], r["stages"]["export"])
                   for r in json.loads(result.stdout))
    assert shown == [("tensorrt-edgellm==0.11.0", "0.11.0", "pass"),
                     (f"tensorrt-edgellm=={STANDIN}", STANDIN, "pass")]
    md = (Path(str(compared["root"])) / "docs" / "supported-models.md").read_text()
    thor = md.split("## thor\n", 1)[1].split("\n## ", 1)[0]
    lines = [x for x in thor.splitlines() if x.startswith("| tiny-qwen3-128")]
    assert [re.sub(r"\]\(runs/run-1\.md#[^)]+\)", "](…)", x) for x in lines] == [
        "| tiny-qwen3-128 (tensorrt-edgellm==0.11.0) | 525K | ◇ implemented (export verified only), tensorrt-edgellm "
        "0.11.0 ([run 1](…)) |",
        f"| tiny-qwen3-128 (tensorrt-edgellm=={STANDIN}) | 525K | ◇ implemented (export verified only), "
        f"tensorrt-edgellm {STANDIN} ([run 1](…)) |"], thor
    evidence = (Path(str(compared["root"])) / "docs" / "runs" / "run-1.md").read_text()
    assert "## tiny-qwen3-128 (tensorrt-edgellm==0.11.0) · int8_sq · thor" in evidence
    assert f"## tiny-qwen3-128 (tensorrt-edgellm=={STANDIN}) · int8_sq · thor" in evidence
    assert f"| quantize | pass | tensorrt-edgellm {STANDIN} |" in evidence
