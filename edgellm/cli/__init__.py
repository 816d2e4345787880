"""The ``edgellm`` command line. Each subcommand is one module in this package exposing
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; they are found by listing the package.

Exit codes: 0 success, 1 test failure (the model ran and a check failed), 2 bad input or unsupported model,
3 infrastructure failure, 4 internal bug.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from edgellm import __version__
from edgellm.errors import EXIT_CODES_HELP, EXIT_OK, EdgeLLMError, ErrorKind
from edgellm.registry import import_submodules

EXIT_TEST_FAILURE = ErrorKind.TEST_FAILURE.exit_code
EXIT_BAD_INPUT = ErrorKind.CONFIGURATION.exit_code
EXIT_INFRA = ErrorKind.INFRASTRUCTURE.exit_code
EXIT_BUG = ErrorKind.BUG.exit_code
__all__ = ["EXIT_BAD_INPUT", "EXIT_BUG", "EXIT_INFRA", "EXIT_OK", "EXIT_TEST_FAILURE", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edgellm",
        description="Inspect, export, build, run and check LLM checkpoints for edge devices.",
        epilog=EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"edgellm {__version__}")
    parser.add_argument("--debug", action="store_true", help="print tracebacks of unexpected errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in import_submodules(__name__, private=False):
        mod = importlib.import_module(f"{__name__}.{name}")
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


# The machine is short of something or its storage broke: infrastructure, never the model's or the code's fault.
MACHINE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ENOMEM})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args))
    except EdgeLLMError as exc:
        print(f"edgellm {args.command}: error ({exc.kind.value}): {exc}", file=sys.stderr)
        if args.debug or os.environ.get("EDGELLM_DEBUG"):
            traceback.print_exc()
        return exc.kind.exit_code
    except ModuleNotFoundError as exc:  # an incomplete install on this machine, not a bug in edgellm
        print(f"edgellm {args.command}: error (configuration): Python package {exc.name!r} is not installed here "
              f"(install edgellm's dependencies: pip install edgellm-farm)", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"edgellm {args.command}: interrupted", file=sys.stderr)
        return 130
    except MemoryError:  # the machine ran out, not the code: infrastructure (the farm retries elsewhere)
        print(f"edgellm {args.command}: error (infrastructure): out of memory", file=sys.stderr)
        return EXIT_INFRA
    except OSError as exc:
        if exc.errno not in MACHINE_ERRNOS:
            print(f"edgellm {args.command}: internal error (bug): {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_BUG
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"edgellm {args.command}: error (infrastructure): {exc.strerror}{where}", file=sys.stderr)
        return EXIT_INFRA
    except Exception as exc:  # a bug: say so in one line; the traceback is one flag away
        print(f"edgellm {args.command}: internal error (bug): {type(exc).__name__}: {exc}", file=sys.stderr)
        if args.debug or os.environ.get("EDGELLM_DEBUG"):
            traceback.print_exc()
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
