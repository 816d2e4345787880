"""Checkpoint -> ONNX export: one graph serving prefill and decode, with an explicit KV cache.

Graph signature (L = num_hidden_layers; ``dtype`` = fp32, fp16 or bf16 per the export precision; a quantized
export computes in fp32):

    inputs   input_ids                       int64  [batch, seq]
             attention_mask                  int64  [batch, total]   total = past + seq; 1 real, 0 padding
             position_ids                    int64  [batch, seq]
             past_key_values.{i}.key/value   dtype  [batch, kv_heads, past, head_dim]   i in 0..L-1
             logits_positions                int64  [n]   which of the seq new positions get logits
    outputs  logits                          fp32   [batch, n, vocab]
             present.{i}.key/value           dtype  [batch, kv_heads, total, head_dim]

A sliding-window layer's ``past`` and ``present`` hold its last ``window`` positions at most (``present`` [batch,
kv_heads, min(its past + seq, window), head_dim]; ``edgellm.models.decoder``): its cache never grows past the window.
Decode feeds ``present`` back as ``past``; a fresh sequence feeds ``past`` with length 0. Padding is on the left;
position ids count real tokens only. ``logits_positions`` = 0..seq-1 gives every position's logits; generation
feeds [seq - 1] so a prefill does not run the lm_head over the whole prompt.

Attention is ONNX Runtime's fused ops: ``RotaryEmbedding`` for q and k, and in graphs computing in fp32 (fp32 and
quantized exports) one ``GroupQueryAttention`` per layer (``edgellm.models.decoder``; ONNX Runtime runs it with
several new positions over a past only for batch 1, so the runtime's session runs such a step row by row); fp16
graphs keep the explicit grouped attention, whose mask is a ``Where`` rather than an additive bias.

The graph is traced with its weights as inputs (a small graph); ``onnx_weights.attach_weights`` then writes each
weight once into ``model.onnx.data`` (external data, always; linear weights stored as the checkpoint holds them, [out,
in], read by FusedMatMul(transB=1); a tied embedding stored once) and the model is checked with ``onnx.checker`` (path
form, so the external data is checked too).

The output directory also holds the runtime artifacts (config.json, tokenizer files, generation_config.json when
the checkpoint has one, and ``edgellm_generation.json``, this project's own generation settings) and
``export_manifest.json`` (sha256 of every file, checkpoint digest, precision, opset, versions).
"""

from __future__ import annotations

import io
import logging
import shutil
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgellm import __version__
from edgellm.backends.base import MAX_SEQ_LEN
from edgellm.compiler.files import checkpoint_files, file_table, staged_dir, tree_sha256, write_json
from edgellm.config import ModelConfig, QuantConfig, read_json_object, tokenizer_size_problem
from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.models import family_for
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision

log = logging.getLogger(__name__)

# From a float checkpoint: the decoder is cast whole to this dtype. Which backend builds which is the backend's
# declaration (``EngineBackend.precisions``): bf16 graphs are built by torch-cuda, not by ONNX Runtime's CPU provider.
EXPORT_DTYPES = {Precision.FP32: "float32", Precision.FP16: "float16", Precision.BF16: "bfloat16"}
EXPORT_PRECISIONS = tuple(EXPORT_DTYPES)
OPSET = 17  # a quantization method's lowering may need more (its ``opset``: fp8's float8 Q/DQ needs 19)
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
EXPORT_MANIFEST = "export_manifest.json"
GENERATION_SETTINGS = "edgellm_generation.json"
LOGITS_POSITIONS = "logits_positions"
# The most positions an export's RoPE tables hold unless asked for more (``max_positions``): 4x the longest engine
# the test lists build (8192); the tables of a 10M-position config are gigabytes, the rest of a tiny export kilobytes.
EXPORT_MAX_POSITIONS = 1 << 15
RUNTIME_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja", "generation_config.json")


def rotary_positions(max_position_embeddings: int, max_positions: int = EXPORT_MAX_POSITIONS) -> int:
    """How many positions the export's RoPE tables hold: the config's context bounded by the export's, so a
    10M-position config on a tiny checkpoint exports small (its tables followed the config: 258 MB for 2**23)."""
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or not 1 <= max_positions <= MAX_SEQ_LEN:
        raise ConfigurationError(f"max_positions {max_positions!r}: expected an integer from 1 to {MAX_SEQ_LEN}")
    return min(max_position_embeddings, max_positions)


def input_names(num_layers: int) -> list[str]:
    names = ["input_ids", "attention_mask", "position_ids"]
    for i in range(num_layers):
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    return [*names, LOGITS_POSITIONS]


def output_names(num_layers: int) -> list[str]:
    names = ["logits"]
    for i in range(num_layers):
        names += [f"present.{i}.key", f"present.{i}.value"]
    return names


def export_variant(precision: Precision) -> tuple[LMHeadPrecision, KVCachePrecision]:
    """The LM head and KV cache an export at ``precision`` holds: both at the weights' precision (the decoder is
    cast whole and its cache tensors take the same dtype); a quantized export runs its float parts (the LM head the
    quantizer leaves in float among them) and its cache in fp32."""
    if precision in quantized_export_precisions():
        return LMHeadPrecision.FP32, KVCachePrecision.FP32
    return LMHeadPrecision(precision.value), KVCachePrecision(precision.value)


# LM heads a quantized export makes on request (weight-only, round-to-nearest at export; the checkpoint keeps its
# LM head in float): MatMulNBits 8 / 4 bits (edgellm.compiler.quantized.WeightOnlyLMHead).
QUANTIZED_LM_HEADS = (LMHeadPrecision.INT8_WO, LMHeadPrecision.INT4_WO)


def lm_head_choices(precision: Precision) -> tuple[LMHeadPrecision, ...]:
    """The LM heads an export at ``precision`` can hold, the default first."""
    made = export_variant(precision)[0]
    return (made, *QUANTIZED_LM_HEADS) if precision in quantized_export_precisions() else (made,)


def check_variant(precision: Precision, lm_head: LMHeadPrecision | str | None,
                  kv_cache: KVCachePrecision | str | None) -> tuple[LMHeadPrecision, KVCachePrecision]:
    """The (LM head, KV cache) an export at ``precision`` will hold; asking for another is UnsupportedError."""
    made = export_variant(precision)
    asked = (None if lm_head is None else LMHeadPrecision.parse(lm_head, what="LM-head precision"),
             None if kv_cache is None else KVCachePrecision.parse(kv_cache, what="KV-cache precision"))
    heads = lm_head_choices(precision)
    if asked[0] is not None and asked[0] not in heads:
        raise UnsupportedError(f"LM-head precision {asked[0].value!r} is not supported by export at "
                               f"{precision.value}; supported: {', '.join(h.value for h in heads)}")
    if asked[1] is not None and asked[1] is not made[1]:
        raise UnsupportedError(f"KV-cache precision {asked[1].value!r} is not supported by export at "
                               f"{precision.value}; supported: {made[1].value} (the weights' precision)")
    return asked[0] or made[0], made[1]


def quantized_export_precisions() -> tuple[Precision, ...]:
    """Precisions exported from a checkpoint quantized by ModelOpt: the methods lowered to ONNX Runtime's integer /
    emulated kernels (edgellm/quant), by GEMM kind."""
    from edgellm.quant import exported

    return tuple(Precision(m.name) for m in exported())


def parse_export_precision(value: str | Precision | None) -> Precision | None:
    """None: the checkpoint's own (its quantization method, else fp32)."""
    if value is None:
        return None
    precision = Precision.parse(value, what="precision")
    valid = (*EXPORT_PRECISIONS, *quantized_export_precisions())
    if precision not in valid:
        from edgellm.quant import method

        refused = method(precision.value).refused  # every float precision is exported: this is a method
        why = f" ({refused})" if refused else ""
        raise UnsupportedError(f"precision {precision.value!r} is not supported by export{why}; "
                               f"supported: {', '.join(p.value for p in valid)}")
    return precision


def _resolve_precision(ckpt_dir: Path, quant: QuantConfig, asked: Precision | None) -> tuple[Precision, Any]:
    """The export precision and, for a quantized checkpoint, its validated layout. Every checkpoint is validated as
    inspect does (headers, names and shapes: a second at most) before a byte of its weights is hashed or loaded."""
    from edgellm.checkpoint import Checkpoint
    from edgellm.quant import check_exportable

    quantized = quantized_export_precisions()
    if not quant.is_quantized:
        if asked in quantized:
            raise ConfigurationError(f"{ckpt_dir}: precision {asked.value} needs a checkpoint quantized with it (this "
                                     f"one is not quantized): run tensorrt-edgellm-quantize --quantization "
                                     f"{asked.value} first; a float checkpoint exports as "
                                     f"{', '.join(p.value for p in EXPORT_PRECISIONS)}")
        Checkpoint.open(ckpt_dir).validate()
        return asked or Precision.FP32, None
    ckpt = Checkpoint.open(ckpt_dir)
    ckpt.validate()
    layout = ckpt.reconciliation.quant_layout
    if layout is None:
        raise UnsupportedError(f"{quant.source}: only ModelOpt's unified format is exported among quantized "
                               f"checkpoints")
    check_exportable(layout)
    own = Precision(quant.method.value)
    if asked is not None and asked is not own:
        raise ConfigurationError(f"{ckpt_dir}: checkpoint is quantized {own.value} ({quant.source}); export it "
                                 f"with --precision {own.value} or without --precision, not {asked.value}")
    return own, layout


def export_checkpoint(ckpt_dir: Path, onnx_dir: Path, precision: str | Precision | None = None, *,
                      lm_head_precision: LMHeadPrecision | str | None = None,
                      kv_cache_precision: KVCachePrecision | str | None = None,
                      max_positions: int = EXPORT_MAX_POSITIONS, overwrite: bool = False) -> dict[str, Any]:
    """Export ``ckpt_dir`` to ``onnx_dir``; returns the export manifest. Nothing is written on failure.
    ``precision`` None: the checkpoint's quantization method, else fp32. The RoPE tables hold
    ``min(max_position_embeddings, max_positions)`` positions (``rotary_positions`` in the manifest): an engine
    built from it holds at most that many."""
    import onnx
    import torch

    from edgellm.compiler.onnx_weights import attach_weights
    from edgellm.models.decoder import Decoder
    from edgellm.weights import load_weights

    asked = parse_export_precision(precision)
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise ConfigurationError(f"{ckpt_dir}: checkpoint directory not found")
    cfg = ModelConfig.load(ckpt_dir)
    family = family_for(cfg)
    quant = QuantConfig.load(ckpt_dir, cfg.raw)
    precision, layout = _resolve_precision(ckpt_dir, quant, asked)
    lm_head, kv_cache = check_variant(precision, lm_head_precision, kv_cache_precision)
    if not (ckpt_dir / "tokenizer.json").is_file():
        raise ConfigurationError(f"{ckpt_dir}: tokenizer.json not found (the runtime needs it)")
    if (too_large := tokenizer_size_problem(ckpt_dir / "tokenizer.json")) is not None:
        raise ConfigurationError(too_large)  # before it is copied into the export
    started = time.perf_counter()
    # The checkpoint digest (hashing ~all its bytes) runs beside loading and tracing; hashlib releases the GIL.
    pool = ThreadPoolExecutor(max_workers=1)
    ckpt_files_future = pool.submit(checkpoint_files, ckpt_dir)
    dtype = getattr(torch, EXPORT_DTYPES.get(precision, "float32"))
    opset = OPSET
    if layout is not None:
        from edgellm.compiler.quantized import load_quantized_decoder
        from edgellm.quant import method

        model = load_quantized_decoder(ckpt_dir, cfg, family, layout, dtype=torch.float32, lm_head=lm_head.value)
        opset = max([OPSET, *(method(p.value).opset for p in {lin.precision for lin in layout.quantized})])
    else:
        model = Decoder.from_weights(cfg, family, load_weights(ckpt_dir, family, cfg), dtype=dtype)
    positions = rotary_positions(cfg.max_position_embeddings, max_positions)
    model.use_rotary_tables(positions)  # com.microsoft.RotaryEmbedding, tables as initializers
    if dtype == torch.float32:  # com.microsoft.GroupQueryAttention (its padding mask is additive: fp32 only)
        model.use_fused_attention()
    model.trace_shapes_only()  # the trace needs operations and shapes, not the weights' products

    L = cfg.num_hidden_layers
    ins, outs = input_names(L), output_names(L)
    b, s, past = 1, 2, 3
    args = (torch.ones(b, s, dtype=torch.int64), torch.ones(b, past + s, dtype=torch.int64),
            torch.arange(past, past + s)[None], *[
                torch.zeros(b, cfg.num_key_value_heads, past, cfg.head_dim, dtype=dtype) for _ in range(2 * L)],
            torch.arange(s))
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "total"},
        "position_ids": {0: "batch", 1: "seq"},
        LOGITS_POSITIONS: {0: "logits_len"},
        "logits": {0: "batch", 1: "logits_len"},
    }
    for name in ins[3:-1]:
        dynamic[name] = {0: "batch", 2: "past"}
    for name in outs[1:]:
        dynamic[name] = {0: "batch", 2: "total"}

    with staged_dir(Path(onnx_dir), overwrite=overwrite) as out:
        buf = io.BytesIO()
        weights = dict(model.named_parameters())  # tied weights appear once
        traced = _traced(model, list(weights), 2 * L)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(traced, (*args, *weights.values()), buf, input_names=[*ins, *weights],
                              output_names=outs, dynamic_axes=dynamic, opset_version=opset, dynamo=False,
                              do_constant_folding=False, custom_opsets={"com.microsoft": 1})
        graph = onnx.load_from_string(buf.getvalue())
        data_sha = attach_weights(graph, weights, ins, out / DATA_FILE)
        del model, traced, weights
        onnx.save_model(graph, str(out / MODEL_FILE))
        onnx.checker.check_model(str(out / MODEL_FILE))  # the path form, so the external data is checked too
        export_s = time.perf_counter() - started
        _copy_runtime_files(ckpt_dir, out)
        write_json(out / GENERATION_SETTINGS, generation_settings(ckpt_dir, cfg))
        ckpt_files = ckpt_files_future.result()
        pool.shutdown()
        manifest = {
            "format": "edgellm-export/1",
            "edgellm_version": __version__,
            "torch_version": torch.__version__,
            "onnx_opset": opset,
            "exporter": "torch.onnx.export(dynamo=False), weights as inputs + edgellm attach_weights",
            "precision": precision.value,
            "lm_head_precision": lm_head.value,
            "kv_cache_precision": kv_cache.value,
            **(_quantization_manifest(layout) if layout is not None else {}),
            "checkpoint": {
                "path": str(ckpt_dir.resolve()),
                "sha256": tree_sha256(ckpt_files),
                "dtype": cfg.dtype,
                "files": ckpt_files,
            },
            "model": {**cfg.summary(), "family": family.name, "sliding_window": family.sliding_window(cfg)},
            "rotary_positions": positions,
            "io": {"inputs": ins, "outputs": outs},
            "export_seconds": round(export_s, 3),
            "created_unix": int(time.time()),
            "files": file_table(out, known={DATA_FILE: data_sha}),
        }
        write_json(out / EXPORT_MANIFEST, manifest)
    log.info("exported %s to %s (%s) in %.1f s", ckpt_dir, onnx_dir, precision.value, export_s)
    return manifest


def _quantization_manifest(layout: Any) -> dict[str, Any]:
    from edgellm.quant import declared_gemms, method

    return {"activation_dtype": "fp32",
            "quantization": {**layout.to_json(), "quantized_gemms": declared_gemms(layout),
                             "emulated": any(method(lin.precision.value).emulated for lin in layout.quantized)}}


def _traced(decoder: Any, weight_names: list[str], num_past: int) -> Any:
    """The decoder with ``logits_positions`` and then every weight as positional inputs (the traced signature).
    Weights as inputs keep the tracer's passes (ONNX shape inference among them) from serializing gigabytes."""
    import torch

    params = dict(decoder.named_parameters())
    aliases: dict[str, list[tuple[Any, str]]] = {n: [] for n in weight_names}
    for full, p in decoder.named_parameters(remove_duplicate=False):  # tied weights: every owner
        owner, _, attr = full.rpartition(".")
        first = next(n for n in weight_names if params[n] is p)
        aliases[first].append((decoder.get_submodule(owner), attr))

    class Traced(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = decoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
            past, positions, weights = rest[:num_past], rest[num_past], rest[num_past + 1:]
            saved = []
            for name, w in zip(weight_names, weights, strict=True):
                for module, attr in aliases[name]:
                    saved.append((module, attr, module._parameters[attr]))
                    module._parameters[attr] = w
            try:
                return self.decoder(input_ids, attention_mask, position_ids, *past, logits_positions=positions)
            finally:
                for module, attr, p in saved:
                    module._parameters[attr] = p

    return Traced()


def _copy_runtime_files(ckpt_dir: Path, out: Path) -> None:
    for name in RUNTIME_FILES:
        if (ckpt_dir / name).is_file():
            shutil.copyfile(ckpt_dir / name, out / name)


def generation_settings(ckpt_dir: Path, cfg: ModelConfig) -> dict[str, Any]:
    """What the runtime needs to generate, independent of transformers and onnxruntime-genai."""
    gen: dict[str, Any] = {}
    if (ckpt_dir / "generation_config.json").is_file():
        gen = read_json_object(ckpt_dir / "generation_config.json", what="generation_config.json")
    eos = gen.get("eos_token_id", list(cfg.eos_token_ids))
    eos_ids = [eos] if isinstance(eos, int) else [e for e in eos if isinstance(e, int)] if isinstance(eos, list) else []
    tok_cfg: dict[str, Any] = {}
    if (ckpt_dir / "tokenizer_config.json").is_file():
        tok_cfg = read_json_object(ckpt_dir / "tokenizer_config.json", what="tokenizer_config.json")
    chat_template = tok_cfg.get("chat_template")
    if (ckpt_dir / "chat_template.jinja").is_file():
        chat_template = (ckpt_dir / "chat_template.jinja").read_text()
    pad = gen.get("pad_token_id", cfg.raw.get("pad_token_id"))
    return {
        "eos_token_ids": sorted(set(eos_ids)),
        "bos_token_id": gen.get("bos_token_id", cfg.bos_token_id),
        "pad_token_id": pad if isinstance(pad, int) else (eos_ids[0] if eos_ids else 0),
        "max_position_embeddings": cfg.max_position_embeddings,
        "chat_template": chat_template if isinstance(chat_template, str) else None,
        "special_tokens": {k: _token_text(tok_cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token",
                                                                      "unk_token")},
        "defaults": {k: gen[k] for k in ("do_sample", "temperature", "top_k", "top_p") if k in gen},
    }


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
