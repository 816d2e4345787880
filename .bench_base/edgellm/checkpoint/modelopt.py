"""ModelOpt's unified Hugging Face checkpoint format (what ``tensorrt-edgellm-quantize`` writes), read from headers
and the scales' values.

``hf_quant_config.json`` (or ``config.json``'s ``quantization_config`` with ``quant_method: modelopt``) names one
``quant_algo`` for the model and the modules left in float (``exclude_modules``, fnmatch patterns). Each quantized
linear ``<module>`` then stores, instead of a float ``weight [out, in]``, a packed weight and its scales: how, each
quantization method says (``stored``, a ``StoredFormat``, in its module of edgellm/quant; e.g. W4A16_AWQ: weight U8
[out/2, in], weight_scale [out, ceil(in/group)], pre_quant_scale [in]).

``read_quant_layout(dir)`` gives the method, group size, KV-cache quantization and, per linear layer, the precision
actually stored there, plus every problem found (a quantized layer without its scales, scales whose shape does not
fit the weight and group size, a quantized declaration over unpacked float weights, a scale holding a NaN, infinite,
zero or negative value: the scales are the only tensor data read here).
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.checkpoint.header import FLOAT_DTYPES, TensorInfo
from edgellm.config import ModelConfig, QuantConfig
from edgellm.errors import CheckpointError
from edgellm.models.base import ModelFamily
from edgellm.quant import methods
from edgellm.quant.base import QuantizationMethod, StoredFormat, scale_value_problem
from edgellm.types import Precision, QuantMethod

_FLOAT_PRECISION = {"F32": Precision.FP32, "F16": Precision.FP16, "BF16": Precision.BF16}
SCALAR = ((), (1,))  # a per-tensor scale is stored as a 0-d or a 1-element tensor


def stored_formats() -> dict[QuantMethod, type[QuantizationMethod]]:
    """The methods whose stored layout is read, by name."""
    return {QuantMethod(m.name): m for m in methods() if m.stored is not None}


@dataclass(frozen=True)
class LinearLayer:
    """One linear layer as stored: ``precision`` is a float precision for a layer left unquantized."""

    module: str  # model.layers.0.self_attn.q_proj
    precision: Precision
    out_features: int
    in_features: int
    tensors: Mapping[str, str]  # role (weight, weight_scale, ...) -> tensor name

    @property
    def quantized(self) -> bool:
        return self.precision not in _FLOAT_PRECISION.values()


@dataclass
class QuantLayout:
    method: QuantMethod
    source: str
    group_size: int | None
    kv_cache: str | None
    exclude_modules: tuple[str, ...]
    linears: dict[str, LinearLayer] = field(default_factory=dict)  # module -> layer, in checkpoint order
    problems: list[CheckpointError] = field(default_factory=list)

    @property
    def quantized(self) -> list[LinearLayer]:
        return [lin for lin in self.linears.values() if lin.quantized]

    def precision_counts(self) -> dict[str, int]:
        return dict(Counter(lin.precision.value for lin in self.linears.values()))

    def to_json(self) -> dict[str, Any]:
        total = len(self.linears)
        return {
            "method": self.method.value,
            "group_size": self.group_size,
            "kv_cache": self.kv_cache,
            "linears": total,
            "quantized_linears": len(self.quantized),
            "unquantized_share": round(1 - len(self.quantized) / total, 4) if total else 0.0,
            "precision_counts": self.precision_counts(),
            "layers": {m: lin.precision.value for m, lin in self.linears.items()},
        }


def read_quant_layout(checkpoint_dir: Path | str) -> QuantLayout:
    """The quantization layout of a checkpoint, from its headers and its scales' values (see
    ``QuantLayout.problems``)."""
    from edgellm.checkpoint.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint_dir)
    return quant_layout(ckpt.tensors, ckpt.family, ckpt.config, ckpt.quant)


def linear_modules(family: type[ModelFamily], cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Every linear layer the family has (a 2-D ``weight`` that is not the embedding): module -> (out, in)."""
    return {name.removesuffix(".weight"): shape for name, shape in family.expected_parameters(cfg).items()
            if len(shape) == 2 and name.endswith(".weight") and name != "model.embed_tokens.weight"}


def quant_layout(tensors: Mapping[str, TensorInfo], family: type[ModelFamily], cfg: ModelConfig,
                 quant: QuantConfig) -> QuantLayout:
    layout = QuantLayout(method=quant.method, source=quant.source, group_size=quant.group_size,
                         kv_cache=quant.kv_cache, exclude_modules=quant.exclude_modules)
    readable = stored_formats()
    found = readable.get(quant.method)
    fmt = found.stored if found is not None else None
    if quant.is_quantized and fmt is None:
        known = ", ".join(m.value for m in readable)
        layout.problems.append(CheckpointError(
            f"{quant.source}: quantization {quant.method.value} is recognised but its stored layout is not read by "
            f"edgellm; readable: {known}"))
        return layout
    if fmt is not None and fmt.needs_group and quant.group_size is None:
        layout.problems.append(CheckpointError(f"{quant.source}: {quant.method.value} needs a group_size"))
        return layout
    if found is not None and quant.group_size is not None:
        why = found.group_size_problem(quant.group_size)
        if why is not None:  # every scale shape would follow from a group no kernel runs: one problem, not one a layer
            layout.problems.append(CheckpointError(f"{quant.source}: {quant.method.value} {why}"))
            return layout
    for module, (out, inp) in linear_modules(family, cfg).items():
        weight = tensors.get(module + ".weight")
        if weight is None:
            continue  # reported by reconciliation as missing
        excluded = any(fnmatch.fnmatchcase(module, p) for p in quant.exclude_modules)
        if fmt is None or excluded:
            precision = _FLOAT_PRECISION.get(weight.dtype)
            if precision is None:
                why = "excluded from quantization" if excluded else "the checkpoint declares no quantization"
                layout.problems.append(_bad(weight, f"dtype {weight.dtype} is not a float type "
                                                    f"({', '.join(sorted(FLOAT_DTYPES))}) and {why}"))
                continue
            layout.linears[module] = LinearLayer(module, precision, out, inp, {"weight": weight.name})
            continue
        layer = _quantized_layer(module, out, inp, weight, tensors, fmt, quant, layout.problems)
        if layer is not None:
            layout.linears[module] = layer
    return layout


def _bad(info: TensorInfo, msg: str) -> CheckpointError:
    return CheckpointError(msg, file=info.file.name, tensor=info.name)


SCALE_CHUNK_BYTES = 8 * 1024 * 1024  # a multiple of every element size


def _scale_values(info: TensorInfo) -> str | None:
    """Why a scale's stored values are unusable (``scale_value_problem``), read in chunks from its checked
    offsets: scales are the one tensor data inspect reads (a small fraction of the weights)."""
    def chunks() -> Iterator[bytes]:
        begin, end = info.file_offsets
        with open(info.file, "rb") as fp:
            fp.seek(begin)
            while begin < end:
                data = fp.read(min(SCALE_CHUNK_BYTES, end - begin))
                if not data:
                    raise OSError(f"the file ends at byte {begin}, inside the tensor (changed since its header "
                                  f"was read?)")
                begin += len(data)
                yield data

    try:
        return scale_value_problem(info.dtype, chunks())
    except OSError as exc:
        return f"could not be read ({exc})"


def _quantized_layer(module: str, out: int, inp: int, weight: TensorInfo, tensors: Mapping[str, TensorInfo],
                     fmt: StoredFormat, quant: QuantConfig, problems: list[CheckpointError]) -> LinearLayer | None:
    method, group = quant.method.value, quant.group_size
    expect = fmt.shape_note(out, inp, group)
    if weight.dtype in FLOAT_DTYPES:
        problems.append(_bad(weight, f"declared {method}-quantized ({quant.source}) but stored as unpacked float "
                                     f"{weight.dtype} {list(weight.shape)}; {method} stores {expect}"))
        return None
    ok = True
    want = fmt.weight_shape(out, inp)
    if weight.dtype not in fmt.weight_dtypes or weight.shape != want:
        problems.append(_bad(weight, f"{method} weight is {weight.dtype} {list(weight.shape)}; for a [{out}, {inp}] "
                                     f"linear {method} stores {expect}"))
        ok = False
    names = {"weight": weight.name}
    missing = []
    for suffix, scale in fmt.scales.items():
        info = tensors.get(f"{module}.{suffix}")
        if info is None:
            if not scale.optional:
                missing.append(f"{module}.{suffix}")
            continue
        names[suffix] = info.name
        shape = scale.shape(out, inp, group)
        allowed = SCALAR if shape is None else (shape,)
        if info.shape not in allowed:
            problems.append(_bad(info, f"scale shape {list(info.shape)} does not fit the [{out}, {inp}] weight"
                                       + (f" and group_size {group}" if fmt.needs_group else "")
                                       + f"; {method} needs {list(shape) if shape is not None else '[] (scalar)'}"))
            ok = False
        elif info.dtype not in scale.dtypes:
            problems.append(_bad(info, f"scale dtype {info.dtype} is not one {method} stores for {suffix} "
                                       f"({', '.join(scale.dtypes)})"))
            ok = False
        elif (why := _scale_values(info)) is not None:
            problems.append(_bad(info, f"{method} {suffix} {why}"))
            ok = False
    if missing:
        problems.append(_bad(weight, f"declared {method}-quantized but its scales are missing: {', '.join(missing)}"))
        ok = False
    if not ok:
        return None
    return LinearLayer(module, Precision(quant.method.value), out, inp, names)


GPTQ_PACKED = ".qweight"  # the packed int4 weight of each linear in a Hugging Face GPTQ or AWQ checkpoint


def quantized_linear_count(checkpoint_dir: Path | str) -> int:
    """How many linear layers a checkpoint stores quantized (0 for a float one), from its headers: ModelOpt's
    layout read and checked (its first problem raises: a layer declared quantized without its scales is never
    exported as float); a Hugging Face GPTQ or AWQ checkpoint (whose layout edgellm does not read further) by its
    packed ``qweight`` tensors."""
    from edgellm.checkpoint.checkpoint import Checkpoint

    ckpt = Checkpoint.open(checkpoint_dir)
    if not ckpt.quant.is_quantized:
        return 0
    if not ckpt.quant.modelopt:
        return sum(1 for name in ckpt.tensors if name.endswith(GPTQ_PACKED))
    layout = quant_layout(ckpt.tensors, ckpt.family, ckpt.config, ckpt.quant)
    if layout.problems:
        raise layout.problems[0]
    return len(layout.quantized)
