"""ONNX Runtime (CPU) backend: the engine is the offline-optimized graph ORT writes for this machine's CPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.backends.base import BuildParams, EngineBackend, Session, TensorSpec, register_backend
from edgellm.errors import ConfigurationError
from edgellm.types import Backend

ENGINE_MODEL = "model.onnx"
ENGINE_DATA = "model.onnx.data"
# EXTENDED: fusions valid for any CPU ORT build; ALL would add layout ops tied to this CPU's instruction set.
OPT_LEVEL = "ORT_ENABLE_EXTENDED"

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
              "tensor(int32)": "int32", "tensor(bfloat16)": "bfloat16"}


def physical_cores() -> int:
    import psutil

    return psutil.cpu_count(logical=False) or psutil.cpu_count() or 1


def _specs(args: list[Any]) -> list[TensorSpec]:
    return [TensorSpec(a.name, _ORT_TYPES.get(a.type, a.type), tuple(a.shape)) for a in args]


class OrtSession(Session):
    def __init__(self, sess: Any) -> None:
        self.sess = sess
        self.inputs = _specs(sess.get_inputs())
        self.outputs = _specs(sess.get_outputs())
        self._out_names = [o.name for o in self.outputs]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self._out_names, self.sess.run(self._out_names, feeds), strict=True))


@register_backend
class OrtBackend(EngineBackend):
    backend = Backend.ORT

    def version(self) -> str:
        import onnxruntime

        return onnxruntime.__version__

    def build(self, onnx_model: Path, out_dir: Path, params: BuildParams) -> dict[str, Any]:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVEL)
        so.optimized_model_filepath = str(out_dir / ENGINE_MODEL)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", ENGINE_DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.intra_op_num_threads = physical_cores()
        try:
            sess = ort.InferenceSession(str(onnx_model), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # ORT raises its own exception types for bad graphs
            raise ConfigurationError(f"{onnx_model}: ONNX Runtime cannot load the exported graph ({exc})") from None
        io = {"inputs": _specs(sess.get_inputs()), "outputs": _specs(sess.get_outputs())}
        del sess
        built = graph_summary(out_dir / ENGINE_MODEL)
        return {
            "engine_files": sorted(p.name for p in out_dir.iterdir() if p.is_file()),
            "io": {k: [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in v] for k, v in io.items()},
            "precision": built["precision"],
            "graph": built,
            "options": {"graph_optimization_level": OPT_LEVEL, "providers": ["CPUExecutionProvider"],
                        "optimized_for": "this CPU's ONNX Runtime CPU execution provider"},
        }

    def open(self, engine_dir: Path, manifest: dict[str, Any], *, num_threads: int | None = None) -> Session:
        import onnxruntime as ort

        so = ort.SessionOptions()
        # The engine is already optimized offline; re-optimizing at load would only cost time.
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = num_threads or physical_cores()
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        path = Path(engine_dir) / ENGINE_MODEL
        try:
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ConfigurationError(f"{path}: ONNX Runtime cannot load the engine ({exc})") from None
        return OrtSession(sess)


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
    return {"precision": precision, "weight_bytes": dict(weight_bytes), "op_counts": dict(sorted(ops.items()))}
