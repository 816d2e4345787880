"""Plan before touching hardware: expand a matrix file or a test list into jobs, decide for each one whether it
runs, is not applicable (the platform cannot run it) or is skipped (nothing here can run it yet), and validate
everything at once. ``--dry-run`` prints this plan and stops.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from devices.inventory import Inventory
from devices.types import DEVICE_TYPES
from edgellm.errors import ConfigurationError
from edgellm.types import Precision
from edgellm.yamlio import read_yaml
from test_lists.catalog import Catalog
from test_lists.schema import EntryDefaults, TestSpec
from test_lists.testlist import TestEntry, TestList
from toolchains.base import Toolchain, choose, require

MATRICES_DIR = Path(__file__).resolve().parent / "matrices"
DEFAULT_MATRIX = MATRICES_DIR / "nightly.yml"


class Decision(enum.StrEnum):
    RUN = "run"
    NOT_APPLICABLE = "not_applicable"  # the platform cannot run this combination
    SKIPPED = "skipped"  # the platform could, but nothing here can (no device, no checkpoint, no quantizer)
    WAIVED = "waived"


@dataclass(frozen=True)
class Job:
    """One test on one platform: the unit the pipeline executes and the results database records."""

    entry: TestEntry
    platform: str
    decision: Decision
    toolchain: Toolchain  # the one chosen to run it; for a job that does not run, the platform's preferred one
    reason: str = ""
    devices: tuple[str, ...] = ()

    @property
    def model(self) -> str:
        return self.entry.model

    @property
    def precision(self) -> Precision:
        return self.entry.precision

    @property
    def test_id(self) -> str:
        return self.entry.test_id

    @property
    def key(self) -> str:
        return f"{self.test_id}@{self.platform}"

    def to_json(self) -> dict[str, Any]:
        """The job as ``edgefarm nightly --dry-run --format json`` prints it."""
        e = self.entry
        return {"model": e.model, "precision": e.precision.value, "platform": self.platform,
                "toolchain": self.toolchain.value, "decision": self.decision.value, "reason": self.reason,
                "test_id": e.test_id, "lm_head_precision": e.lm_head_precision and e.lm_head_precision.value,
                "kv_cache_precision": e.kv_cache_precision and e.kv_cache_precision.value,
                "stages": [s.value for s in e.stages], "devices": list(self.devices)}


@dataclass
class Plan:
    name: str
    kind: str  # nightly | l0 | l1 | adhoc
    jobs: list[Job] = field(default_factory=list)

    def runnable(self) -> list[Job]:
        return [j for j in self.jobs if j.decision is Decision.RUN]

    def exports(self) -> list[tuple[str, Precision, Toolchain]]:
        """Distinct (model, precision, toolchain) to export: once each, whatever the number of platforms."""
        return sorted({(j.model, j.precision, j.toolchain) for j in self.runnable()},
                      key=lambda k: (k[0].lower(), k[1], k[2]))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs:
            out[j.decision.value] = out.get(j.decision.value, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        """The whole plan, jobs in a stable order (platform, model, precision, test id)."""
        jobs = sorted(self.jobs, key=lambda j: (j.platform, j.model.lower(), j.precision, j.test_id))
        return {"name": self.name, "kind": self.kind, "counts": dict(sorted(self.counts().items())),
                "exports": [{"model": m, "precision": p.value, "toolchain": t.value} for m, p, t in self.exports()],
                "jobs": [j.to_json() for j in jobs]}

    def describe(self) -> list[str]:
        lines = [f"plan {self.name} ({self.kind}): {len(self.jobs)} jobs "
                 + ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items())),
                 f"exports ({len(self.exports())}): " + ", ".join(f"{m}/{p}/{t}" for m, p, t in self.exports())]
        for j in sorted(self.jobs, key=lambda j: (j.platform, j.model.lower(), j.precision, j.test_id)):
            stages = "->".join(s.value for s in j.entry.stages)
            where = f" on {','.join(j.devices)}" if j.devices else ""
            why = f" ({j.reason})" if j.reason else ""
            lines.append(f"  {j.decision.value:<14} {j.platform:<12} {j.toolchain:<18} {j.test_id}  [{stages}]"
                         f"{where}{why}")
        return lines


class _Matrix(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    models: list[str]
    precisions: list[str]
    platforms: list[str]
    defaults: dict[str, Any] = {}


def _decide(
    entry: TestEntry, platform: str, inventory: Inventory, catalog: Catalog
) -> tuple[Decision, Toolchain, str, tuple[str, ...]]:
    """Hardware first (not applicable), then the waiver, then who could run it here: a toolchain of the platform
    that can produce the precision, and a device of the platform (skipped, naming every missing part)."""
    dtype = DEVICE_TYPES[platform]
    preferred = dtype.toolchains[0]
    ok, why = dtype.supports(entry.precision)
    if not ok:
        return Decision.NOT_APPLICABLE, preferred, why, ()
    if entry.waived and entry.waiver is not None:
        return Decision.WAIVED, preferred, f"waived until {entry.waiver.expires} ({entry.waiver.bug})", ()
    toolchain, refusals = choose(dtype.toolchains, entry.precision)
    if toolchain is not None and (problem := require(toolchain).variant_problem(
            entry.precision, entry.lm_head_precision, entry.kv_cache_precision)) is not None:
        return Decision.NOT_APPLICABLE, toolchain, problem, ()
    devices = tuple(d.id for d in inventory.select(platform=platform))
    missing = list(refusals) if toolchain is None else []
    if not devices:
        missing.append(f"no device of platform {platform} in the inventory {inventory.directory}")
    if missing:
        return Decision.SKIPPED, toolchain or preferred, "no device/toolchain can run it here: " + "; ".join(
            missing), devices
    assert toolchain is not None
    try:
        catalog.get(entry.model).check()
    except ConfigurationError as exc:
        return Decision.SKIPPED, toolchain, f"checkpoint not available: {exc}", devices
    return Decision.RUN, toolchain, "", devices


def load_matrix(path: Path, catalog: Catalog) -> tuple[str, list[tuple[TestEntry, str]]]:
    """Expand a matrix file into (entry, platform) pairs; every problem of the file in one ConfigurationError."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: a matrix file is a mapping with name, models, precisions, platforms")
    problems: list[str] = []
    try:
        m = _Matrix.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError("\n".join(
            f"{path}: {'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())) from None
    for name in m.models:
        if name not in catalog:
            problems.append(f"{path}: models: unknown model {name!r}; known: {', '.join(sorted(catalog.sources))}")
    precisions: list[Precision] = []
    for value in m.precisions:
        try:
            precisions.append(Precision.parse(value, what="precision"))
        except ConfigurationError as exc:
            problems.append(f"{path}: precisions: {exc}")
    for value in m.platforms:
        if value not in DEVICE_TYPES:
            problems.append(f"{path}: platforms: unknown platform {value!r}; valid: {', '.join(DEVICE_TYPES)}")
    defaults: dict[str, Any] = {}
    try:
        defaults = EntryDefaults.model_validate(m.defaults).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems += [f"{path}: defaults.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
    for key in ("max_seq_len", "max_batch_size", "max_input_len"):
        if key not in defaults and not any(key in p for p in problems):
            problems.append(f"{path}: defaults: missing {key} (engine limits for every combination)")
    if problems:
        raise ConfigurationError("\n".join(problems))
    pairs: list[tuple[TestEntry, str]] = []
    for model in m.models:
        for precision in precisions:
            try:
                spec = TestSpec.model_validate({**defaults, "model": model, "precision": precision.value})
            except ValidationError as exc:
                problems += [f"{path}: {model} {precision}: {e['msg']}" for e in exc.errors()]
                continue
            entry = _entry(m.name, spec, source=str(path))
            pairs += [(entry, platform) for platform in m.platforms]
    if problems:
        raise ConfigurationError("\n".join(problems))
    return m.name, pairs


def _entry(list_name: str, spec: TestSpec, source: str) -> TestEntry:
    return TestEntry(
        list_name=list_name, model=spec.model, precision=spec.precision, max_seq_len=spec.max_seq_len,
        max_batch_size=spec.max_batch_size, max_input_len=spec.max_input_len, stages=tuple(spec.stages),
        timeouts=spec.timeouts(), lm_head_precision=spec.lm_head_precision,
        kv_cache_precision=spec.kv_cache_precision, case=spec.case, source=source,
    )


def plan_matrix(path: Path, inventory: Inventory, catalog: Catalog) -> Plan:
    name, pairs = load_matrix(path, catalog)
    return _plan(name, "nightly", pairs, inventory, catalog)


def plan_test_list(tlist: TestList, inventory: Inventory, catalog: Catalog,
                   today: dt.date | None = None) -> Plan:
    problems = [f"{e.source}: unknown model {e.model!r}; add it to {catalog.path}"
                for e in tlist.entries if e.model not in catalog]
    if problems:
        raise ConfigurationError("\n".join(sorted(set(problems))))
    pairs: list[tuple[TestEntry, str]] = []
    for platform in tlist.platforms:
        devices = [d for d in inventory.select(platform=platform) if tlist.accepts_device(platform, d.labels)[0]]
        if not devices and inventory.select(platform=platform):
            continue  # devices exist but none carries the labels the list needs: not this list's platform here
        pairs += [(e, platform) for e in tlist.entries_for(platform, today)]
    return _plan(tlist.name, tlist.stage.value, pairs, inventory, catalog)


def _plan(name: str, kind: str, pairs: Iterable[tuple[TestEntry, str]], inventory: Inventory, catalog: Catalog) -> Plan:
    plan = Plan(name=name, kind=kind)
    seen: set[str] = set()
    for entry, platform in pairs:
        decision, toolchain, reason, devices = _decide(entry, platform, inventory, catalog)
        job = Job(entry=entry, platform=platform, decision=decision, toolchain=toolchain, reason=reason,
                  devices=devices)
        if job.key in seen:
            raise ConfigurationError(f"{entry.source}: test {job.test_id} on {platform} appears twice")
        seen.add(job.key)
        plan.jobs.append(job)
    return plan

