"""Device-side TensorRT Edge-LLM commands: argument lists, environment, request/response and file translations.

No TensorRT device exists here: the C++ tools are the JetPack-like board's STAND-INs (tests/fixtures/board.py), which
check their arguments and write the real tools' formats (research/trt_edgellm_tools.md sections 1-2) but compute
nothing (never evidence). Literal outputs below are in those formats.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from edgefarm.toolchains.tensorrt_edgellm.device import (
    DIRECT_BUILDER,
    FAILED_TEXT,
    DeviceBuilds,
    DeviceInstall,
    bench_argv,
    bench_asked,
    bench_csv,
    build_argv,
    builder_config_problems,
    from_trt_responses,
    inference_argv,
    parse_bench,
    read_direct_engine,
    read_engine,
    to_trt_requests,
)
from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.runtime.requests import FINISH_REASONS, GenerationRequest, parse_request_file
from edgellm.types import BenchMode

if TYPE_CHECKING:
    from tests.fixtures.board import JetsonBoard

pytest_plugins = ["tests.fixtures.board"]  # jetson_board (a no-op where it is already registered)

CONFIG = {"model": "llama", "model_type": "llama", "edgellm_version": "0.11.0", "spec_decode_type": "none",
          "engine_role": "llm", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
          "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
PARAMS = {"max_batch_size": 2, "max_input_len": 128, "max_seq_len": 256}
# what llm_build writes for --maxBatchSize 2 --maxInputLen 128 --maxKVCacheCapacity 256 (research 2.1)
BUILDER_CONFIG = {"max_input_len": 128, "spec_draft": False, "spec_base": False, "max_batch_size": 2,
                  "max_lora_rank": 0, "max_kv_cache_capacity": 256, "max_kv_pool_pages": 4}


def install_of(board: JetsonBoard) -> DeviceInstall:
    return DeviceInstall.from_inventory(board.toolchain_block(), device=board.id)


def run(board: JetsonBoard, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` as the board's user with the driver's environment for the tools."""
    return board.run(argv, env=install_of(board).env(str(board.trt_package_dir / "lib")))


def owned(board: JetsonBoard, path: Path) -> Path:
    subprocess.run(["chown", "-R", f"{board.user}:{board.user}", str(path)], check=True)
    return path


def make_onnx(board: JetsonBoard, name: str) -> Path:
    """An exporter-shaped ONNX dir with both chat-template artifacts (0.10.0's and 0.11.0's)."""
    directory = board.work_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    for file, text in {"model.onnx": "STAND-IN graph: AttentionPlugin x4", "config.json": json.dumps(CONFIG),
                       "tokenizer.json": "{}", "tokenizer_config.json": "{}", "processed_chat_template.json": "{}",
                       "chat_template.jinja": "{{ messages }}", "embedding.safetensors": "embedding"}.items():
        (directory / file).write_text(text)
    return owned(board, directory)


@pytest.fixture(scope="module")
def engine(jetson_board: JetsonBoard) -> Path:
    """An engine built by the driver's argv on the session's board (the tests only read it)."""
    engine = jetson_board.work_dir / "dev-engine"
    argv = build_argv(install_of(jetson_board), str(make_onnx(jetson_board, "dev-onnx")), str(engine),
                      max_batch_size=2, max_input_len=128, max_kv_cache_capacity=256)
    done = run(jetson_board, argv)
    assert done.returncode == 0, done.stderr
    return engine


def response(idx: int, text: str = "ok", reason: str | None = "end-of-sequence", batch: int | None = None,
             batch_size: int = 1) -> dict[str, Any]:
    item: dict[str, Any] = {"output_text": text, "request_idx": idx,
                            "batch_idx": idx % batch_size if batch is None else batch}
    if reason is not None:
        item["finish_reason"] = reason
    return item


# ---------------------------------------------------------------- install and argument lists


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


def test_build_and_bench_arguments_are_accepted(jetson_board: JetsonBoard, engine: Path) -> None:
    builder = json.loads((engine / "config.json").read_text())["builder_config"]
    assert builder == BUILDER_CONFIG
    assert builder_config_problems(builder, PARAMS) == []
    for mode, kwargs in (("prefill", {"input_len": 128}), ("decode", {"past_kv_len": 128})):
        done = run(jetson_board, bench_argv(install_of(jetson_board), str(engine), mode, iterations=5, warmup=1,
                                            **kwargs))
        assert done.returncode == 0, done.stderr
    with pytest.raises(ConfigurationError, match="decode needs past_kv_len"):
        bench_argv(install_of(jetson_board), str(engine), "decode", input_len=128)
    with pytest.raises(ConfigurationError, match="bad bench mode 'spec_verify'; valid: prefill, decode"):
        bench_argv(install_of(jetson_board), str(engine), "spec_verify", input_len=1)
    with pytest.raises(ConfigurationError, match="max_input_len 512 exceeds max_kv_cache_capacity 256"):
        build_argv(install_of(jetson_board), "o", "e", max_batch_size=1, max_input_len=512, max_kv_cache_capacity=256)


# ---------------------------------------------------------------- the engine dir llm_build writes


def test_builder_config_is_read_by_llm_builds_own_keys() -> None:
    assert builder_config_problems(BUILDER_CONFIG, PARAMS) == []
    assert builder_config_problems(BUILDER_CONFIG, {"max_input_len": 128}) == []  # only what was asked, then
    camel = {"maxBatchSize": 2, "maxInputLen": 128, "maxKVCacheCapacity": 256}
    assert builder_config_problems(camel, PARAMS)[:3] == [
        "max_batch_size=None (expected 2)", "max_input_len=None (expected 128)",
        "max_kv_cache_capacity=None (expected 256)"]
    other = {**BUILDER_CONFIG, "max_kv_cache_capacity": 512, "max_kv_pool_pages": 8}
    assert builder_config_problems(other, PARAMS) == ["max_kv_cache_capacity=512 (expected 256)",
                                                      "max_kv_pool_pages=8 (expected 4)"]
    assert builder_config_problems({**BUILDER_CONFIG, "spec_base": True, "max_lora_rank": 0.0}, PARAMS) == [
        "spec_base=True (expected False)", "max_lora_rank=0.0 (expected 0)"]
    # the pool llm_build resolves with no --maxKVPoolPages: batch x ceil(capacity / 128)
    assert builder_config_problems({**BUILDER_CONFIG, "max_batch_size": 3, "max_kv_cache_capacity": 300,
                                    "max_kv_pool_pages": 9}, {"max_batch_size": 3, "max_seq_len": 300}) == []


def _float_graph(path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.zeros((4, 4), dtype=np.float16), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 4])], [weight])
    onnx.save(helper.make_model(graph), str(path))


def test_read_engine_checks_the_builder_config(tmp_path: Path) -> None:
    onnx_dir, engine_dir = tmp_path / "onnx", tmp_path / "engine"
    onnx_dir.mkdir()
    engine_dir.mkdir()
    _float_graph(onnx_dir / "model.onnx")
    (engine_dir / "llm.engine").write_bytes(b"plan")
    (engine_dir / "config.json").write_text(json.dumps({**CONFIG, "builder_config": BUILDER_CONFIG}))
    found = read_engine(engine_dir, onnx_dir, PARAMS)
    assert (found.weights, found.kv_cache, found.quantized_gemms, found.engine_bytes) == ("fp16", "fp16", 0, 4)
    with pytest.raises(TestFailure, match=r"^the engine was built for other limits: max_batch_size=2 \(expected 4\), "
                                          r"max_kv_pool_pages=4 \(expected 8\)$"):
        read_engine(engine_dir, onnx_dir, {**PARAMS, "max_batch_size": 4})


# ---------------------------------------------------------------- the direct (ONNX-less) builder

ONE = {"build_dir": "/opt/e/build", "trt_package_dir": "/usr",
       "plugin_path": "/opt/e/build/libNvInfer_edgellm_plugin.so", "version": "0.11.0"}
VENV_BUILDER = "/opt/e/.venv/bin/tensorrt-edgellm-build"


def _device(block: dict[str, Any], name: str = "orin-01") -> Any:
    from edgefarm.devices.inventory import Device

    return Device(id=name, type="orin", work_dir="/w", host="127.0.0.1", toolchains={"tensorrt-edgellm": block})


def test_the_direct_builder_is_named_per_build_in_the_inventory() -> None:
    inst = DeviceInstall.from_inventory({**ONE, "direct_builder": VENV_BUILDER}, device="orin-01")
    assert inst.tool(DIRECT_BUILDER) == VENV_BUILDER
    assert list(inst.tools()) == ["llm_build", "llm_inference", "llm_bench", DIRECT_BUILDER]
    plain = DeviceInstall.from_inventory(ONE, device="orin-01")
    assert plain.direct_builder is None and DIRECT_BUILDER not in plain.tools()
    with pytest.raises(ConfigurationError, match=r"unknown TensorRT Edge-LLM tool 'tensorrt-edgellm-build' of this "
                                                 r"build; valid: llm_build, llm_inference, llm_bench$"):
        plain.tool(DIRECT_BUILDER)
    with pytest.raises(ConfigurationError, match="must be absolute: direct_builder=bin/tensorrt-edgellm-build"):
        DeviceInstall.from_inventory({**ONE, "direct_builder": "bin/tensorrt-edgellm-build"}, device="orin-01")
    several = DeviceBuilds.from_inventory({"trt_package_dir": "/usr", "builds": {
        "0.11.0": {"build_dir": "/opt/e11/build", "direct_builder": VENV_BUILDER},
        "0.10.0": {"build_dir": "/opt/e10/build"}}}, device="orin-01")
    new, old = several.build("0.11.0"), several.build("0.10.0")
    assert new is not None and old is not None
    assert (str(new.direct_builder), old.direct_builder) == (VENV_BUILDER, None)
    with pytest.raises(ConfigurationError, match=r"builds\.0\.10\.0: expected \{build_dir\[, plugin_path, "
                                                 r"direct_builder\]\}, got \{'build_dir': '/b', 'builder': '/x'\}"):
        DeviceBuilds.from_inventory({"trt_package_dir": "/usr", "builds": {"0.10.0": {"build_dir": "/b",
                                                                                      "builder": "/x"}}}, device="d")


def test_the_driver_builds_from_the_checkpoint_where_the_device_has_the_direct_builder() -> None:
    from edgefarm.toolchains.base import Route, driver

    trt = driver("tensorrt-edgellm")
    direct, onnx = _device({**ONE, "direct_builder": VENV_BUILDER}), _device(ONE, "orin-02")
    assert (trt.route(direct), trt.route(onnx), trt.route()) == (Route.DIRECT, Route.ONNX, Route.ONNX)
    assert Route.DIRECT.from_checkpoint and not Route.ONNX.from_checkpoint
    assert trt.device().build_key_inputs(direct) == {"route": "direct", "version": "0.11.0", "standin": False}
    assert trt.device().build_key_inputs(onnx) == {"route": "onnx", "version": "0.11.0", "standin": False}
    step = trt.device().build_step(direct, "cache/ckpt", "jobs/j/engine", PARAMS)
    assert step.argv == [VENV_BUILDER, "--model-dir", "cache/ckpt", "--engine-dir", "jobs/j/engine",
                         "--max-input-len", "128", "--max-kv-cache-capacity", "256", "--max-batch-size", "2",
                         "--plugin-path", "/opt/e/build/libNvInfer_edgellm_plugin.so"]
    assert step.fetch == {"engine": "engine"} and step.env["LD_LIBRARY_PATH"] == "/usr/lib"
    assert (trt.device().build_step(onnx, "cache/onnx", "jobs/j/engine", PARAMS).argv[0]
            == "/opt/e/build/examples/llm/llm_build")
    needs = trt.device().device_requirements(direct)
    assert needs is not None and needs.tools[DIRECT_BUILDER] == VENV_BUILDER
    needs = trt.device().device_requirements(onnx)
    assert needs is not None and DIRECT_BUILDER not in needs.tools
    run = trt.device().with_checkpoint(trt.device().infer_step(direct, "cache/e", "cache/r", "jobs/j"), "cache/ckpt")
    assert run.argv[-2:] == ["--checkpointDir", "cache/ckpt"] and run.fetch == {"out.json": "out.json"}
    with pytest.raises(ConfigurationError, match="already names a checkpoint dir"):
        trt.device().with_checkpoint(run, "cache/other")


def _direct_engine(engine_dir: Path, **config: Any) -> None:
    engine_dir.mkdir()
    (engine_dir / "llm.engine").write_bytes(b"plan")
    builder = {**BUILDER_CONFIG, "tp_size": 1, "ragged_backend": "entry_padded_compatibility"}
    (engine_dir / "config.json").write_text(json.dumps({**CONFIG, "builder_config": builder, **config}))


def test_read_direct_engine_takes_the_precision_the_checkpoint_declares(tmp_path: Path) -> None:
    checkpoint, engine_dir = tmp_path / "ckpt", tmp_path / "engine"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama"}))
    binding = {"engine_name": "w", "shape": [2, 2], "dtype": "F16", "checkpoint_keys": ["w"]}
    _direct_engine(engine_dir, checkpoint_weight_bindings=[binding], checkpoint_identity={"version": 1})
    found = read_direct_engine(engine_dir, checkpoint, PARAMS)
    assert (found.weights, found.checkpoint_bindings, found.engine_bytes) == ("fp16", 1, 4)
    (checkpoint / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A16_AWQ"}}))
    assert read_direct_engine(engine_dir, checkpoint, PARAMS).weights == "int4_awq"
    (checkpoint / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(TestFailure, match="declares quant_algo 'W4A8_AWQ', which the farm cannot name; known: FP8, "):
        read_direct_engine(engine_dir, checkpoint, PARAMS)
    (checkpoint / "hf_quant_config.json").unlink()
    with pytest.raises(TestFailure, match=r"other limits: max_batch_size=2 \(expected 4\)"):
        read_direct_engine(engine_dir, checkpoint, {**PARAMS, "max_batch_size": 4})
    bare = tmp_path / "bare"
    _direct_engine(bare, checkpoint_weight_bindings=[binding])
    with pytest.raises(TestFailure, match="records no checkpoint_identity"):
        read_direct_engine(bare, checkpoint, PARAMS)


# ---------------------------------------------------------------- llm_inference's input and output files


def test_inference_round_trip_keeps_request_order(jetson_board: JetsonBoard, engine: Path, tmp_path: Path) -> None:
    ours = tmp_path / "requests.json"
    ours.write_text(json.dumps({"requests": [
        {"id": f"r{i}", "prompt": f"Once upon a time {i}", "max_new_tokens": 32} for i in range(3)]}))
    requests = parse_request_file(ours)
    theirs = to_trt_requests(requests, batch_size=2)
    assert theirs["max_generate_length"] == 32 and theirs["top_k"] == 1 and theirs["apply_chat_template"] is False
    assert theirs["requests"][1]["messages"] == [{"role": "user", "content": "Once upon a time 1"}]
    input_file = jetson_board.work_dir / "dev-in.json"
    output_file = jetson_board.work_dir / "dev-out.json"
    input_file.write_text(json.dumps(theirs))
    owned(jetson_board, input_file)
    done = run(jetson_board, inference_argv(install_of(jetson_board), str(engine), str(input_file), str(output_file)))
    assert done.returncode == 0, done.stderr
    output = json.loads(output_file.read_text())
    assert [(r["request_idx"], r["batch_idx"]) for r in output["responses"]] == [(0, 0), (1, 1), (2, 0)]
    back = from_trt_responses(output, requests, batch_size=2)
    assert [(r["id"], r["text"], r["finish_reason"]) for r in back["responses"]] == [
        (f"r{i}", f"STAND-IN Once upon a time {i}", "eos") for i in range(3)]
    assert back["responses"][0]["output_ids"] is None  # not in llm_inference's file: never guessed


def test_finish_reasons_map_to_ours_and_unknown_ones_to_none() -> None:
    theirs = ["end-of-sequence", "max-length", "stop-words", "cancelled", "not-finished", "something-new", None]
    requests = [GenerationRequest(id=f"r{i}", prompt="x") for i in range(len(theirs))]
    output = {"responses": [response(i, reason=reason) for i, reason in enumerate(theirs)]}
    reasons = [r["finish_reason"] for r in from_trt_responses(output, requests)["responses"]]
    assert reasons == ["eos", "length", "stop", None, None, None, None]
    assert {r for r in reasons if r is not None} <= set(FINISH_REASONS)


def test_failed_and_missing_requests_are_named() -> None:
    requests = [GenerationRequest(id=name, prompt="x") for name in "abcd"]
    output = {"responses": [response(0, reason="error"), response(1), response(2, text=FAILED_TEXT, reason=None)]}
    with pytest.raises(TestFailure, match=r"^llm_inference failed request\(s\) a, c; returned no output for "
                                          r"request\(s\) d$"):
        from_trt_responses(output, requests)
    with pytest.raises(TestFailure, match=r"^llm_inference returned no output for request\(s\) b$"):
        from_trt_responses({"responses": [response(0)]}, requests[:2])


def test_inconsistent_indices_are_refused() -> None:
    requests = [GenerationRequest(id=f"r{i}", prompt="x") for i in range(3)]
    with pytest.raises(TestFailure, match=r"responses\[1\].request_idx 3 is not an index into the 3 request\(s\)"):
        from_trt_responses({"responses": [response(0), response(3)]}, requests)
    with pytest.raises(TestFailure, match=r"responses\[1\] repeats request_idx 0"):
        from_trt_responses({"responses": [response(0), response(0)]}, requests)
    with pytest.raises(TestFailure, match=r"responses\[0\].batch_idx 1 does not match request_idx 0 in batches of 2 "
                                          r"\(expected 0\)"):
        from_trt_responses({"responses": [response(0, batch=1)]}, requests, batch_size=2)
    with pytest.raises(TestFailure, match=r"request_idx '0' is not an index"):
        from_trt_responses({"responses": [{**response(0), "request_idx": "0"}]}, requests)
    # the old misreading (request_idx as a batch number) is caught, not mapped onto other requests
    batched = {"responses": [response(0, batch=0), response(0, batch=1), response(1, batch=0)]}
    with pytest.raises(TestFailure, match="inconsistent"):
        from_trt_responses(batched, requests, batch_size=2)


def test_translation_refuses_what_llm_inference_cannot_express() -> None:
    a = GenerationRequest(id="a", prompt="x", max_new_tokens=8)
    with pytest.raises(ConfigurationError, match="one max_new_tokens for all requests"):
        to_trt_requests([a, GenerationRequest(id="b", prompt="y", max_new_tokens=9)])
    with pytest.raises(ConfigurationError, match=r"not input_ids .requests b"):
        to_trt_requests([a, GenerationRequest(id="b", input_ids=[1, 2], max_new_tokens=8)])
    with pytest.raises(ConfigurationError, match="do not mix prompt and messages"):
        to_trt_requests([a, GenerationRequest(id="b", messages=[{"role": "user", "content": "y"}],
                                              max_new_tokens=8)])


def test_a_seed_is_never_written_and_refused_when_sampling() -> None:
    """llm_inference ignores keys it does not know: a seed key would be silently not honoured."""
    greedy = [GenerationRequest(id="a", prompt="x", seed=1), GenerationRequest(id="b", prompt="y", seed=2)]
    theirs = to_trt_requests(greedy)
    assert "sampling_seed" not in theirs and not any("seed" in key for key in theirs)
    assert theirs["top_k"] == 1
    sampled = [GenerationRequest(id="a", prompt="x", temperature=0.7, top_k=40),
               GenerationRequest(id="b", prompt="y", temperature=0.7, top_k=40, seed=1234)]
    with pytest.raises(ConfigurationError, match=r"^llm_inference takes no sampling seed .*temperature 0.7: "
                                                 r"request\(s\) b \(seed 1234\); drop the seed or use temperature 0"):
        to_trt_requests(sampled)
    assert "seed" not in json.dumps(to_trt_requests([sampled[0]]))


# ---------------------------------------------------------------- llm_bench's CSV


E2E_PREFILL = ("mode,batch_size,osl,e2e_time_ms,per_token_ms,throughput_tps,input_len\n"
               "prefill,1,1,12.8000,0.1000,10000.0000,128\n")


def test_bench_metrics_come_from_the_e2e_csv_alone() -> None:
    metrics = parse_bench(BenchMode.PREFILL, E2E_PREFILL, length=128, batch_size=1)
    assert metrics == {"prefill_tokens_per_s": (10000.0, "tokens/s"), "prefill_ms_per_token": (0.1, "ms"),
                       "prefill_e2e_ms": (12.8, "ms")}
    with pytest.raises(TestFailure, match=r"timed another shape: input_len 128 \(asked 64\), batch_size 1 "
                                          r"\(asked 2\)"):
        parse_bench(BenchMode.PREFILL, E2E_PREFILL, length=64, batch_size=2)
    with pytest.raises(TestFailure, match=r"expected one row with mode, .*, past_kv_len; got 1 row\(s\) with "
                                          r"mode, .*, input_len"):
        parse_bench(BenchMode.DECODE, E2E_PREFILL.replace("prefill,", "decode,"))
    with pytest.raises(TestFailure, match=r"timed another shape: osl 4 \(asked 1\)"):
        parse_bench(BenchMode.PREFILL, E2E_PREFILL.replace("prefill,1,1,", "prefill,1,4,"))
    with pytest.raises(TestFailure, match="wrote mode 'decode' for a prefill run"):
        parse_bench(BenchMode.PREFILL, E2E_PREFILL.replace("prefill,1", "decode,1"))
    argv = bench_argv(install_of_paths(), "/e", "decode", past_kv_len=100, batch_size=2)
    assert bench_asked(BenchMode.DECODE, argv) == {"length": 100, "batch_size": 2}


def install_of_paths() -> DeviceInstall:
    return DeviceInstall.from_inventory({"build_dir": "/opt/e/build", "trt_package_dir": "/opt/trt",
                                         "plugin_path": "/opt/e/build/libNvInfer_edgellm_plugin.so"}, device="d")


def test_the_driver_fetches_only_what_llm_bench_writes(jetson_board: JetsonBoard, engine: Path) -> None:
    driver = TensorrtEdgellm().device()
    job_dir = owned(jetson_board, _mkdir(jetson_board.work_dir / "dev-job"))
    runs = driver.bench_runs(jetson_board.device(), str(engine), str(job_dir), prompt_len=64, past_len=100, warmup=1,
                             iterations=3)
    assert [(r.mode, r.step.fetch) for r in runs] == [
        (BenchMode.PREFILL, {"e2e.csv": "bench-prefill/e2e_prefill_inputlen64.csv"}),
        (BenchMode.DECODE, {"e2e.csv": "bench-decode/e2e_decode_pastkvlen100.csv"})]
    for bench_run in runs:
        done = run(jetson_board, bench_run.step.argv)
        assert done.returncode == 0, done.stderr
        fetched = {name: job_dir / rel for name, rel in bench_run.step.fetch.items()}
        written = sorted(p.name for p in (job_dir / f"bench-{bench_run.mode.value}").iterdir())
        assert written == [Path(bench_csv(".", bench_run.mode, 64 if bench_run.mode is BenchMode.PREFILL else 100))
                           .name]  # no per-iteration samples file
        metrics = driver.bench_metrics(bench_run, fetched)
        mode = bench_run.mode.value
        assert set(metrics) == {f"{mode}_tokens_per_s", f"{mode}_ms_per_token", f"{mode}_e2e_ms"}
        assert all(value > 0 for value, _ in metrics.values())


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
