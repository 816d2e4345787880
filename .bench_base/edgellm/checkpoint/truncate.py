"""``truncate_checkpoint``: a checkpoint cut to its first N decoder layers, for few-layer numeric tests.

The copy keeps every tensor outside the decoder layers (embedding, final norm, lm_head) and those of layers 0..N-1,
byte for byte; config.json says ``num_hidden_layers: N`` (per-layer lists such as ``layer_types`` cut to N); the
files the exporter copies for the runtime (tokenizer, generation config, ...) and hf_quant_config.json are copied.
The source must validate clean (``Checkpoint.validate``) and so must the result: its family needs what it holds.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from edgellm.checkpoint.checkpoint import Checkpoint
from edgellm.checkpoint.index import SINGLE_FILE
from edgellm.compiler.export import RUNTIME_FILES
from edgellm.errors import ConfigurationError

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# what the exporter copies for the runtime, and the quantization block
SIDE_FILES = (*(n for n in RUNTIME_FILES if n != "config.json"), "hf_quant_config.json")


def layer_of(tensor: str) -> int | None:
    """The decoder layer a tensor belongs to (``model.layers.3.mlp.up_proj.weight`` -> 3), or None."""
    m = _LAYER.search(tensor)
    return int(m.group(1)) if m else None


def truncate_checkpoint(src: Path | str, dest: Path | str, layers: int) -> dict[str, Any]:
    """Write ``src`` cut to its first ``layers`` decoder layers into ``dest`` (a new directory); returns what was
    kept and dropped (tensor counts, parameters)."""
    from safetensors.torch import save_file

    src, dest = Path(src), Path(dest)
    ckpt = Checkpoint.open(src)
    ckpt.validate()
    total = ckpt.config.num_hidden_layers
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= total:
        raise ConfigurationError(f"--layers {layers!r}: checkpoint {src} has {total} decoder layers; valid: 1..{total}")
    if dest.exists():
        raise ConfigurationError(f"{dest}: already exists (the truncated checkpoint is written to a new directory)")
    keep = sorted(n for n in ckpt.tensors if (layer_of(n) is None or layer_of(n) < layers))  # type: ignore[operator]
    dest.mkdir(parents=True)
    save_file({n: ckpt.load_tensor(n).contiguous() for n in keep}, str(dest / SINGLE_FILE), metadata={"format": "pt"})
    config = dict(ckpt.config.raw)
    config["num_hidden_layers"] = layers
    for key, value in list(config.items()):
        if isinstance(value, list) and len(value) == total and key != "architectures":
            config[key] = value[:layers]  # per-layer settings (layer_types, ...)
    if isinstance(config.get("max_window_layers"), int):
        config["max_window_layers"] = min(config["max_window_layers"], layers)
    (dest / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dest / name)
    Checkpoint.open(dest).validate()
    dropped = [n for n in ckpt.tensors if n not in set(keep)]
    return {"path": str(dest), "layers": layers, "of_layers": total, "tensors": len(keep), "dropped_tensors":
            len(dropped), "parameters": sum(ckpt.tensors[n].numel for n in keep)}
