"""The transformers reference of a checkpoint, computed once and stored for ``edgellm eval --reference``.

File format (``edgellm-reference/1``): one uncompressed ``.npz`` (numpy zip, no pickles) with
  header                      uint8 [n]: UTF-8 JSON (format, versions, checkpoint sha256 + config, settings, ...)
  prompt{i}_ids / _auto_ids   int64 [S_i]: fixed prompt i through tokenizer.json / transformers' AutoTokenizer
  prompt{i}_logits            float32 [S_i, vocab]: every logit the fp32 logits check compares
  text_ids / text_auto_ids    int64 [T]: the perplexity text (stored in ``text`` as uint8 UTF-8) tokenized
  greedy{i}_ids               int64 [n_i]: the reference's greedy continuation (ends with EOS if one came)
  greedy{i}_top_ids / _top_logits   int64 / float32 [n_i, K]: each greedy step's K largest logits
  greedy{i}_eos_logits        float32 [n_i, E]: each step's logits of the E end-of-sequence ids
  window_nll                  float64 [W]: reference next-token NLL sum of each perplexity window
  window{j}_top1              int64 [len_j - 1]: reference argmax at each predicting position of window j
  prompt{i}_hidden            float32 [S_i, hidden]: with ``layers`` N > 0, the hidden state after the first N
                              decoder layers (the output of layer N-1, before any final norm)
  prompt{i}_layer_logits      float32 [S_i, vocab]: the model's own final norm, lm_head and any final soft-capping
                              applied to that hidden state: the logits of the checkpoint truncated to its first N layers
Windows are non-overlapping runs of ``settings.window`` tokens over the first ``max_tokens`` text ids, so an
engine is evaluated on the same windows whatever its own limits (eval refuses one whose max_input_len is smaller).
K = min(vocab, GREEDY_TOP_K): exact for small vocabularies; for large ones a divergence to a token outside the
top K gets the lead over the K-th logit, a lower bound of the true margin.

Device and dtype policy: transformers always runs the checkpoint in fp32, whatever the engine's precision (the
thresholds are keyed by the engine's precision against an fp32 reference). It runs on the device it is told
(``REFERENCE_DEVICES``; eval defaults to where the engine runs: a torch-cuda engine's reference runs on that GPU);
on CUDA its float32 matmuls run at full IEEE precision (TF32 off), so a GPU reference equals the CPU one up to
float32 summation order and the same checks and thresholds apply. A device that is asked for and absent is an
error, never a fall back to another. The header records the device, its name and the dtype.
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgellm import BUNDLED_TEXT_FILE, __version__
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import ConfigurationError
from edgellm.files import write_bytes_atomic

FORMAT = "edgellm-reference/1"
PROMPTS: tuple[str, ...] = (
    "Once upon a time, there was a little girl named Lily.",
    "The cat sat on the mat and",
    "Tom and his mom went to the park. They saw a big",
    "One day, a boy found a shiny red ball in the garden. He",
)
DEFAULT_GREEDY_TOKENS = 64
DEFAULT_MAX_TOKENS = 4096
DEFAULT_WINDOW = 128
GREEDY_TOP_K = 1024
REFERENCE_DEVICES = ("cpu", "cuda")
LAYER_STATE_TOKENS = 128  # the text's first tokens, kept as one more sequence of per-layer states (error growth)
REFERENCE_DTYPE = "fp32"
CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "rope_theta", "tie_word_embeddings")


@dataclass(frozen=True)
class ReferenceSettings:
    text_file: Path = BUNDLED_TEXT_FILE
    max_tokens: int = DEFAULT_MAX_TOKENS
    greedy_tokens: int = DEFAULT_GREEDY_TOKENS
    window: int = DEFAULT_WINDOW
    prompts: tuple[str, ...] = PROMPTS
    layers: int = 0  # > 0: also keep the hidden states after the first ``layers`` decoder layers
    layer_states: bool = False  # also keep the residual stream after every layer's attention and MLP (layer_diff)

    def validate(self) -> None:
        problems = []
        if isinstance(self.layers, bool) or not isinstance(self.layers, int) or self.layers < 0:
            problems.append(f"--layers {self.layers!r}: must be an integer >= 1 (or 0: no hidden states)")
        if self.greedy_tokens < 1:
            problems.append(f"--greedy-tokens {self.greedy_tokens}: must be >= 1")
        if self.max_tokens < 2:
            problems.append(f"--max-tokens {self.max_tokens}: must be >= 2")
        if self.window < 2:
            problems.append(f"--window {self.window}: must be >= 2")
        if not Path(self.text_file).is_file():
            problems.append(f"text file {self.text_file} not found")
        if problems:
            raise ConfigurationError("; ".join(problems))


def make_windows(ids: list[int], size: int, max_tokens: int) -> list[list[int]]:
    """Non-overlapping windows of <= size tokens covering the first max_tokens ids; a last window of 1 is dropped
    (it predicts nothing)."""
    ids = ids[:max_tokens]
    return [w for w in (ids[i:i + size] for i in range(0, len(ids), size)) if len(w) >= 2]


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))[:, 0]


def window_nll(logits: np.ndarray, window: list[int]) -> tuple[float, int]:
    """Sum of next-token negative log-likelihoods over one window; logits [S, vocab] float32."""
    targets = np.asarray(window[1:], dtype=np.int64)
    total = 0.0
    for start in range(0, len(targets), 64):  # rows at a time: [64, vocab] float64 stays small for big vocabs
        rows = logits[start:start + 64][: len(targets) - start]
        lse = _logsumexp_rows(rows)
        picked = rows[np.arange(len(rows)), targets[start:start + len(rows)]].astype(np.float64)
        total += float((lse - picked).sum())
    return total, len(targets)


def checkpoint_eos_ids(ckpt: Path, cfg: ModelConfig) -> set[int]:
    """End-of-sequence ids as transformers' generate sees them: config.json's plus generation_config.json's."""
    eos = set(cfg.eos_token_ids)
    gen = ckpt / "generation_config.json"
    if gen.is_file():
        value = read_json_object(gen, what="generation_config.json").get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        eos |= {v for v in values if isinstance(v, int) and not isinstance(v, bool)}
    return eos


@dataclass
class TopLogits:
    """One greedy step's reference logits, kept sparse: the K largest (ids, values) and the EOS ids' values."""

    ids: np.ndarray  # int64 [K]
    values: np.ndarray  # float32 [K]
    eos_ids: tuple[int, ...]
    eos_values: np.ndarray  # float32 [E]
    exact: bool  # K == vocab: every logit is here

    def top(self) -> int:
        return int(self.ids[int(np.argmax(self.values))])

    def value(self, token: int) -> tuple[float, bool]:
        """(logit of ``token``, exact); outside the top K: (the K-th logit, an upper bound of it), False)."""
        hit = np.nonzero(self.ids == token)[0]
        if hit.size:
            return float(self.values[hit[0]]), True
        if token in self.eos_ids:
            return float(self.eos_values[self.eos_ids.index(token)]), True
        return float(self.values.min()), self.exact


@dataclass
class ReferenceData:
    header: dict[str, Any]
    prompt_ids: list[list[int]]
    prompt_auto_ids: list[list[int]]
    prompt_logits: list[np.ndarray]
    text: str
    text_ids: list[int]
    text_auto_ids: list[int]
    greedy_ids: list[list[int]]
    greedy_steps: list[list[TopLogits]]
    window_nll: np.ndarray
    window_top1: list[np.ndarray]
    source: str = "<memory>"
    timings: dict[str, float] = field(default_factory=dict)
    hidden: list[np.ndarray] = field(default_factory=list)  # per prompt [S_i, hidden] after ``layers`` layers
    layer_logits: list[np.ndarray] = field(default_factory=list)  # per prompt [S_i, vocab]
    # with settings layer_states: (ids, [2 * num_layers, S, hidden]) per sequence (the prompts, then the text's
    # first LAYER_STATE_TOKENS tokens); rows layer-major, attention then MLP (edgellm.layer_diff.PARTS)
    layer_states: list[tuple[list[int], np.ndarray]] = field(default_factory=list)

    @property
    def layers(self) -> int:
        """N of the stored hidden states (0: none stored)."""
        return int(self.header["settings"].get("layers", 0))

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.header["settings"])

    @property
    def prompts(self) -> tuple[str, ...]:
        return tuple(self.header["settings"]["prompts"])

    @property
    def eos_ids(self) -> set[int]:
        return set(self.header["eos_ids"])

    @property
    def checkpoint_sha256(self) -> str:
        return str(self.header["checkpoint"]["sha256"])

    @property
    def device(self) -> dict[str, Any]:
        """Where transformers ran: ``{device, name, dtype}`` (files made before the header said so ran on the CPU)."""
        return dict(self.header.get("device") or {"device": "cpu", "name": None, "dtype": REFERENCE_DTYPE})

    def windows(self) -> list[list[int]]:
        s = self.header["settings"]
        return make_windows(self.text_ids, int(s["window"]), int(s["max_tokens"]))

    # --- file ----------------------------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        a: dict[str, np.ndarray] = {
            "header": np.frombuffer(json.dumps(self.header, sort_keys=True).encode(), dtype=np.uint8),
            "text": np.frombuffer(self.text.encode("utf-8"), dtype=np.uint8),
            "text_ids": np.asarray(self.text_ids, dtype=np.int64),
            "text_auto_ids": np.asarray(self.text_auto_ids, dtype=np.int64),
            "window_nll": np.asarray(self.window_nll, dtype=np.float64),
        }
        for i in range(len(self.prompt_ids)):
            a[f"prompt{i}_ids"] = np.asarray(self.prompt_ids[i], dtype=np.int64)
            a[f"prompt{i}_auto_ids"] = np.asarray(self.prompt_auto_ids[i], dtype=np.int64)
            a[f"prompt{i}_logits"] = np.asarray(self.prompt_logits[i], dtype=np.float32)
            steps = self.greedy_steps[i]
            a[f"greedy{i}_ids"] = np.asarray(self.greedy_ids[i], dtype=np.int64)
            k = len(steps[0].ids) if steps else 0
            e = len(self.header["eos_ids"])
            a[f"greedy{i}_top_ids"] = np.stack([s.ids for s in steps]) if steps else np.zeros((0, k), np.int64)
            a[f"greedy{i}_top_logits"] = (np.stack([s.values for s in steps]) if steps
                                          else np.zeros((0, k), np.float32))
            a[f"greedy{i}_eos_logits"] = (np.stack([s.eos_values for s in steps]) if steps
                                          else np.zeros((0, e), np.float32))
        for j, top1 in enumerate(self.window_top1):
            a[f"window{j}_top1"] = np.asarray(top1, dtype=np.int64)
        for j, (ids, states) in enumerate(self.layer_states):
            a[f"states{j}_ids"] = np.asarray(ids, dtype=np.int64)
            a[f"states{j}_hidden"] = np.asarray(states, dtype=np.float32)
        for i, (h, lg) in enumerate(zip(self.hidden, self.layer_logits, strict=True)):
            a[f"prompt{i}_hidden"] = np.asarray(h, dtype=np.float32)
            a[f"prompt{i}_layer_logits"] = np.asarray(lg, dtype=np.float32)
        return a

    def save(self, path: Path) -> str:
        """Write atomically (temp file + rename); returns the file's sha256."""
        buf = io.BytesIO()
        np.savez(buf, allow_pickle=False, **self.arrays())
        data = buf.getvalue()
        write_bytes_atomic(Path(path), data)
        return hashlib.sha256(data).hexdigest()


# --- computing it (the only part that needs torch and transformers) ------------------------------------------
def device_problem(device: str) -> str | None:
    """None when transformers can run the reference on ``device`` here; else why not."""
    if device not in REFERENCE_DEVICES:
        return f"unknown reference device {device!r}; valid: {', '.join(REFERENCE_DEVICES)}"
    if device == "cuda":
        from edgellm.backends.torch_cuda import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        if reason:
            return f"reference device cuda is not available here ({reason})"
    return None


class HFModel:
    """transformers' model and tokenizer for a checkpoint, fp32 on ``device`` (see the module's dtype policy)."""

    def __init__(self, checkpoint: Path, device: str = "cpu") -> None:
        import torch
        import transformers

        if (problem := device_problem(device)) is not None:
            raise ConfigurationError(problem)

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.torch = torch
        try:
            # The checkpoint's own tokenizer.json pipeline (post-processor included) is what the engine must match.
            # AutoTokenizer may substitute a model-specific class (transformers 5 does for qwen2, phi3, ...), which
            # disagrees with tokenizer.json for checkpoints pairing such a family with another tokenizer (the
            # synthetic ones do); its agreement is reported, not enforced.
            self.tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(checkpoint)
            self.auto_tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigurationError(f"transformers cannot load checkpoint {checkpoint}: "
                                     f"{str(exc).splitlines()[0]}") from None
        self.device = torch.device(device)
        self.model.to(self.device).eval()
        self.device_name = torch.cuda.get_device_name(self.device) if device == "cuda" else None
        # fp32 means fp32 on the GPU too: no TF32 in the reference's matmuls (put back by close())
        self._matmul_precision = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        # transformers >= 5.2x names the KV argument ``cache``; older releases ``past_key_values``
        self._cache_arg = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        # Tiny models are dominated by per-op overhead, which extra threads only add to (and which collapses when
        # the cores are shared); real-sized ones want every core.
        self._threads = torch.get_num_threads()
        if sum(p.numel() for p in self.model.parameters()) < 20_000_000:
            torch.set_num_threads(1)
        self.versions = {"transformers": transformers.__version__, "torch": torch.__version__}

    def close(self) -> None:
        """Give the process its thread and matmul settings back (callers may be long-lived, e.g. a test session)."""
        self.torch.set_num_threads(self._threads)
        self.torch.set_float32_matmul_precision(self._matmul_precision)

    def tensor(self, ids: list[int] | list[list[int]]) -> Any:
        return self.torch.tensor(ids, dtype=self.torch.long, device=self.device)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def auto_encode(self, text: str) -> list[int]:
        return list(self.auto_tokenizer(text).input_ids)

    def logits(self, ids: list[int]) -> np.ndarray:
        """float32 [S, vocab] for one sequence."""
        with self.torch.inference_mode():
            out = self.model(input_ids=self.tensor([ids]), use_cache=False)
        return out.logits[0].float().cpu().numpy()

    def after_layers(self, ids: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
        """The hidden state after the first ``n`` decoder layers, float32 [S, hidden] (captured at the output of
        layer n-1, so before the final norm even when n is every layer), and the logits the model itself computes
        from it, float32 [S, vocab]: what the checkpoint truncated to n layers computes. The layers after n-1 pass
        their input through unchanged (forward hooks), so whatever the model does after its layers (final norm,
        lm_head, a final soft-capping or logit scale) is the model's own code, never re-written here."""
        layers = getattr(self.model.base_model, "layers", None)
        if layers is None:
            raise ConfigurationError(f"{type(self.model).__name__}: no decoder layers found (base_model.layers): "
                                     f"hidden states after {n} layers cannot be taken")
        caught: list[Any] = []

        def skip(_m: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
            given = args[0] if args else kwargs["hidden_states"]
            return (given, *out[1:]) if isinstance(out, tuple) else given

        hooks = [layers[n - 1].register_forward_hook(
            lambda _m, _i, out: caught.append(out[0] if isinstance(out, tuple) else out))]
        hooks += [layer.register_forward_hook(skip, with_kwargs=True) for layer in layers[n:]]
        try:
            with self.torch.inference_mode():
                logits = self.model(input_ids=self.tensor([ids]), use_cache=False).logits
                hidden = caught[0]
        finally:
            for hook in hooks:
                hook.remove()
        return hidden[0].float().cpu().numpy(), logits[0].float().cpu().numpy()

    def greedy(self, ids: list[int], n: int, eos: set[int]) -> tuple[list[int], list[np.ndarray]]:
        """Plain greedy loop (no generation_config: no repetition penalty or other defaults a checkpoint carries).

        Returns the generated ids (ending with the EOS id if one was produced) and each step's logits [vocab].
        """
        torch = self.torch
        out: list[int] = []
        steps: list[np.ndarray] = []
        past = None
        inp = self.tensor([ids])
        with torch.inference_mode():
            for _ in range(n):
                res = self.model(input_ids=inp, use_cache=True, **{self._cache_arg: past})
                past = getattr(res, self._cache_arg)
                logits = res.logits[0, -1].float().cpu().numpy()
                tok = int(np.argmax(logits))
                out.append(tok)
                steps.append(logits)
                if tok in eos:
                    break
                inp = self.tensor([[tok]])
        return out, steps


def top_logits(row: np.ndarray, k: int, eos_ids: tuple[int, ...]) -> TopLogits:
    """Sparse copy of one step's logits [vocab]: the k largest, sorted descending, and the EOS ids'."""
    k = min(k, row.shape[-1])
    idx = np.argpartition(-row, k - 1)[:k] if k < row.shape[-1] else np.arange(row.shape[-1])
    idx = idx[np.argsort(-row[idx], kind="stable")]
    return TopLogits(ids=idx.astype(np.int64), values=row[idx].astype(np.float32), eos_ids=eos_ids,
                     eos_values=row[list(eos_ids)].astype(np.float32), exact=k == row.shape[-1])


def checkpoint_digest(ckpt: Path) -> str:
    """The checkpoint's identity, as export records it in its manifest (and build copies into the engine's)."""
    from edgellm.compiler.files import checkpoint_files, tree_sha256

    return tree_sha256(checkpoint_files(ckpt))


def checkpoint_revision(ckpt: Path) -> str | None:
    """The Hugging Face hub revision (commit) of a checkpoint in the hub cache (``.../snapshots/<commit>``), or
    None; the identity that always counts is the digest (``checkpoint_digest``)."""
    path = Path(ckpt).resolve()
    if path.parent.name == "snapshots" and len(path.name) == 40 and all(c in "0123456789abcdef" for c in path.name):
        return path.name
    return None


def compute_reference(checkpoint: Path, settings: ReferenceSettings, device: str = "cpu") -> ReferenceData:
    """Run transformers on the checkpoint once (fp32 on ``device``) and keep everything eval compares an engine
    against."""
    settings.validate()
    if (problem := device_problem(device)) is not None:
        raise ConfigurationError(problem)
    checkpoint = Path(checkpoint)
    if not (checkpoint / "config.json").is_file():
        raise ConfigurationError(f"checkpoint {checkpoint} has no config.json (give a Hugging Face checkpoint dir)")
    cfg = ModelConfig.load(checkpoint)
    if settings.layers > cfg.num_hidden_layers:
        raise ConfigurationError(f"--layers {settings.layers}: checkpoint {checkpoint} has {cfg.num_hidden_layers} "
                                 f"decoder layers; valid: 1..{cfg.num_hidden_layers}")
    eos = checkpoint_eos_ids(checkpoint, cfg)
    eos_t = tuple(sorted(eos))
    text = Path(settings.text_file).read_text(encoding="utf-8", errors="replace")
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    digest = checkpoint_digest(checkpoint)
    timings["checkpoint_digest_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    hf = HFModel(checkpoint, device)
    timings["model_load_s"] = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        prompt_ids = [hf.encode(p) for p in settings.prompts]
        prompt_auto = [hf.auto_encode(p) for p in settings.prompts]
        text_ids, text_auto = hf.encode(text), hf.auto_encode(text)
        timings["tokenize_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prompt_logits = [hf.logits(ids) for ids in prompt_ids]
        timings["logits_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        hidden, layer_logits = [], []
        for ids in prompt_ids if settings.layers else []:
            h, lg = hf.after_layers(ids, settings.layers)
            hidden.append(h)
            layer_logits.append(lg)
        timings["hidden_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        layer_states = []
        for ids in [*prompt_ids, text_ids[:min(LAYER_STATE_TOKENS, cfg.max_position_embeddings)]] if (
                settings.layer_states) else []:
            from edgellm.layer_diff import reference_layer_states, stack_states

            layer_states.append((list(ids), stack_states(reference_layer_states(hf, list(ids)),
                                                         cfg.num_hidden_layers)))
        timings["layer_states_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        greedy_ids, greedy_steps = [], []
        for ids in prompt_ids:
            out, steps = hf.greedy(ids, settings.greedy_tokens, eos)
            greedy_ids.append(out)
            greedy_steps.append([top_logits(s, GREEDY_TOP_K, eos_t) for s in steps])
        timings["greedy_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        windows = make_windows(text_ids, settings.window, settings.max_tokens)
        if not windows:
            raise ConfigurationError(f"text file {settings.text_file} gives {len(text_ids)} token(s); need at least 2")
        nll, top1 = [], []
        for w in windows:
            r = hf.logits(w)
            nll.append(window_nll(r, w)[0])
            top1.append(np.argmax(r[:-1], axis=-1).astype(np.int64))
        timings["perplexity_s"] = time.perf_counter() - t0
        auto_class = type(hf.auto_tokenizer).__name__
        versions = hf.versions
        where = {"device": device, "name": hf.device_name, "dtype": REFERENCE_DTYPE}
    finally:
        hf.close()
    count = sum(len(w) - 1 for w in windows)
    header = {
        "format": FORMAT,
        "edgellm_version": __version__,
        "versions": versions,
        "device": where,
        "created_unix": int(time.time()),
        "checkpoint": {"path": str(checkpoint.resolve()), "sha256": digest, "revision": checkpoint_revision(checkpoint),
                       "config": {k: getattr(cfg, k) for k in CONFIG_KEYS}},
        "settings": {"prompts": list(settings.prompts), "text_file": str(settings.text_file),
                     "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
                     "max_tokens": settings.max_tokens, "greedy_tokens": settings.greedy_tokens,
                     "window": settings.window, "layers": settings.layers,
                     "layer_states": settings.layer_states},
        "eos_ids": list(eos_t),
        "auto_tokenizer_class": auto_class,
        "greedy_top_k": min(GREEDY_TOP_K, cfg.vocab_size),
        "windows": len(windows),
        "perplexity_tokens": count,
        "reference_perplexity": float(np.exp(sum(nll) / count)),
        "timings": {k: round(v, 4) for k, v in timings.items()},
    }
    return ReferenceData(header=header, prompt_ids=prompt_ids, prompt_auto_ids=prompt_auto,
                         prompt_logits=prompt_logits, text=text, text_ids=text_ids, text_auto_ids=text_auto,
                         greedy_ids=greedy_ids, greedy_steps=greedy_steps, window_nll=np.asarray(nll, np.float64),
                         window_top1=top1, timings=timings, hidden=hidden, layer_logits=layer_logits,
                         layer_states=layer_states)


# --- reading it back (untrusted input: no pickles, every shape checked) ------------------------------------
def load_reference(path: Path) -> ReferenceData:
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError(f"reference file {path} not found (make one with `edgellm reference`)")
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive")
        with npz:
            arrays = {name: npz[name] for name in npz.files}
        return _from_arrays(arrays, str(path))
    except ConfigurationError:
        raise
    except (OSError, ValueError, EOFError, KeyError, IndexError, TypeError, zipfile.BadZipFile,
            json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"reference file {path} is not a readable {FORMAT} file "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                                 f"remake it with `edgellm reference`") from None


def _arr(arrays: dict[str, np.ndarray], name: str, kind: str, ndim: int) -> np.ndarray:
    if name not in arrays:
        raise ValueError(f"missing array {name!r}")
    a = arrays[name]
    if a.dtype.kind != kind or a.ndim != ndim:
        raise ValueError(f"array {name!r} has dtype {a.dtype} and {a.ndim} dim(s)")
    return a


def _from_arrays(arrays: dict[str, np.ndarray], source: str) -> ReferenceData:
    header = json.loads(_arr(arrays, "header", "u", 1).tobytes().decode("utf-8"))
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise ValueError(f"format {got!r}, expected {FORMAT!r}")
    s = header["settings"]
    prompts = s["prompts"]
    vocab = int(header["checkpoint"]["config"]["vocab_size"])
    eos_ids = tuple(int(e) for e in header["eos_ids"])
    for key in ("max_tokens", "greedy_tokens", "window"):
        if not isinstance(s[key], int) or s[key] < 1:
            raise ValueError(f"setting {key}={s[key]!r}")
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts) or not prompts:
        raise ValueError("settings.prompts must be a non-empty list of strings")
    ids_of = [_arr(arrays, f"prompt{i}_ids", "i", 1).tolist() for i in range(len(prompts))]
    auto_of = [_arr(arrays, f"prompt{i}_auto_ids", "i", 1).tolist() for i in range(len(prompts))]
    logits = []
    for i, ids in enumerate(ids_of):
        lg = _arr(arrays, f"prompt{i}_logits", "f", 2)
        if lg.shape != (len(ids), vocab) or lg.dtype != np.float32:
            raise ValueError(f"prompt{i}_logits shape {list(lg.shape)} {lg.dtype}, expected [{len(ids)}, {vocab}] "
                             f"float32")
        logits.append(lg)
    greedy_ids, greedy_steps = [], []
    for i in range(len(prompts)):
        out = _arr(arrays, f"greedy{i}_ids", "i", 1).tolist()
        top_ids = _arr(arrays, f"greedy{i}_top_ids", "i", 2)
        top_val = _arr(arrays, f"greedy{i}_top_logits", "f", 2)
        eos_val = _arr(arrays, f"greedy{i}_eos_logits", "f", 2)
        n = len(out)
        if top_ids.shape[0] != n or top_val.shape != top_ids.shape or eos_val.shape != (n, len(eos_ids)):
            raise ValueError(f"greedy{i} arrays disagree in shape")
        if top_ids.size and (top_ids.min() < 0 or top_ids.max() >= vocab):
            raise ValueError(f"greedy{i}_top_ids outside the vocabulary")
        exact = top_ids.shape[1] == vocab
        greedy_ids.append(out)
        greedy_steps.append([TopLogits(top_ids[j], top_val[j], eos_ids, eos_val[j], exact) for j in range(n)])
    text = _arr(arrays, "text", "u", 1).tobytes().decode("utf-8")
    text_ids = _arr(arrays, "text_ids", "i", 1).tolist()
    text_auto = _arr(arrays, "text_auto_ids", "i", 1).tolist()
    nll = _arr(arrays, "window_nll", "f", 1)
    windows = make_windows(text_ids, s["window"], s["max_tokens"])
    if len(nll) != len(windows) or not windows:
        raise ValueError(f"{len(nll)} window NLLs for {len(windows)} windows")
    top1 = []
    for j, w in enumerate(windows):
        t = _arr(arrays, f"window{j}_top1", "i", 1)
        if len(t) != len(w) - 1:
            raise ValueError(f"window{j}_top1 has {len(t)} positions, expected {len(w) - 1}")
        top1.append(t)
    layers = s.get("layers", 0)  # files made before hidden states were stored have none
    if isinstance(layers, bool) or not isinstance(layers, int) or not 0 <= layers <= int(
            header["checkpoint"]["config"]["num_hidden_layers"]):
        raise ValueError(f"setting layers={layers!r}")
    hidden, layer_logits = [], []
    hidden_size = int(header["checkpoint"]["config"]["hidden_size"])
    for i, ids in enumerate(ids_of if layers else []):
        h = _arr(arrays, f"prompt{i}_hidden", "f", 2)
        lg = _arr(arrays, f"prompt{i}_layer_logits", "f", 2)
        if h.shape != (len(ids), hidden_size) or lg.shape != (len(ids), vocab):
            raise ValueError(f"prompt{i}_hidden {list(h.shape)} / prompt{i}_layer_logits {list(lg.shape)}, expected "
                             f"[{len(ids)}, {hidden_size}] / [{len(ids)}, {vocab}]")
        hidden.append(h)
        layer_logits.append(lg)
    layer_states = []
    if s.get("layer_states", False) is True:  # files made before per-layer states were stored have none
        rows = 2 * int(header["checkpoint"]["config"]["num_hidden_layers"])
        for j in range(len(prompts) + 1):
            ids = _arr(arrays, f"states{j}_ids", "i", 1).tolist()
            st = _arr(arrays, f"states{j}_hidden", "f", 3)
            if st.shape != (rows, len(ids), hidden_size):
                raise ValueError(f"states{j}_hidden {list(st.shape)}, expected [{rows}, {len(ids)}, {hidden_size}]")
            layer_states.append((ids, st))
    return ReferenceData(header=header, prompt_ids=ids_of, prompt_auto_ids=auto_of, prompt_logits=logits, text=text,
                         text_ids=text_ids, text_auto_ids=text_auto, greedy_ids=greedy_ids,
                         greedy_steps=greedy_steps, window_nll=nll, window_top1=top1, source=source, hidden=hidden,
                         layer_logits=layer_logits, layer_states=layer_states)
