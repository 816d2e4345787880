"""Engine micro-benchmark: prefill or decode steps on a KV cache held at a fixed past length.

prefill: each iteration runs B x input_len new tokens on top of a cache holding past_len positions.
decode:  each iteration runs one new token for each of B sequences on top of past_len positions.
The past is prefilled once (in chunks of <= max_input_len); every iteration first truncates the cache back to
past_len, outside the timed region, so all iterations measure the same shape.
"""

from __future__ import annotations

import enum
import os
import resource
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.errors import BugError, ConfigurationError
from edgellm.reporting import latency_stats, percentile
from edgellm.runtime.engine import threads_problem
from edgellm.types import BenchMode

__all__ = ["BenchMode", "BenchOptions", "run_bench"]  # BenchMode's home is edgellm.types; also importable from here


@dataclass(frozen=True)
class BenchOptions:
    engine_dir: Path
    mode: BenchMode
    batch_size: int = 1
    input_len: int = 128  # prefill only; decode always steps 1 token
    past_len: int = 0
    warmup: int = 2
    iterations: int = 10
    num_threads: int | None = None
    seed: int = 0

    def validate(self) -> None:
        """Problems knowable without opening the engine; all of them in one message."""
        problems = []
        for name, minimum in (("batch_size", 1), ("input_len", 1), ("past_len", 0), ("warmup", 0),
                              ("iterations", 1)):
            value = getattr(self, name)
            if value < minimum:
                problems.append(f"--{name.replace('_', '-')} {value}: must be >= {minimum}")
        if (problem := threads_problem(self.num_threads)) is not None:
            problems.append(problem)
        if not Path(self.engine_dir).is_dir():
            problems.append(f"engine dir {self.engine_dir} not found")
        if problems:
            raise ConfigurationError("; ".join(problems))

    @property
    def new_tokens_per_sequence(self) -> int:
        return self.input_len if self.mode is BenchMode.PREFILL else 1

    def check_limits(self, max_batch_size: int, max_input_len: int, max_seq_len: int) -> None:
        """Against the engine's build limits; the message names each limit exceeded."""
        problems = []
        if self.batch_size > max_batch_size:
            problems.append(f"--batch-size {self.batch_size} exceeds the engine's max_batch_size {max_batch_size}")
        if self.mode is BenchMode.PREFILL and self.input_len > max_input_len:
            problems.append(f"--input-len {self.input_len} exceeds the engine's max_input_len {max_input_len}")
        total = self.past_len + self.new_tokens_per_sequence
        if total > max_seq_len:
            problems.append(f"--past-len {self.past_len} + {self.new_tokens_per_sequence} new token(s) = {total} "
                            f"exceeds the engine's max_seq_len {max_seq_len} (KV capacity)")
        if problems:
            raise ConfigurationError("; ".join(problems))


def peak_rss_bytes() -> int:
    """Peak resident set size of this process: Linux's ``VmHWM`` (its own address space's high-water mark), else
    ``ru_maxrss`` (KiB on Linux). Not ``ru_maxrss`` first: Linux keeps it across exec, so a process started by a
    larger one (a test runner, a farm worker) reports its parent's peak until it exceeds it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def cuda_peaks() -> dict[str, int]:
    """The torch CUDA allocator's peaks in this process (``cuda_peak_allocated_bytes``, ``cuda_peak_reserved_bytes``)
    when an engine ran on CUDA here; empty otherwise (torch is never imported for it)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return {"cuda_peak_allocated_bytes": int(torch.cuda.max_memory_allocated()),
            "cuda_peak_reserved_bytes": int(torch.cuda.max_memory_reserved())}


def run_bench(opts: BenchOptions) -> dict[str, Any]:
    from edgellm.runtime import Engine

    opts.validate()
    rss_before = peak_rss_bytes()
    t0 = time.perf_counter()
    engine = Engine.open(opts.engine_dir, num_threads=opts.num_threads)
    open_s = time.perf_counter() - t0
    opts.check_limits(engine.max_batch_size, engine.max_input_len, engine.max_seq_len)

    rng = np.random.default_rng(opts.seed)
    vocab = engine.config.vocab_size
    b, new = opts.batch_size, opts.new_tokens_per_sequence
    cache = engine.new_cache(b, capacity=opts.past_len + new)
    t0 = time.perf_counter()
    if opts.past_len:
        past = rng.integers(0, vocab, size=(b, opts.past_len), dtype=np.int64)
        for start in range(0, opts.past_len, engine.max_input_len):
            engine.step(past[:, start:start + engine.max_input_len], cache)
    past_prefill_s = time.perf_counter() - t0
    if cache.length != opts.past_len:
        raise BugError(f"engine cache holds {cache.length} positions after prefilling --past-len {opts.past_len}")

    inputs = rng.integers(0, vocab, size=(b, new), dtype=np.int64)
    times: list[float] = []
    for i in range(opts.warmup + opts.iterations):
        cache.truncate(opts.past_len)
        t0 = time.perf_counter()
        logits = engine.step(inputs, cache)
        dt = time.perf_counter() - t0
        if i >= opts.warmup:
            times.append(dt)
    if logits.shape[:2] != (b, new) or not np.all(np.isfinite(logits[:, -1])):
        raise BugError(f"engine step returned logits of shape {logits.shape} or non-finite values "
                       f"for inputs [{b}, {new}]")

    tokens_per_step = b * new
    stats = latency_stats(times)
    median_s, p90_s = stats["median_ms"] / 1e3, stats["p90_ms"] / 1e3
    per_token_ms = [t * 1e3 / tokens_per_step for t in times]
    return {
        "mode": opts.mode.value,
        "parameters": {k: (v.value if isinstance(v, enum.Enum) else str(v) if isinstance(v, Path) else v)
                       for k, v in asdict(opts).items()},
        "engine": {
            "dir": str(opts.engine_dir),
            "precision": engine.precision,
            "bytes": engine.engine_bytes(),
            "max_batch_size": engine.max_batch_size,
            "max_input_len": engine.max_input_len,
            "max_seq_len": engine.max_seq_len,
            "model_type": engine.config.model_type,
            "vocab_size": vocab,
        },
        "tokens_per_step": tokens_per_step,
        # throughput at the median step time (robust to a slow outlier), and over all timed steps
        "tokens_per_s": tokens_per_step / median_s,
        "tokens_per_s_mean": tokens_per_step * len(times) / sum(times),
        # step time divided by the tokens the step produced; for decode with B > 1 the per-sequence latency
        # is the step time itself (step_latency)
        "ms_per_token": {"median": percentile(per_token_ms, 50), "p90": percentile(per_token_ms, 90)},
        "step_latency": stats,
        "step_latency_p90_over_median": p90_s / median_s,
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_bytes_before_open": rss_before,
        # the engine's peak memory on the host: the process's peak RSS less its peak before the engine opened
        "peak_memory_bytes": peak_rss_bytes() - rss_before,
        **cuda_peaks(),
        "threads": opts.num_threads,  # null: the runtime's default
        # the runtime session's own settings where its backend records them (ONNX Runtime: thread count, spinning)
        "session": getattr(engine.session, "settings", None),
        "cpu_count": os.cpu_count(),
        "timings": {"engine_open_s": round(open_s, 4), "past_prefill_s": round(past_prefill_s, 4)},
    }
