"""The torch-CUDA session: one ``GpuDecoder`` on the GPU (its fused Triton kernels where Triton imports), its whole
decode step (every layer, the LM head and the token choice) captured as one CUDA graph per batch size (greedy and
sampling variants), sampling on the GPU, and a generation loop that keeps the GPU ahead of the host: step n+1 is
queued before the host reads step n's token, so no step waits for the host. Opening warms up (prefills, the greedy
graphs of batch 1 and max_batch_size): that first-call cost is paid at open, timed in ``warm_up_s``.

Everything runs on the session's own stream. Each graph reads and writes only the session's static buffers
(tokens, positions, cache column, sampling parameters, logits), so a replay needs no host data and no sync; the
host copies each step's tokens out through pinned memory and an event per step.

Sampling is Gumbel-max over the temperature-scaled, top-k / top-p filtered distribution, with noise hashed from
(request seed, position, token id): exact sampling from that distribution, reproducible per request and seed
whatever batch it runs in (not the same stream of numbers as the CPU runtime's numpy Generator).
"""

from __future__ import annotations

import os
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgellm.backends.base import Session, TensorSpec, position_ids, truncate_problem
from edgellm.backends.sampling import SamplingParams
from edgellm.backends.torch_cuda.decoder import (
    GpuDecoder,
    attn_in_decode,
    attn_out_mlp,
    decode_attention,
    lm_head,
    load_parameters,
)
from edgellm.config import ModelConfig
from edgellm.errors import BugError, ConfigurationError

COMPILE_DECODE = False  # torch.compile the layer modules' decode math (only without the fused kernels)
WARM_PREFILL_LEN = 16  # prompt length of the prefills run at open (their kernels load then, not in the first TTFT)
LOOKAHEAD = 8  # decode steps queued on the GPU ahead of the host's reading of tokens
PREFILL_GRAPHS = 8  # prompt shapes whose prefill replays a CUDA graph (the least recently used dropped first)
_M32 = 0xFFFFFFFF


RECOMPILE_LIMIT = 64  # compiles of one decode function a process may make (dynamo's default, 8, is per code object)


def compiled_fns() -> dict[str, Any]:
    """The per-layer functions through torch.compile (shapes specialize on first use, then go dynamic). Each engine
    variant a process opens (weight dtype, cache length, head layout) is a compile of each function, and dynamo
    counts them per function: its default limit of 8 made the ninth engine of one process fail (fullgraph), so the
    limit is raised to RECOMPILE_LIMIT here (never lowered)."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):  # the name in this torch, then the older one
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), RECOMPILE_LIMIT))
            break
    return {name: torch.compile(fn, fullgraph=True)
            for name, fn in (("attn_in_decode", attn_in_decode), ("decode_attention", decode_attention),
                             ("attn_out_mlp", attn_out_mlp), ("lm_head", lm_head))}


def _uniform(seeds: torch.Tensor, nonce: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Uniform (0, 1) float32 from a 32-bit integer hash of (seed, nonce, token id); int64 arithmetic kept below
    2^63 (multipliers < 2^31 after the first mix)."""
    x = ((seeds[:, None] & 0x3FFFFFFF) * 0x9E3779B1 + (nonce[:, None] & 0xFFFFF) * 0x85EBCA77
         + tokens * 0x27D4EB2F) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x2C1B3C6D) & _M32
    x = x ^ (x >> 16)
    return ((x >> 8).float() + 0.5) * (1.0 / (1 << 24))


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           seeds: torch.Tensor, nonce: torch.Tensor) -> torch.Tensor:
    """logits float32 [B, V]; per-row temperature (0 = greedy), top_k (0 = off), top_p, seed, nonce -> [B]."""
    vocab = logits.shape[-1]
    z = logits / temperature.clamp_min(1e-6)[:, None]
    sz, idx = z.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=logits.device)
    keep = rank[None] < torch.where(top_k > 0, top_k, vocab)[:, None]
    sz = sz.masked_fill(~keep, float("-inf"))
    p = torch.softmax(sz, dim=-1)
    keep = keep & ((p.cumsum(dim=-1) - p) < top_p[:, None])  # the smallest prefix reaching top_p
    gumbel = -torch.log(-torch.log(_uniform(seeds, nonce, idx)))
    choice = torch.where(keep, sz + gumbel, float("-inf")).argmax(dim=-1, keepdim=True)
    return torch.where(temperature > 0, idx.gather(1, choice)[:, 0], logits.argmax(dim=-1))


class DeviceCache:
    """A handle on the session's preallocated KV cache (its first ``batch_size`` rows, ``length`` positions).
    One handle is live at a time: a new one retires the previous."""

    def __init__(self, session: TorchCudaSession, batch_size: int, epoch: int) -> None:
        self.session, self.batch_size, self.epoch = session, batch_size, epoch
        self.length = 0

    @property
    def num_layers(self) -> int:
        return self.session.config.num_hidden_layers

    @property
    def capacity(self) -> int:
        """The session's preallocated cache holds the engine's max_seq_len positions."""
        return self.session.model.max_seq_len

    def truncate(self, length: int) -> None:
        problem = truncate_problem(self.length, length, self.session.model.windows)
        if problem is not None:
            raise ValueError(problem)
        self.session.check_live(self)
        self.length = length

    def nbytes(self) -> int:
        """Bytes of the positions held (a windowed layer's last ``window``)."""
        c = self.session.config
        item = self.session.model.dtype.itemsize
        held = sum(self.length if w is None else min(self.length, w) for w in self.session.model.windows)
        return 2 * held * self.batch_size * c.num_key_value_heads * c.head_dim * item


class TorchCudaSession(Session):
    """The KV cache stays on the GPU (one preallocated for the engine's limits; a ``DeviceCache`` is a handle on its
    first rows) and tokens are chosen there."""

    def __init__(self, data_file: Path, table: list[dict[str, Any]], config: ModelConfig, *, io: dict[str, Any],
                 max_batch_size: int, max_seq_len: int, compile_decode: bool, decode_sdpa: bool = False,
                 fused: bool | None = None, warm: bool = True) -> None:
        """``fused``: the decode step and prefill through kernels.py (default: when Triton imports); otherwise the
        layer modules (``compile_decode``: through torch.compile). ``warm``: at open, run the prefills and capture
        the greedy decode graphs of batch 1 and max_batch_size (kernel loading, Triton compiles, cuBLAS handles:
        the first-call cost, timed in ``warm_up_s``), so the first request's TTFT is a steady-state one."""
        self.config = config
        self.inputs = [TensorSpec(i["name"], i["dtype"], tuple(i["shape"])) for i in io["inputs"]]
        self.outputs = [TensorSpec(o["name"], o["dtype"], tuple(o["shape"])) for o in io["outputs"]]
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.compile_decode = compile_decode
        self.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(self.stream):
            params = load_parameters(data_file, table, self.device)
            fused = _triton_available() if fused is None else fused
            self.model = GpuDecoder(config, params, max_batch_size=max_batch_size, max_seq_len=max_seq_len,
                                    device=self.device, decode_sdpa=decode_sdpa, fused=fused,
                                    fns=compiled_fns() if compile_decode and not fused else None)
            del params
            bmax, d = max_batch_size, self.device
            self.tokens = torch.zeros(bmax, dtype=torch.int64, device=d)
            self.positions = torch.zeros(bmax, dtype=torch.int64, device=d)
            self.write_idx = torch.zeros(1, dtype=torch.int64, device=d)
            self.logits = torch.zeros((bmax, config.vocab_size), dtype=torch.float32, device=d)
            self.temperature = torch.zeros(bmax, dtype=torch.float32, device=d)
            self.top_k = torch.zeros(bmax, dtype=torch.int64, device=d)
            self.top_p = torch.ones(bmax, dtype=torch.float32, device=d)
            self.seeds = torch.zeros(bmax, dtype=torch.int64, device=d)
        self.stream.synchronize()
        torch.cuda.empty_cache()
        self._graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._prefill_graphs: OrderedDict[tuple[int, int, int], _PrefillGraph] = OrderedDict()
        self._prefill_seen: Counter[tuple[int, int, int]] = Counter()
        self._pool = torch.cuda.graph_pool_handle()
        self._epoch = 0
        self.warm_up_s = 0.0
        if warm:
            t = time.perf_counter()
            self._warm_prefill()
            self.warm_up(sorted({1, max_batch_size}))
            self.warm_up_s = time.perf_counter() - t

    def _warm_prefill(self) -> None:
        """One ``generate`` of two tokens (pinned buffers, events, the first token's path), then prefills of prompts
        of 16, 32, ... tokens up to max_seq_len (at most 1,024: cuBLAS picks its kernels by size, and each loads on
        first use) and of a left-padded batch (SDPA's masked kernel); one more token than 16 too (Triton specializes
        lengths divisible by 16). The cache is left empty."""
        m = self.model
        first = min(WARM_PREFILL_LEN, m.max_seq_len - 1)
        if first >= 1:
            ones = np.ones((1, first), dtype=np.int64)
            for _ in self.generate(ones, ones, 2, [SamplingParams(0.0, 0, 1.0, 0)]):
                pass
        lengths, s = [WARM_PREFILL_LEN + 1], 2 * WARM_PREFILL_LEN
        while s <= min(m.max_seq_len, 1024):
            lengths.append(s)
            s *= 2
        for i, s in enumerate(x for x in lengths if x <= m.max_seq_len):
            b = min(2, m.max_batch_size) if i == 0 else 1
            mask = np.ones((b, s), dtype=np.int64)
            mask[1:, :1] = 0
            with torch.cuda.stream(self.stream):
                self._prefill(np.zeros((b, s), dtype=np.int64), position_ids(mask, s), mask, 0, s - 1)
        with torch.cuda.stream(self.stream):
            m.valid.fill_(False)
        self.stream.synchronize()
        self._prefill_seen.clear()  # a prompt shape's graph is captured the second time a request brings it

    # --- caches ----------------------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int | None = None) -> DeviceCache:
        """A handle on the preallocated cache (``capacity``: at most the engine's max_seq_len, which it holds)."""
        if not 1 <= batch_size <= self.model.max_batch_size:
            raise ConfigurationError(f"batch size {batch_size} must be between 1 and the engine's max_batch_size "
                                     f"{self.model.max_batch_size}")
        self._epoch += 1
        return DeviceCache(self, batch_size, self._epoch)

    def check_live(self, cache: DeviceCache) -> None:
        if cache.session is not self or cache.epoch != self._epoch:
            raise BugError("a torch-cuda KV cache handle was used after a newer one replaced it (the session holds "
                           "one preallocated cache)")

    # --- one step (the runtime's generic interface: numpy in, numpy out) --------------------------------------
    def step(self, input_ids: np.ndarray, positions: np.ndarray, attention_mask: np.ndarray, cache: Any, *,
             last_only: bool) -> np.ndarray:
        self.check_live(cache)
        b, s = input_ids.shape
        start = cache.length
        with torch.cuda.stream(self.stream):
            if s == 1 and bool(attention_mask[:, -1].all()):
                graph = self._graph(b, greedy=True)
                self.tokens[:b].copy_(torch.from_numpy(input_ids[:, 0]))
                self.positions[:b].copy_(torch.from_numpy(positions[:, 0]))
                self.write_idx.fill_(start)
                self.model.valid[:b, start:] = False
                graph.replay()
                logits = self.logits[:b, None]
            else:
                logits = self._prefill(input_ids, positions, attention_mask, start, s - 1 if last_only else 0)
            out = logits.to("cpu", non_blocking=False).numpy()
        cache.length = start + s
        return out

    def _prefill(self, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, start: int,
                 logits_from: int) -> torch.Tensor:
        d = self.device
        causal_only = start == 0 and bool(mask.all())
        if causal_only and self.model.fused and PREFILL_GRAPHS > 0:
            graphed = self._prefill_graph(ids.shape[0], ids.shape[1], logits_from)
            if graphed is not None:
                return graphed.replay(ids, positions)
        new_valid = torch.from_numpy(np.ascontiguousarray(mask[:, start:] > 0)).to(d)
        return self.model.prefill(torch.from_numpy(ids).to(d), torch.from_numpy(positions).to(d), start, new_valid,
                                  logits_from, causal_only=causal_only)

    def _prefill_graph(self, b: int, s: int, logits_from: int) -> _PrefillGraph | None:
        """The prefill of a whole unpadded prompt of this shape from the cache's start, as a CUDA graph: captured
        the second time the shape comes (the first ran eagerly, loading its kernels), None until then. A prompt's
        prefill launches some ten kernels a layer, and launching them from Python costs more than running them
        (issue 39: TTFT@128 about 10 ms of host time for 1 ms of GPU time); a replay is one launch."""
        key = (b, s, logits_from)
        graphed = self._prefill_graphs.get(key)
        if graphed is not None:
            self._prefill_graphs.move_to_end(key)
            return graphed
        self._prefill_seen[key] += 1
        if self._prefill_seen[key] < 2:
            return None
        while len(self._prefill_graphs) >= PREFILL_GRAPHS:
            self._prefill_graphs.popitem(last=False)
        graphed = _PrefillGraph(self, b, s, logits_from)
        self._prefill_graphs[key] = graphed
        return graphed

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The export's signature on numpy (past in, present out): correct, but copies the whole cache each call;
        the runtime uses ``step``/``generate`` instead. numpy has no bfloat16: a bf16 engine's cache crosses as
        float32 (exact), and fed-back float32 is rounded to bf16 on the way in."""
        ids, mask, pos = feeds["input_ids"], feeds["attention_mask"], feeds["position_ids"]
        L = self.config.num_hidden_layers
        b, s = ids.shape
        past = mask.shape[1] - s  # a windowed layer's past holds the last ``window`` of these only
        cache = self.new_cache(b)
        m = self.model
        with torch.cuda.stream(self.stream):
            for i in range(L):
                k, v = (torch.from_numpy(feeds[f"past_key_values.{i}.{kv}"]).to(self.device, m.dtype)
                        for kv in ("key", "value"))
                m.load_past(i, b, k, v, past)
            m.valid[:b, :past] = torch.from_numpy(mask[:, :past] > 0).to(self.device)
            logits = self._prefill(ids, pos, mask, past, 0)
            sel = feeds.get("logits_positions")
            if sel is not None:
                logits = logits[:, torch.from_numpy(sel).to(self.device)]
            out = {"logits": logits.cpu().numpy()}
            for i in range(L):
                k, v = m.held(i, b, past + s)
                out[f"present.{i}.key"], out[f"present.{i}.value"] = _host(k), _host(v)
        cache.length = past + s
        return out

    # --- graphs ----------------------------------------------------------------------------------------------
    def _decode_body(self, b: int, greedy: bool) -> None:
        logits = self.model.decode(self.tokens[:b], self.positions[:b], self.write_idx)
        self.logits[:b].copy_(logits)
        self.write_idx.add_(1)
        self.positions[:b].add_(1)
        nxt = logits.argmax(dim=-1) if greedy else sample(
            logits, self.temperature[:b], self.top_k[:b], self.top_p[:b], self.seeds[:b], self.positions[:b])
        self.tokens[:b].copy_(nxt)

    def _graph(self, b: int, greedy: bool) -> torch.cuda.CUDAGraph:
        """The decode graph for batch ``b``, captured on first use. Warm-up runs (which compile, when enabled)
        move the state; it is saved and put back, and the cache columns they wrote lie past the valid ones."""
        key = (b, greedy)
        if key not in self._graphs:
            m = self.model
            # warm-ups write the scratch columns past max_seq_len, never a column holding the sequence; but a
            # windowed layer's ring has no column to spare, so the rings (window-sized) are saved and put back too
            state = [self.tokens, self.positions, self.write_idx, m.valid, self.logits,
                     *(kv for kv, w in zip(m.kv, m.windows, strict=True) if w is not None)]
            saved = [t.clone() for t in state]
            self.write_idx.fill_(m.max_seq_len)
            self.positions.clamp_(max=m.max_seq_len - 1)
            for _ in range(2):
                self._decode_body(b, greedy)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, stream=self.stream):
                self._decode_body(b, greedy)
            for t, s in zip(state, saved, strict=True):
                t.copy_(s)
            self._graphs[key] = graph
        return self._graphs[key]

    def warm_up(self, batch_sizes: list[int], *, greedy: bool = True) -> None:
        """Capture the decode graphs of these batch sizes now (compiling first, when enabled)."""
        with torch.cuda.stream(self.stream):
            for b in batch_sizes:
                self._graph(b, greedy)
        self.stream.synchronize()

    # --- generation ------------------------------------------------------------------------------------------
    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray, steps: int,
                 sampling: list[SamplingParams], finished: np.ndarray | None = None) -> Iterator[np.ndarray]:
        """Prefill the left-padded batch, then ``steps`` tokens per row ([B] int64 each, yielded in order). The
        GPU runs up to LOOKAHEAD steps ahead, choosing for every row (``finished`` rows too: their tokens are
        ignored); closing the iterator stops queueing more."""
        b, s = input_ids.shape
        if s + steps - 1 > self.model.max_seq_len:
            raise ConfigurationError(f"prompt {s} + {steps} new tokens exceed the engine's max_seq_len "
                                     f"{self.model.max_seq_len}")
        cache = self.new_cache(b)
        greedy = all(p.temperature <= 0 for p in sampling)
        positions = position_ids(attention_mask, s)
        host = torch.empty((steps, b), dtype=torch.int64, pin_memory=True)
        events = [torch.cuda.Event() for _ in range(steps)]
        with torch.cuda.stream(self.stream):
            self.temperature[:b].copy_(torch.tensor([p.temperature for p in sampling], dtype=torch.float32))
            self.top_k[:b].copy_(torch.tensor([p.top_k for p in sampling], dtype=torch.int64))
            self.top_p[:b].copy_(torch.tensor([p.top_p for p in sampling], dtype=torch.float32))
            self.seeds[:b].copy_(torch.tensor([_seed(p.seed) for p in sampling], dtype=torch.int64))
            graph = self._graph(b, greedy) if steps > 1 else None
            logits = self._prefill(input_ids, positions, attention_mask, 0, s - 1)[:, -1]
            self.write_idx.fill_(s)
            self.positions[:b].copy_(torch.from_numpy(positions[:, -1] + 1))
            first = logits.argmax(dim=-1) if greedy else sample(
                logits, self.temperature[:b], self.top_k[:b], self.top_p[:b], self.seeds[:b], self.positions[:b])
            self.tokens[:b].copy_(first)
        launched = consumed = 0
        try:
            while consumed < steps:
                with torch.cuda.stream(self.stream):
                    while launched < steps and launched - consumed < LOOKAHEAD:
                        if launched:
                            graph.replay()  # type: ignore[union-attr]
                        host[launched].copy_(self.tokens[:b], non_blocking=True)
                        events[launched].record(self.stream)
                        launched += 1
                events[consumed].synchronize()
                yield host[consumed].numpy().copy()
                consumed += 1
        finally:
            cache.length = s + max(launched - 1, 0)

    # --- facts for reports -----------------------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return {"weights_bytes": self.model.weight_bytes(), "kv_cache_bytes": self.model.kv_bytes(),
                "allocated_bytes": torch.cuda.memory_allocated(self.device),
                "max_allocated_bytes": torch.cuda.max_memory_allocated(self.device),
                "reserved_bytes": torch.cuda.memory_reserved(self.device), "device_used_bytes": total - free,
                "device_total_bytes": total}


class _PrefillGraph:
    """One prompt shape's prefill (batch b, length s, logits of positions logits_from..s-1; cache columns 0..s-1)
    captured in the session's graph pool, with the token ids and positions it reads."""

    def __init__(self, session: TorchCudaSession, b: int, s: int, logits_from: int) -> None:
        d = session.device
        self.ids = torch.zeros((b, s), dtype=torch.int64, device=d)
        self.positions = torch.zeros((b, s), dtype=torch.int64, device=d)
        valid = torch.ones((b, s), dtype=torch.bool, device=d)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=session._pool, stream=session.stream):  # records; runs nothing
            self.logits = session.model.prefill(self.ids, self.positions, 0, valid, logits_from, causal_only=True)

    def replay(self, ids: np.ndarray, positions: np.ndarray) -> torch.Tensor:
        """The prefill of these ids at these positions; the logits are a copy (the graph's own output lies in the
        pool that other graphs of the session reuse)."""
        self.ids.copy_(torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)))
        self.positions.copy_(torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)))
        self.graph.replay()
        return self.logits.clone()


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _host(t: torch.Tensor) -> np.ndarray:
    return (t.float() if t.dtype == torch.bfloat16 else t).cpu().numpy()


def _seed(seed: int | None) -> int:
    return int.from_bytes(os.urandom(4), "little") if seed is None else int(seed)
