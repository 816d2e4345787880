"""Runs INSIDE a tensorrt-edgellm environment (its own Python: ``<env>/bin/python model_probe.py``), never in the
farm's process: it imports the toolchain and nothing of the farm. ``bringup`` runs it and reads its JSON.

stdin: ``{"checkpoint": DIR, "mode": "registry" | "reconcile", "tensors": {name: {"dtype": "BF16", "shape": [..],
"file": "model.safetensors"}}}``; the tensors are the checkpoint's, read from its safetensors headers by the farm.
stdout, last line: one JSON object (below). Exit 0 whenever that object was written.

registry: which class the toolchain's own factory (``AutoModel.from_pretrained``) picks for the checkpoint, with
the model built on the meta device (no weight is allocated) and the weight loading stopped before it reads a tensor:
``{"version", "model_type", "registered": bool, "registry": [model types], "model_class", "default_class",
"stage": "ok" | "config" | "model", "error"}``. ``stage`` says where the toolchain refused it: reading the config
(a broken or foreign config.json) or choosing and building the model (a model it does not support).

reconcile: the same, then the toolchain's own loader (``load_weights``: its key-prefix detection, the key remap the
factory chose, its fused q/k/v and gate/up splits) is run over meta tensors of the checkpoint's names, dtypes and
shapes instead of the file's data. Every assignment is recorded and compared with the parameter or buffer it lands
on: ``{"parameters": {name: shape}, "assigned": [{"tensor", "target", "expected", "found"}], "dropped": [names
the toolchain's key remap skips], "unused": {name: mapped name} (no parameter takes it), "never_loaded": [persistent
parameters and buffers no tensor fills], "optional": [...of those the toolchain defaults itself], "tied": {name:
source}}``. The loader itself checks no shape (it assigns whatever it reads), hence the comparison here.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any


class _Stop(Exception):  # control flow: the factory reached weight loading
    def __init__(self, model: Any, key_remap: Any, key_prefix: Any, mapping: Any) -> None:
        super().__init__("stopped before loading weights")
        self.model, self.key_remap, self.key_prefix, self.mapping = model, key_remap, key_prefix, mapping


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:600]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _build(checkpoint: str) -> tuple[dict[str, Any], _Stop | None]:
    """The toolchain's factory up to weight loading: (facts, the captured model or None when it refused)."""
    import tensorrt_edgellm
    import tensorrt_edgellm._export_api  # registers the per-family classes, as the exporter does
    from tensorrt_edgellm import model as factory
    from tensorrt_edgellm.models.default.modeling_default import CausalLM

    facts: dict[str, Any] = {"version": tensorrt_edgellm.__version__, "registry": sorted(factory._MODEL_REGISTRY),
                             "default_class": _qualname(CausalLM), "model_type": None, "registered": False,
                             "model_class": None, "stage": "ok", "error": None}
    try:
        config = factory.load_model_config(checkpoint)
    except Exception as exc:  # the toolchain's own config reader refused it
        facts.update(stage="config", error=_error(exc))
        return facts, None
    facts["model_type"] = config.model_type
    facts["registered"] = config.model_type in factory._MODEL_REGISTRY

    def stop(model: Any, model_dir: str, device: str = "cpu", key_remap: Any = None, key_prefix: Any = None,
             pre_repack_hook: Any = None, mapping: Any = None) -> None:
        raise _Stop(model, key_remap, key_prefix, mapping)

    real = factory.load_weights
    factory.load_weights = stop
    try:
        factory.AutoModel.from_pretrained(checkpoint, device="cpu", low_cpu_mem_usage=True)
    except _Stop as captured:
        facts["model_class"] = _qualname(type(captured.model))
        facts["model_type"] = captured.model.config.model_type  # after the factory's own re-dispatch (``_moe``)
        facts["registered"] = facts["model_type"] in factory._MODEL_REGISTRY
        return facts, captured
    except Exception as exc:
        facts.update(stage="model", error=_error(exc))
        return facts, None
    finally:
        factory.load_weights = real
    facts.update(stage="model", error="the factory returned without loading weights")
    return facts, None


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
           "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
           "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu", "U16": "uint16", "U32": "uint32", "U64": "uint64"}


def _slot(model: Any, key: str, modules: dict[int, str], slots: dict[str, tuple[int, ...] | None],
          navigate: Any) -> tuple[str, list[int] | None]:
    """The model's own name of the slot the loader's key ``key`` reaches (its path may go through an indexing
    module: ``experts.0`` for ``experts._experts.0``) and the shape it declares: for a bias slot a linear keeps
    empty (filled when the checkpoint has one), its output width; None where the model declares nothing."""
    try:
        module, attr = navigate(model, key.split("."))
    except (AttributeError, IndexError, TypeError):
        return key, None
    prefix = modules.get(id(module))
    name = key if prefix is None else (f"{prefix}.{attr}" if prefix else attr)
    shape = slots.get(name)
    if shape is not None:
        return name, list(shape)
    width = getattr(module, "out_features", None)
    return name, [int(width)] if name in slots and attr == "bias" and isinstance(width, int) else None


def _reconcile(checkpoint: str, captured: _Stop, tensors: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import os

    import torch
    from tensorrt_edgellm.checkpoint import loader

    model = captured.model
    slots: dict[str, tuple[int, ...] | None] = {}  # every parameter/buffer slot, None where it is declared empty
    for prefix, module in model.named_modules():
        for table in (module._parameters, module._buffers):
            for attr, value in table.items():
                name = f"{prefix}.{attr}" if prefix else attr
                slots[name] = None if value is None else tuple(value.shape)
    persistent = set(model.state_dict(keep_vars=True))
    modules: dict[int, str] = {}  # module -> its first name, the one ``slots`` uses
    for prefix, module in model.named_modules(remove_duplicate=False):
        modules.setdefault(id(module), prefix)
    root = os.path.realpath(checkpoint)
    by_file: dict[str, list[str]] = {}
    for name, info in tensors.items():
        by_file.setdefault(os.path.join(root, info["file"]), []).append(name)
    current: list[str] = [""]
    assigned: list[dict[str, Any]] = []
    mapped_of: dict[str, str | None] = {}  # tensor -> its name after the toolchain's prefix handling and remap

    class _Headers:  # stands in for safetensors' safe_open: names from the farm's header read, meta tensors
        def __init__(self, path: str, framework: str = "pt", device: str = "cpu") -> None:
            self.names = by_file.get(os.path.realpath(path), [])

        def __enter__(self) -> _Headers:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def keys(self) -> list[str]:
            return list(self.names)

        def get_tensor(self, name: str) -> Any:
            current[0] = name
            info = tensors[name]
            dtype = getattr(torch, _DTYPES.get(info["dtype"], "float32"), torch.float32)
            return torch.empty(info["shape"], dtype=dtype, device="meta")

    real_set = loader._set_tensor

    def recording_set(target_model: Any, key: str, tensor: Any, *, mapping: Any = None) -> bool:
        done = real_set(target_model, key, tensor, mapping=mapping)
        if done:
            target, expected = _slot(model, key, modules, slots, loader._navigate)
            assigned.append({"tensor": current[0], "target": target, "expected": expected,
                             "found": list(tensor.shape)})
        return done

    remap = captured.key_remap

    def recording_remap(key: str) -> str | None:
        mapped = remap(key) if remap is not None else key
        mapped_of[current[0]] = mapped
        return mapped

    saved = (loader.safe_open, loader._set_tensor, loader.apply_all_repacking)
    loader.safe_open, loader._set_tensor = _Headers, recording_set
    loader.apply_all_repacking = lambda _model: None  # repacking rewrites loaded data: nothing to check here
    try:
        loader.load_weights(model, checkpoint, device="cpu", key_remap=recording_remap,
                            key_prefix=captured.key_prefix, mapping=captured.mapping)
    finally:
        loader.safe_open, loader._set_tensor, loader.apply_all_repacking = saved
    taken = {a["tensor"] for a in assigned}
    dropped = sorted(n for n in tensors if n not in taken and mapped_of.get(n) is None)  # skipped by prefix or remap
    unused = {n: mapped_of[n] for n in sorted(tensors) if n not in taken and mapped_of.get(n) is not None}
    filled = {a["target"] for a in assigned}
    config = model.config
    tied: dict[str, str] = {}
    lm_head = getattr(model, "lm_head", None)
    from tensorrt_edgellm.models.linear import FP16Linear

    if getattr(config, "tie_word_embeddings", False) and isinstance(lm_head, FP16Linear) \
            and hasattr(model, "tie_weights"):
        tied["lm_head.weight"] = "model.embed_tokens.weight"
    from tensorrt_edgellm import model as factory

    optional_leaves = set(getattr(factory, "_OPTIONAL_SCALE_DEFAULT_BUFFERS", ()))
    never_loaded, optional = [], []
    for name, shape in sorted(slots.items()):
        if shape is None or name in filled or name in tied or name not in persistent:
            continue
        (optional if name.rsplit(".", 1)[-1] in optional_leaves else never_loaded).append(name)
    return {"parameters": {n: list(s) for n, s in sorted(slots.items()) if s is not None and n in persistent},
            "assigned": assigned,
            "dropped": dropped, "unused": unused, "never_loaded": never_loaded, "optional": optional,
            "tied": tied}


def main() -> int:
    request = json.loads(sys.stdin.read())
    facts, captured = _build(request["checkpoint"])
    if request["mode"] == "reconcile" and captured is not None:
        facts["reconcile"] = _reconcile(request["checkpoint"], captured, request["tensors"])
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # a failure of this probe itself: the farm reports the traceback's last line
        traceback.print_exc()
        sys.exit(4)
