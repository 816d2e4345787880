"""Where an artifact is recorded (``edgefarm show``): every record of an artifact whose sha256 starts with a prefix,
with the result that refers to it; typed rows only."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import select

from edgefarm.results.db import Db, reading
from edgefarm.results.models import ArtifactRecord, Result


class ArtifactReference(NamedTuple):
    """One record of an artifact: its run and, for a stage's artifact, its result (names as plain strings)."""

    run_id: int
    kind: str
    packing: str
    size: int
    path_hint: str | None = None
    model: str | None = None
    precision: str | None = None
    platform: str | None = None
    stage: str | None = None
    test_id: str | None = None


def artifact_references(db: Db, prefix: str) -> dict[str, list[ArtifactReference]]:
    """Every recorded artifact whose sha256 starts with ``prefix`` (is it, for 64 hex digits), by sha256, each with
    its records in run order."""
    a = ArtifactRecord
    stmt = (select(a.sha256, a.run_id, a.kind, a.packing, a.size, a.path_hint, Result.model, Result.precision,
                   Result.platform, Result.stage, Result.test_id)
            .outerjoin(Result, Result.id == a.result_id)
            .where(a.sha256 == prefix if len(prefix) == 64 else a.sha256.startswith(prefix, autoescape=True))
            .order_by(a.run_id, a.id))
    found: dict[str, list[ArtifactReference]] = {}
    with reading(db) as s:
        for sha, run_id, kind, packing, size, hint, model, precision, platform, stage, test_id in s.execute(stmt):
            found.setdefault(sha, []).append(ArtifactReference(
                run_id, str(getattr(kind, "value", kind)), str(getattr(packing, "value", packing)), int(size), hint,
                model, None if precision is None else str(precision), platform,
                None if stage is None else str(stage), test_id))
    return found
