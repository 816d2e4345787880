"""The published docs, from a real SQLite results database: supported-models.md in the field's layout (one table
per platform, models x precisions), export-verified-only cells, no orchestrator paths/hosts/URLs, trend plots with
integer run ids, one per metric and platform."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from edgefarm.pages.docs import db_label, write_docs
from edgefarm.pages.docs_render import (
    MatrixRow,
    TrendPoint,
    cell_kind,
    format_params,
    render_markdown,
    scrub,
    trend_figure,
)
from edgefarm.results.support import SupportStatus
from tests.helpers.docs_db import build_docs_db

SUPPORTED_MARK = SupportStatus.L0_COVERED.mark
EXPORT_ONLY_MARK = SupportStatus.IMPLEMENTED.mark


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs")
    data = root / "data"
    url = build_docs_db(root / "edgefarm.db", data)
    out = root / "published"
    summary = write_docs(url, out, data)
    assert summary["rows"] == 5 and summary["supported"] == 2
    return out


def _section(md: str, platform: str) -> str:
    return md.split(f"## {platform}\n", 1)[1].split("\n## ", 1)[0]


def test_supported_models_has_one_table_per_platform_with_precisions_as_columns(docs: Path) -> None:
    md = (docs / "supported-models.md").read_text()
    cpu = _section(md, "x86-cpu")
    assert "Toolchain: edgellm-ort 0.1.0+onnxruntime-1.22.0" in cpu
    header = next(line for line in cpu.splitlines() if line.startswith("| Model"))
    assert header == "| Model | Params | FP32 | FP16 |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in cpu.splitlines() if line.startswith("| ")}
    stories = rows["stories260K"].strip("| ").split(" | ")
    assert stories[1] == format_params(_stories_params()) and stories[1].endswith("K")
    assert stories[2] == f"[{SUPPORTED_MARK}](runs/run-2.md#stories260k-fp32-x86-cpu)"
    assert stories[3] == f"[{SUPPORTED_MARK}](runs/run-2.md#stories260k-fp16-x86-cpu)"
    # it failed: its own mark, since when, a link to the run (never the supported mark); fp16 never tested
    assert rows["tiny-qwen3"].strip("| ").split(" | ")[2:] == [
        "✗ failing since run 1 ([run 2](runs/run-2.md#tiny-qwen3-fp32-x86-cpu))", "never tested"]
    orin = _section(md, "orin")
    assert "| Model | Params | FP8 | INT4_AWQ |" in orin
    line = next(x for x in orin.splitlines() if x.startswith("| tiny-qwen3"))
    cells = line.strip("| ").split(" | ")
    assert cells[2] == "never tested"  # no result of tiny-qwen3 fp8 on orin
    assert "Toolchain: tensorrt-edgellm 0.11.0" in orin  # its version said once, in the heading (issue 41)
    assert cells[3] == (f"{EXPORT_ONLY_MARK} implemented (export verified only), tensorrt-edgellm "
                        "([run 2](runs/run-2.md#tiny-qwen3-int4-awq-orin))")
    assert f"[{SUPPORTED_MARK}" not in line  # export-only evidence is not support: never the supported mark
    stories = next(x for x in orin.splitlines() if x.startswith("| stories260K")).strip("| ").split(" | ")
    assert stories[2:] == ["n/a", "never tested"]  # not applicable and never tested: each its own mark, none blank
    assert "Legend:" in md and SUPPORTED_MARK in md and EXPORT_ONLY_MARK in md
    evidence = (docs / "runs" / "run-2.md").read_text()
    assert "<a id='stories260k-fp32-x86-cpu'></a>" in evidence


def test_every_status_renders_visibly_and_distinctly_in_markdown() -> None:
    """Issue 26: failing, not applicable, skipped, waived and never tested each render as their own non-blank
    mark; the legend names every status of the one vocabulary."""
    base = dict(model="m", platform="orin", run_id=3, run_started="t", toolchain="tc", toolchain_version="1")
    rows = [MatrixRow(precision="fp32", status="fail", stages={"export": "pass", "build": "fail"}, **base),
            MatrixRow(precision="fp16", status="not_applicable", stages={"export": "not_applicable"}, **base),
            MatrixRow(precision="fp8", status="incomplete", stages={"export": "skipped"}, **base),
            MatrixRow(precision="int8_sq", status="incomplete", stages={"export": "waived"}, **base),
            MatrixRow(precision="int4_awq", status="incomplete", stages={"export": "pass", "build": "skipped"},
                      **base)]
    md = render_markdown([*rows, MatrixRow(model="other", precision="fp32", platform="orin", status="pass",
                                           run_id=3, run_started="t", stages={"infer": "pass", "accuracy": "pass"})],
                         generated_at="now", db_label="SQLite")
    line = next(x for x in _section(md, "orin").splitlines() if x.startswith("| m |"))
    cells = line.strip("| ").split(" | ")[2:]
    assert all(c.strip() for c in cells) and len(set(cells)) == len(cells), cells
    assert cells[0].startswith("✗ failing") and cells[1] == "n/a" and cells[2].startswith("skipped")
    for status in SupportStatus:
        assert f"- {status.mark}" in md or f"- {status.label} ({status.mark})" in md, status


def test_a_platform_without_evidence_says_what_is_true_there() -> None:
    """Issue 26: no "Tested, no passing evidence yet: orin" when nothing ran there: each status with its reason."""
    base = dict(model="m", precision="fp32", platform="orin", run_id=3, run_started="t")
    skipped = MatrixRow(status="incomplete", stages={"export": "skipped", "build": "skipped"},
                        reason="no orin device in the inventory", **base)
    failing = MatrixRow(**{**base, "platform": "thor"}, status="fail", stages={"export": "fail"}, reason="boom")
    md = render_markdown([skipped, failing], generated_at="now", db_label="SQLite")
    assert "Tested, no passing evidence yet" not in md
    assert "- orin: 1 skipped (no orin device in the inventory)." in md
    assert "- thor: 1 failing (boom)." in md


def _stories_params() -> int:
    from edgellm import ASSETS_DIR
    from edgellm.checkpoint.checkpoint import Checkpoint

    return Checkpoint.open(ASSETS_DIR / "stories260K").parameter_count


def test_published_pages_carry_no_orchestrator_paths_hosts_or_urls(docs: Path) -> None:
    pages = {p: p.read_text() for p in [docs / "supported-models.md", docs / "support-matrix.html",
                                        *sorted((docs / "runs").glob("*.md"))]}
    data_dir = str(docs.parent / "data")
    for path, text in pages.items():
        assert str(docs.parent) not in text, path
        assert "10.1.2.3" not in text and "http://" not in text and "/home/ci" not in text, path
        assert "sqlite:" not in text and "edgefarm.db" not in text, path
    assert "(SQLite)" in pages[docs / "supported-models.md"]
    run = pages[docs / "runs" / "run-2.md"]
    assert "log devices/local-cpu/logs/run-2/accuracy.log" in run  # relative to the data dir
    assert "<host>" in run and "<url>" in run and "…/notes.txt" in run
    assert data_dir not in run
    assert db_label("postgresql+psycopg://u:secret@db.example:5432/farm") == "PostgreSQL"


def test_scrub_keeps_ordinary_text() -> None:
    text = "build/infer: decode 12 tok/s, ratio 1/2 (fp16)"
    assert scrub(text, "/data") == text
    assert scrub("/data/artifacts/ab/cd in /data", "/data") == "artifacts/ab/cd in ."


def test_trend_plots_one_per_metric_and_platform_with_integer_run_ids(docs: Path) -> None:
    names = sorted(p.name for p in docs.glob("trend-*.png"))
    assert names == ["trend-x86-cpu-decode-tokens-per-s.png", "trend-x86-cpu-perplexity-ratio.png",
                     "trend-x86-cpu-prefill-tokens-per-s.png"]
    import matplotlib.pyplot as plt

    one = {("stories260K", "fp32"): [TrendPoint(7, "2026-01-02T02:00:00+00:00", "stories260K", "fp32", "x86-cpu",
                                                "m", 1.0)]}
    fig = trend_figure("decode_tokens_per_s", "x86-cpu", one)
    ax = fig.axes[0]
    fig.canvas.draw()
    assert list(ax.get_xticks()) == [7]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["7\n2026-01-02"]  # run id and date
    plt.close(fig)


def test_trend_plots_tell_series_apart_name_units_and_draw_the_baseline_band() -> None:
    """Issue 26: 15 series are 15 distinct (colour, marker, line style) styles, not paired colours; the y axis is
    the metric's human name with its unit; the baseline band the regression check uses is shaded."""
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    series = {(f"model-{i:02d}", "fp16"): [TrendPoint(r, f"2026-01-{r:02d}T02:00:00", f"model-{i:02d}", "fp16",
                                                      "x86-cpu", "decode_tokens_per_s", 100.0 + i + r % 2)
                                           for r in range(1, 6)] for i in range(15)}
    fig = trend_figure("decode_tokens_per_s", "x86-cpu", series)
    ax = fig.axes[0]
    styles = {(tuple(line.get_color()), line.get_marker(), line.get_linestyle()) for line in ax.get_lines()}
    assert len(ax.get_lines()) == 15 and len(styles) == 15
    colours_markers = {(tuple(line.get_color()), line.get_marker()) for line in ax.get_lines()}
    assert len(colours_markers) == 15  # even without line styles, no two series look alike
    assert ax.get_ylabel() == "decode throughput (tokens/s, higher is better)"
    assert ax.get_title() == "decode throughput on x86-cpu over nightly runs"
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 15  # 4 earlier runs each: every series has its band
    lo, hi = bands[0].get_paths()[0].get_extents().y0, bands[0].get_paths()[0].get_extents().y1
    assert lo < 100.5 < hi  # model-00's median of runs 1-4 (100, 101, 100, 101) inside its band
    assert ax.get_legend().get_title().get_text() == "shaded: baseline band"
    plt.close(fig)


def test_export_only_cells_never_count_as_supported() -> None:
    base = dict(model="m", precision="int4_awq", platform="orin", run_id=1, run_started="t")
    export_only = MatrixRow(status="incomplete", stages={"quantize": "pass", "export": "pass", "build": "skipped"},
                            **base)
    assert cell_kind(export_only) is SupportStatus.IMPLEMENTED
    failed_build = MatrixRow(status="fail", stages={"export": "pass", "build": "fail"}, **base)
    assert cell_kind(failed_build) is SupportStatus.FAILING
    ran = MatrixRow(status="incomplete", stages={"export": "pass", "build": "pass", "infer": "skipped"}, **base)
    assert cell_kind(ran) is SupportStatus.SKIPPED
    md = render_markdown([export_only], generated_at="now", db_label="SQLite")
    assert "## orin" in md and "[" + SUPPORTED_MARK not in md
    assert re.search(r"\| m \| - \| ◇ implemented \(export verified only\)", md)
    empty = render_markdown([failed_build], generated_at="now", db_label="SQLite")
    assert "No combination has passing evidence yet." in empty and "- orin: 1 failing." in empty


def test_format_params() -> None:
    assert [format_params(n) for n in (None, 999, 260_000, 1_540_000, 494_000_000, 7_620_000_000)] == [
        "-", "999", "260K", "1.5M", "494M", "7.6B"]


# -- pages of runs with one toolchain per platform ---------------------------------------------------------------
GOLDEN = Path(__file__).parent / "data" / "golden_docs"
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")
_PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def _normalized(text: str) -> str:
    """A page without what changes between two generations: times and the trend images' bytes."""
    return _PNG.sub("data:image/png;base64,<png>", _TIME.sub("<time>", text))


@pytest.mark.parametrize("page", ["supported-models.md", "support-matrix.html", "runs/run-2.md", "runs/run-2.html"])
def test_pages_of_runs_with_one_toolchain_per_platform_match_the_golden_files(docs: Path, page: str) -> None:
    """Rows, labels, anchors and layout of the pages as they were before rows were keyed by toolchain (each
    platform here ran its preferred toolchain only). After an intended change, regenerate with
    ``EDGEFARM_UPDATE_GOLDEN=1 pytest tests/test_docs.py`` and review the diff of ``tests/data/golden_docs/``."""
    import os

    golden = GOLDEN / page.replace("/", "-")
    text = _normalized((docs / page).read_text())
    if os.environ.get("EDGEFARM_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


# -- rows proven only on the checkpoint-direct route ---------------------------------------------------------------
def test_rows_proven_only_on_the_direct_route_are_marked(tmp_path: Path) -> None:
    """A row whose latest evidence made its engine straight from the checkpoint (route ``direct``: TensorRT
    Edge-LLM's direct builder) says "checkpoint-direct only" in both pages, with a legend line; an ONNX-route row and
    a direct row that did not pass do not."""
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade
    from edgefarm.results.recorder import Recorder
    from tests.helpers.docs_db import PIPELINE

    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc123")
    passed = {"quantize": "pass", **dict.fromkeys(PIPELINE, "pass")}
    failed = {"quantize": "pass", "export": "pass", "build": "fail", **dict.fromkeys(PIPELINE[2:], "skipped")}
    for precision, route, stages in (("fp16", "direct", passed), ("int4_awq", "onnx", passed),
                                     ("fp8", "direct", failed)):
        for stage, status in stages.items():
            on_host = stage in ("quantize", "export")
            rec.record_result(run, model="tiny-qwen3", precision=precision, platform="thor", stage=stage,
                              test_id=f"tiny-qwen3-{precision}", status=status,
                              device="orchestrator" if on_host else "thor-1", toolchain="tensorrt-edgellm",
                              toolchain_version="0.11.0", route=None if on_host else route,
                              reason="boom" if status == "fail" else None)
    rec.finish_run(run, "failed")
    engine.dispose()
    out = tmp_path / "published"
    summary = write_docs(url, out, tmp_path / "data")
    assert summary["supported"] == 2
    md = (out / "supported-models.md").read_text()
    line = next(x for x in _section(md, "thor").splitlines() if x.startswith("| tiny-qwen3"))
    cells = dict(zip(("FP16", "FP8", "INT4_AWQ"), line.strip("| ").split(" | ")[2:], strict=True))
    direct = SupportStatus.CHECKPOINT_DIRECT.mark
    assert cells["FP16"] == f"[{direct}](runs/run-1.md#tiny-qwen3-fp16-thor) checkpoint-direct only"
    assert cells["INT4_AWQ"] == f"[{SUPPORTED_MARK}](runs/run-1.md#tiny-qwen3-int4-awq-thor)"
    assert cells["FP8"] == "✗ failing ([run 1](runs/run-1.md#tiny-qwen3-fp8-thor))"
    assert "- ◆ checkpoint-direct only: passed, but only on the route that builds the engine straight from" in md
    html = (out / "support-matrix.html").read_text()
    assert html.count("<b>checkpoint-direct only</b> · run 1</a>") == 1
    assert "<li>◆ checkpoint-direct only: passed, but only on the route" in html
