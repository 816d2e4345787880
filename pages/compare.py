"""What changed between two sides of the evidence: ``edgefarm compare`` (cli/compare.py) and its pages.

A *side* is one of:
  - a toolchain version (:class:`ToolchainVersionSide`, ``some-toolchain==1.2.0``): per row, its latest published
    results made with that toolchain at that version: a run's results of the row whose ``Result.chosen_versions``
    names ``toolchain==version`` (a matrix's ``toolchain_versions``, several versions side by side in one run), or,
    where the run chose no version of that toolchain, whose stages made by that toolchain
    (``Result.toolchain``) ran at that version (``Result.toolchain_version``);
  - a run (:class:`RunSide`): that published run's rows;
  - a commit of this farm (:class:`CommitSide`): the latest published nightly whose ``Run.code_version`` starts with
    the given prefix (our own toolchain's version is the farm's, so two commits are how it compares two versions).

A row is :class:`RowId`: the row of results/queries.py (model, precision, platform, job toolchain, variant) and the
toolchain versions its run chose (``chosen_versions``; for toolchain-version sides without the compared toolchain's
own entry, so ``0.11.0`` and ``0.12.0`` results of one row meet). Its verdict and worst status per stage are
results/queries.py's (:func:`results.queries.row_history`), never re-derived here; a metric is keyed by
(stage, metric name), the first test id in name order where a stage ran several.

Only published runs are sides or history (of any run kind, except that a commit names its nightly); an unpublished
run is refused. Noise band of a metric delta: the *history* is that metric's values for that row (same stage) in the
published runs before the later of the row's two runs, on side A's line (the same toolchain version for
toolchain-version sides; the same chosen versions for run and commit sides), from results that passed, the last
:data:`HISTORY_RUNS` of them. With at least :data:`MIN_HISTORY` points the band is ``median ± 3 * 1.4826 * MAD``
(``K_MAD`` = 3; MAD: the median absolute deviation, x 1.4826 an estimate of the standard deviation; the spread
results/regressions.py uses for its baseline): a delta
``B - A`` is *within noise* when ``|B - A|`` is at most that half-width, else *outside noise*; with fewer points it
has *no band (n history points)*. A history of identical values has a band of width 0: any change is outside it.

A row's status on a side is its support status in that side's run (``results.support.SupportStatus``, decided by
``results.support.classify`` as the pages and ``edgefarm query`` decide it: l0_covered, failing, implemented...).
A *regression* (``--fail-on-regression``) is a row on both sides that was supported on side A (l0_covered or
checkpoint_direct) and is anything else on side B; a row lost altogether is listed as lost, not counted as one.

Published pages: ``<docs dir>/compare/<slug>.md`` and ``.html`` per comparison, ``index.md`` and ``index.html``
listing them (from ``index.json``, which :func:`published_comparisons` reads). Every name from the database is
escaped (Markdown: pages.escape.markdown_text; HTML: html.escape, control characters dropped); the terminal escapes
with cli.text.cell; reasons are scrubbed like the docs' (pages.docs_render.scrub).
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgefarm.pages.docs_render import scrub
from edgefarm.pages.escape import markdown_text
from edgefarm.results.bisections import latest_bisection_lines
from edgefarm.results.comparisons import (
    latest_nightly_of_commit,
    published_results,
    published_run_ids,
    recent_nightly_commits,
    run_info,
    runs_with_version,
)
from edgefarm.results.comparisons import recorded_versions as _versions_recorded
from edgefarm.results.db import Db, reading
from edgefarm.results.models import ResultStatus
from edgefarm.results.queries import RowKey, RowStatus, row_history
from edgefarm.results.regressions import K_MAD, MAD_TO_SIGMA
from edgefarm.results.support import SupportStatus, classify
from edgefarm.toolchains import base as toolchains
from edgellm.errors import BugError, ConfigurationError
from edgellm.files import write_text_atomic

HISTORY_RUNS = 10  # the last this many history points make a band
MIN_HISTORY = 3  # fewer: no band
COMPARE_DIR = "compare"
INDEX_JSON = "index.json"
MAX_SLUG = 120
# the support statuses of a supported row (results.queries.supported: its verdict was pass)
SUPPORTED = frozenset({SupportStatus.L0_COVERED.value, SupportStatus.CHECKPOINT_DIRECT.value})


# -- sides -------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolchainVersionSide:
    toolchain: str
    version: str

    @property
    def label(self) -> str:
        return f"{self.toolchain}=={self.version}"


@dataclass(frozen=True)
class RunSide:
    run_id: int

    @property
    def label(self) -> str:
        return f"run {self.run_id}"


@dataclass(frozen=True)
class CommitSide:
    prefix: str

    @property
    def label(self) -> str:
        return f"commit {self.prefix}"


Side = ToolchainVersionSide | RunSide | CommitSide
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+!-]{0,199}")
_COMMIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def parse_toolchain_sides(toolchain: str, against: str) -> tuple[ToolchainVersionSide, ToolchainVersionSide]:
    """``--toolchain NAME==A --against [NAME]==B`` as two sides; the errors name the bad value and what is valid."""
    name, sep, version_a = str(toolchain).partition("==")
    if not sep:
        raise ConfigurationError(f"bad --toolchain {toolchain!r}: need NAME==VERSION (e.g. some-toolchain==1.2.0); "
                                 f"toolchains: {', '.join(toolchains.names())}")
    name = toolchains.parse(name, what="toolchain")
    other, sep, version_b = str(against).partition("==")
    if not sep:
        raise ConfigurationError(f"bad --against {against!r}: need ==VERSION or {name}==VERSION (e.g. ==0.12.0)")
    if other.strip() and toolchains.parse(other, what="toolchain") != name:
        raise ConfigurationError(f"bad --against {against!r}: compares versions of {name!r} only; valid: "
                                 f"==VERSION or {name}==VERSION")
    sides = []
    for flag, version in (("--toolchain", version_a), ("--against", version_b)):
        version = version.strip()
        if not _VERSION.fullmatch(version):
            raise ConfigurationError(f"bad {flag} version {version!r}: need a version such as 0.11.0 (letters, digits "
                                     "and . _ + ! -)")
        sides.append(ToolchainVersionSide(name, version))
    if sides[0] == sides[1]:
        raise ConfigurationError(f"--toolchain and --against name the same version {sides[0].label!r}; valid: two "
                                 "different versions")
    return sides[0], sides[1]


def parse_commit(prefix: str) -> CommitSide:
    if not _COMMIT.fullmatch(str(prefix)):
        raise ConfigurationError(f"bad commit {prefix!r}: need the start of a commit id as the runs record it (e.g. "
                                 "abc1234; letters, digits and . _ + -)")
    return CommitSide(prefix)


def _slug_part(text: str) -> str:
    """A file name part: lower case letters, digits, ``.`` and ``_``; anything else one ``-``; no leading dot."""
    part = re.sub(r"[^a-z0-9._]+", "-", text.lower())
    return re.sub(r"\.{2,}", ".", part).strip(".-") or "x"


def comparison_slug(a: Side, b: Side) -> str:
    """The pages' file name: ``some-toolchain-1.2.0-vs-1.3.0``, ``runs-3-vs-5``, ``commits-abc1234-vs-def5678``."""
    if isinstance(a, ToolchainVersionSide) and isinstance(b, ToolchainVersionSide):
        text = f"{_slug_part(a.toolchain)}-{_slug_part(a.version)}-vs-{_slug_part(b.version)}"
    elif isinstance(a, RunSide) and isinstance(b, RunSide):
        text = f"runs-{a.run_id}-vs-{b.run_id}"
    elif isinstance(a, CommitSide) and isinstance(b, CommitSide):
        text = f"commits-{_slug_part(a.prefix)}-vs-{_slug_part(b.prefix)}"
    else:
        raise ConfigurationError(f"cannot compare {a.label!r} with {b.label!r}: both sides must be of one kind "
                                 "(toolchain versions, runs or commits)")
    return text[:MAX_SLUG].rstrip(".-")


# -- rows --------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class RowId:
    key: RowKey
    versions: str = ""  # the chosen toolchain versions that tell this row apart ('' none)

    def to_json(self) -> dict[str, str]:
        return {"model": self.key.model, "precision": str(getattr(self.key.precision, "value", self.key.precision)),
                "platform": self.key.platform, "job_toolchain": str(self.key.toolchain),
                "variant": self.key.variant, "versions": self.versions}

    def text(self) -> str:
        j = self.to_json()
        notes = ", ".join(x for x in (j["job_toolchain"], j["variant"] and f"variant {j['variant']}",
                                      j["versions"]) if x)
        return f"{j['model']} {j['precision']} on {j['platform']} ({notes})"


MetricKey = tuple[str, str]  # (stage, metric name)


@dataclass(frozen=True)
class RowSide:
    """A row's evidence on one side: its run, support status (``verdict``: a ``SupportStatus`` value), worst status
    per stage, chosen versions and metrics."""

    run_id: int
    verdict: str
    stages: dict[str, str]
    chosen_versions: str | None = None
    metrics: dict[MetricKey, tuple[float, str]] = field(default_factory=dict)  # -> (value, unit)
    reasons: dict[str, str] = field(default_factory=dict)  # stage -> why it did not pass (scrubbed)

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "verdict": self.verdict, "stages": dict(self.stages),
                "chosen_versions": self.chosen_versions, "reasons": dict(self.reasons)}

    def why(self, stages: Iterable[str]) -> str:
        """The reasons of these stages, one each (a reason shared by several stages once)."""
        seen = dict.fromkeys(self.reasons[st] for st in stages if st in self.reasons)
        return "; ".join(seen)


@dataclass(frozen=True)
class Band:
    points: int
    median: float | None = None
    half_width: float | None = None  # K_MAD * MAD_TO_SIGMA * MAD

    @property
    def text(self) -> str:
        if self.median is None or self.half_width is None:
            return f"no band ({self.points} history points)"
        return f"{fmt_num(self.median)} ± {fmt_num(self.half_width)} (n={self.points})"


def noise_band(history: Sequence[float]) -> Band:
    """The band of a metric's history (see the module doc): median ± K_MAD * 1.4826 * MAD, or no band below
    MIN_HISTORY points."""
    if len(history) < MIN_HISTORY:
        return Band(len(history))
    median = statistics.median(history)
    mad = statistics.median(abs(x - median) for x in history)
    return Band(len(history), median, K_MAD * MAD_TO_SIGMA * mad)


def noise_verdict(delta: float, band: Band) -> str:
    if band.half_width is None:
        return band.text
    return "within noise" if abs(delta) <= band.half_width else "outside noise"


@dataclass(frozen=True)
class StatusChange:
    row: RowId
    a: RowSide
    b: RowSide
    stages: dict[str, tuple[str | None, str | None]]  # stages whose worst status changed: (A, B), None = absent
    bisected: str | None = None  # a regression's recorded bisection: "first bad: <sha12> <subject>"

    @property
    def regression(self) -> bool:
        return self.a.verdict in SUPPORTED and self.b.verdict not in SUPPORTED

    def why(self) -> str:
        """Why B, with the bisection's answer when the row was bisected."""
        return "; ".join(x for x in (self.b.why(self.stages), self.bisected) if x) or "-"

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row.to_json(), "a": self.a.to_json(), "b": self.b.to_json(),
                "verdict": [self.a.verdict, self.b.verdict], "regression": self.regression,
                "stages": {k: list(v) for k, v in self.stages.items()},
                **({"bisected": self.bisected} if self.bisected else {})}


@dataclass(frozen=True)
class MetricDelta:
    row: RowId
    stage: str
    metric: str
    unit: str
    a: float
    b: float
    band: Band
    history: tuple[float, ...] = ()

    @property
    def delta(self) -> float:
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        return None if self.a == 0 else self.delta / abs(self.a)

    @property
    def noise(self) -> str:
        return noise_verdict(self.delta, self.band)

    def to_json(self) -> dict[str, Any]:
        return {"row": self.row.to_json(), "stage": self.stage, "metric": self.metric, "unit": self.unit,
                "a": _json_num(self.a), "b": _json_num(self.b), "delta": _json_num(self.delta),
                "relative": _json_num(self.relative), "noise": self.noise,
                "band": {"points": self.band.points, "median": _json_num(self.band.median),
                         "half_width": _json_num(self.band.half_width)},
                "history": [_json_num(v) for v in self.history]}


@dataclass(frozen=True)
class Comparison:
    a: str  # the sides as shown (label and the runs they took rows from)
    b: str
    slug: str
    gained: list[tuple[RowId, RowSide]]  # in B, not in A
    lost: list[tuple[RowId, RowSide]]  # in A, not in B
    changed: list[StatusChange]
    deltas: list[MetricDelta]
    same: int  # rows on both sides whose verdict and stages did not change

    @property
    def title(self) -> str:
        return f"{self.a} vs {self.b}"

    @property
    def regressions(self) -> list[StatusChange]:
        return [c for c in self.changed if c.regression]

    def summary(self) -> str:
        outside = sum(d.noise == "outside noise" for d in self.deltas)
        return (f"{len(self.gained)} gained, {len(self.lost)} lost, {len(self.changed)} changed "
                f"({len(self.regressions)} regressions), {self.same} unchanged; {len(self.deltas)} metric deltas "
                f"({outside} outside noise)")

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "slug": self.slug, "summary": self.summary(),
                "gained": [{"row": r.to_json(), "b": s.to_json()} for r, s in self.gained],
                "lost": [{"row": r.to_json(), "a": s.to_json()} for r, s in self.lost],
                "status_changes": [c.to_json() for c in self.changed],
                "regressions": len(self.regressions),
                "metric_deltas": [d.to_json() for d in self.deltas], "unchanged": self.same}


def common_metrics(a: Mapping[RowId, RowSide], b: Mapping[RowId, RowSide]) -> list[tuple[RowId, MetricKey]]:
    """The (row, metric) pairs present on both sides among the judged metrics (``results.regressions.RULES``:
    accuracy and speed; never sizes, cache hits, lease waits or host load): those get a delta (and need a history)."""
    from edgefarm.results.regressions import RULES

    return [(row, m) for row in sorted(a.keys() & b.keys()) for m in sorted(a[row].metrics.keys()
                                                                          & b[row].metrics.keys()) if m[1] in RULES]


def compare_rows(a_label: str, b_label: str, slug: str, a: Mapping[RowId, RowSide], b: Mapping[RowId, RowSide],
                 history: Mapping[tuple[RowId, MetricKey], Sequence[float]]) -> Comparison:
    """The comparison of two sides' rows (pure): gained, lost, status changes, metric deltas with their bands."""
    changed, same = [], 0
    for row in sorted(a.keys() & b.keys()):
        ra, rb = a[row], b[row]
        stages = {st: (ra.stages.get(st), rb.stages.get(st)) for st in _stage_union(ra.stages, rb.stages)
                  if ra.stages.get(st) != rb.stages.get(st)}
        if ra.verdict != rb.verdict or stages:
            changed.append(StatusChange(row, ra, rb, stages))
        else:
            same += 1
    deltas = []
    for row, (stage, name) in common_metrics(a, b):
        (va, unit), (vb, _) = a[row].metrics[(stage, name)], b[row].metrics[(stage, name)]
        past = tuple(history.get((row, (stage, name)), ()))
        deltas.append(MetricDelta(row, stage, name, unit, va, vb, noise_band(past), past))
    return Comparison(a_label, b_label, slug,
                      gained=[(r, b[r]) for r in sorted(b.keys() - a.keys())],
                      lost=[(r, a[r]) for r in sorted(a.keys() - b.keys())],
                      changed=changed, deltas=deltas, same=same)


def _stage_union(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    return list(a) + [s for s in b if s not in a]


# -- reading the database ----------------------------------------------------------------------------------------------
def _parse_chosen(chosen: str) -> list[tuple[str, str]]:
    out = []
    for part in chosen.split(","):
        name, _, version = part.strip().partition("==")
        if name:
            out.append((name, version))
    return out


def _without(chosen: str, toolchain: str) -> str:
    return ", ".join(f"{n}=={v}" for n, v in _parse_chosen(chosen) if n != toolchain)


@dataclass
class _Group:
    """One row's results in one run, one chosen-versions group."""

    key: RowKey
    run_id: int
    chosen: str
    makers: set[tuple[str, str | None]] = field(default_factory=set)  # (toolchain, version) of each result
    metrics: dict[MetricKey, tuple[float, str, bool, str]] = field(default_factory=dict)  # (v, unit, passed, test)
    reasons: dict[str, str] = field(default_factory=dict)  # stage -> reason of a result that did not pass

    def add_metric(self, key: MetricKey, value: float, unit: str, passed: bool, test_id: str) -> None:
        held = self.metrics.get(key)
        if held is None or test_id < held[3]:
            self.metrics[key] = (value, unit, passed, test_id)


def _accepts(side: Side, group: _Group) -> bool:
    """Whether a group's results are on a side's line (toolchain version sides; run sides take every group)."""
    if not isinstance(side, ToolchainVersionSide):
        return True
    named = [v for n, v in _parse_chosen(group.chosen) if n == side.toolchain]
    if named:
        return side.version in named
    return (side.toolchain, side.version) in group.makers


def _row_id(side: Side, group: _Group) -> RowId:
    if isinstance(side, ToolchainVersionSide):
        return RowId(group.key, _without(group.chosen, side.toolchain))
    return RowId(group.key, group.chosen)


def _load_groups(s: Db, *, data_dir: Path | None = None, facts_only: bool = False,
                 **where: Any) -> dict[tuple[RowKey, int, str], _Group]:
    """The published groups of results matching ``where`` (``results.comparisons.published_results``' filters);
    ``facts_only``: their makers, no metrics or reasons."""
    groups: dict[tuple[RowKey, int, str], _Group] = {}
    for r in published_results(s, facts_only=facts_only, **where):
        key = RowKey(r.model, r.precision, r.platform, r.job_toolchain, r.variant or "")
        chosen = r.chosen_versions or ""
        g = groups.get((key, r.run_id, chosen))
        if g is None:
            g = groups[(key, r.run_id, chosen)] = _Group(key, r.run_id, chosen)
        g.makers.add((str(r.toolchain), r.toolchain_version))
        if facts_only:
            continue
        if r.reason and r.status != ResultStatus.PASS:
            g.reasons.setdefault(str(r.stage), scrub(r.reason, data_dir) or "")
        if r.metric is not None:  # a metric has a value and its result a test id
            g.add_metric((str(r.stage), r.metric), float(r.value), r.unit or "",  # type: ignore[arg-type]
                         r.status == ResultStatus.PASS, r.test_id)  # type: ignore[arg-type]
    return groups


def _published_run_ids(s: Db, limit: int = 20) -> str:
    ids = published_run_ids(s, limit)
    return ", ".join(map(str, sorted(ids))) or "none (no run is published yet)"


def recorded_versions(s: Db, toolchain: str) -> list[str]:
    """The versions of ``toolchain`` that published results were made with or chose."""
    found = _versions_recorded(s, toolchain)
    versions = {v for v in found.made if v} | {v for c in found.chosen if c for n, v in _parse_chosen(c)
                                               if n == toolchain}
    return sorted(versions)


def _side_runs(s: Db, side: Side) -> list[int]:
    """The published runs a side's rows may come from; a ConfigurationError naming what exists when none."""
    if isinstance(side, ToolchainVersionSide):
        return runs_with_version(s, side.toolchain, side.version)  # a superset: _resolve picks, says when none left
    if isinstance(side, RunSide):
        run = run_info(s, side.run_id)
        if run is None or not run.published:
            why = "no such run" if run is None else f"run {side.run_id} is not published (status {run.status})"
            raise ConfigurationError(f"bad run {side.run_id}: {why}; published runs: {_published_run_ids(s)}")
        return [side.run_id]
    found = latest_nightly_of_commit(s, side.prefix)
    if found is None:
        latest: dict[str, int] = {}
        for code_version, run_id in recent_nightly_commits(s, 200):
            latest.setdefault(code_version, run_id)
        shown = ", ".join(f"{cv} (run {rid})" for cv, rid in list(latest.items())[:20]) or "none"
        raise ConfigurationError(f"no published nightly run of commit {side.prefix!r}; recent nightlies: {shown}")
    return [found]


@dataclass
class _Resolved:
    side: Side
    groups: dict[RowId, _Group]
    label: str
    runs: list[int]  # the published runs it may take rows from (a run or commit side: one)


def _resolve(s: Db, side: Side, data_dir: Path | None) -> _Resolved:
    runs = _side_runs(s, side)
    picked: dict[RowId, tuple[RowKey, int, str]] = {}
    for g in sorted(_load_groups(s, run_ids=runs, facts_only=True).values(),
                    key=lambda g: (g.run_id, g.chosen)):
        if _accepts(side, g):
            picked[_row_id(side, g)] = (g.key, g.run_id, g.chosen)  # the latest run wins
    if not picked and isinstance(side, ToolchainVersionSide):
        known = recorded_versions(s, side.toolchain)
        raise ConfigurationError(f"no published results of {side.toolchain} at version {side.version!r}; "
                                 f"recorded versions: {', '.join(known) or 'none'}")
    # then the metrics and reasons of the picked groups only (a version's side may span many runs)
    full = _load_groups(s, run_ids=sorted({run for _, run, _ in picked.values()}),
                        models=sorted({key.model for key, _, _ in picked.values()}), data_dir=data_dir)
    chosen = {row: full[group] for row, group in picked.items()}
    ids = sorted({g.run_id for g in chosen.values()})
    if isinstance(side, CommitSide):
        run = run_info(s, runs[0])
        assert run is not None
        label = f"commit {run.code_version} (run {runs[0]})"
    elif isinstance(side, RunSide):
        run = run_info(s, side.run_id)
        assert run is not None
        label = f"run {side.run_id} ({run.kind}, {run.code_version})"
    else:
        label = f"{side.label} ({_runs_text(ids)})"
    return _Resolved(side, chosen, label, runs)


def _runs_text(ids: Sequence[int]) -> str:
    if not ids:
        return "no runs"
    if len(ids) <= 4:
        return ("run " if len(ids) == 1 else "runs ") + ", ".join(map(str, ids))
    return f"{len(ids)} runs, {ids[0]}..{ids[-1]}"


def _row_sides(s: Db, resolved: _Resolved) -> dict[RowId, RowSide]:
    """Each row's support status and stages (results/queries.py's row_history, judged by results.support.classify
    with the reasons its run recorded) with its metrics."""
    histories: dict[tuple[str, Any, str, str], list[RowStatus]] = {}
    rows = {}
    for row, g in resolved.groups.items():
        k = g.key
        hkey = (k.model, k.precision, k.platform, str(k.toolchain))  # one query for all its variants
        if hkey not in histories:
            histories[hkey] = row_history(s, k.model, k.precision, k.platform, toolchain=str(k.toolchain))
        found = [h for h in histories[hkey] if h.key == k and h.run_id == g.run_id
                 and (h.chosen_versions or "") == g.chosen]
        if len(found) != 1:
            raise BugError(f"row_history gave {len(found)} statuses of {row.text()} in run {g.run_id}; expected 1")
        st = found[0]
        stages = {str(getattr(x, "value", x)): str(getattr(v, "value", v)) for x, v in st.stages.items()}
        support = classify(st, histories[hkey], g.reasons)
        rows[row] = RowSide(g.run_id, support.status.value, stages, g.chosen or None,
                            {m: (v, unit) for m, (v, unit, _, _) in g.metrics.items()}, dict(g.reasons))
    return rows


def _histories(s: Db, a: _Resolved, b: _Resolved, wanted: list[tuple[RowId, MetricKey]],
               ) -> dict[tuple[RowId, MetricKey], list[float]]:
    """Per (row, metric): its passing values on side A's line in the published runs before the later side's run,
    newest first, the last HISTORY_RUNS (see the module doc)."""
    if not wanted:
        return {}
    later = {row: max(a.groups[row].run_id, b.groups[row].run_id) for row, _ in wanted}
    models = sorted({row.key.model for row, _ in wanted})
    where: dict[str, Any] = {"models": models, "before_run": max(later.values())}
    # on the line or not: decided by every result of a group (a quantizer's version is on its quantize stage, which
    # has no metric); the values: its passing results' metrics
    line = {k for k, g in _load_groups(s, facts_only=True, **where).items() if _accepts(a.side, g)}
    groups = _load_groups(s, metrics=sorted({name for _, (_, name) in wanted}), passed_only=True, **where)
    by_row: dict[RowId, list[_Group]] = defaultdict(list)
    for k, g in groups.items():
        if k in line:
            by_row[_row_id(a.side, g)].append(g)
    out: dict[tuple[RowId, MetricKey], list[float]] = {}
    for row, metric in wanted:
        past = sorted((g for g in by_row.get(row, ()) if g.run_id < later[row]), key=lambda g: -g.run_id)
        out[(row, metric)] = [g.metrics[metric][0] for g in past if metric in g.metrics][:HISTORY_RUNS]
    return out


def build_comparison(db: Db, a: Side, b: Side, *, data_dir: Path | None = None) -> Comparison:
    """Resolve two sides in the results database and compare them (ConfigurationError on a bad side); reasons are
    scrubbed (pages.docs_render.scrub: paths under ``data_dir`` relative, hosts and URLs hidden)."""
    slug = comparison_slug(a, b)
    if a == b:
        raise ConfigurationError(f"both sides are {a.label!r}; valid: two different sides")
    with reading(db) as s:
        ra, rb = _resolve(s, a, data_dir), _resolve(s, b, data_dir)
        if isinstance(a, CommitSide | RunSide) and ra.runs == rb.runs:
            raise ConfigurationError(f"{a.label!r} and {b.label!r} are one run ({ra.runs[0]}); valid: two "
                                     "different runs")
        rows_a, rows_b = _row_sides(s, ra), _row_sides(s, rb)
        history = _histories(s, ra, rb, common_metrics(rows_a, rows_b))
        c = compare_rows(ra.label, rb.label, slug, rows_a, rows_b, history)
        return with_bisections(s, c)


def _bisect_key(row: RowId) -> tuple[str, str, str]:
    j = row.to_json()
    return (j["model"], j["precision"], j["platform"])


def with_bisections(s: Db, c: Comparison) -> Comparison:
    """Each regression with its row's latest recorded bisection (``results.bisections``: one line per input
    bisected between the same runs), when it has one."""
    found = latest_bisection_lines(s, [_bisect_key(ch.row) for ch in c.regressions])
    if not found:
        return c
    changed = [replace(ch, bisected=found[_bisect_key(ch.row)])
               if ch.regression and _bisect_key(ch.row) in found else ch for ch in c.changed]
    return replace(c, changed=changed)


# -- rendering ---------------------------------------------------------------------------------------------------------
def fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}"


def fmt_delta(x: float) -> str:
    return f"{x:+.4g}"


def _json_num(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return str(x)


def fmt_rel(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def stage_text(stages: Mapping[str, tuple[str | None, str | None]]) -> str:
    return ", ".join(f"{st}: {a or 'absent'} → {b or 'absent'}" for st, (a, b) in stages.items())


def _md_row(cells: Iterable[object]) -> str:
    return "| " + " | ".join(markdown_text(c) for c in cells) + " |"


_ROW_HEAD = ("model", "precision", "platform", "toolchain", "variant", "versions")


def _row_cells(row: RowId) -> list[str]:
    j = row.to_json()
    return [j["model"], j["precision"], j["platform"], j["job_toolchain"], j["variant"] or "default",
            j["versions"] or "-"]


def render_markdown(c: Comparison, *, generated_at: str, db_label: str) -> str:
    lines = [f"# Compare: {markdown_text(c.title)}", "",
             f"Generated {markdown_text(generated_at)} from the results database ({markdown_text(db_label)}).", "",
             f"- A: {markdown_text(c.a)}", f"- B: {markdown_text(c.b)}", f"- {markdown_text(c.summary())}", "",
             "Noise band: the metric's last passing values for that row on side A's line before the later run; "
             f"median ± {K_MAD:g} x 1.4826 x MAD, at least {MIN_HISTORY} points.", ""]

    def table(title: str, head: Sequence[str], rows: list[list[object]]) -> None:
        lines.extend([f"## {title} ({len(rows)})", ""])
        if not rows:
            lines.extend(["none", ""])
            return
        lines.append(_md_row(head))
        lines.append("|" + "---|" * len(head))
        lines.extend(_md_row(r) for r in rows)
        lines.append("")

    table("Status changes", (*_ROW_HEAD, "A", "B", "stages", "why (B)", "run A", "run B"),
          [[*_row_cells(ch.row), ch.a.verdict, ch.b.verdict + (" (regression)" if ch.regression else ""),
            stage_text(ch.stages), ch.why(), ch.a.run_id, ch.b.run_id] for ch in c.changed])
    table("Rows gained (in B, not in A)", (*_ROW_HEAD, "B", "run B"),
          [[*_row_cells(r), s.verdict, s.run_id] for r, s in c.gained])
    table("Rows lost (in A, not in B)", (*_ROW_HEAD, "A", "run A"),
          [[*_row_cells(r), s.verdict, s.run_id] for r, s in c.lost])
    table("Metric deltas", (*_ROW_HEAD, "stage", "metric", "A", "B", "B - A", "relative", "band", "noise"),
          [[*_row_cells(d.row), d.stage, d.metric, fmt_num(d.a), fmt_num(d.b), fmt_delta(d.delta), fmt_rel(d.relative),
            d.band.text, d.noise] for d in c.deltas])
    return "\n".join(lines)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#202124}table{border-collapse:collapse;"
        "margin-bottom:1.5em}td,th{border:1px solid #ccc;padding:4px 8px;font-size:13px;text-align:left}"
        ".l0_covered,.checkpoint_direct{color:#2e9e44}.implemented{color:#1a73e8}.failing{color:#d1342f}"
        ".waived{color:#a142f4}.skipped{color:#e07b00}.not_applicable,.never_tested{color:#70757a}"
        ".outside{color:#d1342f;font-weight:600}"
        ".regression{background:#fde8e7}")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def _h(value: object) -> str:
    """Text for the HTML page: escaped, control characters (a name's newline or escape sequence) one space."""
    return html.escape(_CONTROL.sub(" ", str(value)))


def render_html(c: Comparison, *, generated_at: str, db_label: str) -> str:
    e = _h
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
             f"<title>Compare: {e(c.title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>Compare: {e(c.title)}</h1>",
             f"<p>Generated {e(generated_at)} from the results database ({e(db_label)}).</p>",
             f"<ul><li>A: {e(c.a)}</li><li>B: {e(c.b)}</li><li>{e(c.summary())}</li></ul>",
             f"<p>Noise band: the metric's last passing values for that row on side A's line before the later run; "
             f"median ± {K_MAD:g} × 1.4826 × MAD, at least {MIN_HISTORY} points.</p>"]

    def status(v: str) -> str:
        return f"<span class='{e(_slug_part(v))}'>{e(v)}</span>"

    def table(title: str, head: Sequence[str], rows: list[tuple[str, list[str]]]) -> None:
        parts.append(f"<h2>{e(title)} ({len(rows)})</h2>")
        if not rows:
            parts.append("<p>none</p>")
            return
        parts.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>")
        parts.extend(f"<tr class='{cls}'>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>" for cls, cells in rows)
        parts.append("</tbody></table>")

    def row(r: RowId) -> list[str]:
        return [e(x) for x in _row_cells(r)]

    table("Status changes", (*_ROW_HEAD, "A", "B", "stages", "why (B)", "run A", "run B"),
          [("regression" if ch.regression else "",
            [*row(ch.row), status(ch.a.verdict), status(ch.b.verdict), e(stage_text(ch.stages)),
             e(ch.why()), e(str(ch.a.run_id)), e(str(ch.b.run_id))]) for ch in c.changed])
    table("Rows gained (in B, not in A)", (*_ROW_HEAD, "B", "run B"),
          [("", [*row(r), status(s.verdict), e(str(s.run_id))]) for r, s in c.gained])
    table("Rows lost (in A, not in B)", (*_ROW_HEAD, "A", "run A"),
          [("", [*row(r), status(s.verdict), e(str(s.run_id))]) for r, s in c.lost])
    table("Metric deltas", (*_ROW_HEAD, "stage", "metric", "A", "B", "B - A", "relative", "band", "noise"),
          [("", [*row(d.row), e(d.stage), e(d.metric), e(fmt_num(d.a)), e(fmt_num(d.b)), e(fmt_delta(d.delta)),
                 e(fmt_rel(d.relative)), e(d.band.text),
                 f"<span class='{'outside' if d.noise == 'outside noise' else ''}'>{e(d.noise)}</span>"])
           for d in c.deltas])
    parts.append("</body></html>\n")
    return "\n".join(parts)


# -- publishing --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PublishedComparison:
    """One published comparison; paths relative to the docs dir."""

    slug: str
    title: str
    summary: str
    generated_at: str

    @property
    def markdown(self) -> str:
        return f"{COMPARE_DIR}/{self.slug}.md"

    @property
    def html(self) -> str:
        return f"{COMPARE_DIR}/{self.slug}.html"


_SLUG = re.compile(r"[a-z0-9_][a-z0-9._-]{0,119}")


def published_comparisons(docs_dir: Path) -> list[PublishedComparison]:
    """The comparisons published under ``docs_dir`` (``compare/index.json``), newest first; those whose pages are
    gone, and a missing or unreadable index, are left out."""
    try:
        data = json.loads((docs_dir / COMPARE_DIR / INDEX_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for item in data if isinstance(data, list) else []:
        try:
            entry = PublishedComparison(str(item["slug"]), str(item["title"]), str(item["summary"]),
                                        str(item["generated_at"]))
        except (KeyError, TypeError):
            continue
        if _SLUG.fullmatch(entry.slug) and (docs_dir / entry.markdown).is_file():
            out.append(entry)
    return sorted(out, key=lambda p: p.generated_at, reverse=True)


def render_index(entries: Sequence[PublishedComparison]) -> str:
    lines = ["# Comparisons", "", "Published by `edgefarm compare`, newest first.", ""]
    if not entries:
        lines.append("none yet")
    for p in entries:
        lines.append(f"- [{markdown_text(p.title)}]({p.slug}.md) ([HTML]({p.slug}.html)), "
                     f"{markdown_text(p.generated_at)}: {markdown_text(p.summary)}")
    return "\n".join(lines) + "\n"


def render_index_html(entries: Sequence[PublishedComparison]) -> str:
    items = "".join(f"<li><a href='{_h(p.slug)}.html'>{_h(p.title)}</a>, {_h(p.generated_at)}: {_h(p.summary)}</li>"
                    for p in entries) or "<li>none yet</li>"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>Comparisons</title><style>{_CSS}</style>"
            f"</head><body><h1>Comparisons</h1><p>Published by <code>edgefarm compare</code>, newest first.</p>"
            f"<ul>{items}</ul></body></html>\n")


def ensure_index(docs_dir: Path) -> list[Path]:
    """``compare/index.md`` and ``.html`` (the pages' "comparisons" links), written when absent ("none yet"), so
    those links resolve before any comparison is published; returns the files written."""
    folder = docs_dir / COMPARE_DIR
    index, index_html = folder / "index.md", folder / "index.html"
    if index.is_file() and index_html.is_file():
        return []
    folder.mkdir(parents=True, exist_ok=True)
    entries = published_comparisons(docs_dir)
    write_text_atomic(index, render_index(entries))
    write_text_atomic(index_html, render_index_html(entries))
    return [index, index_html]


def publish(c: Comparison, docs_dir: Path, *, db_label: str, now: str | None = None) -> list[Path]:
    """Write the comparison's Markdown and HTML pages and refresh the index; returns the files written."""
    generated = now or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    if not _SLUG.fullmatch(c.slug):
        raise BugError(f"bad comparison slug {c.slug!r}")  # comparison_slug makes only good ones
    folder = docs_dir / COMPARE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    md, page = folder / f"{c.slug}.md", folder / f"{c.slug}.html"
    write_text_atomic(md, render_markdown(c, generated_at=generated, db_label=db_label))
    write_text_atomic(page, render_html(c, generated_at=generated, db_label=db_label))
    entries = [p for p in published_comparisons(docs_dir) if p.slug != c.slug]
    entries.insert(0, PublishedComparison(c.slug, c.title, c.summary(), generated))
    entries.sort(key=lambda p: p.generated_at, reverse=True)
    write_text_atomic(folder / INDEX_JSON, json.dumps([{"slug": p.slug, "title": p.title, "summary": p.summary,
                                                        "generated_at": p.generated_at} for p in entries],
                                                      indent=2) + "\n")
    index, index_html = folder / "index.md", folder / "index.html"
    write_text_atomic(index, render_index(entries))
    write_text_atomic(index_html, render_index_html(entries))
    return [md, page, index, index_html]
