"""Caches heal: a corrupt store blob or device cache entry is found by its digest, evicted and made again."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactStore, CorruptArtifactError
from edgefarm.devices.transport import open_transport
from edgefarm.tasks import device_cache
from edgefarm.tasks.device_exec import device_env_info, ensure_on_device, promote_to_cache
from edgefarm.tasks.farm import Farm, FarmContext
from edgellm.errors import ErrorKind, InfrastructureError


def _corrupt(path: Path) -> None:
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_blob_is_no_cache_hit_and_is_rebuilt(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    ref = store.put(b"engine bytes " * 1000, ArtifactKind.ENGINE)
    assert store.has(ref.sha256)
    _corrupt(store.path(ref.sha256))
    assert not store.has(ref.sha256)  # a cache miss, not a failure
    assert not store.path(ref.sha256).exists()  # evicted
    again = store.put(b"engine bytes " * 1000, ArtifactKind.ENGINE)  # the stage reruns and stores it
    assert again.sha256 == ref.sha256 and store.has(ref.sha256)


def test_putting_the_content_of_a_corrupt_blob_again_heals_it(tmp_path: Path) -> None:
    """A stage input stored again every run (the infer request) is never looked up first: before the fix its put
    deduplicated against the corrupt blob and returned a reference every device then failed to stage."""
    store = ArtifactStore(tmp_path / "store")
    ref = store.put(b'{"requests": []}', ArtifactKind.REPORT)
    _corrupt(store.path(ref.sha256))
    assert store.verify() == [ref.sha256]
    again = store.put(b'{"requests": []}', ArtifactKind.REPORT)
    assert again == ref
    assert store.verify() == []
    assert store.read_bytes(ref.sha256) == b'{"requests": []}'
    assert oct(store.path(ref.sha256).stat().st_mode & 0o777) == oct(0o444)  # read-only again


def test_corrupt_blob_read_is_infrastructure_then_a_cache_miss(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    ref = store.put(b"x" * 4096)
    _corrupt(store.path(ref.sha256))
    with pytest.raises(CorruptArtifactError, match=r"corrupt .* next cache lookup evicts it") as caught:
        store.get_file(ref.sha256, tmp_path / "out.bin")
    assert isinstance(caught.value, InfrastructureError) and caught.value.kind is ErrorKind.INFRASTRUCTURE
    assert not (tmp_path / "out.bin").exists()
    assert not store.has(ref.sha256) and not store.path(ref.sha256).exists()  # the next lookup: miss, evicted


@pytest.fixture
def local_farm(tmp_path: Path):
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "box.yaml").write_text(f"type: x86-cpu\ntransport: local\nwork_dir: {tmp_path / 'device'}\n")
    ctx = FarmContext(run_id=1, db_url=f"sqlite:///{tmp_path / 'farm.db'}", data_dir=str(tmp_path / "data"),
                      inventory_dir=str(inventory))
    farm = Farm.get(ctx)
    yield farm, next(iter(farm.inventory)), tmp_path / "device"
    Farm.close(ctx)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_device_cache_entries_are_verified_evicted_and_restaged(local_farm, tmp_path: Path) -> None:
    farm, device, work = local_farm
    engine = tmp_path / "engine"
    (engine / "sub").mkdir(parents=True)
    (engine / "model.onnx").write_bytes(os.urandom(10_000))
    (engine / "sub" / "tokenizer.json").write_text('{"v": 1}')
    tar_ref = farm.store.put(engine, ArtifactKind.ENGINE)
    file_ref = farm.store.put(b"weights" * 1000, ArtifactKind.ONNX)
    assert tar_ref.packing is Packing.TAR
    with open_transport(device) as link:
        remote = ensure_on_device(farm, link, tar_ref)
        cached = work / remote
        assert _files(cached) == _files(engine)
        assert (work / "cache" / f"{tar_ref.sha256}.sha256sums").is_file()  # sealed
        assert device_cache.usable(link, tar_ref.sha256, Packing.TAR)

        (cached / "model.onnx").write_bytes(b"flipped")  # a corrupt entry: restaged, not used
        assert ensure_on_device(farm, link, tar_ref) == remote
        assert _files(cached) == _files(engine)
        (cached / "extra.bin").write_text("planted")  # an unlisted file also fails the check
        ensure_on_device(farm, link, tar_ref)
        assert _files(cached) == _files(engine)
        (work / "cache" / f"{tar_ref.sha256}.sha256sums").unlink()  # no seal: not trusted
        assert not device_cache.usable(link, tar_ref.sha256, Packing.TAR) and not cached.exists()

        file_remote = ensure_on_device(farm, link, file_ref)
        (work / file_remote).write_bytes(b"not the weights")
        ensure_on_device(farm, link, file_ref)
        assert (work / file_remote).read_bytes() == b"weights" * 1000


def test_promoted_engine_is_sealed_and_a_corrupt_one_replaced(local_farm, tmp_path: Path) -> None:
    farm, device, work = local_farm
    built = work / "jobs" / "j1" / "engine"
    built.mkdir(parents=True)
    (built / "model.onnx").write_bytes(b"engine")
    ref = farm.store.put(built, ArtifactKind.ENGINE)
    with open_transport(device) as link:
        promote_to_cache(link, "jobs/j1/engine", ref.sha256)
        assert device_cache.usable(link, ref.sha256, Packing.TAR)
        (work / "cache" / ref.sha256 / "model.onnx").write_bytes(b"bitrot")
        rebuilt = work / "jobs" / "j2" / "engine"
        rebuilt.mkdir(parents=True)
        (rebuilt / "model.onnx").write_bytes(b"engine")
        promote_to_cache(link, "jobs/j2/engine", ref.sha256)  # the corrupt entry gives way to the new build
        assert (work / "cache" / ref.sha256 / "model.onnx").read_bytes() == b"engine"
        assert device_cache.usable(link, ref.sha256, Packing.TAR)


def test_dead_uploads_are_swept_from_the_device_cache(local_farm) -> None:
    """A device that died mid-upload (or an orchestrator killed mid-upload) leaves `.<sha>.partial-*` behind, known
    only to the transport that made it; the next run's first contact removes it once nothing wrote to it for
    STALE_PARTIAL_MIN minutes, and leaves an upload in progress alone."""
    farm, device, work = local_farm
    cache = work / "cache"
    dead_dir = cache / f".{'a' * 64}.partial-0123456789ab"
    (dead_dir / "sub").mkdir(parents=True)
    (dead_dir / "sub" / "model.onnx").write_bytes(b"half an engine")
    dead_file = cache / f".{'b' * 64}.partial-ba9876543210"
    dead_file.write_bytes(b"half a blob")
    old = time.time() - (device_cache.STALE_PARTIAL_MIN + 5) * 60
    for path in (dead_dir / "sub" / "model.onnx", dead_dir / "sub", dead_dir, dead_file):
        os.utime(path, (old, old))
    writing = cache / f".{'c' * 64}.partial-00000000000a"  # an old dir whose file is still being written
    writing.mkdir()
    (writing / "model.onnx").write_bytes(b"still arriving")
    os.utime(writing, (old, old))
    kept = cache / ("d" * 64)
    kept.write_bytes(b"a cache entry")
    os.utime(kept, (old, old))
    with open_transport(device) as link:
        swept = device_cache.sweep_partials(link)
    assert sorted(swept) == sorted([dead_dir.name, dead_file.name])
    assert sorted(p.name for p in cache.iterdir()) == sorted([writing.name, kept.name])
    dead_file.write_bytes(b"half a blob")
    os.utime(dead_file, (old, old))
    with open_transport(device) as link:
        device_env_info(farm, device, link)  # a run's first contact with the device sweeps too
    assert not dead_file.exists() and writing.exists()


def _reseal(entry: Path, seal: Path) -> None:
    """What a board that rewrites evidence does: the entry's own seal made to match its (changed) files."""
    import hashlib

    lines = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(entry).as_posix()}\n"
             for p in sorted(entry.rglob("*"), key=lambda p: "./" + p.relative_to(entry).as_posix()) if p.is_file()]
    seal.write_text("".join(lines))


@pytest.mark.parametrize("rewrite", ["weights only", "weights, engine manifest and the board's seal"])
def test_a_reused_engine_must_match_the_farm_s_digest_else_it_is_evicted_and_built_again(
        local_farm, rewrite: str) -> None:
    """Issue 40 item 3: a cached engine with one weight byte flipped (and, by a hostile board, its own
    engine_manifest.json and cache seal rewritten to match) is no build cache hit: the entry is re-hashed against the
    digest the farm recorded when it built it, evicted, and the build runs again; an untouched entry is reused."""
    import hashlib
    import json
    from types import SimpleNamespace

    from edgefarm.tasks import engines
    from edgefarm.tasks.build import engine_present

    farm, device, work = local_farm
    built = work / "jobs" / "j1" / "engine"
    built.mkdir(parents=True)
    weights = os.urandom(4096)
    (built / "rank0.engine").write_bytes(weights)
    (built / "engine_manifest.json").write_text(json.dumps(
        {"files": {"rank0.engine": hashlib.sha256(weights).hexdigest()}}))
    job = SimpleNamespace(key="j")
    with open_transport(device) as link:
        sealed = engines.seal_built(farm, device, link, "jobs/j1")
        ref = engines.store(farm, engines.DeviceEngine(
            digest=sealed.digest, device=device.id, platform="x86-cpu", toolchain="edgellm-ort",
            toolchain_version="1", bytes=sealed.bytes, files=sealed.files, onnx="b" * 64))
        assert engine_present(farm.ctx, job, ref)  # untouched: reused
        entry, seal = work / "cache" / sealed.digest, work / "cache" / f"{sealed.digest}.sha256sums"
        flipped = bytearray(weights)
        flipped[100] ^= 0x01
        (entry / "rank0.engine").write_bytes(bytes(flipped))
        if rewrite != "weights only":
            (entry / "engine_manifest.json").write_text(json.dumps(
                {"files": {"rank0.engine": hashlib.sha256(bytes(flipped)).hexdigest()}}))
            _reseal(entry, seal)
        assert engines.present(link, sealed.digest)  # the board's own evidence still says it is whole
        assert not engine_present(farm.ctx, job, ref)  # the farm's digest does not: a miss, so the build runs again
        assert not entry.exists() and not seal.exists()  # evicted: healed by that build, not failed every night
