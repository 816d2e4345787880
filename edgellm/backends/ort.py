"""ONNX Runtime (CPU) backend: the engine is the offline-optimized graph ORT writes for this machine's CPU.

The weight matrices are not re-serialized: ORT optimizes the graph with them as graph inputs (so it neither loads
them nor changes them), then they are put back as initializers pointing into the engine's ``model.onnx.data``, an
in-kernel copy of the export's data file (so its digest is the export's, already verified). What the optimizer
writes itself (norm weights, folded constants) goes to ``model.engine.data``.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from edgellm.backends.base import BuildParams, EngineBackend, Session, TensorSpec, register_backend
from edgellm.backends.kv_cache import KVBuffer, KVCache
from edgellm.backends.thread_policy import choose_spinning
from edgellm.compiler.export import LOGITS_POSITIONS, quantized_export_precisions
from edgellm.errors import BugError, ConfigurationError
from edgellm.types import Precision

ENGINE_MODEL = "model.onnx"
ENGINE_DATA = "model.onnx.data"  # the export's weights, copied as they are
OWNED_DATA = "model.engine.data"  # initializers the optimizer wrote (norm weights, folded constants)
# EXTENDED: fusions valid for any CPU ORT build; ALL would add layout ops tied to this CPU's instruction set.
OPT_LEVEL = "ORT_ENABLE_EXTENDED"

# ONNX Runtime's intra-op threads spin by default: between parallel sections (every GEMM of a decode step is one) an
# idle thread keeps polling for work instead of sleeping. On a machine the engine shares, that polling burns the CPU
# time the decode needs. benchmarks/results/peers-contention.json (2 CPUs, already loaded by other tenants, 2 threads,
# rounds alternating): the Qwen2.5-0.5B shape at fp32 decoded 1.48x faster with spinning off under a competing
# 2-process job (1.73x without it), stories260K 2.5x under it; on an idle host spinning saves the wake-ups (issue 39:
# quiet int4 fell from 1.21x onnxruntime-genai to 0.89x when spinning was turned off). So by default ("auto") each
# session chooses at open from the host's measured load (edgellm.backends.thread_policy.choose_spinning: spin only
# with an idle CPU per intra-op thread), once: ONNX Runtime cannot change it on an open session.
# ``OrtBackend.open(intra_op_spinning=True|False)`` fixes it (the benchmark's edgellm-spin / edgellm-nospin stacks).
# benchmarks/results/peers_contention_issue39_auto.json (2026-12-06, 0.5B shape fp32, 3 rounds, load average 5-10 on
# 2 CPUs, other tenants busy 1.3-1.6 CPUs even "quiet"): "auto" found 0.00-0.11 idle CPUs at every open and did not
# spin; spinning was slower in both cases (edgellm-nospin / edgellm-spin 1.77x quiet, 1.74x contended). An idle host,
# where "auto" spins, was not available to measure.
INTRA_OP_SPINNING: bool | str = "auto"

INT8_GEMMS = ("MatMulIntegerToFloat", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul")

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(bfloat16)": "bfloat16"}


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def _specs(args: list[Any]) -> list[TensorSpec]:
    return [TensorSpec(a.name, _ORT_TYPES.get(a.type, a.type), tuple(a.shape)) for a in args]


class OrtSession(Session):
    """The KV cache stays on the host, fed to the graph and taken back at every step. ``gqa``: the graph attends
    through GroupQueryAttention, which writes the step's keys and values into its past buffer when past and present
    are bound to one buffer (``kv_in_place``: the session's caches are then ``KVBuffer``s; otherwise a ``KVCache``
    grows by the present outputs), and refuses several new positions over a past for batch > 1 (such a step runs
    one row at a time). ``windows``: each layer's attention window (``family.layer_windows``), whose cache holds the
    graph's present, its last ``window`` positions (never in place)."""

    def __init__(self, sess: Any, *, gqa: bool = False, settings: dict[str, Any] | None = None,
                 windows: tuple[int | None, ...] | None = None) -> None:
        self.sess = sess
        self.settings = settings or {}  # the session options it was opened with (session_settings)
        self.inputs = _specs(sess.get_inputs())
        self.outputs = _specs(sess.get_outputs())
        self._out_names = [o.name for o in self.outputs]
        # (past input, present output) per buffer, in KVBuffer.buffers' order: k0, v0, k1, v1, ...
        layers = sum(s.name.startswith("past_key_values.") for s in self.inputs) // 2
        self._kv = [(f"past_key_values.{i}.{kv}", f"present.{i}.{kv}") for i in range(layers)
                    for kv in ("key", "value")]
        self.windows = tuple(windows) if windows is not None else (None,) * layers
        vocab = next((o.shape[-1] for o in self.outputs if o.name == "logits"), None)
        self._vocab = vocab if isinstance(vocab, int) else None
        self._gqa = gqa
        self.kv_in_place = gqa and self._vocab is not None

    @property
    def kv_names(self) -> list[tuple[str, str]]:
        """(past input, present output) of every cache tensor, in the order k0, v0, k1, v1, ..."""
        return self._kv

    def new_cache(self, batch_size: int, capacity: int) -> KVCache | KVBuffer:
        """Shaped and typed as the graph's past inputs [batch, kv_heads, past, head_dim]: a ``KVBuffer`` of
        ``capacity`` positions when the graph fills it in place, else a ``KVCache`` that grows."""
        spec = next((s for s in self.inputs if s.name == self._kv[0][0]), None) if self._kv else None
        if spec is None or not all(isinstance(d, int) for d in (spec.shape[1], spec.shape[3])):
            raise BugError(f"session inputs have no past key input of static [batch, kv_heads, past, head_dim] "
                           f"shape: {self.inputs[:4]}")
        kv_heads, head_dim, dtype = int(spec.shape[1]), int(spec.shape[3]), np.dtype(spec.dtype)
        layers = len(self._kv) // 2
        if self.kv_in_place:
            return KVBuffer(layers, batch_size, kv_heads, head_dim, dtype, capacity, self.windows)
        return KVCache(layers, batch_size, kv_heads, head_dim, dtype, self.windows)

    def step(self, input_ids: np.ndarray, positions: np.ndarray, attention_mask: np.ndarray,
             cache: KVCache | KVBuffer, *, last_only: bool) -> np.ndarray:
        s = input_ids.shape[1]
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": positions,
                 LOGITS_POSITIONS: np.arange(s - 1 if last_only else 0, s, dtype=np.int64)}
        return cache.run_step(self, feeds)

    def _row_by_row(self, feeds: dict[str, np.ndarray], past_len: int) -> bool:
        b, s = feeds["input_ids"].shape
        return self._gqa and b > 1 and s > 1 and past_len > 0

    @staticmethod
    def _row(feeds: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
        """Row ``i`` of the batched inputs (those of rank >= 2; logits_positions is shared)."""
        return {k: v[i:i + 1] if v.ndim >= 2 else v for k, v in feeds.items()}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._kv and self._row_by_row(feeds, feeds[self._kv[0][0]].shape[2]):
            rows = [self._run(self._row(feeds, i)) for i in range(feeds["input_ids"].shape[0])]
            return {name: np.concatenate([r[name] for r in rows], axis=0) for name in self._out_names}
        return self._run(feeds)

    def _run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._out_names, self.sess.run(self._out_names, feeds), strict=True))

    def run_in_place(self, feeds: dict[str, np.ndarray], cache: KVBuffer) -> np.ndarray:
        """``feeds`` without the past; the step's keys and values land in ``cache``'s buffers after its
        ``length`` (the caller advances it). Returns the logits."""
        if not self.kv_in_place or self._vocab is None:
            raise BugError("run_in_place on a session that does not update its KV cache in place")
        if self._row_by_row(feeds, cache.length):  # over row views of the buffers
            rows = [self._bind_kv([b[i:i + 1] for b in cache.buffers]) for i in range(cache.batch_size)]
            logits = np.concatenate([r.run(self._row(feeds, i)) for i, r in enumerate(rows)], axis=0)
            for j, *_ in rows[0].windowed:  # each row's windowed presents, as one batch
                cache.buffers[j] = np.concatenate([r.buffers[j] for r in rows], axis=0)
            return logits
        if cache.binding is None:
            cache.binding = self._bind_kv(cache.buffers)
        return cache.binding.run(feeds)  # type: ignore[no-any-return]

    def _bind_kv(self, buffers: list[np.ndarray]) -> _KVBinding:
        """Each past input and its present output bound to the same buffer (contiguous arrays: a row of a C-ordered
        buffer is one); a windowed layer's are bound at every step (``_KVBinding.run``)."""
        import onnxruntime as ort

        io = self.sess.io_binding()
        windowed = []
        for j, ((past, present), buf) in enumerate(zip(self._kv, buffers, strict=True)):
            if (window := self.windows[j // 2]) is not None:
                windowed.append((j, past, present, window))
                continue
            value = ort.OrtValue.ortvalue_from_numpy(buf)
            io.bind_ortvalue_input(past, value)
            io.bind_ortvalue_output(present, value)
        return _KVBinding(self.sess, io, buffers, self._vocab, windowed)  # type: ignore[arg-type]  # checked


@dataclass
class _KVBinding:
    """A session's IOBinding over KV buffers, and every array it points into (kept alive as long as the binding:
    ONNX Runtime holds raw pointers). ``windowed``: (index in ``buffers``, past input, present output, window) of
    each windowed layer's keys and values, whose past is bound at every step and whose present (the last
    ``window`` positions of past + new) replaces it in ``buffers``."""

    sess: Any
    io: Any
    buffers: list[np.ndarray]
    vocab: int
    windowed: list[tuple[int, str, str, int]] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)
    logits: np.ndarray | None = None

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        for name, value in feeds.items():
            self.io.bind_cpu_input(name, value)
        b, s = feeds["input_ids"].shape
        logits = np.empty((b, feeds[LOGITS_POSITIONS].shape[0], self.vocab), np.float32)
        self.io.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        presents = []
        for j, past, present, window in self.windowed:
            held = self.buffers[j]
            self.io.bind_cpu_input(past, held)
            out = np.empty((*held.shape[:2], min(held.shape[2] + s, window), held.shape[3]), held.dtype)
            self.io.bind_output(present, "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)
            presents.append(out)
        self.inputs, self.logits = feeds, logits
        self.sess.run_with_iobinding(self.io)
        for (j, *_), out in zip(self.windowed, presents, strict=True):
            self.buffers[j] = out
        return logits


@register_backend
class OrtBackend(EngineBackend):
    backend = "ort"
    # What this backend builds: float exports, and ModelOpt-quantized ones, each method lowered by export to ONNX
    # Runtime's kernels (integer, or emulated: edgellm/quant declares which).
    precisions: ClassVar[tuple[Precision, ...]] = (Precision.FP32, Precision.FP16, *quantized_export_precisions())
    refused: ClassVar[Mapping[Precision, str]] = {
        Precision.BF16: "ONNX Runtime's CPU execution provider has no bf16 kernels (its MatMul, Mul and "
                        "RotaryEmbedding take fp32/fp16 only); build bf16 exports with --backend torch-cuda, or "
                        "export at fp32 or fp16 for ort",
    }
    device: ClassVar[str] = "cpu"

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__

    def build(self, onnx_model: Path, out_dir: Path, params: BuildParams) -> dict[str, Any]:
        import onnx
        import onnxruntime as ort

        graph, weights, data_file = _weights_as_inputs(onnx_model)
        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVEL)
        so.optimized_model_filepath = str(out_dir / ENGINE_MODEL)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", OWNED_DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.intra_op_num_threads = physical_cores()
        try:
            sess = ort.InferenceSession(graph.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise ConfigurationError(f"{onnx_model}: ONNX Runtime cannot load the exported graph ({exc})") from None
        io = {"inputs": [s for s in _specs(sess.get_inputs()) if s.name not in weights],
              "outputs": _specs(sess.get_outputs())}
        del sess, graph
        optimized = onnx.load(str(out_dir / ENGINE_MODEL), load_external_data=False)
        used = {i.name for i in optimized.graph.input} & set(weights)
        keep = [i for i in optimized.graph.input if i.name not in weights]
        del optimized.graph.input[:]
        optimized.graph.input.extend(keep)
        for name in sorted(used):
            optimized.graph.initializer.append(weights[name])
        (out_dir / ENGINE_MODEL).write_bytes(optimized.SerializeToString())
        reused_files: dict[str, str] = {}
        if weights:
            # A copy (in-kernel), not a hard link: onnx.load and onnx.checker refuse external data with several links.
            shutil.copyfile(data_file, out_dir / ENGINE_DATA)
            reused_files[ENGINE_DATA] = data_file.name
        built = graph_summary(out_dir / ENGINE_MODEL)
        owned = (out_dir / OWNED_DATA).stat().st_size if (out_dir / OWNED_DATA).is_file() else 0
        return {
            "engine_files": sorted(p.name for p in out_dir.iterdir() if p.is_file()),
            "io": {k: [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in v] for k, v in io.items()},
            "precision": built["precision"],
            "graph": built,
            "reused_files": reused_files,
            "options": {"graph_optimization_level": OPT_LEVEL, "providers": ["CPUExecutionProvider"],
                        "optimized_for": "this CPU's ONNX Runtime CPU execution provider",
                        "weights": {"export_data": "copy" if weights else "none", "matrices_from_export": len(used),
                                    "engine_owned_bytes": owned}},
        }

    def open(self, engine_dir: Path, manifest: dict[str, Any], *, num_threads: int | None = None,
             intra_op_spinning: bool | str = INTRA_OP_SPINNING) -> Session:
        import onnxruntime as ort

        settings = session_settings(num_threads, intra_op_spinning=intra_op_spinning)
        path = Path(engine_dir) / ENGINE_MODEL
        try:
            sess = ort.InferenceSession(str(path), session_options(settings), providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ConfigurationError(f"{path}: ONNX Runtime cannot load the engine ({exc})") from None
        ops = manifest.get("graph", {}).get("op_counts", {})
        return OrtSession(sess, gqa=bool(ops.get("GroupQueryAttention")), settings=settings,
                          windows=layer_windows(Path(engine_dir)))


def layer_windows(engine_dir: Path) -> tuple[int | None, ...]:
    """Each layer's attention window, as the engine's model family reads its config (the export's graph keeps a
    windowed layer's last ``window`` positions; its cache holds them)."""
    from edgellm.config import ModelConfig
    from edgellm.models import family_for

    cfg = ModelConfig.load(engine_dir)
    return family_for(cfg).layer_windows(cfg)


def session_settings(num_threads: int | None, *,
                     intra_op_spinning: bool | str = INTRA_OP_SPINNING) -> dict[str, Any]:
    """What ``OrtBackend.open`` sets on an engine's session (benchmarks record it beside their numbers), with
    ``intra_op_spinning``: how spinning was chosen and, for "auto", the host's contention it was chosen from."""
    threads = num_threads or physical_cores()
    choice = choose_spinning(intra_op_spinning, threads)
    return {
        # the engine is already optimized offline; re-optimizing at load would only cost time
        "graph_optimization_level": "ORT_DISABLE_ALL",
        "intra_op_num_threads": threads,
        "inter_op_num_threads": 1,
        "execution_mode": "ORT_SEQUENTIAL",
        "config_entries": {"session.intra_op.allow_spinning": "1" if choice.spinning else "0"},
        "intra_op_spinning": choice.as_dict(),
    }


def session_options(settings: dict[str, Any]) -> Any:
    """ONNX Runtime SessionOptions from ``session_settings``."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, settings["graph_optimization_level"])
    so.intra_op_num_threads = settings["intra_op_num_threads"]
    so.inter_op_num_threads = settings["inter_op_num_threads"]
    so.execution_mode = getattr(ort.ExecutionMode, settings["execution_mode"])
    for key, value in settings["config_entries"].items():
        so.add_session_config_entry(key, value)
    return so


def graph_summary(model_path: Path) -> dict[str, Any]:
    """What the built graph really holds: weight bytes per dtype, op counts, and the precision they imply."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    weight_bytes: Counter[str] = Counter()
    for init in model.graph.initializer:
        numel = int(np.prod(init.dims)) if init.dims else 1
        if len(init.dims) < 2:
            continue  # norms, biases, constants: weights are the matrices
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        weight_bytes[str(np.dtype(dtype))] += numel * np.dtype(dtype).itemsize
    ops = Counter(n.op_type for n in model.graph.node)
    float_types = {"float16": "fp16", "float32": "fp32", "bfloat16": "bf16"}
    floats = {float_types[k]: v for k, v in weight_bytes.items() if k in float_types}
    precision = max(floats, key=lambda k: floats[k]) if floats else "unknown"
    return {"precision": precision, "weight_bytes": dict(weight_bytes), "op_counts": dict(sorted(ops.items())),
            "quantized_gemms": quantized_gemms(model)}


def quantized_gemms(model: Any) -> dict[str, int]:
    """Quantized GEMMs of a graph by kind (``edgellm.quant.GemmKind``), read from its nodes: int4
    MatMulNBits, int8 integer MatMuls, and MatMuls fed by a DequantizeLinear of float8 weights (emulated fp8).
    One per linear: a GEMM the export fused from several linears of one input (its output split on the last axis,
    after the fused bias Add if any) counts as the linears its Split gives back."""
    import onnx

    readers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for name in n.input:
            readers.setdefault(name, []).append(n)

    def linears(n: Any) -> int:
        out = readers.get(n.output[0], [])
        if len(out) == 1 and out[0].op_type == "Add":
            out = readers.get(out[0].output[0], [])
        return len(out[0].output) if len(out) == 1 and out[0].op_type == "Split" else 1

    from edgellm.quant import GemmKind

    fp8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E4M3FNUZ, onnx.TensorProto.FLOAT8E5M2}
    fp8_weights = {i.name for i in model.graph.initializer if i.data_type in fp8}
    fp8_weights |= {i.name for i in model.graph.input if i.type.tensor_type.elem_type in fp8}
    dequantized = {n.output[0] for n in model.graph.node
                   if n.op_type == "DequantizeLinear" and n.input[0] in fp8_weights}
    counts: Counter[str] = Counter()
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":  # 4 bits (the checkpoint's int4), or 8 (an LM head quantized at export)
            bits = next((a.i for a in n.attribute if a.name == "bits"), 4)
            counts[(GemmKind.INT8 if bits == 8 else GemmKind.INT4).value] += 1
        elif n.op_type in INT8_GEMMS:
            counts[GemmKind.INT8.value] += linears(n)
        elif n.op_type in ("MatMul", "Gemm") and any(i in dequantized for i in n.input):
            counts[GemmKind.FP8_EMULATED.value] += 1
    return dict(counts)


def _weights_as_inputs(onnx_model: Path) -> tuple[Any, dict[str, Any], Path]:
    """The export's graph with its external weight matrices turned into graph inputs (so ORT optimizes the graph
    without loading or re-serializing gigabytes, and cannot alter them), those initializers keyed by name (to be
    put back, pointing into the engine's copy of the data file), and that data file. Smaller external tensors
    (norm weights) are loaded inline and left to the optimizer."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor

    model = onnx.load(str(onnx_model), load_external_data=False)
    weights: dict[str, Any] = {}
    locations: set[str] = set()
    keep = []
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            keep.append(t)
        elif len(t.dims) >= 2:
            weights[t.name] = t
            locations.add(_external(t)["location"])
        else:
            load_external_data_for_tensor(t, str(onnx_model.parent))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]
            keep.append(t)
    if len(locations) > 1:
        raise ConfigurationError(f"{onnx_model}: weights in several data files ({', '.join(sorted(locations))}); "
                                 f"the export writes one")
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    for t in weights.values():
        model.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        _set_external(t, ENGINE_DATA, int(_external(t).get("offset", 0)), int(_external(t)["length"]))
    data_file = onnx_model.parent / (locations.pop() if locations else ENGINE_DATA)
    return model, weights, data_file


def _external(t: Any) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _set_external(t: Any, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)
