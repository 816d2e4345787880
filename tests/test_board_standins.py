"""The JetPack-like board of tests/fixtures/board.py and its STAND-IN tools, driven over SSH and on this machine.

Each check names what the real tool does (research/trt_edgellm_tools.md; NVIDIA/TensorRT-Edge-LLM 0.10.0 sources):
glibc getopt_long parsing, log format and streams, exit codes, files and schemas, the loader's exit 127, the plugin
found late, attention head sizes, the kernel's OOM kill, version checks; then nvpmodel, jetson_clocks, tegrastats and
the fake root; then that the board's python3 has no access to this repository. At the end, the driver reads what the
real tools write where it once disagreed with them (builder_config keys, llm_bench's one CSV, request_idx). Last,
the direct builder ``tensorrt-edgellm-build`` (the 0.11.0 package's ``experimental/builder/cli.py``): its argparse
command line compared with the real tool's where that runs here (it stops at TensorRT only after parsing), what it
writes, and the runtime's need of the checkpoint it read.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import io
import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgefarm.toolchains.tensorrt_edgellm import device as trt
from edgellm.runtime.requests import GenerationRequest
from edgellm.types import BenchMode
from tests.fixtures.board import BOARD_FILES, JetsonBoard

REPO = BOARD_FILES.parents[2]

LOG_LINE = re.compile(r"^\[\d\d:\d\d:\d\d\.\d{3}\] \[(INFO|WARNING|ERROR|DEBUG)\] \[([\w.]+:\d+:\w+|TensorRT)\] .*$")
CONFIG = {"model": "llama", "model_type": "llama", "edgellm_version": "0.11.0", "spec_decode_type": "none",
          "engine_role": "llm", "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
          "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
          "max_position_embeddings": 2048, "rope_theta": 10000.0, "rms_norm_eps": 1e-05}
LIMITS = ["--maxBatchSize", "2", "--maxInputLen", "128", "--maxKVCacheCapacity", "256"]
TOOLS = ("llm_build", "llm_inference", "llm_bench")


# ---------------------------------------------------------------- helpers


def make_onnx(board: JetsonBoard, name: str = "onnx", drop: tuple[str, ...] = (), **overrides: object) -> Path:
    """An exporter-shaped ONNX dir in the board's work dir (model.onnx only names its plugin ops)."""
    directory = board.work_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in {**CONFIG, **overrides}.items() if v is not None}
    files = {"model.onnx": "STAND-IN graph: AttentionPlugin x4", "config.json": json.dumps(config),
             "tokenizer.json": "{}", "tokenizer_config.json": "{}", "chat_template.jinja": "{{ messages }}",
             "embedding.safetensors": "embedding"}
    for file, text in files.items():
        if file not in drop:
            (directory / file).write_text(text)
    subprocess.run(["chown", "-R", f"{board.user}:{board.user}", str(directory)], check=True)
    return directory


def build(board: JetsonBoard, onnx: Path, engine: Path, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return board.run([str(board.tool("llm_build")), "--onnxDir", str(onnx), "--engineDir", str(engine), *LIMITS,
                      *extra], env=env)


def requests_file(board: JetsonBoard, prompts: list[str], name: str = "requests.json", **top: object) -> Path:
    path = board.work_dir / name
    body = {"batch_size": 1, "temperature": 1.0, "top_k": 1, "max_generate_length": 32,
            "apply_chat_template": False, "add_generation_prompt": False,
            "requests": [{"messages": [{"role": "user", "content": p}]} for p in prompts], **top}
    path.write_text(json.dumps(body))
    subprocess.run(["chown", f"{board.user}:{board.user}", str(path)], check=True)
    return path


def infer(board: JetsonBoard, engine: Path, inputs: Path, output: Path, *extra: str,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return board.run([str(board.tool("llm_inference")), "--engineDir", str(engine), "--inputFile", str(inputs),
                      "--outputFile", str(output), *extra], env=env)


def bench(board: JetsonBoard, engine: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return board.run([str(board.tool("llm_bench")), "--engineDir", str(engine), *args])


def log_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[")]


def messages(text: str) -> list[str]:
    """The message part of each log line."""
    return [line.split("] ", 3)[3] for line in log_lines(text)]


@pytest.fixture(scope="module")
def engine(jetson_board: JetsonBoard) -> Path:
    """An engine built once on the session's board (the tests below only read it)."""
    onnx = make_onnx(jetson_board, "onnx-shared")
    done = build(jetson_board, onnx, jetson_board.work_dir / "engine-shared")
    assert done.returncode == 0, done.stderr
    return jetson_board.work_dir / "engine-shared"


@pytest.fixture(scope="module")
def spare_board(make_board: Callable[..., JetsonBoard]) -> JetsonBoard:
    return make_board("orin", name="orin-spare")


@pytest.fixture
def spare(spare_board: JetsonBoard) -> Iterator[JetsonBoard]:
    """A board a test may break: reset to a fresh one afterwards."""
    yield spare_board
    spare_board.reset()


@pytest.fixture(scope="module")
def thor(make_board: Callable[..., JetsonBoard]) -> JetsonBoard:
    return make_board("thor")


# ---------------------------------------------------------------- the board itself


def test_board_starts_fast_and_reads_like_an_inventory(make_board: Callable[..., JetsonBoard]) -> None:
    start = time.monotonic()
    board = make_board("orin", name="orin-timed")
    elapsed = time.monotonic() - start
    try:
        assert elapsed < 2.0, f"provisioning took {elapsed:.2f} s"
        device = board.device()
        assert (device.type, device.host, device.port, device.user) == ("orin", "127.0.0.1", board.port, board.user)
        assert device.env["AGENT_SYSROOT"] == str(board.sysroot)
        builds = trt.DeviceBuilds.from_inventory(device.toolchains["tensorrt-edgellm"], device=device.id)
        install = builds.build("0.11.0")
        assert (str(install.build_dir), install.version, install.standin) == (str(board.build_dir), "0.11.0", True)
        assert Path(install.tool("llm_build")) == board.tool("llm_build")
        entry = board.inventory_entry()
        assert entry["host_key"] == board.host_key and entry["host_key"].startswith("ssh-ed25519 ")
        assert entry["python"] == str(board.bin_dir / "python3")
        assert (board.trt_package_dir / "lib" / "libnvinfer.so.10").resolve().name == "libnvinfer.so.10.3.0"
        assert board.plugin_path.resolve().name == "libNvInfer_edgellm_plugin.so.1.0"
    finally:
        board.close()


def test_login_environment_and_tools_on_path(jetson_board: JetsonBoard) -> None:
    done = jetson_board.ssh("echo $DEVICE_NAME; echo $AGENT_SYSROOT; command -v python3 nvpmodel jetson_clocks "
                            "tegrastats; id -un")
    assert done.rc == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:2] == [jetson_board.id, str(jetson_board.sysroot)]
    assert lines[2:6] == [str(jetson_board.bin_dir / t) for t in ("python3", "nvpmodel", "jetson_clocks", "tegrastats")]
    assert lines[6] == jetson_board.user


def test_board_python_has_only_the_standard_library(jetson_board: JetsonBoard) -> None:
    for module in ("edgellm", "numpy", "paramiko", "toolchains", "devices"):
        done = jetson_board.ssh(f"cd {REPO} && PYTHONPATH={REPO} python3 -c 'import {module}'")
        assert done.rc == 1 and f"No module named '{module}'" in done.stderr, (module, done)
    done = jetson_board.ssh("python3 -c 'import json, hashlib, sys; print(sys.flags.isolated, sys.flags.no_site)'")
    assert (done.rc, done.stdout.split()) == (0, ["1", "1"])
    # the repository is out of the board user's reach whatever its path
    done = jetson_board.run([jetson_board.python, "-c", "import edgellm"], cwd=jetson_board.work_dir,
                            env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 1 and "No module named 'edgellm'" in done.stderr


def test_standin_sources_are_stdlib_only_python_3_8() -> None:
    stdlib = set(sys.stdlib_module_names)
    scripts = [p for p in (BOARD_FILES / "tools").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(scripts) == 10
    for script in scripts:
        text = script.read_text()
        if not script.suffix:
            assert text.startswith("#!/usr/bin/env python3\n") and script.stat().st_mode & 0o111, script
        tree = ast.parse(text, feature_version=(3, 8))
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= stdlib | {"__future__", "_edgellm_standin", "_jetson_standin", "_direct_build_standin"}, (
            script, imported)


def test_fake_root_reports_jetpack_6_orin(jetson_board: JetsonBoard) -> None:
    release = jetson_board.read("etc/nv_tegra_release").splitlines()
    m = re.match(r"^# R(\d+) \(release\), REVISION: ([\d.]+), GCID: \d+, BOARD: generic, EABI: aarch64, DATE: .+$",
                 release[0])
    assert m and f"{m.group(1)}.{m.group(2)}" == "36.4.3" and len(release) == 1
    status = jetson_board.read("var/lib/dpkg/status")
    stanzas = {s.split("\n")[0].removeprefix("Package: "): s for s in status.strip().split("\n\n")}
    for package, version in (("nvidia-l4t-core", "36.4.3-"), ("tensorrt", "10.3.0.30-1+cuda12.5"),
                             ("libnvinfer10", "10.3.0.30-1+cuda12.5"), ("nvidia-jetpack", "6.2"),
                             ("cuda-runtime-12-6", "12.6")):
        assert "Status: install ok installed" in stanzas[package]
        assert re.search(rf"^Version: {re.escape(version)}", stanzas[package], re.M), package
    assert json.loads(jetson_board.read("usr/local/cuda/version.json"))["cuda"]["version"].startswith("12.6.")
    assert jetson_board.read("var/lib/nvpmodel/status") == "pmode:0000\n"
    zones = sorted((jetson_board.sysroot / "sys/class/thermal").glob("thermal_zone*"))
    assert {(z / "type").read_text().strip() for z in zones} >= {"cpu-thermal", "tj-thermal"}
    assert all(20000 < int((z / "temp").read_text()) < 110000 for z in zones)  # milli-degrees C
    gpu = jetson_board.sysroot / "sys/class/devfreq/17000000.ga10b"
    assert int((gpu / "cur_freq").read_text()) == int((gpu / "max_freq").read_text()) == 1300500000


def test_fake_root_reports_jetpack_7_thor(thor: JetsonBoard) -> None:
    release = thor.read("etc/nv_tegra_release").splitlines()
    assert release[0].startswith("# R38 (release), REVISION: 2.1, ") and release[1] == "# KERNEL_VARIANT: oot"
    status = thor.read("var/lib/dpkg/status")
    assert "Package: tensorrt\n" in status and "Version: 10.13.3.9-1+cuda13.0" in status
    assert json.loads(thor.read("usr/local/cuda/version.json"))["cuda"]["version"].startswith("13.0")
    assert (thor.sysroot / "sys/class/devfreq/gpu-gpc-0/cur_freq").is_file()
    assert (thor.trt_package_dir / "lib" / "libnvinfer.so.10").resolve().name == "libnvinfer.so.10.13.3"


# ---------------------------------------------------------------- option parsing (glibc getopt_long)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_exits_0_with_usage_on_stderr(jetson_board: JetsonBoard, tool: str) -> None:
    done = jetson_board.ssh(f"{jetson_board.tool(tool)} --help")
    assert (done.rc, done.stdout) == (0, "")
    assert done.stderr.startswith(f"Usage: {jetson_board.tool(tool)} ")
    local = jetson_board.run([str(jetson_board.tool(tool)), "--he"])  # an unambiguous prefix
    assert (local.returncode, local.stdout) == (0, "") and local.stderr == done.stderr


def test_build_takes_both_forms_and_prefixes(jetson_board: JetsonBoard) -> None:
    onnx = make_onnx(jetson_board, "onnx-forms")
    engine = jetson_board.work_dir / "engine-forms"
    done = jetson_board.ssh(f"{jetson_board.tool('llm_build')} --onnx={onnx} --engineDir {engine} --maxBatch=3 "
                            "--maxInputLen 100 --maxKVCache=300 --maxL 0 --profilingD positional-ignored",
                            env={"EDGELLM_PLUGIN_PATH": str(jetson_board.plugin_path)})
    assert done.rc == 0, done.stderr
    config = json.loads((engine / "config.json").read_text())
    assert config["builder_config"] == {"max_input_len": 100, "spec_draft": False, "spec_base": False,
                                        "max_batch_size": 3, "max_lora_rank": 0, "max_kv_cache_capacity": 300,
                                        "max_kv_pool_pages": 3 * math.ceil(300 / 128)}


@pytest.mark.parametrize(("tool", "argv", "glibc"), [
    ("llm_build", ["--foo=1"], "unrecognized option '--foo=1'"),
    ("llm_build", ["--spec"], "option '--spec' is ambiguous; possibilities: '--specDraft' '--specBase'"),
    ("llm_build", ["--maxKV", "1"], "option '--maxKV' is ambiguous; possibilities: '--maxKVCacheCapacity' "
                                    "'--maxKVPoolPages'"),
    ("llm_build", ["--debug=yes"], "option '--debug' doesn't allow an argument"),
    ("llm_build", ["--onnxDir"], "option '--onnxDir' requires an argument"),
    ("llm_build", ["-h"], "invalid option -- 'h'"),
    ("llm_inference", ["--engineDir", "e", "--bogus"], "unrecognized option '--bogus'"),
    ("llm_bench", ["--mode", "decode", "--past", "3", "--turbo"], "unrecognized option '--turbo'"),
])
def test_bad_options_are_refused_like_glibc(jetson_board: JetsonBoard, tool: str, argv: list[str],
                                            glibc: str) -> None:
    prog = str(jetson_board.tool(tool))
    done = jetson_board.run([prog, *argv])
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == f"{prog}: {glibc}"
    follow = [m for m in messages(done.stderr)]
    if tool == "llm_build":
        assert follow == ["Invalid Argument ? is (null).", "Unable to parse builder args."]
    elif tool == "llm_bench":
        assert follow == ["Unable to parse args."]
    else:
        assert follow == []  # llm_inference: the glibc line and the usage only
    assert lines[len(follow) + 1].startswith(f"Usage: {prog} ")


def test_missing_required_options(jetson_board: JetsonBoard) -> None:
    build_tool, infer_tool, bench_tool = (str(jetson_board.tool(t)) for t in TOOLS)
    done = jetson_board.run([build_tool])
    assert done.returncode == 1 and messages(done.stderr) == ["Unable to parse builder args."]
    done = jetson_board.run([build_tool, "--engineDir", "e"])
    assert done.returncode == 1 and messages(done.stderr) == ["config.json not found in onnx directory: "]
    done = jetson_board.run([infer_tool, "--inputFile", "in.json", "--engineDir", "e"])
    assert done.returncode == 1
    assert messages(done.stdout) == ["args.inputFile: in.json", "args.engineDir: e"]
    assert messages(done.stderr) == ["ERROR: --outputFile is required"]
    assert "Usage: " in done.stderr
    done = jetson_board.run([bench_tool, "--engineDir", "e"])
    assert done.returncode == 1 and messages(done.stderr) == ["--mode is required. Use --help for available modes."]
    done = jetson_board.run([bench_tool, "--engineDir", "e", "--mode", "prefill"])
    assert done.returncode == 1 and messages(done.stderr) == ["--inputLen is required for prefill mode"]
    done = jetson_board.run([bench_tool, "--engineDir", "e", "--mode", "turbo"])
    assert done.returncode == 1 and messages(done.stderr) == ["Invalid mode: turbo", "Unable to parse args."]


def test_bad_numbers(jetson_board: JetsonBoard) -> None:
    build_tool, infer_tool, bench_tool = (str(jetson_board.tool(t)) for t in TOOLS)
    # llm_build: std::stoi throws and nothing catches it: terminate -> SIGABRT (134 from a shell)
    done = jetson_board.run([build_tool, "--onnxDir", "o", "--maxBatchSize", "many"])
    assert done.returncode == -6
    assert done.stderr.splitlines()[-2:] == [
        "terminate called after throwing an instance of 'std::invalid_argument'", "  what():  stoi"]
    over_ssh = jetson_board.ssh(f"{build_tool} --maxInputLen 99999999999; echo rc=$?")
    assert over_ssh.stdout.strip().endswith("rc=134") and "std::out_of_range" in over_ssh.stderr
    # stoi reads a leading number and ignores the rest
    assert jetson_board.run([build_tool, "--maxBatchSize", "4x", "--help"]).returncode == 0
    done = jetson_board.run([infer_tool, "--warmup", "abc"])
    assert done.returncode == 1 and messages(done.stderr) == ["Invalid warmup value: abc"]
    done = jetson_board.run([infer_tool, "--batchSize=0"])
    assert done.returncode == 1 and messages(done.stderr) == ["Invalid batchSize value: 0 (must be positive)"]
    done = jetson_board.run([bench_tool, "--iterations", "ten"])
    assert done.returncode == 1 and messages(done.stderr) == ["Failed to parse argument: stoi", "Unable to parse args."]


# ---------------------------------------------------------------- llm_build


def test_build_writes_engine_config_and_copies(jetson_board: JetsonBoard, engine: Path) -> None:
    names = sorted(p.name for p in engine.iterdir())
    assert names == ["chat_template.jinja", "config.json", "embedding.safetensors", "llm.engine",
                     "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((engine / "config.json").read_text())
    assert {k: v for k, v in config.items() if k in CONFIG} == CONFIG  # the export's config, carried over
    assert config["builder_config"] == {"max_input_len": 128, "spec_draft": False, "spec_base": False,
                                        "max_batch_size": 2, "max_lora_rank": 0, "max_kv_cache_capacity": 256,
                                        "max_kv_pool_pages": 4}
    assert config["num_deepstack_features"] == 0
    assert list(config) == sorted(config)  # nlohmann::json dumps keys sorted
    description = json.loads((engine / "llm.engine").read_text())
    onnx_config = jetson_board.work_dir / "onnx-shared" / "config.json"
    assert description["onnx_config_sha256"] == hashlib.sha256(onnx_config.read_bytes()).hexdigest()
    assert (description["trt_version"], description["edgellm_release"], description["sm"]) == (
        "10.3.0.30", "0.11.0", 87)
    assert description["builder_config"] == config["builder_config"]


def test_build_log_lines_and_streams(jetson_board: JetsonBoard) -> None:
    onnx = make_onnx(jetson_board, "onnx-log")
    engine = jetson_board.work_dir / "engine-log"
    done = build(jetson_board, onnx, engine)
    assert done.returncode == 0 and done.stderr == ""
    assert all(LOG_LINE.match(line) for line in done.stdout.splitlines()), done.stdout
    assert messages(done.stdout) == [
        "Using TRT_VERSION=10.3.0", f"EDGELLM_PLUGIN_PATH: {jetson_board.plugin_path}",
        f"Parsing ONNX model: {onnx}/model.onnx", f"Created directory {engine} for saving LLM engine.",
        f"Engine saved to {engine}/llm.engine", f"Copied config.json with builder config to {engine}/config.json",
        "Copied tokenizer file: tokenizer_config.json", "Copied tokenizer file: tokenizer.json",
        "Copied tokenizer file: chat_template.jinja",
        f"Copied embedding.safetensors to {engine}/embedding.safetensors", "LLM engine built successfully."]
    assert log_lines(done.stdout)[-1].split("] ")[2] == "[llm_build.cpp:261:main"
    debug = build(jetson_board, onnx, engine, "--debug")
    assert debug.returncode == 0 and "[DEBUG] [llmBuilder.cpp:212:build] ONNX parsing complete." in debug.stdout


def test_build_checks_what_the_real_one_trips_on(jetson_board: JetsonBoard) -> None:
    missing_onnx = make_onnx(jetson_board, "onnx-no-model", drop=("model.onnx",))
    done = build(jetson_board, missing_onnx, jetson_board.work_dir / "e1")
    assert done.returncode == 1
    assert messages(done.stderr)[-2:] == [f"Failed to parse ONNX file: {missing_onnx}/model.onnx",
                                          "Failed to build LLM engine."]
    no_tokenizer = make_onnx(jetson_board, "onnx-no-tok", drop=("tokenizer.json",))
    done = build(jetson_board, no_tokenizer, jetson_board.work_dir / "e2")
    assert done.returncode == 1
    assert messages(done.stderr) == ["Failed to copy tokenizer file tokenizer.json", "Failed to build LLM engine."]
    assert (jetson_board.work_dir / "e2" / "llm.engine").is_file()  # written before the copies failed
    no_embedding = make_onnx(jetson_board, "onnx-no-emb", drop=("embedding.safetensors",))
    done = build(jetson_board, no_embedding, jetson_board.work_dir / "e3")
    assert done.returncode == 1 and messages(done.stderr)[0].startswith("Failed to copy embedding.safetensors from ")
    wrong_role = make_onnx(jetson_board, "onnx-base", engine_role="base", spec_decode_type="eagle3")
    done = build(jetson_board, wrong_role, jetson_board.work_dir / "e4")
    assert done.returncode == 1 and messages(done.stderr)[0].startswith(
        "Build mode does not match config: engine_role='base' (use --specBase for base")
    done = build(jetson_board, wrong_role, jetson_board.work_dir / "e4", "--specBase")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (jetson_board.work_dir / "e4").glob("*base*")) == ["base_config.json",
                                                                                    "spec_base.engine"]
    no_heads = make_onnx(jetson_board, "onnx-no-heads", num_attention_heads=None)
    done = build(jetson_board, no_heads, jetson_board.work_dir / "e5")
    assert done.returncode == -6 and "[json.exception.type_error.302] type must be number, but is null" in done.stderr


@pytest.mark.parametrize(("head_dim", "heads", "kv_heads", "ok", "warning"), [
    (64, 8, 4, True, False), (128, 32, 8, True, False), (256, 8, 4, True, False), (32, 8, 8, True, True),
    (8, 8, 4, False, False), (96, 8, 8, False, False), (256, 8, 8, True, False), (64, 8, 3, False, False)])
def test_attention_head_sizes(jetson_board: JetsonBoard, head_dim: int, heads: int, kv_heads: int, ok: bool,
                              warning: bool) -> None:
    onnx = make_onnx(jetson_board, f"onnx-h{head_dim}-{heads}-{kv_heads}", head_dim=head_dim,
                     num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=head_dim * heads)
    done = build(jetson_board, onnx, jetson_board.work_dir / f"engine-h{head_dim}-{heads}-{kv_heads}")
    assert (done.returncode == 0) is ok, done.stderr
    no_prefill = f"AttentionPlugin: no prefill kernel for headSize={head_dim}; only decode (XQA) is supported."
    assert (no_prefill in messages(done.stderr)) is warning
    if not ok:
        assert messages(done.stderr)[0] == (f"Cannot implement AttentionPlugin configuration. SM: 87, HeadSize: "
                                            f"{head_dim}, NumQHeads: {heads}, NumKVHeads: {kv_heads}")
        assert "Failed to create AttentionPlugin: Cannot implement the AttentionPlugin configuration." in \
            messages(done.stderr)
        assert messages(done.stderr)[-1] == "Failed to build LLM engine."


def test_stories260k_shape_is_refused_on_thor_too(thor: JetsonBoard) -> None:
    """head_dim 8 (hidden 64 / 8 heads, the farm's stories260K): no attention kernel on any SM."""
    onnx = make_onnx(thor, "onnx-stories", hidden_size=64, num_attention_heads=8, num_key_value_heads=4,
                     head_dim=None)
    done = build(thor, onnx, thor.work_dir / "engine-stories")
    assert done.returncode == 1
    assert messages(done.stderr)[0] == ("Cannot implement AttentionPlugin configuration. SM: 101, HeadSize: 8, "
                                        "NumQHeads: 8, NumKVHeads: 4")  # Thor's SM 110 is renumbered to 101


def test_fp8_kv_cache_needs_sm89_or_later(jetson_board: JetsonBoard, thor: JetsonBoard) -> None:
    done = build(jetson_board, make_onnx(jetson_board, "onnx-fp8kv", kv_cache_dtype="fp8"),
                 jetson_board.work_dir / "engine-fp8kv")
    assert done.returncode == 1
    assert messages(done.stderr)[0] == (
        f"Failed to create AttentionPlugin: {jetson_board.source_dir}/cpp/plugins/attentionPlugin/attentionPlugin.cpp"
        ":488: FP8 KV cache is supported only on SM89, SM100, SM101, SM110, SM120, and SM121; got SM87.")
    done = build(thor, make_onnx(thor, "onnx-fp8kv", kv_cache_dtype="fp8"), thor.work_dir / "engine-fp8kv")
    assert done.returncode == 0, done.stderr
    assert "Using __LUNOWUD=-peep:match_dual_gemm=off" in messages(done.stdout)  # TensorRT 10.13


def test_kv_pool_checks_abort(jetson_board: JetsonBoard) -> None:
    onnx = make_onnx(jetson_board, "onnx-pool")
    done = build(jetson_board, onnx, jetson_board.work_dir / "engine-pool", "--maxKVPoolPages", "3")
    assert done.returncode == -6
    assert done.stderr.splitlines()[-1] == (
        f"  what():  {jetson_board.source_dir}/cpp/builder/llmBuilder.h:71: LLMBuilderConfig: maxKVPoolPages (3) must "
        "be zero or at least the minimum active pages (4).")


# ---------------------------------------------------------------- environment: loader, plugin, OOM, disk


def test_without_libnvinfer_the_loader_exits_127(spare: JetsonBoard) -> None:
    spare.remove_libnvinfer()
    for tool in TOOLS:
        local = spare.run([str(spare.tool(tool)), "--help"])
        remote = spare.ssh(f"{spare.tool(tool)} --help")
        for rc, out, err in ((local.returncode, local.stdout, local.stderr), (remote.rc, remote.stdout, remote.stderr)):
            assert (rc, out) == (127, ""), (tool, err)
            assert err == (f"{spare.tool(tool)}: error while loading shared libraries: libnvinfer.so.10: cannot open "
                           "shared object file: No such file or directory\n")
    done = spare.run([str(spare.tool("llm_build")), "--help"], env={"LD_LIBRARY_PATH": "/nowhere"})
    assert done.returncode == 127


def test_missing_plugin_fails_later_with_exit_1(spare: JetsonBoard, engine: Path) -> None:
    onnx = make_onnx(spare, "onnx-plugin")
    missing = str(spare.build_dir / "libNvInfer_edgellm_plugin.so.missing")
    done = build(spare, onnx, spare.work_dir / "engine-plugin", env={"EDGELLM_PLUGIN_PATH": missing})
    assert done.returncode == 1
    errors = messages(done.stderr)
    assert errors[0] == (f"Cannot open plugin library: {missing}: cannot open shared object file: No such file or "
                         "directory")
    assert errors[-2:] == [f"Failed to parse ONNX file: {onnx}/model.onnx", "Failed to build LLM engine."]
    assert f"Parsing ONNX model: {onnx}/model.onnx" in messages(done.stdout)  # it carried on after the error
    assert not (spare.work_dir / "engine-plugin").exists()
    # unset: the default path, relative to the working directory
    env_unset = spare.run(["env", "-u", "EDGELLM_PLUGIN_PATH", str(spare.tool("llm_build")), "--onnxDir", str(onnx),
                           "--engineDir", str(spare.work_dir / "engine-plugin")])
    assert env_unset.returncode == 1
    assert "EDGELLM_PLUGIN_PATH variable is not set. Default to build/libNvInfer_edgellm_plugin.so" in messages(
        env_unset.stdout)
    from_build_parent = spare.run(["env", "-u", "EDGELLM_PLUGIN_PATH", str(spare.tool("llm_build")), "--onnxDir",
                                   str(onnx), "--engineDir", str(spare.work_dir / "engine-plugin")],
                                  cwd=spare.source_dir)
    assert from_build_parent.returncode == 0, from_build_parent.stderr
    # inference: the engine cannot be deserialized without the plugin's creators
    spare_engine = spare.work_dir / "engine-plugin"
    inputs = requests_file(spare, ["hello"])
    done = infer(spare, spare_engine, inputs, spare.work_dir / "out.json", env={"EDGELLM_PLUGIN_PATH": missing})
    assert done.returncode == 1
    assert messages(done.stderr)[-1] == (f"Failed to initialize runtime: Failed to initialize base EngineExecutor: "
                                         f"Failed to deserialize TensorRT engine from file: {spare_engine}/llm.engine")
    assert any("Cannot deserialize plugin since corresponding IPluginCreator not found" in m
               for m in messages(done.stderr))
    spare.remove_plugin()
    done = bench(spare, spare_engine, "--mode", "decode", "--pastKVLen", "16")
    assert done.returncode == 1 and messages(done.stderr)[-1].startswith("Failed to create EngineExecutor: Failed to "
                                                                         "deserialize TensorRT engine from file: ")


def test_oom_kills_the_build_with_sigkill(spare: JetsonBoard) -> None:
    onnx = make_onnx(spare, "onnx-oom")
    spare.oom_next_build()
    done = build(spare, onnx, spare.work_dir / "engine-oom")
    assert done.returncode == -9
    assert done.stderr == "" and messages(done.stdout)[-1] == f"Parsing ONNX model: {onnx}/model.onnx"
    assert not (spare.work_dir / "engine-oom").exists()
    kern = spare.read("var/log/kern.log")
    assert re.search(r"Out of memory: Killed process \d+ \(llm_build\) total-vm:\d+kB, anon-rss:\d+kB", kern)
    assert build(spare, onnx, spare.work_dir / "engine-oom").returncode == 0  # the marker is for one build
    spare.oom_next_build()
    over_ssh = spare.ssh(f"{spare.tool('llm_build')} --onnxDir {onnx} --engineDir {spare.work_dir}/engine-oom2; "
                         "echo rc=$?", env={"EDGELLM_PLUGIN_PATH": str(spare.plugin_path)})
    assert over_ssh.stdout.strip().splitlines()[-1] == "rc=137"
    done = build(spare, onnx, spare.work_dir / "engine-oom3", env={"EDGELLM_STANDIN_OOM": "1"})
    assert done.returncode == -9
    spare.log_oom("llm_inference", pid=77)
    assert "Killed process 77 (llm_inference)" in spare.read("var/log/kern.log")


def test_full_disk(spare: JetsonBoard, engine: Path) -> None:
    onnx = make_onnx(spare, "onnx-disk")
    good = spare.work_dir / "engine-disk-good"
    assert build(spare, onnx, good).returncode == 0
    spare.disk_full()
    done = build(spare, onnx, spare.work_dir / "engine-disk")
    assert done.returncode == 1
    assert messages(done.stderr) == [f"Failed to write engine to file: {spare.work_dir}/engine-disk/llm.engine",
                                     "Failed to build LLM engine."]
    out = spare.work_dir / "out-disk.json"
    done = infer(spare, good, requests_file(spare, ["hi"]), out)
    assert done.returncode == 0 and out.read_text() == ""  # std::ofstream fails silently: an empty output file
    spare.disk_full(False)
    filler = spare.fill_cache(5 * 2**30)
    assert filler.stat().st_size == 5 * 2**30 and filler.owner() == spare.user


# ---------------------------------------------------------------- llm_inference


def test_inference_output_schema(jetson_board: JetsonBoard, engine: Path) -> None:
    inputs = requests_file(jetson_board, ["Once upon a time", "The cat", "A dog"], "req-schema.json", batch_size=2)
    answers = jetson_board.work_dir / "answers.json"
    answers.write_text(json.dumps({"The cat": "sat on the mat."}))
    subprocess.run(["chown", jetson_board.user, str(answers)], check=True)
    out = jetson_board.work_dir / "out-schema.json"
    done = infer(jetson_board, engine, inputs, out, env={"TRT_STANDIN_ANSWERS": str(answers)})
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    data = json.loads(text)
    assert text.startswith('{\n    "input_file": ')  # json.dump(4), keys sorted
    assert data["input_file"] == str(inputs)
    responses = data["responses"]
    assert [(r["request_idx"], r["batch_idx"]) for r in responses] == [(0, 0), (1, 1), (2, 0)]
    assert [r["output_text"] for r in responses] == ["STAND-IN Once upon a time", "sat on the mat.", "STAND-IN A dog"]
    assert {r["finish_reason"] for r in responses} == {"end-of-sequence"}
    assert responses[1]["messages"] == [{"role": "user", "content": [{"type": "text", "text": "The cat"}]}]
    assert set(responses[0]) == {"output_text", "request_idx", "batch_idx", "finish_reason", "messages",
                                 "formatted_system_prompt", "formatted_complete_request"}
    assert messages(done.stdout)[-2:] == ["Processing complete: 2/2 batched requests successful",
                                          f"All responses exported to: {out}"]
    assert f"Base EngineExecutor successfully loaded from {engine}/llm.engine." in messages(done.stdout)


def test_inference_over_ssh_with_board_answers(jetson_board: JetsonBoard, engine: Path) -> None:
    jetson_board.set_answers({"Why?": "Because the stand-in says so."})
    inputs = requests_file(jetson_board, ["Why?"], "req-ssh.json", max_generate_length=3)
    out = jetson_board.work_dir / "out-ssh.json"
    done = jetson_board.ssh(f"{jetson_board.tool('llm_inference')} --engineDir={engine} --inputFile={inputs} "
                            f"--outputFile={out} --dumpOutput",
                            env={"EDGELLM_PLUGIN_PATH": str(jetson_board.plugin_path)})
    assert done.rc == 0, done.stderr
    response = json.loads(out.read_text())["responses"][0]
    assert (response["output_text"], response["finish_reason"]) == ("Because the stand-in", "max-length")
    assert "Response for request 0 batch 0 [finish=max-length]: Because the stand-in" in messages(done.stdout)
    jetson_board.set_answers({})


def test_inference_request_failures_still_write_the_output(jetson_board: JetsonBoard, engine: Path) -> None:
    inputs = requests_file(jetson_board, ["a", "b", "c"], "req-batch3.json", batch_size=3)  # the engine takes 2
    out = jetson_board.work_dir / "out-batch3.json"
    done = infer(jetson_board, engine, inputs, out)
    assert done.returncode == 1
    assert messages(done.stderr) == ["Requested batch size 3 exceeds maximum supported batch size 2",
                                     "*** FAILED *** Request 0 failed to process!", "*** 1 BATCHED REQUESTS FAILED ***"]
    responses = json.loads(out.read_text())["responses"]
    assert {(r["output_text"], r["finish_reason"]) for r in responses} == {
        ("TensorRT Edge LLM cannot handle this request. Fails.", "error")}
    bad = requests_file(jetson_board, [], "req-empty.json")
    done = infer(jetson_board, engine, bad, out)
    assert done.returncode == 1 and messages(done.stderr) == ["No valid requests found in input file."]
    bad.write_text(json.dumps({"batch_size": 17, "requests": []}))
    done = infer(jetson_board, engine, bad, out)
    assert messages(done.stderr) == ["Failed to parse input file: Input rejected: batch_size 17 exceeds limit 16. "
                                     "Limit defined in cpp/common/inputLimits.h."]
    done = infer(jetson_board, engine, jetson_board.work_dir / "nope.json", out)
    assert messages(done.stderr) == [f"Failed to parse input file: Failed to open input file: "
                                     f"{jetson_board.work_dir}/nope.json"]


def test_inference_engine_dir_errors(jetson_board: JetsonBoard, thor: JetsonBoard, engine: Path) -> None:
    inputs = requests_file(jetson_board, ["x"], "req-dir.json")
    out = jetson_board.work_dir / "out-dir.json"
    missing = jetson_board.work_dir / "no-engine"
    done = infer(jetson_board, missing, inputs, out)
    assert done.returncode == 1 and messages(done.stderr) == [
        f"Failed to initialize runtime: {jetson_board.source_dir}/cpp/runtime/state/externalWeightManager.cpp:72: "
        f"Failed to open runtime config: {missing}/config.json"]
    partial = jetson_board.work_dir / "engine-partial"
    partial.mkdir(exist_ok=True)
    for name in ("config.json", "embedding.safetensors"):
        (partial / name).write_bytes((engine / name).read_bytes())
    subprocess.run(["chown", "-R", jetson_board.user, str(partial)], check=True)
    done = infer(jetson_board, partial, inputs, out)  # TensorRT 10.3 (< 10.7) reads engines through mmap
    assert done.returncode == 1
    assert f"MmapReader: Cannot open file: {partial}/llm.engine" in done.stderr.splitlines()
    assert messages(done.stderr)[-1].endswith("/cpp/common/mmapReader.cpp:49: Failed to load file in MmapReader "
                                              "constructor")
    thor_partial = make_onnx(thor, "thor-partial", drop=("model.onnx",))
    thor_inputs = requests_file(thor, ["x"])
    done = infer(thor, thor_partial, thor_inputs, thor.work_dir / "out.json")  # TensorRT 10.13: a file stream
    assert messages(done.stderr)[-1] == (f"Failed to initialize runtime: Failed to initialize base EngineExecutor: "
                                         f"Failed to open engine file: {thor_partial}/llm.engine: No such file or "
                                         "directory")


def test_versions_warn_on_config_and_refuse_foreign_engines(spare: JetsonBoard, thor: JetsonBoard) -> None:
    old_export = make_onnx(spare, "onnx-old", edgellm_version="0.10.0")
    engine = spare.work_dir / "engine-old"
    done = build(spare, old_export, engine)
    warning = "Model version 0.10.0 does not match runtime version 0.11.0. Consider re-exporting or re-building."
    assert done.returncode == 0 and messages(done.stderr) == [warning]
    inputs = requests_file(spare, ["v"])
    done = infer(spare, engine, inputs, spare.work_dir / "out.json")
    assert done.returncode == 0 and messages(done.stderr) == [warning]  # a warning only, as in the real runtime
    no_version = make_onnx(spare, "onnx-nover", edgellm_version=None)
    done = build(spare, no_version, spare.work_dir / "engine-nover")
    assert done.returncode == 0
    assert messages(done.stderr) == ["Model does not have edgellm_version. Current runtime version: 0.11.0"]
    # the tools rebuilt at another release: an engine of the old build is refused
    spare.set_tools_version("0.12.0")
    done = infer(spare, spare.work_dir / "engine-nover", inputs, spare.work_dir / "out.json")
    assert done.returncode == 1
    errors = messages(done.stderr)
    assert "this engine was likely serialized by an older, incompatible build of this plugin; re-export and rebuild." \
        in errors[1]
    assert errors[-1] == (f"Failed to initialize runtime: Failed to initialize base EngineExecutor: {spare.source_dir}"
                          "/cpp/runtime/exec/engineExecutor.cpp:87: failed to create execution context")
    done = bench(spare, spare.work_dir / "engine-nover", "--mode", "prefill", "--inputLen", "16")
    assert done.returncode == 1 and messages(done.stderr)[-1].startswith("Failed to create EngineExecutor: ")
    # an engine of another TensorRT (and SM): TensorRT's own refusal
    foreign = thor.work_dir / "engine-from-orin"
    subprocess.run(["cp", "-r", str(engine), str(foreign)], check=True)
    subprocess.run(["chown", "-R", thor.user, str(foreign)], check=True)
    done = infer(thor, foreign, requests_file(thor, ["v"]), thor.work_dir / "out.json")
    assert done.returncode == 1
    assert ("IRuntime::deserializeCudaEngine: Error Code 6: API Usage Error (The engine plan file is not compatible "
            "with this version of TensorRT, expecting library version 10.13.3.9 got 10.3.0.30, please rebuild.)"
            ) in messages(done.stderr)


# ---------------------------------------------------------------- llm_bench


def test_bench_writes_the_e2e_csv(jetson_board: JetsonBoard, engine: Path) -> None:
    out = jetson_board.work_dir / "bench"
    done = bench(jetson_board, engine, "--mode", "prefill", "--inputLen", "64", "--iterations", "5", "--warmup", "1",
                 "--batchSize", "2", "--outputDir", str(out))
    assert done.returncode == 0, done.stderr
    done = bench(jetson_board, engine, "--mode=decode", "--pastKVLen=100", "--outputDir", str(out))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["e2e_decode_pastkvlen100.csv", "e2e_prefill_inputlen64.csv"]
    prefill = list(csv.DictReader(io.StringIO((out / "e2e_prefill_inputlen64.csv").read_text())))
    assert len(prefill) == 1
    row = prefill[0]
    assert list(row) == ["mode", "batch_size", "osl", "e2e_time_ms", "per_token_ms", "throughput_tps", "input_len"]
    assert (row["mode"], row["batch_size"], row["osl"], row["input_len"]) == ("prefill", "2", "1", "64")
    assert re.fullmatch(r"\d+\.\d{4}", row["e2e_time_ms"])
    assert float(row["per_token_ms"]) == pytest.approx(float(row["e2e_time_ms"]) / 64, abs=1e-4)
    assert float(row["throughput_tps"]) == pytest.approx(64000 / float(row["e2e_time_ms"]), rel=1e-3)
    decode = next(csv.DictReader(io.StringIO((out / "e2e_decode_pastkvlen100.csv").read_text())))
    assert list(decode)[-1] == "past_kv_len" and decode["mode"] == "decode"
    said = messages(done.stdout)
    assert said[:2] == ["=== LLM Profile Benchmark ===", "Mode: decode"]
    assert re.fullmatch(r"Decode E2E Time: \d+\.\d{4} \+/- \d+\.\d{4} ms",
                        next(m for m in said if "E2E Time:" in m and "+/-" in m))
    assert f"E2E timing CSV saved to: {out}/e2e_decode_pastkvlen100.csv" in said
    assert said[-1] == f"Output CSV files saved to: {out}"


def test_bench_reflects_power_state_and_limits(spare: JetsonBoard) -> None:
    onnx = make_onnx(spare, "onnx-bench")
    engine = spare.work_dir / "engine-bench"
    assert build(spare, onnx, engine).returncode == 0

    def decode_ms() -> float:
        done = bench(spare, engine, "--mode", "decode", "--pastKVLen", "32", "--outputDir", str(spare.work_dir / "b"))
        assert done.returncode == 0, done.stderr
        return float(next(csv.DictReader(io.StringIO(
            (spare.work_dir / "b" / "e2e_decode_pastkvlen32.csv").read_text())))["e2e_time_ms"])

    at_maxn = decode_ms()
    spare.set_power_mode("MODE_15W")
    assert decode_ms() > 1.5 * at_maxn
    done = bench(spare, engine, "--mode", "prefill", "--inputLen", "500")  # the engine was built for 128
    assert done.returncode == 1
    assert messages(done.stderr)[-1] == "Prefill warmup iteration 0 failed"
    done = bench(spare, engine, "--mode", "decode", "--pastKVLen", "8", "--osl", "4")
    assert done.returncode == 0
    assert re.search(r"\] Throughput: \d+\.\d\d tokens/sec$", done.stdout, re.M)
    done = bench(spare, engine, "--mode", "spec_verify", "--verifyTreeSize", "4", "--pastKVLen", "8")
    assert done.returncode == 1 and "Mode: eagle_verify" in messages(done.stdout)


# ---------------------------------------------------------------- nvpmodel, jetson_clocks, tegrastats


def test_nvpmodel_query_and_set(spare: JetsonBoard) -> None:
    done = spare.ssh("nvpmodel -q")
    assert (done.rc, done.stdout) == (0, "NV Power Mode: MAXN\n0\n")
    done = spare.ssh("nvpmodel -m 1 && nvpmodel -q")
    assert (done.rc, done.stdout) == (0, "NV Power Mode: MODE_15W\n1\n")
    assert spare.read("var/lib/nvpmodel/status") == "pmode:0001\n"
    assert spare.read("sys/devices/system/cpu/online").strip() == "0-3"
    gpu = spare.sysroot / "sys/class/devfreq/17000000.ga10b"
    assert int((gpu / "max_freq").read_text()) == 408000000
    assert int((gpu / "min_freq").read_text()) < int((gpu / "max_freq").read_text())  # a mode change unlocks clocks
    done = spare.ssh("nvpmodel -m 9")
    assert done.rc == 1 and "NVPM ERROR" in done.stderr
    spare.set_power_mode(0)
    assert spare.ssh("nvpmodel -q").stdout == "NV Power Mode: MAXN\n0\n"


def test_jetson_clocks_show_lock_and_restore(spare: JetsonBoard) -> None:
    shown = spare.ssh("jetson_clocks --show").stdout.splitlines()
    assert shown[0] == "SOC family:tegra234  Machine:NVIDIA Jetson AGX Orin Developer Kit"
    assert shown[1] == "Online CPUs: 0-11"
    cpu = re.compile(r"^cpu(\d+): Online=1 Governor=\w+ MinFreq=(\d+) MaxFreq=(\d+) CurrentFreq=(\d+) IdleStates: .*$")
    rows = [cpu.match(line) for line in shown[2:14]]
    assert all(rows) and all(r.group(2) == r.group(3) == r.group(4) == "2201600" for r in rows)  # locked
    assert re.fullmatch(r"GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq=1300500000", shown[14])
    assert re.fullmatch(r"EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=1", shown[15])
    assert shown[-1] == "NV Power Mode: MAXN"
    spare.unlock_clocks()
    shown = spare.ssh("jetson_clocks --show").stdout
    assert "GPU MinFreq=306000000 MaxFreq=1300500000 CurrentFreq=306000000" in shown
    assert "FreqOverride=0" in shown
    done = spare.ssh("jetson_clocks && jetson_clocks --show | grep '^GPU'")
    assert done.stdout == "GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq=1300500000\n"
    saved = spare.work_dir / "clocks.conf"
    done = spare.ssh(f"jetson_clocks --store {saved} && jetson_clocks --restore && jetson_clocks --show | grep '^GPU' "
                     f"&& jetson_clocks --restore {saved} && jetson_clocks --show | grep '^GPU'")
    assert done.stdout.splitlines() == ["GPU MinFreq=306000000 MaxFreq=1300500000 CurrentFreq=306000000",
                                        "GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq=1300500000"]
    assert "/sys/class/devfreq/17000000.ga10b/min_freq:1300500000" in saved.read_text().splitlines()


def test_tegrastats_prints_until_killed(jetson_board: JetsonBoard, thor: JetsonBoard) -> None:
    orin_line = re.compile(
        r"^\d\d-\d\d-\d{4} \d\d:\d\d:\d\d RAM \d+/\d+MB \(lfb 2x4MB\) SWAP \d+/\d+MB \(cached 0MB\) "
        r"CPU \[(\d+%@\d+,){11}\d+%@\d+\] GR3D_FREQ 0% cpu@52\.875C soc2@48\.656C soc0@49\.062C tj@52\.875C "
        r"soc1@49\.031C VDD_GPU_SOC \d+mW/\d+mW VDD_CPU_CV \d+mW/\d+mW VIN_SYS_5V0 \d+mW/\d+mW$")
    proc = subprocess.Popen([str(jetson_board.bin_dir / "tegrastats"), "--interval", "100"], stdout=subprocess.PIPE,
                            text=True, env=jetson_board.tool_env(), user=jetson_board.user)
    try:
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(3)]
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert all(orin_line.match(line) for line in lines), lines
    done = jetson_board.ssh("timeout 1 tegrastats --interval 200; echo rc=$?")
    out = done.stdout.splitlines()
    assert out[-1] == "rc=124" and len(out) >= 4 and all(orin_line.match(line) for line in out[:-1])
    done = jetson_board.ssh("tegrastats --count 2")  # the real tool has no sample count
    assert done.rc == 1 and done.stdout.startswith("Usage: tegrastats")
    thor_line = thor.ssh("timeout 0.5 tegrastats --interval 100 | head -1").stdout.strip()
    assert re.match(r"^\d\d-\d\d-\d{4} \d\d:\d\d:\d\d RAM \d+/\d+MB \(lfb 34x4MB\) CPU \[(\d+%@\d+,){13}\d+%@\d+\] "
                    r"EMC_FREQ 0%@\d+ GR3D_FREQ @\[\d+,\d+,\d+\] .* cpu@37\.343C tj@38\.875C soc012@37\.468C "
                    r"gpu@38\.875C soc345@37\.406C VDD_GPU \d+mW/\d+mW .*VIN \d+mW/\d+mW$", thor_line), thor_line


def test_tegrastats_follows_the_fake_root(spare: JetsonBoard) -> None:
    spare.set_temperature("tj-thermal", 97500)
    spare.set_power_mode("MODE_15W")
    line = spare.ssh("timeout 0.5 tegrastats --interval 100 | head -1").stdout
    assert " tj@97.500C " in line and ",off,off," in line
    log = spare.work_dir / "tegrastats.log"
    done = spare.ssh(f"tegrastats --start --interval 100 --logfile {log} && sleep 0.6 && tegrastats --stop")
    assert done.rc == 0 and not (spare.sysroot / "run/tegrastats.pid").exists()
    lines = log.read_text().splitlines()
    time.sleep(0.3)
    assert len(lines) >= 3 and log.read_text().splitlines() == lines  # stopped


def test_removing_llm_build(spare: JetsonBoard) -> None:
    spare.remove_tool("llm_build")
    done = spare.ssh(f"{spare.tool('llm_build')} --help")
    assert done.rc == 127 and "No such file or directory" in done.stderr


# ---------------------------------------------------------------- the farm's driver against the real tools' behaviour


def test_driver_argv_is_accepted(jetson_board: JetsonBoard, engine: Path) -> None:
    install = trt.DeviceInstall.from_inventory(jetson_board.toolchain_block(), device=jetson_board.id)
    onnx = make_onnx(jetson_board, "onnx-driver")
    argv = trt.build_argv(install, str(onnx), str(jetson_board.work_dir / "engine-driver"), max_batch_size=2,
                          max_input_len=128, max_kv_cache_capacity=256)
    env = install.env(None)
    assert jetson_board.run(argv, env=env).returncode == 0
    inputs = requests_file(jetson_board, ["p"], "req-driver.json")
    argv = trt.inference_argv(install, str(engine), str(inputs), str(jetson_board.work_dir / "out-driver.json"),
                              warmup=1)
    assert jetson_board.run(argv, env=env).returncode == 0
    argv = trt.bench_argv(install, str(engine), "decode", past_kv_len=64, output_dir=str(jetson_board.work_dir / "bd"))
    assert jetson_board.run(argv, env=env).returncode == 0


def test_driver_reads_the_builder_config(jetson_board: JetsonBoard, engine: Path) -> None:
    """llm_build writes max_batch_size/max_input_len/max_kv_cache_capacity (snake_case), with the resolved pool."""
    builder = json.loads((engine / "config.json").read_text())["builder_config"]
    limits = {"max_batch_size": 2, "max_input_len": 128, "max_seq_len": 256}
    assert trt.builder_config_problems(builder, limits) == []
    assert trt.builder_config_problems(builder, {**limits, "max_seq_len": 512}) == [
        "max_kv_cache_capacity=256 (expected 512)", "max_kv_pool_pages=4 (expected 8)"]


def test_driver_reads_the_one_csv_llm_bench_writes(jetson_board: JetsonBoard, engine: Path) -> None:
    """llm_bench writes no _samples CSV: only the one-row e2e_*.csv, which the driver names and reads."""
    install = trt.DeviceInstall.from_inventory(jetson_board.toolchain_block(), device=jetson_board.id)
    out = jetson_board.work_dir / "bench-samples"
    argv = trt.bench_argv(install, str(engine), BenchMode.DECODE, past_kv_len=64, iterations=4, warmup=1,
                          output_dir=str(out))
    assert bench(jetson_board, engine, *argv[3:]).returncode == 0
    assert [str(p) for p in out.iterdir()] == [trt.bench_csv(str(out), BenchMode.DECODE, 64)]
    metrics = trt.parse_bench(BenchMode.DECODE, (out / "e2e_decode_pastkvlen64.csv").read_text(),
                              **trt.bench_asked(BenchMode.DECODE, argv))
    assert sorted(metrics) == ["decode_e2e_ms", "decode_ms_per_token", "decode_tokens_per_s"]


def test_driver_maps_batched_responses(jetson_board: JetsonBoard, engine: Path) -> None:
    """request_idx is already the flat index (batch_idx the place in its batch); finish reasons map to ours."""
    inputs = requests_file(jetson_board, ["a", "b", "c"], "req-map.json", batch_size=2)
    out = jetson_board.work_dir / "out-map.json"
    assert infer(jetson_board, engine, inputs, out).returncode == 0
    requests = [GenerationRequest(id=f"r{i}", prompt=p, max_new_tokens=8, temperature=0.0)
                for i, p in enumerate("abc")]
    mapped = trt.from_trt_responses(json.loads(out.read_text()), requests, batch_size=2)
    assert [r["text"] for r in mapped["responses"]] == ["STAND-IN a", "STAND-IN b", "STAND-IN c"]
    assert [r["finish_reason"] for r in mapped["responses"]] == ["eos", "eos", "eos"]


# ---------------------------------------------------------------- the direct builder (tensorrt-edgellm-build)

DIRECT = "tensorrt-edgellm-build"
QWEN = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 256, "hidden_size": 128,
        "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 512, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "torch_dtype": "float16"}


def make_checkpoint(board: JetsonBoard, name: str = "ckpt", **overrides: object) -> Path:
    """A checkpoint dir in the board's work dir: config.json, one safetensors file (header and zeros), a tokenizer."""
    directory = board.work_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in {**QWEN, **overrides}.items() if v is not None}
    (directory / "config.json").write_text(json.dumps(config))
    hidden, vocab = int(config["hidden_size"]), int(config["vocab_size"])
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.layers.0.self_attn.q_proj.weight": [hidden, hidden],
              "model.norm.weight": [hidden]}
    header, offset = {}, 0
    for tensor, shape in shapes.items():
        size = 2 * math.prod(shape)
        header[tensor] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (directory / "model.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
    (directory / "tokenizer.json").write_text("{}")
    subprocess.run(["chown", "-R", f"{board.user}:{board.user}", str(directory)], check=True)
    return directory


def direct(board: JetsonBoard, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return board.run([str(board.tool(DIRECT)), *args], env={"COLUMNS": "80", **(env or {})})


def real_direct(trt_env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real tool of the installed 0.11.0 package (its parsing runs here; a build stops at TensorRT)."""
    return subprocess.run([str(trt_env / "bin" / DIRECT), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "COLUMNS": "80", "HOME": "/tmp"}, check=False)


@pytest.fixture(scope="module")
def direct_engine(jetson_board: JetsonBoard) -> tuple[Path, Path]:
    """(checkpoint, engine dir) of one direct build on the session's board (the tests below only read them)."""
    checkpoint = make_checkpoint(jetson_board, "ckpt-shared")
    engine = jetson_board.work_dir / "direct-engine-shared"
    done = direct(jetson_board, "--model-dir", str(checkpoint), "--engine-dir", str(engine), "--max-input-len", "128",
                  "--max-kv-cache-capacity", "256", "--max-batch-size", "2", "--plugin-path",
                  str(jetson_board.plugin_path))
    assert done.returncode == 0, done.stderr
    return checkpoint, engine


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["--model-dir", "m", "--engine-dir", "e", "--foo"],
    ["--model-dir", "m"],
    ["--model-dir", "m", "--engine-dir", "e", "--max-input-len", "x"],
    ["--model-dir", "m", "--engine-dir", "e", "--dense", "int8"],
    ["--model-dir", "m", "--engine-dir", "e", "--max-kv", "12", "--spec-type"],
], ids=["help", "unknown", "required", "bad-int", "bad-choice", "missing-value"])
def test_direct_builder_parses_like_the_real_one(jetson_board: JetsonBoard, trt_env: Path, argv: list[str]) -> None:
    """Everything the real tool decides before it needs TensorRT: same output, same streams, same exit code."""
    ours, real = direct(jetson_board, *argv), real_direct(trt_env, *argv)
    assert (ours.returncode, ours.stdout, ours.stderr) == (real.returncode, real.stdout, real.stderr)
    assert real.returncode == (0 if argv == ["--help"] else 2)


def test_direct_builder_without_tensorrt_stops_like_the_real_one(spare: JetsonBoard, trt_env: Path) -> None:
    """No TensorRT Python bindings (here: no libnvinfer): TensorRTDependencyError, a traceback, exit 1."""
    checkpoint = make_checkpoint(spare)
    argv = ["--model-dir", str(checkpoint), "--engine-dir", str(spare.work_dir / "e")]
    real = real_direct(trt_env, *argv)
    spare.remove_libnvinfer()
    ours = direct(spare, *argv)
    for done in (ours, real):
        assert done.returncode == 1 and done.stdout == ""
        assert done.stderr.startswith("Traceback (most recent call last):\n")
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("tensorrt_edgellm._native.TensorRTDependencyError: TensorRT Python bindings are "
                               "required before checkpoint download or engine build."), last


def test_direct_builder_writes_engine_config_and_bindings(jetson_board: JetsonBoard,
                                                          direct_engine: tuple[Path, Path]) -> None:
    checkpoint, engine = direct_engine
    assert sorted(p.name for p in engine.iterdir()) == ["config.json", "llm.engine", "tokenizer.json"]
    config = json.loads((engine / "config.json").read_text())
    assert config["builder_config"] == {
        "tp_size": 1, "max_input_len": 128, "spec_draft": False, "spec_base": False, "max_batch_size": 2,
        "max_lora_rank": 0, "max_kv_cache_capacity": 256, "max_kv_pool_pages": 4,
        "ragged_backend": "entry_padded_compatibility"}
    assert trt.builder_config_problems(config["builder_config"], {"max_batch_size": 2, "max_input_len": 128,
                                                                  "max_seq_len": 256}) == []
    bound = [b["engine_name"] for b in config["checkpoint_weight_bindings"]]
    assert bound == ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    assert config["checkpoint_identity"]["version"] == 1
    assert "checkpoint_dir" not in config  # the weights are where --model-dir was: the runtime is told by flag
    read = trt.read_direct_engine(engine, checkpoint, {"max_batch_size": 2, "max_input_len": 128, "max_seq_len": 256})
    assert (read.weights, read.checkpoint_bindings) == ("fp16", 2)


def test_direct_builder_log_and_outputs(jetson_board: JetsonBoard) -> None:
    checkpoint = make_checkpoint(jetson_board, "ckpt-log")
    engine = jetson_board.work_dir / "direct-engine-log"
    done = direct(jetson_board, "--model-dir", str(checkpoint), "--engine-dir", str(engine), "--plugin-path",
                  str(jetson_board.plugin_path))
    assert done.returncode == 0, done.stderr
    size = (engine / "llm.engine").stat().st_size
    assert done.stdout == f"Engine outputs:\n  llm: {engine}/llm.engine ({size} bytes)\n"
    lines = done.stderr.splitlines()
    fmt = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR|DEBUG) experimental\.builder[\w.]*: ")
    assert lines and all(fmt.match(line) for line in lines), lines
    text = "\n".join(lines)
    assert "experimental.builder: Building 1 engines for qwen2: llm" in text
    assert "quant=fp16" in text and f"Engine written to {engine}/llm.engine ({size} bytes)" in text
    # the defaults when no limits are given: 32, 96, 1
    builder = json.loads((engine / "config.json").read_text())["builder_config"]
    assert (builder["max_input_len"], builder["max_kv_cache_capacity"], builder["max_batch_size"]) == (32, 96, 1)


def test_direct_builder_refusals(jetson_board: JetsonBoard) -> None:
    unknown = make_checkpoint(jetson_board, "ckpt-gemma3", model_type="gemma3_text")
    engine = str(jetson_board.work_dir / "direct-refused")
    done = direct(jetson_board, "--model-dir", str(unknown), "--engine-dir", engine, "--plugin-path",
                  str(jetson_board.plugin_path))
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("ValueError: unsupported model_type 'gemma3_text'; supported model "
                                                    "types: NemotronH_Nano_Omni_Reasoning_V3, "), last
    assert ", qwen2, qwen2_5_vl, " in last
    untyped = make_checkpoint(jetson_board, "ckpt-untyped", model_type=None)
    done = direct(jetson_board, "--model-dir", str(untyped), "--engine-dir", engine)
    assert done.stderr.strip().splitlines()[-1] == "ValueError: config.json must define a non-empty model_type"
    checkpoint = make_checkpoint(jetson_board, "ckpt-noplugin")
    done = direct(jetson_board, "--model-dir", str(checkpoint), "--engine-dir", engine)  # default: relative path
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == ("FileNotFoundError: plugin library not found: "
                                                    "build/libNvInfer_edgellm_plugin.so")
    assert not Path(engine).exists()


def test_direct_engine_runs_only_with_its_checkpoint(jetson_board: JetsonBoard,
                                                     direct_engine: tuple[Path, Path]) -> None:
    """The runtime reads the bound weights from --checkpointDir; without it (and no checkpoint_dir in the config)
    ExternalWeightManager stops: llm_inference and llm_bench exit 1."""
    checkpoint, engine = direct_engine
    inputs = requests_file(jetson_board, ["p"], "req-direct.json")
    out = jetson_board.work_dir / "out-direct.json"
    done = infer(jetson_board, engine, inputs, out)
    assert done.returncode == 1
    assert "A component checkpoint directory is required for runtime weight loading" in done.stderr
    done = infer(jetson_board, engine, inputs, out, "--checkpointDir", str(checkpoint))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["responses"][0]["output_text"] == "STAND-IN p"
    done = bench(jetson_board, engine, "--mode", "decode", "--pastKVLen", "64")
    assert done.returncode == 1 and "A component checkpoint directory is required" in done.stderr
    assert bench(jetson_board, engine, "--mode", "decode", "--pastKVLen", "64", "--checkpointDir",
                 str(checkpoint)).returncode == 0
    other = make_checkpoint(jetson_board, "ckpt-other", hidden_size=64)
    done = infer(jetson_board, engine, inputs, out, "--checkpointDir", str(other))
    assert done.returncode == 1 and "does not match the identity recorded" in done.stderr


def test_driver_direct_argv_is_accepted(make_board: Callable[..., JetsonBoard]) -> None:
    """The driver's direct build and runtime command lines, on a board whose inventory names the direct builder."""
    board = make_board("orin", name="orin-direct-argv", direct=True)
    try:
        install = trt.DeviceInstall.from_inventory(board.toolchain_block(), device=board.id)
        assert install.direct_builder == board.direct_builder
        checkpoint = make_checkpoint(board, "ckpt-driver")
        engine = board.work_dir / "direct-driver"
        argv = trt.direct_build_argv(install, str(checkpoint), str(engine), max_batch_size=2, max_input_len=128,
                                     max_kv_cache_capacity=256)
        env = install.env(None)
        done = board.run(argv, env=env)
        assert done.returncode == 0, done.stderr
        read = trt.read_direct_engine(engine, checkpoint, {"max_batch_size": 2, "max_input_len": 128,
                                                           "max_seq_len": 256})
        assert read.weights == "fp16"
        inputs = requests_file(board, ["p"], "req-driver.json")
        argv = trt.with_checkpoint_dir(trt.inference_argv(install, str(engine), str(inputs),
                                                          str(board.work_dir / "out.json")), str(checkpoint))
        assert board.run(argv, env=env).returncode == 0
        argv = trt.with_checkpoint_dir(trt.bench_argv(install, str(engine), "prefill", input_len=64,
                                                      output_dir=str(board.work_dir / "bd")), str(checkpoint))
        assert board.run(argv, env=env).returncode == 0
    finally:
        board.close()
