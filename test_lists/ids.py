"""Compact test ids: ``Model-precision-[lmPREC-]mxslN-mxbsN-mxilN[-extras]``.

Variant features (``vocabulary.variant.Features.id_tokens``: ``eagle3base``, ``lora.inserted.r4.NAME``,
``vocab256.NAME``, ``fp8emb``, ``comp.llm.visual``) follow the KV-cache token.

Model names contain '-' (``Qwen2.5-0.5B-Instruct``, ``Mistral-7B-v0.3``), so two different tests could share an id
if the parts were free text. Extras: ``<prec>kv`` (KV-cache precision, e.g. ``fp8kv``) first, then the toolchain a
matrix block asked for (``by.onnxruntime.genai``: its name, '-' written '.', as one token; none when the
platform's own is meant), then a toolchain version a
matrix chose other than the pinned one (``<toolchain>==0.12.0``: the one place an id holds '='), then the case
name (which may not start with ``by.``).
Model tokens may not look like ``mxslN``/``mxbsN``/``mxilN``/``lmPREC`` and a case name may not start with
``<prec>kv``: the first ``mxslN`` token then marks where the model and precision end, so an id names one test only
(the farm formats ids; nothing reads them back).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from edgefarm.vocabulary.variant import ID_TOKEN_PREFIXES
from edgellm.errors import ConfigurationError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


def _alternatives(enum_cls: type[Precision] | type[LMHeadPrecision] | type[KVCachePrecision]) -> str:
    return "|".join(sorted((re.escape(p.value) for p in enum_cls), key=len, reverse=True))


_KV_RE = re.compile(rf"^(?P<p>{_alternatives(KVCachePrecision)})kv\Z")
_RESERVED_RE = re.compile(rf"^(?:(?:mxsl|mxbs|mxil)[0-9]+|lm(?:{_alternatives(LMHeadPrecision)}))\Z")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9._]+\Z")
_CASE_TOKEN_RE = re.compile(r"^[A-Za-z0-9._]+\Z")
_VERSION_TOKEN_RE = re.compile(r"^[a-z0-9-]+==[A-Za-z0-9.+]+\Z")
_TOOLCHAIN_RE = re.compile(r"^[a-z0-9][a-z0-9-]*\Z")
TOOLCHAIN_MARK = "by."  # an id's toolchain token: by.<name with '-' as '.'>


def model_name_problem(short_name: str) -> str | None:
    """Why ``short_name`` cannot be the model part of a test id, or None when it can."""
    tokens = short_name.split("-")
    if not short_name or any(not t for t in tokens):
        return f"model name {short_name!r} has an empty '-'-separated part"
    for tok in tokens:
        if not _TOKEN_RE.match(tok):
            return f"model name {short_name!r} has characters outside letters, digits, '.', '_', '-' in {tok!r}"
        if _RESERVED_RE.match(tok):
            return f"model name {short_name!r} contains {tok!r}, which test ids reserve for limits/LM-head precision"
    return None


def case_name_problem(case: str) -> str | None:
    """Why ``case`` cannot be a test id's case name, or None when it can."""
    tokens = case.split("-")
    if not case or any(not t for t in tokens):
        return f"case name {case!r} has an empty '-'-separated part"
    for tok in tokens:
        if not _CASE_TOKEN_RE.match(tok):
            return f"case name {case!r} has characters outside letters, digits, '.', '_', '-' in {tok!r}"
    if _KV_RE.match(tokens[0]):
        return f"case name {case!r} may not start with {tokens[0]!r}: ids reserve '<precision>kv' for the KV cache"
    if tokens[0].startswith(TOOLCHAIN_MARK):
        return f"case name {case!r} may not start with {TOOLCHAIN_MARK!r}: ids reserve it for the toolchain"
    if tokens[0].startswith(ID_TOKEN_PREFIXES):
        return (f"case name {case!r} may not start with {tokens[0]!r}: ids reserve "
                f"{', '.join(ID_TOKEN_PREFIXES)} for the variant")
    return None


@dataclass(frozen=True)
class TestId:
    """The parts a compact test id encodes. ``model`` is the short name (after the last '/')."""

    __test__ = False  # not a pytest class

    model: str
    precision: Precision
    max_seq_len: int
    max_batch_size: int
    max_input_len: int
    lm_head_precision: LMHeadPrecision | None = None
    kv_cache_precision: KVCachePrecision | None = None
    case: str | None = None
    toolchain_versions: tuple[str, ...] = ()  # "toolchain==version" of each version chosen other than the pinned
    toolchain: str | None = None  # the toolchain a matrix block asked for
    features: list[str] | tuple[str, ...] = ()  # the variant's tokens (vocabulary.variant.Features.id_tokens)

    def __post_init__(self) -> None:
        problem = model_name_problem(self.model)
        for token in self.toolchain_versions:
            name, _, version = token.partition("==")
            if problem is None and (not name or not version or not _VERSION_TOKEN_RE.match(token)):
                problem = f"toolchain version {token!r} must read 'toolchain==version' (e.g. some-toolchain==1.2.0)"
        if problem is None and self.toolchain is not None and not _TOOLCHAIN_RE.match(self.toolchain):
            problem = f"toolchain {self.toolchain!r} must be a lower-case name (letters, digits, '-')"
        if problem is None and self.case is not None:
            problem = case_name_problem(self.case)
        for label, n in (("max_seq_len", self.max_seq_len), ("max_batch_size", self.max_batch_size),
                         ("max_input_len", self.max_input_len)):
            if problem is None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                problem = f"{label} must be an integer >= 1, got {n!r}"
        if problem:
            raise ConfigurationError(problem)

    def format(self) -> str:
        parts = [self.model, self.precision.value]
        if self.lm_head_precision is not None:
            parts.append(f"lm{self.lm_head_precision.value}")
        parts += [f"mxsl{self.max_seq_len}", f"mxbs{self.max_batch_size}", f"mxil{self.max_input_len}"]
        if self.kv_cache_precision is not None:
            parts.append(f"{self.kv_cache_precision.value}kv")
        parts += list(self.features)
        if self.toolchain is not None:
            parts.append(TOOLCHAIN_MARK + self.toolchain.replace("-", "."))
        parts += self.toolchain_versions
        if self.case is not None:
            parts.append(self.case)
        return "-".join(parts)

    __str__ = format


def short_model_name(model: str) -> str:
    """The part of a Hugging Face id after the last '/' (a local model name is its own short name)."""
    return model.rsplit("/", 1)[-1]
