"""``edgefarm --site-dir DIR ...``: applied when this package is imported, before any registry is built.

Device types are read when ``devices.types`` is first imported (issue 38 moves them into a context built from the
settings); so the option, which must come first on the command line, is turned into ``EDGEFARM_SITE_DIR`` here,
ahead of the imports of the command groups. The app's callback checks the value that was applied.
"""

from __future__ import annotations

import os
import sys

from devices.site import ENV_SITE_DIR
from edgellm.errors import ConfigurationError, ErrorKind

OPTION = "--site-dir"


def apply(argv: list[str]) -> None:
    """Set ``EDGEFARM_SITE_DIR`` from a leading ``--site-dir DIR`` / ``--site-dir=DIR`` of ``argv``."""
    if argv and argv[0].startswith(OPTION + "="):
        os.environ[ENV_SITE_DIR] = argv[0].split("=", 1)[1]
    elif len(argv) >= 2 and argv[0] == OPTION:
        os.environ[ENV_SITE_DIR] = argv[1]


def load_or_exit() -> None:
    """Build the registries the site directory feeds now, so that a bad site directory or file is a one-line
    configuration error (exit 2) naming it, not a traceback from an import."""
    try:
        import devices.types  # noqa: F401
    except ConfigurationError as exc:
        print(f"edgefarm: error (configuration): {exc}", file=sys.stderr)
        sys.exit(ErrorKind.CONFIGURATION.exit_code)


if os.path.basename(sys.argv[0]) in ("edgefarm", "__main__.py", "-m"):  # "-m": python -m flows.cli, at import
    apply(sys.argv[1:])
    load_or_exit()
