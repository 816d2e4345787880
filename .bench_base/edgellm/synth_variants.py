"""Deterministic tiny checkpoints of row variants, beside a base written by :mod:`edgellm.synth`: an EAGLE3 draft for
a Llama base, a PEFT LoRA adapter, a reduced-vocabulary map and a tiny Qwen2.5-VL.

Layouts are the ones published checkpoints use (EAGLE3 drafts as on the hub: ``midlayer.*``, ``fc``, ``d2t``; PEFT's
``base_model.model.`` keys; TensorRT Edge-LLM's ``vocab_map.safetensors``; Qwen2.5-VL's ``visual.*`` beside
``model.*``). Weights are random and seeded: the same arguments give byte-identical tensors.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from edgellm import BUNDLED_MODEL_DIR
from edgellm.errors import ConfigurationError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
LORA_TARGETS = ("o_proj", "gate_proj", "up_proj", "down_proj")
VOCAB_MAP = "vocab_map.safetensors"  # TensorRT Edge-LLM's names (vocab_reduction/constants.py)
VOCAB_INFO = "reduced_vocab.json"
_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _config(checkpoint: Path) -> dict[str, Any]:
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise ConfigurationError(f"{checkpoint} is not a checkpoint (config.json not found)")
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _text(config: dict[str, Any]) -> dict[str, Any]:
    text: dict[str, Any] = config.get("text_config") or config
    return text


def _head_dim(text: dict[str, Any]) -> int:
    return int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _copy_tokenizer(src: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (Path(src) / name).is_file():
            shutil.copyfile(Path(src) / name, out / name)


def _random(shapes: Mapping[str, tuple[int, ...]], seed: int, *, ones: Sequence[str] = ()) -> dict[str, Any]:
    """fp16 tensors, keys in sorted order so the draw never depends on dict order; a key ending in one of ``ones``
    (norm weights) is 1 + noise."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key in sorted(shapes):
        t = torch.randn(shapes[key], generator=gen) * 0.02
        if key.endswith(tuple(ones)):
            t = t + 1.0
        out[key] = t.to(torch.float16).contiguous()
    return out


# --- EAGLE3 draft


def make_eagle3_draft(base: Path, out: Path, *, seed: int = 0, draft_vocab_size: int | None = None) -> Path:
    """An EAGLE3 draft for the Llama-style ``base``: one ``midlayer`` whose attention reads the token embedding and the
    fused hidden state (in_features ``2*hidden``), ``fc`` fusing the base's three hidden states (``[hidden,
    3*hidden]``), ``lm_head`` over ``draft_vocab_size`` tokens (default: half the base vocabulary, the lowest ids) and
    ``d2t`` mapping them back (``target = i + d2t[i]``: zeros here). Its config names the ``Eagle3`` architecture and
    the base layers it reads, ``[2, n//2, n-3]`` (TensorRT Edge-LLM's default-model choice; n >= 4)."""
    import torch
    from safetensors.torch import save_file

    base, out = Path(base), Path(out)
    text = _text(_config(base))
    n = int(text["num_hidden_layers"])
    if n < 4:
        raise ConfigurationError(f"an EAGLE3 base needs >= 4 decoder layers (it reads layers [2, n//2, n-3]); "
                                 f"{base} has {n}")
    hidden, inter = int(text["hidden_size"]), int(text["intermediate_size"])
    heads, kv = int(text["num_attention_heads"]), int(text.get("num_key_value_heads") or text["num_attention_heads"])
    hd, vocab = _head_dim(text), int(text["vocab_size"])
    draft_vocab = vocab // 2 if draft_vocab_size is None else int(draft_vocab_size)
    if not 0 < draft_vocab <= vocab:
        raise ConfigurationError(f"draft_vocab_size {draft_vocab} must be in 1..{vocab} (the base vocabulary)")
    layers = [2, n // 2, n - 3]
    shapes = {
        "fc.weight": (hidden, 3 * hidden),
        "midlayer.hidden_norm.weight": (hidden,),
        "midlayer.input_layernorm.weight": (hidden,),
        "midlayer.post_attention_layernorm.weight": (hidden,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": (hidden, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, hidden),
        "midlayer.mlp.up_proj.weight": (inter, hidden),
        "midlayer.mlp.down_proj.weight": (hidden, inter),
        "norm.weight": (hidden,),
        "lm_head.weight": (draft_vocab, hidden),
    }
    tensors = _random(shapes, seed, ones=("norm.weight", "layernorm.weight"))
    tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)  # the draft's ids are the base's lowest ids
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "hidden_act": "silu",
        "vocab_size": vocab, "draft_vocab_size": draft_vocab, "target_hidden_size": hidden,
        "target_layer_ids": layers, "max_position_embeddings": int(text.get("max_position_embeddings", 256)),
        "rms_norm_eps": float(text.get("rms_norm_eps", 1e-6)), "rope_theta": float(_rope_theta(text)),
        "tie_word_embeddings": False, "torch_dtype": "float16", "dtype": "float16",
        "bos_token_id": text.get("bos_token_id"), "eos_token_id": text.get("eos_token_id"),
    }
    _write_json(out / "config.json", config)
    _copy_tokenizer(base, out)
    return out


def _rope_theta(text: dict[str, Any]) -> float:
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    return float(text.get("rope_theta") or params.get("rope_theta") or 10000.0)


# --- LoRA adapter


def _linear_shapes(text: dict[str, Any]) -> dict[str, tuple[str, int, int]]:
    """module name -> (its parent in a decoder layer, in_features, out_features)."""
    hidden, inter = int(text["hidden_size"]), int(text["intermediate_size"])
    heads, kv = int(text["num_attention_heads"]), int(text.get("num_key_value_heads") or text["num_attention_heads"])
    hd = _head_dim(text)
    return {"q_proj": ("self_attn", hidden, heads * hd), "k_proj": ("self_attn", hidden, kv * hd),
            "v_proj": ("self_attn", hidden, kv * hd), "o_proj": ("self_attn", heads * hd, hidden),
            "gate_proj": ("mlp", hidden, inter), "up_proj": ("mlp", hidden, inter), "down_proj": ("mlp", inter, hidden)}


def make_lora_adapter(base: Path, out: Path, *, rank: int, seed: int = 0,
                      targets: Sequence[str] = LORA_TARGETS, alpha: int | None = None) -> Path:
    """A PEFT LoRA adapter for every decoder layer of ``base`` on ``targets``: ``adapter_config.json`` (r,
    lora_alpha = ``alpha`` or 2*rank, target_modules) and ``adapter_model.safetensors`` with PEFT's keys
    (``base_model.model.model.layers.N.self_attn.o_proj.lora_A.weight [r, in]``, ``lora_B.weight [out, r]``). B is
    non-zero (PEFT's init leaves it zero), so merging changes the weights by ``B @ A * alpha / r``."""
    from safetensors.torch import save_file

    base, out = Path(base), Path(out)
    if rank < 1:
        raise ConfigurationError(f"LoRA rank must be >= 1, got {rank}")
    text = _text(_config(base))
    linears = _linear_shapes(text)
    unknown = [t for t in targets if t not in linears]
    if unknown or not targets:
        raise ConfigurationError(f"unknown LoRA target modules {unknown or list(targets)}; valid: {', '.join(linears)}")
    shapes = {}
    for layer in range(int(text["num_hidden_layers"])):
        for name in targets:
            parent, fan_in, fan_out = linears[name]
            stem = f"base_model.model.model.layers.{layer}.{parent}.{name}"
            shapes[f"{stem}.lora_A.weight"] = (rank, fan_in)
            shapes[f"{stem}.lora_B.weight"] = (fan_out, rank)
    tensors = {k: (v * 5).contiguous() for k, v in _random(shapes, seed).items()}  # ~N(0, 0.1): a visible delta
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "adapter_config.json", {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base.resolve()),
        "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": sorted(targets), "fan_in_fan_out": False, "inference_mode": True,
    })
    return out


# --- reduced vocabulary


def special_token_ids(checkpoint: Path) -> list[int]:
    """The ids a reduced vocabulary must keep: the config's bos/eos/pad ids (an int or a list) and the tokenizer's
    bos/eos/pad/unk tokens, looked up in its ``tokenizer.json``."""
    checkpoint = Path(checkpoint)
    config = _config(checkpoint)
    ids: set[int] = set()
    for source in (config, _text(config)):
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = source.get(key)
            ids.update(int(v) for v in (value if isinstance(value, list) else [value]) if v is not None)
    tok_cfg, tok_json = checkpoint / "tokenizer_config.json", checkpoint / "tokenizer.json"
    if tok_cfg.is_file() and tok_json.is_file():
        settings = json.loads(tok_cfg.read_text(encoding="utf-8"))
        tokenizer = json.loads(tok_json.read_text(encoding="utf-8"))
        vocab: dict[str, int] = {t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens", [])}
        model_vocab = tokenizer.get("model", {}).get("vocab")
        if isinstance(model_vocab, dict):
            vocab = {**model_vocab, **vocab}
        elif isinstance(model_vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {**{piece[0]: i for i, piece in enumerate(model_vocab)}, **vocab}
        for key in _SPECIAL_TOKENS:
            token = settings.get(key)
            token = token.get("content") if isinstance(token, dict) else token
            if isinstance(token, str) and token in vocab:
                ids.add(int(vocab[token]))
    return sorted(ids)


def make_reduced_vocab(base: Path, out: Path, *, size: int) -> Path:
    """A vocabulary map as ``tensorrt-edgellm-reduce-vocab`` writes it (that tool downloads a dataset): the base's
    special tokens, then its lowest ids, ``size`` in all, sorted, as ``vocab_map.safetensors`` (key ``vocab_map``,
    int32) beside ``reduced_vocab.json`` (``{"vocab_size", "reduced_vocab_size"}``)."""
    import torch
    from safetensors.torch import save_file

    base, out = Path(base), Path(out)
    vocab = int(_text(_config(base))["vocab_size"])
    special = [i for i in special_token_ids(base) if i < vocab]
    if not len(special) <= size < vocab:
        raise ConfigurationError(f"reduced vocabulary size {size} must be below the vocabulary ({vocab}) and hold "
                                 f"the {len(special)} special tokens {special}")
    keep = set(special)
    for i in range(vocab):
        if len(keep) == size:
            break
        keep.add(i)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"vocab_map": torch.tensor(sorted(keep), dtype=torch.int32)}, str(out / VOCAB_MAP))
    _write_json(out / VOCAB_INFO, {"vocab_size": vocab, "reduced_vocab_size": size})
    return out


# --- Qwen2.5-VL

QWEN2_5_VL_TINY: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, max_position_embeddings=256, rope_theta=10000.0, rms_norm_eps=1e-6,
    vision_depth=2, vision_hidden_size=32, vision_num_heads=2, vision_intermediate_size=64, patch_size=14,
    temporal_patch_size=2, spatial_merge_size=2,
    # ids inside the bundled 512-token vocabulary (ordinary pieces there; the runtime only needs them distinct)
    vision_start_token_id=500, vision_end_token_id=501, image_token_id=502, video_token_id=503,
)
_TEXT_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "max_position_embeddings", "rms_norm_eps")
_TOKEN_KEYS = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")


def make_qwen2_5_vl(out: Path, *, seed: int = 0, tokenizer_from: Path = BUNDLED_MODEL_DIR,
                    **overrides: Any) -> Path:
    """A tiny Qwen2.5-VL (``model_type: qwen2_5_vl``): the text model under ``model.``/``lm_head``, the vision tower
    under ``visual.`` (patch embed, ``vision_depth`` blocks, merger to the text hidden size), the hub's layout;
    ``overrides`` change :data:`QWEN2_5_VL_TINY`. The config is built by transformers' ``Qwen2_5_VLConfig`` and the
    weights' shapes are the ones its model declares."""
    import torch
    import transformers
    from safetensors.torch import save_file

    unknown = sorted(set(overrides) - set(QWEN2_5_VL_TINY))
    if unknown:
        raise ConfigurationError(f"unknown Qwen2.5-VL settings {unknown}; valid: {', '.join(QWEN2_5_VL_TINY)}")
    s = {**QWEN2_5_VL_TINY, **overrides}
    vocab = int(s["vocab_size"])
    bad = {k: s[k] for k in _TOKEN_KEYS if not 0 <= int(s[k]) < vocab}
    if bad:
        raise ConfigurationError(f"token ids {bad} outside the vocabulary (0..{vocab - 1})")
    head_dim = int(s["hidden_size"]) // int(s["num_attention_heads"])
    half = head_dim // 2  # mrope splits the rotary half over (temporal, height, width)
    section = [half - 2 * (half // 3), half // 3, half // 3]
    text = {k: s[k] for k in _TEXT_KEYS}
    text.update(rope_parameters={"rope_type": "default", "rope_theta": float(s["rope_theta"]),
                                 "mrope_section": section},
                bos_token_id=1, eos_token_id=2, pad_token_id=None, tie_word_embeddings=False)
    vision = dict(depth=s["vision_depth"], hidden_size=s["vision_hidden_size"], num_heads=s["vision_num_heads"],
                  intermediate_size=s["vision_intermediate_size"], out_hidden_size=s["hidden_size"],
                  patch_size=s["patch_size"], temporal_patch_size=s["temporal_patch_size"],
                  spatial_merge_size=s["spatial_merge_size"], in_channels=3, window_size=0,
                  fullatt_block_indexes=list(range(int(s["vision_depth"]))))
    transformers.utils.logging.disable_progress_bar()
    tokens: dict[str, Any] = {k: int(s[k]) for k in _TOKEN_KEYS}
    cfg = transformers.Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False, **tokens)
    cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    with torch.device("meta"):
        model = transformers.Qwen2_5_VLForConditionalGeneration(cfg)
    shapes = {_hub_key(name): tuple(p.shape) for name, p in model.named_parameters()}
    tensors = _random(shapes, seed, ones=("norm.weight", "layernorm.weight", "ln_q.weight", "norm1.weight",
                                          "norm2.weight"))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_dict()
    config.update(dtype="float16", torch_dtype="float16")
    config["text_config"]["dtype"] = "float16"
    _write_json(out / "config.json", config)
    merge, patch = int(s["spatial_merge_size"]), int(s["patch_size"])
    _write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Qwen2VLImageProcessor", "processor_class": "Qwen2_5_VLProcessor",
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True, "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711], "patch_size": patch,
        "temporal_patch_size": int(s["temporal_patch_size"]), "merge_size": merge,
        "min_pixels": (patch * merge) ** 2 * 4, "max_pixels": (patch * merge) ** 2 * 64,
    })
    _copy_tokenizer(tokenizer_from, out)
    return out


def _hub_key(name: str) -> str:
    # transformers 5 nests both towers under model.; the hub's checkpoints (and NVIDIA's loader) use model.* for the
    # text model and visual.* for the vision tower.
    if name.startswith("model.language_model."):
        return "model." + name.removeprefix("model.language_model.")
    if name.startswith("model.visual."):
        return name.removeprefix("model.")
    return name
