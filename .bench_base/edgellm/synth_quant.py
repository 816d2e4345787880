"""ModelOpt unified checkpoints (and Hugging Face GPTQ ones) made by round-to-nearest from a float checkpoint, in
seconds: for benchmarks and tests.

NVIDIA's quantizer (``tensorrt-edgellm-quantize``) calibrates with the model on the CPU, which takes close to an hour
for int4_awq on a 0.5B model here. A decode benchmark needs the real file layout and kernels, not calibrated weights,
so this writes exactly the files the quantizer writes (``config.json`` with ``quantization_config``,
``hf_quant_config.json``, one ``model.safetensors``, ``generation_config.json``, the tokenizer files), with the same
tensor names, dtypes and shapes (float tensors fp16, scales fp32, ``lm_head`` and the embedding excluded):

    W4A16_AWQ             weight U8 [out/2, in] (signed int4, output row 2r in the low nibble), weight_scale F32
                          [out, ceil(in/group)] = block amax / 7, pre_quant_scale F16 [in]
    W8A8_SQ_PER_CHANNEL   weight I8 [out, in], weight_scale F32 [out] = row amax / 127, input_scale F32 [] =
                          activation amax / 127 (static), pre_quant_scale F16 [in]

Hugging Face's GPTQ layout (``int4_gptq``; what AutoGPTQ / GPTQModel write, and what NVIDIA's exporter reads as
int4_gptq: no ``hf_quant_config.json``, ``config.json``'s ``quantization_config`` with ``quant_method: gptq``, bits 4,
sym, no act-order), round-to-nearest without GPTQ's Hessian updates (its file layout, not its algorithm), every
linear but ``lm_head``:

    int4_gptq             qweight I32 [in/8, out] (eight unsigned nibbles along the input, input row 8r+i at bits
                          4i), qzeros I32 [in/group, out/8] (zero 8 stored as 7: AutoGPTQ's zero - 1, nibbles along
                          the output), scales F16 [in/group, out] = block amax / 7, g_idx I32 [in] = row // group;
                          a linear's bias stays float

Smoothing (int4_awq, int8_sq): per input channel j, ``s_j = sqrt(act_amax_j / w_amax_j)`` normalized to geometric
mean 1 (the SmoothQuant / AWQ form with alpha 0.5, no search); the stored weight is ``W * s`` and ``pre_quant_scale
= 1 / s`` (rounded to fp16 first, so the product is exact before the weight's rounding). The activation statistics
come from one forward pass of transformers over ``calibration_ids`` (one batch, no search: not a calibration for
accuracy). The producer is named ``edgellm.synth_quant`` in both quantization configs, so ``edgellm inspect`` tells
it apart.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgellm import __version__
from edgellm.errors import ConfigurationError
from edgellm.quant import method
from edgellm.synth import TOKENIZER_FILES

QUANTIZER_NAME = "synthetic RTN in ModelOpt format"
PRODUCER = {"name": "edgellm.synth_quant", "version": __version__}
MODELOPT_WRITTEN = ("int4_awq", "int8_sq")  # in ModelOpt's layout; their quant_algo is the method's own
HF_WRITTEN = ("int4_gptq",)  # in Hugging Face's layout of the method (config.json quantization_config only)
WRITTEN = (*MODELOPT_WRITTEN, *HF_WRITTEN)  # the methods this writer implements (below)
QUANT_ALGOS = {name: method(name).modelopt_algos[0] for name in MODELOPT_WRITTEN}
GPTQ_STORED_ZERO = 7  # AutoGPTQ stores zero - 1: a symmetric zero point of 8 reads 0x77777777
EXCLUDED = ("lm_head", "model.embed_tokens")  # what ModelOpt leaves in float for these methods
RUNTIME_FILES = ("generation_config.json", *TOKENIZER_FILES)
FP16_TINY, FP16_MAX = 2.0**-14, 65504.0  # fp16's smallest normal and largest finite values


def quantize_rtn(src: Path, out: Path, method: str, calibration_ids: Sequence[int], *,
                 group_size: int = 128) -> Path:
    """Write ``src`` (a float Hugging Face checkpoint) quantized with ``method`` (int4_awq | int8_sq | int4_gptq) to
    ``out`` (``calibration_ids`` are read by the smoothed methods only)."""
    import torch
    from safetensors.torch import save_file

    from edgellm.checkpoint.modelopt import linear_modules
    from edgellm.config import ModelConfig
    from edgellm.models import family_for
    from edgellm.weights import load_weights

    if method not in WRITTEN:
        raise ConfigurationError(f"synthetic quantization {method!r} is not written; valid: {', '.join(WRITTEN)}")
    src, out = Path(src), Path(out)
    cfg = ModelConfig.load(src)
    family = family_for(cfg)
    linears = {m: shape for m, shape in linear_modules(family, cfg).items() if m not in EXCLUDED}
    if method in HF_WRITTEN:
        return _write_gptq(src, out, cfg, load_weights(src, family, cfg), set(linears), group_size)
    act_amax = _activation_amax(src, list(linears), calibration_ids)
    state = load_weights(src, family, cfg)
    # int8_sq: linears reading one input (q/k/v, gate/up) share pre_quant_scale and input_scale, as ModelOpt's
    # export resmooths them; int4_awq keeps one per linear (ModelOpt writes them so).
    w_amax: dict[str, torch.Tensor] = {}
    for group in _input_groups(list(linears), act_amax) if method == "int8_sq" else [[m] for m in linears]:
        shared = torch.stack([state[f"{m}.weight"].float().abs().amax(dim=0) for m in group]).amax(dim=0)
        w_amax.update({m: shared for m in group})
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        module = name.removesuffix(".weight")
        if module in linears and name.endswith(".weight"):
            tensors.update(_quantize_linear(module, t.float(), act_amax[module], w_amax[module], method,
                                            group_size))
        elif name != "lm_head.weight" or not cfg.tie_word_embeddings:
            tensors[name] = t.to(torch.float16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    quant: dict[str, Any] = {"quant_algo": QUANT_ALGOS[method], "kv_cache_quant_algo": None}
    if method == "int4_awq":
        quant.update({"group_size": group_size, "has_zero_point": False, "pre_quant_scale": True})
    quant["exclude_modules"] = list(EXCLUDED)
    (out / "hf_quant_config.json").write_text(json.dumps({"producer": PRODUCER, "quantization": quant}, indent=4))
    config = json.loads((src / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "float16"
    config["quantization_config"] = {"ignore": list(EXCLUDED), "quant_algo": QUANT_ALGOS[method],
                                     "producer": PRODUCER, "quant_method": "modelopt"}
    (out / "config.json").write_text(json.dumps(config, indent=4, sort_keys=True))
    for name in RUNTIME_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def _write_gptq(src: Path, out: Path, cfg: Any, state: dict[str, Any], linears: set[str], group: int) -> Path:
    """The GPTQ layout of ``state`` (see the module doc): every linear in ``linears`` packed, the rest fp16."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        module = name.removesuffix(".weight")
        if module in linears and name.endswith(".weight"):
            tensors.update(_gptq_linear(module, t.float(), group))
        elif name != "lm_head.weight" or not cfg.tie_word_embeddings:
            tensors[name] = t.to(torch.float16).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config.pop("torch_dtype", None)
    config["dtype"] = "float16"
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group, "sym": True,
                                     "desc_act": False, "producer": PRODUCER}
    (out / "config.json").write_text(json.dumps(config, indent=4, sort_keys=True))
    for name in RUNTIME_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)
    return out


def _gptq_linear(module: str, w: Any, group: int) -> dict[str, Any]:
    """One linear (``w`` float32 [out, in]) in GPTQ's layout, symmetric round-to-nearest per group."""
    import torch

    n, k = w.shape
    if k % group or k % 8 or n % 8:
        raise ConfigurationError(f"{module}: GPTQ's layout needs in_features divisible by group_size {group} and by 8, "
                                 f"and out_features by 8; the linear is [{n}, {k}]")
    grouped = w.reshape(n, k // group, group)
    scale = (grouped.abs().amax(dim=2) / 7).clamp_min(1e-8).to(torch.float16)  # [out, groups]
    q = torch.clamp(torch.round(grouped / scale.float()[..., None]) + 8, 0, 15).to(torch.int64).reshape(n, k)
    rows = q.t().reshape(k // 8, 8, n)  # [in/8, 8, out]: input row 8r + i
    packed = sum(rows[:, i, :] << (4 * i) for i in range(8))
    zeros = sum(GPTQ_STORED_ZERO << (4 * i) for i in range(8))
    return {f"{module}.qweight": _int32(packed),
            f"{module}.qzeros": torch.full((k // group, n // 8), zeros, dtype=torch.int64).to(torch.int32),
            f"{module}.scales": scale.t().contiguous(),
            f"{module}.g_idx": (torch.arange(k, dtype=torch.int32) // group)}


def _int32(x: Any) -> Any:
    """int64 holding 32-bit patterns -> int32 with the same bits."""
    import torch

    return (((x + 2**31) % 2**32) - 2**31).to(torch.int32).contiguous()


def calibration_ids(checkpoint: Path, n: int = 64) -> list[int]:
    """The first ``n`` token ids of the bundled text in ``checkpoint``'s own tokenizer: the one batch
    :func:`quantize_rtn` reads activation statistics from, when nothing else is given (e.g. the model catalog's
    ``synth_quant`` entries)."""
    from tokenizers import Tokenizer

    from edgellm import BUNDLED_TEXT_FILE

    tokenizer = Path(checkpoint) / "tokenizer.json"
    if not tokenizer.is_file():
        raise ConfigurationError(f"checkpoint {checkpoint} has no tokenizer.json to make calibration ids with")
    return list(Tokenizer.from_file(str(tokenizer)).encode(BUNDLED_TEXT_FILE.read_text(encoding="utf-8")).ids[:n])


def _activation_amax(src: Path, modules: list[str], ids: Sequence[int]) -> dict[str, Any]:
    """Per linear: the max |input| per input channel over one forward pass of ``ids`` (transformers, fp32)."""
    import torch
    import transformers

    if not ids:
        raise ConfigurationError("synthetic quantization needs calibration token ids (none given)")
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    amax: dict[str, torch.Tensor] = {}
    hooks = []
    for name in modules:
        def hook(_: Any, args: tuple[Any, ...], name: str = name) -> None:
            amax[name] = args[0].detach().abs().reshape(-1, args[0].shape[-1]).amax(dim=0)
        hooks.append(model.get_submodule(name).register_forward_pre_hook(hook))
    with torch.inference_mode():
        model(torch.tensor([list(ids)], dtype=torch.long))
    for h in hooks:
        h.remove()
    del model
    return amax


def _input_groups(modules: list[str], act_amax: dict[str, Any]) -> list[list[str]]:
    """Linears of one parent module that read the same input (equal activation statistics), in order."""
    import torch

    groups: list[list[str]] = []
    for m in modules:
        parent = m.rpartition(".")[0]
        same = next((g for g in groups if g[0].rpartition(".")[0] == parent
                     and torch.equal(act_amax[g[0]], act_amax[m])), None)
        if same is None:
            groups.append([m])
        else:
            same.append(m)
    return groups


def _quantize_linear(module: str, w: Any, act_amax: Any, w_amax: Any, method: str, group: int) -> dict[str, Any]:
    """The stored tensors of one quantized linear (``w`` float32 [out, in]; ``w_amax`` [in] over the linears that
    share its smoothing)."""
    import torch

    s = (act_amax.clamp_min(1e-8) / w_amax.clamp_min(1e-8)).sqrt()
    s = s / s.log().mean().exp()  # geometric mean 1: smoothing moves range, not magnitude
    # within fp16's normal range: a dead input channel against a wide weight would round to inf (or 0), a scale
    # inspect refuses (edgellm.quant.base.scale_value_problem)
    pqs = (1.0 / s).clamp(FP16_TINY, FP16_MAX).to(torch.float16)
    ws = w * (1.0 / pqs.float())  # [out, in], exact against the fp16 pre_quant_scale
    if method == "int8_sq":
        scale = (ws.abs().amax(dim=1) / 127).clamp_min(1e-12)
        q = torch.clamp(torch.round(ws / scale[:, None]), -128, 127).to(torch.int8)
        x_amax = (act_amax * pqs.float()).amax().clamp_min(1e-8)
        return {f"{module}.weight": q.contiguous(), f"{module}.weight_scale": scale.float().contiguous(),
                f"{module}.input_scale": (x_amax / 127).reshape(()).float(),
                f"{module}.pre_quant_scale": pqs.contiguous()}
    n, k = ws.shape
    blocks = math.ceil(k / group)
    padded = torch.zeros(n, blocks * group)
    padded[:, :k] = ws
    grouped = padded.reshape(n, blocks, group)
    scale = (grouped.abs().amax(dim=2) / 7).clamp_min(1e-12)  # [out, blocks]
    q = torch.clamp(torch.round(grouped / scale[..., None]), -8, 7).to(torch.int8).reshape(n, -1)[:, :k]
    u = (q & 0x0F).to(torch.uint8)  # two's-complement nibbles
    packed = u[0::2] | (u[1::2] << 4)  # output rows 2r (low nibble) and 2r+1 (high) -> [out/2, in]
    return {f"{module}.weight": packed.contiguous(), f"{module}.weight_scale": scale.float().contiguous(),
            f"{module}.pre_quant_scale": pqs.contiguous()}
