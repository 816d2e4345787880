"""What a toolchain's host stage (quantize, export) gets from the farm (``toolchains.base.HostWork``, made here):
scratch and log dirs on the orchestrating host, the artifact store, this host's copies of quantized checkpoints, the
stage's timeout and the host settings. A driver receives one and never opens the farm itself.

Quantized checkpoints: a quantizer stores its product as a directory ``{checkpoint/, quantize.json, ...}`` in the
artifact store (``quantize.json`` records at least the checkpoint's tree sha256 under ``checkpoint_sha256``); the
export reads it from ``<data dir>/host/checkpoints/<artifact sha256>/checkpoint``, whose tree digest is checked
against that record each time it is handed out.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefarm.artifacts.inuse import held_dir, remove_stale
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.stages.job import JobSpec
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.toolchains.base import QUANTIZE_RECORD
from edgellm.errors import TestFailure
from edgellm.reference import checkpoint_digest

log = logging.getLogger(__name__)
STAGING_PREFIX = "."  # entries of host/checkpoints/ being extracted or dropped (swept when their owner died)


@dataclass(frozen=True)
class FarmHostWork:
    """``toolchains.base.HostWork`` on the farm's data dir and store, for one job's stage."""

    ctx: FarmContext
    job: JobSpec
    stage: str

    @property
    def farm(self) -> Farm:
        return Farm.get(self.ctx)

    @property
    def data_dir(self) -> Path:
        return Path(self.ctx.data_dir)

    @property
    def quantize_device(self) -> str:
        """The quantizer's device on this host (cpu, or cuda on a host with a GPU)."""
        return self.ctx.quantize_device

    @property
    def max_unquantized_share(self) -> float:
        return self.ctx.max_unquantized_share

    @property
    def timeout(self) -> int:
        return self.job.timeout(self.stage)

    def scratch(self, prefix: str) -> AbstractContextManager[Path]:
        """A fresh directory under ``<data dir>/host/scratch``, marked in use while the block runs (gc spares it;
        what a killed run left is swept) and removed when it ends."""
        return held_dir(self.ctx.scratch_dir, prefix)

    def log_path(self, name: str) -> Path:
        """Where a tool's log of this run goes (stored as evidence by the stage)."""
        logs = self.ctx.host_work_dir / "logs" / f"run-{self.ctx.run_id}"
        logs.mkdir(parents=True, exist_ok=True)
        return logs / name

    def put(self, data: Path | bytes, kind: ArtifactKind) -> ArtifactRef:
        return self.farm.store.put(data, kind)

    def extract(self, sha256: str, dest: Path) -> None:
        self.farm.store.extract(sha256, dest)

    # --- quantized checkpoints on this host ---

    def _checkpoints(self) -> Path:
        return self.ctx.host_work_dir / "checkpoints"

    def install_checkpoint(self, ref: ArtifactRef, made: Path) -> None:
        """Put a just-made quantizer product where export reads it (a move: its content is the stored blob's)."""
        dest = self._checkpoints() / ref.sha256
        if dest.exists():
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(made, dest)
        except OSError:  # another run installed it meanwhile; it is checked when handed out
            if not dest.exists():
                raise

    def materialize_checkpoint(self, ref: ArtifactRef) -> tuple[Path, dict[str, Any]]:
        """The stored quantizer product on this host (extracted, verified, when absent or altered) and its record."""
        dest = self._checkpoints() / ref.sha256
        if dest.is_dir():
            record = _record(dest)
            if record is not None and checkpoint_digest(dest / "checkpoint") == record.get("checkpoint_sha256"):
                return dest, record
            log.warning("quantized checkpoint %s was altered on this host: extracting it again", dest)
            with held_dir(dest.parent, f"{STAGING_PREFIX}{ref.sha256[:12]}.stale.") as stale:
                os.replace(dest, stale / "old")
        with held_dir(dest.parent, f"{STAGING_PREFIX}{ref.sha256[:12]}.") as staging:
            self.farm.store.extract(ref.sha256, staging / "q")  # verified against its sha256 while it is read
            try:
                os.replace(staging / "q", dest)
            except OSError:  # extracted by a concurrent run meanwhile; checked below
                if not dest.is_dir():
                    raise
        record = _record(dest)
        if record is None or checkpoint_digest(dest / "checkpoint") != record.get("checkpoint_sha256"):
            raise TestFailure(f"stored quantized checkpoint sha256:{ref.sha256} does not match its own record")
        return dest, record


def sweep_dead_work(data_dir: Path) -> list[Path]:
    """What runs that died left on this host: scratch entries and checkpoint extractions whose owner is gone (its
    in-use mark died with it), whatever their age. A live run's are marked, so they are never swept."""
    ctx = FarmContext(run_id=0, db_url="", data_dir=str(data_dir), inventory_dir="")
    return [*remove_stale(ctx.scratch_dir, "*", 0),
            *remove_stale(ctx.host_work_dir / "checkpoints", f"{STAGING_PREFIX}*", 0)]


def _record(directory: Path) -> dict[str, Any] | None:
    path = directory / QUANTIZE_RECORD
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None
