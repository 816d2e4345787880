"""Export a (quantized) checkpoint to TensorRT Edge-LLM's ONNX with ``tensorrt-edgellm-export``.

The tool writes ``<out>/llm/`` (model.onnx + model.onnx.data, embedding.safetensors, the runtime config.json,
tokenizer, chat template) and fails, after writing the ONNX, when the checkpoint has no chat template; so a
checkpoint without one is exported from a staging directory of links plus the template the catalog names
(default: :data:`DEFAULT_CHAT_TEMPLATE`, shipped here: the messages' text, nothing added, in the subset of
Jinja that the C++ runtime's Inja renderer shares). The source checkpoint is never modified.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgefarm.toolchains.process import run_tool, tree_bytes
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN
from edgefarm.toolchains.tensorrt_edgellm.calibration import offline_env
from edgefarm.toolchains.tensorrt_edgellm.env import installed_version, script
from edgefarm.toolchains.tensorrt_edgellm.quantize import has_chat_template
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.types import QuantMethod

DEFAULT_CHAT_TEMPLATE = Path(__file__).resolve().parent / "plain_chat_template.jinja"
# What the exporter (read in 0.11.0: tensorrt_edgellm/config.py, _parse_quant) takes from a checkpoint that is
# already quantized, besides ModelOpt checkpoints of its own quantizer's methods: Hugging Face's GPTQ (config.json
# quantization_config quant_method gptq; AutoGPTQ's qweight [in/8, out] int32, qzeros, scales, g_idx: its
# GPTQLinear) and AWQ (quant_method awq: its AWQLinear). Anything else it exports as fp16 without a word: ModelOpt's
# W4A16_GPTQ (_algo_to_quant_type has no GPTQ branch) or a quant_method fp8 config (no branch at all).
HF_PREQUANTIZED = (QuantMethod.INT4_GPTQ, QuantMethod.INT4_AWQ)
TIMEOUT_S = 1200  # the reference CI's export stage limit


@dataclass(frozen=True)
class ExportResult:
    onnx_dir: Path  # <out>/llm: what llm_build's --onnxDir takes
    toolchain_version: str
    argv: list[str]
    wall_s: float
    peak_rss_bytes: int
    size_bytes: int
    chat_template: str  # "checkpoint" or the path of the template supplied
    log: Path

    def to_dict(self) -> dict[str, object]:
        return {"onnx_dir": str(self.onnx_dir), "toolchain": TOOLCHAIN, "toolchain_version": self.toolchain_version,
                "argv": self.argv, "wall_s": round(self.wall_s, 3),
                "peak_rss_bytes": self.peak_rss_bytes, "size_bytes": self.size_bytes,
                "chat_template": self.chat_template, "log": str(self.log)}


def _staged(checkpoint: Path, template: Path, stage: Path) -> Path:
    stage.mkdir()
    for entry in sorted(checkpoint.iterdir()):
        (stage / entry.name).symlink_to(entry.resolve())
    shutil.copyfile(template, stage / "chat_template.jinja")
    return stage


def export(env: Path, checkpoint: Path, out_dir: Path, *, chat_template: Path | None = DEFAULT_CHAT_TEMPLATE,
           timeout: float = TIMEOUT_S, extra_args: Sequence[str] = ()) -> ExportResult:
    """Export ``checkpoint`` into ``out_dir`` (created atomically; must not exist).

    ``chat_template`` is used only when the checkpoint has none; ``extra_args`` go to the exporter after the
    positional arguments (e.g. its few-layer option). Raises TestFailure when the tool fails or writes no ONNX,
    InfrastructureError on timeout.
    """
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    if not (checkpoint / "config.json").is_file():
        raise ConfigurationError(f"{checkpoint} is not a checkpoint (config.json not found)")
    if out_dir.exists():
        raise ConfigurationError(f"export output {out_dir} already exists")
    own_template = has_chat_template(checkpoint)
    if not own_template and (chat_template is None or not Path(chat_template).is_file()):
        raise ConfigurationError(f"{checkpoint} has no chat template and none was supplied "
                                 f"(got {chat_template}); name one in the model catalog")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        source = checkpoint if own_template else _staged(checkpoint, Path(chat_template), work / "staged")
        argv = [str(script(env, "tensorrt-edgellm-export")), str(source), str(work / "onnx"), *extra_args]
        run = run_tool(argv, env=offline_env(cache_dir=work / "cache"), log=work / "export.log", timeout=timeout)
        if run.returncode != 0:
            raise TestFailure(f"tensorrt-edgellm-export failed (exit {run.returncode}) on {checkpoint}: "
                              f"{run.error_line()}")
        if not (work / "onnx" / "llm" / "model.onnx").is_file():
            raise TestFailure(f"tensorrt-edgellm-export exited 0 but wrote no llm/model.onnx for {checkpoint}")
        for scratch in ("staged", "cache"):
            shutil.rmtree(work / scratch, ignore_errors=True)
        os.replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    onnx_dir = out_dir / "onnx" / "llm"
    argv = [a.replace(str(work), str(out_dir)) for a in argv]
    result = ExportResult(onnx_dir, installed_version(env), argv, run.wall_s, run.peak_rss_bytes,
                          tree_bytes(out_dir / "onnx"), "checkpoint" if own_template else str(chat_template),
                          out_dir / "export.log")
    (out_dir / "export.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    return result
