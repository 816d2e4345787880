"""Sharded checkpoints: ``model.safetensors.index.json`` and its consistency with the shards' headers.

Rules: shard names are plain file names inside the checkpoint directory (no ``../x``, no absolute paths); every
shard the index names exists; every tensor it maps is in that shard; no tensor is in two shards; tensors in
shards but absent from the index are reported, and so are ``*.safetensors`` files the index never names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.checkpoint.header import SafetensorsHeader, TensorInfo
from edgellm.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_INDEX_BYTES = 64 * 1024 * 1024


@dataclass
class ShardIndex:
    weight_map: dict[str, str]  # tensor name -> shard file name
    metadata: dict[str, Any] = field(default_factory=dict)
    problems: list[CheckpointError] = field(default_factory=list)

    @property
    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def plain_file_name_problem(name: str) -> str | None:
    """Why ``name`` is not a plain ``*.safetensors`` file name inside the checkpoint dir, or None if it is."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name or name.startswith("~"):
        return f"shard name {name!r} is not a plain file name inside the checkpoint directory (path traversal?)"
    if not name.endswith(".safetensors"):
        return f"shard name {name!r} does not end in .safetensors"
    return None


def read_index(ckpt_dir: Path) -> ShardIndex:
    """Parse the index, collecting problems (a broken file yields an empty map and one problem)."""
    path = Path(ckpt_dir) / INDEX_FILE
    index = ShardIndex(weight_map={})

    def bad(msg: str, tensor: str | None = None) -> ShardIndex:
        index.problems.append(CheckpointError(msg, file=INDEX_FILE, tensor=tensor))
        return index

    size = path.stat().st_size
    if size > MAX_INDEX_BYTES:
        return bad(f"index is {size} bytes, over the {MAX_INDEX_BYTES}-byte limit")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"), object_pairs_hook=_pairs)
    except (ValueError, RecursionError) as exc:
        return bad(f"index is not valid UTF-8 JSON ({' '.join(str(exc).split())[:200]})")
    if not isinstance(data, dict):
        return bad(f"index must be a JSON object, got {type(data).__name__}")
    meta = data.get("metadata", {})
    index.metadata = meta if isinstance(meta, dict) else {}
    for key, _, _ in data.duplicates:
        bad(f"duplicate key {key!r} in the index")
    wm = data.get("weight_map")
    if not isinstance(wm, dict):
        return bad("index lacks a 'weight_map' object (tensor name -> shard file)")
    for name, first, second in wm.duplicates:
        bad(f"tensor mapped twice in weight_map (to {first!r} and {second!r})", name)
    for name, shard in wm.items():
        if not isinstance(shard, str):
            bad(f"weight_map value {shard!r} must be a shard file name", name)
            continue
        why = plain_file_name_problem(shard)
        if why:
            bad(why, name)
            continue
        index.weight_map[name] = shard
    return index


class _Object(dict):  # type: ignore[type-arg]
    """A JSON object that remembers duplicate keys as (key, first value, later value)."""

    def __init__(self) -> None:
        super().__init__()
        self.duplicates: list[tuple[str, Any, Any]] = []


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    for key, value in pairs:
        if key in obj:
            obj.duplicates.append((key, obj[key], value))
            continue
        obj[key] = value
    return obj


def check_index(
    ckpt_dir: Path, index: ShardIndex, headers: dict[str, SafetensorsHeader | None]
) -> list[CheckpointError]:
    """Cross-check the index against the shards' headers (``None`` for a shard whose header was unusable)."""
    problems: list[CheckpointError] = []
    for shard in index.shards:
        if not (Path(ckpt_dir) / shard).is_file():
            n = sum(1 for s in index.weight_map.values() if s == shard)
            problems.append(CheckpointError(f"shard named by {INDEX_FILE} for {n} tensor(s) does not exist",
                                            file=shard))
    for name, shard in sorted(index.weight_map.items()):
        header = headers.get(shard)
        if header is not None and name not in header.tensors:
            problems.append(CheckpointError(f"{INDEX_FILE} maps this tensor to {shard!r}, which does not contain it",
                                            file=shard, tensor=name))
    for shard, header in sorted(headers.items()):
        if header is None:
            continue
        for name in sorted(header.tensors):
            if name not in index.weight_map:
                problems.append(CheckpointError(f"tensor is in the shard but absent from {INDEX_FILE}",
                                                file=shard, tensor=name))
    named = set(index.shards)
    for path in sorted(Path(ckpt_dir).glob("*.safetensors")):
        if path.name not in named:
            problems.append(CheckpointError(f"safetensors file is not named by {INDEX_FILE} (stale shard?)",
                                            file=path.name))
    return problems


def merge_shards(headers: dict[str, SafetensorsHeader | None]) -> tuple[dict[str, TensorInfo], list[CheckpointError]]:
    """All tensors of all shards by name; a tensor stored in two shards is a problem."""
    tensors: dict[str, TensorInfo] = {}
    owner: dict[str, str] = {}
    problems: list[CheckpointError] = []
    for shard, header in sorted(headers.items()):
        if header is None:
            continue
        for name, info in header.tensors.items():
            if name in owner:
                problems.append(CheckpointError(f"tensor is stored in two shards ({owner[name]!r} and {shard!r})",
                                                file=shard, tensor=name))
                continue
            owner[name] = shard
            tensors[name] = info
    return tensors, problems
