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
from collections.abc import Mapping, Sequence
from pathlib import Path

from edgefarm.pages.docs_regressions import mark_html
from edgefarm.pages.docs_render import (
    LISTED,
    PASSING,
    MatrixRow,
    TrendImage,
    format_params,
    layout_links,
    legend,
    metrics_text,
    platform_order,
    platform_toolchains,
    precision_order,
    status_counts,
)
from edgefarm.results.support import SupportStatus
from edgefarm.stages.job import MEMORY_ESTIMATE_METRIC

# one colour per status of the one vocabulary (results.support.SupportStatus), in its order
STATUS_COLOURS = {
    SupportStatus.L0_COVERED: "#2e9e44",
    SupportStatus.IMPLEMENTED: "#3f7fd0",
    SupportStatus.CHECKPOINT_DIRECT: "#1f6f5c",
    SupportStatus.FAILING: "#d1342f",
    SupportStatus.WAIVED: "#8a6fd1",
    SupportStatus.NOT_APPLICABLE: "#e8eaed",
    SupportStatus.SKIPPED: "#9aa0a6",
    SupportStatus.NEVER_TESTED: "#ffffff",
}
_DARK_TEXT = (SupportStatus.NOT_APPLICABLE, SupportStatus.SKIPPED, SupportStatus.NEVER_TESTED)

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
.hidden{display:none}td.cell.nofit{opacity:.3}
"""

_JS = """
const CELLS = JSON.parse(document.getElementById('cell-data').textContent);
function checkedStatuses() {
  return new Set([...document.querySelectorAll('#f-status input:checked')].map(i => i.value));
}
function fitsLimit() {
  const select = document.getElementById('f-fits');
  const opt = select ? select.selectedOptions[0] : null;
  return opt && opt.dataset.usableMb ? Number(opt.dataset.usableMb) : Infinity;
}
function applyFilters() {
  const platform = document.getElementById('f-platform').value;
  const precision = document.getElementById('f-precision').value;
  const statuses = checkedStatuses();
  const limit = fitsLimit();
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
        // a cell without an estimate is never dimmed: unknown is not "does not fit"
        const nofit = td.dataset.estimateMb !== undefined && Number(td.dataset.estimateMb) > limit;
        td.classList.toggle('filtered', !match);
        td.classList.toggle('nofit', match && nofit);
        if (match && !nofit && !td.classList.contains('hidden')) any = true;
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
  const bug = panel.querySelector('a.bug');
  bug.hidden = !c.bug; bug.href = c.bug || '#'; bug.textContent = c.bug ? 'bug: ' + c.bug : '';
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
    """The status a cell shows: its name in the one vocabulary (``results.support.SupportStatus``)."""
    return r.state.value


def cell_fields(r: MatrixRow) -> dict[str, str]:
    """What a cell's hover text and details panel say, the root cause first (the first failed, skipped, waived or
    not-applicable stage's reason, in pipeline order), each reason once."""
    fields: dict[str, str] = {}
    reasons = list(r.reasons) or ([r.reason] if r.reason else [])
    if r.root_cause:
        fields["root cause"] = r.root_cause
        reasons = [x for x in reasons if x != r.root_cause]
    fields["status"] = r.state.label
    if r.support is not None and r.support.since_run is not None and r.support.since_run != r.run_id:
        fields["failing since"] = f"run {r.support.since_run}"
    if r.support is not None and r.support.until is not None:
        fields["waived until"] = r.support.until.isoformat()
    if r.bug:
        fields["bug"] = r.bug
    fields |= {
        "toolchain": r.made_by or "not recorded",
        "run": f"{r.run_id} (started {r.run_started})",
        "device": r.device or "-",
        "stages": ", ".join(f"{s}: {st}" for s, st in r.stages.items()) or "-",
    }
    if reasons:
        fields["other reasons" if r.root_cause else "reasons"] = "\n".join(reasons)
    if r.metrics:
        fields["metrics"] = metrics_text(r.metrics, "\n") or ", ".join(f"{k} {v:.4g}" for k, v in r.metrics.items())
    return fields


def _chip(status: SupportStatus) -> str:
    return f"background:{STATUS_COLOURS[status]};color:{'#333' if status in _DARK_TEXT else '#fff'}"


def _cell(r: MatrixRow | None, platform: str, precision: str) -> str:
    e = html.escape
    if r is None:
        never = SupportStatus.NEVER_TESTED
        return (f"<td class='cell {e(never.value)}' data-platform='{e(platform)}' data-precision='{e(precision)}' "
                f"data-status='{e(never.value)}' style='{_chip(never)}' title='{e(never.label)}'>"
                f"{e(never.label)}</td>")
    state = r.state
    fields = cell_fields(r)
    hover = "\n".join(f"{k}: {v}" for k, v in fields.items())
    mark = "" if state.display == state.label else state.mark + " "  # a word mark: the label alone
    bug = f" <a class='bug' href='{e(r.bug)}'>bug</a>" if r.bug else ""
    detail = metrics_text(r.metrics, " · ") if state in PASSING else (r.root_cause or r.made_by or "")
    estimate = r.metrics.get(MEMORY_ESTIMATE_METRIC)
    needs = "" if estimate is None else f"data-estimate-mb='{estimate:.0f}' "
    return (f"<td class='cell {e(state.value)}' data-key='{e(r.anchor)}' data-platform='{e(platform)}' "
            f"data-precision='{e(precision)}' data-status='{e(state.value)}' {needs}"
            f"style='{_chip(state)}' title='{e(hover)}'>"
            f"<a class='evidence' href='{e(r.evidence_html)}'>{e(mark)}<b>{e(state.label)}</b> · run {r.run_id}</a>"
            f"{bug}<div class='m'>{e(detail)}</div>{mark_html(r.regressions)}</td>")


def _section(platform: str, rows: list[MatrixRow], trends: Sequence[TrendImage], docs_dir: Path | None) -> list[str]:
    e = html.escape
    precisions = precision_order(r.precision for r in rows)
    cells = {(r.label, r.precision): r for r in rows}  # one table row per model (per compared version)
    params = {r.label: r.params for r in rows}
    toolchains = platform_toolchains(r for r in rows if r.state in LISTED) or platform_toolchains(rows)
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
    from edgefarm.pages.compare import published_comparisons

    e = html.escape
    found = published_comparisons(docs_dir) if docs_dir is not None else []
    newest = "".join(f" <a href='{e(c.html)}'>{e(c.title)}</a>;" for c in found[:5])
    layouts = "".join(f"The same evidence in {e(product)}'s own layout: <a href='{e(models)}'>supported models</a>, "
                      f"<a href='{e(matrix)}'>support matrix</a>. " for product, models, matrix in layout_links())
    return (f"<p id='see-also'>{layouts}Toolchain versions, runs and commits compared: <a href='compare/index.html'>"
            f"{len(found)} comparison(s)</a>{':' + newest.rstrip(';') if newest else ''}.</p>")


def summary_line(rows: Sequence[MatrixRow], platforms: Sequence[str]) -> str:
    """One line first on the page: rows per status and the platforms with passing or export evidence."""
    e = html.escape
    counts = ", ".join(f"<span data-status='{e(s.value)}'>{n} {e(s.label)}</span>"
                       for s, n in status_counts(rows).items())
    passing = [p for p in platforms if any(r.platform == p and r.state in PASSING for r in rows)]
    export = [p for p in platforms if p not in passing and any(r.platform == p and r.state in LISTED for r in rows)]
    rest = [p for p in platforms if p not in passing and p not in export]
    parts = [f"{len(rows)} rows" + (f": {counts}" if counts else "")]
    parts.append("passing evidence on " + (e(", ".join(passing)) if passing else "no platform"))
    if export:
        parts.append("export evidence only on " + e(", ".join(export)))
    if rest:
        parts.append("no passing or export evidence on " + e(", ".join(rest)))
    return f"<p id='summary'>{'; '.join(parts)}.</p>"


def fits_filter(usable_gb: Mapping[str, float]) -> str:
    """The "fits on" select: one option per device type with its usable memory (GiB, as ``edgellm.memory.GB``); a
    chosen type dims the cells whose estimate (``memory_estimate_mb``) exceeds it. Empty without device types."""
    e = html.escape
    if not usable_gb:
        return ""
    options = "".join(f"<option value='{e(name)}' data-usable-mb='{gb * 1024:.0f}'>{e(name)} ({gb:g} GB usable)"
                      "</option>" for name, gb in sorted(usable_gb.items(), key=lambda kv: (kv[1], kv[0])))
    return ("<label title='dims the cells whose estimated memory exceeds the usable memory of the device type'>"
            f"Fits on <select id='f-fits'><option value='all'>any device</option>{options}</select></label>")


def render_html(rows: Sequence[MatrixRow], *, generated_at: str, db_label: str,
                trends: Sequence[TrendImage] = (), docs_dir: Path | None = None, title: str = "Support matrix",
                intro: str = "", see_also: bool = True, usable_gb: Mapping[str, float] | None = None) -> str:
    """The page; trend PNGs are read from ``docs_dir`` and inlined (no external assets). ``title``, ``intro`` (HTML)
    and ``see_also`` (the links to the layouts' pages and comparisons) let a test list's page use it;
    ``usable_gb`` (device type -> usable memory, GiB) adds the "fits on" filter."""
    e = html.escape
    by_platform: dict[str, list[MatrixRow]] = defaultdict(list)
    for r in rows:
        by_platform[r.platform].append(r)
    precisions = precision_order(r.precision for r in rows)
    platforms = platform_order(rows)
    gaps = any(len({r.label for r in by_platform[p]}) * len(precision_order(r.precision for r in by_platform[p]))
               > len(by_platform[p]) for p in platforms)  # some table has a cell no row fills: never tested
    statuses = [s for s in STATUS_COLOURS if any(r.state is s for r in rows)
                or (s is SupportStatus.NEVER_TESTED and gaps)]
    data = {r.anchor: {"title": f"{r.label} · {r.precision} · {r.platform}", "link": r.evidence_html,
                       "run": r.run_id, "bug": r.bug, "fields": cell_fields(r)} for r in rows}
    out = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>edgellm-farm {e(title.lower())}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        summary_line(rows, platforms),
        intro,
        f"<p>Generated {e(generated_at)} from the results database ({e(db_label)}). One table per platform; each "
        "cell is the latest evidence for that model and precision there. Hover a cell for its details, click it "
        "to pin them, click its link for the run's evidence.</p>",
        _see_also(docs_dir) if see_also else "",
        "<ul class='legend-text'>" + "".join(f"<li>{e(item)}</li>" for item in legend()) + "</ul>",
        "<p class='legend'>" + "".join(
            f"<span data-status='{e(s.value)}' style='{_chip(s)}'>{e(s.label)}</span>" for s in STATUS_COLOURS)
        + "</p>",
        "<div id='filters'>",
        "<label>Platform <select id='f-platform'><option value='all'>all</option>"
        + "".join(f"<option value='{e(p)}'>{e(p)}</option>" for p in platforms) + "</select></label>",
        "<label>Precision <select id='f-precision'><option value='all'>all</option>"
        + "".join(f"<option value='{e(p)}'>{e(p)}</option>" for p in precisions) + "</select></label>",
        "<span id='f-status'>Status "
        + "".join(f"<label><input type='checkbox' value='{e(s.value)}' checked> {e(s.label)}</label> "
                  for s in statuses)
        + "</span>",
        fits_filter(usable_gb or {}),
        "</div>",
    ]
    if not rows:
        out.append("<p>No evidence recorded yet.</p>")
    for platform in platforms:
        out += _section(platform, by_platform[platform], trends, docs_dir)
    out += [
        "<aside id='details' hidden><button id='close-details' style='float:right'>×</button><h3></h3><dl></dl>"
        "<a class='evidence' href='#'></a> <a class='bug' href='#' hidden></a></aside>",
        # <, > and & as JSON escapes: no value can end the script element or open a comment in it
        "<script type='application/json' id='cell-data'>" + json.dumps(data).replace("<", "\\u003c")
        .replace(">", "\\u003e").replace("&", "\\u0026") + "</script>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(out)
