"""Bring-up checks of a checkpoint against an installed tensorrt-edgellm: its model registry (would it load the
model_type into a class of its own, into its default model, or refuse it), the reconciliation of the checkpoint's
tensors with the parameters of the model it would build, and a few-layer export checked structurally.

The first two run ``model_probe.py`` with the environment's own Python (the farm's process never imports the
toolchain); the checkpoint's tensors reach it as names, dtypes and shapes read here from the safetensors headers, so
no weight is read or allocated on either side. The config is validated here first: the toolchain's own reader fills
missing keys with defaults (a config.json without ``hidden_size`` would be read as hidden size 4096).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from edgefarm.toolchains.base import LayerExport, RegistryCheck, RegistryStatus, ShapeMismatch, WeightReconciliation
from edgefarm.toolchains.process import run_captured
from edgefarm.toolchains.tensorrt_edgellm import TOOLCHAIN
from edgefarm.toolchains.tensorrt_edgellm.export import DEFAULT_CHAT_TEMPLATE, export
from edgefarm.toolchains.tensorrt_edgellm.layouts import declared_family
from edgefarm.toolchains.tensorrt_edgellm.onnx_check import check_onnx
from edgellm.checkpoint.header import TensorInfo, scan_header
from edgellm.checkpoint.index import INDEX_FILE, SINGLE_FILE, check_index, merge_shards, read_index
from edgellm.config import ModelConfig, read_json_object
from edgellm.errors import BugError, CheckpointError, ConfigurationError, UnsupportedError

PROBE = Path(__file__).resolve().with_name("model_probe.py")
PROBE_TIMEOUT_S = 300
# the exporter's few-layer option (0.11.0: scripts/export.py, "export only the first N decoder layers")
FEW_LAYER_FLAG = "--num-decoder-layer"
NESTED_CONFIGS = ("text_config", "llm_config")  # where multimodal checkpoints keep their decoder's config


def read_config(checkpoint: Path) -> ModelConfig:
    """The decoder config of ``checkpoint`` (a nested ``text_config``/``llm_config`` where there is one), checked by
    edgellm's config reader: a ConfigurationError naming the file and the bad key otherwise."""
    path = Path(checkpoint) / "config.json"
    data = read_json_object(path, what="config.json")
    nested = next((k for k in NESTED_CONFIGS if isinstance(data.get(k), dict)), None)
    if nested is None:
        return ModelConfig.from_dict(data, source=str(path))
    inner = dict(data[nested])
    inner.setdefault("model_type", data.get("model_type"))
    return ModelConfig.from_dict(inner, source=f"{path}: {nested}")


def checkpoint_tensors(checkpoint: Path) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint from its safetensors headers (and index), whatever its family; a
    CheckpointError naming the first problem (and counting the rest) when the files are not consistent."""
    root = Path(checkpoint)
    problems: list[CheckpointError] = []
    index = None
    if (root / INDEX_FILE).is_file():
        index = read_index(root)
        problems += index.problems
        shards = [s for s in index.shards if (root / s).is_file()]
    elif (root / SINGLE_FILE).is_file():
        shards = [SINGLE_FILE]
    else:
        raise CheckpointError(f"no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints are read)",
                              file=str(root))
    headers = {}
    for shard in shards:
        scan = scan_header(root / shard, name=shard)
        headers[shard] = scan.header
        problems += scan.problems
    if index is not None:
        problems += check_index(root, index, headers)
    tensors, duplicated = merge_shards(headers)
    problems += duplicated
    if problems:
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise CheckpointError(f"{problems[0]}{more}", file=str(root))
    return tensors


def _probe(env: Path, checkpoint: Path, mode: str, tensors: dict[str, TensorInfo]) -> dict[str, Any]:
    python = Path(env) / "bin" / "python"
    request = {"checkpoint": str(Path(checkpoint).resolve()), "mode": mode,
               "tensors": {n: {"dtype": t.dtype, "shape": list(t.shape), "file": t.file.name}
                           for n, t in sorted(tensors.items())}}
    # -I: neither the probe's own directory (a module of ours there would shadow the toolchain's imports) nor
    # PYTHONPATH (the farm's packages) reaches its sys.path; our credentials do not reach it either (the runner's)
    done = run_captured([str(python), "-I", str(PROBE)], env={"HF_HUB_OFFLINE": "1"}, timeout=PROBE_TIMEOUT_S,
                        stdin=json.dumps(request), what=f"{TOOLCHAIN} model probe on {checkpoint}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}, no output"])[-1]
        raise BugError(f"{TOOLCHAIN} model probe failed in {env.name} on {checkpoint}: {last[:400]}")
    facts = json.loads(lines[-1])
    if not isinstance(facts, dict) or "stage" not in facts:
        raise BugError(f"{TOOLCHAIN} model probe printed no report on {checkpoint}: {lines[-1][:200]}")
    return facts


def _registry(facts: dict[str, Any], config: ModelConfig) -> RegistryCheck:
    model_type = facts.get("model_type") or config.model_type
    common = dict(toolchain=TOOLCHAIN, toolchain_version=facts["version"], model_type=model_type,
                  architectures=config.architectures, default_class=facts["default_class"])
    if facts["stage"] == "config":
        return RegistryCheck(**common, status=RegistryStatus.UNSUPPORTED, model_class=None,
                             reason=f"its config reader refuses config.json: {facts['error']}")
    if facts["stage"] != "ok":
        return RegistryCheck(**common, status=RegistryStatus.UNSUPPORTED, model_class=None,
                             reason=f"its model factory refuses it: {facts['error']}")
    if facts["registered"] or facts["model_class"] != facts["default_class"]:
        return RegistryCheck(**common, status=RegistryStatus.REGISTERED, model_class=facts["model_class"],
                             reason=f"registered: {facts['model_class']}")
    family, why = declared_family(config, facts["default_class"])
    return RegistryCheck(**common, status=RegistryStatus.DEFAULT_FALLBACK, model_class=facts["model_class"],
                         layout_family=family, reason=why)


def _same_shape(expected: list[int], found: list[int]) -> bool:
    """A scalar and a one-element tensor are the same to the toolchain (its loader assigns either; a per-tensor
    scale is written [] by ModelOpt and declared [1] by its linears); otherwise the shapes must be equal."""
    return list(expected) == list(found) or (math.prod(expected) == 1 == math.prod(found))


def registry_check(env: Path, checkpoint: Path) -> RegistryCheck:
    """Whether the toolchain in ``env`` registers the checkpoint's model_type, would fall back to its default model
    (accepted only for a family declared layout-identical: ``layouts``), or refuses it (unsupported)."""
    config = read_config(checkpoint)
    return _registry(_probe(env, checkpoint, "registry", {}), config)


def reconcile(env: Path, checkpoint: Path) -> WeightReconciliation:
    """The checkpoint's tensors against the parameters of the model the toolchain in ``env`` builds for it (on the
    meta device, after its own key handling), both ways. UnsupportedError when it builds no model for it."""
    config = read_config(checkpoint)
    tensors = checkpoint_tensors(checkpoint)
    facts = _probe(env, checkpoint, "reconcile", tensors)
    check = _registry(facts, config)
    found = facts.get("reconcile")
    if found is None:
        raise UnsupportedError(check.problem or f"{TOOLCHAIN} built no model for {checkpoint}")
    model = str(facts["model_class"]).rsplit(".", 1)[-1]
    parameters = {n: tuple(s) for n, s in found["parameters"].items()}
    tied = dict(found["tied"])
    problems: list[str] = []
    mismatches: list[ShapeMismatch] = []
    matched: set[str] = set()
    for a in found["assigned"]:
        expected = a["expected"]
        if expected is not None and not _same_shape(expected, a["found"]):
            mismatches.append(ShapeMismatch(a["tensor"], a["target"], tuple(expected), tuple(a["found"])))
            where = "" if a["target"] == a["tensor"] else f" (loaded into {a['target']!r})"
            problems.append(str(CheckpointError(
                f"wrong shape {list(a['found'])}{where}; {model} of {TOOLCHAIN} {facts['version']} expects "
                f"{list(expected)}", tensor=a["tensor"])))
        else:
            matched.add(a["target"])
    missing = {n: parameters[n] for n in found["never_loaded"]}
    for name, shape in missing.items():
        problems.append(str(CheckpointError(
            f"missing: {model} of {TOOLCHAIN} {facts['version']} needs it with shape {list(shape)} and no checkpoint "
            f"tensor loads into it (its loader would leave it unset)", tensor=name)))
    unexpected = tuple(sorted(found["unused"]))
    for name in unexpected:
        mapped = found["unused"][name]
        as_ = "" if mapped == name else f" (mapped to {mapped!r})"
        problems.append(str(CheckpointError(
            f"unexpected: no parameter of {model} of {TOOLCHAIN} {facts['version']} takes it{as_}; its loader "
            f"would skip it without a word", tensor=name)))
    filled_empty = {a["target"] for a in found["assigned"] if a["target"] not in parameters}
    return WeightReconciliation(
        toolchain=TOOLCHAIN, toolchain_version=facts["version"], model=str(facts["model_class"]),
        expected=len(set(parameters) - set(tied)) + len(filled_empty), matched=len(matched),
        missing=missing, unexpected=unexpected, shape_mismatches=tuple(mismatches), tied=tied,
        ignored={n: "skipped by the toolchain's key remap" for n in found["dropped"]},
        defaulted=tuple(found["optional"]), problems=tuple(problems))


def few_layer_flag_problem(env: Path) -> str | None:
    """Why the exporter in ``env`` has no few-layer option (read from its installed source, no import), or None."""
    scripts = sorted(Path(env).glob("lib/python3*/site-packages/tensorrt_edgellm/scripts/export.py"))
    if not scripts:
        return f"{env.name} has no tensorrt_edgellm/scripts/export.py (not a {TOOLCHAIN} environment)"
    if f'"{FEW_LAYER_FLAG}"' not in scripts[0].read_text(encoding="utf-8", errors="replace"):
        return f"the exporter of {env.name} has no {FEW_LAYER_FLAG} option (a few-layer export needs 0.11.0 or later)"
    return None


def export_layers(env: Path, checkpoint: Path, out_dir: Path, layers: int, *,
                  chat_template: Path | None = DEFAULT_CHAT_TEMPLATE) -> LayerExport:
    """Export the first ``layers`` decoder layers of an unquantized ``checkpoint`` with the exporter's
    ``--num-decoder-layer`` into ``out_dir`` and check the ONNX structurally (``onnx_check``): one attention plugin
    per kept layer, KV-cache inputs and outputs for exactly those layers, the runtime config saying ``layers``."""
    config = read_config(checkpoint)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= config.num_hidden_layers:
        raise ConfigurationError(f"few-layer export of {checkpoint}: layers {layers!r} is not an integer in "
                                 f"1..{config.num_hidden_layers} (its num_hidden_layers)")
    problem = few_layer_flag_problem(env)
    if problem is not None:
        raise UnsupportedError(problem)
    done = export(env, checkpoint, out_dir, chat_template=chat_template,
                  extra_args=(FEW_LAYER_FLAG, str(layers)))
    report = check_onnx(done.onnx_dir, expected_quantized=0)
    problems = list(report.problems)
    if report.layers != layers:  # check_onnx counted against the export's own config: count against the ask too
        problems.append(f"the export's config.json says {report.layers} decoder layers, {layers} were asked for")
        if report.attention_plugins != layers:
            problems.append(f"{report.attention_plugins} attention plugin(s) for {layers} exported layer(s)")
    kv = sorted(n for n in report.inputs if n.startswith("past_key_values_"))
    if len(kv) != layers:
        problems.append(f"{len(kv)} past KV-cache input(s) for {layers} exported layer(s): {', '.join(kv)}")
    return LayerExport(toolchain=TOOLCHAIN, toolchain_version=done.toolchain_version, layers=layers,
                       out_dir=done.onnx_dir, evidence={"export": done.to_dict(), "onnx": report.to_dict()},
                       problems=tuple(problems))
