"""STAND-IN for TensorRT Edge-LLM's C++ tools (llm_build, llm_inference, llm_bench), which need TensorRT and a GPU.

It only checks what it receives: the option names and values of the documented interfaces, the environment
(EDGELLM_PLUGIN_PATH, TensorRT on LD_LIBRARY_PATH) and the input files' shape. Whatever it writes is marked
``"stand_in": true`` and is never evidence of anything. Usage: ``standin_llm_tools.py TOOL [--opt value ...]``.
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


def main(tool: str, argv: list[str]) -> None:
    if tool not in INTERFACES:
        fail(f"unknown tool {tool!r}")
    opts = parse(tool, argv)
    check_env()
    if tool == "llm_build":
        if not (Path(opts["onnxDir"]) / "config.json").is_file():
            fail(f"config.json not found in onnx directory: {opts['onnxDir']}")
        engine = Path(opts["engineDir"])
        engine.mkdir(parents=True, exist_ok=True)
        (engine / "stand_in.json").write_text(json.dumps({"stand_in": True, "args": opts}))
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
            responses.append({"output_text": f"STAND-IN {messages[-1]['content']}", "request_idx": n // batch,
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
