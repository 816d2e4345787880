"""torch-CUDA backend: the engine is the export's weights plus a table saying which parameter each stored tensor
holds; the session (``session.py``: CUDA graphs, sampling on the GPU) runs them through ``decoder.py`` on an NVIDIA
GPU.

The export stays the single source of the weights: ``model.onnx.data`` is copied unchanged (its digest is the
export's, already verified) and ``torch_cuda_weights.json`` maps every external initializer of the exported graph back
to the Hugging Face parameters it holds (the export stores linear weights as the checkpoint does, ``[out, in]``, and
fuses q/k/v and gate/up along the output axis; a stored name ending in ``.T`` is ``[in, out]``). The mapping is
checked against the model family's expected parameters and shapes, at build and again at open, so a graph this runtime
does not understand fails the build by name.

Precisions are the export's (fp32, fp16, bf16: the runtime computes in the dtype the table's weights hold, read
back at build into the manifest and checked against it at open); quantized exports are refused by the build with
the reason (``refused``).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from edgellm.backends.base import BuildParams, EngineBackend, Session, register_backend
from edgellm.compiler.export import input_names, output_names
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import BugError, ConfigurationError, UnsupportedError
from edgellm.models import family_for
from edgellm.quant import exported
from edgellm.types import Precision

ENGINE_DATA = "model.onnx.data"  # the export's weights, copied as they are
WEIGHT_TABLE = "torch_cuda_weights.json"
# ONNX TensorProto data types the table accepts, by their numeric code
ONNX_DTYPES = {1: "float32", 10: "float16", 16: "bfloat16"}
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def cuda_unavailable_reason() -> str | None:
    """None when torch sees a CUDA GPU; else one line saying what is missing."""
    try:
        import torch
    except ModuleNotFoundError:
        return "needs torch with CUDA; torch is not installed"
    if torch.version.cuda is None:
        return f"needs torch built with CUDA and an NVIDIA GPU; torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return f"needs an NVIDIA GPU; torch {torch.__version__} (CUDA {torch.version.cuda}) sees none"
    return None


def gpu_info() -> dict[str, Any] | None:
    """The GPU torch would run on (name, SM, memory), or None without one."""
    if cuda_unavailable_reason() is not None:
        return None
    import torch

    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "sm": f"{props.major}.{props.minor}", "count": torch.cuda.device_count(),
            "memory_bytes": int(props.total_memory), "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda}


# The quantized exports hold ONNX Runtime's integer / Q-DQ graphs; torch has kernels of the kind (int4
# ``_weight_int4pack_mm``, int8 ``_int_mm``, fp8 ``_scaled_mm``) but this runtime wires none of them in, and running
# the weights dequantized would be a float engine under a quantized name.
_NO_QUANTIZED_GEMM = ("the torch-cuda runtime has no {kind} GEMM (the weights would have to run dequantized, a "
                      "float engine under a quantized name); build this export with --backend ort, or export the "
                      "float checkpoint at bf16/fp16 for torch-cuda")


@register_backend
class TorchCudaBackend(EngineBackend):
    backend = "torch-cuda"
    precisions = (Precision.FP32, Precision.FP16, Precision.BF16)
    refused: ClassVar[Mapping[Precision, str]] = {  # every quantized precision export makes (edgellm/quant)
        Precision(m.name): _NO_QUANTIZED_GEMM.format(kind=m.gemm_label()) for m in exported()}
    device = "cuda"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return cuda_unavailable_reason()

    def version(self) -> str:
        import torch

        return f"{torch.__version__}+cuda{torch.version.cuda}"

    def build(self, onnx_model: Path, out_dir: Path, params: BuildParams) -> dict[str, Any]:
        cfg = ModelConfig.load(onnx_model.parent)
        table, data_file = weight_table(onnx_model, cfg)
        shutil.copyfile(data_file, out_dir / ENGINE_DATA)  # in-kernel copy; the digest is the export's
        write_table(out_dir / WEIGHT_TABLE, table)
        precision, weight_bytes = table_precision(table)  # what the runtime will load, read back from the table
        kv = precision_dtype(precision)
        L = cfg.num_hidden_layers
        kv_shape = ["batch", cfg.num_key_value_heads, "past", cfg.head_dim]
        inputs = [{"name": n, "dtype": "int64", "shape": ["batch", "seq"]} for n in input_names(L)[:3]]
        inputs += [{"name": n, "dtype": kv, "shape": kv_shape} for n in input_names(L)[3:-1]]
        inputs.append({"name": input_names(L)[-1], "dtype": "int64", "shape": ["logits_len"]})  # logits_positions
        outputs = [{"name": "logits", "dtype": "float32", "shape": ["batch", "logits_len", cfg.vocab_size]}]
        outputs += [{"name": n, "dtype": kv, "shape": kv_shape} for n in output_names(L)[1:]]
        from edgellm.backends.torch_cuda.session import COMPILE_DECODE

        return {
            "engine_files": sorted(p.name for p in out_dir.iterdir() if p.is_file()),
            "io": {"inputs": inputs, "outputs": outputs},
            "precision": precision,
            "graph": {"precision": precision, "weight_bytes": weight_bytes, "stored_tensors": len(table),
                      "parameters": sum(len(t["members"]) for t in table)},
            "reused_files": {ENGINE_DATA: data_file.name},
            "options": {"device": "cuda", "weights": "export data file, mapped by " + WEIGHT_TABLE,
                        "kv_cache": "preallocated [max_batch_size, kv_heads, max_seq_len, head_dim] per layer "
                                    "([..., window, ...], a ring, per sliding-window layer)",
                        "prefill": "fused kernels (Triton) + cuBLAS GEMMs, attention by scaled_dot_product_attention",
                        "decode": "one CUDA graph per batch size: fused kernels (Triton) + cuBLAS GEMMs, the "
                                  "greedy/sampling choice inside",
                        "torch_compile_decode": COMPILE_DECODE},
        }

    def open(self, engine_dir: Path, manifest: dict[str, Any], *, num_threads: int | None = None) -> Session:
        from edgellm.backends.torch_cuda.session import TorchCudaSession

        engine_dir = Path(engine_dir)
        cfg = ModelConfig.load(engine_dir)
        table = read_table(engine_dir / WEIGHT_TABLE)
        check_table(table, cfg)
        check_precision(table, manifest, engine_dir)
        params = manifest["build_params"]
        session = TorchCudaSession(engine_dir / ENGINE_DATA, table, cfg, io=manifest["io"],
                                   max_batch_size=int(params["max_batch_size"]),
                                   max_seq_len=int(params["max_seq_len"]),
                                   compile_decode=bool(manifest["backend_options"].get("torch_compile_decode")))
        loaded = PRECISIONS[str(session.model.dtype).removeprefix("torch.")]
        if loaded != manifest["precision"]:
            raise BugError(f"{engine_dir}: the session computes in {loaded}, the engine is {manifest['precision']}")
        return session


def precision_dtype(precision: str) -> str:
    return {v: k for k, v in PRECISIONS.items()}.get(precision, "float32")


def table_precision(table: list[dict[str, Any]]) -> tuple[str, dict[str, int]]:
    """The precision the runtime loads (the dtype of most bytes of the weight matrices; it computes in the
    embedding's, which the export casts with them) and the matrices' bytes per dtype."""
    weight_bytes: Counter[str] = Counter()
    for t in table:
        if len(t["shape"]) >= 2:
            weight_bytes[t["dtype"]] += int(t["length"])
    precision = PRECISIONS[max(weight_bytes, key=lambda k: weight_bytes[k])] if weight_bytes else "unknown"
    return precision, dict(weight_bytes)


def check_precision(table: list[dict[str, Any]], manifest: dict[str, Any], engine_dir: Path) -> None:
    """An engine whose weights are not at the precision its manifest states is refused (never run as another)."""
    held, _ = table_precision(table)
    if held != manifest.get("precision"):
        raise ConfigurationError(f"{engine_dir}: the manifest states precision {manifest.get('precision')!r} but "
                                 f"{WEIGHT_TABLE} holds {held} weights; rebuild the engine")


# --- the weight table -----------------------------------------------------------------------------------------

def weight_table(onnx_model: Path, cfg: ModelConfig) -> tuple[list[dict[str, Any]], Path]:
    """Every external initializer of the export as ``{name, offset, length, shape, dtype, transposed, members}``,
    ``members`` being the HF parameters it holds, in order along the output axis (``[{param, shape}]``). Raises
    ConfigurationError naming each tensor it cannot map, and each expected parameter no tensor holds."""
    import onnx

    model = onnx.load(str(onnx_model), load_external_data=False)
    table: list[dict[str, Any]] = []
    locations: set[str] = set()
    problems: list[str] = []
    expected = family_for(cfg).expected_parameters(cfg)
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue  # split sizes and other graph constants: the runtime computes its own
        ext = {e.key: e.value for e in t.external_data}
        locations.add(ext["location"])
        if t.data_type not in ONNX_DTYPES:
            problems.append(f"tensor {t.name!r} has ONNX data type {t.data_type}; supported: "
                            f"{', '.join(ONNX_DTYPES.values())}")
            continue
        members = _members(t.name, expected)
        if members is None:
            problems.append(f"tensor {t.name!r} maps to no parameter of the {cfg.model_type} family")
            continue
        table.append({"name": t.name, "offset": int(ext.get("offset", 0)), "length": int(ext["length"]),
                      "shape": list(t.dims), "dtype": ONNX_DTYPES[t.data_type],
                      "transposed": t.name.endswith(".T"),
                      "members": [{"param": m, "shape": list(expected[m])} for m in members]})
    if len(locations) > 1:
        problems.append(f"weights in several data files ({', '.join(sorted(locations))}); the export writes one")
    if problems:
        raise UnsupportedError(f"{onnx_model}: the torch-cuda backend cannot map the export's weights: "
                               + "; ".join(problems))
    check_table(table, cfg, where=str(onnx_model))
    return table, onnx_model.parent / (locations.pop() if locations else ENGINE_DATA)


def _members(stored: str, expected: dict[str, tuple[int, ...]]) -> list[str] | None:
    """The parameters a stored tensor holds: ``a.q_proj.weight.T`` -> [a.q_proj.weight];
    ``a.q_proj+k_proj+v_proj.weight.T`` (the export's fused name) -> [a.q_proj.weight, a.k_proj.weight, ...]."""
    name = stored.removesuffix(".T")
    if "+" not in name:
        return [name] if name in expected else None
    parts = name.split("+")
    first, last = parts[0], parts[-1]
    found = []
    for i in range(1, len(first)):  # head = first[:i] (ends at a dot), tail = last[j:] (starts at a dot)
        if first[i - 1] != ".":
            continue
        for j in range(len(last)):
            if last[j] != ".":
                continue
            head, tail = first[:i], last[j:]
            names = [head + first[i:] + tail, *(head + p + tail for p in parts[1:-1]), head + last[:j] + tail]
            if all(n in expected for n in names):
                found.append(names)
    return found[0] if len(found) == 1 else None


def check_table(table: list[dict[str, Any]], cfg: ModelConfig, *, where: str = WEIGHT_TABLE) -> None:
    """Each stored shape equals its members' shapes joined (transposed when stored so); every expected parameter
    is held exactly once."""
    expected = family_for(cfg).expected_parameters(cfg)
    held: Counter[str] = Counter()
    problems = []
    for t in table:
        shapes = [tuple(m["shape"]) for m in t["members"]]
        for m in t["members"]:
            held[m["param"]] += 1
            if tuple(m["shape"]) != expected.get(m["param"]):
                problems.append(f"{m['param']}: shape {m['shape']} but the config gives {expected.get(m['param'])}")
        if len(shapes[0]) == 2:
            out_dim = sum(s[0] for s in shapes)
            want = [shapes[0][1], out_dim] if t["transposed"] else [out_dim, shapes[0][1]]
        else:
            want = [sum(s[0] for s in shapes)]
        if list(t["shape"]) != want:
            problems.append(f"tensor {t['name']!r} has shape {t['shape']}, expected {want} for its parameters")
        itemsize = 4 if t["dtype"] == "float32" else 2
        numel = 1
        for d in t["shape"]:
            numel *= int(d)
        if int(t["length"]) != numel * itemsize:
            problems.append(f"tensor {t['name']!r}: {t['length']} bytes stored, {numel * itemsize} expected")
    missing = sorted(set(expected) - set(held))
    twice = sorted(n for n, c in held.items() if c > 1)
    if missing:
        problems.append(f"no stored tensor holds {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
    if twice:
        problems.append(f"held more than once: {', '.join(twice[:5])}")
    if problems:
        raise ConfigurationError(f"{where}: weights do not match the model config: " + "; ".join(problems))


def write_table(path: Path, table: list[dict[str, Any]]) -> None:
    from edgellm.compiler.files import write_json

    write_json(path, {"format": "edgellm-torch-cuda-weights/1", "data_file": ENGINE_DATA, "tensors": table})


def read_table(path: Path) -> list[dict[str, Any]]:
    data = read_json_object(path, what=WEIGHT_TABLE, max_bytes=64 * 1024 * 1024)
    tensors = data.get("tensors")
    if data.get("format") != "edgellm-torch-cuda-weights/1" or not isinstance(tensors, list) or not tensors:
        raise ConfigurationError(f"{path}: not a torch-cuda weight table (format edgellm-torch-cuda-weights/1 "
                                 f"with a non-empty 'tensors' list)")
    return tensors
