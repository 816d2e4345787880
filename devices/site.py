"""A lab's own files beside the packaged ones: the site directory (``$EDGEFARM_SITE_DIR``, or ``edgefarm --site-dir``).

Its subdirectories hold files of the packaged schemas, one kind each (``KINDS``): a site file adds to the packaged
ones, or replaces the packaged file of the same name; either way it is validated as the packaged ones are, and
listings say where each came from. Nothing of the installed package is edited, so an upgrade keeps the lab's files.

The settings (``flows.settings``, the one reader of the farm's environment) and the command line ``configure`` the
site directory; the farm's registries (``registries``) are built from ``current()`` when first asked (its one reader)
and carry it: every loader takes its files from them (``Registries.files``, ``Registries.origin``). Once they have
read it, it cannot change in this process.
"""

from __future__ import annotations

from pathlib import Path

from edgellm.errors import ConfigurationError

# each kind's subdirectory and the file patterns it holds (the packaged directory of the kind holds the same)
PATTERNS: dict[str, tuple[str, ...]] = {"device_types": ("*.yaml",), "lists": ("*.yml",), "matrices": ("*.yml",),
                                        "inventory": ("*.yaml", "*.yml"), "catalog": ("*.yml", "*.yaml")}
KINDS = tuple(PATTERNS)
_state: dict[str, Path | bool | None] = {"site": None, "set": False, "read": False}


def checked(value: str | Path) -> Path:
    """``value`` as a site directory: one that is not a directory, or that holds a subdirectory no kind names, is a
    ConfigurationError naming it and the valid kinds."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigurationError(f"site directory {str(value)!r} ($EDGEFARM_SITE_DIR or --site-dir) is not a "
                                 f"directory; it holds {', '.join(f'{k}/' for k in KINDS)}")
    stray = sorted(p.name for p in path.iterdir() if p.is_dir() and p.name not in KINDS and not p.name.startswith("."))
    if stray:
        raise ConfigurationError(f"site directory {path}: unknown subdirector{'ies' if len(stray) > 1 else 'y'} "
                                 f"{', '.join(stray)}; valid: {', '.join(KINDS)}")
    return path.resolve()


def configure(value: str | Path | None) -> Path | None:
    """Set this process's site directory (None: none), checked; refused once a registry has read another one."""
    site = None if value is None or str(value) == "" else checked(value)
    if _state["read"] and site != _state["site"]:
        raise ConfigurationError(f"site directory {site} given after the registries were built from "
                                 f"{_state['site'] or 'the packaged files alone'}: give --site-dir first")
    _state["site"], _state["set"] = site, True
    return site


def configure_default(value: str | Path | None) -> Path | None:
    """``configure(value)`` unless this process already set or read its site directory (the command line's
    ``--site-dir`` wins over the environment a worker's settings read later)."""
    if _state["set"] or _state["read"]:
        return current()
    return configure(value)


def current() -> Path | None:
    """The configured site directory (None: the packaged files alone); from now on it cannot change."""
    _state["read"] = True
    site = _state["site"]
    assert site is None or isinstance(site, Path)
    return site


def overlay(packaged: Path | None, kind: str, site: Path | None) -> dict[str, Path]:
    """File stem -> file: the packaged directory's files of ``kind`` (``PATTERNS``; None: none packaged), then the
    site directory's ``kind/`` ones, which add or replace by stem. Sorted by stem."""
    if kind not in KINDS:
        raise ConfigurationError(f"unknown site kind {kind!r}; valid: {', '.join(KINDS)}")
    found: dict[str, Path] = {}
    for directory in (packaged, None if site is None else site / kind):
        if directory is None or not directory.is_dir():
            continue
        for pattern in PATTERNS[kind]:
            for path in sorted(directory.glob(pattern)):
                found[path.stem] = path
    return dict(sorted(found.items()))


def origin(path: Path, site: Path | None) -> str:
    """Where a registry's file came from, as listings show it: ``site`` or ``packaged``."""
    return "site" if site is not None and path.resolve().is_relative_to(site) else "packaged"
