"""``Checkpoint.open(dir)``: config, family, every tensor's location and every problem, from headers only (and a
quantized checkpoint's scales, whose values edgellm.checkpoint.modelopt checks).

Other tensor data is read only by ``load_tensor``, and only after ``validate()`` found no problem (and the file has not
changed since its header was checked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from edgellm.checkpoint.header import SafetensorsHeader, TensorInfo
from edgellm.checkpoint.index import ShardIndex
from edgellm.checkpoint.reconcile import Reconciliation, reconcile
from edgellm.checkpoint.tensors import read_tensor_files
from edgellm.config import ModelConfig, QuantConfig
from edgellm.errors import CheckpointError
from edgellm.models.base import LAYER_PREFIX, ModelFamily, family_for, layers_held

if TYPE_CHECKING:
    import torch


@dataclass
class Checkpoint:
    root: Path
    config: ModelConfig
    family: type[ModelFamily]
    quant: QuantConfig
    headers: dict[str, SafetensorsHeader | None]  # shard file name -> header (None: unusable)
    tensors: dict[str, TensorInfo]
    index: ShardIndex | None
    reconciliation: Reconciliation
    problems: list[CheckpointError] = field(default_factory=list)
    _stamps: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, ckpt_dir: Path | str) -> Checkpoint:
        """Read config, family and quantization (raising on the first of those that is broken), then every
        safetensors header and the index, collecting all problems in ``.problems``."""
        root = Path(ckpt_dir)
        if not root.is_dir():
            raise CheckpointError("checkpoint directory not found", file=str(root))
        config = ModelConfig.load(root)
        family = family_for(config)
        quant = QuantConfig.load(root, config.raw)
        files = read_tensor_files(root)
        problems = list(files.problems)
        # the config's layer count against the layers the tensors' names hold, before anything is built per layer
        # from the config (num_hidden_layers 1000000 would otherwise take minutes and gigabytes to reconcile)
        too_many = _layers_problem(config, files.named)
        if too_many is not None:
            problems.append(too_many)
            rec = Reconciliation(family=family.name)
        elif files.index is None and files.unreadable:
            rec = Reconciliation(family=family.name, expected=len(family.expected_parameters(config)))
        else:
            rec = reconcile(files.tensors, family, config, quant, unknown=files.unknown)
        problems.extend(rec.problems)
        return cls(root=root, config=config, family=family, quant=quant, headers=files.headers,
                   tensors=files.tensors, index=files.index, reconciliation=rec, problems=problems,
                   _stamps=files.stamps)

    @property
    def ok(self) -> bool:
        return not self.problems

    def validate(self) -> None:
        """Raise one ``CheckpointError`` summarising the problems (the first named, the rest counted)."""
        if self.problems:
            first = self.problems[0]
            more = f" (and {len(self.problems) - 1} more problem(s))" if len(self.problems) > 1 else ""
            raise CheckpointError(f"{first}{more}", file=str(self.root))

    def load_tensor(self, name: str) -> torch.Tensor:
        """Load one tensor with the safetensors library, only from a checkpoint that validated clean."""
        from safetensors import safe_open

        self.validate()
        info = self.tensors.get(name)
        if info is None:
            raise CheckpointError("no such tensor in the checkpoint", file=str(self.root), tensor=name)
        shard = info.file.name
        st = os.stat(info.file)
        if (st.st_size, st.st_mtime_ns) != self._stamps.get(shard):
            raise CheckpointError("file changed since its header was validated; open the checkpoint again",
                                  file=shard, tensor=name)
        with safe_open(str(info.file), framework="pt") as f:
            return f.get_tensor(name)

    @property
    def parameter_count(self) -> int:
        """Elements of the parameters the family uses (tied aliases and ignored buffers not counted)."""
        return sum(self.tensors[n].numel for n in self.reconciliation.matched)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def _layers_problem(config: ModelConfig, names: set[str]) -> CheckpointError | None:
    """config.json asking for more decoder layers than the checkpoint's tensor names hold (fewer: the surplus
    tensors are reported by reconciliation, one by one)."""
    held = layers_held(names)
    top = max(held, default=-1)
    if config.num_hidden_layers <= top + 1:
        return None
    holds = f"{len(held)} layers ({min(held)}..{top})" if held else f"no {LAYER_PREFIX}* tensor"
    return CheckpointError(f"num_hidden_layers {config.num_hidden_layers} disagrees with the tensors: they hold "
                           f"{holds}; fix num_hidden_layers or the shards", file="config.json")
