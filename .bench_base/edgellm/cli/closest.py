"""``edgellm closest CKPT_DIR [--output JSON]``: the registered family closest to a checkpoint and the kind of change
(alias, configuration-only variant, new structure), with the config fields and tensor roles that decide it.

Prints the ``edgellm.closest/1`` JSON (``edgellm.checkpoint.closest``); exit 0 whatever the classification (it is a
finding, not a verdict), 2 for bad input (no directory, no weights, an unreadable config.json)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgellm.checkpoint import write_json_atomic
from edgellm.errors import EXIT_OK

NAME = "closest"
HELP = "compare a checkpoint with every registered family and classify the change (JSON)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CKPT_DIR", help="checkpoint directory")
    parser.add_argument("--output", "-o", type=Path, metavar="JSON", help="also write the JSON here")


def run(args: argparse.Namespace) -> int:
    from edgellm.checkpoint.closest import closest_family

    result = closest_family(args.checkpoint)
    if args.output:
        write_json_atomic(args.output, result)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return EXIT_OK
