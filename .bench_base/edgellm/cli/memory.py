"""``edgellm memory CKPT_DIR --precision P --max-seq-len N --max-batch-size B [...]``: the memory an engine of the
checkpoint would need, estimated from its config alone (``edgellm.memory``), as JSON on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.errors import EXIT_OK
from edgellm.memory import (
    FLOAT_BYTES,
    compute_dtype,
    estimate_checkpoint,
    load_copy,
    load_reserves,
    missing_reserve,
    reserve_for,
)

NAME = "memory"
HELP = "estimate an engine's memory (weights, KV cache, activations, runtime reserve) from a checkpoint's config"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, metavar="CKPT_DIR", help="checkpoint directory (config.json is read)")
    p.add_argument("--precision", default=None, help="weight precision (a quantized checkpoint's own by default)")
    p.add_argument("--lm-head-precision", default=None, help="LM head precision (default: the float dtype)")
    p.add_argument("--kv-cache-precision", default=None, help="KV cache precision (default: the float dtype)")
    p.add_argument("--max-seq-len", type=int, required=True, help="KV capacity per sequence")
    p.add_argument("--max-batch-size", type=int, required=True)
    p.add_argument("--max-input-len", type=int, default=None, help="longest prefill (default: --max-seq-len)")
    p.add_argument("--toolchain", default=None, help="the runtime whose measured reserve is added")
    p.add_argument("--device-type", default=None,
                   help="the device type the reserve was measured on (default: the toolchain's only one)")
    p.add_argument("--float-dtype", default=None, choices=sorted(FLOAT_BYTES),
                   help="float format of the unquantized parts of a quantized row (default: the toolchain's, "
                        "else fp16)")


def run(args: argparse.Namespace) -> int:
    reserves = load_reserves()
    reserve = reserve_for(args.toolchain, args.device_type, reserves)
    found = estimate_checkpoint(args.checkpoint, args.precision, max_seq_len=args.max_seq_len,
                                max_batch_size=args.max_batch_size, max_input_len=args.max_input_len,
                                lm_head_precision=args.lm_head_precision,
                                kv_cache_precision=args.kv_cache_precision,
                                float_dtype=args.float_dtype or compute_dtype(args.toolchain),
                                reserve=reserve, load_copy=load_copy(args.toolchain),
                                no_reserve=missing_reserve(args.toolchain, args.device_type, reserves))
    out = {"checkpoint": str(args.checkpoint), "toolchain": args.toolchain,
           "device_type": reserve.device_type if reserve is not None else args.device_type, **found.to_json()}
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return EXIT_OK

