"""Where does an engine's decode time go? Python step overhead vs ONNX Runtime, and ORT time per op type.

    python benchmarks/profile_decode.py ENGINE_DIR [--past-len 128] [--steps 16] [--threads 2]

Prints: step time through ``Engine.step`` vs the bare ONNX Runtime run on identical feeds; ORT's own profile
aggregated by op type (and the slowest nodes); the weight bytes read per token and the bandwidth that implies.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("engine_dir", type=Path)
    p.add_argument("--past-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = p.parse_args()

    import onnxruntime as ort

    from edgellm.backends.ort import session_options, session_settings
    from edgellm.runtime import Engine, KVBuffer

    engine = Engine.open(args.engine_dir, num_threads=args.threads)
    rng = np.random.default_rng(0)
    vocab = engine.config.vocab_size
    cache = engine.new_cache(1)
    engine.step(rng.integers(0, vocab, (1, args.past_len)), cache)
    tok = rng.integers(0, vocab, (1, 1))

    def engine_steps() -> list[float]:
        out = []
        for _ in range(args.steps):
            cache.truncate(args.past_len)
            t0 = time.perf_counter()
            engine.step(tok, cache)
            out.append(time.perf_counter() - t0)
        return out

    engine_steps()  # warm-up
    t_engine = statistics.median(engine_steps())

    # identical feeds, bare ONNX Runtime run (an in-place cache: its bound buffers, inputs bound once)
    cache.truncate(args.past_len)
    feeds = {"input_ids": tok, "attention_mask": np.ones((1, args.past_len + 1), np.int64),
             "position_ids": np.array([[args.past_len]], np.int64),
             "logits_positions": np.zeros(1, np.int64)}  # every engine has it (Engine.open refuses one without)
    sess = engine.session.sess
    outs = [o.name for o in sess.get_outputs()]
    if isinstance(cache, KVBuffer):
        engine.session.run_in_place(feeds, cache)  # binds the inputs (and the buffers, once)

        def bare() -> None:
            sess.run_with_iobinding(cache.binding.io)  # into the arrays the binding keeps
    else:
        for i in range(engine.config.num_hidden_layers):
            feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = cache.keys[i], cache.values[i]

        def bare() -> None:
            sess.run(outs, feeds)
    runs = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        bare()
        runs.append(time.perf_counter() - t0)
    t_run = statistics.median(runs)
    for i in range(engine.config.num_hidden_layers):  # the profiling session below runs on plain feeds
        feeds[f"past_key_values.{i}.key"] = np.ascontiguousarray(cache.keys[i])
        feeds[f"past_key_values.{i}.value"] = np.ascontiguousarray(cache.values[i])

    # ORT profile on a second session over the same engine file
    so = session_options(session_settings(args.threads))  # what the engine's own session runs with
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")
    psess = ort.InferenceSession(str(args.engine_dir / "model.onnx"), so, providers=["CPUExecutionProvider"])
    for _ in range(args.steps):
        psess.run(outs, feeds)
    prof = json.loads(Path(psess.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    by_node: dict[str, float] = defaultdict(float)
    runs_us = 0.0
    for ev in prof:
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            by_op[ev["args"]["op_name"]] += ev["dur"]
            by_node[ev["name"][: -len("_kernel_time")]] += ev["dur"]
        elif ev.get("cat") == "Session" and ev["name"] == "model_run":
            runs_us += ev["dur"]
    total_kernels = sum(by_op.values())

    weight_bytes = sum(engine.manifest["graph"].get("weight_bytes", {}).values()) or engine.engine_bytes()
    # an untied embedding table is gathered (one row per token), not streamed; every other matrix (a tied
    # embedding is stored once, as the lm_head) is read once per step
    itemsize = 2 if engine.precision in ("fp16", "bf16") else 4
    gathered = 0 if engine.config.tie_word_embeddings else engine.config.vocab_size * engine.config.hidden_size
    streamed = weight_bytes - gathered * itemsize
    print(f"engine: {args.engine_dir} precision {engine.precision}, past {args.past_len}, threads {args.threads}")
    print(f"Engine.step median      {t_engine * 1e3:8.2f} ms  ({1 / t_engine:.2f} tok/s)")
    print(f"bare ORT run median     {t_run * 1e3:8.2f} ms  (python overhead {(t_engine - t_run) * 1e3:.2f} ms)")
    print(f"ORT model_run (profile) {runs_us / args.steps / 1e3:8.2f} ms; "
          f"kernels {total_kernels / args.steps / 1e3:.2f} ms")
    print(f"weights {weight_bytes / 1e9:.3f} GB in the engine, {streamed / 1e9:.3f} GB streamed per step -> "
          f"{streamed / t_run / 1e9:.1f} GB/s effective")
    print("\nop type               ms/step   share")
    for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]:
        print(f"{op:<20} {us / args.steps / 1e3:8.2f}  {us / total_kernels:6.1%}")
    print("\nslowest nodes          ms/step")
    for node, us in sorted(by_node.items(), key=lambda kv: -kv[1])[:10]:
        print(f"{node[:60]:<60} {us / args.steps / 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
