"""What a row's result in one run was made from, as the database records it: the farm's code (the orchestrator's git
revision and source digest), the toolchain versions, the checkpoint's digest; and how the row came out. Two of
these side by side are what ``edgefarm bisect --row`` bisects (``changed``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from edgefarm.results.models import Result, ResultStatus, Run, RunStatus, RunWorker
from edgellm.errors import ConfigurationError


@dataclass(frozen=True)
class RowInputs:
    run_id: int
    code_version: str
    revision: str | None  # the orchestrator's git commit (a trailing -dirty kept), None when not recorded
    source_digest: str | None
    toolchains: dict[str, str] = field(default_factory=dict)
    checkpoint_sha256: str | None = None
    status: str = ""  # fail when any of the row's stages failed or errored, else pass (skips, n/a: their own)
    job_toolchain: str | None = None  # the toolchain the row's job ran (None: several, or not recorded)
    used: tuple[str, ...] = ()  # the toolchains the row's stages ran with (a quantizer's besides the job's)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def row_inputs(db: Engine, run_id: int, model: str, precision: str, platform: str) -> RowInputs:
    """The row's inputs in ``run_id``; an unknown run or a row the run has no result for is ConfigurationError."""
    with db.connect() as c:
        run = c.execute(select(Run.id, Run.code_version).where(Run.id == run_id)).first()
        if run is None:
            raise ConfigurationError(f"run {run_id}: not in the results database; give a run id `edgefarm query` "
                                     f"lists")
        worker = c.execute(select(RunWorker.revision, RunWorker.source_digest, RunWorker.toolchains)
                           .where(RunWorker.run_id == run_id, RunWorker.role == "orchestrator")
                           .order_by(RunWorker.id)).first()
        rows = c.execute(select(Result.status, Result.model_revision, Result.toolchain, Result.toolchain_version,
                                Result.job_toolchain)
                         .where(Result.run_id == run_id, Result.model == model, Result.precision == precision,
                                Result.platform == platform)).all()
    if not rows:
        raise ConfigurationError(f"run {run_id} has no result for row {model} {precision} @{platform}")
    statuses = {r.status for r in rows}
    failed = statuses & {ResultStatus.FAIL, ResultStatus.ERROR}
    status = "fail" if failed else ("pass" if statuses <= {ResultStatus.PASS} else
                                    ",".join(sorted(str(s.value) for s in statuses)))
    toolchains = {r.toolchain: r.toolchain_version for r in rows if r.toolchain_version}
    if worker is not None:
        toolchains = {**{str(k): str(v) for k, v in (worker.toolchains or {}).items()}, **toolchains}
    digests = sorted({r.model_revision for r in rows if r.model_revision})
    jobs = sorted({str(r.job_toolchain) for r in rows if r.job_toolchain})
    return RowInputs(run_id=run_id, code_version=run.code_version,
                     revision=worker.revision if worker is not None else None,
                     source_digest=worker.source_digest if worker is not None else None, toolchains=toolchains,
                     checkpoint_sha256=digests[0] if len(digests) == 1 else None, status=status,
                     job_toolchain=jobs[0] if len(jobs) == 1 else None,
                     used=tuple(sorted({str(r.toolchain) for r in rows if r.toolchain})))


def changed(good: RowInputs, bad: RowInputs) -> dict[str, list[Any]]:
    """What differs between the two sides: {input: [good's, bad's]}."""
    out: dict[str, list[Any]] = {}
    if (good.revision, good.source_digest) != (bad.revision, bad.source_digest):
        out["revision"] = [good.revision, bad.revision]
    for name in sorted(set(good.toolchains) | set(bad.toolchains)):
        if good.toolchains.get(name) != bad.toolchains.get(name):
            out[f"toolchain:{name}"] = [good.toolchains.get(name), bad.toolchains.get(name)]
    if good.checkpoint_sha256 != bad.checkpoint_sha256:
        out["checkpoint_sha256"] = [good.checkpoint_sha256, bad.checkpoint_sha256]
    return out


def newly_failing(db: Engine, run_id: int | None = None) -> tuple[int, int, list[tuple[str, str, str]]]:
    """The rows (model, precision, platform) that fail in nightly ``run_id`` (default: the latest finished nightly)
    and passed in the nightly before it; returns (previous run, run, rows). Fewer than two finished nightlies is
    ConfigurationError."""
    finished = (RunStatus.PASSED, RunStatus.FAILED)
    with db.connect() as c:
        runs = [r.id for r in c.execute(select(Run.id).where(Run.kind == "nightly", Run.status.in_(finished))
                                        .order_by(Run.id.desc()))]
        if run_id is not None:
            if run_id not in runs:
                raise ConfigurationError(f"run {run_id}: no finished nightly run; valid: {', '.join(map(str, runs))}")
            runs = runs[runs.index(run_id):]
        if len(runs) < 2:
            raise ConfigurationError("need two finished nightly runs to find rows that newly fail; found "
                                     f"{len(runs)}")
        now, before = runs[0], runs[1]
        keys = sorted({(r.model, r.precision, r.platform) for r in c.execute(
            select(Result.model, Result.precision, Result.platform).where(Result.run_id == now,
                                                                          Result.status == ResultStatus.FAIL))})
    rows = []
    for key in keys:
        try:
            if row_inputs(db, before, *key).status == "pass":
                rows.append(key)
        except ConfigurationError:  # the row did not run before: not a regression
            continue
    return before, now, rows
