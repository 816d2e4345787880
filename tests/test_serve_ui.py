"""`edgefarm serve` as a person meets it: it prints the URL of Prefect's UI; the UI (a JS app, opened in headless
Chromium) lists both deployments and the nightly 02:00 schedule; a `nightly` reporting to that server prints its
flow run's URL, and that run's page shows the support matrix artifacts; a nightly whose accuracy stage fails shows
Failed there, with the failed row in its message, task runs named after their stage and row (the failed one Failed)
and the stages' logs. Screenshots under .data/test-artifacts/."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from tests.fixtures.browser import Tab
from tests.fixtures.farm import FAILING
from tests.fixtures.sshd import free_port

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def served(tmp_path: Path, migrated_prefect_home: Callable[[Path], Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """A running `edgefarm serve`: (the UI URL it printed, an environment without Prefect settings)."""
    migrated_prefect_home(tmp_path / "serve" / "prefect")  # serve's Prefect home in its data dir: no migration
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=str(REPO), EDGEFARM_DATA_DIR=str(tmp_path / "serve"))
    log = tmp_path / "serve.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "serve", "--port", str(free_port()),
                                 "--data-dir", str(tmp_path / "serve")], cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (m := re.search(r"Prefect UI: (http://127\.0\.0\.1:\d+)", log.read_text())):
            assert proc.poll() is None, f"serve exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"serve printed no UI URL:\n{log.read_text()}"
            time.sleep(0.5)
        yield m.group(1), env
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _text(tab: Tab) -> str:
    return tab.js("document.body.innerText")


def test_serve_shows_prefect_ui_with_deployments_schedule_and_run_artifacts(served: tuple[str, dict[str, str]],
                                                                           tab: Tab, tmp_path: Path) -> None:
    ui, env = served
    # l0-x86-cpu's schedule (every 4 hours, infra/prefect.yaml) shows as the "+1" beside its tag
    want = ["l0-x86-cpu run-test-list Ready l0 +1",
            "nightly nightly-support-matrix Ready nightly At 02:00 AM every day"]
    rows_js = "[...document.querySelectorAll('tbody tr')].map(tr => tr.innerText.replace(/\\s+/g, ' ').trim()).sort()"
    # the runner registers the deployments just after the server is up, and the UI fetches the flow names after
    # the deployments: reload until the table is complete
    deadline = time.monotonic() + 120
    rows: list[str] = []
    while rows != want:
        assert time.monotonic() < deadline, f"deployments not shown by the UI: {rows}\n{_text(tab)[:2000]}"
        tab.goto(f"{ui}/deployments")
        tab.poll(f"JSON.stringify({rows_js}) === {json.dumps(json.dumps(want))}", timeout=15)
        rows = tab.js(rows_js)
    tab.screenshot("prefect-ui-deployments.png")

    # a nightly reporting to this server prints its run's URL: the Orin rows are not applicable here (no orin),
    # one export on the local CPU runs (a run with nothing to do opens no flow run), so it is quick
    matrix = tmp_path / "orin.yml"
    matrix.write_text(yaml.safe_dump({
        "name": "ui-check", "models": ["stories260K"], "precisions": ["fp16", "fp8"], "platforms": ["orin"],
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", "build", "infer", "accuracy", "bench"]},
        "extra": [{"models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
                   "defaults": {"stages": ["export"]}}]}))
    run = subprocess.run([sys.executable, "-m", "edgefarm.cli", "nightly", "--matrix", str(matrix), "--data-dir",
                          str(tmp_path / "nightly")], cwd=REPO, env={**env, "PREFECT_API_URL": f"{ui}/api"},
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    m = re.search(rf"flow run: ({re.escape(ui)}/runs/flow-run/[0-9a-f-]{{36}})", run.stdout)
    assert m, run.stdout
    tab.goto(m.group(1))
    tab.wait_for("document.querySelectorAll('li.p-tab').length > 0", timeout=60)
    tab.js("[...document.querySelectorAll('li.p-tab')].find(t => t.textContent.trim() === 'Artifacts').click()")
    tab.wait_for("document.body.innerText.includes('support-matrix') && "
                 "document.body.innerText.includes('supported-models')", timeout=60)
    assert "nightly-support-matrix" in _text(tab)
    tab.screenshot("prefect-ui-nightly-run-artifacts.png")
    run_id = m.group(1).rsplit("/", 1)[1]
    query = {"artifacts": {"flow_run_id": {"any_": [run_id]}}}
    with urllib.request.urlopen(f"{ui}/api/csrf-token?client=ui-test", timeout=30) as resp:  # serve wants CSRF
        csrf = {"Prefect-Csrf-Token": json.loads(resp.read())["token"], "Prefect-Csrf-Client": "ui-test"}
    req = urllib.request.Request(f"{ui}/api/artifacts/filter", method="POST", data=json.dumps(query).encode(),
                                 headers={"Content-Type": "application/json", **csrf})
    with urllib.request.urlopen(req, timeout=30) as resp:
        artifacts = {a["key"]: a for a in json.loads(resp.read())}
    assert set(artifacts) == {"support-matrix", "supported-models"}
    table = json.loads(artifacts["support-matrix"]["data"])
    rows = {(r["model"], r["precision"], r["platform"], r["status"]) for r in table}
    assert {
        # fp16: no TensorRT Edge-LLM attention kernel takes stories260K's head size 8
        ("stories260K", "fp16", "orin", "not_applicable"), ("stories260K", "fp8", "orin", "not_applicable")} <= rows
    assert {(m, p, pl) for m, p, pl, _ in rows} == {("stories260K", "fp16", "orin"), ("stories260K", "fp8", "orin"),
                                                  ("stories260K", "fp32", "x86-cpu")}
    assert "# Supported models" in artifacts["supported-models"]["data"]


def test_a_failed_nightly_shows_failed_in_prefects_ui_with_named_tasks_and_logs(
        served: tuple[str, dict[str, str]], tab: Tab, tmp_path: Path, farm_dirs: dict[str, Path],
        impossible_catalog: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from edgefarm.cli import app

    ui, _ = served
    matrix = tmp_path / "failing.yml"
    matrix.write_text(yaml.safe_dump(FAILING))
    monkeypatch.setenv("PREFECT_API_URL", f"{ui}/api")  # the command reports to the served UI (and says where)
    with temporary_settings(updates={PREFECT_API_URL: f"{ui}/api"}):
        result = CliRunner().invoke(app, ["nightly", "--matrix", str(matrix), "--db", f"sqlite:///{tmp_path / 'f.db'}",
                                          "--inventory", str(farm_dirs["inventory"]), "--data-dir",
                                          str(farm_dirs["data"]), "--docs-dir", str(tmp_path / "docs")])
    assert result.exit_code == 1, result.stdout
    m = re.search(rf"flow run: ({re.escape(ui)}/runs/flow-run/[0-9a-f-]{{36}})", result.stdout)
    assert m, result.stdout
    row = "stories260K fp32 @x86-cpu"

    tab.goto(m.group(1))  # the run's page opens on its logs
    tab.wait_for("document.body.innerText.includes('Failed') && document.body.innerText.includes('log log:')",
                 timeout=90)
    page = _text(tab)
    assert f"1 row(s) failed: {row}: accuracy fail" in page, page[:3000]
    assert "accuracy fail, log log:" in page and "logits_max_abs_diff" in page, page[:3000]
    assert "This run didn't generate logs" not in page
    tab.screenshot("prefect-ui-failed-nightly-logs.png")

    tab.js("[...document.querySelectorAll('li.p-tab')].find(t => t.textContent.trim() === 'Task Runs').click()")
    tab.wait_for(f"document.body.innerText.includes('accuracy {row}')", timeout=60)
    names = tab.js("[...document.querySelectorAll('.state-list-item, .task-run-list-item, [class*=list-item]')]"
                   ".map(e => e.innerText.replace(/\\s+/g, ' ').trim())")
    tasks = _text(tab)
    for stage in ("export", "build", "infer", "accuracy"):
        assert f"{stage} {row}" in tasks, tasks[:3000]
    accuracy = [n for n in names if n.startswith(f"accuracy {row}")]  # list items and their parts
    assert any("Failed" in n for n in accuracy) and not any("Completed" in n for n in accuracy), names
    assert any(n.startswith(f"export {row}") and "Completed" in n for n in names), names
    tab.screenshot("prefect-ui-failed-nightly-task-runs.png")
