"""Failures where people look (issue 26), on the real local device under a real Prefect server: a nightly whose
accuracy stage genuinely fails ends Failed in Prefect with a message naming the row and its root cause; its task runs
are named ``<stage> <model> <precision> @<platform>`` and end in their stage's state; the stages' logs (their tools'
output tails) are in the flow run's logs; without a terminal the command prints one plain line per stage start and
end and an end summary with the root cause and the command that opens the log; a run where nothing ran exits 5 with
why, like pytest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from tests.fixtures.farm import FAILING

pytestmark = pytest.mark.usefixtures("prefect_harness")
ROW = "stories260K fp32 @x86-cpu"


def _flow_run(matrix: Path) -> object:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        runs = [f for f in client.read_flow_runs() if f.parameters.get("matrix") == str(matrix)]
    assert len(runs) == 1, [r.name for r in runs]
    return runs[0]


def test_a_failed_nightly_is_failed_in_prefect_with_named_tasks_logs_and_plain_progress(
        farm_dirs: dict[str, Path], tmp_path: Path, impossible_catalog: None) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId

    matrix = tmp_path / "failing.yml"
    matrix.write_text(yaml.safe_dump(FAILING))
    result = CliRunner().invoke(app, ["nightly", "--matrix", str(matrix), "--db", f"sqlite:///{tmp_path / 'f.db'}",
                                      "--inventory", str(farm_dirs["inventory"]), "--data-dir",
                                      str(farm_dirs["data"]), "--docs-dir", str(tmp_path / "docs")])
    text = result.stdout
    assert result.exit_code == 1, text

    # progress without a terminal: a line when each stage starts and when each of the job's stages ends
    for stage in ("export", "build", "infer", "accuracy"):
        assert re.search(rf"^\d\d:\d\d:\d\d \+\d+:\d\d \[\d+/4\] start +{stage} {ROW}$", text, re.M), (stage, text)
    assert re.search(rf"^\d\d:\d\d:\d\d \+\d+:\d\d \[\d/4\] pass +export {ROW} \d+\.\d s on orchestrator$", text,
                     re.M), text
    assert re.search(rf"^\d\d:\d\d:\d\d \+\d+:\d\d \[4/4\] FAIL +accuracy {ROW} \d+\.\d s on local-cpu: "
                     r".*logits_max_abs_diff", text, re.M), text
    # every stage that starts prints its end, the model's reference (which no row lists) too
    starts = re.findall(r"^\S+ \S+ \[\d+/4\] start +(\S+ .*)$", text, re.M)
    ends = re.findall(r"^\S+ \S+ \[\d+/4\] (?:pass|FAIL|ERROR|skip|waived|n/a) +(\S+ .*?) \d+\.\d s", text, re.M)
    assert sorted(starts) == sorted(ends) and any(s.startswith("reference ") for s in starts), text
    # the end summary: the failing row, its root cause, how to open its log
    assert "1 row(s) failed (root cause: the first stage that failed):" in text
    assert re.search(rf"✗ {ROW}: accuracy fail \(test_failure\) on local-cpu: .*logits_max_abs_diff", text), text
    log_ids = re.findall(r"log: edgefarm show (log:[0-9a-f]{12})$", text, re.M)
    assert log_ids, text
    assert "{'" not in text, "the summary prints Python dicts"
    assert re.search(r"^run \d+: 4 stage results \(3 pass, 1 fail\); plan: 1 job to run$", text, re.M), text

    flow_run = _flow_run(matrix)
    assert flow_run.state.type.value == "FAILED", flow_run.state
    assert re.match(rf"run \d+: 1 row\(s\) failed: {re.escape(ROW)}: accuracy fail: ", flow_run.state.message), \
        flow_run.state.message
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
    states = {t.name: (t.state.type.value, t.state.name, t.state.message or "") for t in tasks}
    # each stage is one task run, named after it: none for its record (issue 41: 19 task runs for 7 stages)
    assert sorted(t.name.split(" ")[0] for t in tasks) == sorted(
        ["reference", "quantize", "export", "build", "infer", "accuracy"]), sorted(states)
    stages = states
    # the transformers reference (shared by the model's jobs) is a stage of its own, named the same way
    assert {n for n in stages if n.endswith(ROW)} >= {f"{s} {ROW}" for s in ("export", "build", "infer", "accuracy")}
    assert stages[f"accuracy {ROW}"][:2] == ("FAILED", "Failed"), stages
    assert "logits_max_abs_diff" in stages[f"accuracy {ROW}"][2]
    assert all(stages[f"{s} {ROW}"][0] == "COMPLETED" for s in ("export", "build", "infer")), stages
    # the run's logs reach Prefect: the farm's own lines and each stage's tool output tail
    messages = [(entry.name, entry.message) for entry in logs]
    assert any(name.startswith("edgefarm.tasks.") and f"accuracy {FAILING['models'][0]}" in message
               for name, message in messages), messages[:20]
    tails = [m for n, m in messages if n == "edgefarm.tasks.run_logs"]
    assert any(f"log {log_ids[0]}" in m or any(f"log:{i[4:]}" in m for i in log_ids) for m in tails), tails
    assert any(m.startswith("build pass, log log:") for m in tails), tails
    assert any("Finished in state Failed" in m for _, m in messages), messages[-5:]


def test_nothing_ran_exits_5_with_why(farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    """A matrix of a platform without a device: no stage runs, the command says why and exits 5 (pytest's code for
    "no tests ran"); with nothing to do it starts no server, takes no run id and makes no flow run (issue 41)."""
    matrix = tmp_path / "orin-only.yml"
    matrix.write_text(yaml.safe_dump({**FAILING, "name": "orin-only", "platforms": ["orin"]}))
    result = CliRunner().invoke(app, ["nightly", "--matrix", str(matrix), "--db", f"sqlite:///{tmp_path / 'o.db'}",
                                      "--inventory", str(farm_dirs["inventory"]), "--data-dir",
                                      str(farm_dirs["data"]), "--docs-dir", str(tmp_path / "docs")])
    assert result.exit_code == 5, result.stdout
    assert "nothing ran (exit 5):" in result.stdout
    assert re.search(r"^  orin: \S+: .+ \(1 job\)$", result.stdout, re.M), result.stdout
    assert "ratio" not in result.stdout  # no timing of nothing
    assert "no run recorded (nothing to do)" in result.stdout and "Prefect server" not in result.stdout
    assert not (tmp_path / "o.db").exists()
    from prefect import get_client

    with get_client(sync_client=True) as client:
        assert not [f for f in client.read_flow_runs() if f.parameters.get("matrix") == str(matrix)]

    # a test list of a platform without a device: the same (it printed "stage results {}" and exited 0)
    listed = CliRunner().invoke(app, ["run", "--priority", "l0_pipeline_orin", "--db",
                                      f"sqlite:///{tmp_path / 'l.db'}", "--inventory", str(farm_dirs["inventory"]),
                                      "--data-dir", str(farm_dirs["data"])])
    assert listed.exit_code == 5, listed.stdout
    assert "nothing ran (exit 5):" in listed.stdout and "ratio" not in listed.stdout, listed.stdout


def test_prefect_states_say_the_stage_s_status_and_hide_credentials() -> None:
    from edgefarm.results.models import ResultStatus
    from edgefarm.stages.outcome import StageOutcome
    from edgefarm.tasks.states import stage_state
    from edgellm.errors import ErrorKind

    failed = stage_state(StageOutcome(stage="build", status=ResultStatus.ERROR, error_kind=ErrorKind.INFRASTRUCTURE,
                                      reason="lost postgresql://farm:hunter2@db:5432/x\nsecond line", duration_s=2.0))
    assert (failed.type.value, failed.name) == ("FAILED", "Failed")
    assert failed.message == "error (infrastructure) after 2.0 s: lost postgresql://farm:***@db:5432/x"
    cached = stage_state(StageOutcome(stage="export", status=ResultStatus.PASS, cached=True, duration_s=0.1))
    assert (cached.type.value, cached.name, cached.message) == ("COMPLETED", "Cached", "pass in 0.1 s (reused)")
    for status, name in ((ResultStatus.SKIPPED, "Skipped"), (ResultStatus.WAIVED, "Waived"),
                         (ResultStatus.NOT_APPLICABLE, "Not applicable")):
        state = stage_state(StageOutcome(stage="infer", status=status, reason="why"))
        assert (state.type.value, state.name, state.message) == ("COMPLETED", name, "why")


def test_a_shared_run_is_named_after_every_row_it_serves() -> None:
    from types import SimpleNamespace

    from edgefarm.tasks.states import task_run_name

    def job(precision: str, platform: str, variant: str = "") -> object:
        return SimpleNamespace(model="tiny-llama", precision=SimpleNamespace(value=precision), variant=variant,
                               platform=platform)

    one = job("fp32", "x86-cpu")
    assert task_run_name("build", one) == "build tiny-llama fp32 @x86-cpu"  # type: ignore[arg-type]
    # the model's reference serves its precisions; an export, its platforms; a variant is named in brackets
    assert task_run_name("reference", one, [one, job("fp16", "x86-cpu")]) == \
        "reference tiny-llama fp16,fp32 @x86-cpu"  # type: ignore[list-item,arg-type]
    assert task_run_name("export", job("fp16", "thor", "kv=fp8"), [job("fp16", "orin", "kv=fp8")]) == \
        "export tiny-llama fp16 [kv=fp8] @orin,thor"  # type: ignore[list-item,arg-type]
