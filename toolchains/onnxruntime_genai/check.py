"""Read back what onnxruntime-genai's builder produced, and the weight precision actually in its graph.

A requested precision that was not applied fails: the precision is read from the graph (``MatMulNBits`` nodes and
their ``bits``; otherwise the data type of the float GEMM weights), never assumed from the request. The graph is read
without its external data (initializer data types and node attributes only), so a large model costs no memory.

Linear layers are matched to the checkpoint's by the builder's node names ``/model/layers.{i}/{attn|mlp}/{proj}/
MatMul[_Q4]`` and ``/lm_head/MatMul[_Q4]``; the builder fuses q/k/v into one ``qkv_proj`` GEMM (and, for some
families, gate/up into ``gate_up_proj``), which count as the linears they hold.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgefarm.toolchains.onnxruntime_genai.export import RECIPES, head_dim, model_dir
from edgellm.errors import ConfigurationError, TestFailure

DECODER_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj")
LM_HEAD = "lm_head"
# builder GEMM name -> the checkpoint linears it computes
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_BLOCK = {"attn": "self_attn", "mlp": "mlp"}
_LAYER_GEMM = re.compile(r"^/model/layers\.(\d+)/(attn|mlp)/(\w+)/MatMul(?:_Q\d+)?$")
_LM_HEAD_GEMM = re.compile(r"^/lm_head/MatMul(?:_Q\d+)?$")
# ONNX TensorProto data types of float weights -> precision name
_FLOAT_TYPES = {1: "fp32", 10: "fp16", 16: "bf16"}
_VIEWS = frozenset({"Transpose", "Reshape", "Cast", "Identity"})
_GENAI_KEYS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size")


@dataclass(frozen=True)
class ExportCheck:
    requested: str
    found: str  # the weight precision read back: fp32 | fp16 | bf16 | int4_wo | int8_wo | mixed(...) | unknown
    linears: int  # decoder linears the checkpoint has (7 per layer)
    quantized_linears: list[str]  # checkpoint linear names computed by MatMulNBits
    float_linears: list[str]  # checkpoint linear names computed by a float MatMul
    lm_head_quantized: bool | None  # None: no LM head GEMM found
    matmulnbits: int  # MatMulNBits nodes (a fused qkv GEMM is one)
    float_gemms: int  # MatMul/Gemm nodes whose weight is an initializer
    quantization: dict[str, list[int]]  # MatMulNBits attributes found: bits, block_size, accuracy_level
    weight_dtypes: dict[str, int]  # float GEMM weight precision -> count
    embedding: str | None  # the embedding table's precision (tied: the LM head's table, so int4 with it)
    attention_nodes: int  # GroupQueryAttention nodes
    genai_config: dict[str, Any]
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def detail(self) -> str:
        head = {True: ", LM head int4", False: ", LM head float", None: ""}[self.lm_head_quantized]
        decoder = len(set(self.quantized_linears) - {LM_HEAD})
        q = f"{decoder}/{self.linears} decoder linears quantized{head}" if self.matmulnbits else \
            f"{self.float_gemms} float GEMMs ({', '.join(f'{k} {v}' for k, v in sorted(self.weight_dtypes.items()))})"
        return f"weights {self.found} (read back from the graph: {q})"

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "passed": self.passed}

    def raise_problems(self) -> None:
        if self.problems:
            raise TestFailure(f"onnxruntime-genai export failed {len(self.problems)} check(s): "
                              + "; ".join(self.problems))


def expected_linears(config: Mapping[str, Any]) -> list[str]:
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigurationError(f"checkpoint config num_hidden_layers {layers!r}: expected an integer >= 1")
    return [f"model.layers.{i}.{name}" for i in range(layers) for name in DECODER_LINEARS]


def _linears_of(node_name: str) -> list[str] | None:
    if _LM_HEAD_GEMM.match(node_name):
        return [LM_HEAD]
    m = _LAYER_GEMM.match(node_name)
    if m is None:
        return None
    layer, block, proj = m.groups()
    return [f"model.layers.{layer}.{_BLOCK[block]}.{p}" for p in _FUSED.get(proj, (proj,))]


def _source(name: str, producer: Mapping[str, Any]) -> str:
    """The tensor ``name`` is a view of, through layout-only ops."""
    while name in producer and producer[name].op_type in _VIEWS and producer[name].input:
        name = producer[name].input[0]
    return name


def _precision_of_bits(bits: set[int]) -> str:
    names = {4: "int4_wo", 8: "int8_wo"}
    if len(bits) == 1:
        return names.get(next(iter(bits)), f"int{next(iter(bits))}_wo")
    return "mixed(" + "+".join(names.get(b, f"int{b}") for b in sorted(bits)) + ")"


def _genai_config_problems(genai: Any, config: Mapping[str, Any], graph_dir: Path) -> tuple[dict[str, Any], list[str]]:
    if not isinstance(genai, dict) or not isinstance(genai.get("model"), dict):
        return {}, ["genai_config.json has no 'model' object"]
    model = genai["model"]
    decoder = model.get("decoder") if isinstance(model.get("decoder"), dict) else {}
    summary = {"type": model.get("type"), "context_length": model.get("context_length"),
               "vocab_size": model.get("vocab_size"), "eos_token_id": model.get("eos_token_id"),
               "filename": decoder.get("filename"), "head_size": decoder.get("head_size"),
               **{k: decoder.get(k) for k in _GENAI_KEYS}}
    problems = []
    wanted = {**{k: config.get(k) for k in _GENAI_KEYS}, "vocab_size": config.get("vocab_size"),
              "head_size": head_dim(config)}
    if wanted["num_key_value_heads"] is None:
        wanted["num_key_value_heads"] = config.get("num_attention_heads")
    for key, value in wanted.items():
        if value is not None and summary.get(key) != value:
            problems.append(f"genai_config.json {key} {summary.get(key)!r}, the checkpoint has {value!r}")
    if not isinstance(summary["filename"], str) or not (graph_dir / summary["filename"]).is_file():
        problems.append(f"genai_config.json decoder filename {summary['filename']!r} is not a file of the export")
    if summary["eos_token_id"] is None:
        problems.append("genai_config.json names no eos_token_id")
    context = summary["context_length"]
    if not isinstance(context, int) or context < 2:
        problems.append(f"genai_config.json context_length {context!r}: expected an integer >= 2")
    if not isinstance(genai.get("search"), dict):
        problems.append("genai_config.json has no 'search' object")
    return summary, problems


def check_export(out_dir: Path, precision: str, config: Mapping[str, Any]) -> ExportCheck:
    """Check an export dir (``export()``'s out_dir, or the builder's model dir) against the checkpoint ``config``
    (its config.json) and the ``precision`` requested. Problems are listed, not raised: ``raise_problems()``."""
    import onnx

    if precision not in RECIPES:
        raise ConfigurationError(f"unknown precision {precision!r} for onnxruntime-genai; valid: "
                                 f"{', '.join(RECIPES)}")
    graph_dir = model_dir(Path(out_dir))
    config_path = graph_dir / "genai_config.json"
    if not config_path.is_file():
        raise ConfigurationError(f"{out_dir} is not an onnxruntime-genai export: genai_config.json is missing")
    try:
        genai = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise TestFailure(f"{config_path} is not valid JSON ({exc})") from None
    summary, problems = _genai_config_problems(genai, config, graph_dir)
    if problems and summary.get("filename") is None:
        return ExportCheck(precision, "unknown", 0, [], [], None, 0, 0, {}, {}, None, 0, summary, problems)
    graph = onnx.load(str(graph_dir / summary["filename"]), load_external_data=False).graph
    init_type = {i.name: i.data_type for i in graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    expected = expected_linears(config)
    quantized: list[str] = []
    floating: list[str] = []
    attrs: dict[str, set[int]] = {"bits": set(), "block_size": set(), "accuracy_level": set()}
    dtypes: Counter[str] = Counter()
    nbits = gemms = attention = 0
    embedding = None
    for node in graph.node:
        if node.op_type == "GroupQueryAttention":
            attention += 1
        elif node.op_type == "MatMulNBits":
            nbits += 1
            values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            for key in attrs:
                if key in values:
                    attrs[key].add(int(values[key]))
            quantized += _linears_of(node.name) or []
        elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in init_type:
            gemms += 1
            dtypes[_FLOAT_TYPES.get(init_type[node.input[1]], f"onnx-type-{init_type[node.input[1]]}")] += 1
            floating += _linears_of(node.name) or []
        elif node.op_type in ("Gather", "GatherBlockQuantized") and node.input:
            table = _source(node.input[0], producer)
            if table in init_type:  # the embedding (a tied one reads the LM head's weight, transposed or packed)
                values = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                embedding = (f"int{values.get('bits', 4)}" if node.op_type == "GatherBlockQuantized"
                             else _FLOAT_TYPES.get(init_type[table], f"onnx-type-{init_type[table]}"))
    bits = attrs["bits"]
    if bits:
        found = _precision_of_bits(bits)
    elif len(dtypes) == 1:
        found = next(iter(dtypes))
    else:
        found = "mixed(" + "+".join(sorted(dtypes)) + ")" if dtypes else "unknown"
    layers = int(config["num_hidden_layers"])
    lm_head = True if LM_HEAD in quantized else False if LM_HEAD in floating else None
    if found != precision:
        problems.append(f"requested {precision} but the graph's weights are {found}")
    recipe = RECIPES[precision].quantization
    if recipe is not None:
        missing = sorted(set(expected) - set(quantized))
        if missing:
            problems.append(f"{len(missing)} of {len(expected)} decoder linears are not MatMulNBits: "
                            f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
        if bits and attrs["block_size"] != {recipe["block_size"]}:
            problems.append(f"MatMulNBits block_size {sorted(attrs['block_size'])}, requested {recipe['block_size']}")
        if bits and attrs["accuracy_level"] != {recipe["accuracy_level"]}:
            problems.append(f"MatMulNBits accuracy_level {sorted(attrs['accuracy_level'])}, requested "
                            f"{recipe['accuracy_level']}")
    else:
        missing = sorted(set(expected) - set(floating))
        if missing:
            problems.append(f"{len(missing)} of {len(expected)} decoder linears have no float GEMM: "
                            f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''}")
    unknown = sorted(set(quantized + floating) - set(expected) - {LM_HEAD})
    if unknown:
        problems.append(f"GEMMs for linears the checkpoint does not have: {', '.join(unknown[:6])}")
    if lm_head is None:
        problems.append("no LM head GEMM (/lm_head/MatMul) in the graph")
    if attention != layers:
        problems.append(f"{attention} GroupQueryAttention node(s) for {layers} decoder layers")
    return ExportCheck(precision, found, len(expected), sorted(quantized), sorted(floating), lm_head, nbits, gemms,
                       {k: sorted(v) for k, v in attrs.items() if v}, dict(dtypes), embedding, attention, summary,
                       problems)
