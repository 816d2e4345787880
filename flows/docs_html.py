"""The HTML support matrix: the layout of supported-models.md (one table per platform, one row per model, one
column per precision) showing every cell's status in colour, its details on hover (title) and on click (a panel),
and filters by platform, precision and status. One self-contained file: styles, script and trend images are inline,
so it opens from a file, offline.
"""

from __future__ import annotations

import base64
import html
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from flows.docs_regressions import mark_html
from flows.docs_render import (
    DIRECT_ONLY,
    EXPORT_ONLY_MARK,
    SUPPORTED_MARK,
    CellKind,
    MatrixRow,
    TrendImage,
    cell_kind,
    format_params,
    layout_links,
    legend,
    metrics_text,
    platform_toolchains,
    precision_order,
)

STATUS_COLOURS = {
    "pass": "#2e9e44",
    "export_verified": "#3f7fd0",
    "fail": "#d1342f",
    "error": "#e07b00",
    "incomplete": "#c9a227",
    "waived": "#8a6fd1",
    "skipped": "#9aa0a6",
    "not_applicable": "#e8eaed",
}
_DARK_TEXT = ("not_applicable", "skipped", "incomplete")

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#202124}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:6px 8px;vertical-align:top;font-size:13px}
th.model{text-align:left}td.params{text-align:right;color:#555}
td.cell{min-width:120px;cursor:pointer}td.cell a{color:inherit}
td.cell.filtered{background:#fff!important;color:#fff}td.cell.filtered *{visibility:hidden}
td.cell.selected{outline:3px solid #202124}
.m{font-size:11px;opacity:.9}.legend span{display:inline-block;padding:2px 8px;margin:0 4px 4px 0}
#filters{background:#f1f3f4;padding:8px 12px;margin:1em 0;display:flex;gap:18px;flex-wrap:wrap;align-items:center}
#filters label{font-size:13px}
#details{position:fixed;right:1em;top:1em;width:360px;max-height:90vh;overflow:auto;background:#fff;
border:1px solid #999;box-shadow:0 2px 8px rgba(0,0,0,.25);padding:10px 14px;font-size:13px}
#details[hidden]{display:none}#details dt{font-weight:600}#details dd{margin:0 0 6px 0;white-space:pre-wrap}
.hidden{display:none}
"""

_JS = """
const CELLS = JSON.parse(document.getElementById('cell-data').textContent);
function checkedStatuses() {
  return new Set([...document.querySelectorAll('#f-status input:checked')].map(i => i.value));
}
function applyFilters() {
  const platform = document.getElementById('f-platform').value;
  const precision = document.getElementById('f-precision').value;
  const statuses = checkedStatuses();
  for (const sec of document.querySelectorAll('section.platform')) {
    sec.classList.toggle('hidden', platform !== 'all' && sec.dataset.platform !== platform);
    for (const el of sec.querySelectorAll('[data-precision]')) {
      el.classList.toggle('hidden', precision !== 'all' && el.dataset.precision !== precision);
    }
    let shownRows = 0;
    for (const tr of sec.querySelectorAll('tbody tr')) {
      let any = false;
      for (const td of tr.querySelectorAll('td.cell')) {
        const match = td.dataset.status !== '' && statuses.has(td.dataset.status);
        td.classList.toggle('filtered', !match);
        if (match && !td.classList.contains('hidden')) any = true;
      }
      tr.classList.toggle('hidden', !any);
      if (any) shownRows++;
    }
    sec.querySelector('.none-shown').classList.toggle('hidden', shownRows > 0);
  }
}
function showDetails(td) {
  const c = CELLS[td.dataset.key];
  const panel = document.getElementById('details');
  document.querySelectorAll('td.cell.selected').forEach(x => x.classList.remove('selected'));
  if (!c) { panel.hidden = true; return; }
  td.classList.add('selected');
  const dl = panel.querySelector('dl');
  dl.replaceChildren();
  for (const [k, v] of Object.entries(c.fields)) {
    const dt = document.createElement('dt'); dt.textContent = k;
    const dd = document.createElement('dd'); dd.textContent = v;
    dl.append(dt, dd);
  }
  const a = panel.querySelector('a.evidence');
  a.href = c.link; a.textContent = 'evidence: run ' + c.run;
  panel.querySelector('h3').textContent = c.title;
  panel.hidden = false;
}
document.querySelectorAll('#filters select, #f-status input').forEach(el =>
  el.addEventListener('change', applyFilters));
document.querySelectorAll('td.cell').forEach(td => td.addEventListener('click', ev => {
  if (ev.target.closest('a')) return;
  showDetails(td);
}));
document.getElementById('close-details').addEventListener('click', () => {
  document.getElementById('details').hidden = true;
});
applyFilters();
"""


def html_status(r: MatrixRow) -> str:
    """The status a cell shows: export-verified rows get their own (they are never ``pass``)."""
    return CellKind.EXPORT_ONLY.value if cell_kind(r) is CellKind.EXPORT_ONLY else r.status


def cell_fields(r: MatrixRow) -> dict[str, str]:
    """What a cell's hover text and details panel say."""
    fields = {
        "status": html_status(r),
        "toolchain": r.made_by or "not recorded",
        "run": f"{r.run_id} (started {r.run_started})",
        "device": r.device or "-",
        "stages": ", ".join(f"{s}: {st}" for s, st in r.stages.items()) or "-",
    }
    if r.reason:
        fields["reason"] = r.reason
    if r.metrics:
        fields["metrics"] = metrics_text(r.metrics, "\n") or ", ".join(f"{k} {v:.4g}" for k, v in r.metrics.items())
    return fields


def _cell(r: MatrixRow | None, platform: str, precision: str) -> str:
    e = html.escape
    if r is None:
        return f"<td class='cell' data-platform='{e(platform)}' data-precision='{e(precision)}' data-status=''></td>"
    status = html_status(r)
    colour = STATUS_COLOURS.get(status, "#666")
    fg = "#333" if status in _DARK_TEXT else "#fff"
    fields = cell_fields(r)
    hover = "\n".join(f"{k}: {v}" for k, v in fields.items())
    mark = {CellKind.SUPPORTED: SUPPORTED_MARK + " ", CellKind.EXPORT_ONLY: EXPORT_ONLY_MARK + " "}.get(r.kind, "")
    direct = f" · {DIRECT_ONLY}" if r.direct_only else ""
    return (f"<td class='cell {e(status)}' data-key='{e(r.anchor)}' data-platform='{e(platform)}' "
            f"data-precision='{e(precision)}' data-status='{e(status)}' data-kind='{e(r.kind.value)}' "
            f"style='background:{colour};color:{fg}' title='{e(hover)}'>"
            f"<a href='{e(r.evidence_link)}'>{mark}<b>{e(status)}</b> · run {r.run_id}{e(direct)}</a>"
            f"<div class='m'>{e(metrics_text(r.metrics, ' · ') if r.kind is CellKind.SUPPORTED else r.made_by)}"
            f"</div>{mark_html(r.regressions)}</td>")


def _section(platform: str, rows: list[MatrixRow], trends: Sequence[TrendImage], docs_dir: Path | None) -> list[str]:
    e = html.escape
    precisions = precision_order(r.precision for r in rows)
    cells = {(r.label, r.precision): r for r in rows}  # one table row per model (per compared version)
    params = {r.label: r.params for r in rows}
    toolchains = platform_toolchains(r for r in rows if r.kind is not CellKind.NONE) or platform_toolchains(rows)
    out = [f"<section class='platform' data-platform='{e(platform)}'>", f"<h2>{e(platform)}</h2>",
           f"<p class='toolchains'>Toolchain{'s' if len(toolchains) > 1 else ''}: "
           f"{e(', '.join(toolchains) or 'not recorded')}</p>",
           "<table><thead><tr><th class='model'>Model</th><th>Params</th>"
           + "".join(f"<th data-precision='{e(p)}'>{e(p.upper())}</th>" for p in precisions) + "</tr></thead><tbody>"]
    for model in sorted({r.label for r in rows}, key=str.lower):
        out.append(f"<tr data-model='{e(model)}'><th class='model'>{e(model)}</th>"
                   f"<td class='params'>{e(format_params(params.get(model)))}</td>"
                   + "".join(_cell(cells.get((model, p)), platform, p) for p in precisions) + "</tr>")
    out += ["</tbody></table>", "<p class='none-shown hidden'>No cell matches the filters.</p>"]
    mine = [t for t in trends if t.platform == platform]
    if mine:
        out.append("<h3>Performance trends (nightly runs)</h3>")
        for t in mine:
            out.append(f"<p><img class='trend' data-metric='{e(t.metric)}' alt='{e(t.metric)} on {e(platform)}' "
                       f"src='{_inline_png(docs_dir, t.file)}' style='max-width:900px'></p>")
    out.append("</section>")
    return out


def _inline_png(docs_dir: Path | None, name: str) -> str:
    if docs_dir is None:
        return html.escape(name)
    return "data:image/png;base64," + base64.b64encode((docs_dir / name).read_bytes()).decode("ascii")


def _see_also(docs_dir: Path | None) -> str:
    """Links to each toolchain's own page layout and to the published comparisons (the newest few by name)."""
    from flows.compare import published_comparisons

    e = html.escape
    found = published_comparisons(docs_dir) if docs_dir is not None else []
    newest = "".join(f" <a href='{e(c.html)}'>{e(c.title)}</a>;" for c in found[:5])
    layouts = "".join(f"The same evidence in {e(product)}'s own layout: <a href='{e(models)}'>supported models</a>, "
                      f"<a href='{e(matrix)}'>support matrix</a>. " for product, models, matrix in layout_links())
    return (f"<p id='see-also'>{layouts}Toolchain versions, runs and commits compared: <a href='compare/index.html'>"
            f"{len(found)} comparison(s)</a>{':' + newest.rstrip(';') if newest else ''}.</p>")


def render_html(rows: Sequence[MatrixRow], *, generated_at: str, db_label: str,
                trends: Sequence[TrendImage] = (), docs_dir: Path | None = None) -> str:
    """The page; trend PNGs are read from ``docs_dir`` and inlined (no external assets)."""
    e = html.escape
    by_platform: dict[str, list[MatrixRow]] = defaultdict(list)
    for r in rows:
        by_platform[r.platform].append(r)
    statuses = [s for s in STATUS_COLOURS if any(html_status(r) == s for r in rows)]
    precisions = precision_order(r.precision for r in rows)
    data = {r.anchor: {"title": f"{r.label} · {r.precision} · {r.platform}", "link": r.evidence_link,
                       "run": r.run_id, "fields": cell_fields(r)} for r in rows}
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<title>edgellm-farm support matrix</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Support matrix</h1>",
        f"<p>Generated {e(generated_at)} from the results database ({e(db_label)}). One table per platform; each "
        "cell is the latest evidence for that model and precision there. Hover a cell for its details, click it "
        "to pin them, click its link for the run's evidence.</p>",
        _see_also(docs_dir),
        "<ul class='legend-text'>" + "".join(f"<li>{e(item)}</li>" for item in legend(rows)) + "</ul>",
        "<p class='legend'>" + "".join(
            f"<span style='background:{c};color:{'#333' if s in _DARK_TEXT else '#fff'}'>{e(s)}</span>"
            for s, c in STATUS_COLOURS.items()) + "</p>",
        "<div id='filters'>",
        "<label>Platform <select id='f-platform'><option value='all'>all</option>"
        + "".join(f"<option value='{e(p)}'>{e(p)}</option>" for p in sorted(by_platform)) + "</select></label>",
        "<label>Precision <select id='f-precision'><option value='all'>all</option>"
        + "".join(f"<option value='{e(p)}'>{e(p)}</option>" for p in precisions) + "</select></label>",
        "<span id='f-status'>Status "
        + "".join(f"<label><input type='checkbox' value='{e(s)}' checked> {e(s)}</label> " for s in statuses)
        + "</span>",
        "</div>",
    ]
    if not rows:
        out.append("<p>No evidence recorded yet.</p>")
    for platform in sorted(by_platform):
        out += _section(platform, by_platform[platform], trends, docs_dir)
    out += [
        "<aside id='details' hidden><button id='close-details' style='float:right'>×</button><h3></h3><dl></dl>"
        "<a class='evidence' href='#'></a></aside>",
        # <, > and & as JSON escapes: no value can end the script element or open a comment in it
        "<script type='application/json' id='cell-data'>" + json.dumps(data).replace("<", "\\u003c")
        .replace(">", "\\u003e").replace("&", "\\u0026") + "</script>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(out)
