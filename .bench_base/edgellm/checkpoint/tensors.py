"""Every tensor of a checkpoint directory, from its safetensors headers and index only: no config, no family.

``read_tensor_files`` is the family-free half of ``Checkpoint.open``; ``edgellm inspect`` uses it alone for a
checkpoint of a model_type no family registers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgellm.checkpoint.header import SafetensorsHeader, TensorInfo, scan_header
from edgellm.checkpoint.index import INDEX_FILE, SINGLE_FILE, ShardIndex, check_index, merge_shards, read_index
from edgellm.errors import CheckpointError


@dataclass
class TensorFiles:
    headers: dict[str, SafetensorsHeader | None]  # shard file name -> header (None: unusable)
    tensors: dict[str, TensorInfo]
    index: ShardIndex | None
    problems: list[CheckpointError] = field(default_factory=list)
    # names a header or the index gives but whose entry or shard is unusable (already reported; not "missing")
    unknown: set[str] = field(default_factory=set)
    unreadable: bool = False  # a shard could not be read at all
    stamps: dict[str, tuple[int, int]] = field(default_factory=dict)  # shard -> (size, mtime_ns) when validated
    # every tensor name a header or the index gives, usable or not (the layers a checkpoint claims to hold)
    named: set[str] = field(default_factory=set)


def read_tensor_files(root: Path) -> TensorFiles:
    """Read every safetensors header (and the index of a sharded checkpoint), collecting every problem.
    Raises ``CheckpointError`` only when there is no safetensors weight file at all."""
    index: ShardIndex | None = None
    problems: list[CheckpointError] = []
    if (root / INDEX_FILE).is_file():
        index = read_index(root)
        problems.extend(index.problems)
        shard_names = index.shards
    elif (root / SINGLE_FILE).is_file():
        shard_names = [SINGLE_FILE]
    else:
        others = sorted(p.name for p in root.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".gguf"))
        hint = f" (found {', '.join(others)}: only safetensors is supported)" if others else ""
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE}{hint}", file=str(root))
    headers: dict[str, SafetensorsHeader | None] = {}
    stamps: dict[str, tuple[int, int]] = {}
    rejected: set[str] = set()  # tensors a header names but whose entry broke a rule (already reported)
    for shard in shard_names:
        path = root / shard
        if index is not None and not path.is_file():
            continue  # reported by check_index with the tensors it should hold
        scan = scan_header(path, name=shard)
        headers[shard] = scan.header
        problems.extend(scan.problems)
        rejected |= {p.tensor for p in scan.problems if p.tensor}
        if scan.header is not None:
            st = path.stat()
            stamps[shard] = (st.st_size, st.st_mtime_ns)
    if index is not None:
        problems.extend(check_index(root, index, headers))
    tensors, dup_problems = merge_shards(headers)
    problems.extend(dup_problems)
    # Tensors of an unreadable or absent shard, or with a rejected header entry, are already reported:
    # not "missing" too.
    unreadable = {s for s in shard_names if headers.get(s) is None}
    unknown = rejected - set(tensors)
    if index is not None:
        unknown |= {n for n, s in index.weight_map.items() if s in unreadable}
    named = set(tensors) | rejected | (set(index.weight_map) if index is not None else set())
    return TensorFiles(headers=headers, tensors=tensors, index=index, problems=problems, unknown=unknown,
                       unreadable=bool(unreadable), stamps=stamps, named=named)
