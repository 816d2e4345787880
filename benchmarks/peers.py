"""Side-by-side: edgellm vs Hugging Face transformers vs onnxruntime-genai on CPU, batch 1, greedy: fp32, and the
quantized rows (edgellm-int4 / edgellm-int8: the checkpoint in ModelOpt's unified format, int4_awq block 128 /
int8_sq, then edgellm export + build; onnxruntime-genai-int4: its builder's `-p int4 -e cpu`). The quantized
checkpoints are written by round-to-nearest in ModelOpt's format (``--quantizer synthetic``, edgellm.synth_quant:
the same files, tensors and kernels, in seconds) or made by NVIDIA's calibrating tensorrt-edgellm-quantize
(``--quantizer tensorrt-edgellm``: close to an hour for int4_awq on the 0.5B shape on this CPU).
Each row also gets its memory-bandwidth ceiling (copy bandwidth, measured in every round, median / the bytes a
decode step streams: the weight files less tables only gathered). The -q4head / -q8head stacks also quantize the
LM head the checkpoint keeps in float (`--lm-head-precision int4_wo|int8_wo`), as onnxruntime-genai's int4 builder
does to its own.

For each model (the bundled stories260K; a random checkpoint with Qwen2.5-0.5B's shape, made once into .data/bench/):
  - build time: `edgellm export` + `edgellm build` vs `python -m onnxruntime_genai.models.builder -p fp32 -e cpu`
    (wall clock of the commands a person would run, interpreter start included for both);
  - TTFT (prefill of the prompt + first token) and decode tokens/s over the next tokens, same prompt ids for all.
Each stack runs in its own subprocess with the same thread count (OMP/MKL env, torch.set_num_threads, ORT
intra_op_num_threads), one untimed warm-up generation then one timed one per process; --repeats rounds alternate the
stacks (so load from elsewhere on a shared machine hits all alike) and the median over rounds is kept; so do
--build-repeats rounds of the builds.

    PYTHONPATH=. .venv/bin/python benchmarks/peers.py [--models stories260K,qwen2.5-0.5b-shape] [--stacks ...]
        [--repeats 5] [--build-repeats 3] [--quantizer synthetic|tensorrt-edgellm] [--quick]

    PYTHONPATH=. .venv/bin/python benchmarks/peers.py --contention [--quick]   # quiet vs under a competing CPU job:
        # edgellm / onnxruntime-genai decode per case (benchmarks/peers_contention.py says how)

Prints a table of ratios and writes benchmarks/results/peers.json (--contention: peers-contention.json). A stack
that cannot run a model is reported as "n/a (reason)", never as a crash of the whole run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODELS = ("stories260K", "qwen2.5-0.5b-shape")
# The decode-speed targets against the memory-bandwidth ceiling and the quantized ones are defined on the 0.5B
# shape, where decode streams the weights; stories260K (1 MB of weights, in cache) is bound by per-op overhead, so
# its ceiling and its int8/int4 ratios say nothing about the kernels: reported, not judged.
BANDWIDTH_TARGET_MODELS = ("qwen2.5-0.5b-shape",)
STACKS = ("edgellm", "transformers", "onnxruntime-genai", "edgellm-int4", "edgellm-int4-q4head", "edgellm-int8",
          "edgellm-int8-q8head", "onnxruntime-genai-int4")
QUANT_METHODS = {"edgellm-int4": "int4_awq", "edgellm-int4-q4head": "int4_awq", "edgellm-int8": "int8_sq",
                 "edgellm-int8-q8head": "int8_sq"}
# The checkpoint keeps its LM head in float (ModelOpt excludes lm_head); these stacks quantize it at export
# (`edgellm export --lm-head-precision`), as onnxruntime-genai's int4 builder does to its own LM head.
LM_HEADS = {"edgellm-int4-q4head": "int4_wo", "edgellm-int8-q8head": "int8_wo"}
# How the -int4 / -int8 stacks' checkpoints are made (the name is recorded in the JSON as "quantizer").
QUANTIZERS = {"synthetic": "synthetic RTN in ModelOpt format",
              "tensorrt-edgellm": "tensorrt-edgellm-quantize (ModelOpt, calibrated on the bundled text)"}
DEFAULT_TRT_ENV = Path.home() / ".cache" / "edgellm-farm" / "toolchains" / "tensorrt-edgellm-0.11.0"
DEFAULT_DATA = REPO / ".data" / "bench"
DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "peers.json"
STEP_TIMEOUT_S = 1800


# --------------------------------------------------------------------------------------------- workers ----
def _peak_rss() -> int:
    """This process's own peak RSS. Not ru_maxrss: Linux carries the parent's peak across fork + exec, so every
    worker reported the orchestrator's (checkpoint-generating) peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise SystemExit("/proc/self/status has no VmHWM line: peak RSS cannot be measured here")


def _timed_stream(tokens: Callable[[], Any]) -> dict[str, float | int]:
    """Consume an iterator of produced tokens; TTFT is the first token's arrival, decode rate the rest (and the
    process's CPU seconds over each)."""
    t0, c0 = time.perf_counter(), time.process_time()
    first = c_first = None
    n = 0
    for _ in tokens():
        n += 1
        if first is None:
            first, c_first = time.perf_counter(), time.process_time()
    end, c_end = time.perf_counter(), time.process_time()
    assert first is not None and c_first is not None, "no token produced"
    # CPU seconds of all this process's threads: above wall x busy threads when idle threads spin
    return {"ttft_s": first - t0, "decode_s": end - first, "new_tokens": n, "ttft_cpu_s": c_first - c0,
            "decode_cpu_s": c_end - c_first}


def _worker_edgellm(model_dir: Path, prompt: list[int], new: int, threads: int,
                    intra_op_spinning: bool | str | None = None) -> Callable[[int], Any]:
    """edgellm's engine as it opens by default (ONNX Runtime spinning "auto": chosen from the host's load at open),
    or with ``intra_op_spinning`` given. ``run.reopen()`` opens its session again (--contention: the "auto" choice
    made under each case's load) and returns the new session's settings; ``run.settings()`` the current ones."""
    from edgellm.backends.ort import OrtBackend
    from edgellm.runtime import Engine, GenerationRequest

    engine = Engine.open(model_dir, num_threads=threads)

    def reopen() -> Any:
        spin = {} if intra_op_spinning is None else {"intra_op_spinning": intra_op_spinning}
        engine.session = OrtBackend().open(engine.engine_dir, engine.manifest, num_threads=threads, **spin)
        return engine.session.settings  # type: ignore[attr-defined]

    if intra_op_spinning is not None:
        reopen()

    def run(n: int) -> Any:
        req = GenerationRequest(id="bench", input_ids=prompt, max_new_tokens=n, temperature=0.0)
        return engine.stream(req)
    run.reopen = reopen  # type: ignore[attr-defined]
    run.settings = lambda: getattr(engine.session, "settings", None)  # type: ignore[attr-defined]
    return run


def _worker_edgellm_spin(model_dir: Path, prompt: list[int], new: int, threads: int) -> Callable[[int], Any]:
    """edgellm with ONNX Runtime's default intra-op spinning (``--contention``'s A/B of edgellm's choice)."""
    return _worker_edgellm(model_dir, prompt, new, threads, intra_op_spinning=True)


def _worker_edgellm_nospin(model_dir: Path, prompt: list[int], new: int, threads: int) -> Callable[[int], Any]:
    """edgellm with intra-op spinning off (its default before "auto": ``--contention``'s A/B of edgellm's choice)."""
    return _worker_edgellm(model_dir, prompt, new, threads, intra_op_spinning=False)


def _worker_transformers(model_dir: Path, prompt: list[int], new: int, threads: int) -> Callable[[int], Any]:
    import queue
    import threading

    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt], dtype=torch.long)

    class Streamer(transformers.generation.streamers.BaseStreamer):
        def __init__(self) -> None:
            self.q: queue.Queue[int | None] = queue.Queue()
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate() first echoes the prompt
                self.prompt_seen = True
                return
            for t in value.reshape(-1).tolist():
                self.q.put(t)

        def end(self) -> None:
            self.q.put(None)

    def run(n: int) -> Any:
        s = Streamer()

        def gen() -> None:
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                               num_beams=1, repetition_penalty=1.0, streamer=s, pad_token_id=0)
        th = threading.Thread(target=gen)
        th.start()
        while (tok := s.q.get()) is not None:
            yield tok
        th.join()
    return run


def _worker_onnxruntime_genai(model_dir: Path, prompt: list[int], new: int, threads: int) -> Callable[[int], Any]:
    import onnxruntime_genai as og

    cfg = og.Config(str(model_dir))
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
    model = og.Model(cfg)

    def run(n: int) -> Any:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)  # the prefill runs here; the first token is chosen from its logits
        while not gen.is_done():
            gen.generate_next_token()
            yield int(gen.get_next_tokens()[0])
    return run


WORKERS = {"edgellm": _worker_edgellm, "transformers": _worker_transformers,
           "onnxruntime-genai": _worker_onnxruntime_genai, "edgellm-int4": _worker_edgellm,
           "edgellm-int8": _worker_edgellm, "onnxruntime-genai-int4": _worker_onnxruntime_genai,
           "edgellm-int4-q4head": _worker_edgellm, "edgellm-int8-q8head": _worker_edgellm,
           "edgellm-spin": _worker_edgellm_spin, "edgellm-nospin": _worker_edgellm_nospin}


def bandwidth_main(args: argparse.Namespace) -> int:
    """Copy bandwidth (read + write bytes / s) of ``args.threads`` threads over 256 MiB each: the decode ceiling."""
    import threading

    import numpy as np

    n = 256 * 2**20 // 8
    pairs = [(np.ones(n), np.empty(n)) for _ in range(args.threads)]
    best = 0.0
    for _ in range(5):
        threads = [threading.Thread(target=np.copyto, args=(dst, src)) for src, dst in pairs]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        best = max(best, 2 * 8 * n * args.threads / (time.perf_counter() - t0))
    Path(args.result).write_text(json.dumps({"copy_bytes_per_s": best}))
    return 0


def worker_main(args: argparse.Namespace) -> int:
    prompt = json.loads(Path(args.prompt_file).read_text())
    t0 = time.perf_counter()
    run = WORKERS[args.worker](Path(args.model_dir), prompt, args.new_tokens, args.threads)
    load_s = time.perf_counter() - t0
    _timed_stream(lambda: run(min(8, args.new_tokens)))  # warm-up: first-run allocations, kernel selection
    runs = [_timed_stream(lambda: run(args.new_tokens)) for _ in range(args.repeats)]
    ttft = statistics.median(r["ttft_s"] for r in runs)
    rates = [(r["new_tokens"] - 1) / r["decode_s"] for r in runs if r["new_tokens"] > 1]
    result = {
        "load_s": load_s,
        "ttft_ms": ttft * 1e3,
        "decode_tokens_per_s": statistics.median(rates) if rates else None,
        "new_tokens": runs[0]["new_tokens"],
        "runs": runs,
        "peak_rss_bytes": _peak_rss(),
    }
    Path(args.result).write_text(json.dumps(result, indent=2))
    return 0


# ------------------------------------------------------------------------------------------ orchestrator ----
def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO),
                "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"})
    return env


def _run_cmd(cmd: list[str], log: Path, threads: int) -> tuple[float, str | None]:
    """Run one command, output to ``log``; (wall seconds, None) or (wall seconds, last error line)."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(threads), cwd=REPO,
                                  timeout=STEP_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            return time.perf_counter() - t0, f"timed out after {STEP_TIMEOUT_S} s"
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        err = next((ln for ln in reversed(lines) if "error" in ln.lower() or "exception" in ln.lower()),
                   lines[-1] if lines else f"exit {proc.returncode}")
        return wall, f"exit {proc.returncode}: {err[:300]}"
    return wall, None


def prepare_checkpoint(name: str, data: Path) -> Path:
    from edgellm import BUNDLED_MODEL_DIR

    if name == "stories260K":
        return BUNDLED_MODEL_DIR
    from edgellm.synth import QWEN25_05B, make_checkpoint

    out = data / "ckpt" / name
    if not (out / ".complete").is_file():
        shutil.rmtree(out, ignore_errors=True)
        print(f"[{name}] generating the random checkpoint into {out} ...", flush=True)
        make_checkpoint(out, "qwen2", **QWEN25_05B)
        (out / ".complete").write_text("ok\n")
    return out


def prompt_ids(ckpt: Path, length: int) -> list[int]:
    from tokenizers import Tokenizer

    from edgellm import BUNDLED_TEXT_FILE

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    ids = tok.encode(BUNDLED_TEXT_FILE.read_text(encoding="utf-8")).ids
    if len(ids) < length:
        raise SystemExit(f"the bundled text gives only {len(ids)} tokens, fewer than the prompt length {length}")
    return ids[:length]


def quantized_checkpoint(ckpt: Path, method: str, args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """``ckpt`` quantized with ``method``, cached: by ``--quantizer``'s tool (see QUANTIZERS)."""
    if args.quantizer == "synthetic":
        return synthetic_checkpoint(ckpt, method, args)
    return real_quantized_checkpoint(ckpt, method, args)


def synthetic_checkpoint(ckpt: Path, method: str, args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """ModelOpt's unified format written by round-to-nearest (edgellm.synth_quant): the same files, in seconds."""
    from edgellm.synth_quant import quantize_rtn

    out = args.data_dir / "ckpt" / f"{ckpt.name}-{method}-rtn"
    if (out / ".complete").is_file():
        return out, None
    shutil.rmtree(out, ignore_errors=True)
    print(f"[{ckpt.name}] writing {method} by round-to-nearest ({QUANTIZERS['synthetic']}) ...", flush=True)
    from edgellm.errors import EdgeLLMError

    t0 = time.perf_counter()
    try:
        quantize_rtn(ckpt, out, method, prompt_ids(ckpt, args.prompt_len))
    except EdgeLLMError as exc:
        return None, f"synthetic {method} failed: {exc}"
    (out / ".complete").write_text(f"ok {time.perf_counter() - t0:.1f} s\n")
    return out, None


def real_quantized_checkpoint(ckpt: Path, method: str, args: argparse.Namespace) -> tuple[Path | None, str | None]:
    """``ckpt`` quantized by the real tensorrt-edgellm-quantize (offline calibration on the bundled text), cached."""
    from edgellm import BUNDLED_TEXT_FILE

    out = args.data_dir / "ckpt" / f"{ckpt.name}-{method}"
    if (out / ".complete").is_file():
        return out, None
    tool = args.trt_env / "bin" / "tensorrt-edgellm-quantize"
    if not tool.is_file():
        return None, f"{tool} not found (install the toolchain or pass --trt-env)"
    calib = args.data_dir / "calibration.jsonl"
    rows = [ln.strip() for ln in BUNDLED_TEXT_FILE.read_text(encoding="utf-8").splitlines() if ln.strip()]
    calib.write_text("".join(json.dumps({"article": r}) + "\n" for r in rows))
    shutil.rmtree(out, ignore_errors=True)
    print(f"[{ckpt.name}] quantizing {method} with {tool} ...", flush=True)
    os.environ.update({"EDGELLM_QUANT_DATASET_CNN_DAILYMAIL": str(calib), "HF_DATASETS_OFFLINE": "1"})
    _, err = _run_cmd([str(tool), "llm", "--model_dir", str(ckpt), "--output_dir", str(out), "--quantization",
                       method, "--device", "cpu", "--num_samples", str(args.calib_samples)],
                      args.data_dir / f"quantize-{ckpt.name}-{method}.log", args.threads)
    if err:
        return None, f"quantize {method} failed: {err}"
    (out / ".complete").write_text("ok\n")
    return out, None


def _build_edgellm(ckpt: Path, work: Path, args: argparse.Namespace, prompt_len: int,
                   stack: str = "edgellm") -> dict[str, Any]:
    onnx_dir, engine_dir = work / f"{stack}-onnx", work / f"{stack}-engine"
    shutil.rmtree(onnx_dir, ignore_errors=True)
    shutil.rmtree(engine_dir, ignore_errors=True)
    py = [sys.executable, "-m", "edgellm"]
    precision: list[str] = ["--precision", "fp32"]
    if stack in QUANT_METHODS:
        qckpt, err = quantized_checkpoint(ckpt, QUANT_METHODS[stack], args)
        if err:
            return {"error": err}
        ckpt, precision = qckpt, []  # type: ignore[assignment]  # a quantized checkpoint exports as its method
        if stack in LM_HEADS:
            precision = ["--lm-head-precision", LM_HEADS[stack]]
    t_export, err = _run_cmd([*py, "export", str(ckpt), str(onnx_dir), *precision],
                             work / f"{stack}-export.log", args.threads)
    if err:
        return {"error": f"export failed: {err}"}
    t_build, err = _run_cmd([*py, "build", str(onnx_dir), str(engine_dir), "--max-batch-size", "1",
                             "--max-input-len", str(prompt_len),
                             "--max-seq-len", str(prompt_len + args.new_tokens)],
                            work / f"{stack}-build.log", args.threads)
    if err:
        return {"error": f"build failed: {err}"}
    return {"build_s": t_export + t_build, "export_s": t_export, "engine_s": t_build, "model_dir": engine_dir}


def _build_onnxruntime_genai(ckpt: Path, work: Path, args: argparse.Namespace, prompt_len: int,
                             precision: str = "fp32") -> dict[str, Any]:
    out = work / f"ortgenai-{precision}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(work / "ortgenai-cache")]
    t, err = _run_cmd(cmd, work / f"ortgenai-{precision}-build.log", args.threads)
    if err:
        return {"error": f"builder failed: {err}"}
    return {"build_s": t, "model_dir": out}


def _explain(stack: str, cfg: Any, err: str) -> str:
    head = cfg.head_dim
    if stack == "onnxruntime-genai" and head % 16:
        return (f"its CPU GroupQueryAttention needs head_size % 16 == 0; this model's head_size is {head} "
                f"({err[:160]})")
    return err


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from edgellm.config import ModelConfig

    ckpt = prepare_checkpoint(name, args.data_dir)
    cfg = ModelConfig.load(ckpt)
    work = args.data_dir / "work" / name
    work.mkdir(parents=True, exist_ok=True)
    prompt = prompt_ids(ckpt, args.prompt_len)
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps(prompt))
    builds = {
        "edgellm": lambda: _build_edgellm(ckpt, work, args, len(prompt)),
        "transformers": lambda: {"build_s": None, "model_dir": ckpt},
        "onnxruntime-genai": lambda: _build_onnxruntime_genai(ckpt, work, args, len(prompt)),
        "edgellm-int4": lambda: _build_edgellm(ckpt, work, args, len(prompt), "edgellm-int4"),
        "edgellm-int8": lambda: _build_edgellm(ckpt, work, args, len(prompt), "edgellm-int8"),
        "edgellm-int4-q4head": lambda: _build_edgellm(ckpt, work, args, len(prompt), "edgellm-int4-q4head"),
        "edgellm-int8-q8head": lambda: _build_edgellm(ckpt, work, args, len(prompt), "edgellm-int8-q8head"),
        "onnxruntime-genai-int4": lambda: _build_onnxruntime_genai(ckpt, work, args, len(prompt), "int4"),
    }
    out: dict[str, Any] = {"checkpoint": str(ckpt), "parameters": cfg.num_parameters_estimate,
                           "head_dim": cfg.head_dim, "stacks": {}}
    ready: dict[str, Path] = {}
    # Build rounds alternate the stacks too (each build from scratch; the quantized checkpoints are cached after
    # the first); the median is kept.
    builds_done: dict[str, list[dict[str, Any]]] = {s: [] for s in args.stacks}
    for r in range(args.build_repeats):
        for stack in args.stacks:
            if "error" in out["stacks"].get(stack, {}):
                continue
            print(f"[{name}] {stack}: build, round {r + 1}/{args.build_repeats} ...", flush=True)
            load_before = os.getloadavg()[0]
            b = builds[stack]()
            entry: dict[str, Any] = out["stacks"].setdefault(stack, {})
            if stack in QUANT_METHODS:
                entry["quantizer"] = QUANTIZERS[args.quantizer]
            if "error" in b:
                entry["error"] = _explain(stack, cfg, b["error"])
                print(f"[{name}] {stack}: n/a ({entry['error']})", flush=True)
                continue
            builds_done[stack].append({**b, "loadavg_1m_before": load_before})
    for stack, done in builds_done.items():
        entry = out["stacks"][stack]
        if "error" in entry or not done:
            continue
        for key in ("build_s", "export_s", "engine_s"):
            values = [d[key] for d in done if d.get(key) is not None]
            entry[key] = statistics.median(values) if values else None
        entry["build_rounds"] = [{k: v for k, v in d.items() if k != "model_dir"} for d in done]
        ready[stack] = done[-1]["model_dir"]
        entry["weight_bytes"] = _weight_bytes(Path(ready[stack]))
        entry["streamed_bytes"] = _streamed_bytes(Path(ready[stack]), entry["weight_bytes"])
    # Rounds alternate the stacks, so a burst of load from elsewhere on the machine hits all of them alike.
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in ready}
    bandwidths: list[float] = []
    for r in range(args.repeats):
        # the ceiling is measured in every round, under the load the round's stacks see
        if (bw := measure_bandwidth(args)) is not None:
            bandwidths.append(bw)
        for stack, model_dir in ready.items():
            if "error" in out["stacks"][stack]:
                continue
            print(f"[{name}] {stack}: generate, round {r + 1}/{args.repeats} ...", flush=True)
            result = work / f"{stack}.result.json"
            result.unlink(missing_ok=True)
            load = os.getloadavg()[0]
            _, err = _run_cmd([sys.executable, str(Path(__file__).resolve()), "--worker", stack,
                               "--model-dir", str(model_dir), "--prompt-file", str(prompt_file),
                               "--new-tokens", str(args.new_tokens), "--repeats", "1",
                               "--threads", str(args.threads), "--result", str(result)],
                              work / f"{stack}.run.log", args.threads)
            if err:
                out["stacks"][stack]["error"] = _explain(stack, cfg, err)
                print(f"[{name}] {stack}: n/a ({out['stacks'][stack]['error']})", flush=True)
                continue
            rounds[stack].append({**json.loads(result.read_text()), "loadavg_1m_before": load})
    out["copy_bytes_per_s"] = statistics.median(bandwidths) if bandwidths else None
    out["copy_bytes_per_s_rounds"] = bandwidths
    for stack, runs in rounds.items():
        entry = out["stacks"][stack]
        if "error" in entry or not runs:
            continue
        rates = [x["decode_tokens_per_s"] for x in runs if x["decode_tokens_per_s"] is not None]
        entry.update({
            "ttft_ms": statistics.median(x["ttft_ms"] for x in runs),
            "decode_tokens_per_s": statistics.median(rates) if rates else None,
            "new_tokens": runs[0]["new_tokens"],
            "peak_rss_bytes": max(x["peak_rss_bytes"] for x in runs),
            "load_s": statistics.median(x["load_s"] for x in runs),
            "rounds": runs,
        })
    return out


def _weight_bytes(model_dir: Path) -> int | None:
    """Bytes a decode step reads: the model's data files (weights; a tied embedding is one matrix)."""
    files = [p for p in model_dir.iterdir() if p.suffix in (".data", ".safetensors", ".onnx_data")]
    return sum(p.stat().st_size for p in files) or None


def _streamed_bytes(model_dir: Path, weight_bytes: int | None) -> int | None:
    """Bytes a decode step streams: the weight files less the tables only gathered (an untied embedding: one row
    per token). Read from the graph, the same rule for every ONNX stack."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    graph_file = model_dir / "model.onnx"
    if weight_bytes is None or not graph_file.is_file():
        return weight_bytes
    graph = onnx.load(str(graph_file), load_external_data=False).graph
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, set()).add(node.op_type if i == 0 else "other")
    gathered = 0
    for init in graph.initializer:
        if readers.get(init.name) == {"Gather"} and uses_external_data(init):
            gathered += int({e.key: e.value for e in init.external_data}["length"])
    return weight_bytes - gathered


def measure_bandwidth(args: argparse.Namespace) -> float | None:
    result = args.data_dir / "bandwidth.json"
    _, err = _run_cmd([sys.executable, str(Path(__file__).resolve()), "--worker-bandwidth", "--threads",
                       str(args.threads), "--result", str(result)], args.data_dir / "bandwidth.log", args.threads)
    return None if err else float(json.loads(result.read_text())["copy_bytes_per_s"])


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(results: dict[str, Any]) -> None:
    """Ratios and targets per model, in place; print the table."""
    hdr = (f"{'model':<20} {'stack':<24} {'build s':>9} {'TTFT ms':>9} {'decode tok/s':>13} {'ceiling':>8} "
           f"{'of ceil':>8} {'new':>4} {'RSS MB':>8}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for model, m in results.items():
        bw = m.get("copy_bytes_per_s")
        for e in m["stacks"].values():
            if bw and e.get("streamed_bytes") and e.get("decode_tokens_per_s"):
                e["ceiling_tokens_per_s"] = bw / e["streamed_bytes"]
                e["fraction_of_ceiling"] = e["decode_tokens_per_s"] / e["ceiling_tokens_per_s"]
        for stack, e in m["stacks"].items():
            if "error" in e:
                print(f"{model:<20} {stack:<24} n/a ({e['error'][:90]})")
                continue
            b = f"{e['build_s']:.1f}" if e.get("build_s") is not None else "-"
            ceil = f"{e['ceiling_tokens_per_s']:.1f}" if e.get("ceiling_tokens_per_s") else "-"
            frac = f"{e['fraction_of_ceiling']:.0%}" if e.get("fraction_of_ceiling") else "-"
            print(f"{model:<20} {stack:<24} {b:>9} {e['ttft_ms']:>9.1f} {e['decode_tokens_per_s'] or 0:>13.1f} "
                  f"{ceil:>8} {frac:>8} {e['new_tokens']:>4} {e['peak_rss_bytes'] / 2**20:>8.0f}")
        ours = m["stacks"].get("edgellm", {})
        ratios: dict[str, Any] = {}
        for peer in ("transformers", "onnxruntime-genai"):
            p = m["stacks"].get(peer)
            if p is None:
                continue
            if "error" in p or "error" in ours:
                ratios[peer] = {"n/a": p.get("error") or ours.get("error")}
                continue
            ratios[peer] = {
                "decode_speedup": _ratio(ours.get("decode_tokens_per_s"), p.get("decode_tokens_per_s")),
                "ttft_speedup": _ratio(p.get("ttft_ms"), ours.get("ttft_ms")),
                "build_time_ratio": _ratio(ours.get("build_s"), p.get("build_s")),
            }
        targets = {}
        og, hf = ratios.get("onnxruntime-genai", {}), ratios.get("transformers", {})
        if og.get("decode_speedup") is not None:
            targets["decode >= 1.0x onnxruntime-genai"] = og["decode_speedup"] >= 1.0
        if og.get("build_time_ratio") is not None:
            targets["export+build time <= onnxruntime-genai builder"] = og["build_time_ratio"] <= 1.0
        if hf.get("decode_speedup") is not None:
            targets["decode >= 2x transformers"] = hf["decode_speedup"] >= 2.0
        judged = model in BANDWIDTH_TARGET_MODELS
        og4 = m["stacks"].get("onnxruntime-genai-int4", {})
        q: dict[str, float | None] = {}
        for stack in ("edgellm-int4", "edgellm-int4-q4head"):
            e = m["stacks"].get(stack, {})
            q[f"{stack} decode vs onnxruntime-genai int4"] = _ratio(e.get("decode_tokens_per_s"),
                                                                    og4.get("decode_tokens_per_s"))
            q[f"{stack} ttft speedup vs onnxruntime-genai int4"] = _ratio(og4.get("ttft_ms"), e.get("ttft_ms"))
            q[f"{stack} export+build time vs onnxruntime-genai int4 builder"] = _ratio(e.get("build_s"),
                                                                                      og4.get("build_s"))
            if judged and q[f"{stack} decode vs onnxruntime-genai int4"] is not None:
                targets[f"{stack} decode >= 1.0x onnxruntime-genai int4"] = (
                    q[f"{stack} decode vs onnxruntime-genai int4"] >= 1.0)  # type: ignore[operator]
            if judged and e.get("fraction_of_ceiling") is not None:
                targets[f"{stack} decode >= 60% of its bandwidth ceiling"] = e["fraction_of_ceiling"] >= 0.6
        for stack in ("edgellm-int8", "edgellm-int8-q8head"):
            r = _ratio(m["stacks"].get(stack, {}).get("decode_tokens_per_s"), ours.get("decode_tokens_per_s"))
            q[f"{stack} decode vs edgellm fp32"] = r
            if judged and r is not None:
                targets[f"{stack} decode >= 1.8x edgellm fp32"] = r >= 1.8
        ratios["quantized"] = {k: v for k, v in q.items() if v is not None}
        if judged and ours.get("fraction_of_ceiling") is not None:
            targets["fp32 decode >= 90% of its bandwidth ceiling"] = ours["fraction_of_ceiling"] >= 0.9
        m["ratios_vs_peers"], m["targets_met"] = ratios, targets
    print()
    for model, m in results.items():
        for peer, r in m["ratios_vs_peers"].items():
            if peer == "quantized":
                for k, v in r.items():
                    print(f"{model}: {k}: {v:.2f}x")
                continue
            if "n/a" in r:
                print(f"{model}: edgellm vs {peer}: n/a ({r['n/a'][:100]})")
                continue
            parts = [f"{k} {v:.2f}x" for k, v in r.items() if v is not None]
            print(f"{model}: edgellm vs {peer}: " + ", ".join(parts))
        for t, ok in m["targets_met"].items():
            print(f"{model}: target {t}: {'MET' if ok else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help=f"comma list of {', '.join(MODELS)} (default: all; with --contention the 0.5B "
                                    f"shape, or both with --quick)")
    p.add_argument("--stacks", default=",".join(STACKS), help=f"comma list of {', '.join(STACKS)}")
    p.add_argument("--quick", action="store_true", help="one timed repeat and 16 new tokens (smoke run)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads for every stack")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="rounds; each stack runs once per round")
    p.add_argument("--build-repeats", type=int, default=3, help="build rounds; each stack builds once per round")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="cache of checkpoints and builds")
    p.add_argument("--output", type=Path, help=f"default {DEFAULT_OUTPUT.relative_to(REPO)}, with --contention "
                                                "benchmarks/results/peers-contention.json")
    p.add_argument("--contention", action="store_true",
                   help="edgellm vs onnxruntime-genai decode, quiet and under a competing CPU job "
                        "(benchmarks/peers_contention.py)")
    p.add_argument("--load-procs", type=int, default=2, help="--contention: busy processes of the competing job")
    # worker mode (internal): one stack in its own process
    p.add_argument("--trt-env", type=Path, default=DEFAULT_TRT_ENV,
                   help="tensorrt-edgellm environment whose quantizer makes the int4/int8 checkpoints")
    p.add_argument("--quantizer", choices=tuple(QUANTIZERS), default="synthetic",
                   help="how the -int4/-int8 checkpoints are made: synthetic (round-to-nearest written in ModelOpt's "
                        "format, seconds; enough for decode speed) or tensorrt-edgellm (NVIDIA's calibrating "
                        "quantizer; int4_awq takes close to an hour on a 0.5B model on this CPU)")
    p.add_argument("--calib-samples", type=int, default=16, help="calibration rows for the quantizer")
    p.add_argument("--worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--worker-bandwidth", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--prompt-file", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--cases", default="quiet,contended", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.contention:
        import peers_contention

        args.output = args.output or peers_contention.DEFAULT_OUTPUT
        return peers_contention.main(args)
    args.output = args.output or DEFAULT_OUTPUT
    if args.worker_bandwidth:
        return bandwidth_main(args)
    if args.worker:
        return worker_main(args)
    models = [m.strip() for m in (args.models or ",".join(MODELS)).split(",") if m.strip()]
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    bad = [m for m in models if m not in MODELS] + [s for s in stacks if s not in STACKS]
    if bad or not models or not stacks:
        p.error(f"unknown model/stack {', '.join(bad) or '(none given)'}; models: {', '.join(MODELS)}; "
                f"stacks: {', '.join(STACKS)}")
    if args.quick:
        args.repeats, args.build_repeats, args.new_tokens = 1, 1, 16
    args.stacks = stacks
    args.data_dir = args.data_dir.resolve()
    load_at_start = os.getloadavg()
    results = {m: bench_model(m, args) for m in models}
    summarize(results)
    report = {
        "settings": {"precisions": "fp32; int4_awq / int8_sq for the -int4 / -int8 stacks", "batch_size": 1,
                     "prompt_len": args.prompt_len,
                     "new_tokens": args.new_tokens, "repeats": args.repeats, "build_repeats": args.build_repeats,
                     "threads": args.threads,
                     "greedy": True, "quick": args.quick,
                     "quantizer": QUANTIZERS[args.quantizer]},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": load_at_start,
                    "loadavg_at_end": os.getloadavg(),
                    "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "models": results,
    }
    from edgellm.files import write_json_atomic

    write_json_atomic(args.output, json.loads(json.dumps(report, default=str)))
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
