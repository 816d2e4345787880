"""STAND-IN for TensorRT Edge-LLM's C++ tools (llm_build, llm_inference, llm_bench), which need TensorRT and a GPU.

It only checks what it receives: the option names and values of the documented interfaces, the environment
(EDGELLM_PLUGIN_PATH, TensorRT on LD_LIBRARY_PATH) and the input files' shape, and writes outputs in the tools'
documented formats (llm_build: ``llm.engine`` + ``config.json`` with ``builder_config``; llm_inference: the
``responses`` file; llm_bench: the ``e2e_*.csv`` timing files). Nothing is computed: an engine file holds a marker,
timings are fixed numbers, and a response is the text ``$TRT_STANDIN_ANSWERS`` (a JSON file, prompt -> text) gives
for its prompt, else ``STAND-IN <prompt>``. Whatever it writes is marked stand-in and is never evidence of anything.
``$TRT_STANDIN_LOG`` (optional) receives one JSON line per call: tool, options, the TensorRT environment.
Usage: ``standin_llm_tools.py TOOL [--opt value ...]`` (tests/fixtures/trt_standin/ holds executables calling it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# tool -> (options taking a value, flags, required options); names as in the tools' getopt tables.
INTERFACES = {
    "llm_build": ({"onnxDir", "engineDir", "maxInputLen", "maxKVCacheCapacity", "maxBatchSize"}, set(),
                  {"onnxDir", "engineDir"}),
    "llm_inference": ({"engineDir", "inputFile", "outputFile", "checkpointDir", "warmup", "maxGenerateLength",
                       "batchSize"}, {"dumpOutput"}, {"engineDir", "inputFile"}),
    "llm_bench": ({"engineDir", "mode", "inputLen", "pastKVLen", "iterations", "warmup", "batchSize", "outputDir"},
                  set(), {"engineDir", "mode"}),
}
INT_OPTIONS = {"maxInputLen", "maxKVCacheCapacity", "maxBatchSize", "warmup", "maxGenerateLength", "batchSize",
               "inputLen", "pastKVLen", "iterations"}


def fail(message: str) -> None:
    sys.stderr.write(f"stand-in: {message}\n")
    sys.exit(2)


def parse(tool: str, argv: list[str]) -> dict[str, str]:
    valued, flags, required = INTERFACES[tool]
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            fail(f"{tool}: unexpected argument {arg!r}")
        name = arg[2:]
        if name in flags:
            opts[name] = "1"
            i += 1
            continue
        if name not in valued:
            fail(f"{tool}: unknown option --{name}")
        if i + 1 >= len(argv):
            fail(f"{tool}: --{name} needs a value")
        value = argv[i + 1]
        if name in INT_OPTIONS and not value.isdigit():
            fail(f"{tool}: --{name} takes an integer, got {value!r}")
        opts[name] = value
        i += 2
    missing = sorted(required - set(opts))
    if missing:
        fail(f"{tool}: missing {', '.join('--' + m for m in missing)}")
    return opts


def check_env() -> None:
    plugin = os.environ.get("EDGELLM_PLUGIN_PATH", "")
    if not plugin.endswith(".so"):
        fail(f"EDGELLM_PLUGIN_PATH must name the plugin library, got {plugin!r}")
    trt = os.environ.get("TRT_PACKAGE_DIR", "")
    if not trt or f"{trt}/lib" not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        fail("TensorRT's lib directory is not on LD_LIBRARY_PATH")


def log_call(tool: str, opts: dict[str, str]) -> None:
    path = os.environ.get("TRT_STANDIN_LOG")
    if path:
        env = {k: os.environ.get(k) for k in ("TRT_PACKAGE_DIR", "EDGELLM_PLUGIN_PATH", "LD_LIBRARY_PATH")}
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"tool": tool, "opts": opts, "env": env, "cwd": os.getcwd()}) + "\n")


def answers() -> dict[str, str]:
    path = os.environ.get("TRT_STANDIN_ANSWERS")
    return json.loads(Path(path).read_text()) if path else {}


def main(tool: str, argv: list[str]) -> None:
    if tool not in INTERFACES:
        fail(f"unknown tool {tool!r}")
    opts = parse(tool, argv)
    check_env()
    log_call(tool, opts)
    if tool == "llm_build":
        config_file = Path(opts["onnxDir"]) / "config.json"
        if not config_file.is_file():
            fail(f"config.json not found in onnx directory: {opts['onnxDir']}")
        if not (Path(opts["onnxDir"]) / "model.onnx").is_file():
            fail(f"model.onnx not found in onnx directory: {opts['onnxDir']}")
        engine = Path(opts["engineDir"])
        engine.mkdir(parents=True, exist_ok=True)
        (engine / "stand_in.json").write_text(json.dumps({"stand_in": True, "args": opts}))
        (engine / "llm.engine").write_bytes(b"STAND-IN: not a TensorRT engine\n")
        config = json.loads(config_file.read_text())
        config["builder_config"] = {"maxInputLen": int(opts.get("maxInputLen", 1024)),
                                    "maxKVCacheCapacity": int(opts.get("maxKVCacheCapacity", 4096)),
                                    "maxBatchSize": int(opts.get("maxBatchSize", 4))}
        (engine / "config.json").write_text(json.dumps(config, indent=2))
    elif tool == "llm_inference":
        data = json.loads(Path(opts["inputFile"]).read_text())
        if not isinstance(data.get("requests"), list) or not data["requests"]:
            fail("input file needs a non-empty 'requests' list")
        batch = int(data.get("batch_size", 1))
        responses = []
        for n, request in enumerate(data["requests"]):
            messages = request.get("messages")
            if not messages or any(set(m) != {"role", "content"} for m in messages):
                fail(f"request {n}: messages must be [{{role, content}}, ...]")
            prompt = messages[-1]["content"]
            text = answers().get(prompt, f"STAND-IN {prompt}")
            responses.append({"output_text": text, "request_idx": n // batch,
                              "batch_idx": n % batch, "messages": messages})
        if "outputFile" in opts:
            Path(opts["outputFile"]).write_text(json.dumps({"input_file": opts["inputFile"], "stand_in": True,
                                                            "responses": responses}))
    else:
        if opts["mode"] not in ("prefill", "decode"):
            fail(f"llm_bench: mode {opts['mode']!r} is not prefill or decode")
        needed = "inputLen" if opts["mode"] == "prefill" else "pastKVLen"
        if needed not in opts:
            fail(f"llm_bench {opts['mode']}: --{needed} is required")
        if "outputDir" in opts:  # the documented E2E timing files, fixed numbers (nothing ran)
            out = Path(opts["outputDir"])
            out.mkdir(parents=True, exist_ok=True)
            length = int(opts[needed])
            name = f"e2e_prefill_inputlen{length}" if opts["mode"] == "prefill" else f"e2e_decode_pastkvlen{length}"
            tokens = length if opts["mode"] == "prefill" else 1
            e2e_ms = 2.0
            column = "input_len" if opts["mode"] == "prefill" else "past_kv_len"
            (out / f"{name}.csv").write_text(
                f"mode,batch_size,osl,e2e_time_ms,per_token_ms,throughput_tps,{column}\n"
                f"{opts['mode']},{opts.get('batchSize', '1')},1,{e2e_ms:.4f},{e2e_ms / tokens:.4f},"
                f"{1000.0 * tokens / e2e_ms:.4f},{length}\n")
            rows = "".join(f"{opts['mode']},1,{opts.get('inputLen', -1)},{opts.get('pastKVLen', -1)},{i},{e2e_ms:.6f}\n"
                           for i in range(int(opts.get("iterations", "10"))))
            (out / f"{name}_samples.csv").write_text(f"mode,batch_size,input_len,past_kv_len,iteration,latency_ms\n"
                                                     f"{rows}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
