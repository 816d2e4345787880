"""The YAML schema of ``test_lists/<name>.yml`` (and of included fragments), as pydantic models.

A list file is validated in parts (header, defaults, each test, each waiver) so one bad entry never hides another.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from edgefarm import stages
from edgefarm.stages import Stage
from edgefarm.test_lists.ids import case_name_problem, model_name_problem, short_model_name
from edgefarm.vocabulary.variant import Component, LoraMode, SpecMethod
from edgellm.backends.base import MAX_BATCH_SIZE, MAX_SEQ_LEN
from edgellm.errors import ConfigurationError
from edgellm.types import UNQUANTIZED, KVCachePrecision, LMHeadPrecision, Precision


class ListStage(enum.StrEnum):
    """How often a list runs: l0 on every change / nightly, l1 less often and wider."""

    L0 = "l0"
    L1 = "l1"


DEFAULT_STAGES: tuple[Stage, ...] = (Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.ACCURACY)
MAX_TIMEOUT = 6000
_MODEL_RE = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*\Z")


def _parser(parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    """A pydantic before-validator from a parse function that raises ConfigurationError naming the valid values."""
    def validate(value: Any) -> Any:
        if not isinstance(value, str):
            return value  # let pydantic report the type
        try:
            return parse(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None

    return validate


def _enum_parser(enum_cls: Any, what: str) -> Callable[[Any], Any]:
    return _parser(lambda value: enum_cls.parse(value, what=what))


PrecisionField = Annotated[Precision, BeforeValidator(_enum_parser(Precision, "precision"))]
LMHeadField = Annotated[LMHeadPrecision, BeforeValidator(_enum_parser(LMHeadPrecision, "LM-head precision"))]
KVCacheField = Annotated[KVCachePrecision, BeforeValidator(_enum_parser(KVCachePrecision, "KV-cache precision"))]
SpecMethodField = Annotated[SpecMethod, BeforeValidator(_enum_parser(SpecMethod, "speculative decoding method"))]
LoraModeField = Annotated[LoraMode, BeforeValidator(_enum_parser(LoraMode, "LoRA mode"))]
ComponentField = Annotated[Component, BeforeValidator(_enum_parser(Component, "component"))]
# any stage of the stage table (a stage a test registers too), not only the recorded ones
StageField = Annotated[str, BeforeValidator(_parser(stages.parse))]
PositiveInt = Annotated[int, Field(strict=True, ge=1)]
SeqLen = Annotated[int, Field(strict=True, ge=1, le=MAX_SEQ_LEN)]  # the library's engine limits
BatchSize = Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH_SIZE)]
TimeoutSeconds = Annotated[int, Field(strict=True, ge=1, le=MAX_TIMEOUT)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
# one number for every stage, or seconds per stage; tagged so an error names only the form that was given
Timeout = Annotated[
    Annotated[TimeoutSeconds, Tag("all_stages")] | Annotated[dict[StageField, TimeoutSeconds], Tag("per_stage")],
    Discriminator(lambda v: "per_stage" if isinstance(v, dict) else "all_stages"),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Selector(_Strict):
    """Which platforms run the list: exact names, fnmatch globs, and labels the chosen devices must carry."""

    terms: list[NonEmptyStr] = []
    wildcards: list[NonEmptyStr] = []
    labels: list[NonEmptyStr] = []

    @model_validator(mode="after")
    def _needs_a_platform(self) -> Selector:
        if not self.terms and not self.wildcards:
            raise ValueError("selects no platform: give at least one of 'terms' (platform names) or 'wildcards'")
        return self


class SpeculativeSpec(_Strict):
    """Speculative decoding: ``{method: eagle3, draft: MODEL}`` (the entry is the base; its draft becomes a second
    row, planned after the base and skipped when the base does not pass) or ``{method: mtp}`` (MTP layers inside
    the base checkpoint)."""

    method: SpecMethodField
    draft: NonEmptyStr | None = None

    @model_validator(mode="after")
    def _draft(self) -> SpeculativeSpec:
        if self.method is SpecMethod.EAGLE3 and self.draft is None:
            raise ValueError("eagle3 needs draft: the catalog model of its EAGLE3 draft checkpoint")
        if self.method is SpecMethod.MTP and self.draft is not None:
            raise ValueError("mtp takes no draft: its MTP layers are inside the base checkpoint")
        return self


class LoraSpec(_Strict):
    """A LoRA adapter (a catalog model holding a PEFT adapter), inserted into the exported graph or merged into the
    weights before export."""

    adapter: NonEmptyStr
    mode: LoraModeField = LoraMode.INSERTED


class _EntryFields(_Strict):
    precision: PrecisionField | None = None
    speculative: SpeculativeSpec | None = None
    lora: LoraSpec | None = None
    reduced_vocab: NonEmptyStr | None = None  # a catalog model holding a vocabulary map (vocab_map.safetensors)
    fp8_embedding: Annotated[bool, Field(strict=True)] | None = None
    components: list[ComponentField] | None = None  # default [llm]
    lm_head_precision: LMHeadField | None = None
    kv_cache_precision: KVCacheField | None = None
    max_seq_len: SeqLen | None = None
    max_batch_size: BatchSize | None = None
    max_input_len: SeqLen | None = None
    stages: list[StageField] | None = None
    timeout: Timeout | None = None


class EntryDefaults(_EntryFields):
    """Values every test of the list (and of its includes) gets unless it sets them itself."""


class TestSpec(_EntryFields):
    """One ``tests:`` entry after its defaults were merged in."""

    __test__ = False  # not a pytest class

    model: NonEmptyStr
    # None: the model's checkpoint is already quantized and its precision is read from it (the validator fills it
    # in from the model catalog, and refuses a row that gives another)
    precision: PrecisionField | None = None
    max_seq_len: SeqLen
    max_batch_size: BatchSize
    max_input_len: SeqLen
    case: NonEmptyStr | None = None
    stages: list[StageField] = list(DEFAULT_STAGES)

    @model_validator(mode="after")
    def _check(self) -> TestSpec:
        problems: list[str] = []
        if not _MODEL_RE.match(self.model):
            problems.append(
                f"model {self.model!r} is neither a Hugging Face id 'org/name' nor a local model name "
                "(letters, digits, '.', '_', '-')"
            )
        elif problem := model_name_problem(short_model_name(self.model)):
            problems.append(problem)
        if self.case is not None and (problem := case_name_problem(self.case)):
            problems.append(problem)
        if self.max_input_len > self.max_seq_len:
            problems.append(f"max_input_len {self.max_input_len} > max_seq_len {self.max_seq_len}")
        problems += stage_problems(self.stages, self.precision)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def timeouts(self) -> dict[str, int]:
        """Seconds per stage this entry runs: one number for all, or per stage over the stage table's defaults."""
        if isinstance(self.timeout, int):
            return {s: self.timeout for s in self.stages}
        given = self.timeout or {}
        defaults = stages.default_timeouts()
        return {s: given.get(s, defaults[s]) for s in self.stages}


def stage_problems(listed: list[str], precision: Precision | None) -> list[str]:
    """Why this stage list cannot run in this order, if it cannot."""
    if not listed:
        return ["stages is empty; give at least one of " + ", ".join(stages.order())]
    order = [stages.rank(s) for s in listed]
    if order != sorted(set(order)):
        want = ", ".join(stages.order())
        return [f"stages {', '.join(listed)} are not in pipeline order ({want}) or repeat one"]
    problems = stages.needs_problems(list(listed))  # quantize may be left out: it runs anyway (implied)
    if Stage.QUANTIZE in listed and precision in UNQUANTIZED:
        problems.append(f"stage quantize makes no sense for precision {precision.value} (it is not quantized)")
    return problems


class ListHeader(_Strict):
    """Top level of a list file; defaults, tests and waivers are validated one by one afterwards."""

    name: NonEmptyStr
    stage: ListStage
    description: NonEmptyStr
    platforms: Selector
    include: list[NonEmptyStr] = []
    defaults: Any = None
    tests: list[Any] = []
    waivers: list[Any] = []


class FragmentHeader(_Strict):
    """An ``include:``-d fragment: shared tests and defaults, nothing else."""

    description: str | None = None
    include: list[NonEmptyStr] = []
    defaults: Any = None
    tests: list[Any] = []


class WaiversHeader(_Strict):
    """``test_lists/waivers.yml``: waivers that apply to every list in its directory."""

    waivers: list[Any] = []
