"""``edgellm layers-check CKPT_DIR --reference REF [--layers N]``: the checkpoint cut to its first N decoder layers,
exported, built for ONNX Runtime and run, against the reference's layer-N hidden states and logits
(``edgellm.layers_check``). Prints a summary and writes the ``edgellm.layers-check/1`` report (``--output``).

Exit 0 when every check passed, 1 when one failed (the report says which, with the numbers), 2 for bad input."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.errors import EXIT_OK, TestFailure
from edgellm.reporting import json_safe, write_json_atomic

NAME = "layers-check"
HELP = "few-layer numeric test: an N-layer truncation through edgellm's ONNX Runtime route vs the reference"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, metavar="CKPT_DIR", help="Hugging Face checkpoint directory")
    p.add_argument("--reference", type=Path, required=True,
                   help="reference file of this checkpoint with hidden states (`edgellm reference --layers N`)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="decoder layers to keep (default: the reference's N; another N is refused)")
    p.add_argument("--max-diff", type=float, default=None, dest="max_abs_diff",
                   help="limit of max |engine - reference| (logits and normed hidden states; default: fp32's)")
    p.add_argument("--min-cosine", type=float, default=None, dest="min_cosine",
                   help="limit of the min per-position cosine (default: fp32's)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the truncated checkpoint, export and engine are made (a temporary directory)")
    p.add_argument("--threads", type=int, default=None, help="engine intra-op threads (default: runtime's)")
    p.add_argument("--output", "-o", type=Path, default=None, help="write the JSON report here")


def run(args: argparse.Namespace) -> int:
    from edgellm.layers_check import LayerLimits, layers_check

    given = {k: getattr(args, k) for k in ("max_abs_diff", "min_cosine") if getattr(args, k) is not None}
    limits = LayerLimits(**given)  # before any heavy work: a bad limit is refused at once
    report = layers_check(args.checkpoint, args.reference, args.layers, limits=limits, work_dir=args.work_dir,
                          num_threads=args.threads)
    if args.output is not None:
        write_json_atomic(args.output, report)
    summary = {k: report[k] for k in ("passed", "family", "layers", "of_layers", "checkpoint_sha256")}
    summary["checks"] = {k: {f: c[f] for f in ("value", "threshold", "passed")} for k, c in report["checks"].items()}
    summary["hidden_observable"] = report["hidden"]["observable"]
    json.dump(json_safe(summary), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    if not report["passed"]:
        failed = ", ".join(f"{n} = {report['checks'][n]['value']} (limit {report['checks'][n]['op']} "
                           f"{report['checks'][n]['threshold']})" for n in report["failed_checks"])
        raise TestFailure(f"few-layer check failed after {report['layers']} layer(s): {failed}")
    return EXIT_OK
