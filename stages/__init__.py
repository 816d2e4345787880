"""The farm's stages, each declared once: what it needs, where it runs, what runs it, what its cache key is made of,
its default timeout, what one run of it serves and whether the results database records it.

Pipeline order, the DAG ``flows.pipeline`` submits, the timing summary's critical path, default timeouts, the
stages a test list may name and the CLI's progress columns all derive from ``STAGES``. This module imports nothing
else from the farm but the artifact kinds (results/, devices/ and test_lists/ import it); the functions that run a
stage are named where stages run (``tasks.stage_work``).

Adding a stage: one ``register(StageSpec(...))`` here, one module with its work,
``def <name>(ctx, job, *upstream) -> StageOutcome`` (the outcomes of ``needs``, in order), and its entry in
``tasks.stage_work.WORK``. The results database
stores stage names as strings checked against this table (``recorded``): no migration. What the stage runs on a
device, and how its outputs are read, is each toolchain driver's (``toolchains.base.ToolchainDriver``).

Adding a cached stage: the same, plus ``cache=StageCache(...)`` in its entry and a key function in its module (named
by its ``tasks.stage_work`` entry, with the ``verify`` function if it has one); the
generic body (``tasks.common.run_stage``) does the rest, so the module holds no cache code:
  - ``def <name>_key(ctx, job, *upstream) -> Keyed | StageOutcome`` (``stages.outcome.Keyed``): the inputs the key is
    the digest of, whose product the cached artifact is (toolchain and version), and what a hit's outcome records
    (device, route, stand-in). An outcome instead decides the stage without the cache (quantize's identity).
  - the body looks the key up; a hit counts only when it is of the declared kind, once the store has re-hashed its
    blob (a corrupt one is evicted: a miss) and, where its work entry names ``verify``, that says the product is
    still usable (an engine still on its device). A hit's outcome passes, cached, with ``hit_reason``,
    ``hit_metric`` = 1, the entry's toolchain version and the stored artifact as ``outputs[output]`` (and as
    evidence, for a recorded stage); ``Keyed.on_hit`` builds it instead where the artifact is not what the next
    stage reads (a quantizer re-reads its checkpoint's report).
  - on a miss the work runs as ``work(ctx, job, *upstream, keyed=keyed)`` (a host stage's under one of the host's
    slots) and calls ``keyed.made(ref)`` once its product is stored and vouched for; the body remembers it under
    the key (even when the work fails after that), sets ``hit_metric`` = 0 when the product was handed on, and the
    key's toolchain version where the outcome names none.
  - ``cache_key`` names the key's inputs (besides ``"stage"``) that every key has; ``TOOLCHAIN_INPUTS`` last: the
    toolchain's driver adds its own (what its tool depends on). ``tests/test_cache_keys.py`` checks them against
    the keys and pins today's keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgellm.errors import ConfigurationError


class Stage(enum.StrEnum):
    """Names of the pipeline's own recorded stages, in pipeline order (constants for the code that handles them;
    the table below is the vocabulary: a stage added to it needs no member here)."""

    QUANTIZE = "quantize"
    EXPORT = "export"
    BUILD = "build"
    INFER = "infer"
    ACCURACY = "accuracy"
    BENCH = "bench"

    @classmethod
    def parse(cls, value: str | Stage, *, what: str | None = None) -> str:
        """A recorded stage someone named (see :func:`recorded_stage`)."""
        return recorded_stage(value, what=what)


class Where(enum.StrEnum):
    HOST = "host"  # the orchestrating host, under its host slots
    DEVICE = "device"  # a leased device of the job's platform


class Shared(enum.StrEnum):
    """What one run of a stage serves: the jobs that ask the same get the same run (and outcome)."""

    MODEL = "model"  # every job of the model (it reads the source checkpoint only)
    CHECKPOINT = "checkpoint"  # every job of (model, precision, LM head, KV cache), whatever the toolchain
    EXPORT = "export"  # every job of (model, precision, toolchain, LM head, KV cache), whatever the platform
    JOB = "job"  # one job: one test on one platform


@dataclass(frozen=True)
class StageCache:
    """A stage's content cache, looked up and filled by the generic body (see the module doc)."""

    kind: ArtifactKind  # the cached artifact's kind and packing in the store
    packing: Packing
    output: str  # the key of StageOutcome.outputs that hands the product on
    hit_reason: str = "cache hit"
    hit_metric: str = "cache_hit"  # 1 on a hit, 0 when the work handed a new product on


@dataclass(frozen=True)
class StageSpec:
    name: str
    needs: tuple[str, ...]  # stages whose outcomes it reads, in the order its work function takes them
    where: Where
    cache_key: tuple[str, ...]  # the names of its content cache key's inputs (empty: not cached)
    timeout_s: int  # default; a test list may set its own per listed stage
    shared: Shared = Shared.JOB
    implied: bool = False  # runs whenever a stage of the job needs it, listed or not (recorded only if listed)
    cache: StageCache | None = None  # its content cache (with cache_key, and only then)
    recorded: bool = True  # the results database records it (a test list may name only these)


REFERENCE = "reference"  # the transformers reference accuracy compares with: a stage without result rows
TOOLCHAIN_INPUTS = "..."  # in a cache_key: the toolchain's driver adds inputs of its own
STAGES: dict[str, StageSpec] = {}


def register(spec: StageSpec) -> StageSpec:
    """Add a stage to the table; its needs must be registered already (so the table is in a valid order)."""
    spec = dataclasses.replace(spec, name=str(spec.name), needs=tuple(str(n) for n in spec.needs))  # plain names
    if spec.name in STAGES:
        raise ConfigurationError(f"stage {spec.name!r} is registered twice")
    missing = [n for n in spec.needs if n not in STAGES]
    if missing:
        raise ConfigurationError(f"stage {spec.name!r} needs unregistered stage(s) {', '.join(missing)}; "
                                 f"registered: {', '.join(STAGES)}")
    if bool(spec.cache_key) != (spec.cache is not None):
        raise ConfigurationError(f"stage {spec.name!r}: a cached stage (and only one) names its key inputs "
                                 f"(cache_key) and its key function and product (cache=StageCache(...))")
    if spec.cache is not None and not spec.cache.output:
        raise ConfigurationError(f"stage {spec.name!r}: cache.output must name the output that hands the product on "
                                 f"(got {spec.cache.output!r})")
    if spec.timeout_s < 1:
        raise ConfigurationError(f"stage {spec.name!r}: timeout_s must be >= 1, got {spec.timeout_s}")
    STAGES[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove a stage nothing else needs (tests that register a throwaway stage clean up with it)."""
    users = [s.name for s in STAGES.values() if name in s.needs]
    if users:
        raise ConfigurationError(f"stage {name!r} is needed by {', '.join(users)}")
    STAGES.pop(name, None)


def spec(name: str) -> StageSpec:
    try:
        return STAGES[name]
    except KeyError:
        near = difflib.get_close_matches(str(name), STAGES, n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigurationError(f"unknown stage {name!r}{hint}; valid: {', '.join(STAGES)}") from None


def parse(value: str) -> str:
    """A stage name a person gave (a test list's ``stages``): any stage in the table; the pipeline's own as its
    ``Stage``. The error names the bad value and every valid one."""
    name = spec(str(value).strip().lower()).name
    return Stage(name) if name in Stage.__members__.values() else name


def recorded_stage(value: str, *, what: str | None = None) -> str:
    """A stage the results database records (any the table marks ``recorded``), e.g. a result's or a query's; the
    error names the bad value and every valid one."""
    name = str(value).strip().lower()
    found = STAGES.get(name)
    if found is None or not found.recorded:
        raise ConfigurationError(f"unknown {what or 'stage'} {value!r}; valid: {', '.join(recorded_stages())}")
    return Stage(name) if name in Stage.__members__.values() else name


def recorded_stages() -> list[str]:
    """The recorded stages, in pipeline order."""
    return [s.name for s in STAGES.values() if s.recorded]


def order() -> list[str]:
    """Pipeline order: the table's (registration) order, which puts every stage after the ones it needs."""
    return list(STAGES)


def rank(name: str) -> int:
    return order().index(spec(name).name)


def host_stages() -> frozenset[str]:
    return frozenset(s.name for s in STAGES.values() if s.where is Where.HOST)


def default_timeouts() -> dict[str, int]:
    return {s.name: s.timeout_s for s in STAGES.values()}


def closure(listed: Iterable[str]) -> list[str]:
    """Every stage a job with these listed stages runs (its listed ones and what they need), in pipeline order."""
    want: set[str] = set()
    todo = list(listed)
    while todo:
        name = todo.pop()
        if name not in want:
            want.add(name)
            todo += spec(name).needs
    return [s for s in order() if s in want]


def needs_problems(listed: list[str]) -> list[str]:
    """Listed stages whose needs are neither listed nor implied (run anyway), one line each."""
    return [f"stage {name} needs {need}, which is not in stages"
            for name in listed for need in spec(name).needs if need not in listed and not spec(need).implied]


def unlisted_timeout(name: str, timeouts: Mapping[str, int]) -> int:
    """The timeout of a stage a job runs without listing it. An unrecorded one (the reference) spends the budget
    of the first listed stage that needs it (that stage reports its failure); a recorded one, its default."""
    if not spec(name).recorded:
        for user in order():
            if user in timeouts and name in spec(user).needs:
                return timeouts[user]
    return spec(name).timeout_s


def progress_columns(listed: Iterable[Iterable[str]]) -> list[str]:
    """The live progress display's columns: every stage some job lists, in pipeline order."""
    named = {s for stages in listed for s in stages}
    return [s for s in order() if s in named]


def finish_times(durations: Mapping[str, float]) -> Iterator[tuple[str, float]]:
    """(stage, when it would end if nothing waited) for one job's stages: its duration after the latest of its
    needs (a stage the job did not run counts 0). Their maximum is the job's dependent chain."""
    ends: dict[str, float] = {}
    for name in order():
        ends[name] = durations.get(name, 0.0) + max((ends[n] for n in spec(name).needs), default=0.0)
        if name in durations:
            yield name, ends[name]


# Reference CI practice: quantize/export/build 1200 s, inference and scoring up to 6000 s, benchmark 1200 s.
register(StageSpec(
    name=REFERENCE, needs=(), where=Where.HOST,
    cache_key=("format", "checkpoint_sha256", "settings", "edgellm", "edgellm_build", "transformers"),
    cache=StageCache(kind=ArtifactKind.OTHER, packing=Packing.FILE,
                     output="reference", hit_reason="reference cache hit", hit_metric="reference_cache_hit"),
    timeout_s=6000, shared=Shared.MODEL, implied=True, recorded=False))
register(StageSpec(
    name=Stage.QUANTIZE, needs=(), where=Where.HOST,
    cache_key=("checkpoint_sha256", "toolchain", "toolchain_version", TOOLCHAIN_INPUTS),
    cache=StageCache(kind=ArtifactKind.CHECKPOINT, packing=Packing.TAR,
                     output="checkpoint"),
    timeout_s=1200, shared=Shared.CHECKPOINT, implied=True))
register(StageSpec(
    name=Stage.EXPORT, needs=(Stage.QUANTIZE,), where=Where.HOST,
    cache_key=("checkpoint_sha256", "precision", "lm_head_precision", "kv_cache_precision", "toolchain",
               "toolchain_version", TOOLCHAIN_INPUTS),
    cache=StageCache(kind=ArtifactKind.ONNX, packing=Packing.TAR, output="onnx"),
    timeout_s=1200, shared=Shared.EXPORT))
register(StageSpec(
    name=Stage.BUILD, needs=(Stage.EXPORT,), where=Where.DEVICE,
    cache_key=("onnx_sha256", "platform", "toolchain", "toolchain_version", "max_batch_size", "max_input_len",
               "max_seq_len", TOOLCHAIN_INPUTS),
    cache=StageCache(kind=ArtifactKind.ENGINE_MANIFEST, packing=Packing.FILE,
                     output="engine"),
    timeout_s=1200))
register(StageSpec(
    name=Stage.INFER, needs=(Stage.BUILD,), where=Where.DEVICE, cache_key=(),
    timeout_s=6000))
register(StageSpec(
    name=Stage.ACCURACY, needs=(Stage.INFER, REFERENCE), where=Where.DEVICE,
    cache_key=(), timeout_s=6000))
register(StageSpec(
    name=Stage.BENCH, needs=(Stage.BUILD,), where=Where.DEVICE, cache_key=(),
    timeout_s=1200))
