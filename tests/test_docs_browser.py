"""The HTML support matrix as people see it: opened from a file in headless Chromium (offline, no external assets),
its cells, links, details and filters checked in the live DOM, a screenshot kept under .data/test-artifacts/."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgefarm.pages.docs import write_docs
from tests.fixtures.browser import Tab
from tests.helpers.docs_db import build_docs_db


@pytest.fixture(scope="module")
def matrix_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-browser")
    data = root / "data"
    out = root / "published"
    write_docs(build_docs_db(root / "edgefarm.db", data), out, data)
    return out / "support-matrix.html"


def _visible_cells(tab: Tab) -> list[str]:
    return tab.js("[...document.querySelectorAll('td.cell[data-key]')].filter(td => td.offsetParent !== null "
                  "&& !td.classList.contains('filtered')).map(td => td.dataset.key).sort()")


def test_matrix_page_layout_links_details_and_filters(tab: Tab, matrix_page: Path) -> None:
    html = matrix_page.read_text()
    assert "src='http" not in html and "href='http" not in html and "<link" not in html  # nothing external
    tab.send("Network.enable")
    tab.goto(matrix_page.as_uri())
    # one table per platform, models as rows, precisions as columns
    sections = tab.js("[...document.querySelectorAll('section.platform')].map(s => s.dataset.platform)")
    assert sections == ["x86-cpu", "orin"]  # platforms with passing evidence first
    summary = tab.js("document.querySelector('body > p').id + ': ' + document.querySelector('body > p').textContent")
    assert summary == ("summary: 5 rows: 2 L0 covered, 1 implemented (export verified only), 1 failing, 1 not "
                       "applicable; passing evidence on x86-cpu; export evidence only on orin."), summary
    headers = tab.js("[...document.querySelectorAll(\"section[data-platform='x86-cpu'] thead th\")]"
                     ".map(th => th.textContent)")
    assert headers == ["Model", "Params", "FP32", "FP16"]
    toolchain = tab.js("document.querySelector(\"section[data-platform='x86-cpu'] .toolchains\").textContent")
    assert toolchain == "Toolchain: edgellm-ort 0.1.0+onnxruntime-1.22.0"
    orin = tab.js("document.querySelector(\"section[data-platform='orin'] .toolchains\").textContent")
    assert orin == "Toolchain: tensorrt-edgellm 0.11.0"
    params = tab.js("document.querySelector(\"tr[data-model='stories260K'] td.params\").textContent")
    assert params.endswith("K")
    cells = tab.js("Object.fromEntries([...document.querySelectorAll('td.cell[data-key]')]"
                   ".map(td => [td.dataset.key, [td.dataset.status, td.querySelector('a').getAttribute('href')]]))")
    assert cells == {
        "stories260k-fp32-x86-cpu": ["l0_covered", "runs/run-2.html#stories260k-fp32-x86-cpu"],
        "stories260k-fp16-x86-cpu": ["l0_covered", "runs/run-2.html#stories260k-fp16-x86-cpu"],
        "tiny-qwen3-fp32-x86-cpu": ["failing", "runs/run-2.html#tiny-qwen3-fp32-x86-cpu"],
        "stories260k-fp8-orin": ["not_applicable", "runs/run-2.html#stories260k-fp8-orin"],
        "tiny-qwen3-int4-awq-orin": ["implemented", "runs/run-2.html#tiny-qwen3-int4-awq-orin"],
    }
    # never tested where nothing was tested (tiny-qwen3 x fp16 on x86-cpu), said so, never blank
    assert tab.js("[...document.querySelectorAll('td.cell:not([data-key])')].map(td => td.dataset.status + ':' "
                  "+ td.textContent)") == ["never_tested:never tested"] * 3
    # trend images are inline data, one per metric of the platform
    assert tab.js("[...document.images].every(i => i.complete && i.naturalWidth > 0 && "
                  "i.src.startsWith('data:image/png'))")
    assert tab.js("document.querySelectorAll(\"section[data-platform='x86-cpu'] img.trend\").length") == 3
    # hover text and click details
    title = tab.js("document.querySelector(\"td[data-key='tiny-qwen3-fp32-x86-cpu']\").title")
    assert title.startswith("root cause: perplexity ratio 1.9 > 1.2") and "status: failing" in title
    assert title.count("perplexity ratio 1.9 > 1.2") == 1  # each reason once
    tab.js("document.querySelector(\"td[data-key='tiny-qwen3-fp32-x86-cpu'] .m\").click()")
    assert tab.js("!document.getElementById('details').hidden")
    details = tab.js("document.getElementById('details').innerText")
    assert "tiny-qwen3 · fp32 · x86-cpu" in details and "perplexity ratio 1.9" in details
    assert "evidence: run 2" in details
    shot = tab.screenshot("support-matrix-details.png")
    assert shot.stat().st_size > 10_000
    tab.js("document.getElementById('close-details').click()")
    # filters: status, then platform, then precision
    assert len(_visible_cells(tab)) == 5
    tab.js("(() => { for (const i of document.querySelectorAll('#f-status input')) { i.checked = i.value === "
           "'l0_covered'; } document.querySelector('#f-status input').dispatchEvent(new Event('change')); })()")
    assert _visible_cells(tab) == ["stories260k-fp16-x86-cpu", "stories260k-fp32-x86-cpu"]
    assert tab.js("document.querySelector(\"section[data-platform='orin'] .none-shown\").offsetParent !== null")
    tab.screenshot("support-matrix-filter-pass.png")
    tab.js("(() => { for (const i of document.querySelectorAll('#f-status input')) i.checked = true; "
           "const p = document.getElementById('f-platform'); p.value = 'orin'; "
           "p.dispatchEvent(new Event('change')); })()")
    assert _visible_cells(tab) == ["stories260k-fp8-orin", "tiny-qwen3-int4-awq-orin"]
    tab.js("(() => { const p = document.getElementById('f-precision'); p.value = 'int4_awq'; "
           "p.dispatchEvent(new Event('change')); })()")
    assert _visible_cells(tab) == ["tiny-qwen3-int4-awq-orin"]
    assert tab.js("document.querySelector(\"section[data-platform='orin'] th[data-precision='fp8']\")"
                  ".offsetParent === null")
    # a supported cell's link opens its evidence page
    tab.js("(() => { for (const s of ['f-platform', 'f-precision']) { const el = document.getElementById(s); "
           "el.value = 'all'; el.dispatchEvent(new Event('change')); } })()")
    tab.js("document.querySelector(\"td[data-key='stories260k-fp32-x86-cpu'] a\").click()")
    tab.wait_for("location.href.endsWith('runs/run-2.html#stories260k-fp32-x86-cpu') && "
                 "document.readyState === 'complete'")
    # the evidence opens as HTML (not raw Markdown) at the cell's row: that row is the :target, in view
    assert tab.js("document.contentType") == "text/html"
    assert tab.js("document.querySelector(':target').id") == "stories260k-fp32-x86-cpu"
    assert tab.js("document.querySelector(':target h2').textContent") == "stories260K · fp32 · x86-cpu"
    assert tab.js("(() => { const r = document.querySelector(':target').getBoundingClientRect(); "
                  "return r.top >= 0 && r.top < window.innerHeight; })()")
    assert tab.js("document.querySelector('#summary .counts').textContent").startswith("Rows: 5 (2 L0 covered")
    assert tab.js("[...document.querySelectorAll('#summary ul.failing li')].map(li => li.textContent)") == [
        "tiny-qwen3 · fp32 · x86-cpu: perplexity ratio 1.9 > 1.2; log devices/local-cpu/logs/run-2/accuracy.log "
        "(ssh <host>, server <url> …/notes.txt)"]
    stages = tab.js("[...document.querySelectorAll(\"section[id='stories260k-fp8-orin'] tr[data-stage]\")]"
                    ".map(tr => tr.dataset.stage + ': ' + tr.children[5].textContent)")
    assert stages == ["export: fp8 needs SM89+; orin is SM87", "build: same as export", "infer: same as export",
                      "accuracy: same as export", "bench: same as export"]  # pipeline order, the reason once
    tab.screenshot("run-page-at-row.png")
    # a failing cell's link lands on its own row too
    tab.goto(matrix_page.as_uri())
    tab.js("document.querySelector(\"td[data-key='tiny-qwen3-fp32-x86-cpu'] a.evidence\").click()")
    tab.wait_for("location.hash === '#tiny-qwen3-fp32-x86-cpu' && document.readyState === 'complete'")
    assert tab.js("document.querySelector(':target').dataset.status") == "failing"


def test_missing_chromium_fails_and_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.fixtures.browser import chromium_binary

    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium on it
    with pytest.raises(pytest.fail.Exception, match=r"Chromium is missing.*install-system-deps\.sh"):
        chromium_binary()


def test_comparison_and_edge_llm_pages_are_linked_from_the_matrix_and_render(tab: Tab, tmp_path: Path) -> None:
    """Issue 23: the matrix links the Edge-LLM-layout pages and the published comparisons; a comparison's HTML page
    renders offline in Chromium with its tables, its metric delta and a link back."""
    from edgefarm.pages.compare import RunSide, build_comparison, publish
    from edgefarm.results.db import make_engine

    data, out = tmp_path / "data", tmp_path / "published"
    url = build_docs_db(tmp_path / "edgefarm.db", data)
    engine = make_engine(url)
    try:
        written = publish(build_comparison(engine, RunSide(1), RunSide(2), data_dir=data), out, db_label="SQLite")
    finally:
        engine.dispose()
    write_docs(url, out, data)
    page = next(p for p in written if p.name == "runs-1-vs-2.html")
    html = page.read_text()
    assert "src='http" not in html and "<link" not in html and "<script src" not in html  # nothing external
    tab.goto(page.as_uri())
    assert tab.js("document.querySelector('h1').textContent").startswith("Compare: run 1")
    headings = tab.js("[...document.querySelectorAll('h2')].map(h => h.textContent)")
    assert any(h.startswith("metric deltas") or "metric" in h.lower() for h in headings), headings
    cells = tab.js("[...document.querySelectorAll('td')].map(td => td.textContent).join(' | ')")
    assert "decode_tokens_per_s" in cells and "410" in cells and "436.5" in cells
    tab.screenshot("compare-runs.png")
    # from the matrix: the see-also paragraph links pages that exist, and the comparison by its title
    tab.goto((out / "support-matrix.html").as_uri())
    links = tab.js("[...document.querySelectorAll('#see-also a')].map(a => a.getAttribute('href'))")
    assert links[:3] == ["edge-llm/supported-models.md", "edge-llm/support-matrix.md", "compare/index.html"]
    assert "compare/runs-1-vs-2.html" in links
    assert all((out / link).is_file() for link in links), links
    tab.js("document.querySelector(\"#see-also a[href='compare/runs-1-vs-2.html']\").click()")
    tab.wait_for("location.href.endsWith('compare/runs-1-vs-2.html')")
