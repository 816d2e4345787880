"""Export + build time and batch-1 greedy decode speed of this project's ORT engine.

    python benchmarks/compile_and_decode.py CKPT_DIR WORK_DIR [--precision fp32] [--prompt-len 128] [--new 64]

Prints a table and writes WORK_DIR/compile_and_decode.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from edgellm.compiler.build import build_engine
from edgellm.compiler.export import export_checkpoint
from edgellm.runtime import Engine, GenerationRequest


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("ckpt_dir", type=Path)
    p.add_argument("work_dir", type=Path)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--passes", type=int, default=3)
    a = p.parse_args()
    onnx_dir, engine_dir = a.work_dir / "onnx", a.work_dir / "engine"
    t = time.perf_counter()
    export_checkpoint(a.ckpt_dir, onnx_dir, a.precision, overwrite=True)
    export_s = time.perf_counter() - t
    t = time.perf_counter()
    build_engine(onnx_dir, engine_dir, "ort", max_batch_size=1, max_input_len=a.prompt_len,
                 max_seq_len=a.prompt_len + a.new, overwrite=True)
    build_s = time.perf_counter() - t
    t = time.perf_counter()
    engine = Engine.open(engine_dir)
    open_s = time.perf_counter() - t
    engine.eos_ids = frozenset()  # measure exactly --new tokens
    ids = [(7 * i + 3) % engine.config.vocab_size for i in range(a.prompt_len)]
    runs = []
    for _ in range(a.passes):
        r = engine.generate([GenerationRequest(id="b", input_ids=ids, max_new_tokens=a.new)])[0]
        runs.append({"ttft_ms": r.ttft_ms, "ms_per_token": r.ms_per_token, "tokens": len(r.output_ids)})
    best = min(runs, key=lambda x: x["ms_per_token"])
    out = {"ckpt": str(a.ckpt_dir), "precision": a.precision, "export_s": export_s, "build_s": build_s,
           "open_s": open_s, "prompt_len": a.prompt_len, "new_tokens": a.new, "runs": runs,
           "best_decode_tok_s": 1000 / best["ms_per_token"], "best_ttft_ms": best["ttft_ms"]}
    print(f"| export s | build s | open s | TTFT ms | decode tok/s |\n|---|---|---|---|---|\n"
          f"| {export_s:.2f} | {build_s:.2f} | {open_s:.2f} | {best['ttft_ms']:.1f} | "
          f"{out['best_decode_tok_s']:.1f} |")
    (a.work_dir / "compile_and_decode.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
