"""A digest of this edgellm's own source: caches key exports, engines and references by it, so a changed compiler
never reuses an artifact made by the old one (the version string alone does not change between commits)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


@functools.cache
def build_id() -> str:
    """sha256 over the package's Python files (relative path and bytes), first 16 hex digits."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(path.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
