"""Render the support matrix from evidence rows: supported-models.md, a static HTML page, per-run evidence pages
and perf-trend PNGs. Pure functions of their inputs (rows read from the results database by flows/docs.py).
"""

from __future__ import annotations

import html
import os
import re
import tempfile
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Metrics shown in cells, in order: (metric name, label, format)
CELL_METRICS: tuple[tuple[str, str, str], ...] = (
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("prefill_tokens_per_s", "prefill tok/s", "{:.0f}"),
    ("perplexity_ratio", "ppl ratio", "{:.4f}"),
    ("logits_max_abs_diff", "max abs Δlogit", "{:.1e}"),
    ("greedy_match_fraction", "greedy match", "{:.0%}"),
)
STATUS_COLOURS = {
    "pass": "#2e9e44",
    "fail": "#d1342f",
    "error": "#e07b00",
    "waived": "#8a6fd1",
    "skipped": "#9aa0a6",
    "not_applicable": "#e8eaed",
}


@dataclass(frozen=True)
class MatrixRow:
    """The latest evidence for one (model, precision, platform)."""

    model: str
    precision: str
    platform: str
    status: str  # overall: pass only when every required stage passed in the latest run
    run_id: int
    run_started: str
    device: str | None = None
    reason: str | None = None
    stages: dict[str, str] = field(default_factory=dict)  # stage -> status
    metrics: dict[str, float] = field(default_factory=dict)
    toolchain: str | None = None  # what made the evidence, and its version
    toolchain_version: str | None = None

    @property
    def made_by(self) -> str:
        return " ".join(x for x in (self.toolchain, self.toolchain_version) if x)

    @property
    def anchor(self) -> str:
        return slug(f"{self.model}-{self.precision}-{self.platform}")

    @property
    def evidence_link(self) -> str:
        return f"runs/run-{self.run_id}.md#{self.anchor}"


@dataclass(frozen=True)
class TrendPoint:
    run_id: int
    started: str
    model: str
    precision: str
    platform: str
    metric: str
    value: float


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def supported(rows: Iterable[MatrixRow]) -> list[MatrixRow]:
    """Rows that may appear in supported-models.md: inference and accuracy passed in the latest run."""
    return [r for r in rows if r.status == "pass" and r.stages.get("infer") == "pass"
            and r.stages.get("accuracy") == "pass"]


def _metrics_text(metrics: dict[str, float], sep: str) -> str:
    parts = [f"{label} {fmt.format(metrics[name])}" for name, label, fmt in CELL_METRICS if name in metrics]
    return sep.join(parts)


def render_markdown(rows: Sequence[MatrixRow], *, generated_at: str, db_label: str) -> str:
    ok = sorted(supported(rows), key=lambda r: (r.model.lower(), r.precision, r.platform))
    platforms = sorted({r.platform for r in ok})
    lines = [
        "# Supported models",
        "",
        f"Generated {generated_at} from the results database ({db_label}); do not edit by hand.",
        "A combination appears only when inference and its accuracy baseline passed on that platform in the latest",
        "run that tested it. Each cell links to its evidence.",
        "",
    ]
    if not ok:
        lines += ["No combination has passing evidence yet.", ""]
        return "\n".join(lines)
    by_model: dict[tuple[str, str], dict[str, MatrixRow]] = defaultdict(dict)
    for r in ok:
        by_model[(r.model, r.precision)][r.platform] = r
    lines.append("| Model | Precision | " + " | ".join(platforms) + " |")
    lines.append("|---|---|" + "---|" * len(platforms))
    for (model, precision), cells in sorted(by_model.items(), key=lambda kv: (kv[0][0].lower(), kv[0][1])):
        row = [model, precision]
        for p in platforms:
            r = cells.get(p)
            row.append(f"[✓ run {r.run_id}]({r.evidence_link}) {r.made_by}".rstrip() if r else "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Key metrics", "", "| Model | Precision | Platform | Toolchain | Run | Metrics |",
              "|---|---|---|---|---|---|"]
    for r in ok:
        lines.append(f"| {r.model} | {r.precision} | {r.platform} | {r.made_by or '-'} | "
                     f"[{r.run_id}]({r.evidence_link}) | {_metrics_text(r.metrics, ', ') or '-'} |")
    lines.append("")
    return "\n".join(lines)


def render_html(rows: Sequence[MatrixRow], *, generated_at: str, db_label: str, trend_images: Sequence[str]) -> str:
    platforms = sorted({r.platform for r in rows})
    keys = sorted({(r.model, r.precision) for r in rows}, key=lambda k: (k[0].lower(), k[1]))
    cell = {(r.model, r.precision, r.platform): r for r in rows}
    e = html.escape
    out = [
        "<!doctype html><html><head><meta charset='utf-8'><title>edgellm-farm support matrix</title><style>",
        "body{font-family:system-ui,sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:6px 8px;vertical-align:top;font-size:13px}"
        "td.c{min-width:150px;color:#fff}td.c a{color:inherit}td.not_applicable,td.skipped{color:#333}"
        ".m{font-size:11px;opacity:.9}.legend span{display:inline-block;padding:2px 8px;margin-right:4px}",
        "</style></head><body>",
        "<h1>Support matrix</h1>",
        f"<p>Generated {e(generated_at)} from the results database ({e(db_label)}). Each cell is the latest "
        "evidence for that model, precision and platform; click it for the run.</p>",
        "<p class='legend'>" + "".join(
            f"<span style='background:{c};color:{'#333' if s in ('not_applicable', 'skipped') else '#fff'}'>"
            f"{e(s)}</span>" for s, c in STATUS_COLOURS.items()) + "</p>",
        "<table><tr><th>Model</th><th>Precision</th>" + "".join(f"<th>{e(p)}</th>" for p in platforms) + "</tr>",
    ]
    for model, precision in keys:
        out.append(f"<tr><th>{e(model)}</th><td>{e(precision)}</td>")
        for p in platforms:
            r = cell.get((model, precision, p))
            if r is None:
                out.append("<td></td>")
                continue
            colour = STATUS_COLOURS.get(r.status, "#666")
            detail = _metrics_text(r.metrics, "<br>") if r.status == "pass" else e(r.reason or "")
            out.append(
                f"<td class='c {e(r.status)}' style='background:{colour}' title='{e(r.reason or r.status)}'>"
                f"<a href='{e(r.evidence_link)}'><b>{e(r.status)}</b> · run {r.run_id}</a>"
                f"<div class='m'>{e(r.made_by)}</div><div class='m'>{detail}</div></td>"
            )
        out.append("</tr>")
    out.append("</table>")
    if trend_images:
        out.append("<h2>Performance trends (nightly runs)</h2>")
        out += [f"<p><img src='{e(img)}' alt='{e(img)}' style='max-width:900px'></p>" for img in trend_images]
    out.append("</body></html>")
    return "\n".join(out)


def render_run_page(run: dict[str, object], results: Sequence[dict[str, object]]) -> str:
    """Evidence page for one run: every result with its stage, status, reason, metrics and artifacts."""
    lines = [f"# Run {run['id']} ({run['kind']})", ""]
    for key in ("status", "trigger", "code_version", "started_at", "finished_at"):
        lines.append(f"- {key}: {run.get(key)}")
    lines.append("")
    grouped: dict[str, list[dict[str, object]]] = defaultdict(list)
    for res in results:
        grouped[f"{res['model']}-{res['precision']}-{res['platform']}"].append(res)
    for key in sorted(grouped):
        first = grouped[key][0]
        lines += [f"<a id='{slug(key)}'></a>", f"## {first['model']} · {first['precision']} · {first['platform']}", "",
                  "| Stage | Status | Toolchain | Device | Duration (s) | Reason | Metrics | Artifacts |",
                  "|---|---|---|---|---|---|---|---|"]
        for res in grouped[key]:
            metrics = ", ".join(f"{n}={v:.6g}{(' ' + u) if u else ''}" for n, v, u in res.get("metrics", []))
            arts = ", ".join(f"{k}:{s[:12]}" for k, s in res.get("artifacts", []))
            dur = res.get("duration_s")
            lines.append(
                f"| {res['stage']} | {res['status']} | "
                f"{' '.join(str(x) for x in (res.get('toolchain'), res.get('toolchain_version')) if x) or '-'} | "
                f"{res.get('device') or '-'} | "
                f"{f'{dur:.2f}' if isinstance(dur, (int, float)) else '-'} | "
                f"{str(res.get('reason') or '').replace('|', '/')} | {metrics} | {arts} |"
            )
        lines.append("")
    return "\n".join(lines)


def render_trends(points: Sequence[TrendPoint], out_dir: Path) -> list[str]:
    """One PNG per metric: a line per (model, precision, platform) over nightly runs. Returns file names."""
    if not points:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_metric: dict[str, dict[tuple[str, str, str], list[TrendPoint]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        by_metric[p.metric][(p.model, p.precision, p.platform)].append(p)
    names = []
    from matplotlib.ticker import MaxNLocator

    for metric, series in sorted(by_metric.items()):
        fig, ax = plt.subplots(figsize=(11, 4.5))
        colours = plt.get_cmap("tab20")
        for i, ((model, precision, platform), pts) in enumerate(sorted(series.items())):
            pts = sorted(pts, key=lambda x: x.run_id)
            ax.plot([x.run_id for x in pts], [x.value for x in pts], marker="o", color=colours(i % 20),
                    label=f"{model} {precision} {platform}")
        ax.set_xlabel("nightly run id")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} over nightly runs")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
        name = f"trend-{slug(metric)}.png"
        fig.savefig(out_dir / name, dpi=100)
        plt.close(fig)
        names.append(name)
    return names


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
