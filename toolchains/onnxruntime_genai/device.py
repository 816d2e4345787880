"""Argument lists of the device runner (``runner.py``, pushed to the device and run by its Python), and what its
exit codes mean. Paths are device paths (POSIX strings); nothing here touches the device."""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgefarm.toolchains.onnxruntime_genai.runner import (
    EXIT_BAD_INPUT,
    EXIT_BUG,
    EXIT_INFRASTRUCTURE,
    EXIT_OK,
    EXIT_TEST_FAILURE,
)
from edgellm.errors import ConfigurationError, ErrorKind

RUNNER = Path(__file__).resolve().with_name("runner.py")
ENGINE_RECORD = "engine.json"  # what the runner's build writes into the engine dir
EXIT_KINDS: dict[int, ErrorKind | None] = {EXIT_OK: None, EXIT_TEST_FAILURE: ErrorKind.TEST_FAILURE,
                                           EXIT_BAD_INPUT: ErrorKind.CONFIGURATION,
                                           EXIT_INFRASTRUCTURE: ErrorKind.INFRASTRUCTURE, EXIT_BUG: ErrorKind.BUG}
BENCH_MODES = ("prefill", "decode")


def runner_sha256() -> str:
    """The runner's content digest (what a device cache of the pushed script is keyed by)."""
    return hashlib.sha256(RUNNER.read_bytes()).hexdigest()


def exit_kind(code: int) -> ErrorKind | None:
    """The error kind of a runner exit code (None: success). A death by signal (negative code, or 128 + N from a
    shell) is infrastructure: onnxruntime_genai aborts from native code when onnxruntime's library will not load."""
    if code in EXIT_KINDS:
        return EXIT_KINDS[code]
    return ErrorKind.INFRASTRUCTURE if code < 0 or code > 128 else ErrorKind.BUG


def _threads(threads: int | None) -> list[str]:
    return [] if threads is None else ["--threads", str(threads)]


def env_argv(interpreter: str, runner: str) -> list[str]:
    return [interpreter, runner, "env"]


def build_argv(interpreter: str, runner: str, model_dir: str, engine_dir: str, *, max_batch_size: int,
               max_input_len: int, max_seq_len: int) -> list[str]:
    return [interpreter, runner, "build", "--model-dir", model_dir, "--engine-dir", engine_dir,
            "--max-batch-size", str(max_batch_size), "--max-input-len", str(max_input_len),
            "--max-seq-len", str(max_seq_len)]


def infer_argv(interpreter: str, runner: str, model_dir: str, input_file: str, output_file: str, *,
               threads: int | None = None) -> list[str]:
    return [interpreter, runner, "infer", "--model-dir", model_dir, "--input-file", input_file,
            "--output-file", output_file, *_threads(threads)]


def bench_argv(interpreter: str, runner: str, model_dir: str, mode: str, output: str, *, prompt_len: int,
               past_len: int, warmup: int, iterations: int, threads: int | None = None) -> list[str]:
    """The farm's two benchmark shapes, as for edgellm bench: prefill of ``prompt_len`` tokens on an empty cache,
    decode of one token over ``past_len``."""
    if mode not in BENCH_MODES:
        raise ConfigurationError(f"unknown bench mode {mode!r}; valid: {', '.join(BENCH_MODES)}")
    shape = (["--input-len", str(prompt_len), "--past-len", "0"] if mode == "prefill"
             else ["--past-len", str(past_len)])
    return [interpreter, runner, "bench", "--model-dir", model_dir, "--mode", mode, "--batch-size", "1", *shape,
            "--warmup", str(warmup), "--iterations", str(iterations), "--output", output, *_threads(threads)]


def logits_argv(interpreter: str, runner: str, model_dir: str, reference: str, output: str, *,
                threads: int | None = None) -> list[str]:
    return [interpreter, runner, "logits", "--model-dir", model_dir, "--reference", reference, "--output", output,
            *_threads(threads)]
