"""The job a stage task works on: one test of one model at one precision on one platform (serializable)."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision, Stage
from toolchains.base import Toolchain


@dataclass(frozen=True)
class JobSpec:
    model: str
    precision: Precision
    platform: str
    toolchain: Toolchain
    test_id: str
    checkpoint_dir: str
    max_seq_len: int
    max_batch_size: int
    max_input_len: int
    stages: tuple[Stage, ...]
    timeouts: dict[Stage, int] = field(hash=False, default_factory=dict)
    lm_head_precision: LMHeadPrecision | None = None  # None: whatever the toolchain makes at ``precision``
    kv_cache_precision: KVCachePrecision | None = None

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
