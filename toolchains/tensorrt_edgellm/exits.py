"""How a run of TensorRT Edge-LLM's C++ tools (``llm_build``, ``llm_inference``, ``llm_bench``) ended, by their own
conventions (read in their source, 0.10.0, and below): :func:`classify` turns a device command's
``CommandResult`` into None (it passed) or the error it stands for.

What the tools do: they exit 0 on success and 1 on any failure they catch, after ``[HH:MM:SS.mmm] [ERROR]
[file.cpp:line:function] message`` lines on stderr (``[TensorRT]`` in place of the location for TensorRT's own
messages, ``UNKNOWN`` for its internal errors); glibc's ``getopt_long`` refuses a bad option on stderr; an uncaught
C++ exception ends in ``terminate called after throwing an instance of 'T'`` / ``  what():  msg`` and SIGABRT (134
from a shell); the dynamic loader stops a tool whose TensorRT libraries are missing before ``main`` (exit 127); a
plugin library that cannot be opened is only logged, and the tool fails later (exit 1); the kernel's OOM killer ends
a tool by SIGKILL (137 from a shell, -9 from a local process). The rules, first match wins:

1. Exit 0 passes, unless the output carries the tools' own failure lines (``Failed to build LLM engine.``, ``***
   N BATCHED REQUESTS FAILED ***``, ...): then it is judged as a failure by the rules below.
2. The loader (``error while loading shared libraries: X: ...``), a tool that cannot be executed (126/127: ``No
   such file or directory``, ``not found``, ``Permission denied``), a plugin that cannot be opened (``Cannot open
   plugin library: ...``), or a CUDA runtime with no usable GPU or driver: ``DeviceConfigurationError`` naming the
   library, tool or plugin. The device's install is broken, not the job: it is quarantined and the job moves on.
3. SIGKILL: ``ResourceError`` (the OOM killer; the farm adds the memory figures). CUDA's ``out of memory``, TensorRT's
   ``Requested amount of GPU memory (N bytes) could not be allocated`` (N in MiB) and a full disk (``No space left
   on device``): ``ResourceError``.
4. The command line refused: glibc's option errors (``unrecognized option``, ``requires an argument``, ...), the
   tools' own argument errors (``Unable to parse builder args.``, ``ERROR: --outputFile is required``, ``Invalid
   batchSize value: ...``) and llm_build's uncaught ``std::stoi``/``stoll`` (a number argument it cannot read:
   SIGABRT): ``BugError`` (kind BUG). The farm builds every argument list (``device``) and validates its values, so a
   command line a tool refuses is the farm's bug, not a finding about the model or the device.
5. TensorRT Edge-LLM cannot apply to the model on this GPU (``Cannot implement AttentionPlugin configuration. SM: S,
   HeadSize: H, ...``; ``FP8 KV cache is supported only on SM89, ...``): ``NotApplicable`` (a ConfigurationError:
   the row does not apply, naming the head size or SM); the plan's ``model_problem`` should have caught it.
6. An engine the device cannot run because it was built elsewhere: by another TensorRT (``The engine plan file is
   not compatible with this version of TensorRT, expecting library version A got B``, or a serialization version
   tag that does not match), for another GPU (``generated on an incompatible device, expecting compute A got
   compute B``), or by an older build of the Edge-LLM plugin (``this engine was likely serialized by an older,
   incompatible build of this plugin``): ``TestFailure`` naming both sides and "rebuild". Neither the device nor
   the job is broken, and one command cannot tell which side is the odd one out (the builder's TensorRT or this
   device's), so no device is quarantined: the stale engine is a finding (the engine cache key should carry the
   device's TensorRT version and SM so that it cannot recur).
7. Any other crash (SIGABRT after ``terminate called after throwing``, SIGSEGV, ...): the tool ran and broke on
   this model: ``TestFailure`` naming the exception's ``what()`` or the signal.
8. Anything else non-zero: ``TestFailure`` with the tool's last ERROR lines (log prefix stripped, at most 3 joined
   with `` | ``, at most ~500 characters); without ERROR lines, its last stderr or stdout lines.

A timeout never reaches :func:`classify` (the farm's). Messages are one line and name the value seen.
"""

from __future__ import annotations

import re
import signal

from edgefarm.devices.transport.base import CommandResult
from edgefarm.toolchains.base import NotApplicable
from edgellm.errors import BugError, DeviceConfigurationError, EdgeLLMError, ResourceError, TestFailure

MAX_LINES = 3
MAX_CHARS = 500
SHELL_SIGNAL_BASE = 128  # a shell reports death by signal N as exit status 128 + N
CANNOT_EXECUTE, NOT_FOUND = 126, 127

LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[(?P<level>[A-Z]+)\] \[(?P<where>[^\]]*)\] ?(?P<msg>.*)$")
ERROR_LEVELS = ("ERROR", "UNKNOWN")  # UNKNOWN: TensorRT's kINTERNAL_ERROR through the Edge-LLM logger

# the tools' own lines that mean they failed, whatever their exit status
FAILURE_MARKERS = ("Failed to build LLM engine.", "BATCHED REQUESTS FAILED ***", "Failed to initialize runtime",
                   "Failed to create EngineExecutor", "Unable to parse builder args.", "Unable to parse args.")

LOADER = re.compile(r"^(?P<prog>.*?): error while loading shared libraries: (?P<lib>[^:]+): (?P<why>.+)$", re.M)
# "env: '/x/llm_build': No such file or directory", "sh: 1: /x/llm_build: not found", "/x/llm_build: command not
# found", "bash: /x/llm_build: Permission denied", "timeout: failed to run command '/x': ..."
NOT_RUNNABLE = re.compile(r"'?(?P<path>[^\s':]+)'?: (?P<why>No such file or directory|command not found|not found|"
                          r"[Pp]ermission denied)\s*$", re.M)
PLUGIN = re.compile(r"Cannot open plugin library: (?P<why>.+)$", re.M)
# cudaGetErrorString texts that mean the device has no usable GPU or driver
CUDA_DEVICE_ERRORS = ("no CUDA-capable device is detected", "CUDA driver version is insufficient for CUDA runtime "
                      "version", "forward compatibility was attempted on non supported HW",
                      "system has unsupported display driver / cuda driver combination",
                      "all CUDA-capable devices are busy or unavailable")
CUDA_ERROR = re.compile(r"CUDA runtime error in (?P<call>.+?): (?P<why>[^:]+?)\s*$", re.M)
TRT_OOM = re.compile(r"Requested amount of GPU memory \((?P<bytes>\d+) bytes\) could not be allocated")
NO_SPACE = re.compile(r"^.*No space left on device.*$", re.M)

GLIBC_OPTION = re.compile(r"^\S+: (?P<msg>unrecognized option '[^']*'|option '[^']*' requires an argument|"
                          r"option '[^']*' is ambiguous.*|option '[^']*' doesn't allow an argument|"
                          r"invalid option -- '.')$", re.M)
# the tools' own complaints about their command line (llm_build, llm_inference, llm_bench argument checks)
ARGUMENT_ERRORS = re.compile(r"^(Invalid Argument .*|Unable to parse builder args\.|Unable to parse args\.|"
                             r"ERROR: --\w+ is required|--\w+ is required.*|Invalid \w+ value: .*|"
                             r"Failed to parse argument: .*|Invalid mode: .*)$")
TERMINATE = re.compile(r"terminate called after throwing an instance of '(?P<type>[^']+)'(?:\n\s*what\(\):\s*"
                       r"(?P<what>.*))?")
NUMBER_PARSERS = ("stoi", "stol", "stoll", "stoul", "stoull", "stof", "stod")

ATTENTION = re.compile(r"Cannot implement AttentionPlugin configuration\. SM: (?P<sm>\d+), HeadSize: (?P<head>\d+), "
                       r"NumQHeads: (?P<q>\d+), NumKVHeads: (?P<kv>\d+)")
FP8_KV = re.compile(r"FP8 KV cache is supported only on (?P<sms>.+?); got SM(?P<sm>\d+)\.")
TRT_VERSION = re.compile(r"The engine plan file is not compatible with this version of TensorRT, expecting library "
                         r"version (?P<here>\d+(?:\.\d+)*) got (?P<engine>\d+(?:\.\d+)*)")
TRT_TAG = re.compile(r"stdVersionRead == serializationVersion failed|Version tag does not match")
SM_MISMATCH = re.compile(r"generated on an incompatible device, expecting compute (?P<here>\d+(?:\.\d+)*) got "
                         r"compute (?P<engine>\d+(?:\.\d+)*)")
STALE_PLUGIN = "this engine was likely serialized by an older, incompatible build of this plugin"
# each tool's own log locations (its main file and those only it logs from), and its argv[0] in glibc's and the
# loader's lines
TOOL_SOURCES = {"llm_build": ("llm_build.cpp", "llmBuilder.cpp", "builderUtils.cpp"),
                "llm_inference": ("llm_inference.cpp", "llmInferenceRuntime.cpp", "requestFileParser.cpp"),
                "llm_bench": ("llm_bench.cpp", "benchRunner.h", "benchLogger.cpp")}


def log_messages(text: str, levels: tuple[str, ...] = ERROR_LEVELS) -> list[str]:
    """The message of every log line of ``levels`` in ``text`` (the ``[time] [LEVEL] [where]`` prefix stripped)."""
    found = []
    for line in text.splitlines():
        m = LOG_LINE.match(line)
        if m and m.group("level") in levels:
            found.append(m.group("msg").strip())
    return found


def _tool(result: CommandResult) -> str:
    """Which tool ran, from its log locations or its argv[0] in glibc's and the loader's lines."""
    text = "\n" + result.stderr + "\n" + result.stdout
    for name, sources in TOOL_SOURCES.items():
        if any(f"[{source}:" in text for source in sources) or f"/{name}: " in text or f"\n{name}: " in text:
            return name
    return "the TensorRT Edge-LLM tool"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."


def last_errors(result: CommandResult) -> str:
    """The tool's last ERROR lines (at most 3, prefix stripped, joined with " | ", clipped); without any, its last
    non-empty stderr lines, then stdout's (log prefixes stripped); "" when it printed nothing."""
    errors = [m for m in log_messages(result.stderr + "\n" + result.stdout) if m]
    if not errors:
        for stream in (result.stderr, result.stdout):
            errors = [_strip(line) for line in stream.splitlines() if line.strip()]
            if errors:
                break
    return _clip(" | ".join(errors[-MAX_LINES:]))


def _signal(code: int) -> int | None:
    """The signal that ended the command: -N from a local process, 128 + N from a shell (the tools themselves only
    exit 0 or 1)."""
    number = -code if code < 0 else code - SHELL_SIGNAL_BASE if SHELL_SIGNAL_BASE < code < 256 else None
    return number if number is not None and 0 < number < 65 else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failed_despite_zero(text: str) -> bool:
    return any(marker in message for message in log_messages(text) for marker in FAILURE_MARKERS)


def _device_problem(result: CommandResult, text: str, tool: str) -> DeviceConfigurationError | None:
    code = result.exit_code
    loader = LOADER.search(result.stderr)
    if loader:
        return DeviceConfigurationError(
            f"{loader.group('prog')} cannot start: the dynamic loader cannot load {loader.group('lib')} "
            f"({loader.group('why').strip()}, exit {code}); TensorRT's libraries are missing or not on "
            f"LD_LIBRARY_PATH (the install's trt_package_dir/lib)")
    if code in (CANNOT_EXECUTE, NOT_FOUND):
        found = NOT_RUNNABLE.findall(result.stderr)
        if found:
            path, why = found[-1]
            return DeviceConfigurationError(f"the device cannot run {path}: {why} (exit {code}); check the install's "
                                            f"build_dir and the device's tools")
        return DeviceConfigurationError(f"the device cannot run {tool}: exit {code} ("
                                        f"{'not executable' if code == CANNOT_EXECUTE else 'command not found'}"
                                        f"){': ' + last_errors(result) if last_errors(result) else ''}")
    plugin = PLUGIN.search(text)
    if plugin:
        return DeviceConfigurationError(
            f"{tool} cannot open the TensorRT Edge-LLM plugin library: {plugin.group('why').strip()} (the install's "
            f"plugin_path, given as EDGELLM_PLUGIN_PATH); it then failed: {last_errors(result)}")
    for cuda in CUDA_ERROR.finditer(text):
        if cuda.group("why") in CUDA_DEVICE_ERRORS:
            return DeviceConfigurationError(f"{tool} finds no usable GPU: CUDA runtime error in {cuda.group('call')}: "
                                            f"{cuda.group('why')}")
    return None


def _resource_problem(result: CommandResult, text: str, tool: str) -> ResourceError | None:
    if _signal(result.exit_code) == signal.SIGKILL:
        said = [line.strip() for line in (result.stdout + "\n" + result.stderr).splitlines() if line.strip()]
        after = f"; its last line: {_clip(_strip(said[-1]))}" if said else ""
        return ResourceError(f"out of memory: {tool} was killed by SIGKILL (the kernel's OOM killer; exit "
                             f"{result.exit_code}){after}")
    trt = TRT_OOM.search(text)
    if trt:
        size = int(trt.group("bytes"))
        return ResourceError(f"out of GPU memory: TensorRT could not allocate {size / 2**20:.1f} MiB ({size} bytes) "
                             f"in {tool}: {last_errors(result)}")
    for cuda in CUDA_ERROR.finditer(text):
        if cuda.group("why") == "out of memory":
            return ResourceError(f"out of GPU memory: {tool}: CUDA runtime error in {cuda.group('call')}: out of "
                                 f"memory")
    full = NO_SPACE.search(text)
    if full:
        return ResourceError(f"disk full: {tool}: {_clip(_strip(full.group(0)))}")
    return None


def _strip(line: str) -> str:
    m = LOG_LINE.match(line.strip())
    return m.group("msg").strip() if m else line.strip()


def _bad_command(result: CommandResult, text: str, tool: str) -> BugError | None:
    glibc = GLIBC_OPTION.search(result.stderr)
    if glibc:
        return BugError(f"{tool} refused the farm's command line: {glibc.group('msg')}")
    refused = [m for m in log_messages(text) if ARGUMENT_ERRORS.match(m)]
    if refused:
        return BugError(f"{tool} refused the farm's command line: {_clip(' | '.join(refused[:MAX_LINES]))}")
    crash = TERMINATE.search(result.stderr)
    if crash and (crash.group("what") or "").strip() in NUMBER_PARSERS:
        return BugError(f"{tool} could not read a number of the farm's command line: uncaught "
                        f"{crash.group('type')} from std::{crash.group('what').strip()} (SIGABRT)")
    return None


def _not_applicable(text: str, tool: str) -> NotApplicable | None:
    attention = ATTENTION.search(text)
    if attention:
        return NotApplicable(
            f"TensorRT Edge-LLM has no attention kernel for head size {attention.group('head')} with "
            f"{attention.group('q')} query / {attention.group('kv')} KV heads on SM {attention.group('sm')} "
            f"({tool}: Cannot implement AttentionPlugin configuration)")
    fp8 = FP8_KV.search(text)
    if fp8:
        return NotApplicable(f"an fp8 KV cache is not supported on SM {fp8.group('sm')} (TensorRT Edge-LLM supports "
                             f"it only on {fp8.group('sms')})")
    return None


def _stale_engine(text: str, tool: str) -> TestFailure | None:
    version = TRT_VERSION.search(text)
    if version:
        return TestFailure(f"engine built by another TensorRT ({version.group('engine')}; this device has "
                           f"{version.group('here')}): rebuild it with this device's TensorRT ({tool} could not "
                           f"deserialize it)")
    if TRT_TAG.search(text):
        return TestFailure(f"engine built by another TensorRT (its serialization version tag does not match this "
                           f"device's): rebuild it with this device's TensorRT ({tool} could not deserialize it)")
    sm = SM_MISMATCH.search(text)
    if sm:
        return TestFailure(f"engine built for another GPU (compute {sm.group('engine')}; this device is compute "
                           f"{sm.group('here')}): rebuild it on this device's GPU ({tool} could not deserialize it)")
    if STALE_PLUGIN in text:
        return TestFailure(f"engine built by an older, incompatible build of the TensorRT Edge-LLM plugin: rebuild "
                           f"it with this device's tools ({tool} could not run it)")
    return None


def _crash(result: CommandResult, tool: str) -> TestFailure | None:
    crash = TERMINATE.search(result.stderr)
    number = _signal(result.exit_code)
    if crash:
        what = (crash.group("what") or "").strip()
        return TestFailure(_clip(f"{tool} crashed: uncaught {crash.group('type')}"
                                 + (f": {what}" if what else "")
                                 + (f" ({_signal_name(number)})" if number else "")))
    if number:
        said = last_errors(result)
        return TestFailure(_clip(f"{tool} was killed by {_signal_name(number)} (exit {result.exit_code})"
                                 + (f": {said}" if said else "")))
    return None


def classify(result: CommandResult) -> EdgeLLMError | None:
    """None when the tool's run passed, else the error it stands for (see the module doc for the rules)."""
    text = result.stderr + "\n" + result.stdout
    if result.exit_code == 0 and not _failed_despite_zero(text):
        return None
    tool = _tool(result)
    found: EdgeLLMError | None = (_device_problem(result, text, tool) or _resource_problem(result, text, tool)
                                  or _bad_command(result, text, tool) or _not_applicable(text, tool)
                                  or _stale_engine(text, tool) or _crash(result, tool))
    if found is not None:
        return found
    said = last_errors(result)
    if result.exit_code == 0:
        return TestFailure(f"{tool} exited 0 but reported a failure: {said}")
    return TestFailure(said or f"{tool} failed with exit code {result.exit_code} and printed nothing")
