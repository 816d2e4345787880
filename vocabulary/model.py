"""What the farm reads of a model without its weights."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """What a toolchain's kernels care about of a model, read from its config without its weights (the plan asks a
    driver's ``ToolchainDriver.model_problem`` with it, so a model its kernels cannot take is never planned)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    vocab_size: int

    @property
    def q_per_kv(self) -> int:
        """Query heads per KV head (grouped-query attention's group size)."""
        return self.num_attention_heads // max(1, self.num_key_value_heads)
