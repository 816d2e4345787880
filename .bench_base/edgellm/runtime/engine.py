"""Run a built engine: one graph step at a time (``step``), or batched generation with left padding.

Batching: prompts are left-padded to the longest; the attention mask marks padding and position ids count real
tokens only, so each row computes what it would alone. Greedy is deterministic; a sampling request is reproducible
from its seed whatever batch it runs in. The KV cache, and where tokens are chosen, are the backend session's
(``edgellm.backends.base.Session``): the engine checks limits and drives every backend alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm.backends.base import KVCacheHandle, Session, get_backend, position_ids
from edgellm.backends.sampling import SamplingParams
from edgellm.compiler.build import ENGINE_MANIFEST
from edgellm.compiler.export import GENERATION_SETTINGS, LOGITS_POSITIONS
from edgellm.compiler.files import verify_files
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import BugError, ConfigurationError
from edgellm.runtime.requests import GenerationRequest, GenerationResult, check_requests
from edgellm.runtime.tokenizer import TextCodec

# Files Engine.open reads itself (the backend's own model file is checked by the manifest as a whole).
ENGINE_RUNTIME_FILES = ("config.json", GENERATION_SETTINGS, "tokenizer.json")


def max_threads() -> int:
    """Most intra-op threads an engine may ask for: 4 per logical CPU (more only thrashes, or hangs ORT)."""
    return 4 * (os.cpu_count() or 1)


def threads_problem(num_threads: int | None) -> str | None:
    """Why ``--threads num_threads`` is invalid, or None (None means the runtime's default)."""
    if num_threads is None:
        return None
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or not 1 <= num_threads <= max_threads():
        return f"--threads {num_threads!r}: must be an integer in 1..{max_threads()} (4 x this machine's CPUs)"
    return None


@dataclass
class _Row:
    req: GenerationRequest
    prompt: list[int]
    out: list[int] = field(default_factory=list)
    finish: str | None = None
    text: str = ""
    t_first: float = 0.0
    t_done: float = 0.0


class Engine:
    def __init__(self, engine_dir: Path, manifest: dict[str, Any], session: Session, config: ModelConfig,
                 settings: dict[str, Any], codec: TextCodec) -> None:
        self.engine_dir = engine_dir
        self.manifest = manifest
        self.session = session
        self.config = config
        self.settings = settings
        self.codec = codec
        params = manifest["build_params"]
        self.max_batch_size = int(params["max_batch_size"])
        self.max_input_len = int(params["max_input_len"])
        self.max_seq_len = int(params["max_seq_len"])
        self.precision = str(manifest["precision"])
        self.eos_ids = frozenset(int(e) for e in settings.get("eos_token_ids", []))
        self.pad_id = int(settings.get("pad_token_id") or 0)
        specs = {s.name: s for s in session.inputs}
        L = config.num_hidden_layers
        past_names = [f"past_key_values.{i}.{kv}" for i in range(L) for kv in ("key", "value")]
        missing = [n for n in past_names if n not in specs]
        if missing or "input_ids" not in specs:
            raise ConfigurationError(f"{engine_dir}: engine inputs do not match the model config "
                                     f"(missing {', '.join(missing[:4]) or 'input_ids'})")
        if LOGITS_POSITIONS not in specs:
            raise ConfigurationError(f"{engine_dir}: engine has no {LOGITS_POSITIONS} input (exported by an older "
                                     f"edgellm); export and build it again")

    @classmethod
    def open(cls, engine_dir: str | Path, *, num_threads: int | None = None) -> Engine:
        engine_dir = Path(engine_dir)
        if (problem := threads_problem(num_threads)) is not None:
            raise ConfigurationError(problem)
        if not engine_dir.is_dir():
            raise ConfigurationError(f"{engine_dir}: engine directory not found")
        manifest = verify_files(engine_dir, ENGINE_MANIFEST, required=ENGINE_RUNTIME_FILES)
        for key in ("backend", "build_params", "precision"):
            if key not in manifest:
                raise ConfigurationError(f"{engine_dir / ENGINE_MANIFEST}: missing key {key!r}")
        backend = get_backend(manifest["backend"])
        config = ModelConfig.load(engine_dir)
        settings = read_json_object(engine_dir / GENERATION_SETTINGS, what=GENERATION_SETTINGS)
        codec = TextCodec(engine_dir / "tokenizer.json", chat_template=settings.get("chat_template"),
                          special_tokens=settings.get("special_tokens"))
        session = backend.open(engine_dir, manifest, num_threads=num_threads)
        return cls(engine_dir, manifest, session, config, settings, codec)

    # --- tokens ------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.codec.encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.codec.decode(ids)

    def engine_bytes(self) -> int:
        return sum(int(e["bytes"]) for e in self.manifest["files"].values())

    # --- one graph step ----------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int | None = None) -> KVCacheHandle:
        """An empty cache for ``batch_size`` rows and ``capacity`` positions (default: the engine's max_seq_len), of
        the session's kind: ONNX Runtime's host caches (``KVBuffer``, filled in place, or ``KVCache``, which grows),
        torch-cuda's handle on its cache on the GPU."""
        self._check_batch(batch_size)
        if capacity is not None and not 1 <= capacity <= self.max_seq_len:
            raise ConfigurationError(f"KV capacity {capacity} must be in 1..{self.max_seq_len} (the engine's "
                                     f"max_seq_len)")
        return self.session.new_cache(batch_size, capacity or self.max_seq_len)

    def _check_batch(self, batch_size: int) -> None:
        if batch_size > self.max_batch_size:
            raise ConfigurationError(f"batch size {batch_size} exceeds the engine's max_batch_size "
                                     f"{self.max_batch_size}")

    def step(self, input_ids: np.ndarray, cache: KVCacheHandle, attention_mask: np.ndarray | None = None, *,
             last_only: bool = False) -> np.ndarray:
        """input_ids int64 [B, S]; attention_mask int64 [B, cache.length + S] (None = all ones).
        Appends S positions to ``cache``; returns float32 logits [B, S, vocab] ([B, 1, vocab] with
        ``last_only``: the graph then runs the lm_head for the last position only)."""
        b, s = input_ids.shape
        total = cache.length + s
        self._check_batch(b)
        if b != cache.batch_size:
            raise ConfigurationError(f"input batch {b} does not match the cache's batch {cache.batch_size}")
        if s > self.max_input_len:
            raise ConfigurationError(f"input length {s} exceeds the engine's max_input_len {self.max_input_len}")
        if total > self.max_seq_len:
            raise ConfigurationError(f"sequence length {total} (cache {cache.length} + input {s}) exceeds the "
                                     f"engine's max_seq_len {self.max_seq_len} (KV capacity)")
        if cache.capacity is not None and total > cache.capacity:
            raise ConfigurationError(f"sequence length {total} (cache {cache.length} + input {s}) exceeds the "
                                     f"cache's capacity {cache.capacity} (new_cache(capacity=...))")
        if attention_mask is None:
            attention_mask = np.ones((b, total), dtype=np.int64)
        elif attention_mask.shape != (b, total):
            raise ConfigurationError(f"attention_mask shape {list(attention_mask.shape)} must be [{b}, {total}]")
        return self.session.step(np.ascontiguousarray(input_ids, dtype=np.int64),
                                 np.ascontiguousarray(position_ids(attention_mask, s), dtype=np.int64),
                                 np.ascontiguousarray(attention_mask, dtype=np.int64), cache, last_only=last_only)

    def logits(self, input_ids: list[int]) -> np.ndarray:
        """One sequence, fresh cache, single prefill: float32 [S, vocab]."""
        ids = np.asarray([input_ids], dtype=np.int64)
        return self.step(ids, self.new_cache(1))[0]

    # --- generation --------------------------------------------------------------------------------------
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        rows = self._prepare(requests)
        for batch in self._batches(rows):
            for _ in self._run(batch):
                pass
        return [self._result(r) for r in rows]

    def stream(self, request: GenerationRequest) -> Iterator[int]:
        """Yield token ids as they are produced."""
        (row,) = self._prepare([request])
        for _, token in self._run([row]):
            yield token

    def _prepare(self, requests: list[GenerationRequest]) -> list[_Row]:
        problems = check_requests(requests)
        if problems:
            raise ConfigurationError("invalid generation requests: " + "; ".join(problems))
        rows = []
        for r in requests:
            if r.input_ids is not None:
                ids = list(r.input_ids)
                bad = [t for t in ids if t >= self.config.vocab_size]
                if bad:
                    raise ConfigurationError(f"request {r.id!r}: token id {bad[0]} is outside the vocabulary "
                                             f"(size {self.config.vocab_size})")
            elif r.messages is not None:
                ids = self.codec.encode_chat(r.messages)
            else:
                ids = self.codec.encode(r.prompt or "")
            if len(ids) > self.max_input_len:
                raise ConfigurationError(f"request {r.id!r}: prompt is {len(ids)} tokens, over the engine's "
                                         f"max_input_len {self.max_input_len}")
            if len(ids) + r.max_new_tokens > self.max_seq_len:
                raise ConfigurationError(
                    f"request {r.id!r}: prompt {len(ids)} + max_new_tokens {r.max_new_tokens} tokens exceed the "
                    f"engine's max_seq_len {self.max_seq_len} (KV capacity)")
            rows.append(_Row(req=r, prompt=ids))
        return rows

    def _batches(self, rows: list[_Row]) -> Iterator[list[_Row]]:
        """Consecutive groups that fit max_batch_size and, padded, the KV capacity."""
        batch: list[_Row] = []
        for row in rows:
            trial = [*batch, row]
            need = max(len(r.prompt) for r in trial) + max(r.req.max_new_tokens for r in trial)
            if batch and (len(trial) > self.max_batch_size or need > self.max_seq_len):
                yield batch
                trial = [row]
            batch = trial
        if batch:
            yield batch

    def _run(self, rows: list[_Row]) -> Iterator[tuple[int, int]]:
        """Generate for one batch; yields (row index, token) as each token is chosen."""
        b = len(rows)
        plen = max(len(r.prompt) for r in rows)
        ids = np.full((b, plen), self.pad_id, dtype=np.int64)
        mask = np.zeros((b, plen), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, plen - len(r.prompt):] = r.prompt
            mask[i, plen - len(r.prompt):] = 1
        t0 = time.perf_counter()
        steps = max(r.req.max_new_tokens for r in rows)
        finished = np.zeros(b, dtype=bool)
        sampling = [SamplingParams(r.req.temperature, r.req.top_k, r.req.top_p, r.req.seed) for r in rows]
        tokens = self.session.generate(ids, mask, steps, sampling, finished)
        try:
            for n, chosen in enumerate(tokens):
                now = time.perf_counter()
                for i, r in enumerate(rows):
                    if r.finish is not None:
                        continue
                    tok = int(chosen[i])
                    r.out.append(tok)
                    if n == 0:
                        r.t_first = now - t0
                    self._check_finish(r, tok)
                    if r.finish is not None:
                        r.t_done = now - t0
                        finished[i] = True
                    yield i, tok
                if all(r.finish is not None for r in rows):
                    break
        finally:
            close = getattr(tokens, "close", None)
            if close is not None:
                close()
        for r in rows:
            if r.finish is None:  # unreachable: every row ends by length at the latest
                raise BugError(f"request {r.req.id!r} did not finish")

    def _check_finish(self, r: _Row, tok: int) -> None:
        if tok in self.eos_ids:
            r.finish = "eos"
        elif r.req.stop:
            text = self.codec.decode(r.out)
            cut = min((text.find(s) for s in r.req.stop if s in text), default=-1)
            if cut >= 0:
                r.finish, r.text = "stop", text[:cut]
                return
        if r.finish is None and len(r.out) >= r.req.max_new_tokens:
            r.finish = "length"
        if r.finish in ("eos", "length"):
            r.text = self.codec.decode(r.out)

    @staticmethod
    def _result(r: _Row) -> GenerationResult:
        n = len(r.out)
        per_token = (r.t_done - r.t_first) / (n - 1) * 1000 if n > 1 else 0.0
        return GenerationResult(id=r.req.id, output_ids=list(r.out), text=r.text, finish_reason=r.finish or "length",
                                ttft_ms=r.t_first * 1000, ms_per_token=per_token)
