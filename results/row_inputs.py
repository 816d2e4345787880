"""What a row's result in one run was made from, as the database records it: the farm's code (the orchestrator's git
revision and source digest), the toolchain versions, the checkpoint's digest; and how the row came out. Two of
these side by side are what ``edgefarm bisect --row`` bisects (``changed``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from edgellm.errors import ConfigurationError
from results.models import Result, ResultStatus, Run, RunWorker


@dataclass(frozen=True)
class RowInputs:
    run_id: int
    code_version: str
    revision: str | None  # the orchestrator's git commit (a trailing -dirty kept), None when not recorded
    source_digest: str | None
    toolchains: dict[str, str] = field(default_factory=dict)
    checkpoint_sha256: str | None = None
    status: str = ""  # fail when any of the row's stages failed or errored, else pass (skips, n/a: their own)

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
        rows = c.execute(select(Result.status, Result.model_revision, Result.toolchain, Result.toolchain_version)
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
    return RowInputs(run_id=run_id, code_version=run.code_version,
                     revision=worker.revision if worker is not None else None,
                     source_digest=worker.source_digest if worker is not None else None, toolchains=toolchains,
                     checkpoint_sha256=digests[0] if len(digests) == 1 else None, status=status)


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
