"""Next-token choice for one row of logits: greedy, or temperature / top-k / top-p sampling with a per-request
numpy Generator (seeded -> reproducible)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def choose(logits: np.ndarray, *, temperature: float, top_k: int, top_p: float,
           rng: np.random.Generator | None) -> int:
    """``logits`` float32 [vocab]."""
    if temperature <= 0.0 or rng is None:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.shape[0]:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    z -= z.max()
    p = np.exp(z)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, top_p)) + 1]
        mask = np.zeros_like(p)
        mask[keep] = p[keep]
        p = mask / mask.sum()
    return int(rng.choice(p.shape[0], p=p))


@dataclass(frozen=True)
class SamplingParams:
    """One request's choice rule, for runtimes that sample on their device."""

    temperature: float = 0.0  # 0 -> greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
