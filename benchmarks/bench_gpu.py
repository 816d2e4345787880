"""The torch-CUDA engine on an NVIDIA GPU against transformers eager on the same GPU, one run (issue 12).

    python benchmarks/bench_gpu.py WORK_DIR [--output benchmarks/results/gpu.json] [--quick]

A random checkpoint with Qwen2.5-0.5B's shape (bf16, tied embeddings) is exported (fp16: the export's GPU
precision; bf16 export is not implemented) and built with ``--backend torch-cuda``. Measured, prompt 128 and 128
new tokens, greedy, end-of-sequence ignored:
- batch-1 decode tok/s: CUDA graph + torch.compile (the engine as built), the same with the decode attention
  through SDPA's fused kernel instead of two batched matmuls, CUDA graph only, transformers eager
  (fp16 and bf16, ``generate`` with its dynamic cache); ratios against transformers fp16;
- batch-16 aggregate decode tok/s (16 x the per-row decode rate) for the engine and transformers;
- TTFT at a 1,024-token prompt; export and engine build time; graph capture (+ compile) time; GPU memory;
- the weight-bandwidth each decode rate implies, against the device's HBM ceiling measured here by a copy.
Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import QWEN25_05B, make_checkpoint

PROMPT, NEW, LONG_PROMPT, BATCH = 128, 128, 1024, 16


def copy_bandwidth() -> float:
    """Bytes read + written per second by a 2 GiB device-to-device copy (median of 10)."""
    a = torch.empty(1 << 30, dtype=torch.float16, device="cuda").normal_()
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del a, b
    return 2 * (1 << 31) / statistics.median(times[2:])


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=length).tolist() for _ in range(n)]


def engine_decode(engine: Engine, batch: int, repeats: int) -> dict[str, float]:
    """Per-row decode tok/s and aggregate tok/s (median over repeats); ms_per_token excludes the first token."""
    rates, ttfts = [], []
    for r in range(repeats):
        reqs = [GenerationRequest(id=str(i), input_ids=ids, max_new_tokens=NEW)
                for i, ids in enumerate(prompts(batch, PROMPT, engine.config.vocab_size, r))]
        res = engine.generate(reqs)
        if any(len(x.output_ids) != NEW for x in res):
            raise RuntimeError("generation stopped early although end-of-sequence is ignored")
        rates.append(1000.0 / max(x.ms_per_token for x in res))
        ttfts.append(max(x.ttft_ms for x in res))
    row = statistics.median(rates)
    return {"row_tok_s": row, "aggregate_tok_s": row * batch, "ttft_ms": statistics.median(ttfts)}


def engine_ttft(engine: Engine, repeats: int) -> float:
    times = []
    for r in range(repeats):
        (ids,) = prompts(1, LONG_PROMPT, engine.config.vocab_size, 100 + r)
        times.append(engine.generate([GenerationRequest(id="t", input_ids=ids, max_new_tokens=1)])[0].ttft_ms)
    return statistics.median(times)


def hf_decode(ckpt: Path, dtype: torch.dtype, batch: int, repeats: int, vocab: int) -> dict[str, float]:
    """transformers eager ``generate`` on the GPU: (time for 1 + NEW tokens - time for 1 token) / NEW."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).cuda().eval()
    rates = []

    def timed(ids: torch.Tensor, n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t

    for r in range(repeats + 1):
        ids = torch.tensor(prompts(batch, PROMPT, vocab, r), device="cuda")
        first = timed(ids, 1)
        whole = timed(ids, NEW + 1)
        if r:  # the first pass warms up
            rates.append(NEW / (whole - first))
    row = statistics.median(rates)
    return {"row_tok_s": row, "aggregate_tok_s": row * batch}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("work_dir", type=Path)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/gpu.json"))
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    work = a.work_dir
    work.mkdir(parents=True, exist_ok=True)
    ckpt = work / "qwen25_05b_bf16"
    t = time.perf_counter()
    if not (ckpt / "config.json").is_file():
        make_checkpoint(ckpt, "qwen2", dtype="bf16", seed=0, **QWEN25_05B)
    make_s = time.perf_counter() - t
    t = time.perf_counter()
    export_checkpoint(ckpt, work / "onnx", "fp16", overwrite=True)
    export_s = time.perf_counter() - t
    manifest = build_engine(work / "onnx", work / "engine", "torch-cuda", max_batch_size=BATCH,
                            max_input_len=LONG_PROMPT, max_seq_len=LONG_PROMPT + NEW, overwrite=True)
    ceiling = copy_bandwidth()
    torch.cuda.reset_peak_memory_stats()

    t = time.perf_counter()
    engine = Engine.open(work / "engine")
    open_s = time.perf_counter() - t
    engine.eos_ids = frozenset()  # exactly NEW tokens every time
    session: Any = engine.session
    t = time.perf_counter()
    session.warm_up([1, BATCH])
    capture_compiled_s = time.perf_counter() - t
    results: dict[str, Any] = {"engine_compiled_graph": {
        "batch1": engine_decode(engine, 1, a.repeats), f"batch{BATCH}": engine_decode(engine, BATCH, a.repeats),
        "ttft_ms_prompt_1024": engine_ttft(engine, 5)}}
    memory = session.memory()
    weight_bytes = memory["weights_bytes"]

    # the same engine with the decode step built other ways (one session on the GPU at a time)
    from edgellm.backends.torch_cuda import ENGINE_DATA, WEIGHT_TABLE, read_table
    from edgellm.runtime.cuda_graph import TorchCudaSession

    del session
    capture_s = {"compiled_graph": round(capture_compiled_s, 2)}
    for name, compile_decode, sdpa in (("graph_only", False, False), ("compiled_graph_sdpa", True, True)):
        engine.session = None  # type: ignore[assignment]
        torch.cuda.empty_cache()
        engine.session = TorchCudaSession(
            work / "engine" / ENGINE_DATA, read_table(work / "engine" / WEIGHT_TABLE), engine.config,
            io=manifest["io"], max_batch_size=BATCH, max_seq_len=LONG_PROMPT + NEW, compile_decode=compile_decode,
            decode_sdpa=sdpa)
        t = time.perf_counter()
        engine.session.warm_up([1, BATCH])
        capture_s[name] = round(time.perf_counter() - t, 2)
        results[f"engine_{name}"] = {"batch1": engine_decode(engine, 1, a.repeats),
                                     f"batch{BATCH}": engine_decode(engine, BATCH, a.repeats)}
    engine.session = None  # type: ignore[assignment]
    torch.cuda.empty_cache()

    vocab = engine.config.vocab_size
    results["transformers_eager_fp16"] = {"batch1": hf_decode(ckpt, torch.float16, 1, a.repeats, vocab),
                                          f"batch{BATCH}": hf_decode(ckpt, torch.float16, BATCH, 2, vocab)}
    torch.cuda.empty_cache()
    results["transformers_eager_bf16"] = {"batch1": hf_decode(ckpt, torch.bfloat16, 1, a.repeats, vocab)}

    hf1 = results["transformers_eager_fp16"]["batch1"]["row_tok_s"]
    hf16 = results["transformers_eager_fp16"][f"batch{BATCH}"]["aggregate_tok_s"]
    ours1 = results["engine_compiled_graph"]["batch1"]["row_tok_s"]
    ours16 = results["engine_compiled_graph"][f"batch{BATCH}"]["aggregate_tok_s"]
    props = torch.cuda.get_device_properties(0)
    report = {
        "settings": {"model": "random Qwen2.5-0.5B shape (qwen2, tied), checkpoint bf16, engine fp16",
                     "prompt_len": PROMPT, "new_tokens": NEW, "batch": BATCH, "ttft_prompt_len": LONG_PROMPT,
                     "repeats": a.repeats, "greedy": True},
        "machine": {"gpu": props.name, "sm": f"{props.major}.{props.minor}", "torch": torch.__version__,
                    "cuda": torch.version.cuda, "python": platform.python_version(),
                    "hbm_copy_bytes_per_s": ceiling},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "times_s": {"make_checkpoint": round(make_s, 2), "export": round(export_s, 2),
                    "build": manifest["build_seconds"], "engine_open": round(open_s, 2),
                    "capture_b1_b16": capture_s},
        "gpu_memory": memory,
        "results": results,
        "ratios": {"batch1_vs_transformers_fp16": ours1 / hf1, f"batch{BATCH}_vs_transformers_fp16": ours16 / hf16,
                   "batch1_compiled_vs_graph_only": ours1 / results["engine_graph_only"]["batch1"]["row_tok_s"]},
        "bandwidth": {"weight_bytes": weight_bytes, "ceiling_tok_s": ceiling / weight_bytes,
                      "batch1_fraction_of_ceiling": ours1 * weight_bytes / ceiling},
    }
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(report, indent=2) + "\n")
    rows = [("engine: CUDA graph + torch.compile", results["engine_compiled_graph"]),
            ("engine: same, decode attention by SDPA", results["engine_compiled_graph_sdpa"]),
            ("engine: CUDA graph only", results["engine_graph_only"]),
            ("transformers eager fp16", results["transformers_eager_fp16"]),
            ("transformers eager bf16", results["transformers_eager_bf16"])]
    print(f"{'decode (prompt 128, 128 new)':44} {'batch-1 tok/s':>14} {f'batch-{BATCH} agg tok/s':>18}")
    for name, r in rows:
        b16 = r.get(f"batch{BATCH}", {}).get("aggregate_tok_s")
        print(f"{name:44} {r['batch1']['row_tok_s']:14.1f} {b16 if b16 is None else round(b16, 1)!s:>18}")
    print(f"ratio batch-1 vs transformers fp16: {ours1 / hf1:.1f}x; batch-{BATCH}: {ours16 / hf16:.1f}x; "
          f"batch-1 at {100 * ours1 * weight_bytes / ceiling:.1f}% of the copy-bandwidth ceiling "
          f"({ceiling / weight_bytes:.0f} tok/s)")
    print(f"TTFT prompt {LONG_PROMPT}: {results['engine_compiled_graph']['ttft_ms_prompt_1024']:.2f} ms; "
          f"export {export_s:.1f} s, build {manifest['build_seconds']:.2f} s, open {open_s:.2f} s, "
          f"capture+compile b1,b16 {capture_compiled_s:.1f} s; GPU memory: weights "
          f"{weight_bytes / 2**30:.2f} GiB, KV {memory['kv_cache_bytes'] / 2**30:.2f} GiB, "
          f"peak allocated {memory['max_allocated_bytes'] / 2**30:.2f} GiB")
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
