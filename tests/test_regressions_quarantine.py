"""Regressions reach the query, the docs and the HTML matrix; flaky devices are quarantined, skipped by the
leases, named by `devices list`, and released by a passing health check. Real SQLite databases, the real CLI,
the real local device."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.registries import current
from edgefarm.results import quarantine
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder
from edgefarm.results.regressions import flag_regressions
from edgefarm.toolchains.health import check_device
from edgellm.errors import InfrastructureError

TC = "edgellm-ort"
WIDE = {"COLUMNS": "400"}


@pytest.fixture
def rec(tmp_path: Path) -> Recorder:
    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    return Recorder(engine)


def _nightly(rec: Recorder, rows: dict[str, tuple[float, float]], *, finish: bool = True) -> int:
    """One nightly run: per model (decode tokens/s, perplexity ratio), every required stage passing."""
    run = rec.start_run("nightly", "cron", "v")
    for model, (tps, ratio) in rows.items():
        common = dict(model=model, precision="fp16", platform="x86-cpu", test_id=f"{model}-t", toolchain=TC,
                      device="local-cpu")
        rec.record_result(run, stage="infer", status="pass", **common)
        rec.record_result(run, stage="accuracy", status="pass", metrics={"perplexity_ratio": (ratio, "")}, **common)
        rec.record_result(run, stage="bench", status="pass",
                          metrics={"decode_tokens_per_s": (tps, "tokens/s")}, **common)
    if finish:
        rec.finish_run(run, "passed")
    return run


def test_regressions_reach_the_query_the_docs_and_the_html(rec: Recorder, tmp_path: Path) -> None:
    url = str(rec.engine.url)
    history = [(100.0, 1.00), (103.0, 1.01), (98.0, 1.00), (101.0, 1.02)]
    runs = [_nightly(rec, {"acc": h, "perf": h, "steady": h}) for h in history]
    bad = _nightly(rec, {"acc": (100.0, 1.40), "perf": (60.0, 1.01), "steady": (99.0, 1.01)}, finish=False)
    flags = flag_regressions(rec.engine, bad)
    assert {(f.model, f.metric, f.severity.value) for f in flags} == {
        ("acc", "perplexity_ratio", "fail"), ("perf", "decode_tokens_per_s", "warn")}
    rec.finish_run(bad, "failed")

    result = CliRunner().invoke(app, ["query", "--regressions", "--format", "json", "--db", url])
    assert result.exit_code == 0, result.output
    got = {(r["model"], r["metric"]): r for r in json.loads(result.output)}
    assert set(got) == {("acc", "perplexity_ratio"), ("perf", "decode_tokens_per_s")}
    assert got[("perf", "decode_tokens_per_s")]["previous_run_id"] == runs[-1]
    assert got[("perf", "decode_tokens_per_s")]["baseline"] == pytest.approx(100.5)
    table = CliRunner().invoke(app, ["query", "--regressions", "--db", url], env=WIDE)
    assert table.exit_code == 0 and "perf" in table.output and f"{runs[-1]} -> {bad}" in table.output
    status = {r["model"]: r["status"] for r in json.loads(
        CliRunner().invoke(app, ["query", "--format", "json", "--db", url]).output)}
    # accuracy fails, performance warns
    assert status == {"acc": "failing", "perf": "l0_covered", "steady": "l0_covered"}

    docs = tmp_path / "docs"
    result = CliRunner().invoke(app, ["docs", "--db", url, "--out", str(docs)])
    assert result.exit_code == 0, result.output
    md = (docs / "supported-models.md").read_text()
    assert "| acc | - | ✗ failing (" in md and "| perf |" in md and "| steady |" in md
    assert "warn regression: decode_tokens_per_s 60 vs 100.5" in md
    html = (docs / "support-matrix.html").read_text()
    assert html.count("⚠ regression") == 2
    assert f"href='runs/run-{runs[-1]}.html'>run {runs[-1]}</a> → <a href='runs/run-{bad}.html'>run {bad}</a>" in html
    assert (docs / "runs" / f"run-{runs[-1]}.html").is_file()  # the baseline run's page exists for the link
    regenerated = tmp_path / "again"
    assert CliRunner().invoke(app, ["docs", "--db", url, "--out", str(regenerated)]).exit_code == 0
    strip = lambda text: "\n".join(ln for ln in text.splitlines() if "Generated" not in ln)  # noqa: E731
    assert strip((regenerated / "supported-models.md").read_text()) == strip(md)


def _inventory(tmp_path: Path, ids: list[str]) -> Path:
    inv = tmp_path / "inventory"
    inv.mkdir()
    for device in ids:
        (inv / f"{device}.yaml").write_text(yaml.safe_dump({
            "type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "work" / device),
            "max_jobs": 1, "python": sys.executable, "env": {"PYTHONPATH": str(Path(__file__).parents[1])}}))
    return inv


def test_a_flaky_device_is_quarantined_skipped_named_and_released(rec: Recorder, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefarm.cli.devices import store_reports
    from edgefarm.tasks.device_exec import run_stage
    from edgefarm.tasks.farm import Farm, FarmContext

    url = str(rec.engine.url)
    inv = _inventory(tmp_path, ["flaky", "steady"])
    for _ in range(3):  # flaky: 3 runs where one try passed and two failed for infrastructure reasons
        run = rec.start_run("nightly", "cron", "v")
        rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", stage="infer", test_id="t",
                          status="pass", toolchain=TC, device="flaky")
        rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", stage="bench", test_id="t",
                          status="pass", toolchain=TC, device="steady")
        for stage in ("accuracy", "build"):
            rec.record_attempt(run, model="m", precision="fp16", platform="x86-cpu", stage=stage, test_id="t",
                               device="flaky", status="error", error_kind="infrastructure", toolchain=TC,
                               reason="connection lost")
        rec.finish_run(run, "passed")
    rates = {r.device: r for r in quarantine.error_rates(rec.engine)}
    assert (rates["flaky"].infra_errors, rates["flaky"].tries) == (6, 9)
    assert (rates["steady"].infra_errors, rates["steady"].tries) == (0, 3)
    per_test = quarantine.error_rates(rec.engine, per_test=True)
    assert {(r.device, r.test_id) for r in per_test} == {("flaky", "t"), ("steady", "t")}
    new = quarantine.update_quarantine(rec.engine)
    assert [q.device_id for q in new] == ["flaky"] and "6 of its last 9 tries" in new[0].reason
    assert quarantine.update_quarantine(rec.engine) == []  # once

    listed = CliRunner().invoke(app, ["devices", "list", "--inventory", str(inv), "--db", url], env=WIDE)
    assert listed.exit_code == 0, listed.output
    rows = {ln.split("│")[1].strip(): ln for ln in listed.output.splitlines() if ln.startswith("│")}
    assert "6 of its last 9 tries failed for infrastructure" in rows["flaky"]
    assert rows["steady"].rstrip("│ ").endswith("no")

    monkeypatch.setenv("EDGEFARM_DB_URL", url)
    ctx = FarmContext(run_id=rec.start_run("adhoc", "test", "v"), db_url=url, data_dir=str(tmp_path / "data"),
                      inventory_dir=str(inv))
    farm = Farm.get(ctx)
    try:
        for _ in range(2):  # the lease never lands on the quarantined device
            ran = run_stage(farm, platform="x86-cpu", what="probe", timeout=120,
                            argv=lambda d, t, j: [d.interpreter, "-m", "edgellm", "--version"])
            assert ran.device.id == "steady" and ran.status.value == "pass"
        rec.record_attempt(ctx.run_id, model="m", precision="fp16", platform="x86-cpu", stage="infer", test_id="t",
                           device="steady", status="error", error_kind="infrastructure", toolchain=TC)
        assert [q.device_id for q in quarantine.update_quarantine(rec.engine, threshold=0.2)] == ["steady"]
        # both quarantined: the stage fails as infrastructure, naming why
        with pytest.raises(InfrastructureError, match="every x86-cpu device is quarantined: flaky: 6 of"):
            run_stage(farm, platform="x86-cpu", what="probe", timeout=120,
                      argv=lambda d, t, j: [d.interpreter, "-m", "edgellm", "--version"])
    finally:
        Farm.close(ctx)

    devices = {d.id: d for d in load_inventory(inv, data_dir=tmp_path / "data")}
    report = check_device(devices["flaky"], current().device_type(devices["flaky"].type), min_free_gb=0.0)
    assert report.healthy, report
    store_reports(url, [report])  # a passing health check releases it
    assert set(quarantine.active(rec.engine)) == {"steady"}
    assert quarantine.update_quarantine(rec.engine) == []  # its old errors no longer count
    assert "flaky" not in {r.device for r in quarantine.error_rates(rec.engine)}
