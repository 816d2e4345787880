"""The inventory: a JSON-able summary of a checkpoint (config, family, dtypes, counts, name patterns, shards,
reconciliation, quantization, problems). This is the contract ``edgellm inspect --output`` writes."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from edgellm import files
from edgellm.checkpoint.checkpoint import Checkpoint
from edgellm.checkpoint.header import SafetensorsHeader, TensorInfo
from edgellm.checkpoint.modelopt import QuantLayout
from edgellm.checkpoint.tensors import TensorFiles
from edgellm.config import ModelConfig, QuantConfig

SCHEMA = "edgellm.inventory/2"  # 2: findings, config_json; family and reconciliation null without a family
_NUMERIC_SEGMENT = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def collapse_ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0..2,5,7..8"``."""
    parts: list[str] = []
    items = sorted(set(indices))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}..{items[j]}")
        i = j + 1
    return ",".join(parts)


def name_patterns(tensors: dict[str, TensorInfo]) -> list[dict[str, Any]]:
    """Group tensor names whose numeric path segments differ: ``model.layers.{0..N}.self_attn.q_proj.weight``."""
    groups: dict[str, list[tuple[list[int], TensorInfo]]] = defaultdict(list)
    for name, info in tensors.items():
        nums = [int(m) for m in _NUMERIC_SEGMENT.findall(name)]
        groups[_NUMERIC_SEGMENT.sub("{}", name)].append((nums, info))
    out = []
    for template, members in sorted(groups.items()):
        slots = template.count("{}")
        pieces = template.split("{}")
        pattern = pieces[0]
        for k in range(slots):
            pattern += "{" + collapse_ranges(m[0][k] for m in members) + "}" + pieces[k + 1]
        out.append({
            "pattern": pattern,
            "count": len(members),
            "dtypes": sorted({i.dtype for _, i in members}),
            "shapes": [list(s) for s in sorted({i.shape for _, i in members})],
            "parameters": sum(i.numel for _, i in members),
        })
    return out


def quant_summary(quant: QuantConfig) -> dict[str, Any]:
    return {
        "method": quant.method.value,
        "is_quantized": quant.is_quantized,
        "source": quant.source,
        "group_size": quant.group_size,
        "kv_cache": quant.kv_cache,
        "exclude_modules": list(quant.exclude_modules),
        "producer": quant.producer,
    }


def layer_table(layout: QuantLayout) -> list[dict[str, Any]]:
    """Linear layers grouped by name pattern and stored precision: ``model.layers.{0..4}.self_attn.q_proj``."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for module, lin in layout.linears.items():
        nums = [int(m) for m in _NUMERIC_SEGMENT.findall(module + ".")]
        groups[(_NUMERIC_SEGMENT.sub("{}", module + ".").removesuffix("."), lin.precision.value)].append(
            nums[0] if nums else -1)
    rows = []
    for (template, precision), layers in sorted(groups.items()):
        name = template.replace("{}", "{" + collapse_ranges(layers) + "}", 1) if "{}" in template else template
        rows.append({"module": name, "precision": precision, "count": len(layers)})
    return rows


def tensor_summary(tensors: dict[str, TensorInfo], headers: dict[str, SafetensorsHeader | None],
                   sharded: bool) -> dict[str, Any]:
    """What the headers alone say: dtypes, sizes, shards and name patterns (no family needed)."""
    dtypes: dict[str, dict[str, int]] = {}
    for info in tensors.values():
        d = dtypes.setdefault(info.dtype, {"tensors": 0, "parameters": 0, "bytes": 0})
        d["tensors"] += 1
        d["parameters"] += info.numel
        d["bytes"] += info.nbytes
    shards = []
    for name, header in sorted(headers.items()):
        shards.append({
            "file": name,
            "readable": header is not None,
            "tensors": len(header.tensors) if header else 0,
            "header_bytes": header.header_bytes if header else None,
            "file_bytes": header.file_size if header else None,
        })
    return {
        "tensor_count": len(tensors),
        "stored_parameters": sum(t.numel for t in tensors.values()),
        "bytes": sum(t.nbytes for t in tensors.values()),
        "dtypes": dict(sorted(dtypes.items())),
        "sharded": sharded,
        "shards": shards,
        "patterns": name_patterns(tensors),
    }


def build_inventory(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "checkpoint": str(ckpt.root),
        "ok": ckpt.ok,
        "problems": [str(p) for p in ckpt.problems],
        "findings": [],  # a config field the family does not implement is a problem (edgellm.models.contract)
        "config": ckpt.config.summary(),
        "config_json": ckpt.config.raw,
        "family": ckpt.family.name,
        "quantization": quant_summary(ckpt.quant) | _layout_summary(ckpt.reconciliation.quant_layout),
        "parameters": ckpt.parameter_count,
        **tensor_summary(ckpt.tensors, ckpt.headers, ckpt.index is not None),
        "reconciliation": ckpt.reconciliation.to_json(),
    }


def family_free_inventory(root: Path, raw: dict[str, Any], files: TensorFiles, quant: QuantConfig,
                          config: ModelConfig | None, findings: list[dict[str, str]],
                          problems: list[str]) -> dict[str, Any]:
    """The inventory of a checkpoint no registered family takes: everything but reconciliation (``family`` and
    ``reconciliation`` null; ``parameters`` counts every stored element, as no family says which are used)."""
    every = problems + [str(p) for p in files.problems]
    return {
        "schema": SCHEMA,
        "checkpoint": str(root),
        "ok": not every,
        "problems": every,
        "findings": findings,
        "config": config.summary() if config is not None else None,
        "config_json": raw,
        "family": None,
        "quantization": quant_summary(quant),
        "parameters": sum(t.numel for t in files.tensors.values()),
        **tensor_summary(files.tensors, files.headers, files.index is not None),
        "reconciliation": None,
    }


def _layout_summary(layout: QuantLayout | None) -> dict[str, Any]:
    if layout is None:
        return {}
    return {"layout": layout.to_json(), "layer_table": layer_table(layout)}


def failed_inventory(ckpt_dir: Path, problem: str) -> dict[str, Any]:
    """The inventory of a checkpoint whose config, family or quantization could not be read."""
    return {"schema": SCHEMA, "checkpoint": str(ckpt_dir), "ok": False, "problems": [problem], "findings": [],
            "config": None, "config_json": None, "family": None, "quantization": None}


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` whole or not at all, never through a planted link (edgellm.files)."""
    files.write_json_atomic(Path(path), data)
