"""Does it fit: an engine's memory estimated from a checkpoint's config alone (no weight is read).

footprint = weights (decoder linears at the row's precision; embeddings and LM head by their own, tied counted once;
norms and biases at the float dtype) + KV cache (layers x 2 (K, V) x KV heads x head_dim x length x batch x KV bytes,
a sliding-window layer holding at most its window) + activations at the build's shapes + the runtime's reserve.

The reserve is what the runtime takes besides those (its code, allocator pools, a CUDA context): measured per
toolchain and device type and stored with where each number came from (``assets/memory_reserves.yaml``); a pair with
no measurement gets no reserve and says so (``reserve_source``), never a guessed constant.

Sizes are bytes; ``GB`` is 2**30 bytes (board memory is sized in powers of two).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.config import ModelConfig, QuantConfig
from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision

GB = 2**30
RESERVES_FILE = Path(__file__).resolve().parent / "assets" / "memory_reserves.yaml"
DEFAULT_GROUP = 128  # ModelOpt's default AWQ/GPTQ group when the checkpoint does not say
FLOAT_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}
KV_BYTES = {KVCachePrecision.FP32: 4.0, KVCachePrecision.FP16: 2.0, KVCachePrecision.BF16: 2.0,
            KVCachePrecision.FP8: 1.0, KVCachePrecision.INT8: 1.0, KVCachePrecision.NVFP4: 0.5 + 1 / 16}
# a scale's bytes in an engine: the first dtype its Scale allows (ONNX Runtime keeps fp32 group scales), but for
# NVFP4's block scales, which a stored layout allows in several dtypes and which runtimes keep as e4m3 (one byte)
_SCALE_BYTES = {("nvfp4", "weight_scale"): 1}
_DTYPE_BYTES = {"U8": 1, "I8": 1, "F8_E4M3": 1, "F16": 2, "BF16": 2, "F32": 4, "F64": 8}


@dataclass(frozen=True)
class Reserve:
    """One measured runtime reserve: what a toolchain's runtime took on a device type besides the estimated parts."""

    toolchain: str
    device_type: str
    bytes: int
    source: str


@dataclass(frozen=True)
class MemoryEstimate:
    parts: dict[str, int]  # bytes: weights, embeddings, lm_head, kv_cache, activations, runtime_reserve
    reserve_source: str
    notes: tuple[str, ...] = field(default=())
    reserve: Reserve | None = None  # the measurement its runtime_reserve is, if any

    @property
    def total_bytes(self) -> int:
        return sum(self.parts.values())

    @property
    def estimate_gb(self) -> float:
        return round(self.total_bytes / GB, 3)

    def to_json(self) -> dict[str, Any]:
        return {"estimate_gb": self.estimate_gb, "total_bytes": self.total_bytes,
                "parts": {k: round(v / GB, 4) for k, v in self.parts.items()},
                "parts_bytes": dict(self.parts), "reserve_source": self.reserve_source, "notes": list(self.notes)}


def load_reserves(path: Path = RESERVES_FILE) -> dict[tuple[str, str], Reserve]:
    """The stored reserve table: ``(toolchain, device_type) -> Reserve``; a malformed row is a ConfigurationError
    naming the file, the row and the key."""
    from edgellm.yamlio import read_yaml

    data = read_yaml(path)
    rows = data.get("reserves") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ConfigurationError(f"{path}: expected a mapping with a list 'reserves'")
    out: dict[tuple[str, str], Reserve] = {}
    problems = []
    for i, row in enumerate(rows):
        where = f"{path}: reserves[{i}]"
        if not isinstance(row, dict) or set(row) != {"toolchain", "device_type", "reserve_mb", "source"}:
            problems.append(f"{where}: expected exactly toolchain, device_type, reserve_mb, source; got {row!r}")
            continue
        mb = row["reserve_mb"]
        if isinstance(mb, bool) or not isinstance(mb, int | float) or mb < 0:
            problems.append(f"{where}: reserve_mb {mb!r} must be a number >= 0")
            continue
        if not isinstance(row["source"], str) or len(row["source"].strip()) < 10:
            problems.append(f"{where}: source must say where the number came from (command, date, version)")
            continue
        key = (str(row["toolchain"]), str(row["device_type"]))
        if key in out:
            problems.append(f"{where}: {key[0]} on {key[1]} is listed twice")
            continue
        out[key] = Reserve(key[0], key[1], int(mb * 2**20), row["source"].strip())
    if problems:
        raise ConfigurationError("\n".join(problems))
    return out


def compute_dtype(toolchain: str | None, path: Path = RESERVES_FILE) -> str | None:
    """The float format a toolchain's runtime computes in and holds unquantized weights in, when it is not the
    row's own (the data file's ``compute_dtypes``); None: not stated (float rows as built, quantized rows fp16)."""
    if toolchain is None:
        return None
    found = _compute_dtypes(path).get(toolchain)
    if found is not None and found not in FLOAT_BYTES:
        raise ConfigurationError(f"{path}: compute_dtypes.{toolchain}: {found!r}; valid: {', '.join(FLOAT_BYTES)}")
    return found


@functools.cache
def _compute_dtypes(path: Path) -> dict[str, Any]:
    from edgellm.yamlio import read_yaml

    data = read_yaml(path)
    table = data.get("compute_dtypes") if isinstance(data, dict) else None
    if not isinstance(table, dict):
        raise ConfigurationError(f"{path}: expected a mapping 'compute_dtypes: {{TOOLCHAIN: FLOAT DTYPE}}'")
    return table


def load_copy(toolchain: str | None, path: Path = RESERVES_FILE) -> bool:
    """Whether a toolchain's runtime copies each decoder layer's linears at load, one layer at a time (the data
    file's ``load_copies``): its peak then holds one layer's linears twice."""
    if toolchain is None:
        return False
    from edgellm.yamlio import read_yaml

    data = read_yaml(path)
    table = data.get("load_copies", {}) if isinstance(data, dict) else {}
    found = table.get(toolchain) if isinstance(table, dict) else None
    if found not in (None, "one_layer"):
        raise ConfigurationError(f"{path}: load_copies.{toolchain}: {found!r}; valid: one_layer")
    return found == "one_layer"


def missing_reserve(toolchain: str | None, device_type: str | None,
                    reserves: dict[tuple[str, str], Reserve]) -> str:
    """What an estimate without a reserve says of it: which pair has no measurement, and which pairs have one."""
    measured = ", ".join(f"{t} on {d}" for t, d in sorted(reserves)) or "none"
    if toolchain is None:
        return f"no toolchain given: no runtime reserve (measured: {measured})"
    return (f"no reserve measured for {toolchain} on {device_type or 'any one device type'}: none added "
            f"(measured: {measured})")


def reserve_for(toolchain: str | None, device_type: str | None,
                reserves: dict[tuple[str, str], Reserve] | None = None) -> Reserve | None:
    """The measured reserve of ``toolchain`` on ``device_type``; None when none was measured. A toolchain the table
    does not know is not an error (it may have no measurement yet); the caller reports the missing reserve."""
    table = load_reserves() if reserves is None else reserves
    if toolchain is None:
        return None
    if device_type is None:  # the CLI without --device-type: the toolchain's only measurement, if it has one
        found = [r for (t, _), r in table.items() if t == toolchain]
        return found[0] if len(found) == 1 else None
    return table.get((toolchain, device_type))


def weight_bytes_per_value(precision: Precision | LMHeadPrecision | str, group: int | None = None) -> float:
    """Bytes one weight value takes at ``precision``, its scales included (for an [out, in] linear, amortised):
    a float format's width, else the quantization method's stored layout (``edgellm.quant``) with its group."""
    name = str(precision.value if hasattr(precision, "value") else precision)
    if name in FLOAT_BYTES:
        return FLOAT_BYTES[name]
    from edgellm.quant.base import METHODS, discover

    discover()
    if name not in METHODS:
        raise ConfigurationError(f"unknown precision {name!r}; valid: {', '.join([*FLOAT_BYTES, *METHODS])}")
    method = METHODS.get(name)
    if method.stored is None:
        if method.bits_per_weight is None:
            raise UnsupportedError(f"quantization method {name}: neither a stored layout nor bits_per_weight is "
                                   f"declared (edgellm/quant/{name}.py); its size cannot be estimated")
        return method.bits_per_weight / 8
    out, inp = 4096, 4096  # per-value cost is shape-independent but for rounding; a wide layer amortises scales
    g = group or (DEFAULT_GROUP if method.stored.needs_group else None)
    total = math.prod(method.stored.weight_shape(out, inp)) * _DTYPE_BYTES[method.stored.weight_dtypes[0]]
    for suffix, scale in method.stored.scales.items():
        if scale.optional:
            continue
        shape = scale.shape(out, inp, g)
        width = _SCALE_BYTES.get((name, suffix), _DTYPE_BYTES[scale.dtypes[0]])
        total += (math.prod(shape) if shape is not None else 1) * width
    return total / (out * inp)


def _float_dtype(precision: Precision, compute: str | None) -> str:
    """The float format the runtime holds everything not quantized in: the row's own for a float row, or the
    runtime's compute dtype when that is wider (ONNX Runtime on a CPU widens fp16 weights to fp32 at load); for a
    quantized row the compute dtype, else fp16."""
    if precision.value in FLOAT_BYTES:
        if compute is not None and FLOAT_BYTES[compute] > FLOAT_BYTES[precision.value]:
            return compute
        return precision.value
    return compute or "fp16"


def _kv_lengths(cfg: ModelConfig, family: Any, max_seq_len: int) -> list[int]:
    """Positions each layer's cache holds: ``max_seq_len``, or a sliding-window layer's window when smaller (its
    cache holds its last ``window`` positions on every backend). Which layers slide, and their window, is the
    family's reading of the config (``layer_windows``: layer_types, sliding_window_pattern, max_window_layers, its
    own pattern)."""
    windows = family.layer_windows(cfg) if family is not None else (None,) * cfg.num_hidden_layers
    return [max_seq_len if w is None else min(w, max_seq_len) for w in windows]


def estimate(cfg: ModelConfig, precision: Precision | str, *, max_seq_len: int, max_batch_size: int,
             max_input_len: int | None = None, lm_head_precision: LMHeadPrecision | str | None = None,
             kv_cache_precision: KVCachePrecision | str | None = None, group_size: int | None = None,
             float_dtype: str | None = None, reserve: Reserve | None = None,
             no_reserve: str = "no runtime reserve given", load_copy: bool = False) -> MemoryEstimate:
    """The memory an engine of ``cfg`` built at these shapes needs (see the module's docstring)."""
    from edgellm.models.base import NoFamilyError, family_for

    p = Precision.parse(precision, what="precision")
    for name, value in (("max_seq_len", max_seq_len), ("max_batch_size", max_batch_size),
                        ("max_input_len", max_input_len if max_input_len is not None else 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(f"{name} {value!r} must be an integer >= 1")
    if float_dtype is not None and float_dtype not in FLOAT_BYTES:
        raise ConfigurationError(f"float dtype {float_dtype!r}; valid: {', '.join(FLOAT_BYTES)}")
    s_in = min(max_input_len or max_seq_len, max_seq_len)
    notes: list[str] = []
    try:
        family = family_for(cfg)
    except NoFamilyError:
        family = None
        notes.append(f"model_type {cfg.model_type!r}: no registered family; parameters from the generic decoder shape")
    except UnsupportedError as exc:  # a family that refuses to run this config can still be sized, conservatively
        family = None
        notes.append(f"sized from the generic decoder shape with full attention: {exc}")
    fdt = _float_dtype(p, float_dtype)
    fb = FLOAT_BYTES[fdt]
    head = LMHeadPrecision.parse(lm_head_precision, what="LM-head precision") if lm_head_precision else None
    # the KV cache: the row's own float format (an export's default), else the held float format
    kv = KVCachePrecision.parse(kv_cache_precision, what="KV-cache precision") if kv_cache_precision \
        else KVCachePrecision(p.value if p.value in FLOAT_BYTES else fdt)
    per_value = fb if p.value in FLOAT_BYTES else weight_bytes_per_value(p, group_size)
    h, v = cfg.hidden_size, cfg.vocab_size
    linears = other = 0
    shapes = family.expected_parameters(cfg) if family is not None else _generic_parameters(cfg)
    for name, shape in shapes.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            continue
        if len(shape) == 2:
            linears += math.prod(shape)
        else:
            other += math.prod(shape)
    embed = v * h * fb
    head_bytes = v * h * (weight_bytes_per_value(head) if head is not None else fb)
    if cfg.tie_word_embeddings:  # one matrix serves both: counted once, at the wider of the two formats
        embed, head_bytes = max(embed, head_bytes), 0.0
        notes.append("embeddings tied to the LM head: counted once")
    kv_bytes = sum(2 * cfg.num_key_value_heads * cfg.head_dim * n * max_batch_size * KV_BYTES[kv]
                   for n in _kv_lengths(cfg, family, max_seq_len))
    q = cfg.num_attention_heads * cfg.head_dim
    # the widest step at the build's shapes: [B, S_in, *] hidden states, q/k/v, the MLP's gate and up, the logits;
    # the attention scores [B, H, S_in, S]; in the float dtype (logits fp32: the runtime returns them so)
    tokens = max_batch_size * s_in
    act = tokens * (4 * h + q + 2 * cfg.num_key_value_heads * cfg.head_dim + 2 * cfg.intermediate_size) * fb
    act += tokens * v * 4 + max_batch_size * cfg.num_attention_heads * s_in * max_seq_len * fb
    if fb != 4:  # logits in the float dtype before their fp32 copy
        act += tokens * v * fb
    parts = {"weights": int(linears * per_value + other * fb), "embeddings": int(embed), "lm_head": int(head_bytes),
             "kv_cache": int(kv_bytes), "activations": int(act),
             "runtime_reserve": reserve.bytes if reserve is not None else 0}
    if load_copy:  # one layer's linears held twice while the runtime lays them out (``load_copy``)
        parts["load_copy"] = int(linears * per_value / max(cfg.num_hidden_layers, 1))
        notes.append("one decoder layer's linears counted twice: the runtime copies them at load, layer by layer")
    source = reserve.source if reserve is not None else no_reserve
    return MemoryEstimate(parts, source, tuple(notes), reserve)


def _generic_parameters(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, q, kv, f = cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, \
        cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    out: dict[str, tuple[int, ...]] = {}
    for i in range(cfg.num_hidden_layers):
        for name, shape in (("q", (q, h)), ("k", (kv, h)), ("v", (kv, h)), ("o", (h, q)), ("gate", (f, h)),
                            ("up", (f, h)), ("down", (h, f)), ("norm1", (h,)), ("norm2", (h,))):
            out[f"layer{i}.{name}"] = shape
    out["norm"] = (h,)
    return out


def estimate_checkpoint(ckpt_dir: Path, precision: Precision | str | None = None, **kwargs: Any) -> MemoryEstimate:
    """``estimate`` from a checkpoint directory's ``config.json`` (and its quantization config: a pre-quantized
    checkpoint's precision and group are its own; asking another is refused)."""
    cfg = ModelConfig.load(ckpt_dir)
    quant = QuantConfig.load(ckpt_dir, cfg.raw)
    if quant.is_quantized:
        carried = Precision(quant.method.value)
        if precision is not None and Precision.parse(precision, what="precision") != carried:
            raise ConfigurationError(f"{ckpt_dir}: the checkpoint is quantized at {carried.value} ({quant.source}); "
                                     f"--precision {precision} cannot be estimated from it (give {carried.value})")
        precision = carried
        kwargs.setdefault("group_size", quant.group_size)
    if precision is None:
        raise ConfigurationError(f"{ckpt_dir}: the checkpoint is not quantized; give --precision (one of "
                                 f"{', '.join(p.value for p in Precision)})")
    return estimate(cfg, precision, **kwargs)
