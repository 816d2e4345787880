"""Regressions: a metric of a finished run outside its row's baseline.

Baseline of (row, stage, test id, metric, bench conditions) = the values of the last ``BASELINE_RUNS`` published
nightly runs before this one where that result passed, the row being (model, precision, platform, job toolchain), so a
metric is only compared with runs of its own toolchain (results/queries.py) and a benchmark only with runs in the
same conditions (power mode, clocks: ``results.bench_conditions``): their median, and their median absolute
deviation (MAD) as a robust spread. A value is flagged when it is worse than the median by more than
``max(K_MAD * 1.4826 * MAD, floor * |median|)`` (the floor keeps a run of identical values from flagging noise).
Accuracy metrics that regress fail the row (the accuracy result becomes ``fail``); performance ones only warn.

A benchmark taken under load (its result carries ``UNDER_LOAD_METRIC`` = 1: other processes took a share of the host
or the memory bandwidth dropped, as ``tasks/bench_load.py`` defines) is unreliable: it is never part of a baseline
(the last ``BASELINE_RUNS`` values are those of results not under load) and never judged itself; ``unreliable``
lists such results of a run instead.

The metric names are those the stage tasks emit (tasks/accuracy.py, tasks/bench.py, tasks/infer.py).
"""

from __future__ import annotations

import enum
import logging
import statistics
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from sqlalchemy import Engine, Select, and_, delete, func, select, update
from sqlalchemy.orm import Session

from edgefarm.results import summaries
from edgefarm.results.db import write_session
from edgefarm.results.models import (
    Metric,
    Regression,
    RegressionSeverity,
    Result,
    ResultStatus,
    RowLatest,
    Run,
    RunKind,
    parse_name,
)
from edgefarm.stages import Stage
from edgellm.errors import ConfigurationError, ErrorKind

log = logging.getLogger(__name__)
BASELINE_RUNS = 7
UNDER_LOAD_METRIC = "bench_under_load"  # 1: the benchmark was taken under load (tasks/bench_load.py), 0: it was not
MIN_BASELINE_RUNS = 3
K_MAD = 3.0
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution x this = its standard deviation


class Direction(enum.StrEnum):
    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


@dataclass(frozen=True)
class MetricRule:
    direction: Direction
    severity: RegressionSeverity
    floor: float  # smallest relative change that counts, whatever the spread


_ACC = RegressionSeverity.FAIL
_PERF = RegressionSeverity.WARN
# The judged metrics: name as emitted by its stage -> rule. Others (sizes, cache hits, lease waits) are not judged.
RULES: dict[str, MetricRule] = {
    "perplexity_ratio": MetricRule(Direction.LOWER_IS_BETTER, _ACC, 0.01),
    "decode_tokens_per_s": MetricRule(Direction.HIGHER_IS_BETTER, _PERF, 0.05),
    "prefill_tokens_per_s": MetricRule(Direction.HIGHER_IS_BETTER, _PERF, 0.05),
    "decode_ms_per_token": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "prefill_ms_per_token": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "decode_peak_rss_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    # the engine's own peak memory (edgellm bench: RSS over its baseline; torch-CUDA: the allocator's peak)
    "prefill_peak_memory_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "decode_peak_memory_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "infer_peak_memory_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "prefill_cuda_peak_allocated_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "decode_cuda_peak_allocated_mb": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "ttft_ms": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
    "infer_ms_per_token": MetricRule(Direction.LOWER_IS_BETTER, _PERF, 0.05),
}


@dataclass(frozen=True)
class Flag:
    """One flagged regression (as stored in the ``regressions`` table)."""

    run_id: int
    model: str
    precision: str  # a Precision, or an UnknownName where a newer farm wrote the row (results.models)
    platform: str
    stage: str  # a Stage, or an UnknownName likewise
    test_id: str
    metric: str
    unit: str
    value: float
    baseline: float
    spread: float
    baseline_runs: int
    previous_run_id: int | None
    change: float  # relative, positive = worse
    severity: RegressionSeverity
    # the toolchain the flagged result's job ran with (its row's): read from that result, not stored with the flag
    job_toolchain: str | None = None

    def describe(self) -> str:
        """``perplexity_ratio 1.3 vs 1.01 (+28.7 %, median of 5 nightly runs; last: run 7)``."""
        rel = (self.value - self.baseline) / max(abs(self.baseline), 1e-12)
        return (f"{self.metric} {self.value:.4g} vs {self.baseline:.4g} ({rel:+.1%}, median of {self.baseline_runs} "
                f"nightly runs; last: run {self.previous_run_id})")


def worse_by(value: float, baseline: float, direction: Direction) -> float:
    """Relative change, positive = worse."""
    delta = baseline - value if direction is Direction.HIGHER_IS_BETTER else value - baseline
    if baseline == 0:
        return float("inf") if delta > 0 else 0.0
    return delta / abs(baseline)


def judge(value: float, history: Sequence[float], rule: MetricRule) -> tuple[float, float, float] | None:
    """(median, MAD, relative change) when ``value`` falls outside the baseline of ``history``, else None."""
    if len(history) < MIN_BASELINE_RUNS:
        return None
    median = statistics.median(history)
    mad = statistics.median(abs(x - median) for x in history)
    delta = median - value if rule.direction is Direction.HIGHER_IS_BETTER else value - median
    allowed = max(K_MAD * MAD_TO_SIGMA * mad, rule.floor * abs(median))
    if delta <= allowed:
        return None
    return median, mad, worse_by(value, median, rule.direction)


def find_regressions(db: Engine | Session, run_id: int, *, runs: int = BASELINE_RUNS) -> list[Flag]:
    """The regressions of ``run_id``'s passing results against the published nightly runs before it."""
    if runs < MIN_BASELINE_RUNS:
        raise ConfigurationError(f"bad baseline run count {runs!r}: need >= {MIN_BASELINE_RUNS}")
    # bench_conditions last: a benchmark is compared only with runs in the same conditions (an unlocked board's
    # numbers never with locked ones; NULL, the declared conditions, with NULL)
    cols = (Result.model, Result.precision, Result.platform, Result.job_toolchain, Result.stage, Result.test_id,
            Metric.name, Result.bench_conditions)
    names = list(RULES)
    reliable = Result.id.not_in(_under_load())  # a benchmark under load is neither judged nor part of a baseline
    current = (select(*cols, Metric.value, Metric.unit).join(Metric, Metric.result_id == Result.id)
               .where(Result.run_id == run_id, Result.status == ResultStatus.PASS, Metric.name.in_(names),
                      reliable))
    ranked = (
        select(*cols, Metric.value, Result.run_id,
               func.row_number().over(partition_by=cols, order_by=Result.run_id.desc()).label("rn"))
        .join(Metric, Metric.result_id == Result.id).join(Run, Run.id == Result.run_id)
        .where(Result.run_id < run_id, Result.status == ResultStatus.PASS, Metric.name.in_(names),
               Run.kind == RunKind.NIGHTLY, Run.published_at.is_not(None), reliable)
        .subquery()
    )
    history: dict[tuple[object, ...], list[tuple[int, float]]] = defaultdict(list)
    with _session(db) as s:
        cur = {tuple(r[:8]): (r[8], r[9]) for r in s.execute(current)}
        if not cur:
            return []
        for row in s.execute(select(ranked).where(ranked.c.rn <= runs)):
            history[tuple(row[:8])].append((row[9], row[8]))
    flags = []
    for key, (value, unit) in sorted(cur.items(), key=lambda kv: tuple(map(str, kv[0]))):
        past = history.get(key, [])
        rule = RULES[str(key[6])]
        verdict = judge(value, [v for _, v in past], rule)
        if verdict is None:
            continue
        median, mad, change = verdict
        model, precision, platform, job_toolchain, stage, test_id, metric, _conditions = key
        flags.append(Flag(run_id, str(model), precision, str(platform), stage, str(test_id),
                          str(metric), unit, value, median, mad, len(past), max(r for r, _ in past), change,
                          rule.severity, job_toolchain))
    return flags


def _under_load() -> Select[tuple[int]]:
    """The ids of results marked as taken under load."""
    return select(Metric.result_id).where(Metric.name == UNDER_LOAD_METRIC, Metric.value >= 0.5)


@dataclass(frozen=True)
class Unreliable:
    """A result of a run taken under load: its judged metrics were not compared with any baseline."""

    model: str
    precision: str
    platform: str
    stage: str
    test_id: str
    device: str | None
    metrics: tuple[str, ...]  # the judged metrics it carries
    reason: str | None  # says what the load was

    def describe(self) -> str:
        return (f"{self.model} {self.precision} {self.platform} {self.stage} {self.test_id} on {self.device}: "
                f"{', '.join(self.metrics)} not judged (taken under load: unreliable)")


def unreliable(db: Engine | Session, run_id: int) -> list[Unreliable]:
    """The results of ``run_id`` taken under load that carry judged metrics: reported as unreliable, not judged."""
    stmt = (select(Result.id, Result.model, Result.precision, Result.platform, Result.stage, Result.test_id,
                   Result.device, Result.reason, Metric.name)
            .join(Metric, Metric.result_id == Result.id)
            .where(Result.run_id == run_id, Result.id.in_(_under_load()), Metric.name.in_(list(RULES)))
            .order_by(Result.id, Metric.name))
    found: dict[int, Unreliable] = {}
    with _session(db) as s:
        for rid, model, precision, platform, stage, test_id, device, reason, metric in s.execute(stmt):
            known = found.get(rid)
            found[rid] = Unreliable(str(model), precision, str(platform), stage, str(test_id), device,
                                    (*known.metrics, str(metric)) if known else (str(metric),), reason)
    return list(found.values())


def _session(db: Engine | Session) -> AbstractContextManager[Session]:
    return nullcontext(db) if isinstance(db, Session) else Session(db)


def flag_regressions(engine: Engine, run_id: int) -> list[Flag]:
    """Find and store ``run_id``'s regressions (replacing earlier ones of that run); an accuracy regression turns
    its result into a ``fail`` naming the change. Call it before the run is finished and published."""
    flags = find_regressions(engine, run_id)
    for result in unreliable(engine, run_id):
        log.warning("run %s: %s", run_id, result.describe())
    with write_session(engine) as s:
        s.execute(delete(Regression).where(Regression.run_id == run_id))
        for f in flags:
            s.add(Regression(**{k: getattr(f, k) for k in _STORED}))
            if f.severity is RegressionSeverity.FAIL:
                s.execute(update(Result).where(
                    Result.run_id == run_id, Result.model == f.model, Result.precision == f.precision,
                    Result.platform == f.platform, Result.stage == f.stage, Result.test_id == f.test_id,
                ).values(status=ResultStatus.FAIL, error_kind=ErrorKind.TEST_FAILURE,
                         reason=f"accuracy regression: {f.describe()}"))
        summaries.refresh_if_published(s, run_id)
    return flags


_STORED = [k for k in Flag.__dataclass_fields__ if k != "job_toolchain"]  # the regressions table's columns


def published_regressions(db: Engine | Session, *, model: str | None = None, platform: str | None = None,
                          run_id: int | None = None, toolchain: str | None = None) -> list[Flag]:
    """The stored regressions of every row's latest published run (or of one run), each with its result's job
    toolchain (``toolchain``: of rows whose jobs ran with it)."""
    r = Regression
    # the flagged result (one per run, model, precision, platform, stage, test id) names the row's toolchain
    flagged = and_(Result.run_id == r.run_id, Result.model == r.model, Result.precision == r.precision,
                   Result.platform == r.platform, Result.stage == r.stage, Result.test_id == r.test_id)
    stmt = select(r, Result.job_toolchain).outerjoin(Result, flagged)
    if run_id is not None:
        stmt = stmt.where(r.run_id == run_id)
    else:
        stmt = stmt.join(RowLatest, (RowLatest.model == r.model) & (RowLatest.precision == r.precision)
                         & (RowLatest.platform == r.platform) & (RowLatest.toolchain == Result.job_toolchain)
                         & (RowLatest.variant == Result.variant) & (RowLatest.run_id == r.run_id))
    if model is not None:
        stmt = stmt.where(r.model == model)
    if platform is not None:
        stmt = stmt.where(r.platform == platform)
    if toolchain is not None:
        stmt = stmt.where(Result.job_toolchain == parse_name("toolchain", toolchain))
    stmt = stmt.order_by(r.model, r.precision, r.platform, Result.job_toolchain, r.stage, r.test_id, r.metric)
    with _session(db) as s:
        return [Flag(**{k: getattr(row, k) for k in _STORED}, job_toolchain=tc) for row, tc in s.execute(stmt)]


def recent_lowest(engine: Engine, device_id: str, metrics: Sequence[str], last: int) -> list[float]:
    """For each of the device's last ``last`` passing bench results not taken under load that recorded one of
    ``metrics``, the lowest of them (in no particular order)."""
    recent = (select(Result.id).where(Result.device == device_id, Result.stage == Stage.BENCH,
                                      Result.status == ResultStatus.PASS, Result.id.not_in(_under_load()))
              .order_by(Result.id.desc()).limit(last).subquery())
    lowest: dict[int, float] = {}
    with engine.connect() as conn:
        for rid, value in conn.execute(select(Metric.result_id, Metric.value)
                                       .where(Metric.result_id.in_(select(recent.c.id)), Metric.name.in_(metrics))):
            lowest[rid] = min(value, lowest.get(rid, value))
    return list(lowest.values())
