"""Deterministic random checkpoints of real architectures, written by Hugging Face transformers.

Used by the tests, the embedded-default nightly (tiny checkpoints of the families besides the bundled Llama) and
the benchmarks (a random checkpoint with Qwen2.5-0.5B's shape). Weights are random: these checkpoints prove the
pipeline reproduces the reference implementation, not that a model is useful.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from edgellm import BUNDLED_MODEL_DIR
from edgellm.errors import ConfigurationError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Qwen2.5-0.5B's shape (random weights): the benchmark's mid-size model.
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _family(family: str) -> tuple[Any, dict[str, Any]]:
    """The transformers config class and tiny shape a family declares on its class (edgellm/models)."""
    import transformers

    from edgellm.models.base import family_named

    cls = family_named(family)
    if cls.hf_config is None:
        raise ConfigurationError(f"model family {family!r} declares no hf_config: no synthetic checkpoint of it")
    return getattr(transformers, cls.hf_config), dict(cls.tiny_config)


def make_checkpoint(
    out_dir: Path,
    family: str,
    *,
    dtype: str = "fp32",
    tie_word_embeddings: bool = False,
    max_shard_size: str | None = None,
    seed: int = 0,
    tokenizer_from: Path = BUNDLED_MODEL_DIR,
    tokenizer_config: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    """Write a random ``family`` checkpoint to ``out_dir`` (safetensors, config, tokenizer) and return it.

    ``max_shard_size`` (e.g. ``"20KB"``) writes a sharded checkpoint with ``model.safetensors.index.json``.
    ``tokenizer_config``: keys merged into the copied ``tokenizer_config.json`` (e.g. ``{"pad_token": "<unk>"}``:
    transformers' Qwen2 tokenizer otherwise adds ``<|endoftext|>`` as a pad token outside the bundled vocabulary);
    without it the tokenizer files are copied byte for byte.
    The same arguments always give byte-identical tensors.
    """
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    if dtype not in _DTYPES:
        raise ConfigurationError(f"unknown dtype {dtype!r}; valid: {', '.join(_DTYPES)}")
    config_class, tiny = _family(family)
    shape = {**tiny, **overrides}
    cfg = config_class(tie_word_embeddings=tie_word_embeddings, bos_token_id=1, eos_token_id=2,
                                **shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Default init leaves norms at exactly 1 and biases at 0, which would hide a missing norm or bias in the
    # runtime: perturb every parameter so each one matters.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed + 1)
        for _, p in sorted(model.named_parameters()):
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    model = model.to(getattr(torch, _DTYPES[dtype]))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"safe_serialization": True}
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(out_dir, **kwargs)
    _fix_dtype(out_dir / "config.json", _DTYPES[dtype])
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_from) / name
        if src.exists():
            shutil.copyfile(src, out_dir / name)
    if tokenizer_config:
        _merge_json(out_dir / "tokenizer_config.json", tokenizer_config)
    return out_dir


def _merge_json(path: Path, keys: dict[str, Any]) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    data.update(keys)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _fix_dtype(config_path: Path, torch_dtype: str) -> None:
    # transformers 5 omits the dtype for float32; state it so readers never have to guess.
    data = json.loads(config_path.read_text())
    data.setdefault("dtype", torch_dtype)
    data["torch_dtype"] = data["dtype"]
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
