"""``edgellm export CKPT_DIR ONNX_DIR [--precision P]``: checkpoint -> ONNX graph + runtime artifacts.

A float checkpoint exports as fp32 (default), fp16 or bf16; a ModelOpt-quantized one as its own method (one export
lowers: edgellm/quant), which is also the default."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

NAME = "export"
HELP = "export a Hugging Face checkpoint to an ONNX graph with an explicit KV cache"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ckpt_dir", type=Path, help="checkpoint directory (config.json, safetensors, tokenizer)")
    parser.add_argument("onnx_dir", type=Path, help="output directory (written whole or not at all)")
    from edgellm.quant import exported

    parser.add_argument("--precision", default=None,
                        help="fp32, fp16 or bf16 for a float checkpoint (default fp32); a quantized checkpoint's own "
                             f"method ({', '.join(m.name for m in exported())}; the default)")
    parser.add_argument("--lm-head-precision",
                        help="LM-head precision (default: the precision's; a quantized checkpoint's float LM head "
                             "can also be quantized at export: int8_wo or int4_wo, round-to-nearest, block 32)")
    parser.add_argument("--kv-cache-precision", help="KV-cache precision (default and only choice: the precision's)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output directory")


def run(args: argparse.Namespace) -> int:
    from edgellm.compiler.export import check_variant, export_checkpoint, parse_export_precision

    precision = parse_export_precision(args.precision)  # before any heavy import or file read
    if precision is not None:  # otherwise the checkpoint decides, and the export checks the variant
        check_variant(precision, args.lm_head_precision, args.kv_cache_precision)
    manifest = export_checkpoint(args.ckpt_dir, args.onnx_dir, precision, lm_head_precision=args.lm_head_precision,
                                 kv_cache_precision=args.kv_cache_precision, overwrite=args.overwrite)
    summary = {"onnx_dir": str(args.onnx_dir), "precision": manifest["precision"],
               "lm_head_precision": manifest["lm_head_precision"],
               "kv_cache_precision": manifest["kv_cache_precision"],
               "export_seconds": manifest["export_seconds"], "checkpoint_sha256": manifest["checkpoint"]["sha256"]}
    print(json.dumps(summary), file=sys.stdout)
    return 0
