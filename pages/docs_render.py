"""Render the support matrix from evidence rows: supported-models.md in the field's layout (one table per platform,
one row per model, one column per precision) and perf-trend PNGs. Pure functions of their inputs (rows read from
the results database by pages/docs.py); the HTML page is pages/docs_html.py, the run pages pages/docs_runs.py.
Every cell shows its row's status in the one vocabulary (``results.support.SupportStatus``: its mark and label,
never blank); whether a row is supported is results/queries.py's to say (:func:`results.queries.supported`, which
``results.support`` classifies as L0 covered or checkpoint-direct), never re-derived here.

A platform that runs two toolchains side by side has a table row per toolchain: the rows of its preferred toolchain
(the first its device type lists) look as they always did; another toolchain's rows are labelled
``<model> (<toolchain>)`` and anchored with ``-by-<toolchain>`` (:func:`shown_toolchain`).

Published text carries no orchestrator paths, hosts or URLs: :func:`scrub` is applied to every free-text field.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgefarm.results.regressions import UNDER_LOAD_METRIC
from edgefarm.results.support import Support, SupportStatus, count_statuses, status_from
from edgefarm.stages.variant import describe as describe_variant
from edgefarm.toolchains.base import Route
from edgellm.files import atomic_output, write_text_atomic
from edgellm.types import Precision

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from edgefarm.pages.docs_regressions import RegressionMark, mark_markdown
from edgefarm.pages.escape import markdown_text
from edgefarm.registries import current
from edgefarm.stages.job import PPL_LIMIT_METRIC

# Metrics shown in cells, in order: (metric name, label, format)
CELL_METRICS: tuple[tuple[str, str, str], ...] = (
    ("decode_tokens_per_s", "decode tok/s", "{:.1f}"),
    ("prefill_tokens_per_s", "prefill tok/s", "{:.0f}"),
    ("perplexity_ratio", "ppl ratio", "{:.4f}"),
    ("logits_max_abs_diff", "max abs Δlogit", "{:.1e}"),
    ("greedy_match_fraction", "greedy match", "{:.0%}"),
    ("memory_estimate_mb", "estimated memory MiB", "{:.0f}"),  # the plan's estimate (devices.memory_fit)
    ("decode_peak_memory_mb", "peak memory MiB", "{:.0f}"),  # the engine's measured peak (edgellm bench)
)
DIRECT_ONLY = SupportStatus.CHECKPOINT_DIRECT.label
LISTED = (SupportStatus.L0_COVERED, SupportStatus.CHECKPOINT_DIRECT, SupportStatus.IMPLEMENTED)
PASSING = (SupportStatus.L0_COVERED, SupportStatus.CHECKPOINT_DIRECT)


def legend() -> tuple[str, ...]:
    """One line per status of the one vocabulary (``results.support.SupportStatus``): its mark, label, meaning."""
    return tuple(f"{shown_status(s)}{'' if shown_status(s).startswith(s.mark) else f' ({s.mark})'}: {s.meaning}"
                 for s in SupportStatus)


def shown_status(status: SupportStatus) -> str:
    """A status in text: its glyph mark and label (``✗ failing``), or its label alone where its mark is a word
    (``not applicable``; the cell shows the word mark ``n/a``)."""
    return status.display  # decided once, in results.support


@dataclass(frozen=True)
class MatrixRow:
    """The latest evidence for one row: (model, precision, platform, the toolchain its jobs ran with)."""

    model: str
    precision: str
    platform: str
    status: str  # the verdict (results.queries.Verdict): pass only when every required stage passed
    run_id: int
    run_started: str
    device: str | None = None
    reason: str | None = None
    stages: dict[str, str] = field(default_factory=dict)  # stage -> status
    metrics: dict[str, float] = field(default_factory=dict)
    toolchain: str | None = None  # what made the evidence, and its version
    toolchain_version: str | None = None
    params: int | None = None  # the model's parameter count, when its checkpoint could be read
    regressions: tuple[RegressionMark, ...] = ()  # metrics outside their baseline in this run
    chosen_versions: str | None = None  # the toolchain versions its run compared ("name==version"); None: pinned
    job_toolchain: str | None = None  # the toolchain its jobs ran with (its row's); None: not known
    route: str | None = None  # how its engines were made in that run ("onnx", "direct", both joined); None: one way
    variant: str = ""  # its variant key (stages.variant.variant_key): part of the row's key, '' the default
    support: Support | None = None  # its support status (results.support.classify); None: from status and stages
    bug: str | None = None  # a waiver's bug link (http/https only, pages.escape.safe_link)
    reasons: tuple[str, ...] = ()  # its reasons, each once, the root cause first (``reason`` is them joined)
    link_base: str = ""  # the docs dir from the page that shows it ("../" for a test list's page in lists/)

    @property
    def state(self) -> SupportStatus:
        """Its status in the one vocabulary (``results.support.SupportStatus``)."""
        if self.support is not None:
            return self.support.status
        return status_from(self.status, self.stages, route=self.route)

    @property
    def root_cause(self) -> str | None:
        """Why it fails, is skipped, waived or not applicable: the first such stage's reason, in pipeline order."""
        if self.support is not None and self.support.reason:
            return self.reasons[0] if self.reasons else self.support.reason
        return None

    @property
    def direct_only(self) -> bool:
        """Supported on the checkpoint-direct route alone: its latest evidence made every engine that way."""
        return self.state is SupportStatus.CHECKPOINT_DIRECT or (
            self.route == Route.DIRECT.value and self.state is SupportStatus.L0_COVERED)

    @property
    def made_by(self) -> str:
        return " ".join(x for x in (self.toolchain, self.toolchain_version) if x)

    @property
    def shown_toolchain(self) -> str | None:
        return shown_toolchain(self.platform, self.job_toolchain)

    @property
    def label(self) -> str:
        """The table row it shows in: its model, with its toolchain when that is not the platform's preferred one
        and the toolchain versions when its run compared versions (one row each, next to each other)."""
        return row_label(self.model, self.chosen_versions, self.shown_toolchain, self.variant)

    @property
    def anchor(self) -> str:
        return row_anchor(self.model, self.precision, self.platform, self.chosen_versions, self.shown_toolchain,
                          self.variant)

    @property
    def evidence_link(self) -> str:
        """Its section on its run's Markdown page (for Markdown pages)."""
        return f"{self.link_base}runs/run-{self.run_id}.md#{self.anchor}"

    @property
    def evidence_html(self) -> str:
        """Its row on its run's HTML page (for the HTML matrix)."""
        return f"{self.link_base}runs/run-{self.run_id}.html#{self.anchor}"


@dataclass(frozen=True)
class TrendPoint:
    run_id: int
    started: str
    model: str
    precision: str
    platform: str
    metric: str
    value: float


@dataclass(frozen=True)
class TrendImage:
    platform: str
    metric: str
    file: str  # name inside the docs dir


def shown_toolchain(platform: str, job_toolchain: str | None) -> str | None:
    """The toolchain a row's label and anchor name: its jobs' toolchain, unless that is the platform's preferred
    one (the first its device type lists), whose rows keep the plain label; on a platform this farm does not know,
    every toolchain is named."""
    if job_toolchain is None:
        return None
    device_type = current().device_types.get(platform)
    if device_type is not None and str(job_toolchain) == str(device_type.toolchains[0]):
        return None
    return str(job_toolchain)


def row_label(model: str, chosen_versions: str | None, toolchain: str | None = None, variant: str = "") -> str:
    notes = "; ".join(x for x in (toolchain, chosen_versions, variant and describe_variant(variant)) if x)
    return f"{model} ({notes})" if notes else model


def version_suffix(chosen_versions: str | None) -> str:
    return f"-{chosen_versions}" if chosen_versions else ""


def row_name(model: str, precision: str, platform: str, chosen_versions: str | None,
             toolchain: str | None = None, variant: str = "") -> str:
    """A row's name on its run's evidence page, which orders the page's sections; its slug is the row's anchor."""
    by = f"-by-{toolchain}" if toolchain else ""
    var = f"-{variant}" if variant else ""
    return f"{model}-{precision}-{platform}{by}{var}{version_suffix(chosen_versions)}"


def row_anchor(model: str, precision: str, platform: str, chosen_versions: str | None,
               toolchain: str | None = None, variant: str = "") -> str:
    """The id of a row's section on its run's evidence page (and of its cell in the HTML matrix)."""
    return anchor(row_name(model, precision, platform, chosen_versions, toolchain, variant))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


# the registries' names and "name==version, ..." lists of them: their slug alone is their anchor
_PLAIN_PART = r"[A-Za-z0-9][A-Za-z0-9._+=-]*"
_PLAIN_NAME = re.compile(rf"{_PLAIN_PART}(?:, ?{_PLAIN_PART})*\Z")


def anchor(name: str) -> str:
    """The id of a section named ``name``: its slug, readable; a name beyond the registries' characters (``[/]``,
    ``a b``, markup: whose slugs collide) also gets a digest of the exact name, so no two such rows share one."""
    readable = slug(name)
    if _PLAIN_NAME.match(name) and readable:
        return readable
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{readable}-{digest}" if readable else digest


def cell_kind(r: MatrixRow) -> SupportStatus:
    """Its status in the one vocabulary (``MatrixRow.state``)."""
    return r.state


def supported(rows: Iterable[MatrixRow]) -> list[MatrixRow]:
    """Rows that count as supported (L0 covered or checkpoint-direct: what :func:`results.queries.supported` says
    of their verdict); implemented (export verified only) rows never do."""
    return [r for r in rows if r.state in PASSING]


def platform_order(rows: Iterable[MatrixRow]) -> list[str]:
    """Platforms with passing evidence first, then those with export evidence only, then the rest; by name."""
    states: dict[str, set[SupportStatus]] = defaultdict(set)
    for r in rows:
        states[r.platform].add(r.state)
    return sorted(states, key=lambda p: (not states[p] & set(PASSING), not states[p] & set(LISTED), p))


def status_counts(rows: Iterable[MatrixRow]) -> dict[SupportStatus, int]:
    """Rows per status, in the vocabulary's order, those with none left out (``results.support.count_statuses``)."""
    return {s: n for s, n in count_statuses(r.state for r in rows).items() if n}


def platform_truth(rows: Sequence[MatrixRow]) -> str:
    """What is true of a platform's rows, per status, with the distinct root causes (at most three each)."""
    parts = []
    for status, n in status_counts(rows).items():
        why = list(dict.fromkeys(r.root_cause or r.reason for r in rows if r.state is status
                                 and (r.root_cause or r.reason)))
        shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
        parts.append(f"{n} {status.label}" + (f" ({shown})" if shown else ""))
    return ", ".join(parts)


def precision_order(precisions: Iterable[str]) -> list[str]:
    order = [p.value for p in Precision]
    return sorted(set(precisions), key=lambda p: (order.index(p) if p in order else len(order), p))


def format_params(n: int | None) -> str:
    if n is None:
        return "-"
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{suffix}" if value < 10 else f"{value:.0f}{suffix}"
    return str(n)


def platform_toolchains(rows: Iterable[MatrixRow]) -> list[str]:
    """'name version' of every toolchain that produced a shown cell, sorted."""
    return sorted({r.made_by for r in rows if r.made_by})


# A metric judged against a limit shows the limit beside it (as MLPerf shows each row's target): metric -> (the
# metric recording the limit the row was judged by, how to say it)
CELL_LIMITS: dict[str, tuple[str, str]] = {
    "perplexity_ratio": (PPL_LIMIT_METRIC, "limit 1±{:.2g}"),
}


def metrics_text(metrics: dict[str, float], sep: str) -> str:
    parts = []
    for name, label, fmt in CELL_METRICS:
        if name not in metrics:
            continue
        text = f"{label} {fmt.format(metrics[name])}"
        limit_metric, limit_fmt = CELL_LIMITS.get(name, ("", ""))
        if limit_metric in metrics:
            text += f" ({limit_fmt.format(metrics[limit_metric])})"
        parts.append(text)
    return sep.join(parts)


# --- no orchestrator paths, hosts or URLs in published text ---------------------------------------------------
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>)]+")
_USER_HOST = re.compile(r"\b[\w.-]+@[\w-]+(?:\.[\w-]+)*(?::\d+)?")
_IPV4 = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b")
_ABS_PATH = re.compile(r"(?<![\w.~/])/(?:[\w.@+~-]+/)*[\w.@+~-]+/?")


def scrub(text: str | None, data_dir: Path | str | None = None) -> str | None:
    """Paths under the data dir become relative to it; other absolute paths keep their last part only; URLs,
    user@host and IP addresses are replaced by placeholders."""
    if text is None:
        return None
    if data_dir is not None:
        for root in {str(Path(data_dir)), str(Path(data_dir).resolve())}:
            text = text.replace(root.rstrip("/") + "/", "").replace(root, ".")
    text = _URL.sub("<url>", text)
    text = _USER_HOST.sub("<host>", text)
    text = _IPV4.sub("<host>", text)
    return _ABS_PATH.sub(lambda m: "…/" + m.group(0).rstrip("/").rsplit("/", 1)[-1], text)


# --- supported-models.md -----------------------------------------------------------------------------------------
def _run_ref(r: MatrixRow, links: bool) -> str:
    return f"[run {r.run_id}]({r.evidence_link})" if links else f"run {r.run_id}"


def markdown_cell(r: MatrixRow | None, *, several_toolchains: bool, links: bool = True,
                  versions_said: bool = False) -> str:
    """One cell: every status shows its own mark (never blank): L0 covered and checkpoint-direct link the evidence
    with their mark; the others say their label and link their run; no row: never tested. ``versions_said``: the
    table's heading names each toolchain's one version, so a cell names the toolchain only."""
    if r is None:
        return SupportStatus.NEVER_TESTED.mark
    state = r.state
    made_by = r.toolchain if versions_said and r.toolchain else r.made_by
    if state in PASSING:
        # where a platform's table holds several toolchains, each cell names the toolchain (and version) it proves
        text = f"{state.mark} {markdown_text(made_by)}" if several_toolchains and r.toolchain else state.mark
        regressed = f" {mark_markdown(r.regressions)}" if r.regressions and links else ""
        direct = f" {DIRECT_ONLY}" if state is SupportStatus.CHECKPOINT_DIRECT else ""
        return (f"[{text}]({r.evidence_link})" if links else f"{text} (run {r.run_id})") + direct + regressed
    shown = shown_status(state)
    if state is SupportStatus.NOT_APPLICABLE:
        return state.mark
    if state is SupportStatus.IMPLEMENTED:
        return f"{shown}, {markdown_text(made_by or 'toolchain unknown')} ({_run_ref(r, links)})"
    if state is SupportStatus.FAILING and r.support is not None and r.support.since_run is not None \
            and r.support.since_run != r.run_id:
        shown += f" since run {r.support.since_run}"
    if state is SupportStatus.WAIVED and r.support is not None and r.support.until is not None:
        shown += f" until {r.support.until.isoformat()}"
    if state is SupportStatus.WAIVED and r.bug:
        shown += f", [bug]({r.bug})"
    return f"{shown} ({_run_ref(r, links)})"


# pages beside this one (pages/compare.py writes them), relative to the docs dir
COMPARE_INDEX = "compare/index.md"


def layout_links() -> list[tuple[str, str, str]]:
    """(product, supported-models page, support-matrix page) of each toolchain's own page layout
    (``toolchains.base.docs_layouts``; pages/docs_layout.py writes them), relative to the docs dir."""
    from edgefarm.toolchains.base import docs_layouts

    return [(d.product, f"{d.directory}/supported-models.md", f"{d.directory}/support-matrix.md")
            for d in docs_layouts()]


def render_markdown(rows: Sequence[MatrixRow], *, generated_at: str, db_label: str, links: bool = True,
                    title: str = "Supported models", intro: Sequence[str] = ()) -> str:
    """One section per platform with L0-covered, checkpoint-direct or implemented rows (those with passing or export
    evidence first): its toolchain(s) and rows per status, then Model | Params | one column per precision tested
    there, every row of the platform in it, each cell in the one vocabulary. A platform without such rows gets one
    line saying what is true there (failing, skipped and why, not applicable). ``links=False`` writes run numbers
    instead of links (for pages that do not sit beside runs/)."""
    lines = [
        f"# {title}",
        "",
        f"Generated {generated_at} from the results database ({db_label}); do not edit by hand.",
        "",
        *intro,
        *([" ".join(f"The same evidence in {markdown_text(product)}'s own layout: [supported models]({models}) and "
                    f"[support matrix]({matrix});" for product, models, matrix in layout_links())
           + f" Toolchain versions, runs and commits compared: [comparisons]({COMPARE_INDEX}).", ""]
          if links and not intro else []),
        "Legend:",
        "",
        *(f"- {markdown_text(item)}" for item in legend()),
        "",
    ]
    if rows:
        counts = ", ".join(f"{n} {s.label}" for s, n in status_counts(rows).items())
        lines += [f"Rows: {len(rows)} ({counts}).", ""]
    by_platform: dict[str, list[MatrixRow]] = defaultdict(list)
    for r in rows:
        by_platform[r.platform].append(r)
    without = []
    for platform in platform_order(rows):
        tested = by_platform[platform]
        if not any(r.state in LISTED for r in tested):
            without.append(platform)
            continue
        shown = [r for r in tested if r.state in LISTED]
        toolchains = platform_toolchains(shown)
        several = len({r.toolchain for r in shown if r.toolchain}) > 1
        # each toolchain at one version in this table: the heading says the versions once, the cells name toolchains
        once = len(toolchains) == len({r.toolchain for r in shown if r.toolchain and r.made_by})
        precisions = precision_order(r.precision for r in tested)
        cells = {(r.label, r.precision): r for r in tested}  # one table row per model (per compared version)
        params = {r.label: r.params for r in tested}
        lines += [f"## {markdown_text(platform)}", "",
                  f"Toolchain{'s' if len(toolchains) > 1 else ''}: "
                  f"{markdown_text(', '.join(toolchains) or 'not recorded')}", "",
                  f"Rows: {markdown_text(platform_truth(tested))}.", "",
                  "| Model | Params | " + " | ".join(markdown_text(p.upper()) for p in precisions) + " |",
                  "|---|---:|" + ":-:|" * len(precisions)]
        for model in sorted({r.label for r in tested}, key=str.lower):
            row = [markdown_text(model), format_params(params.get(model))]
            row += [markdown_cell(cells.get((model, p)), several_toolchains=several, links=links, versions_said=once)
                    for p in precisions]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    if not any(r.state in PASSING for r in rows):
        lines += ["No combination has passing evidence yet.", ""]
    if without:
        lines += ["## Platforms without passing or export evidence", ""]
        for p in without:
            bugs = ", ".join(f"[bug]({b})" for b in dict.fromkeys(r.bug for r in by_platform[p] if r.bug))
            lines.append(f"- {markdown_text(p)}: {markdown_text(platform_truth(by_platform[p]))}."
                         + (f" Waivers' bugs: {bugs}." if bugs else ""))
        lines.append("")
    return "\n".join(lines)


# --- per-run evidence pages (pages/docs_runs.py renders them) ----------------------------------------------
def bench_load_text(metrics: object) -> str:
    """A benchmark's load conditions from its metrics (``tasks/bench_load.py``), per mode: the host's one-minute
    load before -> after, the copy bandwidth before -> after and the cores other processes took; "" for a result
    without them. Shown with the result's reason, where its bench conditions are."""
    got = {n: v for n, v, _ in metrics} if isinstance(metrics, list) else {}
    parts = []
    for mode in ("prefill", "decode"):
        load = [got.get(f"{mode}_host_load1_{w}") for w in ("before", "after")]
        copy = [got.get(f"{mode}_copy_gb_per_s_{w}") for w in ("before", "after")]
        others = got.get(f"{mode}_others_cpu_cores")
        if all(v is None for v in (*load, *copy, others)):
            continue
        text = "->".join("?" if v is None else f"{v:.2f}" for v in load)
        text += f" host load, {'->'.join('?' if v is None else f'{v:.1f}' for v in copy)} GB/s copy"
        if others is not None:
            text += f", others {others:.2f} cores"
        parts.append(f"{mode}: {text}")
    if not parts:
        return ""
    marked = " UNDER LOAD (unreliable, not judged)" if got.get(UNDER_LOAD_METRIC) == 1.0 else ""
    return f"bench conditions{marked}: " + "; ".join(parts)


def render_run_page(run: dict[str, object], results: Sequence[dict[str, object]]) -> str:
    """A run's Markdown evidence page (``pages.docs_runs.render_markdown``, without support statuses or logs)."""
    from edgefarm.pages.docs_runs import render_markdown as render_run_markdown

    return render_run_markdown(run, results)


# --- trend plots ---------------------------------------------------------------------------------------------------
def plot_text(value: str) -> str:
    """``value`` as literal matplotlib text on one line: a ``$`` would start mathtext (which a stray one makes
    raise); control characters are shown as ``\\xNN``."""
    return re.sub(r"[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", value).replace("$", "\\$")


# a trend metric's name on its plot, with its unit
TREND_NAMES: dict[str, tuple[str, str]] = {
    "decode_tokens_per_s": ("decode throughput", "tokens/s, higher is better"),
    "prefill_tokens_per_s": ("prefill throughput", "tokens/s, higher is better"),
    "perplexity_ratio": ("perplexity ratio to the reference", "ratio, lower is better"),
}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_LINES = ("-", "--", ":", "-.")


def trend_name(metric: str) -> tuple[str, str]:
    """(human name, unit) of a trend metric; another metric: its own name, no unit."""
    return TREND_NAMES.get(metric, (metric, ""))


def series_style(i: int) -> dict[str, object]:
    """The i-th series' colour, marker and line style: (colour, marker) pairs repeat only after 40 series, and the
    line style changes every 10."""
    import matplotlib.pyplot as plt

    return {"color": plt.get_cmap("tab10")(i % 10), "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINES[(i // 10) % len(_LINES)]}


def baseline_band(metric: str, values: Sequence[float]) -> tuple[float, float] | None:
    """The band the regression check accepts for the latest value (``results.regressions``: the median of the
    previous nightly runs, up to ``BASELINE_RUNS``, +- max(K x MAD spread, the metric's floor)); None below
    ``MIN_BASELINE_RUNS`` previous runs or for a metric it does not judge."""
    import statistics

    from edgefarm.results.regressions import BASELINE_RUNS, K_MAD, MAD_TO_SIGMA, MIN_BASELINE_RUNS, RULES

    rule = RULES.get(metric)
    history = list(values[:-1])[-BASELINE_RUNS:]
    if rule is None or len(history) < MIN_BASELINE_RUNS:
        return None
    median = statistics.median(history)
    mad = statistics.median(abs(x - median) for x in history)
    allowed = max(K_MAD * MAD_TO_SIGMA * mad, rule.floor * abs(median))
    return median - allowed, median + allowed


def trend_figure(metric: str, platform: str, series: dict[tuple[str, str], list[TrendPoint]]) -> Figure:
    """One figure: a line per (model, precision) over nightly runs, each its own colour, marker and line style; the
    x axis shows each run's id and date; a shaded band per series is the baseline the regression check judges its
    latest value against (where it has enough earlier runs); the y axis names the metric with its unit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(11, 4.5))
    dates: dict[int, str] = {}
    banded = False
    for i, ((model, precision), pts) in enumerate(sorted(series.items())):
        pts = sorted(pts, key=lambda x: x.run_id)
        dates |= {x.run_id: x.started[:10] for x in pts}
        style = series_style(i)
        ax.plot([x.run_id for x in pts], [x.value for x in pts], label=plot_text(f"{model} {precision}"),
                **style)  # type: ignore[arg-type]
        band = baseline_band(metric, [x.value for x in pts])
        if band is not None:
            window = pts[:-1][-7:]
            ax.fill_between([window[0].run_id, pts[-1].run_id], band[0], band[1], color=style["color"], alpha=0.12,
                            linewidth=0)  # type: ignore[arg-type]
            banded = True
    ids = sorted(dates)
    ax.set_xlim(ids[0] - 0.5, ids[-1] + 0.5)  # a single run still gets a readable, integer axis
    if len(ids) <= 12:
        ax.set_xticks(ids, labels=[f"{i}\n{dates[i]}" for i in ids])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    name, unit = trend_name(metric)
    ax.set_xlabel("nightly run (id and date)")
    ax.set_ylabel(plot_text(f"{name} ({unit})" if unit else name))
    ax.set_title(plot_text(f"{name} on {platform} over nightly runs"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0,
              title="shaded: baseline band" if banded else None, title_fontsize=7)
    fig.tight_layout()
    return fig


def render_trends(points: Sequence[TrendPoint], out_dir: Path) -> list[TrendImage]:
    """One PNG per (metric, platform); earlier trend-*.png files in out_dir are replaced. Returns what was written."""
    for old in out_dir.glob("trend-*.png"):
        old.unlink()
    if not points:
        return []
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], dict[tuple[str, str], list[TrendPoint]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        groups[(p.metric, p.platform)][(p.model, p.precision)].append(p)
    images = []
    for (metric, platform), series in sorted(groups.items()):
        fig = trend_figure(metric, platform, series)
        name = f"trend-{slug(platform)}-{slug(metric)}.png"
        with atomic_output(out_dir / name) as f:
            fig.savefig(f, dpi=100, format="png")
        plt.close(fig)
        images.append(TrendImage(platform=platform, metric=metric, file=name))
    return images


def write_atomic(path: Path, text: str) -> None:
    write_text_atomic(path, text)
