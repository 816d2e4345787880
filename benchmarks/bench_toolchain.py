"""Benchmark NVIDIA's tensorrt-edgellm host stages on this CPU: quantize and export time and peak memory per method.

Models: the catalog's tiny-qwen3-128 and a random checkpoint with Qwen2.5-0.5B's shape (fp16, ~1 GB), so a lab can
size the hosts that run ``l0_checkpoint_export``. Each row runs the real tools through the farm's own functions
(toolchains.tensorrt_edgellm): quantize (``--device cpu``, shipped calibration text, no hub) then export; ``fp16``
is the unquantized export alone. Peak memory is the child process's maximum RSS.
Usage: ``python benchmarks/bench_toolchain.py [--models tiny,qwen05b] [--methods fp16,fp8,...] [--num-samples 16]
[--timeout 1200] [--env DIR] [--output benchmarks/results/toolchain.json]``. The JSON is rewritten after every row,
so a long run stopped part-way keeps what finished. Rows on a shared 2-core machine are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgefarm.toolchains.tensorrt_edgellm import DEFAULT_VERSION  # noqa: E402
from edgefarm.toolchains.tensorrt_edgellm.env import install  # noqa: E402
from edgefarm.toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE, export  # noqa: E402
from edgefarm.toolchains.tensorrt_edgellm.onnx_check import check_onnx  # noqa: E402
from edgefarm.toolchains.tensorrt_edgellm.quantize import METHODS, quantize  # noqa: E402
from edgellm.errors import EdgeLLMError  # noqa: E402

MB = 2**20


def make_model(name: str, root: Path) -> Path:
    from edgefarm.test_lists.catalog import Catalog
    from edgellm.synth import QWEN25_05B, make_checkpoint

    if name == "tiny":
        return Catalog.load().get("tiny-qwen3-128").locate(root)
    if name == "qwen05b":
        return make_checkpoint(root / "qwen2.5-0.5b-shape", "qwen2", dtype="fp16", **QWEN25_05B)
    raise SystemExit(f"unknown model {name!r}; valid: tiny, qwen05b")


def bench_row(env: Path, model: str, checkpoint: Path, method: str, work: Path, num_samples: int,
              timeout: float) -> dict[str, Any]:
    row: dict[str, Any] = {"model": model, "method": method}
    source = checkpoint
    expected = 0
    try:
        if method != "fp16":
            q = quantize(env, checkpoint, work / f"{model}-{method}-q", method, chat_template=DEFAULT_CHAT_TEMPLATE,
                         num_samples=num_samples, timeout=timeout)
            row.update(quantize_s=round(q.wall_s, 2), quantize_peak_mb=round(q.peak_rss_bytes / MB),
                       checkpoint_mb=round(q.size_bytes / MB, 1), quantized_linears=len(q.report.quantized))
            source, expected = q.checkpoint, len(q.report.quantized)
        x = export(env, source, work / f"{model}-{method}-x", timeout=timeout)
        onnx = check_onnx(x.onnx_dir, expected_quantized=expected)
        row.update(export_s=round(x.wall_s, 2), export_peak_mb=round(x.peak_rss_bytes / MB),
                   onnx_mb=round(x.size_bytes / MB, 1), onnx_problems=onnx.problems)
    except EdgeLLMError as exc:
        row["error"] = f"{exc.kind.value}: {exc}"
    return row


def table(rows: list[dict[str, Any]]) -> str:
    cols = ("model", "method", "quantize_s", "quantize_peak_mb", "checkpoint_mb", "export_s", "export_peak_mb",
            "onnx_mb")
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    for r in rows:
        lines.append(" | ".join(str(r.get(c, "-")) for c in cols) + (f"  ERROR {r['error']}" if "error" in r else ""))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,qwen05b")
    parser.add_argument("--methods", default=",".join(["fp16", *(m.value for m in METHODS)]))
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per tool run (reference CI: 1200)")
    parser.add_argument("--env", type=Path, help="an installed tensorrt-edgellm environment (default: install one "
                                                 "under ~/.cache/edgellm-farm/toolchains)")
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "toolchain.json")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    env = args.env or install(Path.home() / ".cache" / "edgellm-farm" / "toolchains", DEFAULT_VERSION).path
    result: dict[str, Any] = {"benchmark": "tensorrt-edgellm host stages (CPU)", "toolchain_version": DEFAULT_VERSION,
                              "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
                              "num_samples": args.num_samples, "timeout_s": args.timeout,
                              "load_average_at_start": os.getloadavg()[0], "rows": []}
    work = Path(tempfile.mkdtemp(prefix="bench-toolchain-"))
    try:
        for model in args.models.split(","):
            checkpoint = make_model(model, work)
            for method in args.methods.split(","):
                started = time.monotonic()
                row = bench_row(env, model, checkpoint, method, work, args.num_samples, args.timeout)
                row["total_s"] = round(time.monotonic() - started, 2)
                result["rows"].append(row)
                print(json.dumps(row), flush=True)
                args.output.parent.mkdir(parents=True, exist_ok=True)
                args.output.write_text(json.dumps(result, indent=2) + "\n")
                for leftover in work.glob(f"{model}-{method}-*"):
                    shutil.rmtree(leftover, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(result["rows"]))


if __name__ == "__main__":
    main()
