"""Benchmark ``edgellm inspect``: a ~1 GB random Llama checkpoint (2 shards + index) vs the bundled stories260K.

Inspection reads headers only, so its time and memory must not grow with tensor data size.
Usage: ``python benchmarks/bench_inspect.py [--runs 5] [--output benchmarks/results/inspect.json]``.
Prints a table and writes JSON. The 1 GB checkpoint is written to a temp dir and deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgellm import BUNDLED_MODEL_DIR  # noqa: E402
from edgellm.checkpoint import Checkpoint, build_inventory  # noqa: E402
from edgellm.files import write_json_atomic  # noqa: E402

# ~267M parameters: 1.07 GB in fp32.
BIG = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=12, num_attention_heads=16,
           num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048)


def write_big_checkpoint(out: Path, seed: int = 0) -> int:
    """A valid Llama checkpoint of BIG's shape in two shards; tensors tile one random block (random-ish, fast)."""
    from edgellm.config import ModelConfig
    from edgellm.models import family_for

    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2, **BIG}
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    cfg = ModelConfig.from_dict(config)
    shapes = family_for(cfg).expected_parameters(cfg)
    block = np.random.default_rng(seed).standard_normal(1 << 20, dtype=np.float32) * 0.02
    names = list(shapes)
    half = len(names) // 2
    weight_map: dict[str, str] = {}
    total = 0
    for i, part in enumerate((names[:half], names[half:])):
        shard = f"model-{i + 1:05d}-of-00002.safetensors"
        tensors = {}
        for name in part:
            n = int(np.prod(shapes[name]))
            tensors[name] = np.resize(block, n).reshape(shapes[name])
            weight_map[name] = shard
            total += n * 4
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def in_process(ckpt: Path, runs: int) -> tuple[float, dict[str, Any]]:
    best = float("inf")
    inv: dict[str, Any] = {}
    for _ in range(runs):
        t0 = time.perf_counter()
        inv = build_inventory(Checkpoint.open(ckpt))
        best = min(best, time.perf_counter() - t0)
    return best, inv


# The CLI in a fresh interpreter, reporting its own peak RSS (VmHWM: the exec'd process's high-water mark;
# rusage's ru_maxrss would include the forking parent's memory).
_CHILD = (
    "import sys\n"
    "from edgellm.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "hwm = next(ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:'))\n"
    "print('PEAK_KIB', hwm.split()[1], file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


def cli_run(ckpt: Path, runs: int) -> tuple[float, int]:
    """Best wall time and peak RSS (KiB) of the ``edgellm inspect`` CLI in a fresh process."""
    best, peak = float("inf"), 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", _CHILD, "inspect", str(ckpt)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"inspect {ckpt} exited {proc.returncode}: {proc.stderr}")
        kib = int(proc.stderr.split("PEAK_KIB")[1].split()[0])
        best, peak = min(best, elapsed), max(peak, kib)
    return best, peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "inspect.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_inspect_") as tmp:
        big = Path(tmp) / "llama_1gb"
        t0 = time.perf_counter()
        data_bytes = write_big_checkpoint(big)
        write_s = time.perf_counter() - t0
        for label, ckpt in (("stories260K", BUNDLED_MODEL_DIR), ("llama-1GB (2 shards)", big)):
            t_lib, inv = in_process(ckpt, args.runs)
            if not inv["ok"]:
                raise SystemExit(f"{label} did not inspect clean: {inv['problems']}")
            if ckpt == big and inv["bytes"] != data_bytes:
                raise SystemExit(f"inventory says {inv['bytes']} tensor bytes, {data_bytes} were written")
            t_cli, rss = cli_run(ckpt, args.runs)
            rows.append({"checkpoint": label, "parameters": inv["parameters"], "tensor_bytes": inv["bytes"],
                         "tensors": inv["tensor_count"], "shards": len(inv["shards"]),
                         "inspect_lib_s": round(t_lib, 5), "inspect_cli_s": round(t_cli, 4),
                         "cli_peak_rss_mib": round(rss / 1024, 1)})
    print(f"{'checkpoint':<22} {'params':>12} {'data MiB':>9} {'tensors':>7} {'lib best s':>10} "
          f"{'cli best s':>10} {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['checkpoint']:<22} {r['parameters']:>12,} {r['tensor_bytes'] / 2**20:>9.1f} {r['tensors']:>7} "
              f"{r['inspect_lib_s']:>10.4f} {r['inspect_cli_s']:>10.3f} {r['cli_peak_rss_mib']:>12.1f}")
    ratio = rows[1]["inspect_lib_s"] / rows[0]["inspect_lib_s"]
    data_ratio = rows[1]["tensor_bytes"] / rows[0]["tensor_bytes"]
    print(f"data x{data_ratio:.0f}, library inspect time x{ratio:.2f} (1 GB checkpoint written in {write_s:.1f} s)")
    result = {"benchmark": "inspect", "runs": args.runs, "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count(), "write_1gb_s": round(write_s, 2),
              "rows": rows, "data_ratio": round(data_ratio, 1), "lib_time_ratio": round(ratio, 2)}
    write_json_atomic(args.output, result)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
