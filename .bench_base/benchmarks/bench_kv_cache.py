"""In-place KV buffer vs the growing (copying) cache on one ONNX Runtime engine, in one process, alternating rounds.

    .venv/bin/python benchmarks/bench_kv_cache.py --onnx-dir EXPORT [--batches 1,8] [--pasts 128,768] [--steps 32]

Builds an ORT engine from the export (into --work, sized for the largest batch and past + steps), opens it twice:
once as the runtime opens it (a GroupQueryAttention graph fills a preallocated ``KVBuffer`` in place), once with the
session told to keep the growing ``KVCache`` (each step's present outputs: the past is copied into them every step).
Each round prefills the past untimed, then times ``--steps`` decode steps that append to the cache, as generation
does. Prints a table and writes JSON (median tok/s over rounds and the in-place / growing ratio).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def decode_rate(engine: Any, batch: int, past: int, steps: int, seed: int) -> float:
    """Tokens/s of ``steps`` appending decode steps over a prefilled past of ``past`` positions."""
    rng = np.random.default_rng(seed)
    vocab = engine.config.vocab_size
    cache = engine.new_cache(batch, capacity=past + steps)
    ids = rng.integers(0, vocab, size=(batch, past), dtype=np.int64)
    for start in range(0, past, engine.max_input_len):
        engine.step(ids[:, start:start + engine.max_input_len], cache)
    tokens = rng.integers(0, vocab, size=(steps, batch, 1), dtype=np.int64)
    t0 = time.perf_counter()
    for tok in tokens:
        engine.step(tok, cache, last_only=True)
    return batch * steps / (time.perf_counter() - t0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx-dir", type=Path, required=True, help="an `edgellm export` directory (GQA: fp32/quantized)")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--pasts", default="128,768")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--work", type=Path, default=REPO / ".data" / "bench" / "kv-cache-engine")
    p.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "kv_cache.json")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    pasts = [int(x) for x in args.pasts.split(",")]

    from edgellm.compiler.build import build_engine
    from edgellm.files import write_json_atomic
    from edgellm.runtime import Engine, KVBuffer, KVCache

    shutil.rmtree(args.work, ignore_errors=True)
    seq = max(pasts) + args.steps
    build_engine(args.onnx_dir, args.work, "ort", max_batch_size=max(batches), max_input_len=min(128, seq),
                 max_seq_len=seq)
    in_place = Engine.open(args.work, num_threads=args.threads)
    growing = Engine.open(args.work, num_threads=args.threads)
    growing.session.kv_in_place = False  # the copying cache, for comparison
    if not (isinstance(in_place.new_cache(1), KVBuffer) and isinstance(growing.new_cache(1), KVCache)):
        raise SystemExit(f"{args.onnx_dir}: not a GroupQueryAttention graph (an fp16 export?): nothing to compare")

    rows = []
    print(f"{'batch':>5} {'past':>5} {'in-place tok/s':>15} {'growing tok/s':>14} {'ratio':>6}")
    for b in batches:
        for past in pasts:
            rates: dict[str, list[float]] = {"in_place": [], "growing": []}
            decode_rate(in_place, b, past, 4, 0)  # warm-up: kernels and arena for this shape
            decode_rate(growing, b, past, 4, 0)
            for r in range(args.rounds):
                rates["in_place"].append(decode_rate(in_place, b, past, args.steps, r))
                rates["growing"].append(decode_rate(growing, b, past, args.steps, r))
            med = {k: statistics.median(v) for k, v in rates.items()}
            rows.append({"batch": b, "past": past, "steps": args.steps, "tokens_per_s": med, "rounds": rates,
                         "ratio": med["in_place"] / med["growing"]})
            print(f"{b:>5} {past:>5} {med['in_place']:>15.1f} {med['growing']:>14.1f} {rows[-1]['ratio']:>5.2f}x",
                  flush=True)
    write_json_atomic(args.output, {
        "settings": {"onnx_dir": str(args.onnx_dir), "precision": in_place.precision, "threads": args.threads,
                     "rounds": args.rounds, "steps": args.steps},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "loadavg": os.getloadavg()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
    })
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
