"""Checkpoints of model families edgellm does not register, written by transformers (tiny, random, deterministic)."""

from __future__ import annotations

from pathlib import Path


def make_gemma3_text(out_dir: Path, *, num_hidden_layers: int = 1, max_shard_size: str | None = None) -> Path:
    """A ``gemma3_text`` checkpoint (Gemma3ForCausalLM): q/k norms like Qwen3, plus pre/post feed-forward norms,
    GELU-tanh and a query scale no registered family has."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg = transformers.Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=num_hidden_layers,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                                        max_position_embeddings=256)
    torch.manual_seed(0)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    transformers.Gemma3ForCausalLM(cfg).save_pretrained(out_dir, **kwargs)
    return Path(out_dir)
