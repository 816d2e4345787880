#!/usr/bin/env python3
"""onnxruntime-genai device runner for edgellm-farm: one self-contained script the farm pushes to a device and runs
with the device's own Python (3.8+; imports only the standard library, numpy and onnxruntime_genai).

Subcommands (every output is JSON or .npz; a one-line summary goes to stdout, one error line to stderr):
  env                                   versions: python, onnxruntime-genai, onnxruntime, numpy, machine
  build  --model-dir D --engine-dir E --max-batch-size N --max-input-len N --max-seq-len N
         the engine: a copy of the builder's model dir whose genai_config.json search.max_length is --max-seq-len,
         loaded once by onnxruntime-genai on this device (a model it cannot load fails here); E/engine.json
         records the versions, limits and load time. E must not exist; it appears whole or not at all.
  infer  --model-dir D --input-file I --output-file O [--threads N]
         I: {"requests": [{"id", "prompt" | "input_ids", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
         "stop"}]} (temperature 0 = greedy); O: {"responses": [{"id", "output_ids", "text", "finish_reason",
         "timings": {"ttft_ms", "ms_per_token"}}]} in request order: the files of `edgellm infer`. Requests run one
         at a time; output_ids end with the end-of-sequence id when one came (finish_reason "eos").
  bench  --model-dir D --mode prefill|decode [--batch-size 1] [--input-len N] [--past-len N] [--warmup N]
         [--iterations N] [--seed N] [--threads N] --output F
         F has the fields `edgellm bench` writes (tokens_per_s, ms_per_token {median, p90}, step_latency,
         peak_rss_bytes, ...). Each iteration rewinds the KV cache to --past-len outside the timed region, then
         times one append of --input-len (prefill) or 1 (decode) random tokens: one model run at a fixed shape.
  logits --model-dir D --reference R --output F [--threads N] [--max-window-logits-mb M]
         R: the farm's float reference (`edgellm reference`, format edgellm-reference/1). F (.npz, no pickles):
           header                     uint8: UTF-8 JSON (format FORMAT, versions, genai config, reference sha256,
                                      settings, greedy finish reasons, timings)
           prompt{i}_ids / _logits    int64 [S] / float32 [S, vocab]: teacher-forced logits of reference prompt i
           greedy{i}_ids              int64 [n]: greedy continuation of prompt i's ids (EOS kept when produced)
           greedy{i}_engine_text / _reference_text   uint8: both continuations decoded by the engine's tokenizer
           engine_prompt{i}_ids, engine_text_ids     int64: the engine tokenizer's ids of the prompts and the text
           window{j}_ids              int64 [len_j]: the perplexity windows fed (the reference's)
           window{j}_logits           float32 [len_j, vocab]  when all windows fit --max-window-logits-mb, else
           window_nll / window{j}_argmax   float64 [W] / int64 [len_j - 1]: per-window next-token NLL sums and
                                      argmax (the reduction edgellm.reference.window_nll computes)
         The host scores it with edgellm's own comparison (toolchains/onnxruntime_genai/accuracy.py).
Exit codes: 0 ok, 1 test failure (the engine ran and failed), 2 bad input, 3 infrastructure (e.g. onnxruntime_genai
not importable here), 4 bug.
The engine's tokenizer is told to add special tokens (``add_special_tokens``), as the checkpoint's tokenizer.json
does for a plain prompt: onnxruntime-genai 0.18's default encode leaves the BOS out.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback

FORMAT = "onnxruntime-genai-logits/1"
REFERENCE_FORMAT = "edgellm-reference/1"
RUNNER_VERSION = "1"
EXIT_OK, EXIT_TEST_FAILURE, EXIT_BAD_INPUT, EXIT_INFRASTRUCTURE, EXIT_BUG = 0, 1, 2, 3, 4
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
MAX_REQUEST_FILE_BYTES = 64 * 1024 * 1024
REQUEST_KEYS = ("id", "prompt", "messages", "input_ids", "max_new_tokens", "temperature", "top_k", "top_p", "seed",
                "stop")
DEFAULT_MAX_WINDOW_LOGITS_MB = 16.0


class RunnerError(Exception):
    code = EXIT_BUG
    kind = "bug"


class TestFailed(RunnerError):
    code = EXIT_TEST_FAILURE
    kind = "test failure"


class BadInput(RunnerError):
    code = EXIT_BAD_INPUT
    kind = "bad input"


class Infrastructure(RunnerError):
    code = EXIT_INFRASTRUCTURE
    kind = "infrastructure"


# --- what the device has ---------------------------------------------------------------------------------------
def _version(distribution):
    try:
        import importlib.metadata as metadata
    except ImportError:  # Python < 3.8 has none; this script needs 3.8 anyway
        return None
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def import_runtime():
    """numpy and onnxruntime_genai, or Infrastructure naming what is missing. onnxruntime_genai loads the
    onnxruntime package's shared library when imported; its absence is checked first because a library that
    cannot be loaded aborts the process from native code instead of raising."""
    try:
        import numpy
    except ImportError as exc:
        raise Infrastructure(f"numpy is not importable by {sys.executable} ({exc}); install numpy") from None
    ort = importlib.util.find_spec("onnxruntime")
    if ort is None or not ort.submodule_search_locations:
        raise Infrastructure(f"onnxruntime is not importable by {sys.executable}: onnxruntime_genai needs it "
                             "(pip install onnxruntime-genai)")
    capi = os.path.join(next(iter(ort.submodule_search_locations)), "capi")
    if sys.platform.startswith("linux") and not glob.glob(os.path.join(capi, "libonnxruntime.so*")):
        raise Infrastructure(f"onnxruntime's shared library is missing from {capi}: onnxruntime_genai cannot load it "
                             "(reinstall onnxruntime)")
    try:
        import onnxruntime_genai
    except (ImportError, OSError) as exc:
        raise Infrastructure(f"onnxruntime_genai is not importable by {sys.executable} "
                             f"({type(exc).__name__}: {exc}); install onnxruntime-genai") from None
    return numpy, onnxruntime_genai


def versions():
    return {"python": platform.python_version(), "runner": RUNNER_VERSION,
            "onnxruntime_genai": _version("onnxruntime-genai"), "onnxruntime": _version("onnxruntime"),
            "numpy": _version("numpy")}


def peak_rss_bytes():
    """This process's own peak resident set (VmHWM; ru_maxrss where /proc is absent)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * scale


def write_atomic(path, data):
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise BadInput(f"output directory {folder} does not exist")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600: give the file the mode open() would
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path, data):
    write_atomic(path, (json.dumps(data, indent=1, allow_nan=False) + "\n").encode("utf-8"))


# --- statistics (the same definitions as edgellm.reporting) ----------------------------------------------------
def percentile(values, q):
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_stats(seconds):
    ms = [s * 1e3 for s in seconds]
    mean = sum(ms) / len(ms)
    return {"count": len(ms), "mean_ms": mean, "median_ms": percentile(ms, 50), "p90_ms": percentile(ms, 90),
            "p99_ms": percentile(ms, 99), "min_ms": min(ms), "max_ms": max(ms),
            "std_ms": math.sqrt(sum((x - mean) ** 2 for x in ms) / len(ms))}


# --- the engine --------------------------------------------------------------------------------------------------
class Engine:
    """An onnxruntime-genai model dir: the model, its tokenizer and the limits its genai_config.json states."""

    def __init__(self, model_dir, threads=None):
        if not os.path.isdir(model_dir):
            raise BadInput(f"model dir {model_dir} not found")
        config_path = os.path.join(model_dir, "genai_config.json")
        if not os.path.isfile(config_path):
            raise BadInput(f"{model_dir} is not an onnxruntime-genai model dir: genai_config.json is missing")
        try:
            with open(config_path, encoding="utf-8") as f:
                self.genai_config = json.load(f)
            model = self.genai_config["model"]
            self.context_length = int(model["context_length"])
            self.vocab_size = int(model["vocab_size"])
            eos = model["eos_token_id"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise BadInput(f"{config_path} is unreadable or lacks model.context_length/vocab_size/eos_token_id "
                           f"({type(exc).__name__}: {exc})") from None
        self.eos_ids = set(int(e) for e in (eos if isinstance(eos, list) else [eos]))
        self.model_dir = model_dir
        self.threads = threads
        self.np, self.og = import_runtime()
        t0 = time.perf_counter()
        try:
            config = self.og.Config(model_dir)
            if threads:
                config.overlay(json.dumps({"model": {"decoder": {"session_options": {
                    "intra_op_num_threads": threads, "inter_op_num_threads": 1}}}}))
            self.model = self.og.Model(config)
            self.tokenizer = self.og.Tokenizer(self.model)
        except RuntimeError as exc:
            raise TestFailed(f"onnxruntime-genai cannot load {model_dir}: {exc}") from None
        self.add_special_tokens = "true"
        try:  # as tokenizer.json's post-processor does for a plain prompt (genai's default leaves BOS out)
            self.tokenizer.update_options(add_special_tokens="true")
        except (AttributeError, RuntimeError, TypeError):
            self.add_special_tokens = "not supported by this onnxruntime-genai"
        self.load_s = time.perf_counter() - t0

    def describe(self):
        model = self.genai_config.get("model", {})
        decoder = model.get("decoder", {}) if isinstance(model.get("decoder"), dict) else {}
        keys = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_size")
        out = {"type": model.get("type"), "vocab_size": self.vocab_size, "context_length": self.context_length,
               "eos_token_ids": sorted(self.eos_ids)}
        out.update({k: decoder.get(k) for k in keys})
        return out

    def bytes(self):
        total = 0
        for name in os.listdir(self.model_dir):
            path = os.path.join(self.model_dir, name)
            if os.path.isfile(path):
                total += os.path.getsize(path)
        return total

    def encode(self, text):
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, ids):
        return self.tokenizer.decode(self.np.asarray(ids, dtype=self.np.int32)) if ids else ""

    def generator(self, max_length, **search):
        if max_length > self.context_length:
            raise BadInput(f"{max_length} positions asked, over the model's context_length {self.context_length}")
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length, **search)
        return self.og.Generator(self.model, params)

    def logits(self, ids):
        """Teacher-forced logits of one sequence, one prefill: float32 [S, vocab]."""
        np = self.np
        gen = self.generator(len(ids) + 1, do_sample=False)
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        out = np.asarray(gen.get_output("logits"))
        if out.ndim != 3 or out.shape[0] != 1 or out.shape[1] != len(ids) or out.shape[2] != self.vocab_size:
            raise TestFailed(f"the model returned logits of shape {list(out.shape)} for {len(ids)} tokens; expected "
                             f"[1, {len(ids)}, {self.vocab_size}] (a graph built with prune_lm_head returns the last "
                             "position only)")
        return np.array(out[0], dtype=np.float32)

    def generate(self, ids, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=(), decode=True):
        """(output ids, text, finish reason, ttft ms, ms per token): the loop `edgellm infer` times the same way.
        ``decode`` False: ids only (text None)."""
        np = self.np
        search = {"do_sample": temperature > 0}
        if temperature > 0:
            search.update(temperature=float(temperature), top_k=int(top_k) if top_k else self.vocab_size,
                          top_p=float(top_p), random_seed=int(seed) if seed is not None else -1)
        gen = self.generator(len(ids) + max_new_tokens, **search)
        out, text, finish, t_first, t_done = [], None, None, None, None
        t0 = time.perf_counter()
        gen.append_tokens(np.asarray(ids, dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
            token = int(gen.get_next_tokens()[0])
            now = time.perf_counter()
            out.append(token)
            if t_first is None:
                t_first = now - t0
            if token in self.eos_ids:
                finish = "eos"
            elif stop:
                decoded = self.decode(out)
                cuts = [decoded.find(s) for s in stop if s in decoded]
                if cuts:
                    finish, text = "stop", decoded[:min(cuts)]
            if finish is None and len(out) >= max_new_tokens:
                finish = "length"
            if finish is not None:
                t_done = now - t0
                break
        if not out:
            raise TestFailed(f"onnxruntime-genai produced no token for a {len(ids)}-token prompt")
        if finish is None:  # the generator stopped on its own (an end id it knows and we do not)
            finish, t_done = "eos", time.perf_counter() - t0
        if text is None and decode:
            try:
                text = self.decode(out)
            except RuntimeError as exc:
                raise TestFailed(f"onnxruntime-genai's tokenizer cannot decode the ids it generated ({out[:8]}): "
                                 f"{exc}") from None
        per_token = (t_done - t_first) / (len(out) - 1) * 1000 if len(out) > 1 else 0.0
        return out, text, finish, t_first * 1000, per_token


# --- env ---------------------------------------------------------------------------------------------------------
def cmd_env(args):
    import_runtime()
    data = versions()
    data.update({"implementation": platform.python_implementation(), "machine": platform.machine(),
                 "platform": platform.platform(), "cpu_count": os.cpu_count(), "executable": sys.executable})
    print(json.dumps(data, indent=1))
    return EXIT_OK


# --- build -------------------------------------------------------------------------------------------------------
ENGINE_RECORD = "engine.json"


def cmd_build(args):
    import shutil

    limits = {"max_batch_size": args.max_batch_size, "max_input_len": args.max_input_len,
              "max_seq_len": args.max_seq_len}
    bad = [f"{k}={v!r}" for k, v in limits.items() if v < 1]
    if bad or args.max_input_len > args.max_seq_len:
        raise BadInput("engine limits must be >= 1 and max_input_len <= max_seq_len: {}".format(
            ", ".join(bad) or f"max_input_len={args.max_input_len} > max_seq_len={args.max_seq_len}"))
    source = Engine(args.model_dir)  # a model dir this device's onnxruntime-genai can load
    if args.max_seq_len > source.context_length:
        raise BadInput(f"max_seq_len {args.max_seq_len} exceeds the model's context_length {source.context_length}")
    engine_dir = os.path.abspath(args.engine_dir)
    if os.path.exists(engine_dir):
        raise BadInput(f"engine dir {engine_dir} already exists")
    work = tempfile.mkdtemp(dir=os.path.dirname(engine_dir), prefix="." + os.path.basename(engine_dir) + ".")
    try:
        staged = os.path.join(work, "engine")
        shutil.copytree(args.model_dir, staged)
        config_path = os.path.join(staged, "genai_config.json")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        config.setdefault("search", {})["max_length"] = args.max_seq_len
        write_json(config_path, config)
        t0 = time.perf_counter()
        built = Engine(staged)
        record = {"format": "onnxruntime-genai-engine/1", "versions": versions(), "limits": limits,
                  "model": built.describe(), "load_s": built.load_s, "build_s": time.perf_counter() - t0}
        write_json(os.path.join(staged, ENGINE_RECORD), record)
        os.replace(staged, engine_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("engine {} (max_seq_len {}, loaded in {:.2f} s)".format(engine_dir, args.max_seq_len, record["load_s"]))
    return EXIT_OK


# --- infer -------------------------------------------------------------------------------------------------------
def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def request_problems(r, index):
    """Every problem of one request (the rules of edgellm.runtime.requests)."""
    if not isinstance(r, dict):
        return [f"requests[{index}] is not an object"]
    where = "request {!r}".format(r.get("id", f"#{index}"))
    out = ["{}: unknown field {!r}; valid: {}".format(where, k, ", ".join(REQUEST_KEYS))
           for k in sorted(r) if k not in REQUEST_KEYS]
    if not isinstance(r.get("id"), str) or not r.get("id"):
        out.append(f"{where}: id must be a non-empty string")
    given = [k for k in ("prompt", "messages", "input_ids") if r.get(k) is not None]
    if len(given) != 1:
        out.append("{}: needs exactly one of prompt, input_ids (got {})".format(where, ", ".join(given) or "none"))
    if r.get("messages") is not None:
        out.append(f"{where}: messages (chat) requests are not supported by this runner; send prompt or input_ids"
                   )
    prompt = r.get("prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        out.append(f"{where}: prompt must be a non-empty string")
    ids = r.get("input_ids")
    if ids is not None and (not isinstance(ids, list) or not ids or not all(_is_int(t) and t >= 0 for t in ids)):
        out.append(f"{where}: input_ids must be a non-empty list of integers >= 0")
    new = r.get("max_new_tokens", 64)
    if not _is_int(new) or new < 1:
        out.append(f"{where}: max_new_tokens {new!r} must be an integer >= 1")
    temperature = r.get("temperature", 0.0)
    if not _is_number(temperature) or not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        out.append(f"{where}: temperature {temperature!r} must be 0 (greedy) or a number in "
                   f"[{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}]")
    top_k = r.get("top_k", 0)
    if not _is_int(top_k) or top_k < 0:
        out.append(f"{where}: top_k {top_k!r} must be an integer >= 0 (0 = off)")
    top_p = r.get("top_p", 1.0)
    if not _is_number(top_p) or not 0.0 < top_p <= 1.0:
        out.append(f"{where}: top_p {top_p!r} must be a number in (0, 1]")
    seed = r.get("seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        out.append(f"{where}: seed {seed!r} must be null or an integer >= 0")
    stop = r.get("stop", [])
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        out.append(f"{where}: stop must be a list of non-empty strings")
    return out


def read_requests(path):
    if not os.path.isfile(path):
        raise BadInput(f"{path}: request file not found")
    if os.path.getsize(path) > MAX_REQUEST_FILE_BYTES:
        raise BadInput(f"{path}: request file is over {MAX_REQUEST_FILE_BYTES} bytes")
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{path}: request file is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or set(data) != {"requests"}:
        raise BadInput(f'{path}: expected {{"requests": [...]}} and nothing else')
    requests = data["requests"]
    if not isinstance(requests, list) or not requests:
        raise BadInput(f"{path}: requests must be a non-empty list")
    problems = []
    for i, r in enumerate(requests):
        problems += request_problems(r, i)
    ids = [r.get("id") for r in requests if isinstance(r, dict)]
    problems += [f"duplicate request id {i!r}" for i in sorted(set(x for x in ids if ids.count(x) > 1))]
    if problems:
        raise BadInput("{}: invalid request file: {}".format(path, "; ".join(problems)))
    return requests


def cmd_infer(args):
    requests = read_requests(args.input_file)  # validated before the model loads
    engine = Engine(args.model_dir, args.threads)
    prompts, problems = [], []
    for r in requests:
        ids = list(r["input_ids"]) if r.get("input_ids") is not None else engine.encode(r["prompt"])
        if any(t < 0 for t in ids):  # the tokenizer's "unknown": its files do not describe the vocabulary it has
            raise TestFailed(f"onnxruntime-genai's tokenizer encoded request {r['id']!r} to ids outside the "
                             f"vocabulary ({ids[:8]}...)")
        new = r.get("max_new_tokens", 64)
        bad = [t for t in ids if t >= engine.vocab_size]
        if bad:
            problems.append("request {!r}: token id {} is outside the vocabulary (size {})".format(
                r["id"], bad[0], engine.vocab_size))
        if len(ids) + new > engine.context_length:
            problems.append("request {!r}: prompt {} + max_new_tokens {} tokens exceed the model's context_length "
                            "{}".format(r["id"], len(ids), new, engine.context_length))
        prompts.append(ids)
    if problems:
        raise BadInput("; ".join(problems))
    responses = []
    for r, ids in zip(requests, prompts):  # noqa: B905  (Python 3.8: no strict=)
        out, text, finish, ttft_ms, per_token_ms = engine.generate(
            ids, r.get("max_new_tokens", 64), r.get("temperature", 0.0), r.get("top_k", 0), r.get("top_p", 1.0),
            r.get("seed"), tuple(r.get("stop", [])))
        responses.append({"id": r["id"], "output_ids": out, "text": text, "finish_reason": finish,
                          "timings": {"ttft_ms": round(ttft_ms, 3), "ms_per_token": round(per_token_ms, 3)}})
    write_json(args.output_file, {"responses": responses})
    print(json.dumps({"output_file": args.output_file, "responses": len(responses)}))
    return EXIT_OK


# --- bench -------------------------------------------------------------------------------------------------------
def cmd_bench(args):
    problems = []
    if args.mode not in ("prefill", "decode"):
        problems.append(f"unknown --mode {args.mode!r}; valid: prefill, decode")
    if args.batch_size != 1:
        problems.append(f"--batch-size {args.batch_size}: this runner benchmarks batch 1 only")
    for name, minimum in (("input_len", 1), ("past_len", 0), ("warmup", 0), ("iterations", 1)):
        if getattr(args, name) < minimum:
            problems.append("--{} {}: must be >= {}".format(name.replace("_", "-"), getattr(args, name), minimum))
    if args.threads is not None and args.threads < 1:
        problems.append(f"--threads {args.threads}: must be >= 1")
    if problems:
        raise BadInput("; ".join(problems))
    rss_before = peak_rss_bytes()
    engine = Engine(args.model_dir, args.threads)
    np = engine.np
    new = args.input_len if args.mode == "prefill" else 1
    if args.past_len + new + 1 > engine.context_length:
        raise BadInput(f"--past-len {args.past_len} + {new} new token(s) exceed the model's context_length "
                       f"{engine.context_length}")
    rng = np.random.default_rng(args.seed)
    usable = np.array([t for t in range(engine.vocab_size) if t not in engine.eos_ids], dtype=np.int32)
    past = usable[rng.integers(0, len(usable), size=args.past_len)]
    inputs = usable[rng.integers(0, len(usable), size=new)]
    gen = engine.generator(args.past_len + new + 1, do_sample=False)
    t0 = time.perf_counter()
    if args.past_len:
        gen.append_tokens(past)
    past_prefill_s = time.perf_counter() - t0
    times = []
    for i in range(args.warmup + args.iterations):
        gen.rewind_to(args.past_len)
        t0 = time.perf_counter()
        gen.append_tokens(inputs)
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(dt)
    last = np.asarray(gen.get_output("logits"))
    if last.shape[-1] != engine.vocab_size or not np.all(np.isfinite(last[0, -1])):
        raise TestFailed(f"the model's step returned logits of shape {list(last.shape)} or non-finite values")
    stats = latency_stats(times)
    per_token_ms = [t * 1e3 / new for t in times]
    report = {
        "mode": args.mode,
        "parameters": {"model_dir": args.model_dir, "mode": args.mode, "batch_size": 1, "input_len": args.input_len,
                       "past_len": args.past_len, "warmup": args.warmup, "iterations": args.iterations,
                       "num_threads": args.threads, "seed": args.seed},
        "engine": dict(engine.describe(), dir=args.model_dir, bytes=engine.bytes(), runtime="onnxruntime-genai"),
        "tokens_per_step": new,
        "tokens_per_s": new / (stats["median_ms"] / 1e3),
        "tokens_per_s_mean": new * len(times) / sum(times),
        "ms_per_token": {"median": percentile(per_token_ms, 50), "p90": percentile(per_token_ms, 90)},
        "step_latency": stats,
        "step_latency_p90_over_median": stats["p90_ms"] / stats["median_ms"],
        "peak_rss_bytes": peak_rss_bytes(),
        "peak_rss_bytes_before_open": rss_before,
        "threads": args.threads,
        "cpu_count": os.cpu_count(),
        "versions": versions(),
        "timings": {"engine_open_s": round(engine.load_s, 4), "past_prefill_s": round(past_prefill_s, 4)},
    }
    write_json(args.output, report)
    print(json.dumps({"output": args.output, "mode": args.mode, "tokens_per_s": report["tokens_per_s"]}))
    return EXIT_OK


# --- logits ------------------------------------------------------------------------------------------------------
def load_reference(np, path):
    """The parts of an edgellm-reference/1 file the device needs (numpy only; no pickles)."""
    if not os.path.isfile(path):
        raise BadInput(f"reference file {path} not found")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
            header = json.loads(npz["header"].tobytes().decode("utf-8"))
            if not isinstance(header, dict) or header.get("format") != REFERENCE_FORMAT:
                raise ValueError("format {!r}, expected {!r}".format(
                    header.get("format") if isinstance(header, dict) else None, REFERENCE_FORMAT))
            settings = header["settings"]
            prompts = list(settings["prompts"])
            ref = {"header": header, "sha256": hashlib.sha256(raw).hexdigest(), "prompts": prompts,
                   "prompt_ids": [npz[f"prompt{i}_ids"].astype(np.int64).tolist()
                                  for i in range(len(prompts))],
                   "greedy_ids": [npz[f"greedy{i}_ids"].astype(np.int64).tolist()
                                  for i in range(len(prompts))],
                   "text": npz["text"].tobytes().decode("utf-8"),
                   "text_ids": npz["text_ids"].astype(np.int64).tolist(),
                   "greedy_tokens": int(settings["greedy_tokens"]), "window": int(settings["window"]),
                   "max_tokens": int(settings["max_tokens"]),
                   "vocab_size": int(header["checkpoint"]["config"]["vocab_size"])}
    except (OSError, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as exc:
        raise BadInput(f"reference file {path} is not a readable {REFERENCE_FORMAT} file "
                       f"({type(exc).__name__}: {exc})") from None
    return ref


def make_windows(ids, size, max_tokens):
    """Non-overlapping windows of <= size ids over the first max_tokens (edgellm.reference.make_windows)."""
    ids = ids[:max_tokens]
    return [w for w in (ids[i:i + size] for i in range(0, len(ids), size)) if len(w) >= 2]


def window_reduction(np, logits, window):
    """(sum of next-token NLLs, argmax at each predicting position): edgellm.reference.window_nll's arithmetic."""
    targets = np.asarray(window[1:], dtype=np.int64)
    total = 0.0
    for start in range(0, len(targets), 64):
        rows = logits[start:start + 64][: len(targets) - start].astype(np.float64)
        m = rows.max(axis=-1, keepdims=True)
        lse = (m + np.log(np.exp(rows - m).sum(axis=-1, keepdims=True)))[:, 0]
        total += float((lse - rows[np.arange(len(rows)), targets[start:start + len(rows)]]).sum())
    return total, np.argmax(logits[:-1], axis=-1).astype(np.int64)


def _utf8(np, text):
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def cmd_logits(args):
    if args.max_window_logits_mb < 0:
        raise BadInput(f"--max-window-logits-mb {args.max_window_logits_mb}: must be >= 0")
    engine = Engine(args.model_dir, args.threads)
    np = engine.np
    ref = load_reference(np, args.reference)
    problems = []
    if ref["vocab_size"] != engine.vocab_size:
        problems.append("the reference's checkpoint has vocab_size {}, the model {}: not the same model".format(
            ref["vocab_size"], engine.vocab_size))
    longest = max(len(ids) for ids in ref["prompt_ids"])
    if longest + ref["greedy_tokens"] > engine.context_length:
        problems.append("the greedy check needs {} positions (longest prompt {} + greedy tokens {}), over the "
                        "model's context_length {}".format(longest + ref["greedy_tokens"], longest,
                                                           ref["greedy_tokens"], engine.context_length))
    if ref["window"] + 1 > engine.context_length:
        problems.append("perplexity window {} is over the model's context_length {}".format(
            ref["window"], engine.context_length))
    if problems:
        raise BadInput("; ".join(problems))
    arrays, timings = {}, {"model_load_s": engine.load_s}
    t0 = time.perf_counter()
    for i, ids in enumerate(ref["prompt_ids"]):
        arrays[f"prompt{i}_ids"] = np.asarray(ids, dtype=np.int64)
        arrays[f"prompt{i}_logits"] = engine.logits(ids)
    timings["logits_s"] = time.perf_counter() - t0
    # The tokenizer's failures are evidence for the tokenizer check, not a reason to withhold the logits: they are
    # recorded (empty ids, a marked text) and the host's tokenizer check fails on them.
    tokenizer_errors = []

    def tokenizer(what, call, fallback):
        try:
            return call()
        except RuntimeError as exc:
            tokenizer_errors.append(f"{what}: {exc}")
            return fallback

    t0 = time.perf_counter()
    finishes = []
    for i, ids in enumerate(ref["prompt_ids"]):
        out, _, finish, _, _ = engine.generate(ids, ref["greedy_tokens"], decode=False)
        finishes.append(finish)
        arrays[f"greedy{i}_ids"] = np.asarray(out, dtype=np.int64)
        for name, seq in (("engine", out), ("reference", ref["greedy_ids"][i])):
            text = tokenizer(f"decode greedy{i} {name}", lambda s=seq: engine.decode(s), "<decode failed>")
            arrays[f"greedy{i}_{name}_text"] = _utf8(np, text)
    timings["greedy_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, prompt in enumerate(ref["prompts"]):
        ids = tokenizer(f"encode prompt {i}", lambda p=prompt: engine.encode(p), [])
        arrays[f"engine_prompt{i}_ids"] = np.asarray(ids, dtype=np.int64)
    ids = tokenizer("encode text", lambda: engine.encode(ref["text"]), [])
    arrays["engine_text_ids"] = np.asarray(ids, dtype=np.int64)
    timings["tokenize_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    windows = make_windows(ref["text_ids"], ref["window"], ref["max_tokens"])
    full = sum(len(w) for w in windows) * engine.vocab_size * 4 <= args.max_window_logits_mb * 2 ** 20
    nll = []
    for j, w in enumerate(windows):
        arrays[f"window{j}_ids"] = np.asarray(w, dtype=np.int64)
        logits = engine.logits(w)
        if full:
            arrays[f"window{j}_logits"] = logits
        else:
            total, top1 = window_reduction(np, logits, w)
            nll.append(total)
            arrays[f"window{j}_argmax"] = top1
    if not full:
        arrays["window_nll"] = np.asarray(nll, dtype=np.float64)
    timings["perplexity_s"] = time.perf_counter() - t0
    header = {"format": FORMAT, "versions": versions(), "model_dir": args.model_dir, "model": engine.describe(),
              "reference": {"sha256": ref["sha256"], "format": REFERENCE_FORMAT,
                            "checkpoint_sha256": ref["header"].get("checkpoint", {}).get("sha256")},
              "settings": {"greedy_tokens": ref["greedy_tokens"], "window": ref["window"],
                           "max_tokens": ref["max_tokens"]},
              "prompts": len(ref["prompts"]), "windows": len(windows), "window_logits": "full" if full else "reduced",
              "greedy_finish": finishes, "add_special_tokens": engine.add_special_tokens,
              "tokenizer_errors": tokenizer_errors, "threads": args.threads,
              "peak_rss_bytes": peak_rss_bytes(), "timings": {k: round(v, 4) for k, v in timings.items()}}
    arrays["header"] = _utf8(np, json.dumps(header, sort_keys=True))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    write_atomic(args.output, buf.getvalue())
    print(json.dumps({"output": args.output, "bytes": len(buf.getvalue()), "windows": len(windows),
                      "window_logits": header["window_logits"]}))
    return EXIT_OK


# --- command line ------------------------------------------------------------------------------------------------
def build_parser():
    p = argparse.ArgumentParser(prog="runner.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command")
    sub.required = True
    env = sub.add_parser("env", help="versions of python, onnxruntime-genai, onnxruntime, numpy (JSON)")
    env.set_defaults(func=cmd_env)
    build = sub.add_parser("build", help="make this device's engine from the builder's model dir")
    build.add_argument("--model-dir", required=True)
    build.add_argument("--engine-dir", required=True)
    build.add_argument("--max-batch-size", type=int, required=True)
    build.add_argument("--max-input-len", type=int, required=True)
    build.add_argument("--max-seq-len", type=int, required=True)
    build.set_defaults(func=cmd_build)
    infer = sub.add_parser("infer", help="run a request file (edgellm infer's format)")
    infer.add_argument("--model-dir", required=True)
    infer.add_argument("--input-file", required=True)
    infer.add_argument("--output-file", required=True)
    infer.add_argument("--threads", type=int, default=None, help="intra-op threads (default: onnxruntime's)")
    infer.set_defaults(func=cmd_infer)
    bench = sub.add_parser("bench", help="prefill or decode step throughput at a fixed shape (edgellm bench's JSON)")
    bench.add_argument("--model-dir", required=True)
    bench.add_argument("--mode", required=True, help="prefill | decode")
    bench.add_argument("--batch-size", type=int, default=1)
    bench.add_argument("--input-len", type=int, default=128, help="new tokens per step in prefill mode")
    bench.add_argument("--past-len", type=int, default=0, help="positions already in the KV cache")
    bench.add_argument("--warmup", type=int, default=2)
    bench.add_argument("--iterations", type=int, default=10)
    bench.add_argument("--seed", type=int, default=0, help="seed of the random input token ids")
    bench.add_argument("--threads", type=int, default=None)
    bench.add_argument("--output", required=True)
    bench.set_defaults(func=cmd_bench)
    logits = sub.add_parser("logits", help="what the host needs to score the model against a float reference")
    logits.add_argument("--model-dir", required=True)
    logits.add_argument("--reference", required=True, help="edgellm-reference/1 .npz")
    logits.add_argument("--output", required=True, help=".npz written here")
    logits.add_argument("--threads", type=int, default=None)
    logits.add_argument("--max-window-logits-mb", type=float, default=DEFAULT_MAX_WINDOW_LOGITS_MB,
                        help="ship the perplexity windows' full logits up to this size, else their reductions")
    logits.set_defaults(func=cmd_logits)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)  # a usage error exits 2 (bad input)
    try:
        return args.func(args)
    except RunnerError as exc:
        code, kind, message = exc.code, exc.kind, str(exc)
    except MemoryError:
        code, kind, message = EXIT_INFRASTRUCTURE, "infrastructure", "out of memory"
    except RuntimeError as exc:  # what onnxruntime-genai raises when the model fails to run
        code, kind, message = EXIT_TEST_FAILURE, "test failure", f"onnxruntime-genai failed: {exc}"
    except OSError as exc:  # a disk, a file system, a device that failed under us
        code, kind, message = EXIT_INFRASTRUCTURE, "infrastructure", f"{type(exc).__name__}: {exc}"
    except Exception as exc:
        traceback.print_exc()
        code, kind, message = EXIT_BUG, "bug", f"{type(exc).__name__}: {exc}"
    sys.stderr.write("onnxruntime-genai runner: {}: {}\n".format(kind, " ".join(message.split("\n"))))
    return code


if __name__ == "__main__":
    sys.exit(main())
