"""The torch-CUDA engine on an NVIDIA GPU against transformers eager on the same GPU, one run (issues 12, 25).

    python benchmarks/bench_gpu.py WORK_DIR [--output benchmarks/results/gpu-bf16.json] [--precisions bf16,fp16]
        [--transformers bf16] [--repeats 3] [--variants] [--profile] [--hf-static] [--shape qwen2.5-0.5b|tiny]
        [--no-pdl | --pdl [--prefetch]]

A random checkpoint with Qwen2.5-0.5B's shape (bf16, tied embeddings) is exported at each engine precision (bf16 first:
the issue's benchmark row; fp16 beside it) and built with ``--backend torch-cuda``. Measured per engine, prompt 128
and 128 new tokens, greedy, end-of-sequence ignored:
- batch-1 decode tok/s and batch-16 aggregate decode tok/s (16 x the per-row rate), the engine as built (decode
  step through the fused kernels, one CUDA graph per batch size);
- TTFT of a 128-token prompt: the first request after open, and the steady state (median of the next 10); the
  first-call cost paid at open (prefills, Triton compiles, graph captures) beside them; TTFT at 1,024 tokens;
- export and engine build time; engine open time; GPU memory (weights, KV cache, peak allocated, device used);
- with ``--profile``: the decode graphs of batch 1 and 16 replayed: wall time per step, kernels per step, the
  heaviest kernels, the gap between wall and kernel time;
- with ``--variants``: the same engine through the layer modules (torch.compile + CUDA graph: issue 19's engine).
transformers eager ``generate`` (dynamic cache) at each ``--transformers`` dtype, batch 1 and 16, gives the ratios;
with ``--hf-static``, transformers with a static cache and its forward compiled, in a child process (a crash is
reported as such);
the weight bandwidth a decode rate implies is set against the device's HBM ceiling, measured here by a copy.
The JSON is rewritten after every stage, so a run cut short keeps what it measured. ``--shape tiny`` (a small
Qwen2 shape) exercises the script where there is no GPU: it exports, then stops with the build's refusal.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.errors import EdgeLLMError
from edgellm.runtime import Engine, GenerationRequest
from edgellm.synth import QWEN25_05B, make_checkpoint

PROMPT, NEW, LONG_PROMPT, BATCH = 128, 128, 1024, 16
SHAPES = {"qwen2.5-0.5b": QWEN25_05B,
          "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=2048)}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# issue 25's targets (bf16): batch-1 >= 1,700 tok/s (issue 12's: >= 15x transformers eager), batch-16 >= 20,000
# tok/s aggregate, TTFT of a 128-token prompt <= 10 ms in steady state (the first-call cost reported beside it)
TARGETS = {"batch1_vs_transformers": 15.0, "batch1_tok_s": 1700.0, "batch16_tok_s": 20000.0,
           "ttft_ms_prompt_128_steady": 10.0}
# transformers static cache + torch.compile runs in a child process (it segfaulted on the H200), this long at most
STATIC_TIMEOUT_S = int(os.environ.get("BENCH_STATIC_TIMEOUT_S", "240"))


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
    torch.cuda.empty_cache()
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


def engine_ttft(engine: Engine, repeats: int, length: int = LONG_PROMPT) -> list[float]:
    """TTFT (ms) of ``repeats`` single-token generations of a ``length``-token prompt, in order."""
    times = []
    for r in range(repeats):
        (ids,) = prompts(1, length, engine.config.vocab_size, 100 + r)
        times.append(engine.generate([GenerationRequest(id="t", input_ids=ids, max_new_tokens=1)])[0].ttft_ms)
    return times


def release(engine: Engine | None) -> None:
    """Free the GPU memory of an engine's session (one session on the GPU at a time)."""
    if engine is not None:
        engine.session = None  # type: ignore[assignment]
    gc.collect()
    torch.cuda.empty_cache()


def profile_decode(session: Any, batch: int, steps: int = 50) -> dict[str, Any]:
    """The greedy decode graph of ``batch`` replayed ``steps`` times over a 128-column cache: wall time per step
    (CUDA events), then under torch.profiler the kernels one step runs (count, GPU time, the heaviest); the gap
    (wall minus kernel time) is launch latency and idle between kernels."""
    graph = session._graph(batch, greedy=True)
    m = session.model

    def reset() -> None:
        session.write_idx.fill_(PROMPT)
        m.valid[:batch, :PROMPT] = True
        m.valid[:batch, PROMPT:] = False
        session.positions[:batch].fill_(PROMPT)

    with torch.cuda.stream(session.stream):
        reset()
        graph.replay()
        reset()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(session.stream)
        for _ in range(steps):
            graph.replay()
        end.record(session.stream)
    end.synchronize()
    wall_us = start.elapsed_time(end) * 1e3 / steps
    from torch.profiler import ProfilerActivity, profile

    n = 10
    with torch.cuda.stream(session.stream):
        reset()
    session.stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(session.stream):
            for _ in range(n):
                graph.replay()
        session.stream.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    total = sum(e.self_device_time_total for e in kernels) / n
    top = sorted(kernels, key=lambda e: -e.self_device_time_total)[:15]
    return {"batch": batch, "wall_us_per_step": wall_us, "tok_s_graph_replay": batch * 1e6 / wall_us,
            "kernels_per_step": sum(e.count for e in kernels) / n, "kernel_us_per_step": total,
            "gap_us_per_step": wall_us - total,
            "top_kernels": [{"name": e.key[:90], "calls_per_step": e.count / n,
                             "us_per_step": e.self_device_time_total / n} for e in top]}


def profile_prefill(engine: Engine, length: int = PROMPT) -> dict[str, Any]:
    """Where a steady-state prefill of one ``length``-token prompt spends its time: the host's time to queue it,
    the wall time to its end, and under torch.profiler the GPU kernel time and count (TTFT's parts)."""
    from torch.profiler import ProfilerActivity, profile

    session: Any = engine.session
    ids = np.array(prompts(1, length, engine.config.vocab_size, 7), dtype=np.int64)
    mask = np.ones_like(ids)
    pos = np.arange(length)[None]

    def once() -> tuple[float, float]:
        session.stream.synchronize()
        t = time.perf_counter()
        with torch.cuda.stream(session.stream):
            session._prefill(ids, pos, mask, 0, length - 1)
        queued = time.perf_counter() - t
        session.stream.synchronize()
        return queued * 1e3, (time.perf_counter() - t) * 1e3

    runs = [once() for _ in range(5)]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        once()
    with torch.cuda.stream(session.stream):
        session.model.valid.fill_(False)
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    return {"prompt": length, "host_queue_ms": statistics.median(r[0] for r in runs),
            "wall_ms": statistics.median(r[1] for r in runs), "kernels": sum(e.count for e in kernels),
            "kernel_ms": sum(e.self_device_time_total for e in kernels) / 1e3}


def measure_engine(work: Path, ckpt: Path, precision: str, repeats: int, variants: bool,
                   profile: bool = False) -> dict[str, Any]:
    onnx_dir, engine_dir = work / f"onnx_{precision}", work / f"engine_{precision}"
    t = time.perf_counter()
    export_checkpoint(ckpt, onnx_dir, precision, overwrite=True)
    export_s = time.perf_counter() - t
    manifest = build_engine(onnx_dir, engine_dir, "torch-cuda", max_batch_size=BATCH, max_input_len=LONG_PROMPT,
                            max_seq_len=LONG_PROMPT + NEW, overwrite=True)
    release(None)
    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    engine = Engine.open(engine_dir)  # warms up: prefills, the decode graphs of batch 1 and 16
    open_s = time.perf_counter() - t
    engine.eos_ids = frozenset()  # exactly NEW tokens every time
    # the first request after open, then the steady state (its kernels loaded, compiled and captured at open)
    ttft128 = engine_ttft(engine, 11, PROMPT)
    out: dict[str, Any] = {
        "manifest_precision": manifest["precision"], "export_precision": manifest["export_precision"],
        "fused_kernels": engine.session.model.fused,  # type: ignore[attr-defined]
        "ttft_ms_prompt_128": {"first_call": ttft128[0], "steady": statistics.median(ttft128[1:]),
                               "first_call_cost_at_open_s": engine.session.warm_up_s},  # type: ignore[attr-defined]
        "batch1": engine_decode(engine, 1, repeats), f"batch{BATCH}": engine_decode(engine, BATCH, repeats),
        "ttft_ms_prompt_1024": statistics.median(engine_ttft(engine, 5)),
        "memory": engine.session.memory(),  # type: ignore[attr-defined]
        "times_s": {"export": round(export_s, 2), "build": manifest["build_seconds"], "engine_open": round(open_s, 2),
                    "warm_up_at_open": round(engine.session.warm_up_s, 2)}}  # type: ignore[attr-defined]
    if profile:
        out["profile"] = [profile_decode(engine.session, b) for b in (1, BATCH)]
        out["profile_prefill"] = profile_prefill(engine)
    if variants:  # the layer modules' decode step (issue 19's engine): torch.compile'd, then graph-only
        from edgellm.backends.torch_cuda import ENGINE_DATA, WEIGHT_TABLE, read_table
        from edgellm.backends.torch_cuda.session import TorchCudaSession

        for name, compile_decode in (("layer_modules_compiled_graph", True),):
            release(engine)
            t = time.perf_counter()
            engine.session = TorchCudaSession(
                engine_dir / ENGINE_DATA, read_table(engine_dir / WEIGHT_TABLE), engine.config, io=manifest["io"],
                max_batch_size=BATCH, max_seq_len=LONG_PROMPT + NEW, compile_decode=compile_decode, fused=False)
            out["times_s"][f"open_{name}"] = round(time.perf_counter() - t, 2)
            ttft = engine_ttft(engine, 6, PROMPT)
            out[f"variant_{name}"] = {"batch1": engine_decode(engine, 1, repeats),
                                      f"batch{BATCH}": engine_decode(engine, BATCH, repeats),
                                      "ttft_ms_prompt_128": {"first_call": ttft[0],
                                                             "steady": statistics.median(ttft[1:])}}
            if profile:
                out[f"variant_{name}"]["profile"] = [profile_decode(engine.session, 1)]
    release(engine)
    return out


def hf_decode(ckpt: Path, dtype: torch.dtype, repeats: int, vocab: int) -> dict[str, dict[str, float]]:
    """transformers eager ``generate`` on the GPU, batch 1 and 16: (time for 1 + NEW tokens - time for 1) / NEW."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=dtype).cuda().eval()

    def timed(ids: torch.Tensor, n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t

    results = {}
    for batch in (1, BATCH):
        rates = []
        for r in range(repeats + 1):
            ids = torch.tensor(prompts(batch, PROMPT, vocab, r), device="cuda")
            first = timed(ids, 1)
            whole = timed(ids, NEW + 1)
            if r:  # the first pass warms up
                rates.append(NEW / (whole - first))
        row = statistics.median(rates)
        results[f"batch{batch}"] = {"row_tok_s": row, "aggregate_tok_s": row * batch}
    return results  # the model goes with this frame; the caller releases its memory


def hf_static_child(ckpt: Path, out: Path) -> None:
    """In a child process: transformers ``generate`` with a static cache and the forward compiled
    (mode reduce-overhead: CUDA graphs), bf16, batch 1 and 16; rates as ``hf_decode``'s."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).cuda().eval()
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    vocab = model.config.vocab_size

    def timed(ids: torch.Tensor, n: int) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0, cache_implementation="static")
        torch.cuda.synchronize()
        return time.perf_counter() - t

    results: dict[str, Any] = {}
    for batch in (1, BATCH):
        ids = torch.tensor(prompts(batch, PROMPT, vocab, 0), device="cuda")
        for _ in range(2):  # compiles and captures
            timed(ids, 1), timed(ids, NEW + 1)
        row = NEW / (timed(ids, NEW + 1) - timed(ids, 1))
        results[f"batch{batch}"] = {"row_tok_s": row, "aggregate_tok_s": row * batch}
        out.write_text(json.dumps(results))


def hf_static(ckpt: Path, work: Path) -> dict[str, Any]:
    """``hf_static_child`` in a subprocess: its rates, or how it failed (a crash is a result, not a stop)."""
    import signal
    import subprocess

    out = work / "hf_static.json"
    out.unlink(missing_ok=True)
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, __file__, str(work), "--hf-static-child", str(ckpt), str(out)],
                              capture_output=True, text=True, timeout=STATIC_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # what it measured before (it writes after each batch size) still counts
        done = json.loads(out.read_text()) if out.is_file() else {}
        return {**done, "status": f"timed out after {STATIC_TIMEOUT_S} s (compiling and capturing)"}
    res: dict[str, Any] = json.loads(out.read_text()) if out.is_file() else {}
    res["seconds"] = round(time.perf_counter() - t, 1)
    if proc.returncode == 0:
        res["status"] = "ran"
    else:
        rc = proc.returncode
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit {rc}"
        res["status"] = f"crashed ({how})"
        res["stderr_tail"] = proc.stderr[-1500:]
    return res


def ratios(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    hf, engines = report["transformers_eager"], report["engines"]
    for p, e in engines.items():
        for b in ("batch1", f"batch{BATCH}"):
            for ref, h in hf.items():
                if b in e and b in h:
                    out[f"{p}_{b}_vs_transformers_{ref}"] = e[b]["aggregate_tok_s"] / h[b]["aggregate_tok_s"]
    bf16, hf16 = engines.get("bf16"), hf.get("bf16")
    if bf16 and hf16:
        b1, b16 = bf16["batch1"]["row_tok_s"], bf16[f"batch{BATCH}"]["aggregate_tok_s"]
        out["targets"] = {
            "batch1_vs_transformers_bf16": {"value": b1 / hf16["batch1"]["row_tok_s"],
                                            "target": TARGETS["batch1_vs_transformers"]},
            "batch1_tok_s": {"value": b1, "target": TARGETS["batch1_tok_s"]},
            "batch16_tok_s": {"value": b16, "target": TARGETS["batch16_tok_s"]}}
        for t in out["targets"].values():
            t["met"] = t["value"] >= t["target"]
        ttft = bf16["ttft_ms_prompt_128"]["steady"]
        out["targets"]["ttft_ms_prompt_128_steady"] = {"value": ttft, "target": TARGETS["ttft_ms_prompt_128_steady"],
                                                       "met": ttft <= TARGETS["ttft_ms_prompt_128_steady"],
                                                       "first_call_ms": bf16["ttft_ms_prompt_128"]["first_call"]}
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("work_dir", type=Path)
    p.add_argument("--output", type=Path, default=Path("benchmarks/results/gpu-bf16.json"))
    p.add_argument("--precisions", default="bf16,fp16", help="engine precisions, in order (bf16 is the issue's row)")
    p.add_argument("--transformers", default="bf16", help="dtypes of the transformers eager baseline")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--variants", action="store_true",
                   help="also time the layer modules' decode step (torch.compile + CUDA graph, issue 19's engine)")
    p.add_argument("--profile", action="store_true", help="profile the decode graphs (kernels per step, gaps)")
    p.add_argument("--hf-static", action="store_true",
                   help="also transformers with a static cache, compiled, in a child process (a crash is reported)")
    p.add_argument("--hf-static-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    p.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=None,
                   help="launch the fused kernels as programmatic dependent launches (default: as shipped, on where "
                   "the GPU has it); --no-pdl: the plain launch (the A/B of issue 39)")
    p.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                   help="under dependent launch, GEMVs prefetch their weights into L2 first (default: as shipped, off)")
    a = p.parse_args()
    if a.hf_static_child:
        hf_static_child(*a.hf_static_child)
        return 0
    precisions = [x for x in a.precisions.split(",") if x]
    hf_dtypes = [x for x in a.transformers.split(",") if x]
    work = a.work_dir
    work.mkdir(parents=True, exist_ok=True)
    pdl = None
    if torch.cuda.is_available():
        from edgellm.backends.torch_cuda import kernels

        kernels.PDL = kernels.PDL if a.pdl is None else a.pdl
        kernels.PDL_PREFETCH = kernels.PDL_PREFETCH if a.prefetch is None else a.prefetch
        pdl = kernels.pdl(torch.device("cuda"))
    report: dict[str, Any] = {
        "settings": {"model": f"random {a.shape} shape (qwen2, tied), checkpoint bf16", "engines": precisions,
                     "prompt_len": PROMPT, "new_tokens": NEW, "batch": BATCH, "ttft_prompt_len": LONG_PROMPT,
                     "repeats": a.repeats, "greedy": True, "command": " ".join(sys.argv),
                     "programmatic_dependent_launch": pdl,
                     "pdl_l2_prefetch": bool(pdl and kernels.PDL_PREFETCH)},
        "machine": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                    "load_avg_at_start": list(os.getloadavg())},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "times_s": {}, "engines": {}, "transformers_eager": {}}

    def save() -> None:
        report["ratios"] = ratios(report)
        a.output.parent.mkdir(parents=True, exist_ok=True)
        a.output.write_text(json.dumps(report, indent=2) + "\n")

    ckpt = work / f"{a.shape}_bf16"
    try:
        t = time.perf_counter()
        if not (ckpt / "config.json").is_file():
            make_checkpoint(ckpt, "qwen2", dtype="bf16", seed=0, **SHAPES[a.shape])
        report["times_s"]["make_checkpoint"] = round(time.perf_counter() - t, 2)
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            report["machine"].update(gpu=props.name, sm=f"{props.major}.{props.minor}",
                                     hbm_copy_bytes_per_s=copy_bandwidth())
        save()
        vocab = int(json.loads((ckpt / "config.json").read_text())["vocab_size"])
        # the first engine, then its baseline (the headline ratio), then the others: a run cut short keeps the row
        for step in [("engine", precisions[0]), *(("transformers", d) for d in hf_dtypes),
                     *(("engine", p) for p in precisions[1:])]:
            if step[0] == "engine":
                report["engines"][step[1]] = e = measure_engine(work, ckpt, step[1], a.repeats, a.variants,
                                                                a.profile and step[1] == precisions[0])
                t128 = e["ttft_ms_prompt_128"]
                print(f"engine {step[1]}: batch-1 {e['batch1']['row_tok_s']:.1f} tok/s, batch-{BATCH} "
                      f"{e[f'batch{BATCH}']['aggregate_tok_s']:.1f} tok/s, TTFT@{LONG_PROMPT} "
                      f"{e['ttft_ms_prompt_1024']:.2f} ms, TTFT@{PROMPT} steady {t128['steady']:.2f} ms (first "
                      f"call {t128['first_call']:.2f} ms), build {e['times_s']['build']:.2f} s, warm-up at open "
                      f"{e['times_s']['warm_up_at_open']:.1f} s, weights {e['memory']['weights_bytes'] / 2**30:.2f} "
                      f"GiB, peak {e['memory']['max_allocated_bytes'] / 2**30:.2f} GiB", flush=True)
                if "profile_prefill" in e:
                    print(f"  profile prefill: {json.dumps(e['profile_prefill'])}", flush=True)
                for prof in e.get("profile", []):
                    print(f"  profile b{prof['batch']}: {prof['wall_us_per_step']:.1f} us/step, "
                          f"{prof['kernels_per_step']:.0f} kernels, {prof['kernel_us_per_step']:.1f} us in kernels",
                          flush=True)
            else:
                report["transformers_eager"][step[1]] = h = hf_decode(ckpt, DTYPES[step[1]], a.repeats, vocab)
                release(None)
                print(f"transformers eager {step[1]}: batch-1 {h['batch1']['row_tok_s']:.1f} tok/s, batch-{BATCH} "
                      f"{h[f'batch{BATCH}']['aggregate_tok_s']:.1f} tok/s", flush=True)
            save()
        if a.hf_static:
            report["transformers_static_compiled"] = h = hf_static(ckpt, work)
            print(f"transformers static cache + compile bf16: {json.dumps(h)[:600]}", flush=True)
            save()
    except EdgeLLMError as exc:
        report["error"] = {"kind": exc.kind.value, "message": str(exc)}
        save()
        print(f"bench_gpu: stopped ({exc.kind.value}): {exc}", file=sys.stderr)
        return 2
    if "bf16" in report["engines"] and report.get("machine", {}).get("hbm_copy_bytes_per_s"):
        weights = report["engines"]["bf16"]["memory"]["weights_bytes"]
        ceiling = report["machine"]["hbm_copy_bytes_per_s"]
        report["bandwidth"] = {"weight_bytes": weights, "ceiling_tok_s": ceiling / weights,
                               "bf16_batch1_fraction_of_ceiling":
                                   report["engines"]["bf16"]["batch1"]["row_tok_s"] * weights / ceiling}
    save()
    for name, t in report["ratios"].get("targets", {}).items():
        print(f"target {name}: {t['value']:.1f} (>= {t['target']:g}: {'met' if t['met'] else 'NOT met'})")
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
