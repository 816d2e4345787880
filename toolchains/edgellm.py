"""The toolchains made of this library: ``edgellm`` exports on the host, ``edgellm build --backend B`` builds on the
device, ``edgellm infer|eval|bench`` run there. One class per backend; what each can produce is the library's
own answer (edgellm/capabilities.py: its export precisions and variants, and the backend's declaration), never a
list kept here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from edgellm.backends.base import registered_backends
from edgellm.capabilities import buildable
from edgellm.compiler.export import check_variant, quantized_export_precisions
from edgellm.errors import UnsupportedError
from edgellm.types import Backend, KVCachePrecision, LMHeadPrecision, Precision
from toolchains.base import Availability, Toolchain, ToolchainDriver, register_toolchain


class EdgellmToolchain(ToolchainDriver):
    backend: ClassVar[str]  # the `edgellm build --backend` value
    package: ClassVar[str]  # the Python distribution whose version is the backend's (`edgellm env` packages)

    def precisions(self) -> tuple[Precision, ...]:
        """From a float checkpoint: what export and the backend both make; from a checkpoint the farm's quantizer
        made: the quantized precisions export reads and the backend builds (toolchains.base checks the quantizer)."""
        if self.backend not in {b.value for b in Backend}:
            return ()
        backend = registered_backends().get(self.backend)
        built = set(backend.precisions) if backend is not None else set()
        return (*buildable(self.backend), *(p for p in quantized_export_precisions() if p in built))

    def variant_problem(self, precision: Precision, lm_head: LMHeadPrecision | None,
                        kv_cache: KVCachePrecision | None) -> str | None:
        try:
            check_variant(precision, lm_head, kv_cache)
        except UnsupportedError as exc:
            return f"toolchain {self.name}: {exc}"
        return None

    def available(self) -> Availability:
        if self.backend not in {b.value for b in Backend}:
            return Availability(False, f"this edgellm has no {self.backend} backend")
        return Availability(True)

    def version(self, env: Mapping[str, Any]) -> str:
        packages = env.get("packages") or {}
        backend = packages.get(self.package) if isinstance(packages, Mapping) else None
        return f"{env.get('edgellm')}+{self.package}-{backend}"

    def build_command(self, interpreter: str, onnx_dir: str, engine_dir: str,
                      params: Mapping[str, int]) -> list[str]:
        return [interpreter, "-m", "edgellm", "build", onnx_dir, engine_dir, "--backend", self.backend,
                "--max-batch-size", str(params["max_batch_size"]), "--max-input-len", str(params["max_input_len"]),
                "--max-seq-len", str(params["max_seq_len"])]


@register_toolchain
class EdgellmOrt(EdgellmToolchain):
    name = Toolchain.EDGELLM_ORT
    backend = "ort"
    package = "onnxruntime"


@register_toolchain
class EdgellmTorchCuda(EdgellmToolchain):
    name = Toolchain.EDGELLM_TORCH_CUDA
    backend = "torch-cuda"
    package = "torch"
