"""Does it fit, on an NVIDIA GPU: ``edgellm memory``'s estimate against what a torch-cuda engine really allocated
(``edgellm bench``'s ``cuda_peak_allocated_bytes``: the torch allocator's peak, which holds the weights, the KV cache
and the activations; the CUDA context is the runtime's reserve, outside the allocator, so it is compared apart).

Self-contained (no conftest fixtures) so the GPU machine runs it with ``--noconftest``; ``make test`` deselects it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.memory import estimate_checkpoint, load_copy
from edgellm.synth import make_checkpoint

pytestmark = pytest.mark.gpu

MIB = 2**20
SHAPES = dict(max_batch_size=2, max_input_len=64, max_seq_len=256)
# ~110M parameters: embeddings and LM head of 32k x 1024, four layers with GQA 16/4 (a small Llama's widths)
MID = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
           num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_estimate_within_15_percent_of_the_allocated_peak_on_the_gpu(tmp_path: Path, precision: str) -> None:
    ckpt = make_checkpoint(tmp_path / "ckpt", "llama", dtype="bf16", **MID)
    export_checkpoint(ckpt, tmp_path / "onnx", precision)
    build_engine(tmp_path / "onnx", tmp_path / "engine", "torch-cuda", **SHAPES)
    done = subprocess.run([sys.executable, "-m", "edgellm", "bench", "--engine-dir", str(tmp_path / "engine"),
                           "--mode", "prefill", "--batch-size", "2", "--input-len", "64", "--past-len", "192",
                           "--warmup", "1", "--iterations", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    allocated = int(report["cuda_peak_allocated_bytes"])
    found = estimate_checkpoint(ckpt, precision, float_dtype=precision, reserve=None,
                                load_copy=load_copy("edgellm-torch-cuda"), **SHAPES)
    engine_part = found.total_bytes - found.parts["runtime_reserve"]
    print(json.dumps({"precision": precision, "estimate_mib": engine_part / MIB, "allocated_mib": allocated / MIB,
                      "reserved_mib": report.get("cuda_peak_reserved_bytes", 0) / MIB,
                      "peak_rss_mib": report.get("peak_memory_bytes", 0) / MIB,
                      "parts_mib": {k: v / MIB for k, v in found.parts.items()}}))
    assert abs(engine_part - allocated) <= 0.15 * allocated, (
        f"{precision}: estimate {engine_part / MIB:.1f} MiB (reserve apart), allocated {allocated / MIB:.1f} MiB "
        f"({found.parts})")
