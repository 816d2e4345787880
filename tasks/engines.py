"""Engines stay on the device that built them.

A build leaves its engine dir in the device's cache as ``cache/<digest>``, sealed (``<digest>.sha256sums``: the
``sha256sum`` lines of its files, made by the agent while hashing), where ``digest`` is the sha256 of that seal (the
tree digest). The farm keeps a small manifest instead of the engine (:class:`DeviceEngine`, an ``engine_manifest``
artifact: the build cache's product); only the files the toolchain reads back to check the engine come back
(``DeviceStages.engine_readback``), beside ``ENGINE_LISTING`` (every file's size and sha256). An engine a later
run reuses (a build cache hit) is re-hashed on its device first and must match the digest the farm recorded
(:func:`verified`; else it is evicted and built again). Infer, accuracy and bench run on the device holding the
engine and use ``cache/<digest>``, checked for presence (its seal and file count): it was hashed by this run. An
engine's bytes reach the store only when a policy asks (``fetch_engines``); such an engine can also run on any
device of its platform (staged from the store like any input).

Every cache entry a run uses is marked in use for that run (``cache/.inuse/<sha>.run-<id>``, which the agent's
eviction honours) and touched (its last use); the run's markers are removed when it ends (and expire after the
agent's TTL if it died). Before staging or building, the device's cache is brought under its bound
(``Device.cache_max_gb``) by the agent, least recently used first.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.devices import agent_client
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import RemoteNameError, Transport
from edgefarm.tasks import device_cache
from edgefarm.tasks.farm import Farm
from edgefarm.toolchains.base import ENGINE_LISTING, DeviceStep, ToolchainDriver
from edgellm.errors import BugError, ConfigurationError, InfrastructureError

SCHEMA = 2  # 2: the ONNX it was built from (to build it again when its device is lost)
log = logging.getLogger(__name__)
_SHA = re.compile(r"[0-9a-f]{64}\Z")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")

# $1 = job's engine dir, $2 = its seal, $3 = digest: into cache/<digest> (an identical entry already there wins)
_PROMOTE = (
    'mkdir -p cache && if [ -d "cache/$3" ] && [ -s "cache/$3.sha256sums" ]; then rm -rf -- "$1" "$2"; '
    'else rm -rf -- "cache/$3" && mv -T -- "$1" "cache/$3" && mv -f -- "$2" "cache/$3.sha256sums"; fi'
)
# $1 = digest: the entry and its seal are there and list the same number of files (content was hashed when built)
_PRESENT = (
    'd="cache/$1"; [ -d "$d" ] && [ -s "$d.sha256sums" ] '
    '&& [ "$(find "$d" -type f | wc -l)" -eq "$(wc -l < "$d.sha256sums")" ]'
)
# $1 = tag, then shas: mark each entry in use by the tag and touch it (its last use)
_MARK = ('tag=$1; shift; mkdir -p cache/.inuse && for s; do [ -e "cache/$s" ] || continue; '
         ': > "cache/.inuse/$s.$tag" && touch -c -- "cache/$s"; done')


@dataclass(frozen=True)
class DeviceEngine:
    """What the farm keeps of an engine that stays on a device (the build cache's product)."""

    digest: str  # the tree digest: sha256 of its seal; the entry is cache/<digest> on ``device``
    device: str  # the device whose cache holds it
    platform: str
    toolchain: str
    toolchain_version: str | None
    bytes: int
    files: int
    stored: str | None = None  # sha256 of the engine dir's tar in the store, when a policy fetched it
    onnx: str | None = None  # sha256 of the export it was built from (the store keeps it)
    schema: int = SCHEMA
    # sha256 of the checkpoint's tar in the store that an engine built from the checkpoint reads its weights from at
    # run time (staged wherever it runs); None: the engine holds its weights. Manifests written before it lack it.
    checkpoint: str | None = None

    def to_json(self) -> bytes:
        data = asdict(self)
        if data["checkpoint"] is None:  # an engine holding its weights: the manifest it always had
            del data["checkpoint"]
        return (json.dumps(data, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Any, *, where: str) -> DeviceEngine:
        fields = set(cls.__dataclass_fields__)
        if (not isinstance(data, dict) or set(data) - {"checkpoint"} != fields - {"checkpoint"}
                or data.get("schema") != SCHEMA):
            raise ConfigurationError(f"{where}: not an engine manifest of schema {SCHEMA} (keys {sorted(fields)})")
        data = {"checkpoint": None, **data}
        bad = [k for k in ("digest", "stored", "onnx", "checkpoint")
               if data[k] is not None and not _SHA.match(str(data[k]))]
        bad += [k for k in ("device", "platform", "toolchain") if not _ID.match(str(data[k]))]
        bad += [k for k in ("bytes", "files") if not isinstance(data[k], int) or data[k] < 0]
        if bad or data["digest"] is None:
            raise ConfigurationError(f"{where}: engine manifest with bad {', '.join(bad or ['digest'])}")
        return cls(**data)

    @property
    def path(self) -> str:
        """Where it is on its device, relative to the work dir."""
        return device_cache.entry(self.digest)


def load(farm: Farm, ref: ArtifactRef) -> DeviceEngine:
    where = f"engine manifest {ref.sha256[:12]}"
    try:
        data = json.loads(farm.store.read_bytes(ref.sha256))
    except ValueError:
        raise ConfigurationError(f"{where}: not JSON") from None
    return DeviceEngine.from_json(data, where=where)


def runtime_inputs(farm: Farm, engine: DeviceEngine) -> list[ArtifactRef]:
    """What a stage running ``engine`` stages besides it: the checkpoint it reads its weights from, if any."""
    if engine.checkpoint is None:
        return []
    return [farm.store.ref(engine.checkpoint, ArtifactKind.CHECKPOINT, Packing.TAR)]


def runtime_step(toolchain: ToolchainDriver, engine: DeviceEngine, step: DeviceStep) -> DeviceStep:
    """``step`` (a command running ``engine``) as the engine needs it: given its checkpoint (staged by
    :func:`runtime_inputs`) where it reads its weights from one."""
    if engine.checkpoint is None:
        return step
    return toolchain.device().with_checkpoint(step, device_cache.entry(engine.checkpoint))


def store(farm: Farm, engine: DeviceEngine) -> ArtifactRef:
    return farm.store.put(engine.to_json(), ArtifactKind.ENGINE_MANIFEST)


def holders(farm: Farm, engine: DeviceEngine) -> list[str] | None:
    """The devices a stage using ``engine`` may run on: its device, or any (None) when its bytes are stored."""
    return None if engine.stored is not None else [engine.device]


def present(transport: Transport, digest: str) -> bool:
    return transport.run(["sh", "-c", _PRESENT, "sh", digest], timeout=600).ok


def verified(device: Device, transport: Transport, digest: str) -> bool:
    """Whether ``cache/<digest>`` on ``device`` may be reused: present, and its files hashing (by the agent, now) to
    ``digest``, the tree digest the farm recorded when the engine was built (its :class:`DeviceEngine` manifest in
    the store; the board's seal and the engine's own manifest are files the board can rewrite, so neither is asked).
    An entry that fails is evicted, so the build misses and makes it again instead of every later run using it."""
    if not present(transport, digest):
        return False
    try:
        found = agent_client.run(device, transport, "hash", device_cache.entry(digest), "--within", "cache",
                                 timeout=device_cache.CHECK_TIMEOUT_S)
        now = str(found.get("sha256")) if found.get("kind") == "tree" else f"not a tree ({found.get('kind')})"
    except BugError as exc:  # the agent refused what is there (a link or special file planted in the entry)
        now = str(exc).splitlines()[0]
    if now == digest:
        return True
    log.warning("%s: engine cache/%s does not hash to the digest the farm recorded when it was built (now: %s): "
                "evicted, building it again", device.id, digest[:12], now[:200])
    device_cache.evict(transport, digest)
    return False


def locate(farm: Farm, device: Device, transport: Transport, engine: DeviceEngine) -> str:
    """The engine's path on ``device`` for a stage about to run there (marked in use by the run): its cache entry
    when the device holds it, else the stored copy staged from the store; an engine that is neither is an
    infrastructure failure naming where it was."""
    if device.id == engine.device and present(transport, engine.digest):
        mark_in_use(farm, transport, [engine.digest])
        return engine.path
    if engine.stored is not None:
        from edgefarm.tasks.device_exec import ensure_on_device

        ref = farm.store.ref(engine.stored, ArtifactKind.ENGINE, Packing.TAR)
        path = ensure_on_device(farm, transport, ref)
        mark_in_use(farm, transport, [ref.sha256])
        return path
    raise InfrastructureError(f"engine {engine.digest[:12]} is no longer in {engine.device}'s cache (and its bytes "
                              f"were not fetched: fetch_engines is off); it is built again on the next run")


def run_tag(farm: Farm) -> str:
    return f"run-{farm.ctx.run_id}"


def mark_in_use(farm: Farm, transport: Transport, shas: Iterable[str]) -> None:
    """Mark cache entries in use by this run (the agent's eviction leaves them) and touch them (last use)."""
    names = [s for s in shas if _SHA.match(s)]
    if names:
        transport.run(["sh", "-c", _MARK, "sh", run_tag(farm), *names], timeout=120)
        with farm.lock:
            farm.touched_devices.add(transport.device_id)


def release_run(farm: Farm, transport: Transport) -> None:
    """Remove this run's in-use markers from the device's cache (the run is over)."""
    transport.run(["sh", "-c", f"rm -f -- cache/.inuse/*.{shlex.quote(run_tag(farm))}"], timeout=120)


def make_room(farm: Farm, device: Device, transport: Transport, incoming: int) -> None:
    """Bring the device's cache down to its bound less ``incoming`` bytes, least recently used first (entries in
    use are never evicted). Raises when it cannot: ConfigurationError when ``incoming`` alone exceeds the bound,
    InfrastructureError when what is in use leaves no room (another device, or later, may)."""
    limit = device.cache_max_bytes
    if incoming > limit:
        raise ConfigurationError(f"{device.id}: {incoming / 2**30:.2f} GiB to stage exceeds its cache bound of "
                                 f"{limit / 2**30:.2f} GiB (cache_max_gb in its inventory file)")
    found = agent_client.run(device, transport, "cache", "evict", "--cache", "cache", "--max-bytes",
                      str(limit - incoming), no_ok=True)
    if not found.get("ok"):
        blocked = found.get("blocked") or []
        raise InfrastructureError(
            f"{device.id}: its cache holds {int(found.get('total_bytes') or 0) / 2**30:.2f} GiB, "
            f"{len(blocked)} entr{'y' if len(blocked) == 1 else 'ies'} in use, and cannot make "
            f"{incoming / 2**30:.2f} GiB of room under its {limit / 2**30:.2f} GiB bound")


@dataclass(frozen=True)
class Sealed:
    digest: str
    bytes: int
    files: int
    listing: list[dict[str, Any]]


def seal_built(farm: Farm, device: Device, transport: Transport, job_dir: str, rel: str = "engine") -> Sealed:
    """Hash and seal the engine a build left in ``<job_dir>/<rel>`` (one read of its files, by the agent) and move it
    into the cache as ``cache/<digest>``, marked in use by the run."""
    engine_dir, seal = f"{job_dir}/{rel}", f"{job_dir}/{rel}.sha256sums"
    found = agent_client.run(device, transport, "hash", engine_dir, "--within", job_dir, "--list", "--seal", seal,
                      timeout=device_cache.CHECK_TIMEOUT_S)
    digest = str(found.get("sha256"))
    if found.get("kind") != "tree" or not _SHA.match(digest):
        raise InfrastructureError(f"{device.id}: the agent's hash of {engine_dir} is not a tree digest: {found}")
    moved = transport.run(["sh", "-c", _PROMOTE, "sh", engine_dir, seal, digest], timeout=600)
    if not moved.ok:
        raise InfrastructureError(f"{device.id}: cannot move the engine into cache/{digest[:12]}: "
                                  f"{moved.stderr.strip()[:300]}")
    mark_in_use(farm, transport, [digest])
    return Sealed(digest, int(found.get("bytes") or 0), int(found.get("files") or 0), list(found.get("listing") or []))


def read_back(transport: Transport, sealed: Sealed, patterns: tuple[str, ...], dest: Path) -> Path:
    """Fetch the engine files matching ``patterns`` (globs over paths relative to the engine dir) into ``dest``,
    with ``ENGINE_LISTING`` beside them; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    files: dict[str, dict[str, Any]] = {}
    for item in sealed.listing:
        rel = str(item.get("path", "")).removeprefix("./")
        files[rel] = {"sha256": item.get("sha256"), "bytes": item.get("bytes")}
    for rel in sorted(files):
        if any(fnmatch.fnmatchcase(rel, pattern) for pattern in patterns):
            if rel.startswith("/") or ".." in rel.split("/"):
                raise RemoteNameError(f"{transport.device_id}: the engine lists an unsafe name {rel!r}")
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            transport.get(f"{device_cache.entry(sealed.digest)}/{rel}", target)
    (dest / ENGINE_LISTING).write_text(json.dumps({"digest": sealed.digest, "bytes": sealed.bytes,
                                                   "files": files}, indent=1, sort_keys=True))
    return dest
