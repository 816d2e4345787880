"""Planning: the matrix and test lists expand into jobs with decisions and reasons; bad input lists every problem."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from devices.inventory import load_inventory
from flows.catalog import Catalog
from flows.cli import app
from flows.plan import DEFAULT_MATRIX, Decision, plan_matrix, plan_test_list
from test_lists.loader import load_list

DATA = Path(__file__).parent / "data"


def test_default_matrix_plan_decides_every_cell_with_a_reason() -> None:
    plan = plan_matrix(DEFAULT_MATRIX, load_inventory(), Catalog.load())
    by = {(j.model, j.precision.value, j.platform): j for j in plan.jobs}
    assert by[("stories260K", "fp32", "x86-cpu")].decision is Decision.RUN
    assert by[("stories260K", "fp32", "x86-cpu")].devices == ("local-cpu",)
    orin_fp8 = by[("stories260K", "fp8", "orin")]
    assert orin_fp8.decision is Decision.NOT_APPLICABLE and "needs SM89+" in orin_fp8.reason
    thor_fp16 = by[("tiny-qwen3", "fp16", "thor")]
    assert thor_fp16.decision is Decision.SKIPPED and "no device of platform thor" in thor_fp16.reason
    thor_fp8 = by[("tiny-qwen2", "fp8", "thor")]
    assert thor_fp8.decision is Decision.SKIPPED and "cannot produce fp8" in thor_fp8.reason
    # export once per (model, precision), whatever the number of platforms
    assert len(plan.exports()) == len({(j.model, j.precision) for j in plan.runnable()})
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


def test_l0_list_plan_runs_on_local_cpu_and_hardware_lists_wait_for_devices() -> None:
    inventory, catalog = load_inventory(), Catalog.load()
    l0 = plan_test_list(load_list("l0_pipeline_x86cpu"), inventory, catalog)
    assert l0.kind == "l0" and l0.runnable() and all(j.platform == "x86-cpu" for j in l0.jobs)
    orin = plan_test_list(load_list("l0_pipeline_orin"), inventory, catalog)
    assert orin.jobs and not orin.runnable()
    reasons = {j.decision for j in orin.jobs}
    assert reasons <= {Decision.SKIPPED, Decision.WAIVED, Decision.NOT_APPLICABLE}
