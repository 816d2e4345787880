"""The device side of TensorRT Edge-LLM: argument lists, environments and file translations for its C++ tools.

On a TensorRT device the toolchain is a CMake build of TensorRT-Edge-LLM (tools under ``<build>/examples/llm/``):
``llm_build --onnxDir D --engineDir E --maxBatchSize N --maxInputLen N --maxKVCacheCapacity N``;
``llm_inference --engineDir E --inputFile I --outputFile O [--checkpointDir C --warmup N --maxGenerateLength N]``;
``llm_bench --engineDir E --mode prefill|decode (--inputLen N | --pastKVLen N) --iterations N --warmup N
[--batchSize N --outputDir D]``. What they write: ``llm_build`` puts ``llm.engine`` and ``config.json`` (the export's
runtime config plus a ``builder_config`` block with the limits it built for, snake_case) into the engine dir;
``llm_inference`` writes ``{"responses": [{"output_text", "request_idx" (flat index into the requests), "batch_idx"
(within its batch), "finish_reason", ...}]}``, also when some requests failed (then it exits 1); ``llm_bench
--outputDir D`` writes only ``D/e2e_prefill_inputlen<N>.csv`` / ``D/e2e_decode_pastkvlen<N>.csv`` (header ``mode,
batch_size,osl,e2e_time_ms,per_token_ms,throughput_tps,<input_len|past_kv_len>``, one data row of aggregates; no
per-iteration file). That is the tools' behaviour as read in their source (0.10.0) and run (0.11.0); how their exits
are read: ``exits``. Paths are device paths (POSIX strings).

The checkpoint-direct (ONNX-less) route: where a build's inventory entry names ``direct_builder`` (the
``tensorrt-edgellm-build`` console script of the Edge-LLM Python package installed on the board against its TensorRT,
``experimental/builder/cli.py`` of release 0.11.0), the engine is built from the checkpoint: ``tensorrt-edgellm-build
--model-dir C --engine-dir E --max-input-len N --max-kv-cache-capacity N --max-batch-size N --plugin-path P`` (its
defaults are 32, 96 and 1, so all three limits are always passed; ``--plugin-path`` because its default is the
wheel's bundled payload, else ``build/libNvInfer_edgellm_plugin.so`` relative to the working dir). It is a Python
``argparse`` tool: an unknown flag or a bad number exits 2 with ``<prog>: error: ...`` after the usage; any failure
after that is an uncaught exception (a traceback, exit 1). It writes ``E/llm.engine`` and ``E/config.json`` (the
runtime config with a ``builder_config`` that also holds ``tp_size`` and ``ragged_backend``; weights it leaves in the
checkpoint are listed as ``checkpoint_weight_bindings`` with a ``checkpoint_identity``) and prints ``Engine outputs:``
then ``  llm: <path> (<n> bytes)`` on stdout. It reads the precision from the checkpoint's quantization block
(``hf_quant_config.json``), never from a flag. Serving such an engine needs the checkpoint: ``llm_inference`` and
``llm_bench`` take ``--checkpointDir C`` (without it, and with weight bindings, the runtime stops with "A component
checkpoint directory is required for runtime weight loading").
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgefarm.toolchains.base import ENGINE_LISTING, engine_listing
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.runtime.requests import GenerationRequest
from edgellm.types import BenchMode

TOOLS = ("llm_build", "llm_inference", "llm_bench")
DIRECT_BUILDER = "tensorrt-edgellm-build"  # the ONNX-less builder (a console script of the Python package)
INSTALL_KEYS = ("build_dir", "trt_package_dir", "plugin_path")  # required (one build)
# the C++ build's release (CMakeCache.txt's project version); a test stand-in; the direct builder of that release
OPTIONAL_KEYS = ("version", "standin", "direct_builder")
BUILD_KEYS = ("build_dir", "plugin_path", "direct_builder")  # of each entry of ``builds:`` (build_dir required)
PLUGIN_NAME = "libNvInfer_edgellm_plugin.so"  # written next to the build's tools (cpp/CMakeLists.txt)
ENGINE_FILE = "llm.engine"
# What llm_inference writes as output_text for a request it could not handle.
FAILED_TEXT = "TensorRT Edge LLM cannot handle this request. Fails."
_VERSION = re.compile(r"^\d+\.\d+\.\d+([.+-][0-9A-Za-z.+-]*)?\Z")


@dataclass(frozen=True)
class DeviceInstall:
    """One build of TensorRT Edge-LLM on a device (inventory data): where its tools and plugin are, the TensorRT
    they run with, and the release it was built from."""

    build_dir: PurePosixPath  # the CMake build directory of TensorRT-Edge-LLM
    trt_package_dir: PurePosixPath  # TensorRT's install (lib/ holds libnvinfer)
    plugin_path: PurePosixPath  # the plugin library, found by the tools through EDGELLM_PLUGIN_PATH
    version: str | None = None  # the release the build dir was made from (recorded with every result)
    # True: the tools are a test STAND-IN (they check their arguments, compute nothing): never evidence
    standin: bool = False
    # the release's tensorrt-edgellm-build (absolute): engines are then built from the checkpoint (route direct)
    direct_builder: PurePosixPath | None = None

    @classmethod
    def from_inventory(cls, data: Mapping[str, Any], *, device: str) -> DeviceInstall:
        """The one-build form of the block (``build_dir``, ``trt_package_dir``, ``plugin_path``[, ``version``,
        ``standin``, ``direct_builder``])."""
        builds = DeviceBuilds.from_inventory(data, device=device).builds
        if len(builds) != 1:
            raise ConfigurationError(f"device {device!r}: expected one tensorrt-edgellm build, got {len(builds)}")
        return builds[0]

    def describe(self) -> dict[str, Any]:
        """What a result records of the install (no paths: they reach published pages)."""
        return {"version": self.version, "standin": self.standin}

    def tool(self, name: str) -> str:
        if name == DIRECT_BUILDER and self.direct_builder is not None:
            return str(self.direct_builder)
        if name not in TOOLS:
            valid = (*TOOLS, DIRECT_BUILDER) if self.direct_builder is not None else TOOLS
            raise ConfigurationError(f"unknown TensorRT Edge-LLM tool {name!r} of this build; valid: "
                                     f"{', '.join(valid)}")
        return str(self.build_dir / "examples" / "llm" / name)

    def tools(self) -> dict[str, str]:
        """Every tool of this build the farm runs: the C++ tools, and the direct builder where one is named."""
        names = (*TOOLS, DIRECT_BUILDER) if self.direct_builder is not None else TOOLS
        return {name: self.tool(name) for name in names}

    def lib_dirs(self) -> tuple[str, ...]:
        """Where TensorRT's libraries may be under its package dir (cmake/FindTensorRT.cmake's suffixes)."""
        base = self.trt_package_dir
        return (str(base / "lib"), str(base / "lib64"), str(base / "lib" / "aarch64-linux-gnu"),
                str(base / "lib" / "x86_64-linux-gnu"))

    def env(self, ld_library_path: str | None = None) -> dict[str, str]:
        """Environment for the tools: TensorRT's libraries first on LD_LIBRARY_PATH, the plugin by path."""
        libs = str(self.trt_package_dir / "lib")
        return {"TRT_PACKAGE_DIR": str(self.trt_package_dir), "EDGELLM_PLUGIN_PATH": str(self.plugin_path),
                "LD_LIBRARY_PATH": f"{libs}:{ld_library_path}" if ld_library_path else libs}


@dataclass(frozen=True)
class DeviceBuilds:
    """A device's ``toolchains: {tensorrt-edgellm: {...}}`` block: its builds of TensorRT Edge-LLM, one per release.

    Two forms. One build: ``{build_dir, trt_package_dir, plugin_path, version, standin, direct_builder}``. Several:
    ``{trt_package_dir, standin, builds: {"0.11.0": {build_dir, plugin_path, direct_builder}, "0.10.0": {...}}}``
    (``plugin_path`` defaults to ``<build_dir>/libNvInfer_edgellm_plugin.so``; versions are quoted strings;
    ``direct_builder``, optional, is that release's ``tensorrt-edgellm-build``: its engines are then built from the
    checkpoint). A job runs only on the build of its export's version (:meth:`build`)."""

    builds: tuple[DeviceInstall, ...]
    standin: bool = False

    @classmethod
    def from_inventory(cls, data: Any, *, device: str) -> DeviceBuilds:
        where = f"device {device!r}: toolchains.tensorrt-edgellm"
        valid = (f"{', '.join(INSTALL_KEYS)} (optional: {', '.join(OPTIONAL_KEYS)}), or trt_package_dir, standin "
                 f"and builds: {{VERSION: {{{', '.join(BUILD_KEYS)}}}}}")
        if not isinstance(data, Mapping):
            raise ConfigurationError(f"{where} must be a mapping with {valid}")
        standin = data.get("standin", False)
        if not isinstance(standin, bool):
            raise ConfigurationError(f"{where}.standin must be true or false, got {standin!r}")
        if "builds" in data:
            return cls(_several(data, where, valid, standin), standin)
        missing = [k for k in INSTALL_KEYS if not data.get(k)]
        unknown = sorted(set(data) - set(INSTALL_KEYS) - set(OPTIONAL_KEYS))
        if missing or unknown:
            raise ConfigurationError(
                f"device {device!r}: tensorrt-edgellm install needs {', '.join(INSTALL_KEYS)}"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
                + f" (valid keys: {', '.join(INSTALL_KEYS + OPTIONAL_KEYS)}, or builds:)"
            )
        version = data.get("version")
        if version is not None:
            version = _version(version, f"{where}.version")
        paths = _absolute({k: data[k] for k in (*INSTALL_KEYS, "direct_builder") if data.get(k)}, device)
        return cls((DeviceInstall(**paths, version=version, standin=standin),), standin)

    def build(self, version: str | None) -> DeviceInstall | None:
        """The build of ``version`` (None: the only build, whatever its version), or None."""
        if version is None:
            return self.builds[0] if len(self.builds) == 1 else None
        return next((b for b in self.builds if b.version == version), None)

    def versions(self) -> list[str]:
        return [b.version or "unknown" for b in self.builds]


def _version(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _VERSION.match(value.strip()):
        raise ConfigurationError(f"{where}: {value!r} is not a release like \"0.11.0\" (quote it in YAML: 0.10 "
                                 f"would read as a number)")
    return value.strip()


def _absolute(raw: Mapping[str, Any], device: str) -> dict[str, PurePosixPath]:
    paths = {k: PurePosixPath(str(v)) for k, v in raw.items()}
    relative = [f"{k}={v}" for k, v in paths.items() if not v.is_absolute()]
    if relative:
        raise ConfigurationError(f"device {device!r}: install paths must be absolute: {', '.join(relative)}")
    return paths


def _several(data: Mapping[str, Any], where: str, valid: str, standin: bool) -> tuple[DeviceInstall, ...]:
    device = where.split("'")[1]
    unknown = sorted(set(data) - {"builds", "trt_package_dir", "standin"})
    if unknown or not data.get("trt_package_dir"):
        raise ConfigurationError(f"{where}: with builds: give trt_package_dir and optionally standin"
                                 + (f"; unknown {', '.join(unknown)}" if unknown else "; missing trt_package_dir")
                                 + f" (valid: {valid})")
    builds = data["builds"]
    if not isinstance(builds, Mapping) or not builds:
        raise ConfigurationError(f"{where}.builds must map each release to its build dir, e.g. "
                                 f"{{\"0.11.0\": {{build_dir: /opt/TensorRT-Edge-LLM-0.11.0/build}}}}; got {builds!r}")
    trt_dir = _absolute({"trt_package_dir": data["trt_package_dir"]}, device)["trt_package_dir"]
    out = []
    for raw_version, entry in builds.items():
        version = _version(raw_version, f"{where}.builds")
        if not isinstance(entry, Mapping) or not entry.get("build_dir") or set(entry) - set(BUILD_KEYS):
            raise ConfigurationError(f"{where}.builds.{version}: expected {{build_dir[, plugin_path, "
                                     f"direct_builder]}}, got {entry!r}")
        paths = _absolute({k: entry[k] for k in BUILD_KEYS if k in entry}, device)
        plugin = paths.get("plugin_path", paths["build_dir"] / PLUGIN_NAME)
        out.append(DeviceInstall(paths["build_dir"], trt_dir, plugin, version=version, standin=standin,
                                 direct_builder=paths.get("direct_builder")))
    return tuple(sorted(out, key=lambda b: b.version or ""))


def _positive(**values: int) -> None:
    bad = [f"{k}={v!r}" for k, v in values.items() if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise ConfigurationError(f"engine limits must be integers >= 1: {', '.join(bad)}")


def build_argv(install: DeviceInstall, onnx_dir: str, engine_dir: str, *, max_batch_size: int, max_input_len: int,
               max_kv_cache_capacity: int) -> list[str]:
    """``llm_build`` on the export's ``llm/`` directory (it holds model.onnx and the runtime config.json)."""
    _positive(max_batch_size=max_batch_size, max_input_len=max_input_len, max_kv_cache_capacity=max_kv_cache_capacity)
    if max_input_len > max_kv_cache_capacity:
        raise ConfigurationError(f"max_input_len {max_input_len} exceeds max_kv_cache_capacity "
                                 f"{max_kv_cache_capacity}")
    return [install.tool("llm_build"), "--onnxDir", onnx_dir, "--engineDir", engine_dir,
            "--maxBatchSize", str(max_batch_size), "--maxInputLen", str(max_input_len),
            "--maxKVCacheCapacity", str(max_kv_cache_capacity)]


def direct_build_argv(install: DeviceInstall, model_dir: str, engine_dir: str, *, max_batch_size: int,
                      max_input_len: int, max_kv_cache_capacity: int) -> list[str]:
    """``tensorrt-edgellm-build`` on a checkpoint dir (the route direct; see the module doc): the same limits as
    :func:`build_argv`, the build's plugin by path."""
    if install.direct_builder is None:
        raise ConfigurationError(f"the {install.version or 'unversioned'} build at {install.build_dir} names no "
                                 f"direct_builder (its {DIRECT_BUILDER}); valid: an absolute path in its inventory")
    _positive(max_batch_size=max_batch_size, max_input_len=max_input_len, max_kv_cache_capacity=max_kv_cache_capacity)
    if max_input_len > max_kv_cache_capacity:
        raise ConfigurationError(f"max_input_len {max_input_len} exceeds max_kv_cache_capacity "
                                 f"{max_kv_cache_capacity}")
    return [install.tool(DIRECT_BUILDER), "--model-dir", model_dir, "--engine-dir", engine_dir,
            "--max-input-len", str(max_input_len), "--max-kv-cache-capacity", str(max_kv_cache_capacity),
            "--max-batch-size", str(max_batch_size), "--plugin-path", str(install.plugin_path)]


def with_checkpoint_dir(argv: list[str], checkpoint_dir: str) -> list[str]:
    """An ``llm_inference`` / ``llm_bench`` command line given the checkpoint a direct engine reads its weights
    from (``--checkpointDir``; both tools take it)."""
    if "--checkpointDir" in argv:
        raise ConfigurationError(f"the command line already names a checkpoint dir: {argv!r}")
    return [*argv, "--checkpointDir", checkpoint_dir]


def inference_argv(install: DeviceInstall, engine_dir: str, input_file: str, output_file: str, *,
                   warmup: int = 0) -> list[str]:
    """``llm_inference`` on an engine built from the exported ONNX."""
    argv = [install.tool("llm_inference"), "--engineDir", engine_dir, "--inputFile", input_file,
            "--outputFile", output_file]
    if warmup:
        argv += ["--warmup", str(warmup)]
    return argv


def bench_argv(install: DeviceInstall, engine_dir: str, mode: str | BenchMode, *, input_len: int | None = None,
               past_kv_len: int | None = None, iterations: int = 10, warmup: int = 3, batch_size: int = 1,
               output_dir: str | None = None) -> list[str]:
    """``llm_bench``: prefill needs ``input_len``, decode needs ``past_kv_len``."""
    try:
        parsed = BenchMode(mode)
    except ValueError:
        raise ConfigurationError(f"bad bench mode {mode!r}; valid: {', '.join(m.value for m in BenchMode)}") from None
    _positive(iterations=iterations, batch_size=batch_size)
    prefill = parsed is BenchMode.PREFILL
    length_flag, length = ("--inputLen", input_len) if prefill else ("--pastKVLen", past_kv_len)
    if length is None:
        raise ConfigurationError(f"llm_bench {parsed.value} needs {'input_len' if prefill else 'past_kv_len'}")
    argv = [install.tool("llm_bench"), "--engineDir", engine_dir, "--mode", parsed.value, length_flag, str(length),
            "--iterations", str(iterations), "--warmup", str(warmup), "--batchSize", str(batch_size)]
    if output_dir is not None:
        argv += ["--outputDir", output_dir]
    return argv


def _same(requests: list[GenerationRequest], attr: str) -> Any:
    values = {getattr(r, attr) if not isinstance(getattr(r, attr), list) else tuple(getattr(r, attr))
              for r in requests}
    if len(values) != 1:
        raise ConfigurationError(f"llm_inference takes one {attr} for all requests; got {sorted(map(str, values))}")
    return values.pop()


def to_trt_requests(requests: list[GenerationRequest], *, batch_size: int = 1) -> dict[str, Any]:
    """Our requests (``edgellm infer``'s file) -> llm_inference's OpenAI-like input file.

    Plain prompts are sent as one user message without the chat template (a completion, like ours); messages go
    through the engine's chat template. Greedy (temperature 0) is sent as top_k 1. llm_inference reads no seed (it
    ignores keys it does not know), so none is written: a seed is irrelevant to greedy requests, and a sampling
    request that asks for one is refused rather than silently run unseeded.
    """
    if not requests:
        raise ConfigurationError("no requests to translate")
    with_ids = [r.id for r in requests if r.input_ids is not None]
    if with_ids:
        raise ConfigurationError(f"llm_inference takes text, not input_ids (requests {', '.join(with_ids)})")
    kinds = {r.prompt is not None for r in requests}
    if len(kinds) != 1:
        raise ConfigurationError("llm_inference applies the chat template to all requests or none: do not mix "
                                 "prompt and messages requests in one file")
    temperature, top_k, top_p = (_same(requests, a) for a in ("temperature", "top_k", "top_p"))
    greedy = temperature == 0.0
    seeded = [f"{r.id} (seed {r.seed})" for r in requests if r.seed is not None]
    if seeded and not greedy:
        raise ConfigurationError(f"llm_inference takes no sampling seed (its input file has no seed key), so a seed "
                                 f"cannot be honoured at temperature {temperature}: request(s) {', '.join(seeded)}; "
                                 f"drop the seed or use temperature 0 (greedy)")
    plain = kinds.pop()
    out: dict[str, Any] = {
        "batch_size": batch_size,
        "temperature": 1.0 if greedy else temperature,
        "top_p": 1.0 if greedy else top_p,
        "top_k": 1 if greedy else top_k,
        "max_generate_length": _same(requests, "max_new_tokens"),
        "apply_chat_template": not plain,
        "add_generation_prompt": not plain,
        "requests": [],
    }
    for r in requests:
        messages = [{"role": "user", "content": r.prompt}] if plain else r.messages
        entry: dict[str, Any] = {"messages": messages}
        if r.stop:
            entry["stop"] = list(r.stop)
        out["requests"].append(entry)
    return out


# llm_inference's finish_reason (cpp/runtime/streaming.cpp) -> ours (edgellm.runtime.requests.FINISH_REASONS).
# "cancelled" and "not-finished" have no counterpart and map to None like any unknown one (never guessed);
# "error" marks a failed request.
FINISH_REASONS = {"end-of-sequence": "eos", "max-length": "length", "stop-words": "stop"}
FAILED_REASON = "error"


def _index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def from_trt_responses(output: Mapping[str, Any], requests: list[GenerationRequest], *,
                       batch_size: int = 1) -> dict[str, Any]:
    """llm_inference's output file -> our ``{"responses": [...]}`` in request order.

    ``request_idx`` is the flat index into the requests sent and ``batch_idx`` its place in its batch of
    ``batch_size`` consecutive requests (checked). Its ``finish_reason`` is mapped to ours (:data:`FINISH_REASONS`;
    others None). Token ids and timings are not in its file: they are null, never guessed. The file is also
    written when requests failed (llm_inference then exits 1): a request whose finish_reason is "error" or whose
    text is its failure text, or that has no response, raises TestFailure naming the request ids."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    responses = output.get("responses")
    if not isinstance(responses, list):
        raise TestFailure("llm_inference output has no 'responses' list")
    by_index: dict[int, Mapping[str, Any]] = {}
    problems: list[str] = []
    for n, item in enumerate(responses):
        if not isinstance(item, Mapping):
            problems.append(f"responses[{n}] is not an object")
            continue
        index, batch_index = _index(item.get("request_idx")), _index(item.get("batch_idx"))
        if index is None or not 0 <= index < len(requests):
            problems.append(f"responses[{n}].request_idx {item.get('request_idx')!r} is not an index into the "
                            f"{len(requests)} request(s) sent")
        elif index in by_index:
            problems.append(f"responses[{n}] repeats request_idx {index}")
        elif batch_index != index % batch_size:
            problems.append(f"responses[{n}].batch_idx {item.get('batch_idx')!r} does not match request_idx {index} "
                            f"in batches of {batch_size} (expected {index % batch_size})")
        elif not isinstance(item.get("output_text"), str):
            problems.append(f"responses[{n}].output_text {item.get('output_text')!r} is not a string")
        else:
            by_index[index] = item
    if problems:
        raise TestFailure(f"llm_inference output is inconsistent: {'; '.join(problems[:3])}"
                          + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
    failed = [r.id for i, r in enumerate(requests) if i in by_index and (
        by_index[i].get("finish_reason") == FAILED_REASON or by_index[i]["output_text"] == FAILED_TEXT)]
    missing = [r.id for i, r in enumerate(requests) if i not in by_index]
    if failed or missing:
        raise TestFailure("llm_inference "
                          + "; ".join(([f"failed request(s) {', '.join(failed)}"] if failed else [])
                                      + ([f"returned no output for request(s) {', '.join(missing)}"] if missing
                                         else [])))
    return {"responses": [{"id": r.id, "text": by_index[i]["output_text"], "output_ids": None,
                           "finish_reason": FINISH_REASONS.get(str(by_index[i].get("finish_reason"))),
                           "timings": None} for i, r in enumerate(requests)]}


def bench_csv(output_dir: str, mode: BenchMode, length: int) -> str:
    """Where ``llm_bench --outputDir`` writes its end-to-end timing of ``mode`` (see the module doc); the only file it
    writes there without ``--profile`` (no per-iteration samples: the E2E CSV holds aggregates)."""
    name = f"e2e_prefill_inputlen{length}" if mode is BenchMode.PREFILL else f"e2e_decode_pastkvlen{length}"
    return f"{output_dir}/{name}.csv"


E2E_COLUMNS = ("mode", "batch_size", "osl", "e2e_time_ms", "per_token_ms", "throughput_tps")
# the E2E CSV's mode-specific last column, and the bench_argv flag that sets it
LENGTH_COLUMNS = {BenchMode.PREFILL: ("input_len", "--inputLen"), BenchMode.DECODE: ("past_kv_len", "--pastKVLen")}


def bench_asked(mode: BenchMode, argv: list[str]) -> dict[str, int]:
    """What an ``llm_bench`` command line (:func:`bench_argv`) asked: ``length`` (input_len or past_kv_len) and
    ``batch_size``, the values its E2E CSV must echo (:func:`parse_bench`)."""
    flags = {"length": LENGTH_COLUMNS[mode][1], "batch_size": "--batchSize"}
    asked: dict[str, int] = {}
    for key, flag in flags.items():
        if flag in argv[:-1]:
            asked[key] = int(argv[argv.index(flag) + 1])
    return asked


def _csv_int(row: Mapping[str, str], column: str, mode: BenchMode) -> int:
    try:
        return int(row[column])
    except ValueError:
        raise TestFailure(f"llm_bench {mode.value}: {column} {row[column]!r} is not an integer") from None


def parse_bench(mode: BenchMode, e2e: str, *, length: int | None = None,
                batch_size: int | None = None) -> dict[str, tuple[float, str]]:
    """llm_bench's end-to-end CSV -> the farm's bench metrics: ``<mode>_tokens_per_s`` (its throughput_tps, which
    llm_bench does not multiply by the batch size), ``<mode>_ms_per_token`` and ``<mode>_e2e_ms`` (means over its
    iterations). Its mode, mode-specific length column and batch size must be those asked (``length``,
    ``batch_size``: checked when given); osl must be 1 (the farm passes no ``--osl``, so a decode row times one
    step). No latency percentiles: llm_bench writes no per-iteration times."""
    import csv
    import io

    column = LENGTH_COLUMNS[mode][0]
    rows = list(csv.DictReader(io.StringIO(e2e)))
    needed = (*E2E_COLUMNS, column)
    if len(rows) != 1 or any(c not in rows[0] for c in needed):
        raise TestFailure(f"llm_bench {mode.value}: expected one row with {', '.join(needed)}; got "
                          f"{len(rows)} row(s) with {', '.join(rows[0]) if rows else 'no columns'}")
    row = rows[0]
    if row["mode"] != mode.value:
        raise TestFailure(f"llm_bench wrote mode {row['mode']!r} for a {mode.value} run")
    found = {"length": _csv_int(row, column, mode), "batch_size": _csv_int(row, "batch_size", mode)}
    asked = {"length": length, "batch_size": batch_size}
    names = {"length": column, "batch_size": "batch_size"}
    wrong = [f"{names[k]} {found[k]} (asked {v})" for k, v in asked.items() if v is not None and found[k] != v]
    osl = _csv_int(row, "osl", mode)
    if osl != 1:
        wrong.append(f"osl {osl} (asked 1)")
    if wrong:
        raise TestFailure(f"llm_bench {mode.value} timed another shape: {', '.join(wrong)}")
    try:
        out = {f"{mode.value}_tokens_per_s": (float(row["throughput_tps"]), "tokens/s"),
               f"{mode.value}_ms_per_token": (float(row["per_token_ms"]), "ms"),
               f"{mode.value}_e2e_ms": (float(row["e2e_time_ms"]), "ms")}
    except ValueError as exc:
        raise TestFailure(f"llm_bench {mode.value}: unreadable timing ({exc})") from None
    bad = [k for k, (v, _) in out.items() if not v > 0]
    if bad:
        raise TestFailure(f"llm_bench {mode.value}: non-positive {', '.join(bad)}")
    return out


@dataclass(frozen=True)
class EngineReadBack:
    """What the farm can read back of an llm_build engine dir without TensorRT (see :func:`read_engine`)."""

    weights: str  # the weight precision of the graph the engine was built from: fp16, int4_awq, int8_sq, fp8, ...
    kv_cache: str  # kv_cache_dtype of the engine's runtime config
    quantized_gemms: int
    engine_bytes: int
    builder_config: dict[str, Any]
    checkpoint_bindings: int = 0  # weights a direct engine reads from its checkpoint at run time


# quantized GEMM kind in the exported graph -> the precision it stands for
_WEIGHT_KINDS = {"int4": "int4_awq", "int8": "int8_sq", "fp8": "fp8", "fp4": "nvfp4", "mxfp8": "mxfp8"}
# the farm's build params -> the builder_config keys llm_build writes for them (its --maxBatchSize, --maxInputLen,
# --maxKVCacheCapacity)
_LIMITS = {"max_batch_size": "max_batch_size", "max_input_len": "max_input_len", "max_seq_len": "max_kv_cache_capacity"}
# builder_config keys of flags the farm never passes, with llm_build's defaults
_DEFAULTS = {"spec_draft": False, "spec_base": False, "max_lora_rank": 0}
TOKENS_PER_PAGE = 128  # the paged KV cache's page (kTOKENS_PER_PAGE)


def _gemm_weight_kinds(onnx_dir: Path) -> list[str]:
    """Per GEMM of the exported graph whose weight is quantized: int4 | int8 | fp8 | fp4 | mxfp8 (headers only)."""
    import onnx

    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    graph = model.graph
    init_type = {i.name: i.data_type for i in graph.initializer}
    producer = {out: n for n in graph.node for out in n.output}
    kinds: list[str] = []
    for node in graph.node:
        if node.op_type == "Int4GroupwiseGemmPluginV2":
            kinds.append("int4")
        elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1:
            src = producer.get(node.input[1])
            while src is not None and src.op_type in ("Transpose", "Reshape", "Cast", "Identity"):
                src = producer.get(src.input[0])
            if src is None:
                continue
            if src.op_type == "TRT_MXFP8DequantizeLinear":
                kinds.append("mxfp8")
            elif src.op_type == "DequantizeLinear":
                dtype = init_type.get(src.input[0])
                fp8 = {onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2}
                fp4 = {getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}
                kinds.append("fp8" if dtype in fp8 else "fp4" if dtype in fp4 else "int8")
    return kinds


def _engine_bytes(engine_dir: Path) -> int:
    """The size of the engine's plan file: from the listing of the engine as it is on the device (the plan stays
    there: ``toolchains.base.ENGINE_LISTING``), else the file itself (an engine dir fetched whole)."""
    if (engine_dir / ENGINE_LISTING).is_file():
        entry = engine_listing(engine_dir)["files"].get(ENGINE_FILE) or {}
        return int(entry.get("bytes") or 0)
    engine = engine_dir / ENGINE_FILE
    return engine.stat().st_size if engine.is_file() else 0


def builder_config_problems(builder: Mapping[str, Any], params: Mapping[str, int]) -> list[str]:
    """Where the ``builder_config`` llm_build wrote differs from what the farm asked (``params``: max_batch_size,
    max_input_len, max_seq_len, each checked when given) or from the defaults of the flags it never passes; the
    KV pool must be the one it resolves with no ``--maxKVPoolPages``: batch x ceil(capacity / 128) pages."""
    expected: dict[str, Any] = {theirs: params[ours] for ours, theirs in _LIMITS.items() if ours in params}
    expected.update(_DEFAULTS)
    if "max_batch_size" in params and "max_seq_len" in params:
        pages = -(-params["max_seq_len"] // TOKENS_PER_PAGE)
        expected["max_kv_pool_pages"] = params["max_batch_size"] * pages
    return [f"{key}={builder.get(key)!r} (expected {value!r})" for key, value in expected.items()
            if key not in builder or builder[key] != value or type(builder[key]) is not type(value)]


def _engine_config(engine_dir: Path, params: Mapping[str, int], tool: str) -> tuple[int, dict[str, Any]]:
    """The engine file's size and its config.json, whose ``builder_config`` must hold the limits asked."""
    engine_bytes = _engine_bytes(engine_dir)
    if not engine_bytes:
        raise TestFailure(f"{tool} wrote no {ENGINE_FILE} (or an empty one) in the engine dir")
    config_path = engine_dir / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TestFailure(f"{tool} wrote no readable config.json in the engine dir ({exc})") from None
    builder = config.get("builder_config")
    if not isinstance(builder, dict):
        raise TestFailure(f"the engine's config.json has no builder_config block (not written by {tool}?)")
    wrong = builder_config_problems(builder, params)
    if wrong:
        raise TestFailure(f"the engine was built for other limits: {', '.join(wrong)}")
    return engine_bytes, config


def _declared_algos() -> dict[str, str]:
    """hf_quant_config.json's quant_algo -> the precision (the quantizer's methods: ``quantize.METHODS``)."""
    from edgefarm.toolchains.tensorrt_edgellm.quantize import METHODS

    return {spec.quant_algo: method.value for method, spec in METHODS.items()}


def checkpoint_precision(checkpoint_dir: Path) -> str:
    """The weight precision the direct builder builds a checkpoint at: its ModelOpt ``quant_algo``
    (``hf_quant_config.json``, else config.json's ``quantization_config``), fp16 when it declares none. An
    algorithm the farm cannot name is a TestFailure naming it (never read as fp16)."""
    declared = None
    quant_file = checkpoint_dir / "hf_quant_config.json"
    try:
        if quant_file.is_file():
            declared = (json.loads(quant_file.read_text(encoding="utf-8")).get("quantization") or {}).get(
                "quant_algo")
        else:
            config = json.loads((checkpoint_dir / "config.json").read_text(encoding="utf-8"))
            declared = (config.get("quantization_config") or {}).get("quant_algo")
    except (OSError, ValueError, AttributeError) as exc:
        raise TestFailure(f"the checkpoint's quantization block does not read ({exc})") from None
    if declared is None:
        return "fp16"
    known = _declared_algos()
    if declared not in known:
        raise TestFailure(f"the checkpoint declares quant_algo {declared!r}, which the farm cannot name; known: "
                          f"{', '.join(sorted(known))}")
    return known[declared]


def read_direct_engine(engine_dir: Path, checkpoint_dir: Path, params: Mapping[str, int]) -> EngineReadBack:
    """Read back a ``tensorrt-edgellm-build`` output: ``llm.engine`` is there and not empty, its ``config.json``
    carries the ``builder_config`` of the limits asked, and the weight precision is the one the builder reads from
    the checkpoint it was given (:func:`checkpoint_precision`; a plan's layer types need TensorRT). Its
    ``checkpoint_weight_bindings`` count the weights the engine reads from the checkpoint at run time (reported as
    ``quantized_gemms`` 0: no graph to count them in). Raises TestFailure on any mismatch."""
    engine_bytes, config = _engine_config(engine_dir, params, DIRECT_BUILDER)
    bindings = config.get("checkpoint_weight_bindings") or []
    if not isinstance(bindings, list):
        raise TestFailure(f"the engine's checkpoint_weight_bindings is not a list: {type(bindings).__name__}")
    if bindings and not isinstance(config.get("checkpoint_identity"), dict):
        raise TestFailure("the engine reads weights from its checkpoint but its config.json records no "
                          "checkpoint_identity")
    return EngineReadBack(weights=checkpoint_precision(checkpoint_dir),
                          kv_cache=str(config.get("kv_cache_dtype", "fp16")), quantized_gemms=0,
                          engine_bytes=engine_bytes, builder_config=config["builder_config"],
                          checkpoint_bindings=len(bindings))


def read_engine(engine_dir: Path, onnx_dir: Path, params: Mapping[str, int]) -> EngineReadBack:
    """Read back an llm_build output: ``llm.engine`` is there and not empty, its ``config.json`` carries the
    ``builder_config`` of the limits asked, and the weight precision is that of the quantized GEMMs of the graph it
    was built from (a TensorRT plan cannot be opened without TensorRT; its per-layer types need the engine
    inspector on the device, not driven here). Raises TestFailure on any mismatch."""
    engine_bytes, config = _engine_config(engine_dir, params, "llm_build")
    builder = config["builder_config"]
    kinds = _gemm_weight_kinds(onnx_dir)
    found = sorted(set(kinds))
    if len(found) > 1:
        raise TestFailure(f"the engine's graph mixes quantized GEMM kinds {', '.join(found)}")
    weights = _WEIGHT_KINDS[found[0]] if found else "fp16"
    return EngineReadBack(weights=weights, kv_cache=str(config.get("kv_cache_dtype", "fp16")),
                          quantized_gemms=len(kinds), engine_bytes=engine_bytes, builder_config=builder)
