"""Accuracy of an onnxruntime-genai model against the farm's float reference, judged exactly as ``edgellm eval``.

The device computes (``runner.py logits``: teacher-forced logits of the reference's prompts and perplexity windows,
greedy continuations of its prompts, the engine tokenizer's ids); the host scores here with edgellm's own comparison
functions (``edgellm.accuracy``: logits max |diff| and cosine, greedy prefix match and divergence margin, perplexity
and teacher-forced top-1, tokenizer parity) and its per-precision thresholds (``edgellm.thresholds``), through
:class:`FetchedEngine`, a read-only engine whose answers come from the fetched file. So both toolchains are judged
by one implementation.

The report is ``edgellm.accuracy.score``'s, the one ``run_eval`` returns; when the device shipped per-window
reductions instead of the windows' full logits (large vocabularies), ``score`` sums perplexity and top-1 agreement
from them (``edgellm.accuracy.WindowReductions``). This module adds only what is the device's: the versions it ran,
where perplexity came from, its tokenizer setting and its timings.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgefarm.toolchains.onnxruntime_genai import DISTRIBUTION
from edgefarm.toolchains.onnxruntime_genai.runner import FORMAT
from edgellm.accuracy import WindowReductions, score
from edgellm.errors import ConfigurationError
from edgellm.reference import ReferenceData, load_reference
from edgellm.thresholds import resolve_thresholds
from edgellm.types import Precision

# genai_config name -> the reference header's checkpoint config name
_CONFIG_KEYS = {"vocab_size": "vocab_size", "num_hidden_layers": "num_hidden_layers", "hidden_size": "hidden_size",
                "num_attention_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
                "head_size": "head_dim"}


@dataclass(frozen=True)
class GreedyResult:
    """What edgellm.accuracy reads of a generation result."""

    output_ids: list[int]
    finish_reason: str


class FetchedEngine:
    """The engine as edgellm.accuracy's comparisons see it (``logits``, ``generate``, ``encode``, ``decode``,
    ``max_batch_size``), answered from a runner logits file. Any question the file cannot answer (ids or a text
    the device was not given) is a ConfigurationError: the file was made for another reference."""

    def __init__(self, arrays: Mapping[str, np.ndarray], header: dict[str, Any], ref: ReferenceData) -> None:
        self.header = header
        vocab = int(ref.header["checkpoint"]["config"]["vocab_size"])
        self._logits: dict[tuple[int, ...], np.ndarray] = {}
        self._greedy: dict[str, GreedyResult] = {}
        self._encoded: dict[str, list[int]] = {}
        self._decoded: dict[tuple[int, ...], str] = {}
        finishes = header.get("greedy_finish") or []
        for i, (prompt, ids) in enumerate(zip(ref.prompts, ref.prompt_ids, strict=True)):
            fed = _ints(arrays, f"prompt{i}_ids")
            if fed != list(ids):
                raise ConfigurationError(f"the logits file fed prompt {i} other ids than the reference's: made for "
                                         f"another reference")
            self._logits[tuple(ids)] = _logits(arrays, f"prompt{i}_logits", len(ids), vocab)
            out = _ints(arrays, f"greedy{i}_ids")
            self._greedy[f"prompt{i}"] = GreedyResult(out, str(finishes[i]) if i < len(finishes) else "length")
            self._encoded[prompt] = _ints(arrays, f"engine_prompt{i}_ids")
            self._decoded[tuple(out)] = _text(arrays, f"greedy{i}_engine_text")
            self._decoded[tuple(ref.greedy_ids[i])] = _text(arrays, f"greedy{i}_reference_text")
        self._encoded[ref.text] = _ints(arrays, "engine_text_ids")
        self.windows = ref.windows()
        self.full_windows = header.get("window_logits") == "full"
        for j, w in enumerate(self.windows):
            if _ints(arrays, f"window{j}_ids") != list(w):
                raise ConfigurationError(f"the logits file fed window {j} other ids than the reference's windows")
            if self.full_windows:
                self._logits[tuple(w)] = _logits(arrays, f"window{j}_logits", len(w), vocab)
        self.reductions = None if self.full_windows else WindowReductions(
            _array(arrays, "window_nll", "f", 1),
            [_array(arrays, f"window{j}_argmax", "i", 1) for j in range(len(self.windows))])
        self.max_batch_size = max(1, len(ref.prompt_ids))

    def logits(self, ids: list[int]) -> np.ndarray:
        try:
            return self._logits[tuple(ids)]
        except KeyError:
            raise ConfigurationError(f"the logits file holds no logits for a sequence of {len(ids)} ids "
                                     f"asked by the comparison") from None

    def generate(self, requests: list[Any]) -> list[GreedyResult]:
        out = []
        for r in requests:
            if r.id not in self._greedy:
                raise ConfigurationError(f"the logits file holds no greedy continuation for {r.id}")
            out.append(self._greedy[r.id])
        return out

    def encode(self, text: str) -> list[int]:
        try:
            return self._encoded[text]
        except KeyError:
            raise ConfigurationError("the logits file holds no engine tokenization of a text asked") from None

    def decode(self, ids: list[int]) -> str:
        try:
            return self._decoded[tuple(ids)]
        except KeyError:
            raise ConfigurationError("the logits file holds no engine decoding of a sequence asked") from None


def _array(arrays: Mapping[str, np.ndarray], name: str, kind: str, ndim: int) -> np.ndarray:
    if name not in arrays:
        raise ConfigurationError(f"the logits file has no array {name!r}")
    a = arrays[name]
    if a.dtype.kind != kind or a.ndim != ndim:
        raise ConfigurationError(f"the logits file's {name!r} is {a.dtype} with {a.ndim} dim(s)")
    return a


def _ints(arrays: Mapping[str, np.ndarray], name: str) -> list[int]:
    return [int(x) for x in _array(arrays, name, "i", 1)]


def _text(arrays: Mapping[str, np.ndarray], name: str) -> str:
    return _array(arrays, name, "u", 1).tobytes().decode("utf-8", errors="replace")


def _logits(arrays: Mapping[str, np.ndarray], name: str, length: int, vocab: int) -> np.ndarray:
    a = _array(arrays, name, "f", 2)
    if a.shape != (length, vocab) or a.dtype != np.float32:
        raise ConfigurationError(f"the logits file's {name!r} is {a.dtype} {list(a.shape)}, expected float32 "
                                 f"[{length}, {vocab}]")
    return a


def read_fetched(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of a runner logits file (untrusted: no pickles, format checked)."""
    try:
        with np.load(Path(path), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        header = json.loads(arrays.pop("header").tobytes().decode("utf-8"))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, UnicodeDecodeError, AttributeError) as exc:
        raise ConfigurationError(f"{path} is not a readable {FORMAT} file ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise ConfigurationError(f"{path} has format {got!r}, expected {FORMAT!r}")
    return header, arrays


def config_differences(model: Mapping[str, Any], ref: ReferenceData) -> dict[str, list[Any]]:
    """[engine, reference] of every shape value that differs between the genai config and the reference's."""
    ref_cfg = ref.header["checkpoint"]["config"]
    out = {}
    for ours, theirs in _CONFIG_KEYS.items():
        want = ref_cfg.get(theirs)
        if theirs == "num_key_value_heads" and want is None:
            want = ref_cfg.get("num_attention_heads")
        if theirs == "head_dim" and want is None and ref_cfg.get("num_attention_heads"):
            want = ref_cfg["hidden_size"] // ref_cfg["num_attention_heads"]
        if model.get(ours) != want:
            out[theirs] = [model.get(ours), want]
    return out


def report(fetched_file: Path, reference: Path, precision: str, thresholds: Mapping[str, float]) -> dict[str, Any]:
    """The accuracy report of the runner's logits file against the float reference (``edgellm eval``'s shape:
    ``passed``, ``checks``, ``failed_checks``, perplexities, per-prompt details). ``thresholds``: the catalog's
    limits over edgellm's defaults for ``precision`` (a precision without defaults needs them, as for eval)."""
    parsed = Precision.parse(precision, what="precision")
    limits = resolve_thresholds(parsed, None, dict(thresholds))  # type: ignore[arg-type]
    header, arrays = read_fetched(fetched_file)
    ref = load_reference(Path(reference))
    sha = hashlib.sha256(Path(reference).read_bytes()).hexdigest()
    if (header.get("reference") or {}).get("sha256") != sha:
        raise ConfigurationError(f"{fetched_file} was computed against reference sha256 "
                                 f"{str((header.get('reference') or {}).get('sha256'))[:16]}..., not {reference} "
                                 f"({sha[:16]}...)")
    differences = config_differences(header.get("model") or {}, ref)
    if differences:
        raise ConfigurationError(f"the model the device ran does not match reference {reference}: "
                                 + ", ".join(f"{k} {e} (engine) vs {r} (reference)"
                                             for k, (e, r) in differences.items()))
    engine = FetchedEngine(arrays, header, ref)
    out = score(engine, ref, limits, parsed, engine_dir=header.get("model_dir"),
                checkpoint=ref.header["checkpoint"]["path"], reference_file=str(reference),
                engine_backend=DISTRIBUTION, config_differences=differences, reductions=engine.reductions)
    return {**out, "engine_versions": header.get("versions"),
            "perplexity_from": "logits" if engine.reductions is None else "device reductions",
            "add_special_tokens": header.get("add_special_tokens"),
            "timings": dict(header.get("timings") or {})}  # the device's: the host only read a file
