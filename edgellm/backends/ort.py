"""ONNX Runtime (CPU) backend: the engine is the offline-optimized graph ORT writes for this machine's CPU.

Weights the optimizer leaves unchanged are not re-serialized: the engine's ``model.onnx.data`` is an in-kernel copy
of the export's data file (so its digest is known), and only new or changed initializers go to ``model.engine.data``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.backends.base import BuildParams, EngineBackend, Session, TensorSpec, register_backend
from edgellm.errors import ConfigurationError
from edgellm.types import Backend

ENGINE_MODEL = "model.onnx"
ENGINE_DATA = "model.onnx.data"  # the export's weights, copied as they are
OWNED_DATA = "model.engine.data"  # initializers the optimizer created or changed
ALIGN = 4096
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
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", ENGINE_DATA)
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        so.intra_op_num_threads = physical_cores()
        # ORT rewrites every weight with the optimized graph; it goes to memory-backed scratch, and the weights the
        # optimizer left unchanged are then taken from the export's data file (already hashed), not from that copy.
        with tempfile.TemporaryDirectory(prefix="edgellm-ort-", dir=_scratch_root(onnx_model)) as tmp:
            so.optimized_model_filepath = str(Path(tmp) / ENGINE_MODEL)
            try:
                sess = ort.InferenceSession(str(onnx_model), so, providers=["CPUExecutionProvider"])
            except Exception as exc:  # ORT raises its own exception types for bad graphs
                raise ConfigurationError(f"{onnx_model}: ONNX Runtime cannot load the exported graph ({exc})") from None
            io = {"inputs": _specs(sess.get_inputs()), "outputs": _specs(sess.get_outputs())}
            del sess
            weights = reuse_export_weights(Path(tmp) / ENGINE_MODEL, onnx_model, out_dir)
        built = graph_summary(out_dir / ENGINE_MODEL)
        return {
            "engine_files": sorted(p.name for p in out_dir.iterdir() if p.is_file()),
            "io": {k: [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape)} for s in v] for k, v in io.items()},
            "precision": built["precision"],
            "graph": built,
            "reused_files": weights.pop("reused_files"),
            "options": {"graph_optimization_level": OPT_LEVEL, "providers": ["CPUExecutionProvider"],
                        "optimized_for": "this CPU's ONNX Runtime CPU execution provider", "weights": weights},
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


def _scratch_root(onnx_model: Path) -> str | None:
    """/dev/shm when it has room for the optimized copy of the weights, else the system temp dir."""
    need = sum(p.stat().st_size for p in onnx_model.parent.glob(f"{onnx_model.name}*")) * 1.2
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > need:
        return str(shm)
    return None


def reuse_export_weights(optimized: Path, exported: Path, out_dir: Path) -> dict[str, Any]:
    """Write ``out_dir/model.onnx`` from ORT's ``optimized`` graph: an external initializer byte-identical to the
    export's (same name, dtype, shape, bytes) points into the export's data file, copied whole as
    ``out_dir/model.onnx.data`` (its sha256 is the export's); the others go to ``model.engine.data``."""
    import onnx

    opt = onnx.load(str(optimized), load_external_data=False)
    exp = onnx.load(str(exported), load_external_data=False)
    src = {t.name: t for t in exp.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    src_file = exported.parent / _external(next(iter(src.values())))["location"] if src else None
    opt_files: dict[str, np.memmap] = {}
    src_map = np.memmap(src_file, dtype=np.uint8, mode="r") if src_file else None
    reused = owned = 0
    owned_path = out_dir / OWNED_DATA
    with open(owned_path, "wb") as f:
        for t in opt.graph.initializer:
            if t.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = _external(t)
            loc = info["location"]
            if loc not in opt_files:
                opt_files[loc] = np.memmap(optimized.parent / loc, dtype=np.uint8, mode="r")
            off, n = int(info.get("offset", 0)), int(info["length"])
            data = opt_files[loc][off:off + n]
            s = src.get(t.name)
            if s is not None and src_map is not None and s.data_type == t.data_type and list(s.dims) == list(
                    t.dims):
                s_info = _external(s)
                s_off, s_n = int(s_info.get("offset", 0)), int(s_info["length"])
                if s_n == n and np.array_equal(src_map[s_off:s_off + s_n], data):
                    _set_external(t, ENGINE_DATA, s_off, n)
                    reused += n
                    continue
            pad = -f.tell() % ALIGN
            f.write(b"\0" * pad)
            _set_external(t, OWNED_DATA, f.tell(), n)
            f.write(memoryview(data))
            owned += n
    del opt_files, src_map
    reused_files: dict[str, str] = {}
    link = "none"
    if reused and src_file is not None:
        # A copy (in-kernel), not a hard link: onnx.checker / onnx.load refuse external data with several links.
        shutil.copyfile(src_file, out_dir / ENGINE_DATA)
        link = "copy"
        reused_files[ENGINE_DATA] = src_file.name
    if not owned:
        owned_path.unlink()
    (out_dir / ENGINE_MODEL).write_bytes(opt.SerializeToString())
    return {"export_bytes_reused": reused, "engine_owned_bytes": owned, "export_data": link,
            "reused_files": reused_files}


def _external(t: Any) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def _set_external(t: Any, location: str, offset: int, length: int) -> None:
    del t.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        t.external_data.add(key=k, value=v)
