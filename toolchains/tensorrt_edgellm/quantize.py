"""Quantize a Hugging Face checkpoint with ``tensorrt-edgellm-quantize`` and report what it actually stored.

Preconditions the tool would trip on are checked before it runs (:func:`preconditions` -> a not-applicable reason).
After it runs, the produced ModelOpt checkpoint is read back: per linear layer, the precision stored. A method that
left more than ``max_unquantized_share`` of the linears in floating point fails with the count (int4_awq silently
keeps every linear that is not aligned to its group in fp16: 25 of stories260K's linears).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edgefarm.toolchains.base import NotApplicable  # raised before the tool runs when a precondition fails
from edgefarm.toolchains.process import run_tool, tree_bytes
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN
from edgefarm.toolchains.tensorrt_edgellm.calibration import CALIBRATION_FILE, offline_env
from edgefarm.toolchains.tensorrt_edgellm.env import installed_version, script
from edgellm.checkpoint.header import TensorInfo, read_header
from edgellm.checkpoint.modelopt import read_quant_layout
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.types import QuantMethod


@dataclass(frozen=True)
class MethodSpec:
    quant_algo: str  # hf_quant_config.json's quant_algo for this method
    stored: str  # the precision a quantized linear's weight is stored in
    block: int | None  # block size every linear width must divide by (the tool asserts), None when it copes


# The methods tensorrt-edgellm-quantize accepts (its --quantization choices) and what each must produce.
METHODS: dict[QuantMethod, MethodSpec] = {
    QuantMethod.FP8: MethodSpec("FP8", "fp8", None),
    QuantMethod.INT4_AWQ: MethodSpec("W4A16_AWQ", "int4_awq", None),  # misaligned linears silently stay fp16
    QuantMethod.INT8_SQ: MethodSpec("W8A8_SQ_PER_CHANNEL", "int8_sq", None),
    QuantMethod.NVFP4: MethodSpec("NVFP4", "nvfp4", 16),
    QuantMethod.MXFP8: MethodSpec("MXFP8", "mxfp8", 32),
}
LM_HEAD_METHODS = (QuantMethod.FP8, QuantMethod.INT4_AWQ, QuantMethod.NVFP4, QuantMethod.MXFP8)
FLOAT_PRECISIONS = frozenset({"fp32", "fp16", "bf16"})
DEFAULT_MAX_UNQUANTIZED_SHARE = 0.0
DEFAULT_NUM_SAMPLES = 64
TIMEOUT_S = 1200  # the reference CI's quantize stage limit
_EMBEDDINGS = ("embed_tokens", "wte", "tok_embeddings", "embeddings")


def parse_method(method: str | QuantMethod) -> QuantMethod:
    try:
        parsed = QuantMethod(method)
    except ValueError:
        parsed = None
    if parsed not in METHODS:
        raise ConfigurationError(f"{TOOLCHAIN} cannot quantize with {str(method)!r}; valid: "
                                 f"{', '.join(m.value for m in METHODS)}")
    return parsed  # type: ignore[return-value]


def _tensors(checkpoint: Path) -> dict[str, TensorInfo]:
    files = sorted(Path(checkpoint).glob("*.safetensors"))
    if not files:
        raise ConfigurationError(f"{checkpoint}: no *.safetensors files (not a Hugging Face checkpoint?)")
    tensors: dict[str, TensorInfo] = {}
    for path in files:
        tensors.update(read_header(path).tensors)
    return tensors


def linear_shapes(checkpoint: Path) -> dict[str, tuple[int, int]]:
    """Every linear layer of an unquantized checkpoint: module name -> (out_features, in_features)."""
    return {name.removesuffix(".weight"): (t.shape[0], t.shape[1]) for name, t in _tensors(checkpoint).items()
            if name.endswith(".weight") and len(t.shape) == 2 and not any(e in name for e in _EMBEDDINGS)}


def has_chat_template(checkpoint: Path) -> bool:
    """The places tensorrt-edgellm-export reads a chat template from."""
    checkpoint = Path(checkpoint)
    if (checkpoint / "chat_template.jinja").is_file():
        return True
    for name in ("chat_template.json", "processor_config.json", "tokenizer_config.json"):
        path = checkpoint / name
        if path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("chat_template"):
            return True
    return False


def preconditions(checkpoint: Path, method: str | QuantMethod, *, chat_template: Path | None,
                  lm_head: str | QuantMethod | None = None) -> str | None:
    """Why ``method`` cannot apply to ``checkpoint`` (checked before the tool runs), or None when it can.
    ``chat_template`` is the template export will supply when the checkpoint has none."""
    spec = METHODS[parse_method(method)]
    shapes = linear_shapes(checkpoint)
    head = parse_method(lm_head) if lm_head is not None else None
    if head is not None and head not in LM_HEAD_METHODS:
        raise ConfigurationError(f"lm_head quantization {head.value!r} is not offered by {TOOLCHAIN}; valid: "
                                 f"{', '.join(m.value for m in LM_HEAD_METHODS)}")
    checks = [(spec.block, [n for n in shapes if n != "lm_head"], str(method))]
    if head is not None:
        checks.append((METHODS[head].block, [n for n in shapes if n == "lm_head"], f"lm_head {head.value}"))
    for block, names, what in checks:
        if block is None:
            continue
        bad = [f"{n} {shapes[n][0]}x{shapes[n][1]}" for n in names if shapes[n][0] % block or shapes[n][1] % block]
        if bad:
            return (f"{what} needs every linear width divisible by its block of {block}; {len(bad)} linear(s) are "
                    f"not, e.g. {', '.join(bad[:3])}")
    if not has_chat_template(checkpoint) and chat_template is None:
        return f"{checkpoint} has no chat template and none is configured (export needs one)"
    if chat_template is not None and not Path(chat_template).is_file():
        return f"chat template {chat_template} does not exist"
    return None


@dataclass(frozen=True)
class QuantReport:
    """Per linear layer, the precision stored in the produced checkpoint."""

    method: str
    quant_algo: str | None  # as declared by hf_quant_config.json
    expected: str  # the precision the method should store
    linears: dict[str, str]  # module name -> stored precision (fp16, int4_awq, int8_sq, fp8, nvfp4, mxfp8, ...)
    by_design: list[str] = field(default_factory=list)  # left unquantized on purpose (lm_head unless requested)

    @property
    def checked(self) -> dict[str, str]:
        return {n: p for n, p in self.linears.items() if n not in self.by_design}

    @property
    def quantized(self) -> list[str]:
        return sorted(n for n, p in self.checked.items() if p not in FLOAT_PRECISIONS)

    @property
    def unquantized(self) -> list[str]:
        return sorted(n for n, p in self.checked.items() if p in FLOAT_PRECISIONS)

    @property
    def unquantized_share(self) -> float:
        return len(self.unquantized) / max(1, len(self.checked))

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "quantized": len(self.quantized), "unquantized": self.unquantized,
                "unquantized_share": round(self.unquantized_share, 4)}

    def check(self, max_unquantized_share: float = DEFAULT_MAX_UNQUANTIZED_SHARE) -> None:
        """Raise TestFailure when the checkpoint is not what the method promised."""
        spec = METHODS[QuantMethod(self.method)]
        if self.quant_algo != spec.quant_algo:
            raise TestFailure(f"{self.method}: checkpoint declares quant_algo {self.quant_algo!r}, expected "
                              f"{spec.quant_algo!r}")
        wrong = sorted(n for n in self.quantized if self.checked[n] != self.expected)
        if wrong:
            raise TestFailure(f"{self.method}: {len(wrong)} linear(s) stored as another precision than "
                              f"{self.expected}, e.g. {wrong[0]} ({self.checked[wrong[0]]})")
        if self.unquantized_share > max_unquantized_share:
            left = self.unquantized
            raise TestFailure(
                f"{self.method}: {len(left)} of {len(self.checked)} linear layers stayed unquantized "
                f"({self.unquantized_share:.0%} > allowed {max_unquantized_share:.0%}), e.g. "
                f"{', '.join(f'{n} ({self.checked[n]})' for n in left[:3])}"
            )


def _stored_precisions(checkpoint: Path) -> dict[str, str]:
    """Per linear layer, the precision stored (the library's reading of the ModelOpt layout, headers only)."""
    layout = read_quant_layout(checkpoint)
    if layout.problems:  # e.g. a declared quantized layer without its scales: never a silent fp16 reading
        raise TestFailure(f"{checkpoint}: quantized checkpoint does not read back: {layout.problems[0]}")
    return {name: linear.precision.value for name, linear in layout.linears.items()}


def quant_report(checkpoint: Path, method: str | QuantMethod, *, lm_head: str | None = None) -> QuantReport:
    """Read the produced checkpoint back (safetensors headers and hf_quant_config.json; no tensor data)."""
    parsed = parse_method(method)
    config = Path(checkpoint) / "hf_quant_config.json"
    algo = None
    if config.is_file():
        algo = json.loads(config.read_text(encoding="utf-8")).get("quantization", {}).get("quant_algo")
    linears = _stored_precisions(checkpoint)
    by_design = [] if lm_head is not None else [n for n in linears if n == "lm_head"]
    return QuantReport(parsed.value, algo, METHODS[parsed].stored, linears, by_design)


@dataclass(frozen=True)
class QuantizeResult:
    checkpoint: Path  # the quantized ModelOpt checkpoint
    method: str
    toolchain_version: str
    argv: list[str]
    wall_s: float
    peak_rss_bytes: int
    size_bytes: int
    report: QuantReport
    log: Path

    def to_dict(self) -> dict[str, object]:
        return {"checkpoint": str(self.checkpoint), "method": self.method, "toolchain": TOOLCHAIN,
                "toolchain_version": self.toolchain_version, "argv": self.argv,
                "wall_s": round(self.wall_s, 3), "peak_rss_bytes": self.peak_rss_bytes,
                "size_bytes": self.size_bytes, "report": self.report.to_dict(), "log": str(self.log)}


def quantize_options(method: str | QuantMethod, *, device: str = "cpu", num_samples: int = DEFAULT_NUM_SAMPLES,
                     lm_head: str | None = None, kv_cache: str | None = None,
                     calibration: Path = CALIBRATION_FILE) -> dict[str, object]:
    """Everything besides the checkpoint digest and the toolchain version that decides quantize's output: with
    those two, the cache key of a quantized checkpoint."""
    import hashlib

    return {"method": parse_method(method).value, "device": device, "num_samples": num_samples,
            "lm_head": lm_head, "kv_cache": kv_cache,
            "calibration_sha256": hashlib.sha256(Path(calibration).read_bytes()).hexdigest()}


def quantize_argv(env: Path, checkpoint: Path, out_dir: Path, method: QuantMethod, *, device: str,
                  num_samples: int, lm_head: QuantMethod | None = None, kv_cache: str | None = None) -> list[str]:
    argv = [str(script(env, "tensorrt-edgellm-quantize")), "llm", "--model_dir", str(checkpoint),
            "--output_dir", str(out_dir), "--quantization", method.value, "--device", device,
            "--num_samples", str(num_samples)]
    if lm_head is not None:
        argv += ["--lm_head_quantization", lm_head.value]
    if kv_cache is not None:
        argv += ["--kv_cache_quantization", kv_cache]
    return argv


def quantize(env: Path, checkpoint: Path, out_dir: Path, method: str | QuantMethod, *,
             chat_template: Path | None, device: str = "cpu", num_samples: int = DEFAULT_NUM_SAMPLES,
             lm_head: str | None = None, kv_cache: str | None = None, calibration: Path = CALIBRATION_FILE,
             timeout: float = TIMEOUT_S, max_unquantized_share: float = DEFAULT_MAX_UNQUANTIZED_SHARE,
             ) -> QuantizeResult:
    """Quantize ``checkpoint`` into ``out_dir`` (created atomically; must not exist) and check the result.

    Raises NotApplicable before running when a precondition fails, TestFailure when the tool fails or its
    checkpoint is not what the method promised (the result is kept for inspection), InfrastructureError on timeout.
    """
    parsed = parse_method(method)
    if device not in ("cpu", "cuda"):
        raise ConfigurationError(f"bad quantize device {device!r}; valid: cpu, cuda")
    if kv_cache not in (None, "fp8"):
        raise ConfigurationError(f"bad kv cache quantization {kv_cache!r}; valid: fp8")
    reason = preconditions(checkpoint, parsed, chat_template=chat_template, lm_head=lm_head)
    if reason is not None:
        raise NotApplicable(reason)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise ConfigurationError(f"quantize output {out_dir} already exists")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        argv = quantize_argv(env, checkpoint, work / "checkpoint", parsed, device=device, num_samples=num_samples,
                             lm_head=parse_method(lm_head) if lm_head else None, kv_cache=kv_cache)
        run = run_tool(argv, env=offline_env(calibration, cache_dir=work / "cache"), log=work / "quantize.log",
                       timeout=timeout)
        if run.returncode != 0:
            raise TestFailure(f"tensorrt-edgellm-quantize {parsed.value} failed (exit {run.returncode}) on "
                              f"{checkpoint}: {run.error_line()}")
        shutil.rmtree(work / "cache", ignore_errors=True)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    quantized = out_dir / "checkpoint"
    argv = [a.replace(str(work), str(out_dir)) for a in argv]
    report = quant_report(quantized, parsed, lm_head=lm_head)
    result = QuantizeResult(quantized, parsed.value, installed_version(env), argv, run.wall_s, run.peak_rss_bytes,
                            tree_bytes(quantized), report, out_dir / "quantize.log")
    (out_dir / "quantize.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    report.check(max_unquantized_share)
    return result
