"""Read a checkpoint's safetensors into a ``{hf_name: tensor}`` dict, checked against the family's expectations.

Handles a single ``model.safetensors`` or a sharded checkpoint with ``model.safetensors.index.json``. Every
missing, mis-shaped or unexpected tensor is named (all of them, in one error); tensors a family ignores on
purpose (e.g. rotary ``inv_freq`` buffers) and tied aliases are dropped.
"""

from __future__ import annotations

from pathlib import Path

import torch

from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import CheckpointError
from edgellm.models.base import ModelFamily

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(ckpt_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in a stable order."""
    ckpt_dir = Path(ckpt_dir)
    index = ckpt_dir / INDEX_FILE
    if index.exists():
        data = read_json_object(index, what="safetensors index", max_bytes=64 * 1024 * 1024)
        wmap = data.get("weight_map")
        if not isinstance(wmap, dict) or not all(isinstance(v, str) for v in wmap.values()):
            raise CheckpointError("'weight_map' must be an object of tensor name -> file name", file=str(index))
        files = sorted(set(wmap.values()))
        for name in files:
            if "/" in name or "\\" in name or name.startswith("."):
                raise CheckpointError(f"shard name {name!r} must be a plain file name", file=str(index))
            if not (ckpt_dir / name).is_file():
                raise CheckpointError(f"shard {name!r} listed in the index is missing", file=str(index))
        return [ckpt_dir / f for f in files]
    single = ckpt_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} found", file=str(ckpt_dir))


def load_weights(ckpt_dir: Path, family: type[ModelFamily], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """All parameters the family needs, as stored (dtype unchanged). Raises CheckpointError listing every problem."""
    from safetensors import SafetensorError, safe_open

    expected = family.expected_parameters(cfg)
    tied = family.tied_parameters(cfg)
    found: dict[str, torch.Tensor] = {}
    problems: list[str] = []
    for path in weight_files(ckpt_dir):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    if name in expected:
                        if name in found:
                            problems.append(f"tensor {name!r} appears in more than one file (again in {path.name})")
                        found[name] = f.get_tensor(name)
                    elif name in tied or any(rule.matches(name) for rule in family.ignore_rules):
                        continue
                    else:
                        problems.append(f"unexpected tensor {name!r} in {path.name}")
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read safetensors file ({exc})", file=str(path)) from None
    for name, shape in expected.items():
        t = found.get(name)
        if t is None:
            problems.append(f"missing tensor {name!r} (expected shape {list(shape)})")
        elif tuple(t.shape) != shape:
            problems.append(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        elif not t.is_floating_point():
            problems.append(f"tensor {name!r} has dtype {t.dtype}, expected a floating-point dtype")
    if problems:
        raise CheckpointError(f"{family.name} checkpoint does not match its config: " + "; ".join(problems),
                              file=str(ckpt_dir))
    return found
