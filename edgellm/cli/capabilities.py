"""``edgellm capabilities``: the precisions this edgellm can export and build, and its backends, as JSON."""

from __future__ import annotations

import argparse
import json

NAME = "capabilities"
HELP = "print what this edgellm can export and build (precisions, backends present and why others are not), as JSON"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", help="also write the JSON to this file")


def run(args: argparse.Namespace) -> int:
    from edgellm.capabilities import capabilities

    text = json.dumps(capabilities(), indent=2, sort_keys=True)
    print(text)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0
