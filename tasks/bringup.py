"""The host rungs of a bring-up's add-model ladder (``flows.bringup`` climbs them in ``RUNGS`` order), one function
each: it runs the rung's check, writes its evidence file into the report directory and returns a :class:`Rung`.

A rung's status is the results' vocabulary: ``pass``; ``fail`` (the checkpoint is not ready for the next rung: the
reason names what, e.g. the tensor a reconciliation misses); ``not_applicable`` (the rung cannot apply, with why:
a reference of a pre-quantized checkpoint); ``skipped`` (an earlier rung failed). Bad input raises
``ConfigurationError`` before any rung runs; an infrastructure error (a toolchain that cannot be installed) is the
rung's ``error``. What each toolchain answers is its driver's (``toolchains.base``: ``registry_check``,
``reconcile``, ``export_layers``); one that does not offer a check is listed as such, and a rung needs at least one
toolchain that answered. Rungs 3 and 4 also ask the toolchains of no requested platform that are usable on this host
(``advisers``): their answers are kept and shown as advice (what that toolchain would do with the model_type, e.g. a
fall back to its default model) and decide nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgefarm.results.models import ResultStatus
from edgefarm.toolchains.base import NotOffered, ToolchainDriver
from edgellm.errors import ConfigurationError, EdgeLLMError, ErrorKind, UnsupportedError
from edgellm.files import write_text_atomic

RUNGS = ("inventory", "closest_family", "registry", "reconciliation", "reference", "few_layers", "pipeline")
TITLES = {
    "inventory": "Family-free inventory",
    "closest_family": "Closest family",
    "registry": "Toolchain registries",
    "reconciliation": "Weight reconciliation",
    "reference": "Provider reference",
    "few_layers": "Few-layer numeric test",
    "pipeline": "Export, build, infer, accuracy, bench",
}
PASSING_CLASSIFICATIONS = ("configuration-only variant", "alias")  # edgellm.checkpoint.closest: no new structure
# the files rungs 1-6 write in the report directory, and the few-layer test's work directory there
RUNG_FILES = ("inventory.json", "closest.json", "registry.json", "reconciliation.json", "reference.npz",
              "layers_check.json")
LAYERS_DIR = "layers"
TENSOR_DIFFERENCES = ("missing tensor ", "unexpected tensor ", "wrong-shape tensor ")  # its tensor-only deciding items


@dataclass
class Rung:
    name: str
    status: ResultStatus
    reason: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def stops(self) -> bool:
        """Whether the ladder stops here (a failure or an error; not applicable goes on)."""
        return self.status in (ResultStatus.FAIL, ResultStatus.ERROR)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "title": TITLES[self.name], "status": self.status.value, "reason": self.reason,
                "evidence": self.evidence, "duration_s": round(self.duration_s, 3)}


def timed(name: str, body: Callable[[], Rung]) -> Rung:
    """Run one rung; an infrastructure error (or any other of the library's errors but bad input) is its ``error``
    with the reason, never a traceback."""
    t0 = time.perf_counter()
    try:
        rung = body()
    except ConfigurationError:
        raise
    except EdgeLLMError as exc:
        status = ResultStatus.FAIL if exc.kind in (ErrorKind.TEST_FAILURE,) else ResultStatus.ERROR
        rung = Rung(name, status, f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
    rung.duration_s = time.perf_counter() - t0
    return rung


def _write(out_dir: Path, name: str, data: dict[str, Any]) -> str:
    """A fresh file replacing ``name`` (a link planted there is refused, never written through)."""
    write_text_atomic(out_dir / name, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    return name


# rung 1 --------------------------------------------------------------------------------------------------------------
def inventory(checkpoint: Path, out_dir: Path) -> Rung:
    """Any model_type is inventoried; a checkpoint problem (headers, shards, scales, config) fails the rung. What the
    checkpoint lacks against a family is reconciliation's (rung 4), not a problem here."""
    from edgellm.checkpoint import inspect_checkpoint

    try:
        inv = inspect_checkpoint(checkpoint)
    except EdgeLLMError as exc:
        return Rung("inventory", ResultStatus.FAIL, f"no inventory: {exc}")
    file = _write(out_dir, "inventory.json", inv)
    against_family = _family_problems(checkpoint)
    problems = [p for p in inv["problems"] if p not in against_family]
    evidence = {"file": file, "model_type": (inv.get("config_json") or {}).get("model_type"),
                "family": inv.get("family"), "findings": inv.get("findings", []), "tensors": inv.get("tensor_count"),
                "shards": len(inv.get("shards") or []), "dtypes": sorted(inv.get("dtypes") or {}),
                "parameters": inv.get("parameters"), "quantization": inv.get("quantization"), "problems": problems}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Rung("inventory", ResultStatus.FAIL, f"{problems[0]}{more}", evidence)
    findings = "; ".join(f["message"] for f in inv.get("findings", []))
    return Rung("inventory", ResultStatus.PASS, findings or None, evidence)


def _family_problems(checkpoint: Path) -> set[str]:
    """The inventory's problems that are its registered family's reconciliation (rung 4 reports them)."""
    from edgellm.checkpoint.checkpoint import Checkpoint

    try:
        ckpt = Checkpoint.open(checkpoint)
    except EdgeLLMError:  # no registered family (a finding), or a config it refuses (a problem of the inventory)
        return set()
    return {str(p) for p in ckpt.reconciliation.problems}


# rung 2 --------------------------------------------------------------------------------------------------------------
def closest_family(checkpoint: Path, out_dir: Path) -> Rung:
    """The closest registered family and the change's class; a new structure stops the ladder (a family is
    needed), naming the fields and tensor roles that decide it."""
    from edgellm.checkpoint.closest import closest_family as closest

    found = closest(checkpoint)
    file = _write(out_dir, "closest.json", found)
    deciding = [d if isinstance(d, str) else json.dumps(d, sort_keys=True, default=str)
                for d in found.get("deciding", [])]
    evidence = {"file": file, "family": found["family"], "classification": found["classification"],
                "deciding": deciding, "model_type": found["model_type"], "registered": found["registered"]}
    said = f"{found['classification']} of {found['family']}"
    if deciding:
        said += f" (deciding: {', '.join(deciding[:6])}{' ...' if len(deciding) > 6 else ''})"
    if found["classification"] in PASSING_CLASSIFICATIONS:
        return Rung("closest_family", ResultStatus.PASS, said, evidence)
    if deciding and all(d.startswith(TENSOR_DIFFERENCES) for d in deciding):
        # the config is the family's; which tensors differ is the reconciliation's to judge, toolchain by toolchain
        return Rung("closest_family", ResultStatus.PASS,
                    f"{found['family']} by its config; its tensors differ (rung 4 reconciles them): "
                    f"{', '.join(deciding[:6])}", evidence)
    return Rung("closest_family", ResultStatus.FAIL, f"{said}: a new family is needed", evidence)


# rungs 3 and 4 -------------------------------------------------------------------------------------------------------
def _answer(driver: ToolchainDriver, ask: Callable[[ToolchainDriver], Any]) -> tuple[dict[str, Any], str | None]:
    """A toolchain's answer (JSON) and, where it is not ok, why in one line."""
    try:
        found = ask(driver)
    except NotOffered as exc:
        return {"offered": False, "reason": str(exc)}, None
    except UnsupportedError as exc:
        return {"offered": True, "ok": False, "problems": [str(exc)]}, str(exc)
    if found.ok:
        return {"offered": True, **found.to_json()}, None
    problems = getattr(found, "problems", None) or []
    why = getattr(found, "problem", None) or "; ".join(problems[:3])
    return {"offered": True, **found.to_json()}, why


def _advice(advisers: Sequence[ToolchainDriver], ask: Callable[[ToolchainDriver], Any]
            ) -> tuple[dict[str, Any], list[str]]:
    """The advisers' answers (an infrastructure or configuration error of one is its answer: advice decides
    nothing) and one short line each for the rung's reason."""
    answers: dict[str, Any] = {}
    said: list[str] = []
    for driver in advisers:
        usable = driver.environment.available()
        if not usable.ok:  # never installed for advice
            answers[driver.name] = {"offered": False, "advice": True, "reason": f"not usable here: {usable.reason}"}
            continue
        try:
            answer, why = _answer(driver, ask)
        except EdgeLLMError as exc:
            answer, why = {"offered": True, "ok": False, "problems": [str(exc)]}, str(exc)
        answers[driver.name] = {**answer, "advice": True}
        if answer["offered"]:
            version = answer.get("toolchain_version")
            who = f"{driver.name} {version}" if version else driver.name
            if why is None:
                said.append(f"{who}: {answer.get('status') or 'ok'}")
                continue
            first = why.split("; ")[0]
            line = f"{first[:300]}{' ...' if len(first) > 300 or first != why else ''}"
            said.append(line if line.startswith(driver.name) else f"{who}: {line}")
    return answers, said


def _per_toolchain(name: str, drivers: Sequence[ToolchainDriver], ask: Callable[[ToolchainDriver], Any],
                   out_dir: Path, advisers: Sequence[ToolchainDriver] = ()) -> Rung:
    answers: dict[str, Any] = {}
    failed: list[str] = []
    for driver in drivers:
        answers[driver.name], why = _answer(driver, ask)
        if why is not None:
            failed.append(f"{driver.name}: {why}")
    advice, advised = _advice(advisers, ask)
    file = _write(out_dir, f"{name}.json", {**answers, **advice})
    evidence = {"file": file, "toolchains": answers, **({"advice": advice} if advice else {})}
    besides = (f"; advice, deciding nothing (no requested platform runs them): {'; '.join(advised)}"
               if advised else "")
    if failed:
        return Rung(name, ResultStatus.FAIL, "; ".join(failed) + besides, evidence)
    answered = sorted(n for n, a in answers.items() if a["offered"])
    if not answered:
        return Rung(name, ResultStatus.FAIL, f"none of {', '.join(d.name for d in drivers)} offers this check",
                    evidence)
    return Rung(name, ResultStatus.PASS, f"checked by {', '.join(answered)}{besides}", evidence)


def registry(checkpoint: Path, drivers: Sequence[ToolchainDriver], out_dir: Path,
             advisers: Sequence[ToolchainDriver] = ()) -> Rung:
    """Each toolchain's own model registry, asked in its own environment: registered, or a fallback to its default
    model that one of our families declares layout-identical. ``advisers`` are asked too, deciding nothing."""
    return _per_toolchain("registry", drivers, lambda d: d.host().registry_check(checkpoint), out_dir, advisers)


def reconciliation(checkpoint: Path, drivers: Sequence[ToolchainDriver], out_dir: Path,
                   advisers: Sequence[ToolchainDriver] = ()) -> Rung:
    """The checkpoint's tensors against each toolchain's model for it (meta device, headers only), both ways.
    ``advisers`` are asked too, deciding nothing."""
    return _per_toolchain("reconciliation", drivers, lambda d: d.host().reconcile(checkpoint), out_dir, advisers)


# rung 5 --------------------------------------------------------------------------------------------------------------
def reference(checkpoint: Path, layers: int, out_dir: Path, quantized: str | None) -> Rung:
    """transformers on the checkpoint (fp32, greedy, the shipped prompts), with the hidden states after the first
    ``layers`` decoder layers and the checkpoint's digest and revision; stored as ``reference.npz``."""
    from edgellm.reference import ReferenceSettings, compute_reference

    if quantized is not None:
        return Rung("reference", ResultStatus.NOT_APPLICABLE,
                    f"the checkpoint is already quantized ({quantized}): a provider reference is made from its float "
                    f"base (the catalog's base:), not from it")
    ref = compute_reference(checkpoint, ReferenceSettings(layers=layers))
    sha = ref.save(out_dir / "reference.npz")
    evidence = {"file": "reference.npz", "sha256": sha, "checkpoint_sha256": ref.checkpoint_sha256,
                "checkpoint_revision": ref.header["checkpoint"].get("revision"), "layers": ref.layers,
                "reference_perplexity": ref.header.get("reference_perplexity"), "device": ref.device,
                "settings": {k: v for k, v in ref.settings.items() if k != "prompts"}}
    device = ref.device.get("device") if isinstance(ref.device, dict) else ref.device
    return Rung("reference", ResultStatus.PASS,
                f"transformers fp32 on {device}, {ref.layers} layer(s) kept, perplexity "
                f"{float(ref.header.get('reference_perplexity') or 0.0):.4g}", evidence)


# rung 6 --------------------------------------------------------------------------------------------------------------
def few_layers(checkpoint: Path, layers: int, drivers: Sequence[ToolchainDriver], out_dir: Path,
               quantized: str | None) -> Rung:
    """The checkpoint truncated to ``layers`` layers: ours exported, built and run on ONNX Runtime and compared
    numerically with the reference's layer-N logits and hidden states; each other toolchain with a few-layer export
    exports it on this host and checks its graph structurally (numerics need its device)."""
    from edgellm.layers_check import layers_check

    if quantized is not None:
        return Rung("few_layers", ResultStatus.NOT_APPLICABLE,
                    f"the checkpoint is already quantized ({quantized}): the few-layer test compares fp32 exports of "
                    f"float checkpoints with their reference")
    work = out_dir / LAYERS_DIR
    try:
        work.mkdir()  # fresh: the flow removed whatever was there (clear_planted)
    except FileExistsError:
        raise ConfigurationError(f"{work}: appeared while the ladder ran (planted?); refusing to write through "
                                 f"it") from None
    found = layers_check(checkpoint, out_dir / "reference.npz", layers, work_dir=work)
    evidence: dict[str, Any] = {"numeric": {"toolchain": "edgellm", "file": _write(out_dir, "layers_check.json", found),
                                            "passed": found["passed"], "failed_checks": found["failed_checks"],
                                            "checks": found.get("checks"),
                                            "first_divergent_layer": found.get("first_divergent_layer"),
                                            "layers_summary": found.get("layers_summary")},
                                "structural": {}}
    problems = [f"ONNX Runtime against the reference: {', '.join(found['failed_checks'])} out of limits"
                + (f" ({found['layers_summary']})" if found.get("layers_summary") else "")
                ] if not found["passed"] else []
    for driver in drivers:
        try:
            done = driver.host().export_layers(checkpoint, work / driver.name, layers)
        except NotOffered:
            continue
        evidence["structural"][driver.name] = done.to_json()
        problems += [f"{driver.name} {done.toolchain_version}: {p}" for p in done.problems]
    if not any(work.iterdir()):
        work.rmdir()  # only ours ran: its truncated export lived in a temporary directory
    if problems:
        return Rung("few_layers", ResultStatus.FAIL, "; ".join(problems), evidence)
    shown = ", ".join(["edgellm (ONNX Runtime, numeric)", *(f"{n} (export, structural)"
                                                           for n in evidence["structural"])])
    return Rung("few_layers", ResultStatus.PASS, f"{layers} layer(s): {shown}", evidence)
