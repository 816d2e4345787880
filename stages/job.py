"""The job a stage task works on: one test of one model at one precision on one platform (serializable), and the
one reference by which a checkpoint is known in a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgefarm import stages
from edgefarm.stages import Shared
from edgefarm.vocabulary.variant import PLAIN, Features, variant_key
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


def chosen_versions(versions: tuple[tuple[str, str], ...]) -> str | None:
    """``name==version, ...`` of toolchain versions a matrix chose; None when it chose none."""
    return ", ".join(f"{t}=={v}" for t, v in versions) or None


PPL_LIMIT_METRIC = "perplexity_rel_limit"  # the accuracy stage's perplexity limit |ratio - 1| <= it, per result
MEMORY_ESTIMATE_METRIC = "memory_estimate_mb"  # the plan's estimate of a row's engine memory (MiB), per result


def estimate_metric(estimate_gb: float | None) -> dict[str, tuple[float, str]]:
    """``{memory_estimate_mb: (MiB, "MiB")}`` for a plan's ``estimate_gb`` (GiB, as ``edgellm.memory.GB``); empty
    for None."""
    return {} if estimate_gb is None else {MEMORY_ESTIMATE_METRIC: (round(estimate_gb * 1024, 1), "MiB")}


def job_key(test_id: str, platform: str) -> str:
    """The one name of a job (a test on a platform) in a run: plans, progress, reports and attempts use it."""
    return f"{test_id}@{platform}"


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
    toolchain: str  # the toolchain the plan chose to run it (a registered name)
    test_id: str
    checkpoint: CheckpointRef  # the source checkpoint (quantize returns the one export reads)
    max_seq_len: int
    max_batch_size: int
    max_input_len: int
    stages: tuple[str, ...]  # the listed ones (recorded); stages.closure adds what they need
    timeouts: dict[str, int] = field(hash=False, default_factory=dict)
    lm_head_precision: LMHeadPrecision | None = None  # None: whatever the toolchain makes at ``precision``
    kv_cache_precision: KVCachePrecision | None = None
    chat_template: str | None = None  # the catalog's template for exports whose checkpoint ships none
    thresholds: dict[str, float] = field(hash=False, default_factory=dict)  # the catalog's accuracy limits, if any
    calibration_samples: int | None = None  # the catalog's calibration rows for its quantizer (None: its default)
    # the versions a matrix chose for toolchains this job uses (empty: each one's pinned version)
    toolchain_versions: tuple[tuple[str, str], ...] = ()
    # resolved by the plan: the toolchain's version on the orchestrating host (its host stages' product), and the
    # toolchain whose quantize stage makes the checkpoint the export reads, with its version (None: the source)
    toolchain_version: str | None = None
    quantizer: str | None = None
    quantizer_version: str | None = None
    # the source checkpoint is already quantized at ``precision``: where that was read (the plan's evidence line);
    # quantize then hands the source on as it is, and never quantizes it again
    prequantized: str | None = None
    # the float checkpoint the accuracy reference is computed from, when it is not the source (a pre-quantized
    # checkpoint's base in the catalog); None: the source
    reference_checkpoint: CheckpointRef | None = None
    features: Features = PLAIN  # the variant beyond KV cache and LM head (vocabulary.variant)
    # the job key of the job this one runs after (an EAGLE3 draft's base): each stage runs once that one's passed
    after: str | None = None
    # the checkpoints its variant reads besides its own, by role (Features.part_models: draft, lora, vocab)
    parts: tuple[tuple[str, CheckpointRef], ...] = ()
    # the plan's estimate of the engine's memory on its platform (devices.memory_fit; None: not sized): recorded
    # with each stage's metrics as ``memory_estimate_mb`` so the pages show it beside the measured peak
    memory_estimate_gb: float | None = field(default=None, hash=False, compare=False)

    def part(self, role: str) -> CheckpointRef | None:
        return dict(self.parts).get(role)

    @property
    def variant(self) -> str:
        """The row's variant key (what the results database stores)."""
        return variant_key(self.lm_head_precision, self.kv_cache_precision, self.features)

    @property
    def reference_source(self) -> CheckpointRef:
        """The checkpoint the transformers reference reads: the float base of a pre-quantized one, else the
        source."""
        return self.reference_checkpoint if self.reference_checkpoint is not None else self.checkpoint

    @property
    def estimate_metrics(self) -> dict[str, tuple[float, str]]:
        """The plan's memory estimate as a metric of the row (none when the plan could not size it)."""
        return estimate_metric(self.memory_estimate_gb)

    @property
    def chosen_versions(self) -> str | None:
        """What the results database records of them (``Result.chosen_versions``)."""
        return chosen_versions(self.toolchain_versions)

    @property
    def pins(self) -> dict[str, str]:
        """The versions chosen for the toolchains it uses (what drivers take to drive them)."""
        return dict(self.toolchain_versions)

    @property
    def quantize_variant(self) -> tuple[str, Precision, LMHeadPrecision | None, KVCachePrecision | None, str | None]:
        """What one quantized checkpoint is made for, and by whom: shared by every toolchain and platform that
        consumes it."""
        return self.model, self.precision, self.lm_head_precision, self.kv_cache_precision, self.quantizer

    @property
    def export_variant(self) -> tuple[str, Precision, str, LMHeadPrecision | None, KVCachePrecision | None, Features]:
        """What one export is made for: shared by every job (and platform) that asks the same."""
        return self.model, self.precision, self.toolchain, self.lm_head_precision, self.kv_cache_precision, \
            self.features

    @property
    def key(self) -> str:
        return job_key(self.test_id, self.platform)

    def timeout(self, stage: str) -> int:
        given = self.timeouts.get(stage)
        return int(given) if given is not None else stages.unlisted_timeout(stage, self.timeouts)

    def share(self, shared: Shared) -> tuple[object, ...]:
        """The jobs that get the same run of a stage shared this way have the same key."""
        if shared is Shared.MODEL:
            return (self.model,)
        if shared is Shared.CHECKPOINT:  # two versions of the quantizer make two checkpoints
            return (*self.quantize_variant, self.toolchain_versions)
        if shared is Shared.EXPORT:
            return (*self.export_variant, self.toolchain_versions)
        return (self.key,)

    @property
    def build_params(self) -> dict[str, int]:
        return {"max_batch_size": self.max_batch_size, "max_input_len": self.max_input_len,
                "max_seq_len": self.max_seq_len}
