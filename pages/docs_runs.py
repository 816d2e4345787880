"""A run's evidence pages: ``runs/run-N.md`` and, beside it, ``runs/run-N.html`` (what every HTML matrix cell links,
at its row's anchor), with the same content: a summary first (rows per status, each failing row with its root
cause), then one section per row with its stages in pipeline order (``stages.Stage``, stable between runs), numbers
in human units, each reason once (a reason several stages share is written on the first and referred to after) and
log artifacts linked to a copy of their text beside the page (``runs/logs/<sha12>.txt``), so the evidence opens from
a file, offline.

Pure functions of the run's info and results (read by ``pages.docs.run_evidence``) and each row's support status;
every name, reason and value is escaped (``pages.escape.markdown_text``, ``html.escape``).
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from edgefarm.pages.docs_render import anchor, bench_load_text, row_label, row_name, shown_toolchain
from edgefarm.pages.escape import markdown_text, safe_link
from edgefarm.results.support import Support, SupportStatus, count_statuses, stage_order

LOG_DIR = "logs"  # beside the run pages: runs/logs/<sha12>.txt
COLUMNS = ("Stage", "Status", "Toolchain", "Device", "Duration", "Reason", "Metrics", "Artifacts")
_BYTES = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))


def human_bytes(value: float) -> str:
    for suffix, scale in _BYTES:
        if abs(value) >= scale:
            return f"{value / scale:.1f} {suffix}"
    return f"{value:.0f} B"


def human_seconds(value: float) -> str:
    if abs(value) >= 60:
        minutes, seconds = divmod(value, 60)
        return f"{int(minutes)} min {seconds:.0f} s"
    return f"{value:.2f} s" if abs(value) < 10 else f"{value:.1f} s"


def human_metric(name: str, value: float, unit: str | None) -> str:
    """``name value unit`` in a reader's units: bytes as kB / MB / GB, seconds as s or min s, rates with their unit,
    other values with 6 significant digits (``onnx_bytes=1.18784e+06 B`` -> ``onnx_bytes 1.2 MB``)."""
    unit = (unit or "").strip()
    if unit == "B" or (not unit and name.endswith("_bytes")):
        shown = human_bytes(value)
    elif unit == "s" or (not unit and name.endswith("_s") and not name.endswith("per_s")):
        shown = human_seconds(value)
    elif unit in ("tok/s", "tokens/s"):
        shown = f"{value:,.1f} tok/s" if value < 1000 else f"{value:,.0f} tok/s"
    elif unit == "ms":
        shown = f"{value:.1f} ms"
    else:
        shown = f"{value:.6g}" + (f" {unit}" if unit else "")
    return f"{name} {shown}"


@dataclass(frozen=True)
class Section:
    """One row of the run: its name (which orders the page), anchor, label and results in pipeline order."""

    name: str
    anchor: str
    label: str
    precision: str
    platform: str
    results: tuple[Mapping[str, object], ...]

    @property
    def title(self) -> str:
        return f"{self.label} · {self.precision} · {self.platform}"


def _chosen(res: Mapping[str, object]) -> str | None:
    chosen = res.get("chosen_versions")
    return chosen if isinstance(chosen, str) else None


def _shown(res: Mapping[str, object]) -> str | None:
    job_toolchain = res.get("job_toolchain")
    return shown_toolchain(str(res["platform"]), None if job_toolchain is None else str(job_toolchain))


def sections(results: Sequence[Mapping[str, object]]) -> list[Section]:
    """The run's rows (one per compared version), sorted by name; each row's results in pipeline order."""
    grouped: dict[str, list[Mapping[str, object]]] = defaultdict(list)
    for res in results:
        grouped[row_name(str(res["model"]), str(res["precision"]), str(res["platform"]), _chosen(res), _shown(res),
                         str(res.get("variant") or ""))].append(res)
    out = []
    for name in sorted(grouped):
        rows = sorted(grouped[name], key=lambda r: stage_order(r["stage"]))  # stable: the results' own order next
        first = rows[0]
        out.append(Section(name, anchor(name), row_label(str(first["model"]), _chosen(first), _shown(first),
                                                        str(first.get("variant") or "")),
                           str(first["precision"]), str(first["platform"]), tuple(rows)))
    return out


def reasons_once(rows: Sequence[Mapping[str, object]]) -> list[str]:
    """Each result's reason (with its bench conditions), written on the first stage that has it; a later stage
    with the same reason refers to that stage."""
    first: dict[str, str] = {}
    out = []
    for res in rows:
        text = "; ".join(str(x) for x in (res.get("reason"), bench_load_text(res.get("metrics", []))) if x)
        if text and text in first:
            out.append(f"same as {first[text]}")
        else:
            if text:
                first[text] = str(res["stage"])
            out.append(text)
    return out


def _duration(res: Mapping[str, object]) -> str:
    dur = res.get("duration_s")
    return human_seconds(float(dur)) if isinstance(dur, (int, float)) else "-"


def _made_by(res: Mapping[str, object]) -> str:
    return " ".join(str(x) for x in (res.get("toolchain"), res.get("toolchain_version")) if x) or "-"


def _metrics(res: Mapping[str, object]) -> list[str]:
    got = res.get("metrics", [])
    return [human_metric(str(n), float(v), str(u) if u else None) for n, v, u in got] if isinstance(got, list) else []


def _artifacts(res: Mapping[str, object]) -> list[tuple[str, str]]:
    got = res.get("artifacts", [])
    return [(str(k), str(s)) for k, s in got] if isinstance(got, list) else []


def log_name(sha256: str) -> str:
    """A log's copy beside the run pages, relative to them."""
    return f"{LOG_DIR}/{sha256[:12]}.txt"


def summary_counts(secs: Sequence[Section], states: Mapping[str, Support]) -> dict[SupportStatus, int]:
    found = count_statuses(states[sec.anchor].status for sec in secs if sec.anchor in states)
    return {s: n for s, n in found.items() if n}


def bisection_line(run: Mapping[str, object], sec: Section) -> str | None:
    """``first bad: <sha12> <subject>`` of a row this run is the bad end of (``run["bisections"]``: (model,
    precision, platform) -> the line; unescaped)."""
    found = run.get("bisections") or {}
    key = (str(sec.results[0]["model"]), sec.precision, sec.platform)
    return found.get(key) if isinstance(found, Mapping) else None


def _info_lines(run: Mapping[str, object]) -> list[tuple[str, object]]:
    return [(key, run.get(key)) for key in ("status", "trigger", "code_version", "started_at", "finished_at")]


# --- Markdown ------------------------------------------------------------------------------------------------------
def render_markdown(run: Mapping[str, object], results: Sequence[Mapping[str, object]],
                    states: Mapping[str, Support] | None = None, logs: Mapping[str, str] | None = None) -> str:
    """The Markdown page (``states``: each row's support status by anchor; ``logs``: log sha256 -> its copy)."""
    states, logs = states or {}, logs or {}
    secs = sections(results)
    lines = [f"# Run {markdown_text(run['id'])} ({markdown_text(run['kind'])})", ""]
    lines += [f"- {key}: {markdown_text(value)}" for key, value in _info_lines(run)]
    report, link = run.get("report"), run.get("report_link")
    if report and link:
        lines.append(f"- report: [{markdown_text(report)}/report.md]({quote(str(link))})")
    prefect = safe_link(run.get("prefect_url"))
    if prefect:
        lines.append(f"- Prefect flow run: [{markdown_text(run.get('flow_run_id'))}]({prefect})")
    page = f"run-{run['id']}.html"
    lines += ["", f"The same page as HTML: [{markdown_text(page)}]({quote(page)}).", ""]
    counts = summary_counts(secs, states)
    lines += ["## Summary", "", f"Rows: {len(secs)}" + (" (" + ", ".join(f"{n} {s.label}" for s, n in counts.items())
                                                     + ")" if counts else "") + "."]
    failing = [(sec, states[sec.anchor]) for sec in secs if sec.anchor in states
               and states[sec.anchor].status is SupportStatus.FAILING]
    if failing:
        lines += ["", "Failing rows, with the first failed stage's reason:", ""]
        lines += [f"- [{markdown_text(sec.title)}](#{sec.anchor}): {markdown_text(st.reason or 'no reason recorded')}"
                  for sec, st in failing]
    lines.append("")
    rungs = run.get("rungs") or []
    if isinstance(rungs, list) and rungs:
        lines += ["## Bring-up rungs", "", "| # | Rung | Status | Duration | Reason |", "|---|---|---|---|---|"]
        for g in rungs:
            lines.append("| " + " | ".join(markdown_text(c) for c in (
                g["position"], g["name"], g["status"], _duration(g), g.get("reason") or "")) + " |")
        lines.append("")
    for sec in secs:
        state = states.get(sec.anchor)
        lines += [f"<a id='{sec.anchor}'></a>",
                  f"## {' · '.join(markdown_text(x) for x in (sec.label, sec.precision, sec.platform))}", ""]
        if state is not None:
            lines += [f"Status: {markdown_text(state.status.display)}"
                      + (f"; root cause: {markdown_text(state.reason)}" if state.reason else "") + ".", ""]
        bisected = bisection_line(run, sec)
        if bisected:
            lines += [f"Bisected: {markdown_text(bisected)}.", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        for res, reason in zip(sec.results, reasons_once(sec.results), strict=True):
            arts = ", ".join(f"[{markdown_text(k)}:{s[:12]}]({logs[s]})" if s in logs
                             else f"{markdown_text(k)}:{s[:12]}" for k, s in _artifacts(res))
            cells = [markdown_text(c) for c in (res["stage"], res["status"], _made_by(res), res.get("device") or "-",
                                                _duration(res), reason, ", ".join(_metrics(res)))]
            lines.append("| " + " | ".join([*cells, arts]) + " |")
        lines.append("")
    return "\n".join(lines)


# --- HTML ----------------------------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#202124}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;font-size:13px;text-align:left}
section.row{padding:2px 8px;margin:0 0 1em 0}section.row:target{outline:3px solid #3f7fd0;background:#f3f7fd}
td.fail,td.error{color:#b3261e;font-weight:600}td.pass{color:#1e7b34}.same{color:#666;font-style:italic}
"""


def render_html(run: Mapping[str, object], results: Sequence[Mapping[str, object]],
                states: Mapping[str, Support] | None = None, logs: Mapping[str, str] | None = None) -> str:
    """The HTML page: the Markdown page's content, each row a ``<section id=anchor>`` (what a matrix cell links)."""
    e = html.escape
    states, logs = states or {}, logs or {}
    secs = sections(results)
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>Run {e(str(run['id']))} ({e(str(run['kind']))})</title>", f"<style>{_CSS}</style></head><body>",
           f"<h1>Run {e(str(run['id']))} ({e(str(run['kind']))})</h1>", "<ul class='info'>"]
    out += [f"<li>{e(key)}: {e(str(value))}</li>" for key, value in _info_lines(run)]
    report, link = run.get("report"), run.get("report_link")
    if report and link:
        out.append(f"<li>report: <a href='{e(quote(str(link)))}'>{e(str(report))}/report.md</a></li>")
    prefect = safe_link(run.get("prefect_url"))
    if prefect:
        out.append(f"<li>Prefect flow run: <a href='{e(prefect)}'>{e(str(run.get('flow_run_id')))}</a></li>")
    out += ["</ul>", f"<p><a href='../support-matrix.html'>support matrix</a> · <a href='run-{e(str(run['id']))}.md'>"
            "this page as Markdown</a></p>"]
    counts = summary_counts(secs, states)
    out.append("<section id='summary'><h2>Summary</h2><p class='counts'>Rows: " + e(str(len(secs)))
               + (" (" + ", ".join(f"<span data-status='{e(s.value)}'>{n} {e(s.label)}</span>"
                                   for s, n in counts.items()) + ")" if counts else "") + ".</p>")
    failing = [(sec, states[sec.anchor]) for sec in secs if sec.anchor in states
               and states[sec.anchor].status is SupportStatus.FAILING]
    if failing:
        out.append("<p>Failing rows, with the first failed stage's reason:</p><ul class='failing'>")
        out += [f"<li><a href='#{e(sec.anchor)}'>{e(sec.title)}</a>: {e(st.reason or 'no reason recorded')}</li>"
                for sec, st in failing]
        out.append("</ul>")
    out.append("</section>")
    rungs = run.get("rungs") or []
    if isinstance(rungs, list) and rungs:
        out.append("<h2>Bring-up rungs</h2><table><tr><th>#</th><th>Rung</th><th>Status</th><th>Duration</th>"
                   "<th>Reason</th></tr>")
        out += ["<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in (
            g["position"], g["name"], g["status"], _duration(g), g.get("reason") or "")) + "</tr>" for g in rungs]
        out.append("</table>")
    for sec in secs:
        state = states.get(sec.anchor)
        out.append(f"<section class='row' id='{e(sec.anchor)}'"
                   + (f" data-status='{e(state.status.value)}'" if state else "") + f"><h2>{e(sec.title)}</h2>")
        if state is not None:
            out.append(f"<p class='status'>Status: <b>{e(state.status.display)}</b>"
                       + (f"; root cause: {e(state.reason)}" if state.reason else "") + "</p>")
        bisected = bisection_line(run, sec)
        if bisected:
            out.append(f"<p class='bisected'>Bisected: {e(bisected)}.</p>")
        out.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + "</tr>")
        for res, reason in zip(sec.results, reasons_once(sec.results), strict=True):
            arts = ", ".join(f"<a class='log' href='{e(logs[s])}'>{e(k)}:{e(s[:12])}</a>" if s in logs
                             else f"{e(k)}:{e(s[:12])}" for k, s in _artifacts(res))
            why = f"<span class='same'>{e(reason)}</span>" if reason.startswith("same as ") else e(reason)
            status = str(res["status"])
            out.append(f"<tr data-stage='{e(str(res['stage']))}'><td>{e(str(res['stage']))}</td>"
                       f"<td class='{e(status)}'>{e(status)}</td><td>{e(_made_by(res))}</td>"
                       f"<td>{e(str(res.get('device') or '-'))}</td><td>{e(_duration(res))}</td><td>{why}</td>"
                       f"<td>{'<br>'.join(e(m) for m in _metrics(res))}</td><td>{arts}</td></tr>")
        out.append("</table></section>")
    out.append("</body></html>")
    return "\n".join(out)
