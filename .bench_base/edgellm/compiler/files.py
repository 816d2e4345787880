"""File plumbing shared by export and build: sha256 manifests and all-or-nothing output directories."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgellm.config import read_json_object
from edgellm.errors import ConfigurationError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


def file_table(root: Path, *, exclude: tuple[str, ...] = (),
               known: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{relative path: {sha256, bytes}}`` for every regular file under ``root`` (sorted). ``known`` gives
    digests already computed while writing (large files hashed as they were written, not read back)."""
    table: dict[str, dict[str, Any]] = {}
    known = known or {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in exclude:
            table[rel] = {"sha256": known.get(rel) or sha256_file(p), "bytes": p.stat().st_size}
    return table


def checkpoint_files(ckpt: Path) -> dict[str, dict[str, Any]]:
    """A checkpoint's file table, its identity's input: every file but a version-control folder's (a Hugging Face
    repository cloned with git has ``.git/``, which git rewrites: another revision checked out and back must give the
    same identity)."""
    return {k: v for k, v in file_table(ckpt).items() if k.split("/", 1)[0] != ".git"}


def tree_sha256(table: dict[str, dict[str, Any]]) -> str:
    """One digest over a file table (names and contents), e.g. a checkpoint's identity."""
    h = hashlib.sha256()
    for name in sorted(table):
        h.update(f"{name}\0{table[name]['sha256']}\n".encode())
    return h.hexdigest()


def _listed_path(root: Path, rel: Any, manifest_name: str) -> Path:
    """``root / rel`` for a name a manifest lists, refused unless it is a plain relative path that stays in
    ``root`` (after resolving links). Checked before anything is read, so nothing outside leaks (not even a size)."""
    parts = rel.split("/") if isinstance(rel, str) else []
    plain = bool(parts) and all(p not in ("", ".", "..") and "\\" not in p and "\0" not in p for p in parts)
    if not plain or not (root / rel).resolve().is_relative_to(root.resolve()):
        raise ConfigurationError(
            f"{root / manifest_name}: lists {rel!r}, which is not a file inside {root}; "
            "a manifest may only list relative paths within its directory"
        )
    return root / rel


def verify_files(root: Path, manifest_name: str, *, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load ``root/manifest_name`` and check every listed file's size and sha256; the error names the file.

    ``required``: files the caller will read, which the manifest must list (so they are verified too)."""
    manifest = read_json_object(root / manifest_name, what=manifest_name, max_bytes=16 * 1024 * 1024)
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ConfigurationError(f"{root / manifest_name}: 'files' must be a non-empty object")
    paths = {rel: _listed_path(root, rel, manifest_name) for rel in files}
    unlisted = [name for name in required if name not in files]
    if unlisted:
        raise ConfigurationError(
            f"{root / manifest_name}: does not list {', '.join(unlisted)}, which the runtime reads; "
            "rebuild the directory so its manifest covers every file"
        )
    for rel, entry in files.items():
        path = paths[rel]
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise ConfigurationError(f"{root / manifest_name}: entry for {rel!r} has no sha256")
        if not path.is_file():
            raise ConfigurationError(f"{path}: file listed in {manifest_name} is missing")
        if path.stat().st_size != entry.get("bytes", path.stat().st_size):
            raise ConfigurationError(
                f"{path}: size {path.stat().st_size} does not match {manifest_name} ({entry['bytes']} bytes)"
            )
        digest = sha256_file(path)
        if digest != entry["sha256"]:
            raise ConfigurationError(
                f"{path}: sha256 {digest[:16]}... does not match {manifest_name} ({entry['sha256'][:16]}...)"
            )
    return manifest


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def staged_dir(final: Path, *, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temp dir beside ``final``; on success it replaces ``final`` in one rename, on failure it
    is deleted, so ``final`` is never half-written."""
    final = Path(final).resolve()
    if final.exists() and (not final.is_dir() or any(final.iterdir())) and not overwrite:
        raise ConfigurationError(f"{final}: output directory exists and is not empty; pass --overwrite to replace it")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{os.getpid()}"
            final.rename(old)
        tmp.rename(final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink()
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
