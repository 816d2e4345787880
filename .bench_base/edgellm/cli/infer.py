"""``edgellm infer --engine-dir E --input-file req.json --output-file out.json``: batched generation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.bench import cuda_peaks, peak_rss_bytes

NAME = "infer"
HELP = "run generation requests (JSON file) on a built engine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-dir", type=Path, required=True, help="directory written by 'edgellm build'")
    parser.add_argument("--input-file", type=Path, required=True, help='{"requests": [{"id", "prompt", ...}]}')
    parser.add_argument("--output-file", type=Path, required=True, help='{"responses": [...]} is written here')
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads (default: physical cores)")


def run(args: argparse.Namespace) -> int:
    from edgellm.runtime import Engine
    from edgellm.runtime.requests import parse_request_file, write_response_file

    requests = parse_request_file(args.input_file)  # validate before loading the engine
    rss_before = peak_rss_bytes()
    engine = Engine.open(args.engine_dir, num_threads=args.threads)
    results = engine.generate(requests)
    # the engine's peak memory over the run: host RSS over the baseline before it opened; torch-CUDA's allocator
    peaks = {"peak_memory_bytes": peak_rss_bytes() - rss_before, **cuda_peaks()}
    write_response_file(args.output_file, results, peaks)
    print(json.dumps({"output_file": str(args.output_file), "responses": len(results), **peaks}), file=sys.stdout)
    return 0
