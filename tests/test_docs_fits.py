"""Issue 37's pages: each row shows the memory the plan estimated for it (recorded with its results as the metric
``memory_estimate_mb``) beside the peak measured where it ran, and the HTML support matrix's "fits on" filter dims
the cells whose estimate exceeds the chosen device type's usable memory, escaped and offline."""

from __future__ import annotations

import html
from pathlib import Path

from edgefarm.pages.docs import usable_memory
from edgefarm.pages.docs_html import fits_filter, render_html
from edgefarm.pages.docs_render import MatrixRow
from edgefarm.stages.job import MEMORY_ESTIMATE_METRIC, estimate_metric
from tests.fixtures.browser import Tab

BASE = dict(platform="orin", run_id=3, run_started="t", toolchain="tc", toolchain_version="1")
PASSED = {"export": "pass", "build": "pass", "infer": "pass", "accuracy": "pass"}


def _rows() -> list[MatrixRow]:
    """A small model that fits an 8 GB board, a big one that needs 9.8 GB, one the plan could not size."""
    return [
        MatrixRow(model="small", precision="fp16", status="pass", stages=PASSED,
                  metrics={MEMORY_ESTIMATE_METRIC: 2048.0, "decode_peak_memory_mb": 1900.0}, **BASE),
        MatrixRow(model="big", precision="fp16", status="pass", stages=PASSED,
                  metrics={MEMORY_ESTIMATE_METRIC: 10035.2}, **BASE),
        MatrixRow(model="unsized", precision="fp16", status="pass", stages=PASSED, **BASE),
    ]


def test_the_estimate_is_a_metric_in_mib_recorded_only_when_the_plan_sized_the_row() -> None:
    assert estimate_metric(9.8) == {MEMORY_ESTIMATE_METRIC: (10035.2, "MiB")}
    assert estimate_metric(None) == {}


def test_a_cell_shows_estimate_and_measured_peak_and_carries_the_estimate_for_the_filter() -> None:
    page = render_html(_rows(), generated_at="now", db_label="SQLite", see_also=False,
                       usable_gb={"orin-nano-8gb": 6.9, "orin": 62.0})
    assert "estimated memory MiB 2048 · peak memory MiB 1900" in page
    assert "data-estimate-mb='2048'" in page and "data-estimate-mb='10035'" in page
    assert page.count("data-estimate-mb=") == 2  # the unsized row is never dimmed: unknown is not "does not fit"
    assert ("<select id='f-fits'><option value='all'>any device</option><option value='orin-nano-8gb' "
            "data-usable-mb='7066'>orin-nano-8gb (6.9 GB usable)</option><option value='orin' "
            "data-usable-mb='63488'>orin (62 GB usable)</option></select>") in page


def test_the_filter_escapes_a_site_device_type_name_and_is_absent_without_types() -> None:
    hostile = "<b>x'\"&"
    text = fits_filter({hostile: 4.0})
    assert hostile not in text and f"value='{html.escape(hostile)}'" in text
    assert fits_filter({}) == ""
    assert "f-fits" not in render_html(_rows(), generated_at="now", db_label="SQLite", see_also=False).split(
        "<script>")[0]


def test_the_pages_offer_every_device_type_with_its_usable_memory() -> None:
    usable = usable_memory()
    assert {"orin-nano-8gb", "orin-nx-16gb", "agx-orin-32gb", "orin", "thor"} <= set(usable)
    assert usable["orin-nano-8gb"] < usable["orin-nx-16gb"] < usable["agx-orin-32gb"] < usable["orin"]


def test_fits_on_dims_the_cells_that_exceed_the_chosen_type_in_the_browser(tab: Tab, tmp_path: Path) -> None:
    page = tmp_path / "support-matrix.html"
    page.write_text(render_html(_rows(), generated_at="now", db_label="SQLite", see_also=False,
                                usable_gb={"orin-nano-8gb": 6.9, "orin": 62.0}))
    tab.goto(page.as_uri())
    dimmed = "[...document.querySelectorAll('td.cell.nofit')].map(td => td.dataset.key).sort()"
    shown = ("[...document.querySelectorAll('tbody tr')].filter(tr => !tr.classList.contains('hidden'))"
             ".map(tr => tr.dataset.model).sort()")
    assert tab.js(dimmed) == [] and tab.js(shown) == ["big", "small", "unsized"]
    tab.js("(() => { const s = document.getElementById('f-fits'); s.value = 'orin-nano-8gb'; "
           "s.dispatchEvent(new Event('change')); return true; })()")
    assert tab.js(dimmed) == ["big-fp16-orin"]
    assert tab.js(shown) == ["small", "unsized"]  # a row with no cell that fits is hidden
    tab.js("(() => { const s = document.getElementById('f-fits'); s.value = 'orin'; "
           "s.dispatchEvent(new Event('change')); return true; })()")
    assert tab.js(dimmed) == [] and tab.js(shown) == ["big", "small", "unsized"]


def test_the_record_and_the_plan_s_decisions_carry_the_estimate_to_the_matrix_rows(
        migrated_db_url: str, tmp_path: Path) -> None:
    """What a job's stages record (and what the plan records of a job that will not run) carries the plan's
    estimate, and the support matrix's row reads it back beside the measured peak: no migration, one metric."""
    from sqlalchemy import create_engine

    from edgefarm.flows.pipeline import RunReport, record_plan_decisions
    from edgefarm.flows.plan import Decision, Job, Plan
    from edgefarm.pages.docs import matrix_rows
    from edgefarm.results.models import ResultStatus
    from edgefarm.results.recorder import Recorder
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import StageOutcome
    from edgefarm.tasks.farm import Farm, FarmContext
    from edgefarm.tasks.record import record
    from edgefarm.test_lists.testlist import TestEntry
    from edgellm.types import Precision

    engine = create_engine(migrated_db_url)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    ctx = FarmContext(run_id=run, db_url=migrated_db_url, data_dir=str(tmp_path / "data"),
                      inventory_dir=str(Path(__file__).resolve().parents[1] / "devices" / "inventory"))
    try:
        job = JobSpec(model="m", precision=Precision.FP32, platform="x86-cpu", toolchain="edgellm-ort",
                      test_id="m-fp32", max_seq_len=64, checkpoint=CheckpointRef("m", str(tmp_path), "ab" * 32),
                      max_batch_size=1, max_input_len=32, stages=("export",), memory_estimate_gb=1.5)
        record(ctx, job, "export", StageOutcome("export", ResultStatus.PASS, toolchain_version="1",
                                                metrics={"decode_peak_memory_mb": (1400.0, "MiB")}))
        entry = TestEntry(list_name="l", model="big", precision=Precision.FP32, max_seq_len=64, max_batch_size=1,
                          max_input_len=32, stages=("export",), timeouts={})
        refused = Job(entry=entry, platform="x86-cpu", decision=Decision.NOT_APPLICABLE, toolchain="edgellm-ort",
                      reason="needs 30.0 GB; x86-cpu has 20 GB usable", memory={"estimate_gb": 30.0, "parts": {}})
        record_plan_decisions(ctx, Plan(name="p", kind="nightly", jobs=[refused]), RunReport(run_id=run))
    finally:
        Farm.close(ctx)
    rec.finish_run(run, "passed")
    try:
        rows = {r.model: r.metrics for r in matrix_rows(engine, tmp_path / "data")}
    finally:
        engine.dispose()
    assert rows == {"m": {MEMORY_ESTIMATE_METRIC: 1536.0, "decode_peak_memory_mb": 1400.0},
                    "big": {MEMORY_ESTIMATE_METRIC: 30720.0}}
