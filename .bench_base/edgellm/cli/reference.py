"""``edgellm reference``: run transformers on a checkpoint once and store what ``edgellm eval --reference`` needs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from edgellm import BUNDLED_TEXT_FILE
from edgellm.reference import (
    DEFAULT_GREEDY_TOKENS,
    DEFAULT_MAX_TOKENS,
    DEFAULT_WINDOW,
    FORMAT,
    REFERENCE_DEVICES,
    ReferenceSettings,
    compute_reference,
)

NAME = "reference"
HELP = f"compute the transformers reference of a checkpoint once and save it ({FORMAT} .npz) for `edgellm eval`"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint directory")
    p.add_argument("--output", type=Path, required=True, help="reference file to write (.npz; replaced atomically)")
    p.add_argument("--text", type=Path, default=BUNDLED_TEXT_FILE,
                   help="text for the perplexity check (default: the bundled TinyStories sample); stored in the file")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens of the text to evaluate (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--greedy-tokens", type=int, default=DEFAULT_GREEDY_TOKENS,
                   help=f"tokens to generate per prompt for the greedy check (default {DEFAULT_GREEDY_TOKENS})")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"perplexity window in tokens (default {DEFAULT_WINDOW}); engines with a smaller "
                        f"max_input_len are refused by eval")
    p.add_argument("--layers", type=int, default=0, metavar="N",
                   help="also store each prompt's hidden state after the first N decoder layers and the logits of "
                        "the checkpoint truncated to N layers (for `edgellm layers-check`; default 0: none)")
    p.add_argument("--layer-states", action="store_true",
                   help="also store the residual stream after every layer's attention and MLP on the prompts and the "
                        "text's first tokens, so `edgellm eval --reference` can say which layer diverges")
    p.add_argument("--device", choices=REFERENCE_DEVICES, default="cpu",
                   help="where transformers runs the checkpoint, always in fp32 (default cpu; cuda: the first GPU, "
                        "TF32 off); recorded in the file")


def run(args: argparse.Namespace) -> int:
    settings = ReferenceSettings(text_file=args.text, max_tokens=args.max_tokens, greedy_tokens=args.greedy_tokens,
                                 window=args.window, layers=args.layers, layer_states=args.layer_states)
    t0 = time.perf_counter()
    ref = compute_reference(args.checkpoint, settings, args.device)
    sha = ref.save(args.output)
    summary = {"output": str(args.output), "sha256": sha, "bytes": Path(args.output).stat().st_size,
               "checkpoint_sha256": ref.checkpoint_sha256,
               "checkpoint_revision": ref.header["checkpoint"]["revision"], "layers": ref.layers,
               "settings": {k: v for k, v in ref.settings.items() if k != "prompts"},
               "reference_perplexity": ref.header["reference_perplexity"], "device": ref.device,
               "seconds": round(time.perf_counter() - t0, 3)}
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0
