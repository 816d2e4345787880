"""The row variants TensorRT Edge-LLM 0.11.0 runs (``vocabulary.variant``), each reaching its real tool and flags, and
the structural checks of what its exporter wrote for them.

- EAGLE3 base: ``--eagle-base`` (plus ``--eagle-draft-dir DRAFT``, which only fills ``eagle_hidden_state_layers`` in
  config.json for the default model); the graph gains output ``hidden_states`` ``[tokens, 3*hidden]`` (layers
  ``[2, n//2, n-3]``). EAGLE3 draft: no flag, the exporter knows a draft from its config (``Eagle3`` architecture or
  ``draft_vocab_size``); its ``llm/`` graph reads ``hidden_states_input`` and ``hidden_states_from_draft``, writes
  ``hidden_states`` and logits over the draft vocabulary, beside ``d2t.safetensors``.
- LoRA inserted: the plain export, then ``tensorrt-edgellm-insert-lora --onnx_dir llm/`` (writes
  ``llm/lora_model.onnx``: per eligible linear, fp16 inputs ``<stem>.lora_A.weight [in, <stem>.rank]`` and
  ``<stem>.lora_B.weight [<stem>.rank, out]``) and ``tensorrt-edgellm-process-lora`` (the adapter as the runtime loads
  it: ``processed_adapter_model.safetensors``, A ``[in, r]``, B ``[r, out]`` scaled by alpha/r) into
  ``<export root>/lora/``. LoRA merged: ``tensorrt-edgellm-merge-lora --device cpu`` into a new checkpoint, exported
  as any other.
- Reduced vocabulary: ``--reduced-vocab-dir DIR`` (``vocab_map.safetensors``): logits narrow to the map, config.json
  gains ``reduced_vocab_size`` and the map is copied into ``llm/``.
- FP8 embedding: ``--fp8-embedding`` (hidden size a multiple of 128): ``embedding.safetensors`` holds float8 e4m3
  rows and per-128 block scales; the graph does not change (it takes ``inputs_embeds``).
- Components: ``--components thinker,visual`` (the LLM is ``thinker`` there); one directory per component.
- MTP is refused (:data:`MTP_REASON`), audio components too (:data:`AUDIO_REASON`).
"""

from __future__ import annotations

import json
import shutil
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefarm.toolchains.process import run_tool
from edgefarm.toolchains.tensorrt_edgellm.calibration import offline_env
from edgefarm.toolchains.tensorrt_edgellm.env import script
from edgefarm.vocabulary.variant import FEATURE_NAMES, Component, Features, LoraMode, SpecMethod, SpecRole
from edgellm.errors import ConfigurationError, TestFailure

TOOL_TIMEOUT_S = 1200  # as the export stage's
CHECK_VERSION = 1  # part of a variant export's cache key: bumped when the structural checks below change
LORA_DIR = "lora"  # under the export root: process-lora's output
LORA_ONNX = "lora_model.onnx"  # insert-lora's output, beside model.onnx
PROCESSED_LORA = "processed_adapter_model.safetensors"
VOCAB_MAP = "vocab_map.safetensors"
FP8_DTYPE = "F8_E4M3"  # the safetensors header's name of torch.float8_e4m3fn
FP16 = 10  # onnx.TensorProto.FLOAT16

MTP_REASON = ("TensorRT Edge-LLM 0.11.0 exports MTP only from checkpoints that carry MTP layers: Qwen3.5 "
              "(qwen3_5_text, qwen3_5_moe_text with mtp_num_hidden_layers 1), Qwen3-Omni-Next "
              "(qwen3_omni_next_text_moe) and Nemotron-H (nemotron_h), none verified here; on any other checkpoint "
              "its exporter stops with '--mtp was requested, but the checkpoint does not expose MTP weights/config'")
AUDIO_REASON = ("no checkpoint with an audio encoder (Qwen3-Omni, Qwen3-ASR ...) has been exported with this "
                "toolchain here, so its audio/ output has no structural check")
FEATURES: frozenset[str] = frozenset({
    "speculative.eagle3.base", "speculative.eagle3.draft", "lora.inserted", "lora.merged", "reduced_vocab",
    "fp8_embedding", "components.visual",
})
# keyed by the full feature name and by its first part (what ToolchainDriver.features_problem looks up)
FEATURE_REASONS: dict[str, str] = {
    "speculative.mtp.base": MTP_REASON, "speculative": MTP_REASON,
    "components.audio": AUDIO_REASON, "components": AUDIO_REASON,
}
_unknown = sorted(FEATURES - set(FEATURE_NAMES))
if _unknown:  # fails on import, as a registry does on a bad entry
    raise ConfigurationError(f"unknown variant features {_unknown}; valid: {', '.join(FEATURE_NAMES)}")

COMPONENT_NAMES = {Component.LLM: "thinker", Component.VISUAL: "visual", Component.AUDIO: "audio"}  # --components
COMPONENT_DIRS = {Component.LLM: "llm", Component.VISUAL: "visual", Component.AUDIO: "audio"}  # what it writes


@dataclass(frozen=True)
class VariantInputs:
    """Local directories the farm resolved from the catalog for the row's variant."""

    draft: Path | None = None  # the EAGLE3 draft checkpoint paired with a base
    lora: Path | None = None  # the PEFT adapter (adapter_config.json + adapter_model.safetensors)
    vocab: Path | None = None  # the vocabulary map (vocab_map.safetensors)


def _is_draft(features: Features) -> bool:
    s = features.speculative
    return s is not None and s.method is SpecMethod.EAGLE3 and s.role is SpecRole.DRAFT


def exporter_args(features: Features, inputs: VariantInputs) -> list[str]:
    """The flags ``tensorrt-edgellm-export`` takes for the variant, after the checkpoint and output dir. A plain
    variant adds none (the exporter's default selection: every component the checkpoint has)."""
    refused = [name for name in features.names() if name not in FEATURES]
    if refused:
        raise ConfigurationError("; ".join(f"{n}: {FEATURE_REASONS.get(n, 'not offered')}" for n in refused))
    args: list[str] = []
    if (s := features.speculative) is not None and s.role is SpecRole.BASE:
        args.append("--eagle-base")
        if inputs.draft is not None:
            args += ["--eagle-draft-dir", str(inputs.draft)]
    if (rv := features.reduced_vocab) is not None:
        if _is_draft(features):
            raise ConfigurationError("a reduced vocabulary on an EAGLE3 draft: the exporter refuses it (the draft's "
                                     "vocabulary is its d2t map); reduce the base instead")
        if inputs.vocab is None or not (Path(inputs.vocab) / VOCAB_MAP).is_file():
            raise ConfigurationError(f"reduced vocabulary {rv.vocab}: no {VOCAB_MAP} in {inputs.vocab}")
        args += ["--reduced-vocab-dir", str(inputs.vocab)]
    if features.fp8_embedding:
        if _is_draft(features):
            raise ConfigurationError("fp8_embedding on an EAGLE3 draft: a draft has no embedding table (it reads "
                                     "its base's); put it on the base")
        args.append("--fp8-embedding")
    if features.lora is not None and inputs.lora is None:
        raise ConfigurationError(f"LoRA adapter {features.lora.adapter} was not resolved to a directory")
    if features.components != Features().components:
        args += ["--components", ",".join(COMPONENT_NAMES[c] for c in features.components)]
    return args


def _run(env: Path, tool: str, args: list[str], log: Path) -> None:
    """Run a console script of ``env``; its output is appended to ``log``. TestFailure when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    part = log.with_name(f".{log.name}.{tool}")
    run = run_tool([str(script(env, tool)), *args], env=offline_env(cache_dir=part.with_suffix(".cache")), log=part,
                   timeout=TOOL_TIMEOUT_S)
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(run.argv)}  # exit {run.returncode}, {run.wall_s:.1f} s\n")
        out.write(part.read_text(encoding="utf-8", errors="replace"))
    part.unlink()
    shutil.rmtree(part.with_suffix(".cache"), ignore_errors=True)
    if run.returncode != 0:
        raise TestFailure(f"{tool} failed (exit {run.returncode}): {run.error_line()} (log: {log})")


def prepare_checkpoint(env: Path, checkpoint: Path, features: Features, inputs: VariantInputs, work: Path, *,
                       log: Path) -> Path:
    """The checkpoint to export: for a merged LoRA, ``work/merged`` (``tensorrt-edgellm-merge-lora``, fp16 on the
    CPU; ``work/merged`` must not exist), else ``checkpoint`` itself."""
    lora = features.lora
    if lora is None or lora.mode is not LoraMode.MERGED:
        return Path(checkpoint)
    if inputs.lora is None:
        raise ConfigurationError(f"LoRA adapter {lora.adapter} was not resolved to a directory")
    merged = Path(work) / "merged"
    if merged.exists():  # the tool removes an existing output dir: never hand it one
        raise ConfigurationError(f"merge output {merged} already exists")
    Path(work).mkdir(parents=True, exist_ok=True)
    _run(env, "tensorrt-edgellm-merge-lora", ["--model_dir", str(checkpoint), "--lora_dir", str(inputs.lora),
                                              "--output_dir", str(merged), "--device", "cpu",
                                              "--torch-dtype", "float16"], log)
    if not (merged / "config.json").is_file():
        raise TestFailure(f"tensorrt-edgellm-merge-lora exited 0 but wrote no checkpoint in {merged} (log: {log})")
    return merged


def after_export(env: Path, export_root: Path, features: Features, inputs: VariantInputs, *, log: Path) -> list[Path]:
    """What runs on the export for the variant, and the files it wrote: for an inserted LoRA,
    ``tensorrt-edgellm-insert-lora`` (``llm/lora_model.onnx``) and ``tensorrt-edgellm-process-lora``
    (``<export_root>/lora/``). Nothing for the others."""
    lora = features.lora
    if lora is None or lora.mode is not LoraMode.INSERTED:
        return []
    if inputs.lora is None:
        raise ConfigurationError(f"LoRA adapter {lora.adapter} was not resolved to a directory")
    llm = Path(export_root) / COMPONENT_DIRS[Component.LLM]
    _run(env, "tensorrt-edgellm-insert-lora", ["--onnx_dir", str(llm)], log)
    processed = Path(export_root) / LORA_DIR
    _run(env, "tensorrt-edgellm-process-lora", ["--input_dir", str(inputs.lora), "--output_dir", str(processed)], log)
    wrote = [llm / LORA_ONNX, processed / PROCESSED_LORA, processed / "config.json"]
    missing = [str(p) for p in wrote if not p.is_file()]
    if missing:
        raise TestFailure(f"LoRA tools exited 0 but did not write {', '.join(missing)} (log: {log})")
    return wrote


# --- structural checks


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (dtype and shape per tensor), without reading the tensors."""
    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header: dict[str, Any] = json.loads(fh.read(size))
    header.pop("__metadata__", None)
    return header


def _dims(value: Any) -> list[int | str]:
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def _graph(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return ({v.name: v for v in model.graph.input}, {v.name: v for v in model.graph.output})


def _last_dim(value: Any) -> int | str | None:
    dims = _dims(value)
    return dims[-1] if dims else None


def check_variant_export(export_root: Path, features: Features, *, lm_head_width: int | None = None) -> list[str]:
    """What is wrong with the exporter's output ``export_root`` (``llm/``, ``visual/``...) for ``features``; empty
    when it has the structure the variant needs. ``lm_head_width``: the checkpoint's LM-head rows (its vocabulary,
    a draft's draft vocabulary) when the caller knows them; else read from ``llm/config.json``."""
    root = Path(export_root)
    llm = root / COMPONENT_DIRS[Component.LLM]
    missing = [str(llm / n) for n in ("model.onnx", "config.json") if not (llm / n).is_file()]
    if missing:
        return [f"expected the LLM's graph and runtime config; missing {', '.join(missing)}"]
    config = json.loads((llm / "config.json").read_text(encoding="utf-8"))
    inputs, outputs = _graph(llm / "model.onnx")
    hidden = int(config["hidden_size"])
    problems = _speculative(features, config, inputs, outputs, hidden, llm)
    problems += _logits(features, config, outputs, lm_head_width, llm)
    problems += _embedding(features, llm, hidden)
    problems += _lora(features, root, config)
    problems += _components(features, root, hidden)
    return problems


def _speculative(features: Features, config: dict[str, Any], inputs: dict[str, Any], outputs: dict[str, Any],
                 hidden: int, llm: Path) -> list[str]:
    s = features.speculative
    spec, role = config.get("spec_decode_type"), config.get("engine_role")
    if s is None:
        out = []
        if (spec, role) != ("none", "llm"):
            out.append(f"expected a plain LLM (config.json spec_decode_type none, engine_role llm); found "
                       f"spec_decode_type {spec!r}, engine_role {role!r}")
        if "hidden_states" in outputs:
            out.append("expected no hidden_states output in a plain LLM graph; found one")
        return out
    out = []
    if (spec, role) != (s.method.value, s.role.value):
        out.append(f"expected config.json spec_decode_type {s.method.value!r}, engine_role {s.role.value!r}; found "
                   f"{spec!r}, {role!r}")
    if "hidden_states" not in outputs:
        out.append(f"expected an output hidden_states for the {s.method.value} {s.role.value}; outputs are "
                   f"{', '.join(outputs)}")
    if s.role is SpecRole.BASE:
        if "hidden_states" in outputs and _last_dim(outputs["hidden_states"]) != 3 * hidden:
            out.append(f"expected hidden_states last dim 3*hidden = {3 * hidden} (three base layers); found "
                       f"{_dims(outputs['hidden_states'])}")
        layers = config.get("eagle_hidden_state_layers")
        if not (isinstance(layers, list) and len(layers) == 3):
            out.append(f"expected config.json eagle_hidden_state_layers: three layer ids; found {layers!r}")
        return out
    for name, width in (("hidden_states_input", config.get("base_model_hidden_size")), ("hidden_states_from_draft",
                                                                                         hidden)):
        if name not in inputs:
            out.append(f"expected a draft input {name}; inputs are {', '.join(inputs)}")
        elif width is not None and _last_dim(inputs[name]) != width:
            out.append(f"expected {name} last dim {width}; found {_dims(inputs[name])}")
    d2t = llm / "d2t.safetensors"
    if not d2t.is_file():
        out.append(f"expected the draft-to-target map {d2t}; not written")
    else:
        shape = safetensors_header(d2t).get("d2t", {}).get("shape")
        if shape != [config.get("draft_vocab_size")]:
            out.append(f"expected d2t of shape [draft_vocab_size = {config.get('draft_vocab_size')}]; found {shape}")
    return out


def _logits(features: Features, config: dict[str, Any], outputs: dict[str, Any], lm_head_width: int | None,
            llm: Path) -> list[str]:
    if "logits" not in outputs:
        return [f"expected an output logits; outputs are {', '.join(outputs)}"]
    width = _last_dim(outputs["logits"])
    out = []
    if (rv := features.reduced_vocab) is not None:
        if width != rv.size:
            out.append(f"expected logits over the reduced vocabulary ({rv.size}); found last dim {width}")
        if config.get("reduced_vocab_size") != rv.size:
            out.append(f"expected config.json reduced_vocab_size {rv.size}; found "
                       f"{config.get('reduced_vocab_size')!r}")
        vmap = llm / VOCAB_MAP
        if not vmap.is_file():
            out.append(f"expected the vocabulary map copied to {vmap}; not there")
        else:
            entry = safetensors_header(vmap).get("vocab_map", {})
            if entry.get("shape") != [rv.size] or entry.get("dtype") != "I32":
                out.append(f"expected {vmap.name} vocab_map int32 [{rv.size}]; found {entry.get('dtype')} "
                           f"{entry.get('shape')}")
        return out
    if "reduced_vocab_size" in config:
        out.append(f"expected the full vocabulary; config.json has reduced_vocab_size {config['reduced_vocab_size']}")
    expected = lm_head_width
    if expected is None:
        expected = config.get("draft_vocab_size") if _is_draft(features) else config.get("vocab_size")
    if expected is None:
        out.append(f"expected config.json {'draft_vocab_size' if _is_draft(features) else 'vocab_size'} (the LM "
                   f"head's rows); not there (logits last dim {width})")
    elif width != expected:
        out.append(f"expected logits last dim {expected} (the LM head's rows); found {width}")
    return out


def _embedding(features: Features, llm: Path, hidden: int) -> list[str]:
    path = llm / "embedding.safetensors"
    if _is_draft(features):  # a draft reads its base's embedding
        return [f"expected no embedding table for an EAGLE3 draft; found {path}"] if path.is_file() else []
    if not path.is_file():
        return [f"expected the embedding table {path}; not written"]
    header = safetensors_header(path)
    dtype = header.get("embedding", {}).get("dtype")
    if not features.fp8_embedding:
        return [f"expected an fp16 embedding table (no fp8_embedding); found {dtype}"] if dtype != "F16" else []
    out = []
    if dtype != FP8_DTYPE:
        out.append(f"expected embedding dtype {FP8_DTYPE} (fp8_embedding); found {dtype}")
    scale = header.get("embedding_scale")
    rows = header.get("embedding", {}).get("shape", [None])[0]
    if scale is None or scale.get("dtype") != "F32" or scale.get("shape") != [rows, hidden // 128]:
        out.append(f"expected embedding_scale F32 [{rows}, {hidden // 128}] (one per 128 columns); found "
                   f"{scale and (scale.get('dtype'), scale.get('shape'))}")
    return out


def lora_slots(lora_onnx: Path) -> dict[str, tuple[int, int]]:
    """The LoRA inputs insert-lora added: stem -> (in, out) from ``<stem>.lora_A.weight [in, rank]`` and
    ``<stem>.lora_B.weight [rank, out]``; a pair that is not of that form is left out (see :func:`_lora`)."""
    inputs, _ = _graph(lora_onnx)
    slots = {}
    for name, value in inputs.items():
        if not name.endswith(".lora_A.weight"):
            continue
        stem = name.removesuffix(".lora_A.weight")
        b = inputs.get(f"{stem}.lora_B.weight")
        a_dims = _dims(value)
        if b is None or len(a_dims) != 2:
            continue
        b_dims = _dims(b)
        if len(b_dims) == 2 and a_dims[1] == b_dims[0] == f"{stem}.rank" and isinstance(a_dims[0], int) \
                and isinstance(b_dims[1], int):
            slots[stem] = (a_dims[0], b_dims[1])
    return slots


def _expected_linears(config: dict[str, Any]) -> Counter[tuple[int, int]]:
    """(in, out) of every linear of the decoder an fp16 export gives a LoRA slot: fused q/k/v, o, gate, up, down."""
    hidden, inter, n = int(config["hidden_size"]), int(config["intermediate_size"]), int(config["num_hidden_layers"])
    heads, kv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    hd = int(config.get("head_dim") or hidden // heads)
    per_layer = [(hidden, (heads + 2 * kv) * hd), (heads * hd, hidden), (hidden, inter), (hidden, inter),
                 (inter, hidden)]
    return Counter({shape: count * n for shape, count in Counter(per_layer).items()})


def _lora(features: Features, root: Path, config: dict[str, Any]) -> list[str]:
    lora_onnx = root / COMPONENT_DIRS[Component.LLM] / LORA_ONNX
    lora = features.lora
    if lora is None or lora.mode is LoraMode.MERGED:
        return [f"expected no LoRA graph (LoRA {'merged' if lora else 'not asked'}); found {lora_onnx}"] \
            if lora_onnx.is_file() else []
    if not lora_onnx.is_file():
        return [f"expected insert-lora's graph {lora_onnx}; not there"]
    out = []
    inputs, _ = _graph(lora_onnx)
    names = [n for n in inputs if ".lora_A." in n or ".lora_B." in n]
    slots = lora_slots(lora_onnx)
    if len(names) != 2 * len(slots):
        out.append(f"expected LoRA inputs in pairs <stem>.lora_A.weight [in, <stem>.rank] / <stem>.lora_B.weight "
                   f"[<stem>.rank, out]; {len(names) - 2 * len(slots)} of {len(names)} are not")
    bad_dtype = [n for n in names if inputs[n].type.tensor_type.elem_type != FP16]
    if bad_dtype:
        out.append(f"expected fp16 LoRA inputs; not fp16: {', '.join(bad_dtype[:4])}")
    found = Counter(slots.values())
    short = {s: c for s, c in _expected_linears(config).items() if found[s] < c}
    if short:
        out.append("expected a LoRA slot on every decoder linear; short of (in, out): " + ", ".join(
            f"{s} {found[s]}/{c}" for s, c in sorted(short.items())))
    processed = root / LORA_DIR / PROCESSED_LORA
    if not processed.is_file():
        return [*out, f"expected process-lora's adapter {processed}; not there"]
    header = safetensors_header(processed)
    ranks = {v["shape"][1] for k, v in header.items() if k.endswith(".lora_A.weight")} | {
        v["shape"][0] for k, v in header.items() if k.endswith(".lora_B.weight")}
    if ranks != {lora.rank}:
        out.append(f"expected the processed adapter at rank {lora.rank}; found ranks {sorted(ranks)}")
    dtypes = {v["dtype"] for v in header.values()}
    if dtypes != {"F16"}:
        out.append(f"expected an fp16 processed adapter; found {sorted(dtypes)}")
    return out


def lora_binding_problems(export_root: Path) -> list[str]:
    """Processed-adapter modules with no LoRA input of their name in ``lora_model.onnx`` (the runtime binds
    adapter tensors to graph inputs by name, and drops what does not match)."""
    root = Path(export_root)
    slots = lora_slots(root / COMPONENT_DIRS[Component.LLM] / LORA_ONNX)
    stems = sorted({k.rsplit(".lora_", 1)[0] for k in safetensors_header(root / LORA_DIR / PROCESSED_LORA)})
    unbound = [s for s in stems if s not in slots]
    if not unbound:
        return []
    return [f"expected a graph input <module>.lora_A.weight for each of the {len(stems)} adapter modules; "
            f"{len(unbound)} have none (e.g. {unbound[0]}); the graph's LoRA stems are e.g. "
            f"{', '.join(sorted(slots)[:3]) or 'none'}"]


def _components(features: Features, root: Path, hidden: int) -> list[str]:
    out = []
    for c in features.components:
        d = root / COMPONENT_DIRS[c]
        missing = [n for n in ("model.onnx", "config.json") if not (d / n).is_file()]
        if missing:
            out.append(f"expected component {c.value} in {d} (model.onnx, config.json); missing {', '.join(missing)}")
    if features.components != Features().components:  # an explicit selection: nothing else written
        extra = [COMPONENT_DIRS[c] for c in Component if c not in features.components and (root / COMPONENT_DIRS[c])
                 .exists()]
        if extra:
            out.append(f"expected only components {', '.join(c.value for c in features.components)}; also found "
                       f"{', '.join(extra)}/")
    visual = root / COMPONENT_DIRS[Component.VISUAL] / "model.onnx"
    if Component.VISUAL in features.components and visual.is_file():
        _, outputs = _graph(visual)
        if "output" not in outputs:
            out.append(f"expected the visual graph's output 'output'; outputs are {', '.join(outputs)}")
        elif _last_dim(outputs["output"]) != hidden:
            out.append(f"expected the visual output's last dim = the LLM's hidden size {hidden}; found "
                       f"{_dims(outputs['output'])}")
    return out


def check_merged_lora(base: Path, merged: Path, adapter: Path, *, rtol: float = 1e-2) -> list[str]:
    """Whether ``merged`` is ``base`` plus the adapter's delta ``B @ A * lora_alpha / r`` on every adapter module
    (fp16 rounding allowed: ``rtol`` of the delta's largest value)."""
    import torch
    from safetensors import safe_open

    def tensors(directory: Path) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for path in sorted(Path(directory).glob("*.safetensors")):
            with safe_open(str(path), "pt") as fh:
                found.update({k: fh.get_tensor(k).float() for k in fh.keys()})  # noqa: SIM118 (not a dict)
        return found

    settings = json.loads((Path(adapter) / "adapter_config.json").read_text(encoding="utf-8"))
    scale = float(settings["lora_alpha"]) / float(settings["r"])
    lora, w0, w1 = tensors(adapter), tensors(base), tensors(merged)
    out = []
    stems = sorted({k.removesuffix(".lora_A.weight") for k in lora if k.endswith(".lora_A.weight")})
    if not stems:
        return [f"expected lora_A/lora_B tensors in {adapter}; found none"]
    for stem in stems:
        key = stem.removeprefix("base_model.model.") + ".weight"
        if key not in w0 or key not in w1:
            out.append(f"expected {key} in the base and the merged checkpoint; missing")
            continue
        delta = lora[f"{stem}.lora_B.weight"] @ lora[f"{stem}.lora_A.weight"] * scale
        err = float((w1[key] - w0[key] - delta).abs().max())
        if not torch.isfinite(delta).all() or err > rtol * float(delta.abs().max()):
            out.append(f"expected {key} = base + B@A*{scale:g}; off by up to {err:.3g} (delta up to "
                       f"{float(delta.abs().max()):.3g})")
    return out
