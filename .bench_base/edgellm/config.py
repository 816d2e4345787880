"""Typed, validated views of a checkpoint's ``config.json`` and its quantization config.

Every problem names the file and the key. Unknown quantization methods or algorithms are errors that list the
known ones: a checkpoint that says it is quantized is never silently built as FP16.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError, UnsupportedError
from edgellm.quant import methods
from edgellm.types import QuantMethod

MAX_CONFIG_BYTES = 4 * 1024 * 1024
# The longest context a config may declare: ~13x the longest real release (10M positions); 1e15 is a typo.
MAX_POSITION_EMBEDDINGS = 1 << 27
# The largest tokenizer.json taken (checked before it is read or copied): real ones are a few MiB to ~35 MiB;
# a 600 MB one took 2.2 GB to load and was copied into every export.
MAX_TOKENIZER_BYTES = 128 * 1024 * 1024


def tokenizer_size_problem(tokenizer_file: Path) -> str | None:
    """Why ``tokenizer_file`` is too large to take (naming its size and the limit), or None."""
    try:
        size = Path(tokenizer_file).stat().st_size
    except OSError:
        return None  # absent: the caller says so in its own words
    if size > MAX_TOKENIZER_BYTES:
        return (f"{tokenizer_file}: tokenizer file is {size} bytes, over the {MAX_TOKENIZER_BYTES}-byte limit "
                f"(real tokenizer.json files are at most a few tens of MiB)")
    return None


_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def read_json_object(path: Path, *, what: str, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """Read a small JSON object from an untrusted file, with one-line errors naming the file."""
    if not path.is_file():
        raise ConfigurationError(f"{path}: {what} not found")
    size = path.stat().st_size
    if size > max_bytes:
        raise ConfigurationError(f"{path}: {what} is {size} bytes, over the {max_bytes}-byte limit")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigurationError(f"{path}: {what} is not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigurationError(f"{path}: {what} is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


class _Reader:
    """Typed key access into a config dict, collecting every problem before raising once."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source
        self.problems: list[str] = []

    def _bad(self, key: str, value: Any, expected: str) -> None:
        self.problems.append(f"key {key!r} = {value!r}: expected {expected}")

    def int(self, key: str, *, default: int | None = None, required: bool = True, minimum: int = 1,
            maximum: int | None = None) -> int:
        value = self.data.get(key)
        if value is None:  # absent or null: both mean "use the default"
            value = default
        if value is None:
            if required:
                self.problems.append(f"missing required key {key!r} (an integer >= {minimum})")
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self._bad(key, value, f"an integer >= {minimum}" + (f" and <= {maximum}" if maximum else ""))
            return 0
        if maximum is not None and value > maximum:
            self._bad(key, value, f"an integer from {minimum} to {maximum}")
            return 0
        return value

    def opt_int(self, key: str, *, minimum: int = 1) -> int | None:
        if self.data.get(key) is None:
            return None
        return self.int(key, minimum=minimum)

    def float(self, key: str, *, default: float | None = None, positive: bool = True) -> float:
        value = self.data.get(key, default)
        if value is None:
            self.problems.append(f"missing required key {key!r} (a number)")
            return 0.0
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self._bad(key, value, "a finite number")
            return 0.0
        if positive and value <= 0:
            self._bad(key, value, "a number > 0")
            return 0.0
        return float(value)

    def bool(self, key: str, *, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self._bad(key, value, "true or false")
            return default
        return value

    def str(self, key: str, *, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value:
            if key not in self.data and default is None:
                self.problems.append(f"missing required key {key!r} (a string)")
            else:
                self._bad(key, value, "a non-empty string")
            return ""
        return value

    def raise_if_problems(self) -> None:
        if self.problems:
            raise ConfigurationError(f"{self.source}: " + "; ".join(self.problems))


@dataclass(frozen=True)
class RopeScaling:
    """RoPE scaling; only types a family implements are accepted (checked by the family)."""

    rope_type: str
    factor: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelConfig:
    """The subset of a Hugging Face decoder config this project understands, validated."""

    model_type: str
    architectures: tuple[str, ...]
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    hidden_act: str
    dtype: str  # fp32 | fp16 | bf16: the checkpoint's declared storage dtype
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None
    raw: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config.json") -> ModelConfig:
        r = _Reader(data, source)
        model_type = r.str("model_type")
        archs = data.get("architectures") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            r._bad("architectures", archs, "a list of strings")
            archs = []
        hidden = r.int("hidden_size")
        heads = r.int("num_attention_heads")
        kv_heads = r.int("num_key_value_heads", default=heads or None)
        head_dim = r.opt_int("head_dim")
        if head_dim is None and hidden and heads:
            if hidden % heads:
                r.problems.append(
                    f"hidden_size {hidden} is not divisible by num_attention_heads {heads} and no head_dim is given"
                )
            head_dim = hidden // heads if heads else 0
        if heads and kv_heads and heads % kv_heads:
            r.problems.append(
                f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            )
        rope_theta, rope_scaling = _rope(data, r)
        # transformers<5 writes torch_dtype, >=5 writes dtype; either may be null (meaning float32).
        dtype_name = next((data[k] for k in ("torch_dtype", "dtype") if data.get(k) is not None), "float32")
        dtype = _DTYPES.get(str(dtype_name), "")
        if not dtype:
            r._bad("torch_dtype", dtype_name, f"one of {', '.join(_DTYPES)}")
        eos = data.get("eos_token_id")
        eos_ids: tuple[int, ...] = ()
        if isinstance(eos, int) and not isinstance(eos, bool):
            eos_ids = (eos,)
        elif isinstance(eos, list) and all(isinstance(e, int) and not isinstance(e, bool) for e in eos):
            eos_ids = tuple(eos)
        elif eos is not None:
            r._bad("eos_token_id", eos, "an integer or a list of integers")
        bos = data.get("bos_token_id")
        if bos is not None and (isinstance(bos, bool) or not isinstance(bos, int)):
            r._bad("bos_token_id", bos, "an integer")
            bos = None
        sliding = data.get("sliding_window")
        if sliding is not None and (isinstance(sliding, bool) or not isinstance(sliding, int) or sliding < 1):
            r._bad("sliding_window", sliding, "null or an integer >= 1")
            sliding = None
        cfg = cls(
            model_type=model_type,
            architectures=tuple(archs),
            hidden_size=hidden,
            intermediate_size=r.int("intermediate_size"),
            num_hidden_layers=r.int("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim or 0,
            vocab_size=r.int("vocab_size"),
            max_position_embeddings=r.int("max_position_embeddings", default=2048, maximum=MAX_POSITION_EMBEDDINGS),
            rms_norm_eps=r.float("rms_norm_eps", default=1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
            attention_bias=r.bool("attention_bias", default=False),
            mlp_bias=r.bool("mlp_bias", default=False),
            hidden_act=r.str("hidden_act", default="silu"),
            dtype=dtype,
            bos_token_id=bos,
            eos_token_ids=eos_ids,
            sliding_window=sliding,
            raw=data,
        )
        r.raise_if_problems()
        return cfg

    @classmethod
    def load(cls, ckpt_dir: Path) -> ModelConfig:
        path = Path(ckpt_dir) / "config.json"
        return cls.from_dict(read_json_object(path, what="config.json"), source=str(path))

    @property
    def num_parameters_estimate(self) -> int:
        h, f, L, v = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.vocab_size
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
        return L * per_layer + v * h * (1 if self.tie_word_embeddings else 2) + h

    def summary(self) -> dict[str, Any]:
        return {
            "model_type": self.model_type,
            "architectures": list(self.architectures),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_scaling": None
            if self.rope_scaling is None
            else {"rope_type": self.rope_scaling.rope_type, "factor": self.rope_scaling.factor,
                  **self.rope_scaling.params},
            "tie_word_embeddings": self.tie_word_embeddings,
            "dtype": self.dtype,
        }


def _rope(data: dict[str, Any], r: _Reader) -> tuple[float, RopeScaling | None]:
    """Read RoPE settings from either layout: transformers<5 (``rope_theta`` + ``rope_scaling``) or
    transformers>=5 (``rope_parameters`` holding ``rope_type``, ``rope_theta`` and the scaling keys)."""
    params = data.get("rope_parameters")
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        params = params["full_attention"]  # per layer type (Gemma-3): the global layers'; edgellm.models.rope
    scaling = data.get("rope_scaling")
    theta_value = data.get("rope_theta")
    if isinstance(params, dict):
        theta_value = params.get("rope_theta", theta_value)
        if params.get("rope_type", "default") != "default":
            scaling = params
    elif params is not None:
        r._bad("rope_parameters", params, "an object")
    theta = r.float("rope_theta", default=10000.0) if theta_value is None else _checked_theta(theta_value, r)
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        r._bad("rope_scaling", scaling, "null or an object")
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if not isinstance(rope_type, str):
        r._bad("rope_scaling.rope_type", rope_type, "a string such as 'llama3'")
        return theta, None
    if rope_type == "default":
        return theta, None
    factor = scaling.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
        r._bad("rope_scaling.factor", factor, "a number > 0")
        factor = 1.0
    rest = {k: v for k, v in scaling.items() if k not in ("rope_type", "type", "factor", "rope_theta")}
    return theta, RopeScaling(rope_type=rope_type, factor=float(factor), params=rest)


def _checked_theta(value: Any, r: _Reader) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        r._bad("rope_theta", value, "a number > 0")
        return 0.0
    return float(value)


# --- quantization -------------------------------------------------------------------------------------------

# ModelOpt `hf_quant_config.json` -> quantization.quant_algo, and config.json -> quantization_config.quant_method
# (with bits where it matters): each method's own declaration (edgellm/quant).
MODELOPT_ALGOS: dict[str, QuantMethod] = {algo: QuantMethod(m.name) for m in methods() for algo in m.modelopt_algos}
HF_QUANT_METHODS: dict[tuple[str, int | None], QuantMethod] = {
    key: QuantMethod(m.name) for m in methods() for key in m.hf_quant_methods}
MODELOPT_KV_ALGOS = {"FP8": "fp8", "INT8": "int8", "NVFP4": "nvfp4"}


@dataclass(frozen=True)
class QuantConfig:
    method: QuantMethod
    source: str  # the file it came from
    group_size: int | None = None
    kv_cache: str | None = None  # KV-cache quantization: fp8 | int8 | nvfp4 | None
    exclude_modules: tuple[str, ...] = ()
    producer: str | None = None
    modelopt: bool = False  # ModelOpt's unified format: per-layer layout read by edgellm.checkpoint.modelopt

    @property
    def is_quantized(self) -> bool:
        return self.method is not QuantMethod.NONE

    @classmethod
    def none(cls) -> QuantConfig:
        return cls(method=QuantMethod.NONE, source="(none)")

    @classmethod
    def from_modelopt(cls, data: dict[str, Any], *, source: str) -> QuantConfig:
        quant = data.get("quantization")
        if not isinstance(quant, dict):
            raise ConfigurationError(f"{source}: key 'quantization' must be an object (ModelOpt layout)")
        algo = quant.get("quant_algo")
        kv = quant.get("kv_cache_quant_algo")
        if algo is None and kv is None:
            raise ConfigurationError(f"{source}: 'quantization' has neither quant_algo nor kv_cache_quant_algo")
        method = QuantMethod.NONE
        if algo is not None:
            if not isinstance(algo, str) or algo not in MODELOPT_ALGOS:
                raise UnsupportedError(
                    f"{source}: unknown quant_algo {algo!r}; known: {', '.join(sorted(MODELOPT_ALGOS))}"
                )
            method = MODELOPT_ALGOS[algo]
        kv_cache = None
        if kv is not None:
            if not isinstance(kv, str) or kv not in MODELOPT_KV_ALGOS:
                raise UnsupportedError(
                    f"{source}: unknown kv_cache_quant_algo {kv!r}; known: {', '.join(sorted(MODELOPT_KV_ALGOS))}"
                )
            kv_cache = MODELOPT_KV_ALGOS[kv]
        group = quant.get("group_size")
        if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 1):
            raise ConfigurationError(f"{source}: group_size {group!r} must be an integer >= 1")
        excl = quant.get("exclude_modules") or []
        if not isinstance(excl, list) or not all(isinstance(e, str) for e in excl):
            raise ConfigurationError(f"{source}: exclude_modules must be a list of strings")
        producer = data.get("producer", {})
        producer_name = producer.get("name") if isinstance(producer, dict) else None
        return cls(method=method, source=source, group_size=group, kv_cache=kv_cache,
                   exclude_modules=tuple(excl), producer=producer_name, modelopt=True)

    @classmethod
    def from_hf(cls, data: dict[str, Any], *, source: str) -> QuantConfig:
        qm = data.get("quant_method")
        if qm == "modelopt":  # config.json spells exclude_modules "ignore"
            excl = {"exclude_modules": data["ignore"]} if "ignore" in data and "exclude_modules" not in data else {}
            return cls.from_modelopt({"quantization": {**data, **excl}}, source=source)
        bits = data.get("bits")
        hashable = isinstance(qm, str) and (bits is None or (isinstance(bits, int) and not isinstance(bits, bool)))
        key = (qm, bits if hashable and (qm, bits) in HF_QUANT_METHODS else None) if hashable else None
        if key not in HF_QUANT_METHODS:
            known = ", ".join(f"{m}" + (f" (bits={b})" if b else "") for m, b in sorted(HF_QUANT_METHODS,
                              key=lambda k: (k[0], k[1] or 0)))
            raise UnsupportedError(
                f"{source}: unknown quantization_config quant_method={qm!r} bits={bits!r}; known: {known}, modelopt"
            )
        group = data.get("group_size")
        # -1 is GPTQ's "one group per row" (no grouping).
        if group is not None and (isinstance(group, bool) or not isinstance(group, int) or (group < 1 and group != -1)):
            raise ConfigurationError(f"{source}: group_size {group!r} must be an integer >= 1 (or -1: no grouping)")
        return cls(method=HF_QUANT_METHODS[key], source=source,
                   group_size=group if group is not None and group > 0 else None)

    @classmethod
    def load(cls, ckpt_dir: Path, model_config: dict[str, Any] | None = None) -> QuantConfig:
        """``hf_quant_config.json`` wins; else ``config.json``'s ``quantization_config``; else not quantized."""
        ckpt_dir = Path(ckpt_dir)
        modelopt = ckpt_dir / "hf_quant_config.json"
        if modelopt.exists():
            return cls.from_modelopt(read_json_object(modelopt, what="hf_quant_config.json"), source=str(modelopt))
        if model_config is None:
            model_config = read_json_object(ckpt_dir / "config.json", what="config.json")
        qc = model_config.get("quantization_config")
        if qc is None:
            return cls.none()
        src = f"{ckpt_dir / 'config.json'}: quantization_config"
        if not isinstance(qc, dict):
            raise ConfigurationError(f"{src} must be an object")
        return cls.from_hf(qc, source=src)
