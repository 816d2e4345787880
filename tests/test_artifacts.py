"""Content-addressed artifact store: dedupe, deterministic directories, atomic writes, verification, gc."""

from __future__ import annotations

import hashlib
import math
import os
import time
from pathlib import Path

import pytest

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactStore, CorruptArtifactError, MissingArtifactError
from edgellm.errors import ConfigurationError


def _tree(root: Path, mtime: float) -> Path:
    (root / "sub").mkdir(parents=True)
    (root / "b.bin").write_bytes(b"\x00\x01" * 1000)
    (root / "a.txt").write_text("hello")
    (root / "sub" / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "sub" / "run.sh", 0o755)
    for p in root.rglob("*"):
        os.utime(p, (mtime, mtime))
    return root


def test_put_bytes_and_file_dedupe(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    ref = store.put(b"weights", ArtifactKind.CHECKPOINT)
    assert ref.sha256 == hashlib.sha256(b"weights").hexdigest() and ref.size == 7
    assert (ref.kind, ref.packing) == (ArtifactKind.CHECKPOINT, Packing.FILE)
    blob = store.path(ref.sha256)
    assert blob == tmp_path / "store" / "sha256" / ref.sha256[:2] / ref.sha256[2:]
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights")
    assert store.put(f, "log").sha256 == ref.sha256
    assert list(store.list()) == [ref.sha256]  # stored once
    assert store.read_bytes(ref.sha256) == b"weights"
    assert store.get_file(ref.sha256, tmp_path / "out" / "w.bin").read_bytes() == b"weights"
    assert not (blob.stat().st_mode & 0o222)  # read-only
    assert list((tmp_path / "store" / "tmp").iterdir()) == []


def test_directory_is_a_deterministic_tar(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    a = store.put(_tree(tmp_path / "a", 1_000_000), ArtifactKind.ONNX)
    b = store.put(_tree(tmp_path / "b", 2_000_000), ArtifactKind.ONNX)  # same content, other mtimes and path
    assert a.packing is Packing.TAR and a.sha256 == b.sha256
    out = store.extract(a.sha256, tmp_path / "restored")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["a.txt", "b.bin", "sub", "sub/run.sh"]
    assert (out / "b.bin").read_bytes() == b"\x00\x01" * 1000
    assert os.access(out / "sub" / "run.sh", os.X_OK) and not os.access(out / "a.txt", os.X_OK)
    (tmp_path / "a" / "a.txt").write_text("changed")
    assert store.put(tmp_path / "a").sha256 != a.sha256
    (tmp_path / "a" / "link").symlink_to("a.txt")
    with pytest.raises(ConfigurationError, match="symlink"):
        store.put(tmp_path / "a")
    with pytest.raises(ConfigurationError, match="already exists"):
        store.extract(a.sha256, out)


def test_corruption_is_never_served_and_verify_lists_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    good = store.put(b"good")
    bad = store.put(b"bad content")
    blob = store.path(bad.sha256)
    os.chmod(blob, 0o644)
    blob.write_bytes(b"bit rot")
    assert store.verify() == [bad.sha256]
    with pytest.raises(CorruptArtifactError, match=f"sha256:{bad.sha256}.*corrupt"):
        store.read_bytes(bad.sha256)
    dest = tmp_path / "out.bin"
    with pytest.raises(CorruptArtifactError):
        store.get_file(bad.sha256, dest)
    assert not dest.exists() and list(tmp_path.glob(".out.bin*")) == []  # nothing half-written
    assert store.read_bytes(good.sha256) == b"good"
    with pytest.raises(MissingArtifactError, match="0" * 64):
        store.read_bytes("0" * 64)
    with pytest.raises(ConfigurationError, match="'nothex'"):
        store.read_bytes("nothex")
    with pytest.raises(ConfigurationError, match="tarball"):
        store.put(b"x", "tarball")
    with pytest.raises(ConfigurationError, match="no such file"):
        store.put(tmp_path / "missing")


def test_interrupted_write_leaves_no_blob(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")

    src = tmp_path / "d"
    src.mkdir()
    (src / "ok.txt").write_text("ok")
    os.mkfifo(src / "fifo")  # refused mid-tar, after some bytes were written
    with pytest.raises(ConfigurationError, match="fifo"):
        store.put(src)
    assert list(store.list()) == [] and list((tmp_path / "store" / "tmp").iterdir()) == []


def test_gc_removes_only_old_unreferenced_blobs(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    old_ref, old_unref, young = store.put(b"kept"), store.put(b"garbage"), store.put(b"young")
    past = time.time() - 3600
    for ref in (old_ref, old_unref):
        os.utime(store.path(ref.sha256), (past, past))
    stale_tmp = tmp_path / "store" / "tmp" / "put-crashed"
    stale_tmp.write_bytes(b"partial")
    os.utime(stale_tmp, (past, past))
    store.close()  # the run that put them ended: from now on only references (and age) keep them
    assert store.gc({old_ref.sha256}, older_than_s=600) == [old_unref.sha256]
    assert sorted(store.list()) == sorted([old_ref.sha256, young.sha256])
    assert not stale_tmp.exists()
    # putting old content again makes it young: gc spares it until the caller records the reference
    os.utime(store.path(old_ref.sha256), (past, past))
    store.put(b"kept")
    store.close()
    assert store.gc(set(), older_than_s=600) == []
    for bad in (-1, math.nan, math.inf):
        with pytest.raises(ConfigurationError, match=str(bad)):
            store.gc(set(), older_than_s=bad)


def test_gc_keeps_what_an_open_store_put_until_it_is_closed(tmp_path: Path) -> None:
    run, gc = ArtifactStore(tmp_path / "store"), ArtifactStore(tmp_path / "store")
    ref = run.put(b"not recorded yet")
    assert gc.gc(set(), older_than_s=0) == [] and run.has(ref.sha256)  # pinned by the run's open store
    run.close()
    assert gc.gc(lambda: set(), older_than_s=0) == [ref.sha256]
    assert list((tmp_path / "store" / "pins").iterdir()) == []
