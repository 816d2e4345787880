"""`edgellm eval` per engine, fresh process each time: `--checkpoint` (transformers in-process) vs `--reference`
(a stored reference file, made once per checkpoint by `edgellm reference`). stories260K, fp32 and fp16 engines,
farm settings (--max-tokens 1024). Prints a table; writes benchmarks/results/eval_reference.json.

    python benchmarks/bench_eval_reference.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgellm import BUNDLED_MODEL_DIR  # noqa: E402
from edgellm.compiler.build import build_engine  # noqa: E402
from edgellm.compiler.export import export_checkpoint  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "edgellm", *argv], capture_output=True, text=True, env=ENV)
    elapsed = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"edgellm {argv[0]} failed ({res.returncode}): {res.stderr.strip()[-500:]}")
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        engines = {}
        for precision in ("fp32", "fp16"):
            export_checkpoint(BUNDLED_MODEL_DIR, tmp / f"onnx-{precision}", precision)
            build_engine(tmp / f"onnx-{precision}", tmp / f"engine-{precision}", "ort")
            engines[precision] = tmp / f"engine-{precision}"
        ref = tmp / "ref.npz"
        reference_s = _timed(["reference", str(BUNDLED_MODEL_DIR), "--output", str(ref), "--max-tokens", "1024"])
        rows = []
        for precision, engine in engines.items():
            base = ["eval", "--engine-dir", str(engine), "--output", str(tmp / "eval.json")]
            ckpt, stored = [], []
            for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both alike
                ckpt.append(_timed([*base, "--checkpoint", str(BUNDLED_MODEL_DIR), "--max-tokens", "1024"]))
                stored.append(_timed([*base, "--reference", str(ref)]))
            rows.append({"precision": precision, "checkpoint_s": statistics.median(ckpt),
                         "reference_s": statistics.median(stored), "checkpoint_all": ckpt, "reference_all": stored})
    print(f"reference file made once: {reference_s:.2f} s ({ref.name}, {args.rounds} rounds per mode)")
    print(f"{'engine':8} {'--checkpoint s':>15} {'--reference s':>14} {'saved s':>8} {'speedup':>8}")
    for r in rows:
        print(f"{r['precision']:8} {r['checkpoint_s']:15.2f} {r['reference_s']:14.2f} "
              f"{r['checkpoint_s'] - r['reference_s']:8.2f} {r['checkpoint_s'] / r['reference_s']:7.1f}x")
    out = ROOT / "benchmarks" / "results" / "eval_reference.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"reference_once_s": reference_s, "rounds": args.rounds, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
