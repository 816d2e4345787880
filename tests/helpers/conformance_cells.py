"""Running cells of the conformance matrix (edgellm.conformance), in a worker process of tests/test_conformance.py.

Cells sharing a float checkpoint (same family, feature and dtype) run in one worker, one after the other; each cell
first proves its inputs are what it says (the feature's config keys in config.json, the tensors stored in the cell's
dtype, shards with an index), so a feature silently dropped by a writer fails rather than passes. The cells of a
group that run an eval are judged against one transformers reference: the same checkpoint, settings and device give
the same reference (one thread per worker), so it is computed for the first and a copy serves the others (a
quantized cell is judged against its float source, as the float cells). A cell's outcome is None (passed) or the
failure, with its traceback.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import traceback
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from edgellm import conformance

STORED = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}
BUILD = dict(max_seq_len=128, max_input_len=64, max_batch_size=1)
EVAL = dict(greedy_tokens=conformance.GREEDY_TOKENS, max_tokens=128, window=64)
# Random weights give near-uniform logits whose argmax is mostly a near-tie: teacher-forced top-1 agreement of a
# round-to-nearest int4 checkpoint measured 0.72-0.79 (llama, qwen3; as the catalog's tiny models' int4_wo). The
# method's other limits (perplexity, finite outputs, tokenizer) stand as declared.
RANDOM_WEIGHTS_QUANTIZED = {"top1_min_agreement": 0.5}
BF16_IDS = [1, 5, 9, 33, 70, 100, 4, 8, 200, 13, 17, 42, 7, 300, 91, 64, 5, 11, 250, 6]


def init_worker() -> None:
    """One thread per worker: the pool has a worker per core."""
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)


def run_group(cells: list[conformance.Cell], root: Path) -> dict[str, str | None]:
    """Outcomes of cells that share one checkpoint (made here, under ``root``)."""
    from edgellm.synth import make_checkpoint

    first = cells[0]
    ckpt = root / "-".join(first.checkpoint_key)
    try:
        make_checkpoint(ckpt, first.family, dtype=first.dtype, max_shard_size=first.feature.max_shard_size,
                        **first.feature.overrides)
        check_made_as_asked(ckpt, first)
    except Exception:  # every cell of the group fails with the checkpoint's problem
        problem = "checkpoint: " + traceback.format_exc()
        return {c.id: problem for c in cells}
    out: dict[str, str | None] = {}
    with one_reference_per_input():
        for cell in cells:
            work = root / "cells" / cell.id
            try:
                run_cell(cell, ckpt, work)
                out[cell.id] = None
            except Exception:
                out[cell.id] = traceback.format_exc()
    return out


@contextlib.contextmanager
def one_reference_per_input() -> Iterator[dict[tuple[str, Any, str], Any]]:
    """While open, ``edgellm.accuracy``'s evals compute the transformers reference once per (checkpoint, settings,
    device) and get a copy of it after (``compute_reference`` is deterministic for those). Yields the memo."""
    from edgellm import accuracy

    real = accuracy.compute_reference
    made: dict[tuple[str, Any, str], Any] = {}

    def compute_reference(checkpoint: Path, settings: Any, device: str = "cpu") -> Any:
        key = (str(Path(checkpoint).resolve()), settings, device)
        if key not in made:
            made[key] = real(checkpoint, settings, device)
        return copy.deepcopy(made[key])

    accuracy.compute_reference = compute_reference
    try:
        yield made
    finally:
        accuracy.compute_reference = real


def _config_value(config: dict[str, Any], key: str) -> Any:
    if key == "rope_scaling" and "rope_scaling" not in config:  # transformers 5 writes rope_parameters
        params = config.get("rope_parameters")
        # per layer type (Gemma-3): a rope_scaling applies to the global (full attention) layers
        if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
            return params["full_attention"]
        return params
    return config.get(key)


def check_made_as_asked(ckpt: Path, cell: conformance.Cell) -> None:
    from edgellm.checkpoint import Checkpoint

    config = json.loads((ckpt / "config.json").read_text())
    for key, value in cell.feature.overrides.items():
        got = _config_value(config, key)
        if isinstance(value, dict):
            if not isinstance(got, dict) or any(got.get(k) != v for k, v in value.items()):
                raise AssertionError(f"config.json {key} = {got!r}, asked {value!r}")
        elif got != value:
            raise AssertionError(f"config.json {key} = {got!r}, asked {value!r}")
    dtypes = Counter(t.dtype for t in Checkpoint.open(ckpt).tensors.values())
    if set(dtypes) != {STORED[cell.dtype]}:
        raise AssertionError(f"tensors stored as {dict(dtypes)}, asked {cell.dtype}")
    sharded = (ckpt / "model.safetensors.index.json").is_file()
    if sharded != (cell.feature.max_shard_size is not None):
        raise AssertionError(f"sharded {sharded}, asked {cell.feature.max_shard_size is not None}")


def run_cell(cell: conformance.Cell, ckpt: Path, work: Path) -> None:
    from edgellm.compiler.export import export_checkpoint

    if cell.kind == "quantized":
        from edgellm.synth_quant import calibration_ids, quantize_rtn

        source = quantize_rtn(ckpt, work / "quantized", cell.precision, calibration_ids(ckpt, 64),
                              group_size=conformance.QUANT_GROUP_SIZE)
        manifest = export_checkpoint(source, work / "onnx")
        assert manifest["precision"] == cell.precision and manifest["quantization"]["quantized_gemms"], manifest
        report = _eval(ckpt, work, RANDOM_WEIGHTS_QUANTIZED)
    elif cell.precision == "bf16":
        bf16_on_the_torch_runtime(ckpt, export_checkpoint(ckpt, work / "onnx", "bf16"), work / "onnx")
        return
    else:
        manifest = export_checkpoint(ckpt, work / "onnx", cell.precision)
        assert manifest["precision"] == cell.precision and manifest["checkpoint"]["dtype"] == cell.dtype, manifest
        report = _eval(ckpt, work, {})
    values = {k: v.get("value") for k, v in report["checks"].items()}
    assert report["passed"], f"failed checks {report['failed_checks']}: {json.dumps(values)}"
    if cell.precision == "fp32":  # exact over every prompt's 16 tokens
        assert values["greedy_match_fraction"] == 1.0, values


def _eval(ckpt: Path, work: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    from edgellm.accuracy import EvalOptions, run_eval
    from edgellm.compiler.build import build_engine

    build_engine(work / "onnx", work / "engine", "ort", **BUILD)
    return run_eval(EvalOptions(engine_dir=work / "engine", checkpoint=ckpt, threshold_overrides=overrides,
                                num_threads=1, **EVAL))


def bf16_on_the_torch_runtime(ckpt: Path, manifest: dict[str, Any], onnx_dir: Path) -> None:
    """A bf16 export is built by torch-cuda (not ONNX Runtime's CPU provider): its decoder, reading the export's
    weights, runs here on the CPU in bf16 against transformers in fp32, by bf16's limits (logits cosine; an argmax
    that differs only at a near-tie of the reference)."""
    import torch
    import transformers

    from edgellm.backends.torch_cuda import weight_table
    from edgellm.backends.torch_cuda.decoder import GpuDecoder, load_parameters
    from edgellm.config import ModelConfig
    from edgellm.thresholds import DEFAULTS
    from edgellm.types import Precision

    assert manifest["precision"] == "bf16", manifest
    cfg = ModelConfig.load(onnx_dir)
    table, data_file = weight_table(onnx_dir / "model.onnx", cfg)
    model = GpuDecoder(cfg, load_parameters(data_file, table, torch.device("cpu")), max_batch_size=1,
                       max_seq_len=64, device=torch.device("cpu"))
    assert model.dtype == torch.bfloat16
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.tensor([BF16_IDS])
    n = ids.shape[1]
    with torch.no_grad():
        ref = hf(ids).logits[0].float()
        got = model.prefill(ids, torch.arange(n)[None], 0, torch.ones(1, n, dtype=torch.bool), 0,
                            causal_only=True)[0].float()
    limits = DEFAULTS[Precision.BF16]
    assert bool(torch.isfinite(got).all()), "non-finite logits"
    cosine = float(torch.nn.functional.cosine_similarity(got, ref, dim=-1).min())
    assert limits.logits_min_cosine is not None and cosine >= limits.logits_min_cosine, f"logits cosine {cosine}"
    margin = limits.greedy_max_divergence_margin
    assert margin is not None
    for pos in torch.nonzero(got.argmax(-1) != ref.argmax(-1)).flatten().tolist():
        lead = float(ref[pos].max() - ref[pos][int(got[pos].argmax())])
        assert lead <= margin, f"position {pos}: the reference led the engine's token by {lead:.3f} > {margin}"
