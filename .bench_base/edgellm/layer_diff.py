"""Where an engine leaves the reference: the hidden state after every decoder layer (and after its attention),
taken from the engine itself and from transformers on the same token ids, compared layer by layer.

Engine side (ONNX Runtime engines): a debug copy of the engine's own ``model.onnx`` (its weights shared through
links, the engine directory untouched) whose residual stream is made graph outputs. The residual sums are found by
the norm that consumes them, named by the checkpoint's tensors: layer i's MLP input norm (the family's
``mlp_input_norm``: ``model.layers.i.post_attention_layernorm.weight``, or ``pre_feedforward_layernorm`` with sandwich
norms) reads the sum after layer i's attention; ``model.layers.{i+1}.input_layernorm.weight`` (``model.norm.weight``
for the last layer) the sum after its MLP, i.e. the layer's output. A fused ``SkipSimplifiedLayerNormalization``
carries the sum as its fourth output, a plain ``SimplifiedLayerNormalization`` reads it as its first input. Where no
norm carries a checkpoint name (a (1 + w) norm exports its scale as a folded constant), the residual stream is
followed as the chain of its adds from the first norm's input (the embeddings): each layer adds twice (attention,
then MLP).
Reference side: transformers' forward hooks, the input of the family's MLP input norm (after attention) and the
output of the decoder layer (after the MLP). Both run one sequence at a time from an empty cache.
Torch-cuda engines (and a board's TensorRT engines) expose no intermediate tensors here: ``engine_layer_states``
refuses them with that reason (UnsupportedError), and ``edgellm layers-check``'s few-layer engines are the fallback.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.errors import UnsupportedError

PARTS = ("attention", "mlp")
_INPUT_NORM = re.compile(r"^model\.layers\.(\d+)\.input_layernorm\.weight$")
FINAL_NORM = "model.norm.weight"
NORM_OPS = ("SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization")
DEFAULT_MLP_NORM = "post_attention_layernorm"  # a model_type no family registers: the Llama layout

Key = tuple[int, str]  # (layer, part)


def mlp_input_norm(model_type: object) -> str:
    """The norm reading the residual after attention, as the registered family of ``model_type`` declares it."""
    from edgellm.models.base import FAMILIES, is_registered_model_type

    return FAMILIES.get(model_type).mlp_input_norm() if is_registered_model_type(model_type) else DEFAULT_MLP_NORM


def residual_tensors(graph: Any, num_layers: int, mlp_norm: str = DEFAULT_MLP_NORM) -> dict[Key, str]:
    """(layer, part) -> the name of the graph tensor holding the residual stream there (see the module doc)."""
    return _by_norm_names(graph, num_layers, mlp_norm) or _by_residual_adds(graph, num_layers)


def _by_norm_names(graph: Any, num_layers: int, mlp_norm: str) -> dict[Key, str]:
    after_attention = re.compile(rf"^model\.layers\.(\d+)\.{re.escape(mlp_norm)}\.weight$")
    found: dict[Key, str] = {}
    for node in graph.node:
        if node.op_type not in NORM_OPS:
            continue
        weight = node.input[2] if node.op_type.startswith("Skip") else node.input[1]
        if node.op_type.startswith("Skip"):
            tensor = node.output[3] if len(node.output) > 3 and node.output[3] else None
        else:
            tensor = node.input[0]
        if tensor is None:
            continue
        if (m := after_attention.match(weight)) is not None:
            found[(int(m.group(1)), "attention")] = tensor
        elif (m := _INPUT_NORM.match(weight)) is not None and int(m.group(1)) > 0:
            found[(int(m.group(1)) - 1, "mlp")] = tensor
        elif weight == FINAL_NORM:
            found[(num_layers - 1, "mlp")] = tensor
    return found


def _by_residual_adds(graph: Any, num_layers: int) -> dict[Key, str]:
    """The residual stream as the chain of its adds: from the first norm's input (the embeddings), each step the one
    ``Add`` (or fused skip norm's sum) that reads the last; the k-th sum is layer k // 2's, after attention for even
    k, after the MLP for odd k. Stops where a sum is read by no add, or by several (not a chain)."""
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    first = next((n for n in graph.node if n.op_type in NORM_OPS), None)
    if first is None:
        return {}
    current, found = first.input[0], {}
    for k in range(2 * num_layers):
        adds = [n for n in consumers[current] if n.op_type == "Add"
                or (n.op_type == NORM_OPS[0] and current in n.input[:2])]
        if len(adds) != 1:
            break
        node = adds[0]
        current = node.output[0] if node.op_type == "Add" else (node.output[3] if len(node.output) > 3 else "")
        if not current:
            break
        found[(k // 2, PARTS[k % 2])] = current
    return found


@dataclass
class DebugSession:
    """An ONNX Runtime session of an engine's graph with its residual stream as extra outputs."""

    sess: Any
    outputs: dict[Key, str]
    kv_inputs: list[tuple[str, list[int], Any]]  # past inputs: name, shape with past 0, numpy dtype

    @classmethod
    def open(cls, engine_dir: Path, num_layers: int) -> DebugSession:
        import onnx
        import onnxruntime as ort

        model_path = Path(engine_dir) / "model.onnx"
        if not model_path.is_file():
            raise UnsupportedError(f"{engine_dir}: no model.onnx; per-layer hidden states are taken from ONNX Runtime "
                                   f"engines only (use `edgellm layers-check` for few-layer engines)")
        model = onnx.load(str(model_path), load_external_data=False)
        config = Path(engine_dir) / "config.json"
        model_type = json.loads(config.read_text()).get("model_type") if config.is_file() else None
        outputs = residual_tensors(model.graph, num_layers, mlp_input_norm(model_type))
        if not outputs:
            raise UnsupportedError(f"{engine_dir}: no residual stream found in model.onnx (no norm named after the "
                                   f"checkpoint's tensors, no chain of residual adds): per-layer states unavailable")
        known = {o.name for o in model.graph.output}
        for name in outputs.values():
            if name not in known:
                model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                known.add(name)
        dtypes = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}
        kv = []
        for i in model.graph.input:
            if i.name.startswith("past_key_values."):
                dims = [d.dim_value if d.HasField("dim_value") else 0 for d in i.type.tensor_type.shape.dim]
                kv.append((i.name, [1, dims[1], 0, dims[3]], dtypes.get(i.type.tensor_type.elem_type, np.float32)))
        with tempfile.TemporaryDirectory(prefix="edgellm-layer-diff-") as tmp:
            for f in Path(engine_dir).iterdir():  # the weights beside the model: ORT refuses links out of its dir
                if f.is_file() and f.name != "model.onnx":
                    try:
                        os.link(f, Path(tmp) / f.name)
                    except OSError:  # another filesystem
                        shutil.copyfile(f, Path(tmp) / f.name)
            onnx.save_model(model, str(Path(tmp) / "model.onnx"))
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # built already: run as is
            so.intra_op_num_threads = 1
            sess = ort.InferenceSession(str(Path(tmp) / "model.onnx"), so, providers=["CPUExecutionProvider"])
        return cls(sess, outputs, kv)

    def states(self, ids: list[int]) -> dict[Key, np.ndarray]:
        """float32 [S, hidden] per (layer, part) for one sequence."""
        s = len(ids)
        feeds: dict[str, np.ndarray] = {
            "input_ids": np.asarray([ids], dtype=np.int64),
            "attention_mask": np.ones((1, s), dtype=np.int64),
            "position_ids": np.arange(s, dtype=np.int64)[None],
            "logits_positions": np.arange(s, dtype=np.int64),
        }
        for name, shape, dtype in self.kv_inputs:
            feeds[name] = np.zeros(shape, dtype=dtype)
        names = list(dict.fromkeys(self.outputs.values()))
        got = dict(zip(names, self.sess.run(names, feeds), strict=True))
        return {k: got[n][0].astype(np.float32) for k, n in self.outputs.items()}


def reference_layer_states(hf: Any, ids: list[int]) -> dict[Key, np.ndarray]:
    """transformers' residual stream after every layer's attention and MLP, float32 [S, hidden] (``hf``: an
    ``edgellm.reference.HFModel``)."""
    layers = getattr(hf.model.base_model, "layers", None)
    if layers is None:
        raise UnsupportedError(f"{type(hf.model).__name__}: no base_model.layers; per-layer states cannot be taken")
    caught: dict[Key, Any] = {}
    hooks = []
    mlp_norm = mlp_input_norm(getattr(hf.model.config, "model_type", None))
    for i, layer in enumerate(layers):
        norm = getattr(layer, mlp_norm, None)
        if norm is not None:
            hooks.append(norm.register_forward_pre_hook(
                lambda _m, args, i=i: caught.__setitem__((i, "attention"), args[0])))
        hooks.append(layer.register_forward_hook(
            lambda _m, _a, out, i=i: caught.__setitem__((i, "mlp"), out[0] if isinstance(out, tuple) else out)))
    try:
        with hf.torch.inference_mode():
            hf.model(input_ids=hf.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return {k: v[0].float().cpu().numpy() for k, v in caught.items()}


def stack_states(states: dict[Key, np.ndarray], num_layers: int) -> np.ndarray:
    """[2 * num_layers, S, hidden], layer-major, ``PARTS`` order (a missing part: NaN rows)."""
    any_state = next(iter(states.values()))
    return np.stack([states.get((i, part), np.full_like(any_state, np.nan)) for i in range(num_layers)
                     for part in PARTS]).astype(np.float32)


def unstack_states(stacked: np.ndarray) -> dict[Key, np.ndarray]:
    return {(k // len(PARTS), PARTS[k % len(PARTS)]): stacked[k] for k in range(len(stacked))
            if np.isfinite(stacked[k]).all()}


def _entry(diffs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
    """max abs / relative difference and non-finite count of (engine, reference) pairs, plus the per-position
    relative difference of the longest sequence (its error growth with position)."""
    max_abs, scale, nonfinite = 0.0, 0.0, 0
    profile: list[float] = []
    for e, r in diffs:
        bad = ~np.isfinite(e)
        nonfinite += int(bad.sum())
        d = np.abs(np.where(bad, 0.0, e).astype(np.float64) - r)
        max_abs = max(max_abs, float(d.max()))
        scale = max(scale, float(np.abs(r).max()))
        if len(e) >= len(profile):
            row_scale = np.maximum(np.abs(r).max(axis=-1), 1e-30)
            rows = d.max(axis=-1) / row_scale
            profile = [math.inf if b else float(x) for x, b in zip(rows, bad.any(axis=-1), strict=True)]
    rel = math.inf if nonfinite else (max_abs / scale if scale > 0 else max_abs)
    return {"max_abs_diff": math.inf if nonfinite else max_abs, "rel_diff": rel, "nonfinite": nonfinite,
            "position_rel_diff": profile}


def compare_layers(engine_states: list[dict[Key, np.ndarray]], ref_states: list[dict[Key, np.ndarray]],
                   num_layers: int, limit: float) -> dict[str, Any]:
    """``layers``: one entry per layer (its output = after the MLP; ``parts`` after attention and MLP), and
    ``first_divergent_layer``: the first (layer, part) whose relative difference exceeds ``limit``, or None."""
    layers: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    for i in range(num_layers):
        parts: dict[str, Any] = {}
        for part in PARTS:
            pairs = [(e[(i, part)], r[(i, part)]) for e, r in zip(engine_states, ref_states, strict=True)
                     if (i, part) in e and (i, part) in r]
            if pairs:
                parts[part] = _entry(pairs)
        out = parts.get("mlp", {})
        layers.append({"layer": i, "max_abs_diff": out.get("max_abs_diff"), "rel_diff": out.get("rel_diff"),
                       "nonfinite": out.get("nonfinite"), "parts": parts})
        if first is None:
            for part in PARTS:
                if part in parts and not parts[part]["rel_diff"] <= limit:
                    first = {"layer": i, "part": part, "rel_diff": parts[part]["rel_diff"],
                             "max_abs_diff": parts[part]["max_abs_diff"], "nonfinite": parts[part]["nonfinite"]}
                    break
    return {"layers": layers, "first_divergent_layer": first, "layer_rel_limit": limit}


def summary(result: dict[str, Any]) -> str:
    """One line for a failing row's reason: "diverges at layer 7 (mlp): rel 3.1e-1; layers 0-6 within 2e-4"."""
    first, layers = result.get("first_divergent_layer"), result.get("layers") or []
    if first is None:
        return f"layers 0-{len(layers) - 1} within {result.get('layer_rel_limit', 0):.0e}" if layers else ""
    before = [e["rel_diff"] for e in layers[:first["layer"]] if e.get("rel_diff") is not None]
    text = f"diverges at layer {first['layer']} ({first['part']}): rel {first['rel_diff']:.1e}"
    if first.get("nonfinite"):
        text += f", {first['nonfinite']} non-finite"
    if before:
        text += f"; layers 0-{first['layer'] - 1} within {max(before):.0e}"
    return text


def layer_report(engine_dir: Path, checkpoint: Path | None, sequences: list[list[int]], num_layers: int,
                 limit: float, *, device: str = "cpu",
                 stored: list[tuple[list[int], np.ndarray]] | None = None) -> dict[str, Any]:
    """Run both sides on ``sequences`` (token ids) and compare (``compare_layers``); ``stored``: the reference's
    states from a reference file (its own sequences; no transformers here), else transformers on ``checkpoint``."""
    from edgellm.reference import HFModel

    if stored is not None:
        sequences = [ids for ids, _ in stored]
    debug = DebugSession.open(engine_dir, num_layers)
    engine_states = [debug.states(ids) for ids in sequences]
    if stored is not None:
        ref_states = [unstack_states(st) for _, st in stored]
    else:
        hf = HFModel(checkpoint, device)
        try:
            ref_states = [reference_layer_states(hf, ids) for ids in sequences]
        finally:
            hf.close()
    result = compare_layers(engine_states, ref_states, num_layers, limit)
    result["sequences"] = [len(s) for s in sequences]
    result["summary"] = summary(result)
    return result
