"""TensorRT Edge-LLM's exit conventions (toolchains/tensorrt_edgellm/exits.py) on what its tools print.

First the board's STAND-IN tools (tests/fixtures/board.py; their fidelity to the real tools is
tests/test_board_standins.py's subject), run on this machine and through the farm's own SSH transport (where a shell
reports signals as 128 + N); then, for TensorRT's and CUDA's lines the stand-in cannot produce, the literal wording
research/trt_edgellm_tools.md cites, in the tools' log format. Every rule of the module doc is exercised.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from edgefarm.devices.transport.base import CommandResult
from edgefarm.devices.transport.ssh import SSHTransport
from edgefarm.toolchains.base import NotApplicable
from edgefarm.toolchains.tensorrt_edgellm import device as trt
from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm
from edgefarm.toolchains.tensorrt_edgellm.exits import classify, last_errors
from edgellm.errors import (
    BugError,
    ConfigurationError,
    DeviceConfigurationError,
    EdgeLLMError,
    ErrorKind,
    ResourceError,
    TestFailure,
)
from edgellm.runtime.requests import GenerationRequest

if TYPE_CHECKING:
    from tests.fixtures.board import JetsonBoard

pytest_plugins = ["tests.fixtures.board"]  # make_board (a no-op where it is already registered)

CONFIG = {"model": "llama", "model_type": "llama", "edgellm_version": "0.11.0", "spec_decode_type": "none",
          "engine_role": "llm", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
          "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
LIMITS = {"max_batch_size": 2, "max_input_len": 128, "max_kv_cache_capacity": 256}
TS = "[12:00:01.123]"


# ---------------------------------------------------------------- helpers


def make_onnx(board: JetsonBoard, name: str, **overrides: object) -> Path:
    """An exporter-shaped ONNX dir on the board (model.onnx only names its plugin ops), with both chat-template
    artifacts (0.10.0's builder copies processed_chat_template.json, 0.11.0's exporter writes chat_template.jinja)."""
    directory = board.work_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in {**CONFIG, **overrides}.items() if v is not None}
    files = {"model.onnx": "STAND-IN graph: AttentionPlugin x4", "config.json": json.dumps(config),
             "tokenizer.json": "{}", "tokenizer_config.json": "{}", "processed_chat_template.json": "{}",
             "chat_template.jinja": "{{ messages }}", "embedding.safetensors": "embedding"}
    for file, text in files.items():
        (directory / file).write_text(text)
    subprocess.run(["chown", "-R", f"{board.user}:{board.user}", str(directory)], check=True)
    return directory


def install_of(board: JetsonBoard) -> trt.DeviceInstall:
    return trt.DeviceInstall.from_inventory(board.toolchain_block(), device=board.id)


def local(board: JetsonBoard, argv: list[str], env: dict[str, str] | None = None) -> CommandResult:
    """``argv`` run on this machine as the board's user (a process killed by signal N exits -N)."""
    done = board.run(argv, env=env)
    return CommandResult(done.returncode, done.stdout, done.stderr, 0.0)


def over_ssh(board: JetsonBoard, argv: list[str], env: dict[str, str] | None = None) -> CommandResult:
    """``argv`` through the farm's SSH transport (``timeout ... env ... argv`` in a login shell), with the driver's
    environment for the tools."""
    with SSHTransport(board.device()) as transport:
        return transport.run(argv, timeout=60, env={**install_of(board).env(str(board.trt_package_dir / "lib")),
                                                    **(env or {})})


def build_argv(board: JetsonBoard, onnx: Path, engine: str) -> list[str]:
    return trt.build_argv(install_of(board), str(onnx), str(board.work_dir / engine), **LIMITS)


def requests_file(board: JetsonBoard, prompts: list[str], name: str, batch_size: int = 1) -> Path:
    requests = [GenerationRequest(id=f"r{i}", prompt=p, max_new_tokens=8) for i, p in enumerate(prompts)]
    path = board.work_dir / name
    path.write_text(json.dumps(trt.to_trt_requests(requests, batch_size=batch_size)))
    subprocess.run(["chown", f"{board.user}:{board.user}", str(path)], check=True)
    return path


def result(code: int, stderr: str = "", stdout: str = "") -> CommandResult:
    return CommandResult(code, stdout, stderr, 1.0)


def err(where: str, msg: str) -> str:
    return f"{TS} [ERROR] [{where}] {msg}\n"


def info(where: str, msg: str) -> str:
    return f"{TS} [INFO] [{where}] {msg}\n"


def built(board: JetsonBoard, name: str) -> Path:
    done = local(board, build_argv(board, make_onnx(board, f"onnx-{name}"), name))
    assert classify(done) is None, done.stderr
    return board.work_dir / name


@pytest.fixture(scope="module")
def board(make_board: Callable[..., JetsonBoard]) -> JetsonBoard:
    """A board no test breaks."""
    return make_board("orin", name="orin-exits")


@pytest.fixture(scope="module")
def engine(board: JetsonBoard) -> Path:
    return built(board, "engine-exits")


@pytest.fixture(scope="module")
def spare_board(make_board: Callable[..., JetsonBoard]) -> JetsonBoard:
    return make_board("orin", name="orin-exits-spare")


@pytest.fixture
def spare(spare_board: JetsonBoard) -> Iterator[JetsonBoard]:
    """A board a test may break: reset to a fresh one afterwards (its files are gone)."""
    yield spare_board
    spare_board.reset()


# ---------------------------------------------------------------- the stand-in tools, run for real


def test_success_is_none_locally_and_over_ssh(board: JetsonBoard, engine: Path) -> None:
    onnx = make_onnx(board, "onnx-ok")
    done = over_ssh(board, build_argv(board, onnx, "engine-ok"))
    assert (done.exit_code, classify(done)) == (0, None)
    inputs = requests_file(board, ["hello"], "req-ok.json")
    argv = trt.inference_argv(install_of(board), str(engine), str(inputs), str(board.work_dir / "out-ok.json"))
    assert classify(over_ssh(board, argv)) is None
    argv = trt.bench_argv(install_of(board), str(engine), "decode", past_kv_len=32, output_dir=str(board.work_dir))
    assert classify(local(board, argv)) is None


def test_missing_tensorrt_library_is_the_devices(spare: JetsonBoard) -> None:
    spare.remove_libnvinfer()
    onnx = make_onnx(spare, "onnx-nolib")
    for done in (local(spare, build_argv(spare, onnx, "engine-nolib")),
                 over_ssh(spare, build_argv(spare, onnx, "engine-nolib"))):
        assert done.exit_code == 127
        found = classify(done)
        assert isinstance(found, DeviceConfigurationError) and found.kind is ErrorKind.INFRASTRUCTURE
        assert str(found) == (f"{spare.tool('llm_build')} cannot start: the dynamic loader cannot load "
                              "libnvinfer.so.10 (cannot open shared object file: No such file or directory, exit "
                              "127); TensorRT's libraries are missing or not on LD_LIBRARY_PATH (the install's "
                              "trt_package_dir/lib)")


def test_missing_or_unexecutable_tool_is_the_devices(spare: JetsonBoard) -> None:
    engine = built(spare, "engine-notool")
    inputs = requests_file(spare, ["x"], "req-notool.json")
    argv = trt.inference_argv(install_of(spare), str(engine), str(inputs), str(spare.work_dir / "o.json"))
    spare.tool("llm_inference").chmod(0o644)
    done = over_ssh(spare, argv)
    assert done.exit_code == 126
    found = classify(done)
    assert isinstance(found, DeviceConfigurationError)
    assert str(found).startswith(f"the device cannot run {spare.tool('llm_inference')}: Permission denied (exit 126)")
    spare.remove_tool("llm_inference")
    done = over_ssh(spare, argv)  # env (under timeout) cannot find it
    assert done.exit_code == 127 and "No such file or directory" in done.stderr
    found = classify(done)
    assert isinstance(found, DeviceConfigurationError)
    assert str(found).startswith(f"the device cannot run {spare.tool('llm_inference')}: No such file or directory "
                                 "(exit 127)")


def test_missing_plugin_is_the_devices(spare: JetsonBoard) -> None:
    engine = built(spare, "engine-plugin")
    missing = str(spare.build_dir / "libNvInfer_edgellm_plugin.so.gone")
    onnx = make_onnx(spare, "onnx-noplugin")
    done = local(spare, build_argv(spare, onnx, "engine-noplugin"), env={"EDGELLM_PLUGIN_PATH": missing})
    assert done.exit_code == 1
    found = classify(done)
    assert isinstance(found, DeviceConfigurationError)
    assert str(found).startswith(f"llm_build cannot open the TensorRT Edge-LLM plugin library: {missing}: cannot "
                                 "open shared object file: No such file or directory (the install's plugin_path")
    assert str(found).endswith("Failed to build LLM engine.")
    spare.remove_plugin()  # the install's own plugin_path now names nothing
    inputs = requests_file(spare, ["x"], "req-noplugin.json")
    done = over_ssh(spare, trt.inference_argv(install_of(spare), str(engine), str(inputs), str(spare.work_dir / "o")))
    assert done.exit_code == 1 and isinstance(classify(done), DeviceConfigurationError)
    done = over_ssh(spare, trt.bench_argv(install_of(spare), str(engine), "prefill", input_len=16))
    assert done.exit_code == 1 and "llm_bench cannot open the TensorRT Edge-LLM plugin" in str(classify(done))


def test_oom_kill_is_a_resource_error(spare: JetsonBoard) -> None:
    onnx = make_onnx(spare, "onnx-oom")
    spare.oom_next_build()
    done = local(spare, build_argv(spare, onnx, "engine-oom"))
    assert done.exit_code == -9
    found = classify(done)
    assert isinstance(found, ResourceError) and found.kind is ErrorKind.RESOURCE
    assert str(found).startswith("out of memory: llm_build was killed by SIGKILL (the kernel's OOM killer; exit -9); "
                                 "its last line: ")
    assert str(found).endswith(f"Parsing ONNX model: {onnx}/model.onnx")
    spare.oom_next_build()
    done = over_ssh(spare, build_argv(spare, onnx, "engine-oom"))
    assert done.exit_code == 137 and not done.timed_out
    assert str(classify(done)).startswith("out of memory: llm_build was killed by SIGKILL (the kernel's OOM killer; "
                                          "exit 137)")


def test_refused_command_lines_are_the_farms_bug(board: JetsonBoard, engine: Path) -> None:
    install = install_of(board)
    onnx = make_onnx(board, "onnx-badargs")
    argv = [*build_argv(board, onnx, "engine-badargs"), "--maxBatch"]  # a prefix of --maxBatchSize, no value
    done = local(board, argv)
    found = classify(done)
    assert isinstance(found, BugError) and found.kind is ErrorKind.BUG
    assert str(found) == "llm_build refused the farm's command line: option '--maxBatchSize' requires an argument"
    done = local(board, [install.tool("llm_inference"), "--engineDir", str(engine), "--input", "x", "--bogus"])
    assert str(classify(done)) == "llm_inference refused the farm's command line: unrecognized option '--bogus'"
    done = local(board, [install.tool("llm_inference"), "--engineDir", str(engine), "--inputFile", "in.json"])
    assert str(classify(done)) == "llm_inference refused the farm's command line: ERROR: --outputFile is required"
    done = local(board, [install.tool("llm_bench"), "--engineDir", str(engine), "--mode", "prefill"])
    assert str(classify(done)) == ("llm_bench refused the farm's command line: --inputLen is required for prefill "
                                   "mode")
    done = local(board, [install.tool("llm_bench"), "--engineDir", str(engine), "--mode", "decode", "--pastKVLen",
                         "8", "--iterations", "ten"])
    assert str(classify(done)) == ("llm_bench refused the farm's command line: Failed to parse argument: stoi | "
                                   "Unable to parse args.")
    # llm_build's std::stoi throws with nothing to catch it: SIGABRT, -6 here and 134 through a shell
    for done in (local(board, [install.tool("llm_build"), "--onnxDir", str(onnx), "--maxBatchSize", "many"]),
                 over_ssh(board, [install.tool("llm_build"), "--onnxDir", str(onnx), "--maxInputLen", "99999999999"])):
        assert done.exit_code in (-6, 134)
        found = classify(done)
        assert isinstance(found, BugError)
        assert str(found).startswith("the TensorRT Edge-LLM tool could not read a number of the farm's command line: "
                                     "uncaught std::")  # it printed nothing else: nothing names it


def test_a_kernel_that_cannot_take_the_model_is_not_applicable(board: JetsonBoard) -> None:
    onnx = make_onnx(board, "onnx-stories", hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=None)
    done = local(board, build_argv(board, onnx, "engine-stories"))
    assert done.exit_code == 1
    found = classify(done)
    assert isinstance(found, NotApplicable) and isinstance(found, ConfigurationError)
    assert str(found) == ("TensorRT Edge-LLM has no attention kernel for head size 8 with 8 query / 4 KV heads on SM "
                          "87 (llm_build: Cannot implement AttentionPlugin configuration)")
    done = local(board, build_argv(board, make_onnx(board, "onnx-fp8kv", kv_cache_dtype="fp8"), "engine-fp8kv"))
    found = classify(done)
    assert isinstance(found, NotApplicable)
    assert str(found) == ("an fp8 KV cache is not supported on SM 87 (TensorRT Edge-LLM supports it only on SM89, "
                          "SM100, SM101, SM110, SM120, and SM121)")


def test_engines_built_elsewhere_fail_naming_both_sides(make_board: Callable[..., JetsonBoard],
                                                        spare: JetsonBoard) -> None:
    engine = built(spare, "engine-elsewhere")
    thor = make_board("thor", name="thor-exits")
    try:
        foreign = thor.work_dir / "engine-from-orin"
        subprocess.run(["cp", "-r", str(engine), str(foreign)], check=True)
        subprocess.run(["chown", "-R", thor.user, str(foreign)], check=True)
        inputs = requests_file(thor, ["v"], "req-foreign.json")
        done = local(thor, trt.inference_argv(install_of(thor), str(foreign), str(inputs),
                                              str(thor.work_dir / "o.json")))
        assert done.exit_code == 1
        found = classify(done)
        assert type(found) is TestFailure
        assert str(found) == ("engine built by another TensorRT (10.3.0.30; this device has 10.13.3.9): rebuild it "
                              "with this device's TensorRT (llm_inference could not deserialize it)")
    finally:
        thor.close()
    spare.set_tools_version("0.12.0")  # the tools rebuilt at another release: the engine's plugin is stale
    done = local(spare, trt.bench_argv(install_of(spare), str(engine), "prefill", input_len=16))
    assert done.exit_code == 1
    assert str(classify(done)) == ("engine built by an older, incompatible build of the TensorRT Edge-LLM plugin: "
                                   "rebuild it with this device's tools (llm_bench could not run it)")


def test_crashes_and_other_failures_are_test_failures(board: JetsonBoard, engine: Path) -> None:
    no_heads = make_onnx(board, "onnx-noheads", num_attention_heads=None)
    done = local(board, build_argv(board, no_heads, "engine-noheads"))
    assert done.exit_code == -6
    found = classify(done)
    assert type(found) is TestFailure
    assert str(found).startswith("llm_build crashed: uncaught nlohmann::")
    assert str(found).endswith("[json.exception.type_error.302] type must be number, but is null (SIGABRT)")
    missing = board.work_dir / "no-engine"
    inputs = requests_file(board, ["x"], "req-noengine.json")
    done = over_ssh(board, trt.inference_argv(install_of(board), str(missing), str(inputs), str(board.work_dir / "o")))
    assert str(classify(done)) == (f"Failed to initialize runtime: {board.source_dir}/cpp/runtime/state/"
                                   f"externalWeightManager.cpp:72: Failed to open runtime config: "
                                   f"{missing}/config.json")


def test_failed_requests_exit_1_and_their_output_names_them(board: JetsonBoard, engine: Path) -> None:
    """llm_inference still writes its output when requests failed: the exit is a TestFailure with its last ERROR
    lines, and the output (which the farm must fetch on FAIL) names the failed requests."""
    inputs = requests_file(board, ["a", "b", "c"], "req-fail.json", batch_size=3)  # the engine takes 2
    out = board.work_dir / "out-fail.json"
    done = over_ssh(board, trt.inference_argv(install_of(board), str(engine), str(inputs), str(out)))
    assert done.exit_code == 1
    found = classify(done)
    assert type(found) is TestFailure
    assert str(found) == ("Requested batch size 3 exceeds maximum supported batch size 2 | *** FAILED *** Request 0 "
                          "failed to process! | *** 1 BATCHED REQUESTS FAILED ***")
    requests = [GenerationRequest(id=f"r{i}", prompt=p, max_new_tokens=8) for i, p in enumerate("abc")]
    with pytest.raises(TestFailure, match=r"^llm_inference failed request\(s\) r0, r1, r2$"):
        trt.from_trt_responses(json.loads(out.read_text()), requests, batch_size=3)


def test_the_driver_classifies_with_these_rules() -> None:
    driver = TensorrtEdgellm().device()
    assert driver.classify_exit(result(0, stdout=info("llm_build.cpp:261:main", "LLM engine built successfully."))) \
        is None
    found = driver.classify_exit(result(137))
    assert isinstance(found, ResourceError)
    # not edgellm's exit codes: 2 would be "bad input" there, 4 a bug; here the tools' 1 is a test failure
    assert type(driver.classify_exit(result(1, err("llm_build.cpp:258:main", "Failed to build LLM engine.")))) \
        is TestFailure


# ---------------------------------------------------------------- literal lines (research sections 1, 3, 4)


TRT_VERSION_LINE = ("IRuntime::deserializeCudaEngine: Error Code 6: API Usage Error (The engine plan file is not "
                    "compatible with this version of TensorRT, expecting library version 10.12.0.36 got 10.3.0.30, "
                    "please rebuild.)")
OLD_TRT_VERSION_LINE = ("6: The engine plan file is not compatible with this version of TensorRT, expecting library "
                        "version 8.0.0 got 8.0.1, please rebuild.")
SM_LINE = ("IRuntime::deserializeCudaEngine: Error Code 6: API Usage Error (The engine plan file is generated on an "
           "incompatible device, expecting compute 8.9 got compute 8.6, please rebuild.)")
TAG_LINE = ("Error Code 1: Serialization (Serialization assertion stdVersionRead == serializationVersion failed."
            "Version tag does not match. Note: Current Version: 236, Serialized Engine Version: 213)")
TRT_OOM_LINE = ("Requested amount of GPU memory (1073741824 bytes) could not be allocated. There may not be enough "
                "free memory for allocation to succeed.")
STALE_LINE = ("AttentionPlugin::getWorkspaceSize: nbInputs (5) is too small for kv_page_table input index 5 -- this "
              "engine was likely serialized by an older, incompatible build of this plugin; re-export and rebuild.")
BUILD_FAILED = err("llm_build.cpp:258:main", "Failed to build LLM engine.")
RUNTIME_FAILED = err("llm_inference.cpp:785:main", "Failed to initialize runtime: Failed to initialize base "
                     "EngineExecutor: Failed to deserialize TensorRT engine from file: /e/llm.engine")


@pytest.mark.parametrize(("outcome", "kind", "message"), [
    (result(0, stdout=info("llm_build.cpp:261:main", "LLM engine built successfully.")), None, None),
    # exit 0, yet the tool's own failure line
    (result(0, BUILD_FAILED), TestFailure, "llm_build exited 0 but reported a failure: Failed to build LLM engine."),
    # the loader, before main
    (result(127, "/opt/e/build/examples/llm/llm_bench: error while loading shared libraries: libcudart.so.12: cannot "
                 "open shared object file: No such file or directory\n"), DeviceConfigurationError,
     "/opt/e/build/examples/llm/llm_bench cannot start: the dynamic loader cannot load libcudart.so.12 (cannot open "
     "shared object file: No such file or directory, exit 127); TensorRT's libraries are missing or not on "
     "LD_LIBRARY_PATH (the install's trt_package_dir/lib)"),
    # the farm's local transport, and a shell, for a tool that is not there
    (result(127, "/opt/e/build/examples/llm/llm_build: command not found\n"), DeviceConfigurationError,
     "the device cannot run /opt/e/build/examples/llm/llm_build: command not found (exit 127); check the install's "
     "build_dir and the device's tools"),
    (result(127, "sh: 1: /opt/e/build/examples/llm/llm_build: not found\n"), DeviceConfigurationError,
     "the device cannot run /opt/e/build/examples/llm/llm_build: not found (exit 127); check the install's build_dir "
     "and the device's tools"),
    (result(127, "/usr/bin/env: 'python3': No such file or directory\n"), DeviceConfigurationError,
     "the device cannot run python3: No such file or directory (exit 127); check the install's build_dir and the "
     "device's tools"),
    (result(127), DeviceConfigurationError, "the device cannot run the TensorRT Edge-LLM tool: exit 127 (command not "
                                            "found)"),
    # no GPU: cudaStreamCreateWithFlags fails outside any try block
    (result(134, "terminate called after throwing an instance of 'std::runtime_error'\n  what():  CUDA runtime error "
                 "in cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking): no CUDA-capable device is detected\n"),
     DeviceConfigurationError, "the TensorRT Edge-LLM tool finds no usable GPU: CUDA runtime error in "
                               "cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking): no CUDA-capable device is "
                               "detected"),
    # memory
    (result(-9), ResourceError, "out of memory: the TensorRT Edge-LLM tool was killed by SIGKILL (the kernel's OOM "
                                "killer; exit -9)"),
    (result(1, err("TensorRT", TRT_OOM_LINE) + err("builderUtils.cpp:362:buildEngine", "Failed to build serialized "
                                                   "engine") + BUILD_FAILED),
     ResourceError, "out of GPU memory: TensorRT could not allocate 1024.0 MiB (1073741824 bytes) in llm_build: "
                    "Requested amount of GPU memory (1073741824 bytes) could not be allocated. There may not be enough "
                    "free memory for allocation to succeed. | Failed to build serialized engine | Failed to build LLM "
                    "engine."),
    (result(134, "terminate called after throwing an instance of 'std::runtime_error'\n  what():  CUDA runtime error "
                 "in cudaMalloc(&ptr, bytes): out of memory\n"),
     ResourceError, "out of GPU memory: the TensorRT Edge-LLM tool: CUDA runtime error in cudaMalloc(&ptr, bytes): out "
                    "of memory"),
    (result(1, err("builderUtils.cpp:380:saveEngine", "Failed to write engine to file: /e/llm.engine: No space left "
                                                      "on device") + BUILD_FAILED),
     ResourceError, "disk full: llm_build: Failed to write engine to file: /e/llm.engine: No space left on device"),
    # the farm's command line
    (result(1, "/opt/e/build/examples/llm/llm_build: option '--spec' is ambiguous; possibilities: '--specDraft' "
               "'--specBase'\n" + err("llm_build.cpp:200:parseLLMBuildArgs", "Invalid Argument ? is (null).")
            + err("llm_build.cpp:214:main", "Unable to parse builder args.")),
     BugError, "llm_build refused the farm's command line: option '--spec' is ambiguous; possibilities: '--specDraft' "
               "'--specBase'"),
    (result(1, "llm_build: unrecognized option '--foo'\n"), BugError,
     "llm_build refused the farm's command line: unrecognized option '--foo'"),
    (result(1, err("llm_inference.cpp:350:parseArgs", "Invalid batchSize value: 0 (must be positive)")), BugError,
     "llm_inference refused the farm's command line: Invalid batchSize value: 0 (must be positive)"),
    # engines built elsewhere (TensorRT's public wording)
    (result(1, err("TensorRT", TRT_VERSION_LINE) + RUNTIME_FAILED), TestFailure,
     "engine built by another TensorRT (10.3.0.30; this device has 10.12.0.36): rebuild it with this device's "
     "TensorRT (llm_inference could not deserialize it)"),
    (result(1, err("TensorRT", OLD_TRT_VERSION_LINE) + RUNTIME_FAILED), TestFailure,
     "engine built by another TensorRT (8.0.1; this device has 8.0.0): rebuild it with this device's TensorRT "
     "(llm_inference could not deserialize it)"),
    (result(1, err("TensorRT", SM_LINE) + RUNTIME_FAILED), TestFailure,
     "engine built for another GPU (compute 8.6; this device is compute 8.9): rebuild it on this device's GPU "
     "(llm_inference could not deserialize it)"),
    (result(1, err("TensorRT", TAG_LINE) + RUNTIME_FAILED), TestFailure,
     "engine built by another TensorRT (its serialization version tag does not match this device's): rebuild it "
     "with this device's TensorRT (llm_inference could not deserialize it)"),
    (result(1, err("attentionPlugin.cpp:1043:getWorkspaceSize", STALE_LINE) + RUNTIME_FAILED), TestFailure,
     "engine built by an older, incompatible build of the TensorRT Edge-LLM plugin: rebuild it with this device's "
     "tools (llm_inference could not run it)"),
    # what Edge-LLM's kernels cannot take (research 4), at build time through the plugin creator
    (result(1, err("attentionPlugin.cpp:549:AttentionPlugin", "Cannot implement AttentionPlugin configuration. SM: "
                   "110, HeadSize: 96, NumQHeads: 32, NumKVHeads: 8")
            + err("attentionPlugin.cpp:2027:createPlugin", "Failed to create AttentionPlugin: Cannot implement the "
                  "AttentionPlugin configuration.") + BUILD_FAILED),
     NotApplicable, "TensorRT Edge-LLM has no attention kernel for head size 96 with 32 query / 8 KV heads on SM 110 "
                    "(llm_build: Cannot implement AttentionPlugin configuration)"),
    # other crashes: the tool ran and broke
    (result(134, "terminate called after throwing an instance of 'std::filesystem::__cxx11::filesystem_error'\n  "
                 "what():  filesystem error: cannot create directories: Permission denied [/e]\n"),
     TestFailure, "the TensorRT Edge-LLM tool crashed: uncaught std::filesystem::__cxx11::filesystem_error: filesystem "
                  "error: cannot create directories: Permission denied [/e] (SIGABRT)"),
    (result(139, stdout=info("llm_inference.cpp:900:main", "Processing 1 batched requests...")), TestFailure,
     "llm_inference was killed by SIGSEGV (exit 139): Processing 1 batched requests..."),
    # anything else: the last ERROR lines, prefix stripped
    (result(1, err("llm_build.cpp:235:main", "config.json not found in onnx directory: /x")), TestFailure,
     "config.json not found in onnx directory: /x"),
    (result(1), TestFailure, "the TensorRT Edge-LLM tool failed with exit code 1 and printed nothing"),
])
def test_literal_outputs(outcome: CommandResult, kind: type[EdgeLLMError] | None, message: str | None) -> None:
    found = classify(outcome)
    if kind is None:
        assert found is None
        return
    assert type(found) is kind, found
    assert str(found) == message


def test_last_errors_keep_three_lines_and_500_characters() -> None:
    lines = "".join(err("llm_inference.cpp:1190:main", f"*** FAILED *** Request {i} failed to process!")
                    for i in range(5))
    noise = f"{TS} [WARNING] [llm_inference.cpp:10:main] a warning\n{TS} [UNKNOWN] [TensorRT] internal error\n"
    assert last_errors(result(1, lines + noise)) == ("*** FAILED *** Request 3 failed to process! | *** FAILED *** "
                                                     "Request 4 failed to process! | internal error")
    long = err("llm_build.cpp:1:main", "x" * 800)
    said = last_errors(result(1, long))
    assert len(said) == 500 and said.endswith("...")
    assert last_errors(result(1, "plain text on stderr\n", "stdout line\n")) == "plain text on stderr"
    assert last_errors(result(1, "", "only stdout\n" + info("llm_bench.cpp:1:main", "then a log line"))) == (
        "only stdout | then a log line")


def test_a_host_tool_failure_names_the_root_cause_of_a_chained_traceback(tmp_path: Path) -> None:
    """NVIDIA's exporter on an fp32 Qwen2 checkpoint (0.11.0): torch.export wraps the model's TypeError in a generic
    TorchExportError whose message says nothing of the model. The reason leads with the cause."""
    from edgefarm.toolchains.process import ToolRun

    log = tmp_path / "export.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        '  File "linear.py", line 54, in _require_fp16_input\n'
        "TypeError: FP16Linear expects float16 input, got torch.float32\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        "torch.onnx._internal.exporter._errors.TorchExportError: Failed to export the model with torch.export. "
        "\x1b[96mThis is step 1/3\x1b[0m of exporting the model to ONNX. Next steps:\n"
        "- Create an issue in the PyTorch GitHub repository\n"
        "<class 'TypeError'>: FP16Linear expects float16 input, got torch.float32\n")
    line = ToolRun(["tensorrt-edgellm-export"], 1, 1.0, 0, log).error_line()
    assert line.startswith("TypeError: FP16Linear expects float16 input, got torch.float32 (raised as "
                           "torch.onnx._internal.exporter._errors.TorchExportError: Failed to export"), line
    assert "\x1b" not in line
    log.write_text("loading\nValueError: model_type='qwen2' does not provide a chat template\n")
    plain = ToolRun(["x"], 1, 1.0, 0, log).error_line()
    assert plain == "ValueError: model_type='qwen2' does not provide a chat template"
