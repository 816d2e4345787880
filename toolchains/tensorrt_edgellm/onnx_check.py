"""Structural validation of a TensorRT Edge-LLM ONNX export (ONNX Runtime cannot run its plugin ops).

Checks: op inventory by domain; one ``trt_edgellm::AttentionPlugin`` per decoder layer; the number of linear layers
whose GEMM reads a quantized weight equals the quantization report's count; inputs and outputs as the runtime
binds them (``inputs_embeds``, paged ``past_key_values_i`` [2, pages, page size, kv heads, head dim] per layer,
``logits`` [sequences, vocab], ``present_key_values_i``). Loads the graph without its external weights (fast).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgellm.errors import ConfigurationError, TestFailure

ATTENTION_PLUGIN = ("trt_edgellm", "AttentionPlugin")
GEMMS = frozenset({"MatMul", "Gemm", "Int4GroupwiseGemmPluginV2"})
QUANTIZED_GEMM_PLUGINS = frozenset({"Int4GroupwiseGemmPluginV2"})  # take the packed weight directly
DEQUANTIZE = frozenset({"DequantizeLinear", "TRT_MXFP8DequantizeLinear"})
WEIGHT_PATH = DEQUANTIZE | {"Transpose", "Reshape", "Cast", "Identity"}  # ops between a weight and its GEMM
# GEMMs the exporter fuses: their weight initializer stands for several linear layers of the checkpoint.
FUSED = {"qkv_proj_fused": ("q_proj", "k_proj", "v_proj")}


@dataclass(frozen=True)
class OnnxReport:
    ops_by_domain: dict[str, dict[str, int]]
    attention_plugins: int
    layers: int
    quantized_linears: list[str]  # checkpoint linear names whose GEMM reads a dequantized/packed weight
    float_linears: list[str]  # float GEMM weights (unquantized exports name most of them val_N and fuse q/k/v)
    inputs: dict[str, list[Any]]
    outputs: dict[str, list[Any]]
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def raise_problems(self) -> None:
        if self.problems:
            raise TestFailure(f"ONNX export failed {len(self.problems)} structural check(s): "
                              + "; ".join(self.problems))


def _dims(value_info: Any) -> list[Any]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _linear_names(initializer: str) -> list[str]:
    name = initializer.removeprefix("_model.").removesuffix(".weight")
    module, _, leaf = name.rpartition(".")
    if leaf in FUSED:
        return [f"{module}.{part}" for part in FUSED[leaf]]
    return [name]


def _gemm_weights(graph: Any) -> list[tuple[str, bool]]:
    """(weight initializer, quantized?) for every GEMM whose second input traces back to an initializer."""
    producer = {out: node for node in graph.node for out in node.output}
    initializers = {init.name for init in graph.initializer}
    found = []
    for node in graph.node:
        if node.op_type not in GEMMS or len(node.input) < 2:
            continue
        name, quantized = node.input[1], node.op_type in QUANTIZED_GEMM_PLUGINS
        while name not in initializers and name in producer and producer[name].op_type in WEIGHT_PATH:
            quantized = quantized or producer[name].op_type in DEQUANTIZE
            name = producer[name].input[0]
        if name in initializers:
            found.append((name, quantized))
    return found


def check_onnx(onnx_dir: Path, *, expected_quantized: int | None) -> OnnxReport:
    """Validate ``onnx_dir`` (the export's ``llm/``). ``expected_quantized``: the quantization report's count of
    quantized linears (0 for an unquantized export; None skips that check)."""
    import onnx

    onnx_dir = Path(onnx_dir)
    model_path, config_path = onnx_dir / "model.onnx", onnx_dir / "config.json"
    for path in (model_path, config_path):
        if not path.is_file():
            raise ConfigurationError(f"{onnx_dir} is not a tensorrt-edgellm export: {path.name} is missing")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    ops: dict[str, Counter[str]] = {}
    for node in graph.node:
        ops.setdefault(node.domain or "ai.onnx", Counter())[node.op_type] += 1
    layers = int(config["num_hidden_layers"])
    attention = ops.get(ATTENTION_PLUGIN[0], Counter())[ATTENTION_PLUGIN[1]]
    quantized, floating = [], []
    for weight, is_quantized in _gemm_weights(graph):
        (quantized if is_quantized else floating).extend(_linear_names(weight))
    inputs = {vi.name: _dims(vi) for vi in graph.input}
    outputs = {vi.name: _dims(vi) for vi in graph.output}
    problems = []
    if attention != layers:
        problems.append(f"{attention} {'::'.join(ATTENTION_PLUGIN)} node(s) for {layers} decoder layers")
    if expected_quantized is not None and len(quantized) != expected_quantized:
        problems.append(f"{len(quantized)} linear(s) read quantized weights in the graph, the quantization report "
                        f"counts {expected_quantized}")
    problems += _io_problems(inputs, outputs, config, layers)
    return OnnxReport({d: dict(sorted(c.items())) for d, c in sorted(ops.items())}, attention, layers,
                      sorted(quantized), sorted(floating), inputs, outputs, problems)


def logits_width(config: dict[str, Any]) -> int:
    """The logits' width the runtime config declares: a reduced vocabulary's size (``reduced_vocab_size``), an
    EAGLE3 draft's vocabulary (``draft_vocab_size``), else the vocabulary's."""
    if config.get("reduced_vocab_size"):
        return int(config["reduced_vocab_size"])
    if config.get("engine_role") == "draft" and config.get("draft_vocab_size"):
        return int(config["draft_vocab_size"])
    return int(config["vocab_size"])


def _io_problems(inputs: dict[str, list[Any]], outputs: dict[str, list[Any]], config: dict[str, Any],
                 layers: int) -> list[str]:
    problems = []
    kv_heads, head_dim = config["num_key_value_heads"], config["head_dim"]
    if "inputs_embeds" not in inputs:
        problems.append(f"input inputs_embeds missing (inputs: {', '.join(inputs)})")
    elif inputs["inputs_embeds"][-1] != config["hidden_size"]:
        problems.append(f"inputs_embeds {inputs['inputs_embeds']} does not end in hidden size {config['hidden_size']}")
    if "logits" not in outputs:
        problems.append(f"output logits missing (outputs: {', '.join(outputs)})")
    elif outputs["logits"][-1] != (width := logits_width(config)):
        problems.append(f"logits {outputs['logits']} does not end in vocab size {width}")
    for i in range(layers):
        for names, kind in ((inputs, "past"), (outputs, "present")):
            name = f"{kind}_key_values_{i}"
            dims = names.get(name)
            if dims is None:
                problems.append(f"{kind} KV cache {name} missing")
            elif len(dims) != 5 or dims[0] != 2 or dims[3:] != [kv_heads, head_dim]:
                problems.append(f"{name} {dims} is not [2, pages, page size, {kv_heads}, {head_dim}]")
    return problems
