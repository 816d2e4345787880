"""Which of our model families the toolchain's default model takes as they are: the one home of that declaration.

tensorrt-edgellm dispatches on ``model_type``: a type its registry (``tensorrt_edgellm.model._MODEL_REGISTRY``) does
not name is loaded into its default model, and its loader skips unknown tensors without a word. So a fallback is
accepted only for a family declared here as layout-identical to that default (the same parameter names and shapes
after the loader's key handling, and the same computation); any other model_type that would fall back is an error
of the registry check. The declaration names the default class it was made against: a release whose default model
is another class takes nothing on trust. Evidence: tests/test_trt_edgellm_bringup.py reconciles a tiny checkpoint of
each declared family cleanly against the installed default model.
"""

from __future__ import annotations

from edgellm.config import ModelConfig
from edgellm.errors import UnsupportedError
from edgellm.models.base import family_for

DEFAULT_MODEL = "tensorrt_edgellm.models.default.modeling_default.CausalLM"
# 0.11.0 registers none of these: Llama, Mistral, Qwen2 and Qwen3 all run on its default CausalLM (the q/k/v bias of
# Qwen2 fills the bias slot its linears keep, the q/k norms of Qwen3 are found from the checkpoint's tensor names).
LAYOUT_IDENTICAL_FAMILIES: frozenset[str] = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def declared_family(config: ModelConfig, default_class: str) -> tuple[str | None, str]:
    """(the family of ours that declares ``config``'s model layout-identical to the toolchain's default model
    ``default_class``, or None; why, in one line naming the valid choices)."""
    declared = ", ".join(sorted(LAYOUT_IDENTICAL_FAMILIES))
    if default_class != DEFAULT_MODEL:
        return None, (f"the toolchain's default model is {default_class}; the families declared layout-identical "
                      f"({declared}) were declared against {DEFAULT_MODEL}")
    try:
        family = family_for(config)
    except UnsupportedError as exc:
        return None, (f"it would fall back to the default model {DEFAULT_MODEL}, and no family of ours declares "
                      f"model_type {config.model_type!r} layout-identical to it ({exc}; declared: {declared})")
    if family.name not in LAYOUT_IDENTICAL_FAMILIES:
        return None, (f"it would fall back to the default model {DEFAULT_MODEL}, and family {family.name} is not "
                      f"declared layout-identical to it (declared: {declared})")
    return family.name, (f"no model of its own; family {family.name} is declared layout-identical to its default "
                         f"model {DEFAULT_MODEL}")
