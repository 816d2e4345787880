"""``edgellm build ONNX_DIR ENGINE_DIR --backend ort [--max-batch-size N --max-input-len N --max-seq-len N]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "build"
HELP = "build an inference engine from an ONNX export"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("onnx_dir", type=Path, help="directory written by 'edgellm export'")
    parser.add_argument("engine_dir", type=Path, help="output directory (written whole or not at all)")
    parser.add_argument("--backend", default="ort",
                        help="engine backend (edgellm capabilities lists them): ort (CPU), torch-cuda (NVIDIA GPU)")
    parser.add_argument("--max-batch-size", type=int, default=None, help="largest batch (default 4)")
    parser.add_argument("--max-input-len", type=int, default=None, help="longest prompt in tokens")
    parser.add_argument("--max-seq-len", type=int, default=None, help="KV capacity: prompt + generated tokens")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from edgellm.compiler.build import build_engine

    manifest = build_engine(args.onnx_dir, args.engine_dir, args.backend, max_batch_size=args.max_batch_size,
                            max_input_len=args.max_input_len, max_seq_len=args.max_seq_len,
                            overwrite=args.overwrite)
    summary = {"engine_dir": str(args.engine_dir), "backend": manifest["backend"],
               "precision": manifest["precision"], "build_seconds": manifest["build_seconds"],
               **manifest["build_params"]}
    print(json.dumps(summary), file=sys.stdout)
    return 0
