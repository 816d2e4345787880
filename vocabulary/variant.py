"""What a row asks besides its model: the variant (:class:`Variant`: the weight precision, the LM head's and KV
cache's, and the :class:`Features`), part of every row's key.

One vocabulary, declared here once: the KV-cache and LM-head precisions (edgellm.types), speculative decoding (an
EAGLE3 or MTP draft paired with its base), a LoRA adapter (inserted into the graph or merged into the weights), a
reduced vocabulary, an FP8 embedding table and the components of a multimodal checkpoint. Test lists write it
(``test_lists.schema``), the plan validates it with the toolchain's capabilities
(``toolchains.base.ToolchainDriver.variant_problem``), test ids name it (:meth:`Features.id_tokens`), the results
database stores :func:`variant_key` as a plain string in every result and row (no migration for a new feature) and
pages show :func:`describe`. A default variant's key is the empty string: rows recorded before variants existed
keep their key.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from edgellm.errors import ConfigurationError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision


class _Choice(enum.StrEnum):
    @classmethod
    def parse(cls, value: Any, *, what: str) -> Any:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ConfigurationError(f"unknown {what} {value!r}; valid: {', '.join(m.value for m in cls)}") from None


class SpecMethod(_Choice):
    EAGLE3 = "eagle3"  # a separate draft checkpoint; the base is exported to hand it hidden states
    MTP = "mtp"  # multi-token-prediction layers inside the base checkpoint


class SpecRole(_Choice):
    BASE = "base"  # the target model, exported for its draft
    DRAFT = "draft"  # the draft model; planned after its base and skipped when the base did not pass


class LoraMode(_Choice):
    INSERTED = "inserted"  # the adapter's inputs added to the exported graph (weights swapped at run time)
    MERGED = "merged"  # the adapter merged into the weights before export


class Component(_Choice):
    LLM = "llm"
    VISUAL = "visual"
    AUDIO = "audio"


@dataclass(frozen=True)
class Speculative:
    method: SpecMethod
    role: SpecRole
    pair: str  # the other model of the pair (a catalog name): the draft of a base, the base of a draft

    def __post_init__(self) -> None:
        if self.method is SpecMethod.MTP and self.role is SpecRole.DRAFT:
            raise ConfigurationError("an MTP draft lives inside its base checkpoint: write role base (valid roles "
                                     "for mtp: base)")


@dataclass(frozen=True)
class Lora:
    adapter: str  # a catalog model: a PEFT adapter directory
    rank: int  # the adapter's rank (its adapter_config.json's r), read from the catalog
    mode: LoraMode = LoraMode.INSERTED


@dataclass(frozen=True)
class ReducedVocab:
    vocab: str  # a catalog model: a vocabulary map directory (vocab_map.safetensors)
    size: int  # its reduced vocabulary size


DEFAULT_COMPONENTS: tuple[Component, ...] = (Component.LLM,)


@dataclass(frozen=True)
class Features:
    """The variant's parts beyond the KV-cache and LM-head precisions (which rows carried before these)."""

    speculative: Speculative | None = None
    lora: Lora | None = None
    reduced_vocab: ReducedVocab | None = None
    fp8_embedding: bool = False
    components: tuple[Component, ...] = DEFAULT_COMPONENTS

    def __post_init__(self) -> None:
        if not self.components:
            raise ConfigurationError(f"components is empty; valid: {', '.join(c.value for c in Component)}")
        if len(set(self.components)) != len(self.components):
            raise ConfigurationError(f"components repeat one: {', '.join(c.value for c in self.components)}")
        if Component.LLM not in self.components and (self.lora or self.reduced_vocab or self.fp8_embedding
                                                     or self.speculative):
            raise ConfigurationError("lora, reduced_vocab, fp8_embedding and speculative change the LLM: "
                                     "components must include llm")

    @property
    def plain(self) -> bool:
        return self == PLAIN

    def parts(self) -> list[str]:
        """The canonical parts of the key (stable order; see :func:`variant_key`)."""
        out = []
        if (s := self.speculative) is not None:
            out.append(f"spec={s.method.value}-{s.role.value}:{s.pair}")
        if (lo := self.lora) is not None:
            out.append(f"lora={lo.adapter}:r{lo.rank}:{lo.mode.value}")
        if (rv := self.reduced_vocab) is not None:
            out.append(f"vocab={rv.vocab}:{rv.size}")
        if self.fp8_embedding:
            out.append("fp8emb")
        if self.components != DEFAULT_COMPONENTS:
            out.append("components=" + "+".join(c.value for c in self.components))
        return out

    def part_models(self) -> dict[str, str]:
        """The catalog models a job of this variant reads besides its own checkpoint, by role: ``draft`` (an EAGLE3
        base's draft), ``lora`` (the adapter), ``vocab`` (the vocabulary map)."""
        out = {}
        if (s := self.speculative) is not None and s.method is SpecMethod.EAGLE3 and s.role is SpecRole.BASE:
            out["draft"] = s.pair
        if self.lora is not None:
            out["lora"] = self.lora.adapter
        if self.reduced_vocab is not None:
            out["vocab"] = self.reduced_vocab.vocab
        return out

    def names(self) -> list[str]:
        """The feature names it asks of a toolchain (what ``ToolchainDriver.FEATURES`` declares): e.g.
        ``speculative.eagle3.base``, ``lora.inserted``, ``reduced_vocab``, ``fp8_embedding``, ``components.visual``."""
        out = []
        if (s := self.speculative) is not None:
            out.append(f"speculative.{s.method.value}.{s.role.value}")
        if (lo := self.lora) is not None:
            out.append(f"lora.{lo.mode.value}")
        if self.reduced_vocab is not None:
            out.append("reduced_vocab")
        if self.fp8_embedding:
            out.append("fp8_embedding")
        out += [f"components.{c.value}" for c in self.components if c is not Component.LLM]
        return out

    def id_tokens(self, self_model: str = "") -> list[str]:
        """Test-id tokens (letters, digits, '.', '_' only), after the KV-cache token; ``self_model``: the row's own
        model (an MTP base is its own pair, and the id does not repeat it)."""
        out = []
        if (s := self.speculative) is not None:  # a pair names its other half: two bases of one draft are two ids
            out.append(f"{s.method.value}{s.role.value}" + ("" if s.pair == self_model else f".{_token(s.pair)}"))
        if (lo := self.lora) is not None:
            out.append(f"lora.{lo.mode.value}.r{lo.rank}.{_token(lo.adapter)}")
        if (rv := self.reduced_vocab) is not None:
            out.append(f"vocab{rv.size}.{_token(rv.vocab)}")
        if self.fp8_embedding:
            out.append("fp8emb")
        if self.components != DEFAULT_COMPONENTS:
            out.append("comp." + ".".join(c.value for c in self.components))
        return out

    def to_json(self) -> dict[str, Any]:
        s, lo, rv = self.speculative, self.lora, self.reduced_vocab
        return {
            "speculative": None if s is None else {"method": s.method.value, "role": s.role.value, "pair": s.pair},
            "lora": None if lo is None else {"adapter": lo.adapter, "rank": lo.rank, "mode": lo.mode.value},
            "reduced_vocab": None if rv is None else {"vocab": rv.vocab, "size": rv.size},
            "fp8_embedding": self.fp8_embedding,
            "components": [c.value for c in self.components],
        }


PLAIN = Features()  # the default: no feature


@dataclass(frozen=True)
class Variant:
    """What a row asks of a toolchain besides the model: the weight precision and, when a test names them, the LM
    head's and the KV cache's."""

    precision: Precision
    lm_head: LMHeadPrecision | None = None
    kv_cache: KVCachePrecision | None = None
    features: Features = PLAIN  # speculative decoding, LoRA, reduced vocabulary... (above)

# every feature name a toolchain may declare (Features.names)
FEATURE_NAMES: tuple[str, ...] = (
    *(f"speculative.{m.value}.{r.value}" for m in SpecMethod for r in SpecRole
      if not (m is SpecMethod.MTP and r is SpecRole.DRAFT)),
    *(f"lora.{m.value}" for m in LoraMode), "reduced_vocab", "fp8_embedding",
    *(f"components.{c.value}" for c in Component if c is not Component.LLM),
)

# id tokens a model or case name may not start with (they mark a variant; see test_lists.ids)
ID_TOKEN_PREFIXES = ("eagle3base", "eagle3draft", "mtpbase", "lora.", "vocab", "fp8emb", "comp.")


def _token(name: str) -> str:
    return name.rsplit("/", 1)[-1].replace("-", "_")


def variant_key(lm_head: LMHeadPrecision | None, kv_cache: KVCachePrecision | None,
                features: Features = PLAIN) -> str:
    """The variant as the results database stores it: '' for the default (what every row recorded before variants
    has), else ``;``-joined canonical parts (``kv=fp8;lm=fp16;spec=eagle3-base:DRAFT;...``)."""
    parts = []
    if kv_cache is not None:
        parts.append(f"kv={kv_cache.value}")
    if lm_head is not None:
        parts.append(f"lm={lm_head.value}")
    return ";".join(parts + features.parts())


def variant_json(lm_head: LMHeadPrecision | None, kv_cache: KVCachePrecision | None,
                 features: Features = PLAIN) -> dict[str, Any]:
    """The ``variant`` object of a planned job (``edgefarm nightly --dry-run --format json``)."""
    return {"key": variant_key(lm_head, kv_cache, features),
            "kv_cache": kv_cache and kv_cache.value, "lm_head": lm_head and lm_head.value, **features.to_json()}


def describe(key: str) -> str:
    """A stored key for people: '' reads 'default'; parts joined by ', '."""
    return ", ".join(key.split(";")) if key else "default"
