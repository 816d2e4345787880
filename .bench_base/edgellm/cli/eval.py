"""``edgellm eval``: compare a built engine with Hugging Face transformers running the same checkpoint, either
here (``--checkpoint``) or from a reference file ``edgellm reference`` made (``--reference``: no torch needed)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.accuracy import DEFAULT_GREEDY_TOKENS, DEFAULT_MAX_TOKENS, DEFAULT_WINDOW, EvalOptions, run_eval
from edgellm.errors import TestFailure
from edgellm.reference import REFERENCE_DEVICES
from edgellm.reporting import json_safe, write_json_atomic

NAME = "eval"
HELP = "check an engine's logits, greedy output and perplexity against transformers on the same checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine-dir", type=Path, required=True, help="engine directory (from `edgellm build`)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path, help="the Hugging Face checkpoint it was built from (runs "
                                                     "transformers here)")
    src.add_argument("--reference", type=Path, help="a reference file from `edgellm reference` of that checkpoint "
                                                    "(no torch/transformers needed; its settings apply)")
    p.add_argument("--text", type=Path, default=None,
                   help="with --checkpoint: text for the perplexity check (default: the bundled TinyStories sample)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"with --checkpoint: tokens of the text to evaluate (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--greedy-tokens", type=int, default=None,
                   help=f"with --checkpoint: tokens to generate per prompt (default {DEFAULT_GREEDY_TOKENS})")
    p.add_argument("--window", type=int, default=None,
                   help=f"with --checkpoint: perplexity window in tokens (default {DEFAULT_WINDOW}; must fit the "
                        f"engine's max_input_len)")
    p.add_argument("--reference-device", choices=REFERENCE_DEVICES, default=None,
                   help="with --checkpoint: where transformers computes the (always fp32) reference (default: where "
                        "the engine runs: cuda for torch-cuda engines, cpu for ort); an absent device is an error")
    p.add_argument("--threads", type=int, default=None, help="engine intra-op threads (default: runtime's)")
    p.add_argument("--thresholds", type=Path, default=None,
                   help="JSON/YAML thresholds, flat or keyed by precision (fp32: {...}); null disables a check")
    g = p.add_argument_group("threshold overrides (apply to the engine's precision)")
    g.add_argument("--max-logits-diff", type=float, dest="logits_max_abs_diff")
    g.add_argument("--min-cosine", type=float, dest="logits_min_cosine")
    g.add_argument("--min-greedy-match", type=float, dest="greedy_min_match_fraction")
    g.add_argument("--max-divergence-margin", type=float, dest="greedy_max_divergence_margin")
    g.add_argument("--max-ppl-rel-diff", type=float, dest="ppl_max_rel_diff")
    g.add_argument("--min-top1-agreement", type=float, dest="top1_min_agreement")
    p.add_argument("--layers", action="store_true",
                   help="with --checkpoint: compare the hidden states after every layer (attention, MLP) with "
                        "transformers' even when every check passed (a failing eval always does)")
    p.add_argument("--output", type=Path, default=None, help="write the JSON report here (default: stdout only)")


_OVERRIDES = ("logits_max_abs_diff", "logits_min_cosine", "greedy_min_match_fraction",
              "greedy_max_divergence_margin", "ppl_max_rel_diff", "top1_min_agreement")


def run(args: argparse.Namespace) -> int:
    opts = EvalOptions(
        engine_dir=args.engine_dir,
        checkpoint=args.checkpoint,
        reference=args.reference,
        text_file=args.text,
        window=args.window,
        greedy_tokens=args.greedy_tokens,
        max_tokens=args.max_tokens,
        thresholds_file=args.thresholds,
        threshold_overrides={k: getattr(args, k) for k in _OVERRIDES if getattr(args, k) is not None},
        num_threads=args.threads,
        reference_device=args.reference_device,
        layers=args.layers,
    )
    report = run_eval(opts)
    if args.output is not None:
        write_json_atomic(args.output, report)
    summary = {k: report[k] for k in ("passed", "precision", "reference_device", "reference_perplexity",
                                      "engine_perplexity", "perplexity_ratio")}
    for key in ("first_divergent_layer", "layers_summary", "layers_unavailable", "diagnosis"):
        if key in report:
            summary[key] = report[key]
    summary["checks"] = {k: {f: c[f] for f in ("value", "threshold", "passed")} for k, c in report["checks"].items()}
    json.dump(json_safe(summary), sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
    if not report["passed"]:
        failed = ", ".join(f"{n} = {report['checks'][n]['value']} (limit {report['checks'][n]['op']} "
                           f"{report['checks'][n]['threshold']})" for n in report["failed_checks"])
        where = "".join(f"; {report[k]}" for k in ("layers_summary",) if report.get(k))
        if report.get("diagnosis"):
            from edgellm.diagnosis import diagnosis_line

            where += f"; diagnosis: {diagnosis_line(report['diagnosis'])}"
        raise TestFailure(f"accuracy check failed at precision {report['precision']}: {failed}{where}")
    return 0
