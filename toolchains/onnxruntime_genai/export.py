"""Export a Hugging Face checkpoint with onnxruntime-genai's model builder, offline, for its CPU runtime.

The builder runs as ``python -m onnxruntime_genai.models.builder -i CKPT -o OUT -p PREC -e cpu -c CACHE
[--extra_options K=V ...]`` in a subprocess of this interpreter (an argv list, never a shell line), with the Hugging
Face hub switched off and its caches under the export's scratch dir. Never with ``--help``: its help text has a bare
``%`` that makes argparse crash. The builder needs ``onnx_ir`` (``pip install onnx-ir``; pip does not pull it in).

Precisions (``RECIPES``; the only place they are listed): ``fp32`` (``-p fp32``) and ``int4_wo`` (``-p int4``: the
builder's default MatMulNBits quantizer, i.e. MLAS block-wise symmetric round-to-nearest, weight only, no
calibration; block size and accuracy level given explicitly so a new builder default cannot change them silently).
The builder quantizes every MatMul it emits, the LM head included (``/lm_head/MatMul_Q4``); the embedding Gather
stays float unless asked (we do not ask).

What it cannot build is refused before it runs (:func:`applicability`): an architecture its dispatch does not name
(read from the installed builder's source, so a new release's list is never re-typed here), and a head size its CPU
``GroupQueryAttention`` kernel refuses (a multiple of 16; stories260K has 8).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefarm.devices.environment import stage_environ
from edgefarm.toolchains.onnxruntime_genai import DISTRIBUTION
from edgefarm.toolchains.process import run_tool, tree_bytes
from edgellm.errors import ConfigurationError, InfrastructureError, TestFailure, UnsupportedError

BUILDER_MODULE = "onnxruntime_genai.models.builder"
MODEL_SUBDIR = "model"  # <out_dir>/model holds what the builder wrote (genai_config.json, model.onnx, ...)
EXPORT_RECORD = "export.json"
TIMEOUT_S = 1200  # the reference CI's export stage limit
LOG_TAIL_LINES = 15
GQA_HEAD_MULTIPLE = 16  # CPU GroupQueryAttention: head_size % 16 == 0
INT4_BLOCK_SIZE = 32
INT4_ACCURACY_LEVEL = 4  # MatMulNBits computes with int8 activations per block (the builder's CPU default)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass(frozen=True)
class Recipe:
    """How one farm precision is asked of the builder, and the quantization it stands for (None: float)."""

    builder_precision: str  # -p
    extra_options: tuple[str, ...]  # --extra_options K=V ...
    quantization: Mapping[str, Any] | None


_OFFLINE_OPTIONS = ("hf_token=false", "hf_remote=false")  # no hub authentication, no repository code
RECIPES: dict[str, Recipe] = {
    "fp32": Recipe("fp32", _OFFLINE_OPTIONS, None),
    "int4_wo": Recipe(
        "int4",
        (*_OFFLINE_OPTIONS, f"block_size={INT4_BLOCK_SIZE}", f"accuracy_level={INT4_ACCURACY_LEVEL}",
         "is_symmetric=true", "algo_config=default"),
        {"method": "rtn", "quantizer": "MatMulNBits default (MLAS block-wise round-to-nearest)", "bits": 4,
         "block_size": INT4_BLOCK_SIZE, "symmetric": True, "accuracy_level": INT4_ACCURACY_LEVEL,
         "calibration": None},
    ),
}
PRECISIONS = tuple(RECIPES)


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    model_dir: Path  # what the runner's --model-dir takes (genai_config.json, model.onnx, tokenizer)
    precision: str
    quantization: Mapping[str, Any] | None
    toolchain_version: str
    argv: list[str]
    wall_s: float
    peak_rss_bytes: int | None  # the builder's own VmHWM, sampled every 0.1 s (None where /proc is absent)
    size_bytes: int
    log: Path

    def to_dict(self) -> dict[str, object]:
        return {"out_dir": str(self.out_dir), "model_dir": str(self.model_dir), "precision": self.precision,
                "quantization": dict(self.quantization) if self.quantization is not None else None,
                "toolchain": DISTRIBUTION, "toolchain_version": self.toolchain_version, "argv": self.argv,
                "wall_s": round(self.wall_s, 3), "peak_rss_bytes": self.peak_rss_bytes,
                "size_bytes": self.size_bytes, "log": str(self.log)}


class BuilderFailed(TestFailure):
    """The builder ran and failed; ``log_tail`` holds the last lines of its output."""

    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(f"{message}; last lines of its log:\n{log_tail}")
        self.log_tail = log_tail


def toolchain_version(python: Path | None = None) -> str:
    """The installed distribution's version: in this interpreter's environment, or in ``python``'s (an
    environment of one version, for a version bisection)."""
    if python is not None:
        from edgefarm.toolchains.venvs import distribution_version

        found = distribution_version(Path(python).parent.parent, DISTRIBUTION)
        if found is None:
            raise InfrastructureError(f"{DISTRIBUTION} is not installed in {python}'s environment")
        return found
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise InfrastructureError(f"{DISTRIBUTION} is not installed in {sys.executable}'s environment "
                                  f"(pip install {DISTRIBUTION} onnx-ir)") from None


def builder_source(python: Path | None = None) -> Path:
    """The model builder's source file: of this interpreter's onnxruntime-genai (found without importing it), or of
    the one in ``python``'s environment."""
    if python is not None:
        env = Path(python).parent.parent
        found = sorted(env.glob("lib/python3*/site-packages/onnxruntime_genai/models/builder.py"))
        if not found:
            raise InfrastructureError(f"{DISTRIBUTION} has no model builder in {env}")
        return found[0]
    spec = importlib.util.find_spec("onnxruntime_genai")  # a top-level spec: the package is not imported
    if spec is None or not spec.submodule_search_locations:
        raise InfrastructureError(f"{DISTRIBUTION} is not installed in {sys.executable}'s environment")
    return Path(next(iter(spec.submodule_search_locations))) / "models" / "builder.py"


@functools.cache
def supported_architectures(source: Path | None = None) -> frozenset[str]:
    """The ``architectures[0]`` values the builder dispatches on, read from its source (no import); ``source``:
    :func:`builder_source` (default: this interpreter's)."""
    source = source or builder_source()
    if not source.is_file():
        raise InfrastructureError(f"{DISTRIBUTION} has no model builder at {source}")
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"), str(source))):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Subscript)
                and ast.unparse(node.left) == "config.architectures[0]"):
            found |= {c.value for c in node.comparators if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    if not found:
        raise InfrastructureError(f"found no architecture dispatch in {source}: the builder's layout changed")
    return frozenset(found)


def head_dim(config: Mapping[str, Any]) -> int | None:
    explicit = config.get("head_dim")
    if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit > 0:
        return explicit
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def applicability(config: Mapping[str, Any], precision: str | None = None, python: Path | None = None) -> str | None:
    """Why the builder cannot make a CPU model of this checkpoint config (at ``precision`` when given), naming the
    value and what is valid; None when it can. Decided from config.json alone, before anything runs. ``python``: the
    builder of that interpreter's environment is asked (default: this one's)."""
    reasons = []
    if precision is not None and precision not in RECIPES:
        reasons.append(f"precision {precision!r} is not one onnxruntime-genai's builder makes here; valid: "
                       f"{', '.join(PRECISIONS)}")
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    supported = supported_architectures(None if python is None else builder_source(python))
    if arch is None:
        reasons.append(f"config.json names no architectures (model_type {config.get('model_type')!r}); the "
                       f"builder dispatches on architectures[0], one of: {', '.join(sorted(supported))}")
    elif arch not in supported:
        reasons.append(f"architecture {arch} (model_type {config.get('model_type')!r}) is not one the builder "
                       f"supports; supported: {', '.join(sorted(supported))}")
    size = head_dim(config)
    if size is None:
        reasons.append("config.json gives no head_dim and no hidden_size/num_attention_heads to derive it")
    elif size % GQA_HEAD_MULTIPLE:
        reasons.append(f"head_dim {size} is not a multiple of {GQA_HEAD_MULTIPLE}: onnxruntime's CPU "
                       f"GroupQueryAttention kernel, which the builder's CPU graphs use, refuses it")
    return "; ".join(reasons) or None


def model_dir(out_dir: Path) -> Path:
    """The builder's output inside an export dir (the dir itself when given the model dir)."""
    out_dir = Path(out_dir)
    return out_dir / MODEL_SUBDIR if (out_dir / MODEL_SUBDIR / "genai_config.json").is_file() else out_dir


def builder_argv(checkpoint: Path, output: Path, cache: Path, precision: str,
                 python: Path | None = None) -> list[str]:
    recipe = RECIPES[precision]
    return [str(python or sys.executable), "-m", BUILDER_MODULE, "-i", str(checkpoint), "-o", str(output),
            "-p", recipe.builder_precision, "-e", "cpu", "-c", str(cache), "--extra_options", *recipe.extra_options]


def offline_env(scratch: Path) -> dict[str, str]:
    """The builder's environment: ours less our credentials (``devices.environment``), with the hub off and every
    cache it could write under ``scratch``."""
    return {**stage_environ(), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(scratch / "hf-home"), "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log, colour codes and progress-bar redraws (carriage returns) removed."""
    try:
        raw = Path(log).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    text = [ln.rsplit("\r", 1)[-1].rstrip() for ln in _ANSI.sub("", raw).split("\n")]
    return "\n".join([ln for ln in text if ln.strip()][-lines:]) or "(empty log)"


def export(checkpoint: Path, out_dir: Path, precision: str, *, timeout: float = TIMEOUT_S, log: Path,
           python: Path | None = None) -> ExportResult:
    """Build ``checkpoint`` at ``precision`` into ``out_dir`` (made atomically; must not exist): the builder's files
    in ``<out_dir>/model``, this result in ``<out_dir>/export.json``, the builder's output in ``log``. ``python``: the
    builder of that interpreter's environment runs (an environment of one version; default: this interpreter's).

    Raises UnsupportedError for what :func:`applicability` refuses, ConfigurationError for bad arguments,
    BuilderFailed (a TestFailure carrying the log's last lines) when the builder fails or writes no model,
    InfrastructureError on timeout or when onnxruntime-genai is not installed here.
    """
    checkpoint, out_dir, log = Path(checkpoint), Path(out_dir), Path(log)
    if precision not in RECIPES:
        raise ConfigurationError(f"unknown precision {precision!r} for onnxruntime-genai; valid: "
                                 f"{', '.join(PRECISIONS)}")
    config_file = checkpoint / "config.json"
    if not config_file.is_file():
        raise ConfigurationError(f"{checkpoint} is not a checkpoint (config.json not found)")
    if out_dir.exists():
        raise ConfigurationError(f"export output {out_dir} already exists")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{config_file} is not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigurationError(f"{config_file} holds {type(config).__name__}, not a JSON object")
    reason = applicability(config, precision, python)
    if reason is not None:
        raise UnsupportedError(f"onnxruntime-genai cannot export {checkpoint.name}: {reason}")
    version = toolchain_version(python)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        argv = builder_argv(checkpoint.resolve(), work / MODEL_SUBDIR, work / "cache", precision, python)
        run = run_tool(argv, env=offline_env(work), cwd=work, log=log, timeout=timeout,
                       what="the onnxruntime-genai builder")
        code = run.returncode
        if code != 0:
            raise BuilderFailed(f"the onnxruntime-genai builder failed (exit {code}) on {checkpoint}", log_tail(log))
        missing = [n for n in ("genai_config.json", "model.onnx") if not (work / MODEL_SUBDIR / n).is_file()]
        if missing:
            raise BuilderFailed(f"the onnxruntime-genai builder exited 0 but wrote no {', '.join(missing)} for "
                                f"{checkpoint}", log_tail(log))
        for scratch in ("cache", "hf-home"):
            shutil.rmtree(work / scratch, ignore_errors=True)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    result = ExportResult(out_dir, out_dir / MODEL_SUBDIR, precision, RECIPES[precision].quantization, version,
                          [a.replace(str(work), str(out_dir)) for a in argv], run.wall_s,
                          run.peak_rss_bytes or None, tree_bytes(out_dir / MODEL_SUBDIR), log)
    (out_dir / EXPORT_RECORD).write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result
