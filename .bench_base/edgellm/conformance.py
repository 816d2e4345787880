"""The conformance matrix: every registered family x the config features its published checkpoints use x the dtype a
checkpoint is saved in x the export precision, generated from the registries, never hand-listed. A new family, a
family's new feature, an implemented RoPE scaling type or a new exported quantization method enters the matrix by
being registered.

Features of a family (each a set of config overrides over the family's ``tiny_config``):
    base             the tiny shape as declared (untied embeddings, grouped KV heads)
    tied             tied embeddings (Llama 3.2, Qwen2.5 small, Gemma)
    mha / mqa        one KV head per query head (Llama 2, Phi-3) / one KV head for all
    head_dim         head_dim other than hidden / heads (Qwen3, Gemma)
    sharded          safetensors shards with an index, as every published checkpoint over a few GB
    attention_bias   ``attention_bias: true``: q/k/v/o biases where transformers reads it (Llama, Qwen3), ignored
                     where it does not (Mistral; Qwen2 always has q/k/v biases)
    mlp_bias         ``mlp_bias: true``: MLP biases where transformers reads it (Llama), ignored elsewhere
    rope_<type>      each ``rope_scaling`` type the family implements (``ModelFamily.rope_types``), unless the family
                     gives its own example of it
    <own>            the family's ``conformance_features`` (sliding windows, partial rotary, ...)

Cells, per family (``cells()``):
    structure   every feature x every checkpoint dtype, exported at fp32: greedy equal to transformers over 16 tokens
                and logits within fp32's limits (a RoPE scaling type from the bf16 checkpoint only: it changes the
                fp32 tables alone, which every dtype and precision shares)
    precision   every feature but the RoPE types from its bf16 checkpoint (as published) at each half precision: fp16
                built on ONNX Runtime, bf16 run by the torch-cuda runtime's decoder (on the CPU here), by the
                precision's limits
    quantized   every ModelOpt method edgellm exports and ``edgellm.synth_quant`` writes, from the base checkpoint in
                every dtype, by the method's limits (``edgellm.thresholds``), for each family whose export takes
                quantized checkpoints (``ModelFamily.quantized_export``)

The checks themselves (export, build, eval) are the library's; this module only says what to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgellm.errors import BugError
from edgellm.models.base import ModelFamily, registered_families

CHECKPOINT_DTYPES = ("fp32", "bf16", "fp16")
HALF_PRECISIONS = ("fp16", "bf16")
GREEDY_TOKENS = 16
SHARD_SIZE = "40KB"  # a tiny checkpoint in several shards
QUANT_GROUP_SIZE = 32  # divides every tiny width (hidden 64)

# One published-style example per RoPE scaling type: a type a family declares in ``rope_types`` enters the matrix
# with this example (a declared type without one is a bug the test suite reports).
ROPE_EXAMPLES: dict[str, dict[str, Any]] = {
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    # the short factors over the whole engine (original_max_position_embeddings = the tiny context); filled per head
    # size by rope_example()
    "longrope": {"rope_type": "longrope", "short_factor": None, "long_factor": None},
}


@dataclass(frozen=True)
class Feature:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    max_shard_size: str | None = None
    # a RoPE scaling type changes only the fp32 tables every precision and dtype shares: its structure cell from the
    # bf16 checkpoint (as published) proves it; the others are proven on every dtype and precision by ``base``
    rope: bool = False


@dataclass(frozen=True)
class Cell:
    family: str
    feature: Feature
    dtype: str  # the checkpoint's storage dtype
    precision: str  # the export precision
    kind: str  # structure | precision | quantized

    @property
    def id(self) -> str:
        return f"{self.family}-{self.feature.name}-{self.dtype}-to-{self.precision}"

    @property
    def checkpoint_key(self) -> tuple[str, str, str]:
        """Cells with the same key share one float checkpoint."""
        return self.family, self.feature.name, self.dtype


def rope_example(rope_type: str, family: type[ModelFamily]) -> dict[str, Any]:
    if rope_type not in ROPE_EXAMPLES:
        raise BugError(f"family {family.name!r} implements rope_scaling type {rope_type!r} but edgellm.conformance "
                       f"has no example of it; known: {', '.join(ROPE_EXAMPLES)}")
    example = dict(ROPE_EXAMPLES[rope_type])
    if rope_type == "longrope":
        shape = family.tiny_config
        example["original_max_position_embeddings"] = shape["max_position_embeddings"]
        head_dim = shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"]
        rotary = int(head_dim * float(shape.get("partial_rotary_factor", 1.0)))
        example["short_factor"] = [1.0 + 0.05 * i for i in range(rotary // 2)]
        example["long_factor"] = [1.5 + 0.1 * i for i in range(rotary // 2)]
    return example


def features(family: type[ModelFamily]) -> list[Feature]:
    """The features of ``family`` the matrix crosses with dtypes and precisions (module docstring)."""
    shape = family.tiny_config
    heads = int(shape["num_attention_heads"])
    natural = int(shape.get("head_dim") or shape["hidden_size"] // heads)
    plain = int(shape["hidden_size"]) // heads
    found = [
        Feature("base"),
        Feature("tied", {"tie_word_embeddings": True}),
        Feature("mha", {"num_key_value_heads": heads}),
        Feature("mqa", {"num_key_value_heads": 1}),
        Feature("head_dim", {"head_dim": 3 * plain if natural == 2 * plain else 2 * plain}),
        Feature("sharded", max_shard_size=SHARD_SIZE),
    ]
    # Every family takes the bias flags: those whose transformers model reads them grow biases, the others must ignore
    # them as transformers does (Mistral, Qwen2's MLP).
    found.append(Feature("attention_bias", {"attention_bias": True}))
    found.append(Feature("mlp_bias", {"mlp_bias": True}))
    own: dict[str, dict[str, Any]] = family.conformance_features
    # a rope type the family gives its own published example of (a feature named after it) takes that one
    found += [Feature(f"rope_{t}", {"rope_scaling": rope_example(t, family)}, rope=True) for t in family.rope_types
              if t not in own and f"rope_{t}" not in own]
    found += [Feature(name, dict(overrides)) for name, overrides in sorted(own.items())]
    names = [f.name for f in found]
    if len(set(names)) != len(names):
        raise BugError(f"family {family.name!r}: conformance feature names repeat: {names}")
    return found


def quantized_methods() -> tuple[str, ...]:
    """ModelOpt methods edgellm exports that edgellm.synth_quant writes (a checkpoint in ModelOpt's format)."""
    from edgellm.compiler.export import quantized_export_precisions
    from edgellm.synth_quant import MODELOPT_WRITTEN

    exported = {p.value for p in quantized_export_precisions()}
    return tuple(m for m in MODELOPT_WRITTEN if m in exported)


def cells(families: list[type[ModelFamily]] | None = None) -> list[Cell]:
    """Every cell of the matrix, in a stable order (module docstring)."""
    out: list[Cell] = []
    for family in families if families is not None else registered_families():
        if family.hf_config is None:
            continue  # no synthetic checkpoint of it (edgellm.synth): proven by its own tests
        feats = features(family)
        out += [Cell(family.name, f, d, "fp32", "structure") for f in feats
                for d in (("bf16",) if f.rope else CHECKPOINT_DTYPES)]
        out += [Cell(family.name, f, "bf16", p, "precision") for f in feats if not f.rope for p in HALF_PRECISIONS]
        if family.quantized_export:  # else its export refuses a quantized checkpoint by name (its own tests)
            out += [Cell(family.name, feats[0], d, m, "quantized") for m in quantized_methods()
                    for d in CHECKPOINT_DTYPES]
    return out
