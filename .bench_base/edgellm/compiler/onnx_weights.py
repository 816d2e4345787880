"""Turn a weight-free ONNX trace into the exported model, writing every weight once.

``torch.onnx.export(export_params=False)`` gives a small graph whose weights are graph inputs named like the
module's parameters. Here they become initializers stored in one external data file, written straight from the
torch tensors (no protobuf of the weights, no re-load, no shape inference over gigabytes) and hashed as written:

- every weight is stored as the checkpoint holds it: an ``nn.Linear`` weight stays ``[out, in]`` and its traced
  ``MatMul(x, Transpose(W))`` becomes ``com.microsoft.FusedMatMul(x, W, transB=1)`` (ONNX Runtime packs B for its
  GEMM at session load either way), so writing a weight is one sequential copy of its bytes, never a transpose;
- a tied embedding is stored once: the lookup's ``Gather`` and the lm_head's ``FusedMatMul`` read the same tensor;
- MatMuls of one input (q/k/v, gate/up) become one GEMM of their weights concatenated along the output axis,
  rows after rows in the file.

Offsets are aligned to 4096 bytes so the runtime can map each tensor directly.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

ALIGN = 4096
MS_DOMAIN = "com.microsoft"
LOOKAHEAD = 2  # pieces written ahead of the hasher


def _perm(node: Any) -> list[int] | None:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return None


def _reads_as_b(node: Any, name: str) -> bool:
    """``node`` is a plain MatMul reading ``name`` as its right operand only."""
    return node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and list(node.input[1:]) == [name] \
        and node.input[0] != name


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
    drop: set[int] = set()
    plan: list[tuple[str, torch.Tensor]] = []
    for inp in weight_inputs:
        tensor = weights[inp.name].detach()
        transposes = [n for n in consumers[inp.name] if n.op_type == "Transpose" and _perm(n) == [1, 0]]
        products = [(m, t.output[0]) for t in transposes for m in consumers[t.output[0]]]
        # a transpose read elsewhere stays in the graph (correct, only slower): the exporter emits none today
        if tensor.dim() == 2 and all(_reads_as_b(m, name) for m, name in products):
            drop.update(id(t) for t in transposes)
            for m, _ in products:  # MatMul(x, W^T) -> FusedMatMul(x, W, transB=1)
                m.op_type, m.domain = "FusedMatMul", MS_DOMAIN
                m.input[1] = inp.name
                m.attribute.append(helper.make_attribute("transB", 1))
        plan.append((inp.name, tensor))
    if drop:
        nodes = [n for n in graph.node if id(n) not in drop]
        del graph.node[:]
        graph.node.extend(nodes)
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
    """GEMMs of one input by stored weights used nowhere else (q/k/v, gate/up) become one GEMM by the weights
    concatenated along the output axis (and one Add of their concatenated biases, when each has one), then a
    Split: fewer, wider kernels, the same dot products."""
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
            if node.op_type in ("MatMul", "FusedMatMul"):
                attrs = tuple(sorted(a.SerializeToString() for a in node.attribute))
                groups[(node.op_type, node.input[0], *attrs)].append(node)
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
        first = members[0]
        axis = _output_axis(first)
        tensors[name] = _Concat(parts, axis)
        widths = [int(p.shape[axis]) for p in parts]
        graph.initializer.append(helper.make_tensor(sizes, TensorProto.INT64, [len(parts)], widths))
        out = f"{name}.out"
        inputs = [first.input[0], name]
        if first.op_type == "MatMulIntegerToFloat":
            scales = [m.input[3] for m in members]
            tensors[_fused_name(scales)] = _Concat([tensors[n] for n in scales], 0)
            gone.update(scales)
            inputs = [*inputs, first.input[2], _fused_name(scales), first.input[4], first.input[5]]
        gemm = helper.make_node(first.op_type, inputs, [out], name=f"{first.name}.fused", domain=first.domain)
        gemm.attribute.extend(first.attribute)
        nodes = [gemm]
        split_outputs = [m.output[0] for m in members]
        adds = [_bias_add(readers[m.output[0]], m.output[0], tensors, uses) for m in members]
        if all(a is not None for a in adds):  # q/k/v biases: one Add before the Split
            biases = [a.input[1] if a.input[0] == m.output[0] else a.input[0]
                      for a, m in zip(adds, members, strict=True)]
            bias = _fused_name(biases)
            tensors[bias] = _Concat([tensors[b] for b in biases], 0)
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


FUSABLE_GEMMS = ("MatMul", "FusedMatMul", "MatMulIntegerToFloat")


def _output_axis(gemm: Any) -> int:
    """The axis of the GEMM's stored weight that indexes its output columns: 0 for ``[out, in]`` read with
    transB (FusedMatMul), 1 for ``[in, out]`` (MatMul, MatMulIntegerToFloat)."""
    trans_b = any(a.name == "transB" and a.i for a in gemm.attribute)
    return 0 if trans_b else 1


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
    """Tensors concatenated along ``axis`` (weights along their output axis, biases and scales along their only
    one), materialized by the writer: along axis 0, the parts are written one after the other."""

    def __init__(self, parts: list[Any], axis: int) -> None:
        self.parts, self.axis = parts, axis
        shape = list(parts[0].shape)
        shape[axis] = sum(int(p.shape[axis]) for p in parts)
        self.shape = tuple(shape)

    def dim(self) -> int:
        return len(self.shape)

    def pieces(self) -> list[Any]:
        import torch

        return list(self.parts) if self.axis == 0 else [torch.cat(self.parts, dim=self.axis)]


def _fused_name(names: list[str]) -> str:
    """[a.q_proj.weight, a.k_proj.weight] -> a.q_proj+k_proj.weight"""
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
    """Write the tensors in order, 4096-aligned, each straight from its tensor's memory (a concatenation along
    axis 0 part after part); hashing runs in a thread beside the writes (hashlib and file writes release the GIL).
    Returns the sha256."""
    import onnx

    h = hashlib.sha256()
    offset = 0
    hasher = ThreadPoolExecutor(1)  # one thread: the updates run in write order
    hashing: deque[Future[None]] = deque()
    try:
        with open(data_path, "wb") as f:
            for name, tensor in plan:
                pad = b"\0" * (-offset % ALIGN)
                f.write(pad)
                offset += len(pad)
                start, data_type = offset, None
                for piece in tensor.pieces() if isinstance(tensor, _Concat) else [tensor]:
                    arr, data_type = _as_array(piece)
                    buf = memoryview(arr).cast("B")
                    f.write(buf)
                    offset += arr.nbytes
                    hashing.append(hasher.submit(_update, h, pad, buf))
                    pad = b""
                    if len(hashing) > LOOKAHEAD:
                        hashing.popleft().result()
                init = onnx.TensorProto(name=name, dims=[int(d) for d in tensor.shape], data_type=data_type)
                init.data_location = onnx.TensorProto.EXTERNAL
                for k, v in (("location", data_path.name), ("offset", str(start)), ("length", str(offset - start))):
                    init.external_data.add(key=k, value=v)
                graph.initializer.append(init)
        for fut in hashing:
            fut.result()
    finally:
        hasher.shutdown()
    return h.hexdigest()


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
