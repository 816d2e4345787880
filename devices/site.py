"""A lab's own files beside the packaged ones: the site directory (``EDGEFARM_SITE_DIR``, or ``edgefarm --site-dir``).

Its subdirectories hold files of the packaged schemas, one kind each (``KINDS``): a site file adds to the packaged
ones, or replaces the packaged file of the same name; either way it is validated as the packaged ones are, and
listings say where each came from. Nothing of the installed package is edited, so an upgrade keeps the lab's files.

Registries ask ``overlay`` with the site directory they were given (``site_dir()`` reads the setting once, at the
edge); none reads the environment itself (issue 38: registries built from settings, carried in a context).
"""

from __future__ import annotations

import os
from pathlib import Path

from edgellm.errors import ConfigurationError

ENV_SITE_DIR = "EDGEFARM_SITE_DIR"
KINDS = ("device_types", "lists", "matrices", "inventory", "catalog")


def site_dir(value: str | Path | None = None) -> Path | None:
    """The site directory: ``value``, else ``EDGEFARM_SITE_DIR``, else None. One that is not a directory, or that
    holds a subdirectory no kind names, is a ConfigurationError naming it and the valid kinds."""
    raw = value if value is not None else os.environ.get(ENV_SITE_DIR) or None
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if not path.is_dir():
        raise ConfigurationError(f"site directory {str(raw)!r} ({ENV_SITE_DIR} or --site-dir) is not a directory; "
                                 f"it holds {', '.join(f'{k}/' for k in KINDS)}")
    stray = sorted(p.name for p in path.iterdir() if p.is_dir() and p.name not in KINDS and not p.name.startswith("."))
    if stray:
        raise ConfigurationError(f"site directory {path}: unknown subdirector{'ies' if len(stray) > 1 else 'y'} "
                                 f"{', '.join(stray)}; valid: {', '.join(KINDS)}")
    return path.resolve()


def overlay(packaged: Path, kind: str, site: Path | None, patterns: tuple[str, ...]) -> dict[str, Path]:
    """File stem -> file: the packaged directory's files matching ``patterns``, then the site directory's
    ``kind/`` ones, which add or replace by stem. Sorted by stem."""
    if kind not in KINDS:
        raise ConfigurationError(f"unknown site kind {kind!r}; valid: {', '.join(KINDS)}")
    found: dict[str, Path] = {}
    for directory in (packaged, None if site is None else site / kind):
        if directory is None or not directory.is_dir():
            continue
        for pattern in patterns:
            for path in sorted(directory.glob(pattern)):
                found[path.stem] = path
    return dict(sorted(found.items()))


def origin(path: Path, site: Path | None) -> str:
    """Where a registry's file came from, as listings show it: ``site`` or ``packaged``."""
    return "site" if site is not None and path.resolve().is_relative_to(site) else "packaged"
