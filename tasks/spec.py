"""The job a stage task works on: one test of one model at one precision on one platform (serializable), and the
one reference by which a checkpoint is known in a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision
from stages import Stage
from toolchains.base import Toolchain


@dataclass(frozen=True)
class CheckpointRef:
    """A checkpoint as every stage knows it: where it is on the orchestrating host and its one digest (the tree
    sha256 of its files, as ``edgellm export`` records it in manifests), computed once per checkpoint per run.
    Cache keys, ``model_revision`` and manifests all carry this digest."""

    model: str
    path: str
    sha256: str


@dataclass(frozen=True)
class JobSpec:
    model: str
    precision: Precision
    platform: str
    toolchain: Toolchain
    test_id: str
    checkpoint: CheckpointRef  # the source checkpoint (quantize returns the one export reads)
    max_seq_len: int
    max_batch_size: int
    max_input_len: int
    stages: tuple[Stage, ...]
    timeouts: dict[Stage, int] = field(hash=False, default_factory=dict)
    lm_head_precision: LMHeadPrecision | None = None  # None: whatever the toolchain makes at ``precision``
    kv_cache_precision: KVCachePrecision | None = None
    chat_template: str | None = None  # the catalog's template for exports whose checkpoint ships none
    thresholds: dict[str, float] = field(hash=False, default_factory=dict)  # the catalog's accuracy limits, if any

    @property
    def quantize_variant(self) -> tuple[str, Precision, LMHeadPrecision | None, KVCachePrecision | None]:
        """What one quantized checkpoint is made for: shared by every toolchain and platform that consumes it."""
        return self.model, self.precision, self.lm_head_precision, self.kv_cache_precision

    @property
    def export_variant(self) -> tuple[str, Precision, Toolchain, LMHeadPrecision | None, KVCachePrecision | None]:
        """What one export is made for: shared by every job (and platform) that asks the same."""
        return self.model, self.precision, self.toolchain, self.lm_head_precision, self.kv_cache_precision

    @property
    def key(self) -> str:
        return f"{self.test_id}@{self.platform}"

    def timeout(self, stage: Stage) -> int:
        return int(self.timeouts.get(stage, 1200))

    @property
    def build_params(self) -> dict[str, int]:
        return {"max_batch_size": self.max_batch_size, "max_input_len": self.max_input_len,
                "max_seq_len": self.max_seq_len}
