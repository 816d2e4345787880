"""``edgellm bench``: prefill or decode throughput and latency of a built engine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.bench import BenchOptions, run_bench
from edgellm.errors import ConfigurationError
from edgellm.reporting import json_safe, write_json_atomic
from edgellm.types import BenchMode

NAME = "bench"
HELP = "measure an engine's prefill or decode tokens/s and step latency at a given batch, input and past length"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-dir", type=Path, required=True, help="engine directory (from `edgellm build`)")
    p.add_argument("--mode", required=True, help="prefill (input_len new tokens per sequence) or decode (1 token)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--input-len", type=int, default=128, help="new tokens per sequence in prefill mode")
    p.add_argument("--past-len", type=int, default=0, help="positions already in the KV cache")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    p.add_argument("--iterations", type=int, default=10, help="timed iterations")
    p.add_argument("--threads", type=int, default=None, help="engine intra-op threads (default: runtime's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input token ids")
    p.add_argument("--output", type=Path, default=None, help="write the JSON report here (default: stdout only)")


def run(args: argparse.Namespace) -> int:
    try:
        mode = BenchMode(str(args.mode).lower())
    except ValueError:
        raise ConfigurationError(f"unknown --mode {args.mode!r}; valid: "
                                 f"{', '.join(m.value for m in BenchMode)}") from None
    opts = BenchOptions(engine_dir=args.engine_dir, mode=mode, batch_size=args.batch_size,
                        input_len=args.input_len, past_len=args.past_len, warmup=args.warmup,
                        iterations=args.iterations, num_threads=args.threads, seed=args.seed)
    report = run_bench(opts)
    if args.output is not None:
        write_json_atomic(args.output, report)
    json.dump(json_safe(report), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
