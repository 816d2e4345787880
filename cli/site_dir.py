"""``edgefarm --site-dir DIR ...`` (or ``$EDGEFARM_SITE_DIR``): the site directory is set when this package is
imported, before any registry is built from it (``devices.site``; the device types are read on first use).

The option must come first on the command line: it is read here, ahead of the command groups; the app's callback
checks the value that was applied. A bad site directory or site file is a one-line configuration error (exit 2).
"""

from __future__ import annotations

import os
import sys

from edgellm.errors import ConfigurationError, ErrorKind

OPTION = "--site-dir"


def given(argv: list[str]) -> str | None:
    """The value of a leading ``--site-dir DIR`` / ``--site-dir=DIR`` of ``argv``, else None."""
    if argv and argv[0].startswith(OPTION + "="):
        return argv[0].split("=", 1)[1]
    if len(argv) >= 2 and argv[0] == OPTION:
        return argv[1]
    return None


def configure_or_exit(argv: list[str]) -> None:
    """Set the site directory (the option, else the settings' environment) and build the device types from it now,
    so that a bad one is a configuration error naming it, not a traceback."""
    try:
        from edgefarm.flows.settings import configure_site

        configure_site(given(argv))
        from edgefarm.registries import current

        current()
    except ConfigurationError as exc:
        from edgefarm.cli.text import visible  # not cli.common: it would build the registries this decides first

        print(f"edgefarm: error (configuration): {visible(exc)}", file=sys.stderr)
        sys.exit(ErrorKind.CONFIGURATION.exit_code)


if os.path.basename(sys.argv[0]) in ("edgefarm", "__main__.py", "-m"):  # "-m": python -m edgefarm.cli, at import
    configure_or_exit(sys.argv[1:])
