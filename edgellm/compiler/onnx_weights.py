"""Turn a weight-free ONNX trace into the exported model, writing every weight once.

``torch.onnx.export(export_params=False)`` gives a small graph whose weights are graph inputs named like the
module's parameters. Here they become initializers stored in one external data file, written straight from the
torch tensors (no protobuf of the weights, no re-load, no shape inference over gigabytes) and hashed as written:

- a weight used only through ``Transpose(perm=[1, 0])`` (``nn.Linear``) is stored transposed, ``[in, out]``, and
  the Transpose node is dropped, so ONNX Runtime has nothing to constant-fold into a second copy;
- a tied embedding (``Gather`` for the lookup and ``Transpose`` for the lm_head) is stored once, transposed
  ``[hidden, vocab]`` for the MatMul; the lookup becomes ``Gather(axis=1)`` + ``Transpose``.

Offsets are aligned to 4096 bytes so the runtime can map each tensor directly.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ALIGN = 4096
LOOKAHEAD = 2  # tensors prepared / hashed ahead of the writer (bounds the extra memory to ~2 tensors)


def _perm(node: Any) -> list[int] | None:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return None


def _gather_axis(node: Any) -> int:
    for a in node.attribute:
        if a.name == "axis":
            return int(a.i)
    return 0


def attach_weights(model: Any, weights: dict[str, Any], inputs: list[str], data_path: Path) -> str:
    """Replace ``model``'s graph inputs other than ``inputs`` (each named in ``weights``: torch tensors) by
    external initializers in ``data_path`` (written here); returns the data file's sha256. ``model`` is an
    ``onnx.ModelProto``, edited in place."""
    import torch
    from onnx import helper

    graph = model.graph
    weight_inputs = [i for i in graph.input if i.name not in inputs]
    unknown = [i.name for i in weight_inputs if i.name not in weights]
    if unknown:
        from edgellm.errors import BugError

        raise BugError(f"traced graph inputs without a tensor: {', '.join(unknown[:5])}")
    consumers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    renames: dict[str, str] = {}  # Transpose output -> stored (transposed) initializer
    drop: set[int] = set()
    plan: list[tuple[str, torch.Tensor]] = []
    extra_nodes: dict[int, list[Any]] = {}  # replaces node id(...) with these nodes
    for inp in weight_inputs:
        tensor = weights[inp.name].detach()
        users = consumers[inp.name]
        transposes = [n for n in users if n.op_type == "Transpose" and _perm(n) == [1, 0]]
        gathers = [n for n in users if n.op_type == "Gather" and n.input[0] == inp.name and _gather_axis(n) == 0]
        if tensor.dim() == 2 and transposes and len(transposes) + len(gathers) == len(users):
            stored = f"{inp.name}.T"
            plan.append((stored, tensor.t()))  # made contiguous by the writer, one tensor ahead
            for t in transposes:
                renames[t.output[0]] = stored
                drop.add(id(t))
            for g in gathers:  # Gather(W, ids) == Transpose(Gather(W^T, ids, axis=1)): [H, *ids] -> [*ids, H]
                mid = f"{g.output[0]}.hidden_first"
                rank = _rank_of(graph, g.input[1])
                extra_nodes[id(g)] = [
                    helper.make_node("Gather", [stored, g.input[1]], [mid], name=f"{g.name}.T", axis=1),
                    helper.make_node("Transpose", [mid], [g.output[0]], name=f"{g.name}.untranspose",
                                     perm=[*range(1, rank + 1), 0]),
                ]
        else:
            plan.append((inp.name, tensor))
    new_nodes = []
    for node in graph.node:
        if id(node) in drop:
            continue
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        new_nodes.extend(extra_nodes.get(id(node), [node]))
    del graph.node[:]
    graph.node.extend(new_nodes)
    keep = [i for i in graph.input if i.name in inputs]
    del graph.input[:]
    graph.input.extend(keep)
    plan = _dedupe_small_tensors(graph, plan)
    _eliminate_common_nodes(graph)
    plan = _fuse_shared_input_matmuls(graph, plan)
    return _write(plan, graph, data_path)


DEDUPE_MAX_NUMEL = 1 << 16  # scales and smoothing vectors, not matrices


def _dedupe_small_tensors(graph: Any, plan: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Small stored tensors equal in dtype, shape and bytes (SmoothQuant's pre_quant_scale and input_scale, which
    ModelOpt shares between the linears of one input) become one tensor, so their nodes become identical."""
    import torch

    first: dict[tuple[Any, ...], str] = {}
    renames: dict[str, str] = {}
    for name, t in plan:
        if not isinstance(t, torch.Tensor) or t.numel() > DEDUPE_MAX_NUMEL:
            continue
        key = (t.dtype, tuple(t.shape), _as_array(t.detach())[0].tobytes())
        if key in first:
            renames[name] = first[key]
        else:
            first[key] = name
    if not renames:
        return plan
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
    return [(n, t) for n, t in plan if n not in renames]


def _eliminate_common_nodes(graph: Any) -> None:
    """Nodes computing the same op with the same attributes on the same inputs as an earlier node are dropped and
    their outputs read from that node (all ops here are deterministic); graph outputs are never renamed."""
    outputs = {o.name for o in graph.output}
    seen: dict[tuple[Any, ...], list[str]] = {}
    renames: dict[str, str] = {}
    keep = []
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        key = (node.domain, node.op_type, tuple(node.input), len(node.output),
               tuple(sorted(a.SerializeToString() for a in node.attribute)))
        if key in seen and not outputs.intersection(node.output) and all(node.output):
            renames.update(zip(node.output, seen[key], strict=True))
            continue
        seen.setdefault(key, list(node.output))
        keep.append(node)
    if renames:
        del graph.node[:]
        graph.node.extend(keep)


def _fuse_shared_input_matmuls(graph: Any, plan: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """MatMuls of one input by stored weights used nowhere else (q/k/v, gate/up) become one MatMul by the
    weights concatenated along the output axis (and one Add of their concatenated biases, when each has one),
    then a Split: fewer, wider kernels, the same dot products."""
    from onnx import TensorProto, helper

    tensors = dict(plan)
    uses: dict[str, int] = defaultdict(int)
    readers: dict[str, list[Any]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            uses[name] += 1
            readers[name].append(node)
    groups: dict[tuple[str, ...], list[Any]] = defaultdict(list)
    for node in graph.node:
        w = node.input[1] if node.op_type in FUSABLE_GEMMS else None
        if w in tensors and uses[w] == 1 and tensors[w].dim() == 2:
            if node.op_type == "MatMul":
                groups[(node.op_type, node.input[0])].append(node)
            elif len(node.input) == 6 and _per_column(tensors, uses, node.input[3], tensors[w]):
                # MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero, b_zero): one quantized input and its
                # quantization; per-output-column weight scales concatenate with the weights
                groups[(node.op_type, node.input[0], node.input[2], node.input[4], node.input[5])].append(node)
    fused: dict[int, list[Any]] = {}
    gone: set[str] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        names = [m.input[1] for m in members]
        parts = [tensors[n] for n in names]
        name = _fused_name(names)
        sizes = f"{name}.split"
        tensors[name] = _Concat(parts)
        widths = [int(p.shape[1]) for p in parts]
        graph.initializer.append(helper.make_tensor(sizes, TensorProto.INT64, [len(parts)], widths))
        first = members[0]
        out = f"{name}.out"
        inputs = [first.input[0], name]
        if first.op_type == "MatMulIntegerToFloat":
            scales = [m.input[3] for m in members]
            tensors[_fused_name(scales)] = _Concat([tensors[n] for n in scales])
            gone.update(scales)
            inputs = [*inputs, first.input[2], _fused_name(scales), first.input[4], first.input[5]]
        nodes = [helper.make_node(first.op_type, inputs, [out], name=f"{first.name}.fused",
                                  domain=first.domain)]
        split_outputs = [m.output[0] for m in members]
        adds = [_bias_add(readers[m.output[0]], m.output[0], tensors, uses) for m in members]
        if all(a is not None for a in adds):  # q/k/v biases: one Add before the Split
            biases = [a.input[1] if a.input[0] == m.output[0] else a.input[0]
                      for a, m in zip(adds, members, strict=True)]
            bias = _fused_name(biases)
            tensors[bias] = _Concat([tensors[b] for b in biases])
            nodes.append(helper.make_node("Add", [out, bias], [f"{out}.bias"], name=f"{first.name}.bias"))
            out, split_outputs = f"{out}.bias", [a.output[0] for a in adds]
            for a in adds:
                fused[id(a)] = []
            gone.update(biases)
        nodes.append(helper.make_node("Split", [out, sizes], split_outputs, name=f"{first.name}.split", axis=-1))
        fused[id(first)] = nodes
        for m in members[1:]:
            fused[id(m)] = []
        gone.update(names)
    if not fused:
        return plan
    nodes = []
    for node in graph.node:
        nodes.extend(fused.get(id(node), [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    return [(n, t) for n, t in tensors.items() if n not in gone]


FUSABLE_GEMMS = ("MatMul", "MatMulIntegerToFloat")


def _per_column(tensors: dict[str, Any], uses: dict[str, int], name: str, weight: Any) -> bool:
    """``name`` is a stored 1-D scale per output column of ``weight`` [in, out], used nowhere else."""
    t = tensors.get(name)
    return t is not None and uses[name] == 1 and t.dim() == 1 and int(t.shape[0]) == int(weight.shape[1])


def _bias_add(readers: list[Any], name: str, tensors: dict[str, Any], uses: dict[str, int]) -> Any:
    """The one reader of ``name`` when it is ``Add(name, bias)`` with a stored 1-D bias used nowhere else."""
    if len(readers) != 1 or readers[0].op_type != "Add":
        return None
    add = readers[0]
    other = add.input[1] if add.input[0] == name else add.input[0]
    t = tensors.get(other)
    return add if t is not None and uses[other] == 1 and t.dim() == 1 else None


class _Concat:
    """Weights [in, out_i] (or biases [out_i]) concatenated along the output axis, materialized by the writer."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts
        self.shape = (*parts[0].shape[:-1], sum(int(p.shape[-1]) for p in parts))

    def dim(self) -> int:
        return len(self.shape)

    def contiguous(self) -> Any:
        import torch

        return torch.cat(self.parts, dim=-1)


def _fused_name(names: list[str]) -> str:
    """[a.q_proj.weight.T, a.k_proj.weight.T] -> a.q_proj+k_proj.weight.T"""
    split = [n.split(".") for n in names]
    head = 0
    while all(len(p) > head and p[head] == split[0][head] for p in split):
        head += 1
    tail = 0
    while all(len(p) - tail > head and p[-1 - tail] == split[0][-1 - tail] for p in split):
        tail += 1
    middle = "+".join(".".join(p[head:len(p) - tail]) for p in split)
    return ".".join([*split[0][:head], middle, *split[0][len(split[0]) - tail:]])


def _write(plan: list[tuple[str, Any]], graph: Any, data_path: Path) -> str:
    """Write the tensors in order, 4096-aligned; transposing the next tensor and hashing the last one run in two
    threads beside the write (torch copies, hashlib and file writes release the GIL). Returns the sha256."""
    import onnx

    h = hashlib.sha256()
    offset = 0
    # The largest tensor (the embedding / lm_head) is written last and transposed from the start, in its own
    # thread, so the writer never waits for it.
    big = max(range(len(plan)), key=lambda i: _numel(plan[i][1])) if plan else 0
    plan = [*plan[:big], *plan[big + 1:], plan[big]] if plan else plan
    prep, hasher, early = ThreadPoolExecutor(1), ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    last = early.submit(_as_array, plan[-1][1]) if plan else None
    ready = deque(prep.submit(_as_array, t) for _, t in plan[:-1][:LOOKAHEAD])
    hashing: deque[Future[None]] = deque()
    try:
        with open(data_path, "wb") as f:
            for i, (name, _) in enumerate(plan):
                arr, data_type = ready.popleft().result() if i < len(plan) - 1 else last.result()  # type: ignore[union-attr]
                if i + LOOKAHEAD < len(plan) - 1:
                    ready.append(prep.submit(_as_array, plan[i + LOOKAHEAD][1]))
                pad = b"\0" * (-offset % ALIGN)
                f.write(pad)
                offset += len(pad)
                buf = memoryview(arr).cast("B")
                f.write(buf)
                hashing.append(hasher.submit(_update, h, pad, buf))
                if len(hashing) > LOOKAHEAD:
                    hashing.popleft().result()
                init = onnx.TensorProto(name=name, dims=list(arr.shape), data_type=data_type)
                init.data_location = onnx.TensorProto.EXTERNAL
                for k, v in (("location", data_path.name), ("offset", str(offset)), ("length", str(arr.nbytes))):
                    init.external_data.add(key=k, value=v)
                graph.initializer.append(init)
                offset += arr.nbytes
        for fut in hashing:
            fut.result()
    finally:
        prep.shutdown(cancel_futures=True)
        early.shutdown()
        hasher.shutdown()
    return h.hexdigest()


def _numel(tensor: Any) -> int:
    n = 1
    for d in tensor.shape:
        n *= int(d)
    return n


def _as_array(tensor: Any) -> tuple[Any, int]:
    """The tensor's bytes as a numpy array and its ONNX data type. numpy has neither float8 nor bfloat16: those
    are written as their raw bits (uint8 / int16), typed FLOAT8E4M3FN / BFLOAT16 in the graph."""
    import onnx
    import torch
    from onnx import helper

    t = tensor.contiguous()
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy(), onnx.TensorProto.FLOAT8E4M3FN
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), onnx.TensorProto.BFLOAT16
    arr = t.numpy()
    return arr, helper.np_dtype_to_tensor_dtype(arr.dtype)


def _update(h: Any, pad: bytes, buf: memoryview) -> None:
    h.update(pad)
    h.update(buf)


def _rank_of(graph: Any, name: str) -> int:
    for vi in (*graph.input, *graph.value_info):
        if vi.name == name:
            return len(vi.type.tensor_type.shape.dim)
    return 2  # the token ids [batch, seq]
