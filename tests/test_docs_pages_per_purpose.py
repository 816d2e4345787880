"""Issue 26: pages per purpose and evidence one click away. The nightly's pages come from nightly runs only
(never a bring-up's, issue 41); a test-list run publishes its own page (``docs/lists/<list>.md`` and ``.html``);
neither rewrites the other. A waiver's bug link stays a link in the HTML and the Prefect table; a run's log is
copied beside its run pages and linked; tooltips lead with the root cause."""

from __future__ import annotations

import re
from pathlib import Path

from edgefarm.pages.docs import matrix_rows, publish_test_list, write_docs
from edgefarm.pages.docs_html import render_html
from edgefarm.pages.docs_render import MatrixRow
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder
from edgefarm.results.support import Support, SupportStatus
from tests.helpers.docs_db import ORT, PIPELINE, TRT, _row, build_docs_db

_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[+-]\d{2}:\d{2}|Z)?")
_PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def _pages(out: Path) -> dict[str, str]:
    """Every nightly page, without what changes between two generations (times, image bytes)."""
    return {str(p.relative_to(out)): _PNG.sub("<png>", _TIME.sub("<time>", p.read_text()))
            for p in sorted(out.rglob("*")) if p.is_file() and p.suffix in (".md", ".html")
            and "lists" not in p.parts and "runs" not in p.parts}


def _farm(tmp_path: Path) -> tuple[str, int, int]:
    """A nightly with a benchmark on x86-cpu, then a test-list run (kind l0) without one that also ran orin."""
    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    nightly = rec.start_run("nightly", "schedule", "abc")
    metrics = {"decode_tokens_per_s": (410.0, "tok/s"), "perplexity_ratio": (1.0001, "")}
    _row(rec, nightly, "stories260K", "fp32", "x86-cpu", dict.fromkeys(PIPELINE, "pass"), metrics=metrics,
         device="local-cpu")
    rec.finish_run(nightly, "passed")
    listed = rec.start_run("l0", "cli", "abc")
    no_bench = {"export": "pass", "build": "pass", "infer": "pass", "accuracy": "pass"}
    _row(rec, listed, "stories260K", "fp32", "x86-cpu", no_bench, metrics={"perplexity_ratio": (1.0002, "")},
         device="local-cpu")
    _row(rec, listed, "tiny-qwen3", "int4_awq", "orin",
         {"quantize": "pass", "export": "pass", "build": "skipped", "infer": "skipped", "accuracy": "skipped"},
         reason="no orin device in the inventory", toolchain=TRT)
    rec.finish_run(listed, "passed")
    engine.dispose()
    return url, nightly, listed


def test_a_test_list_run_publishes_its_own_page_and_never_changes_the_nightlys(tmp_path: Path) -> None:
    url, nightly, listed = _farm(tmp_path)
    out = tmp_path / "docs"
    write_docs(url, out, tmp_path / "data")
    before = _pages(out)
    md = before["supported-models.md"]
    assert f"(runs/run-{nightly}.md#stories260k-fp32-x86-cpu)" in md and "tiny-qwen3" not in md  # nightly only
    assert "decode tok/s 410.0" in before["support-matrix.html"]  # the nightly's throughput, not lost
    published = publish_test_list(url, out, "l0_pipeline_x86cpu", listed, tmp_path / "data")
    assert published["pages"] == ["lists/l0_pipeline_x86cpu.md", "lists/l0_pipeline_x86cpu.html"]
    assert _pages(out) == before  # the list's page rewrote none of the nightly's
    write_docs(url, out, tmp_path / "data")
    assert _pages(out) == before  # and regenerating the nightly's leaves the list run out of them
    engine = make_engine(url)
    try:  # the Prefect matrix artifact's rows (publish_matrix_artifacts) are the nightly's too
        assert [(r.model, r.platform, r.run_id) for r in matrix_rows(engine)] == [
            ("stories260K", "x86-cpu", nightly)]
    finally:
        engine.dispose()
    page = (out / "lists" / "l0_pipeline_x86cpu.md").read_text()
    assert page.startswith("# Test list l0_pipeline_x86cpu")
    assert f"[✓](../runs/run-{listed}.md#stories260k-fp32-x86-cpu)" in page
    assert f"([run {listed}](../runs/run-{listed}.md#tiny-qwen3-int4-awq-orin))" in page
    html = (out / "lists" / "l0_pipeline_x86cpu.html").read_text()
    assert f"href='../runs/run-{listed}.html#tiny-qwen3-int4-awq-orin'" in html
    assert (out / "runs" / f"run-{listed}.html").is_file() and (out / "runs" / f"run-{listed}.md").is_file()
    assert "decode tok/s" not in html  # the list run had no bench: its page says so, the nightly's keeps it


def test_a_waivers_bug_link_stays_a_link_in_the_html_and_the_markdown() -> None:
    link = "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/1"
    support = Support(SupportStatus.WAIVED, reason=f"waived until 2099-01-01 ({link})", link=link, run_id=4)
    row = MatrixRow(model="m", precision="fp32", platform="x86-cpu", status="incomplete", run_id=4, run_started="t",
                    stages={"export": "waived"}, reason="waived until 2099-01-01 (<url>)", support=support, bug=link)
    html = render_html([row], generated_at="now", db_label="SQLite")
    assert f"<a class='bug' href='{link}'>bug</a>" in html and "data-status='waived'" in html
    from edgefarm.pages.docs_render import render_markdown

    md = render_markdown([row], generated_at="now", db_label="SQLite", links=False)
    assert f"[bug]({link})" in md


def test_the_prefect_table_keeps_the_bug_link_and_leads_with_the_root_cause(tmp_path: Path, monkeypatch) -> None:
    import prefect.artifacts

    from edgefarm.pages.docs import publish_matrix_artifacts

    url = f"sqlite:///{tmp_path / 'w.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc")
    link = "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/7"
    _row(rec, run, "m", "fp32", "x86-cpu", dict.fromkeys(("export", "build", "infer"), "waived"),
         reason=f"waived until 2099-01-01 ({link})", toolchain=ORT)
    _row(rec, run, "m", "fp16", "x86-cpu", {"export": "pass", "build": "fail", "infer": "skipped",
                                             "accuracy": "skipped"}, toolchain=ORT, reason="upstream build failed")
    rec.finish_run(run, "failed")
    engine.dispose()
    tables: list[list[dict[str, object]]] = []
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda table, **_: tables.append(table))
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **_: None)
    publish_matrix_artifacts(url)
    by = {r["precision"]: r for r in tables[0]}
    assert by["fp32"]["status"] == "waived" and by["fp32"]["bug"] == link
    assert by["fp16"]["status"] == "failing" and by["fp16"]["label"] == "failing"


def test_a_runs_log_is_copied_beside_its_run_pages_and_linked(tmp_path: Path) -> None:
    """A log artifact in this host's store: its text (scrubbed) sits at runs/logs/<sha12>.txt, linked from both run
    pages, so the evidence opens offline from a file."""
    from edgefarm.artifacts.store import ArtifactStore

    data = tmp_path / "data"
    store = ArtifactStore(data / "artifacts")
    ref = store.put(f"step 1 ok\nFAILED: ratio 1.9 in {data}/devices/x/work (ssh edge@10.1.2.3)\n".encode(), "log")
    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc")
    _row(rec, run, "m", "fp32", "x86-cpu", {"export": "pass", "build": "pass", "infer": "fail"},
         reason="ratio 1.9", toolchain=ORT)
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from edgefarm.results.models import Result

    with Session(engine) as s:
        infer = s.scalars(select(Result.id).where(Result.stage == "infer")).one()
    rec.record_artifact(run, ref, result_id=infer)
    rec.finish_run(run, "failed")
    engine.dispose()
    out = tmp_path / "docs"
    write_docs(url, out, data)
    copy = out / "runs" / "logs" / f"{ref.sha256[:12]}.txt"
    text = copy.read_text()
    assert "FAILED: ratio 1.9 in devices/x/work" in text and "10.1.2.3" not in text and str(data) not in text
    short = ref.sha256[:12]
    assert f"href='logs/{short}.txt'>log:{short}</a>" in (out / "runs" / f"run-{run}.html").read_text()
    assert f"[log:{short}](logs/{short}.txt)" in (out / "runs" / f"run-{run}.md").read_text()


def test_hostile_names_and_reasons_stay_text_on_the_html_run_page_and_every_cell_lands_on_its_row(
        tmp_path: Path) -> None:
    """The HTML run page escapes every hostile name and reason (no tag, attribute or script of theirs), gives each
    row its own id, and every matrix cell's evidence link names an id that exists on that page."""
    from tests.test_hostile_inputs_web import COLLIDING, HOSTILE_NAMES, _Tags

    names = [*HOSTILE_NAMES, *COLLIDING]
    url = f"sqlite:///{tmp_path / 'h.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc")
    for name in names:
        _row(rec, run, name, "fp32", "x86-cpu", {"export": "pass", "build": "fail", "infer": "skipped"},
             reason=f"<script>alert(1)</script> {name} ' onmouseover='x", device="local-cpu")
    rec.finish_run(run, "failed")
    engine.dispose()
    out = tmp_path / "docs"
    write_docs(url, out, tmp_path / "data")
    page = _Tags((out / "runs" / f"run-{run}.html").read_text())
    assert "script" not in page.names()
    assert page.names().count("b") == len(names)  # each row's own status only: the name "<b>" is text
    assert all(not k.startswith("on") for _, attrs in page.tags for k in attrs)
    ids = [a["id"] for t, a in page.tags if t == "section" and a.get("class") == "row"]
    assert len(ids) == len(set(ids)) == len(names)
    assert "<script>alert(1)</script>" in page.text  # shown as text
    matrix = _Tags((out / "support-matrix.html").read_text())
    links = [str(a["href"]) for t, a in matrix.tags if t == "a" and a.get("class") == "evidence"
             and str(a.get("href")).startswith("runs/")]
    assert len(links) == len(names)
    assert {link.split("#", 1)[1] for link in links} == set(ids)
    assert all(link.split("#", 1)[0] == f"runs/run-{run}.html" for link in links)


# -- the pages count rows through one function, so they agree (issue 41 item 5) --------------------------------------
def _md_counts(text: str) -> dict[str, int]:
    """``N <label>`` pieces of a counts line (each status's label, as the pages write it), by status value."""
    found = {}
    for s in SupportStatus:
        hit = re.search(rf"(?:^|, |\()(\d+) {re.escape(s.label)}(?= \(|,|\.|$)", text)
        if hit:
            found[s.value] = int(hit.group(1))
    return found


def test_the_pages_count_every_status_through_one_function_and_agree(tmp_path: Path, monkeypatch) -> None:
    """supported-models.md (overall and per platform), the HTML matrix, the toolchain's support-matrix.md and the run
    pages count through ``results.support.count_statuses``; rendered from one database, their counts agree: the HTML
    matrix's with supported-models.md's, and on a platform whose rows one toolchain ran (orin: tensorrt-edgellm), the
    layout page's coverage with supported-models.md's (the layout counts only its own toolchain's rows)."""

    from edgefarm import pages, results
    from edgefarm.pages import docs_layout, docs_render, docs_runs  # noqa: F401  (pages.docs_*)
    from edgefarm.results import support  # noqa: F401  (results.support)

    called: set[str] = set()

    def spy(module: str) -> object:
        def count(statuses: object) -> dict[SupportStatus, int]:
            called.add(module)
            return results.support.count_statuses(statuses)  # type: ignore[arg-type]
        return count

    for module in (pages.docs_layout, pages.docs_render, pages.docs_runs):
        monkeypatch.setattr(module, "count_statuses", spy(module.__name__))
    url = build_docs_db(tmp_path / "edgefarm.db", tmp_path / "data")
    engine = make_engine(url)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abd")  # a third nightly: a skipped orin row, a waived x86-cpu row
    _row(rec, run, "tiny-llama", "fp32", "orin", dict.fromkeys(("export", "build", "infer"), "skipped"),
         reason="no orin device in the inventory", toolchain=TRT)
    _row(rec, run, "tiny-llama", "fp16", "x86-cpu", dict.fromkeys(("export", "build", "infer", "accuracy"), "waived"),
         reason="waived until 2099-01-01 (https://bugs.example/42)")
    rec.finish_run(run, "failed")
    engine.dispose()
    out = tmp_path / "docs"
    write_docs(url, out, tmp_path / "data")
    assert called == {"edgefarm.pages.docs_layout", "edgefarm.pages.docs_render", "edgefarm.pages.docs_runs"}
    models = (out / "supported-models.md").read_text()
    overall = _md_counts(re.search(r"^Rows: \d+ \((.*)\)\.$", models, re.M).group(1))  # type: ignore[union-attr]
    html = (out / "support-matrix.html").read_text()
    in_html = {v: int(n) for v, n in re.findall(r"<span data-status='(\w+)'>(\d+) ", html)}
    assert in_html == overall and sum(overall.values()) == 7
    per_platform = {p: _md_counts(line) for p, line in re.findall(r"^## (\S+)\n\n.*\n\nRows: (.*)\.$", models, re.M)}
    assert set(per_platform) == {"x86-cpu", "orin"}
    matrix = (out / "edge-llm" / "support-matrix.md").read_text()
    header = re.findall(r"^\| Platform \| (.*) \|$", matrix, re.M)[-1].split(" | ")  # the coverage table's
    assert header == [s.display for s in SupportStatus]
    coverage = {name: {s.value: int(n) for s, n in zip(SupportStatus, cells.split(" | "), strict=True) if int(n)}
                for name, cells in re.findall(r"^\| `([^`]+)` \| ([\d |]+) \|$", matrix, re.M)}
    assert coverage["orin"] == per_platform["orin"] == {"implemented": 1, "not_applicable": 1, "skipped": 1}
    # a platform tensorrt-edgellm never ran: its rows (another toolchain's) are none of the layout's counts
    assert set(coverage["x86-cpu"]) <= {"never_tested", "not_applicable"}
    assert per_platform["x86-cpu"] == {"l0_covered": 2, "failing": 1, "waived": 1}
    # one way to count: no page module keeps a tally of its own
    for page in sorted(Path(pages.docs_render.__file__).parent.glob("docs*.py")):
        assert "dict.fromkeys(SupportStatus" not in page.read_text(), page.name
