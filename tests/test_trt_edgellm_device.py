"""Device-side TensorRT Edge-LLM commands: argument lists, environment, request/response translation.

No TensorRT device exists here: the C++ tools are played by tests/helpers/standin_llm_tools.py, a STAND-IN that
only checks the arguments, environment and files it receives (never evidence).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm.errors import ConfigurationError, TestFailure
from edgellm.runtime.requests import GenerationRequest, parse_request_file
from toolchains.tensorrt_edgellm.device import (
    TOOLS,
    DeviceInstall,
    bench_argv,
    build_argv,
    from_trt_responses,
    inference_argv,
    to_trt_requests,
)

STANDIN = Path(__file__).resolve().parent / "helpers" / "standin_llm_tools.py"


@pytest.fixture
def install(tmp_path: Path) -> DeviceInstall:
    """A device install whose tools are the stand-in."""
    tools = tmp_path / "edge-llm" / "build" / "examples" / "llm"
    tools.mkdir(parents=True)
    for tool in TOOLS:
        wrapper = tools / tool
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN}" {tool} "$@"\n')
        wrapper.chmod(0o755)
    (tmp_path / "trt" / "lib").mkdir(parents=True)
    plugin = tmp_path / "edge-llm" / "build" / "libNvInfer_edgellm_plugin.so"
    plugin.write_bytes(b"")
    return DeviceInstall.from_inventory({"build_dir": str(tmp_path / "edge-llm" / "build"),
                                         "trt_package_dir": str(tmp_path / "trt"), "plugin_path": str(plugin)},
                                        device="orin-01")


def run(argv: list[str], install: DeviceInstall) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **install.env(os.environ.get("LD_LIBRARY_PATH"))}
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)


def test_inventory_data_is_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"orin-01.*missing plugin_path; unknown pluginpath"):
        DeviceInstall.from_inventory({"build_dir": "/opt/e/build", "trt_package_dir": "/usr",
                                      "pluginpath": "/x.so"}, device="orin-01")
    with pytest.raises(ConfigurationError, match="must be absolute: build_dir=build"):
        DeviceInstall.from_inventory({"build_dir": "build", "trt_package_dir": "/usr", "plugin_path": "/p.so"},
                                     device="orin-01")


def test_environment_puts_tensorrt_first() -> None:
    inst = DeviceInstall.from_inventory({"build_dir": "/opt/e/build", "trt_package_dir": "/opt/trt",
                                         "plugin_path": "/opt/e/build/libNvInfer_edgellm_plugin.so"}, device="d")
    assert inst.env("/usr/local/cuda/lib64") == {
        "TRT_PACKAGE_DIR": "/opt/trt", "EDGELLM_PLUGIN_PATH": "/opt/e/build/libNvInfer_edgellm_plugin.so",
        "LD_LIBRARY_PATH": "/opt/trt/lib:/usr/local/cuda/lib64"}
    assert inst.tool("llm_build") == "/opt/e/build/examples/llm/llm_build"


def test_build_and_bench_arguments_are_accepted(install: DeviceInstall, tmp_path: Path) -> None:
    onnx = tmp_path / "export" / "llm"
    onnx.mkdir(parents=True)
    (onnx / "config.json").write_text("{}")
    (onnx / "model.onnx").write_bytes(b"")
    engine = tmp_path / "engine"
    argv = build_argv(install, str(onnx), str(engine), max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256)
    done = run(argv, install)
    assert done.returncode == 0, done.stderr
    assert json.loads((engine / "stand_in.json").read_text())["args"]["maxKVCacheCapacity"] == "256"
    for mode, kwargs in (("prefill", {"input_len": 128}), ("decode", {"past_kv_len": 128})):
        done = run(bench_argv(install, str(engine), mode, iterations=5, warmup=1, **kwargs), install)
        assert done.returncode == 0, done.stderr
    with pytest.raises(ConfigurationError, match="decode needs past_kv_len"):
        bench_argv(install, str(engine), "decode", input_len=128)
    with pytest.raises(ConfigurationError, match="bad bench mode 'spec_verify'; valid: prefill, decode"):
        bench_argv(install, str(engine), "spec_verify", input_len=1)
    with pytest.raises(ConfigurationError, match="max_input_len 512 exceeds max_kv_cache_capacity 256"):
        build_argv(install, "o", "e", max_batch_size=1, max_input_len=512, max_kv_cache_capacity=256)


def test_standin_rejects_what_the_real_tool_would(install: DeviceInstall, tmp_path: Path) -> None:
    done = run([install.tool("llm_build"), "--onnx-dir", str(tmp_path), "--engineDir", str(tmp_path)], install)
    assert done.returncode == 2 and "unknown option --onnx-dir" in done.stderr
    done = subprocess.run([install.tool("llm_bench"), "--engineDir", "e", "--mode", "decode", "--pastKVLen", "8"],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={k: v for k, v in os.environ.items() if k != "EDGELLM_PLUGIN_PATH"})
    assert done.returncode == 2 and "EDGELLM_PLUGIN_PATH" in done.stderr


def test_inference_round_trip_keeps_request_order(install: DeviceInstall, tmp_path: Path) -> None:
    ours = tmp_path / "requests.json"
    ours.write_text(json.dumps({"requests": [
        {"id": f"r{i}", "prompt": f"Once upon a time {i}", "max_new_tokens": 32} for i in range(3)]}))
    requests = parse_request_file(ours)
    theirs = to_trt_requests(requests, batch_size=2)
    assert theirs["max_generate_length"] == 32 and theirs["top_k"] == 1 and theirs["apply_chat_template"] is False
    assert theirs["requests"][1]["messages"] == [{"role": "user", "content": "Once upon a time 1"}]
    input_file, output_file = tmp_path / "trt-in.json", tmp_path / "trt-out.json"
    input_file.write_text(json.dumps(theirs))
    done = run(inference_argv(install, str(tmp_path / "engine"), str(input_file), str(output_file)), install)
    assert done.returncode == 0, done.stderr
    back = from_trt_responses(json.loads(output_file.read_text()), requests, batch_size=2)
    assert [(r["id"], r["text"]) for r in back["responses"]] == [
        (f"r{i}", f"STAND-IN Once upon a time {i}") for i in range(3)]
    assert back["responses"][0]["output_ids"] is None  # not in llm_inference's file: never guessed


def test_translation_refuses_what_llm_inference_cannot_express() -> None:
    a = GenerationRequest(id="a", prompt="x", max_new_tokens=8)
    with pytest.raises(ConfigurationError, match="one max_new_tokens for all requests"):
        to_trt_requests([a, GenerationRequest(id="b", prompt="y", max_new_tokens=9)])
    with pytest.raises(ConfigurationError, match=r"not input_ids .requests b"):
        to_trt_requests([a, GenerationRequest(id="b", input_ids=[1, 2], max_new_tokens=8)])
    with pytest.raises(ConfigurationError, match="do not mix prompt and messages"):
        to_trt_requests([a, GenerationRequest(id="b", messages=[{"role": "user", "content": "y"}],
                                              max_new_tokens=8)])
    failed = {"responses": [{"output_text": "TensorRT Edge LLM cannot handle this request. Fails.",
                             "request_idx": 0, "batch_idx": 0}]}
    with pytest.raises(TestFailure, match=r"could not handle request.s. a"):
        from_trt_responses(failed, [a])
