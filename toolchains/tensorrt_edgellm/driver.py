"""The ``tensorrt-edgellm`` toolchain as the farm drives it: the pinned version's environment under the data dir,
its quantizer (the farm's one quantizer: every consumer of a quantized precision takes its checkpoint) and its ONNX
exporter on the orchestrating host. Its device stages (``llm_build``/``llm_inference``/``llm_bench`` on a TensorRT
device, argument lists in ``device``) are not driven yet, so the plan keeps jobs that need them skipped.

``make nightly`` and ``edgefarm run`` install the pinned version on first use (:func:`ensure_installed`); when that
fails (e.g. the package registry is unreachable) the reason is remembered for this process, and every row that
needs the toolchain is skipped with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from edgellm.errors import BugError, EdgeLLMError, UnsupportedError
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision, QuantMethod
from toolchains.base import Availability, Toolchain, ToolchainDriver, register_toolchain
from toolchains.tensorrt_edgellm import DEFAULT_VERSION, TOOLCHAIN
from toolchains.tensorrt_edgellm.env import (
    CONSOLE_SCRIPTS,
    env_dir,
    install,
    installed_version,
    script,
    toolchains_root,
)
from toolchains.tensorrt_edgellm.quantize import LM_HEAD_METHODS, METHODS

log = logging.getLogger(__name__)

PINNED_VERSION = DEFAULT_VERSION
INSTALL_COMMAND = f"edgefarm toolchains install {TOOLCHAIN}=={PINNED_VERSION}"
DEVICE_STAGES_PROBLEM = (f"toolchain {TOOLCHAIN} runs quantize and export on the host only: its device stages "
                         f"(llm_build, llm_inference, llm_bench on a TensorRT device) are not driven by the farm yet")
_FLOAT_HEADS = frozenset({LMHeadPrecision.FP16})  # the head the exporter writes when the quantizer leaves it alone
_install_failures: dict[Path, str] = {}  # env dir -> why installing it failed in this process
_install_lock = threading.Lock()
_assumed = threading.local()  # planning "what if it were installed" (see assume_installed)


def pinned_env(farm_data_dir: Path) -> Path:
    """The pinned version's environment: ``<data dir>/toolchains/tensorrt-edgellm-<version>``."""
    return env_dir(toolchains_root(farm_data_dir), PINNED_VERSION)


def env_problem(env: Path) -> str | None:
    """Why ``env`` is not a usable install of the pinned version (fast: metadata and files, no imports), or None.
    The reason names no absolute path (it lands in published pages)."""
    if getattr(_assumed, "on", False):
        return None
    try:
        version = installed_version(env)
    except EdgeLLMError:
        failure = _install_failures.get(env)
        if failure is not None:
            return f"{TOOLCHAIN} {PINNED_VERSION} could not be installed: {failure}"
        return f"{TOOLCHAIN} {PINNED_VERSION} is not installed in the farm's data dir (run: {INSTALL_COMMAND})"
    if version != PINNED_VERSION:
        return f"the {TOOLCHAIN} environment holds version {version}, not {PINNED_VERSION} (run: {INSTALL_COMMAND})"
    missing = [name for name in CONSOLE_SCRIPTS if not script(env, name).is_file()]
    if missing:
        return f"the {TOOLCHAIN} {PINNED_VERSION} environment lacks {', '.join(missing)} (run: {INSTALL_COMMAND})"
    return None


@contextmanager
def assume_installed() -> Iterator[None]:
    """In this thread, answer as if the pinned version were installed (to plan what installing it would run)."""
    _assumed.on = True
    try:
        yield
    finally:
        _assumed.on = False


def ensure_installed(farm_data_dir: Path) -> str | None:
    """Install the pinned version under the data dir unless it is there (one-time, a few minutes). Returns None
    when it is usable, else why not (also remembered, so the plan skips the rows that need it with that reason)."""
    env = pinned_env(farm_data_dir)
    with _install_lock:
        if env_problem(env) is None:
            return None
        log.warning("installing %s %s (one-time, a few minutes): %s", TOOLCHAIN, PINNED_VERSION, INSTALL_COMMAND)
        try:
            install(env.parent, PINNED_VERSION)
        except EdgeLLMError as exc:
            reason = str(exc).splitlines()[0].replace(str(env.parent), "<data dir>/toolchains")
            _install_failures[env] = reason
            log.warning("%s %s not installed: %s", TOOLCHAIN, PINNED_VERSION, reason)
            return env_problem(env)
        _install_failures.pop(env, None)
        return env_problem(env)


def quantizer_lm_head(lm_head: LMHeadPrecision | None) -> QuantMethod | None:
    """The quantizer's ``--lm_head_quantization`` for an LM-head precision a test asks for (None: left alone)."""
    if lm_head is None or lm_head in _FLOAT_HEADS:
        return None
    return QuantMethod(lm_head.value)


def quantizer_kv_cache(kv_cache: KVCachePrecision | None) -> str | None:
    """The quantizer's ``--kv_cache_quantization`` for a KV-cache precision a test asks for (None: fp16)."""
    return "fp8" if kv_cache is KVCachePrecision.FP8 else None


@register_toolchain
class TensorrtEdgellm(ToolchainDriver):
    name = Toolchain.TENSORRT_EDGELLM

    def env_path(self) -> Path:
        if self.data_dir is None:
            raise BugError(f"toolchain {self.name}: its environment was asked for without the farm's data dir")
        return pinned_env(self.data_dir)

    def quantizes(self) -> tuple[Precision, ...]:
        return tuple(Precision(m.value) for m in METHODS)

    def precisions(self) -> tuple[Precision, ...]:
        return (Precision.FP16, *self.quantizes())

    def variant_problem(self, precision: Precision, lm_head: LMHeadPrecision | None,
                        kv_cache: KVCachePrecision | None) -> str | None:
        quantized = precision is not Precision.FP16
        heads = {h for h in LMHeadPrecision if h.value in {m.value for m in LM_HEAD_METHODS}}
        if lm_head is not None and lm_head not in _FLOAT_HEADS:
            if lm_head not in heads:
                return (f"toolchain {self.name}: LM-head precision {lm_head.value!r} is not offered by its quantizer; "
                        f"valid: {', '.join(sorted(h.value for h in heads | _FLOAT_HEADS))}")
            if not quantized:
                return f"toolchain {self.name}: a {lm_head.value} LM head needs a quantized precision (not fp16)"
        if kv_cache not in (None, KVCachePrecision.FP16, KVCachePrecision.FP8):
            return f"toolchain {self.name}: KV-cache precision {kv_cache.value!r} is not offered; valid: fp16, fp8"
        if kv_cache is KVCachePrecision.FP8 and not quantized:
            return f"toolchain {self.name}: an fp8 KV cache needs a quantized precision (not fp16)"
        return None

    def available(self) -> Availability:
        problem = env_problem(self.env_path())
        return Availability(problem is None, problem)

    def version(self, env: Mapping[str, Any]) -> str:
        packages = env.get("packages") or {}
        found = packages.get(TOOLCHAIN) if isinstance(packages, Mapping) else None
        return str(found) if found else "unknown"

    def host_version(self) -> str:
        return installed_version(self.env_path())

    def device_problem(self) -> str | None:
        return DEVICE_STAGES_PROBLEM

    def build_command(self, interpreter: str, onnx_dir: str, engine_dir: str,
                      params: Mapping[str, int]) -> list[str]:
        raise UnsupportedError(DEVICE_STAGES_PROBLEM)
