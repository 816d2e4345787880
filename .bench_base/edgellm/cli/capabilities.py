"""``edgellm capabilities``: the precisions this edgellm can export and build, and its backends, as JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

NAME = "capabilities"
HELP = "print what this edgellm can export and build (precisions, backends present and why others are not), as JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="also write the JSON to this file")


def run(args: argparse.Namespace) -> int:
    from edgellm.capabilities import capabilities
    from edgellm.files import write_text_atomic

    text = json.dumps(capabilities(), indent=2, sort_keys=True)
    if args.output:  # first: a refused output path prints nothing
        write_text_atomic(Path(args.output), text + "\n")
    print(text)
    return 0
