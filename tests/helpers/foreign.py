"""Checkpoints of model families edgellm does not register, written by transformers (tiny, random, deterministic)."""

from __future__ import annotations

from pathlib import Path


def make_olmo2(out_dir: Path, *, num_hidden_layers: int = 1, max_shard_size: str | None = None) -> Path:
    """An ``olmo2`` checkpoint (Olmo2ForCausalLM): q/k norms over whole projections (not per head, as Qwen3's), norms
    after attention and feed-forward and none before them, a layout no registered family has."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg = transformers.Olmo2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=num_hidden_layers,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    transformers.Olmo2ForCausalLM(cfg).save_pretrained(out_dir, **kwargs)
    return Path(out_dir)


def make_granite(out_dir: Path) -> Path:
    """A ``granite`` checkpoint (GraniteForCausalLM): the Llama layout with embedding, residual, attention and logits
    multipliers (config fields no registered family implements: a new structure at the closest-family rung)."""
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    cfg = transformers.GraniteConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=512, max_position_embeddings=256,
                                     embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.015625,
                                     logits_scaling=8.0, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.GraniteForCausalLM(cfg).save_pretrained(out_dir)
    return Path(out_dir)
