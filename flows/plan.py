"""Plan before touching hardware: expand a matrix file or a test list into jobs, decide for each one whether it
runs, is not applicable (the platform cannot run it) or is skipped (nothing here can run it yet), and validate
everything at once. ``--dry-run`` prints this plan and stops.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from edgefarm import stages
from edgefarm.devices.inventory import Inventory
from edgefarm.devices.memory_fit import Sizer, fit_problem, memory_json, source_group
from edgefarm.devices.pools import check_pool_name
from edgefarm.registries import Registries, current
from edgefarm.stages.job import job_key
from edgefarm.stages.variant import FEATURE_NAMES, PLAIN, Features
from edgefarm.test_lists.capability import Capability, capability, hardware
from edgefarm.test_lists.catalog import Catalog, ModelSource, prequantized_evidence, row_precision
from edgefarm.test_lists.schema import EntryDefaults, TestSpec
from edgefarm.test_lists.testlist import TestEntry, TestList
from edgefarm.test_lists.variants import features as variant_features
from edgefarm.test_lists.variants import rows as variant_rows
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.base import ToolchainDriver, Variant, WheelSource, assuming_installed, runnable_problem
from edgellm.config import QuantConfig
from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.types import Precision
from edgellm.yamlio import read_yaml

log = logging.getLogger(__name__)

MATRICES_DIR = Path(__file__).resolve().parent / "matrices"
DEFAULT_MATRIX = MATRICES_DIR / "nightly.yml"


def default_matrix(registries: Registries | None = None) -> Path:
    """The nightly matrix: the site directory's ``matrices/nightly.yml`` when it has one (``registries``'; default:
    the farm's), else the shipped one."""
    return (registries or current()).files("matrices", MATRICES_DIR)["nightly"]


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
    toolchain: str  # the one chosen to run it; for a job that does not run, the one it would have run with
    reason: str = ""
    devices: tuple[str, ...] = ()
    # resolved for a job that runs (the stages get them: none resolves a toolchain again): the toolchain's version
    # on this host, and the toolchain that quantizes its checkpoint with that one's version (None: the source)
    toolchain_version: str | None = None
    quantizer: str | None = None
    quantizer_version: str | None = None
    # the checkpoint is already quantized: its precision, read from it, and where (no quantize stage runs for it)
    prequantized: str | None = None
    # the engine's estimated memory on this platform (flows.memory_fit.memory_json); None: the model's config cannot
    # be read here
    memory: dict[str, Any] | None = None

    @property
    def memory_estimate_gb(self) -> float | None:
        """The estimate alone (GiB), what the job's results record; None when it was not sized."""
        return None if self.memory is None else float(self.memory["estimate_gb"])

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
        return job_key(self.test_id, self.platform)

    @property
    def pins(self) -> dict[str, str]:
        """The toolchain versions the matrix chose for this job (empty: every toolchain's pinned version)."""
        return dict(self.entry.toolchain_versions)

    def to_json(self) -> dict[str, Any]:
        """The job as ``edgefarm nightly --dry-run --format json`` prints it (``toolchain_versions`` only when a
        matrix chose versions)."""
        e = self.entry
        out = {"model": e.model, "precision": e.precision.value, "platform": self.platform,
               "toolchain": self.toolchain, "quantizer": self.quantizer, "decision": self.decision.value,
               "reason": self.reason,
               "test_id": e.test_id, "lm_head_precision": e.lm_head_precision and e.lm_head_precision.value,
               "kv_cache_precision": e.kv_cache_precision and e.kv_cache_precision.value,
               "variant": e.variant_json(), "after": e.after,
               "stages": [str(s) for s in e.stages], "devices": list(self.devices), "memory": self.memory}
        if e.toolchain_versions:
            out["toolchain_versions"] = dict(e.toolchain_versions)
        if self.prequantized is not None:
            out["prequantized"] = self.prequantized
        return out


@dataclass
class Plan:
    name: str
    kind: str  # results.models.RunKind: nightly | l0 | l1 | adhoc | bringup
    jobs: list[Job] = field(default_factory=list)
    # each job's model as the catalog said when the plan was made (its checkpoint, chat template, thresholds): the
    # run reads these, so the catalog is read once per run
    sources: dict[str, ModelSource] = field(default_factory=dict)
    quantize_on: str | None = None  # the matrix's quantization pool (settings may override it: flows.execute)

    def runnable(self) -> list[Job]:
        return [j for j in self.jobs if j.decision is Decision.RUN]

    def exports(self) -> list[tuple[str, Precision, str, tuple[tuple[str, str], ...]]]:
        """Distinct (model, precision, toolchain, chosen toolchain versions) to export: once each, whatever the
        number of platforms."""
        return sorted({(j.model, j.precision, j.toolchain, j.entry.toolchain_versions) for j in self.runnable()},
                      key=lambda k: (k[0].lower(), k[1], k[2], k[3]))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for j in self.jobs:
            out[j.decision.value] = out.get(j.decision.value, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        """The whole plan, jobs in a stable order (platform, model, precision, test id)."""
        jobs = sorted(self.jobs, key=lambda j: (j.platform, j.model.lower(), j.precision, j.test_id))
        return {"name": self.name, "kind": self.kind, "counts": dict(sorted(self.counts().items())),
                "exports": [{"model": m, "precision": p.value, "toolchain": t,
                             **({"toolchain_versions": dict(pins)} if pins else {})}
                            for m, p, t, pins in self.exports()],
                **({"quantize_on": self.quantize_on} if self.quantize_on else {}),
                "jobs": [j.to_json() for j in jobs]}

    def describe(self) -> list[str]:
        lines = [f"plan {self.name} ({self.kind}): {len(self.jobs)} jobs "
                 + ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items())),
                 f"exports ({len(self.exports())}): " + ", ".join(
                     f"{m}/{p}/{t}" + "".join(f"/{n}=={v}" for n, v in pins) for m, p, t, pins in self.exports())]
        for j in sorted(self.jobs, key=lambda j: (j.platform, j.model.lower(), j.precision, j.test_id)):
            chain = "->".join(str(s) for s in j.entry.stages)
            where = f" on {','.join(j.devices)}" if j.devices else ""
            why = f" ({j.reason})" if j.reason else ""
            pins = "".join(f" {{{t}=={v}}}" for t, v in j.entry.toolchain_versions)
            lines.append(f"  {j.decision.value:<14} {j.platform:<12} {j.toolchain:<18} {j.test_id}  [{chain}]"
                         f"{pins}{where}{why}")
        return lines


class _Block(BaseModel):
    """Models x precisions x platforms, with defaults over the matrix's own."""

    model_config = ConfigDict(extra="forbid")
    description: str = ""
    models: list[str]
    precisions: list[str]
    platforms: list[str]
    # run with these toolchains, one job each (side by side; the test id names each); empty: the platform's own
    toolchains: list[str] = []
    defaults: dict[str, Any] = {}


class _ListShare(BaseModel):
    """A test list run inside the matrix: all of it, or only its tests of ``models`` at ``precisions`` (the
    matrix's share)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    models: list[str] | None = None
    precisions: list[str] | None = None
    variants: list[str] | None = None  # variant features (stages.variant.FEATURE_NAMES): its tests with one of them


class _Matrix(_Block):
    name: str
    extra: list[_Block] = []  # further blocks (e.g. the quantized precisions on fewer models and platforms)
    lists: list[_ListShare] = []
    # toolchain -> the exact versions to compare (every job using that toolchain runs once per version)
    toolchain_versions: dict[str, Any] = {}
    # the work pool whose worker runs this matrix's quantize stages (a GPU host's); None: the orchestrating host
    quantize_on: str | None = None


@dataclass(frozen=True)
class ListShare:
    """A test list inside a matrix, and the part of it the matrix runs (None: all)."""

    name: str
    models: frozenset[str] | None = None
    precisions: frozenset[Precision] | None = None
    variants: frozenset[str] | None = None  # feature names: an entry with one of them (None: any entry)

    def takes(self, entry: TestEntry) -> bool:
        return ((self.models is None or entry.model in self.models)
                and (self.precisions is None or entry.precision in self.precisions)
                and (self.variants is None or bool(self.variants & set(entry.features.names()))))


@dataclass(frozen=True)
class Matrix:
    name: str
    pairs: list[tuple[TestEntry, str]]  # (entry, platform) of every block
    lists: list[ListShare]
    versions: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # chosen, to compare
    quantize_on: str | None = None  # the pool quantize stages are sent to (None: the orchestrating host)


@dataclass(frozen=True)
class _Decided:
    decision: Decision
    toolchain: str
    reason: str = ""
    devices: tuple[str, ...] = ()
    driver: ToolchainDriver | None = None  # the chosen toolchain's, for a job that runs
    quantizer: ToolchainDriver | None = None


def _decide(entry: TestEntry, platform: str, inventory: Inventory, catalog: Catalog, data_dir: Path,
            prequantized: QuantConfig | None = None) -> _Decided:
    """Hardware first (not applicable: ``test_lists.capability``), then the waiver, then who could run it here: a
    toolchain (the entry's, else the platform's in order of preference) that can run the variant there and is
    available with its quantizer, and, when a stage runs on a device, a device of the platform that the toolchain can
    drive (skipped, naming every missing part). Host-only jobs (quantize, export) need no device. A ``prequantized``
    checkpoint (its quantization, read from it) is exported as it is: a toolchain whose export cannot read it is not
    applicable (``ToolchainDriver.prequantized_problem``), and none quantizes it."""
    dtype = current().device_types[platform]
    candidates = (entry.toolchain,) if entry.toolchain is not None else dtype.toolchains
    variant = Variant(entry.precision, entry.lm_head_precision, entry.kv_cache_precision, entry.features)
    if not (fits := hardware(platform, variant)):
        return _Decided(Decision.NOT_APPLICABLE, candidates[0], fits.reason)
    if entry.waived and entry.waiver is not None:
        return _Decided(Decision.WAIVED, candidates[0], f"waived until {entry.waiver.expires} ({entry.waiver.bug})")
    pins = dict(entry.toolchain_versions)
    # the model's limits (its toolchain's kernels) bind where a stage runs on the device; None: its shape is unknown
    # here, or only host stages (quantize, export) run, which no kernel of the device's takes part in
    shape = None if set(entry.stages) <= stages.host_stages() else catalog.get(entry.model).shape()
    capable = [(name, capability(platform, name, variant, shape)) for name in candidates]
    if prequantized is not None:
        capable = [(name, cap if not cap else _reads(toolchains.driver(name, data_dir, pins), prequantized))
                   for name, cap in capable]
    if not any(cap for _, cap in capable):  # no toolchain of the platform can, in principle
        return _Decided(Decision.NOT_APPLICABLE, candidates[0], capable[0][1].reason)
    chosen: ToolchainDriver | None = None
    maker: ToolchainDriver | None = None
    missing: list[str] = []
    for name, cap in capable:
        if not cap:
            continue
        found = toolchains.driver(name, data_dir, pins)
        problem, maker = runnable_problem(found, entry.precision, prequantized is not None)
        if problem is None:
            chosen = found
            break
        missing.append(problem)
    preferred = chosen.name if chosen is not None else next(name for name, cap in capable if cap)
    if chosen is not None:
        missing = []
    found_devices = inventory.select(platform=platform)
    devices = tuple(d.id for d in found_devices)
    if not set(entry.stages) <= stages.host_stages():
        if not devices:
            missing.append(f"no device of platform {platform} in the inventory {inventory.directory}")
        if chosen is not None:
            problem = chosen.device_problem()  # a toolchain of host stages only is never asked for a device step
            if problem is None:
                part = chosen.device()
                problem = part.devices_problem(platform, found_devices)
                devices = tuple(d.id for d in found_devices if part.drives(d)) or devices  # skipped: still name them
            if problem is not None:
                missing.append(problem)
    else:
        devices = ()  # nothing of this job runs on a device
    if missing:
        return _Decided(Decision.SKIPPED, preferred, "no device/toolchain can run it here: " + "; ".join(missing),
                        devices)
    assert chosen is not None
    try:
        catalog.get(entry.model).check()
    except ConfigurationError as exc:
        return _Decided(Decision.SKIPPED, chosen.name, f"checkpoint not available: {exc}", devices)
    return _Decided(Decision.RUN, chosen.name, "", devices, chosen, maker)


def _reads(found: ToolchainDriver, quant: QuantConfig) -> Capability:
    """Whether the toolchain's export reads the pre-quantized checkpoint as it is (its driver's reason if not)."""
    problem = found.prequantized_problem(quant)
    return Capability(True) if problem is None else Capability(False, problem)


def load_matrix(path: Path, catalog: Catalog) -> Matrix:
    """Expand a matrix file into (entry, platform) pairs and the test lists it includes; every problem of the file
    in one ConfigurationError."""
    from edgefarm.test_lists.loader import list_names

    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigurationError(f"{path}: a matrix file is a mapping with name, models, precisions, platforms")
    try:
        m = _Matrix.model_validate(data)
    except ValidationError as exc:
        raise ConfigurationError("\n".join(
            f"{path}: {'.'.join(str(x) for x in e['loc']) or '(top)'}: {e['msg']}" for e in exc.errors())) from None
    problems: list[str] = []
    pairs: list[tuple[TestEntry, str]] = []
    for where, block, base in [("", m, {}), *((f"extra[{i}].", b, m.defaults) for i, b in enumerate(m.extra))]:
        pairs += _block_pairs(Path(path), m.name, block, base, where, catalog, problems)
    lists = []
    known = list_names()
    for i, share in enumerate(m.lists):
        if share.name not in known:
            problems.append(f"{path}: lists[{i}]: unknown test list {share.name!r}; known: {', '.join(known)}")
        for name in share.models or []:
            if name not in catalog:
                problems.append(f"{path}: lists[{i}].models: unknown model {name!r}; known: "
                                f"{', '.join(sorted(catalog.sources))}")
        precisions = set()
        for value in share.precisions or []:
            try:
                precisions.add(Precision.parse(value, what="precision"))
            except ConfigurationError as exc:
                problems.append(f"{path}: lists[{i}].precisions: {exc}")
        for name in share.variants or []:
            if name not in FEATURE_NAMES:
                problems.append(f"{path}: lists[{i}].variants: unknown variant feature {name!r}; valid: "
                                f"{', '.join(FEATURE_NAMES)}")
        lists.append(ListShare(share.name, None if share.models is None else frozenset(share.models),
                               None if share.precisions is None else frozenset(precisions),
                               None if share.variants is None else frozenset(share.variants)))
    versions = _versions(Path(path), m.toolchain_versions, problems)
    if m.quantize_on is not None:
        try:
            check_pool_name(m.quantize_on)
        except ConfigurationError as exc:
            problems.append(f"{path}: quantize_on: {exc}")
    if problems:
        raise ConfigurationError("\n".join(problems))
    return Matrix(m.name, pairs, lists, versions, m.quantize_on)


def _versions(path: Path, given: Mapping[str, Any], problems: list[str]) -> dict[str, tuple[str, ...]]:
    """``toolchain_versions:`` checked: known toolchains whose version can be chosen, each a non-empty list of
    distinct exact versions (strings: YAML reads 0.12 as a number)."""
    out: dict[str, tuple[str, ...]] = {}
    for name, listed in given.items():
        where = f"{path}: toolchain_versions.{name}"
        try:
            found = toolchains.driver(name)
        except ConfigurationError as exc:
            problems.append(f"{path}: toolchain_versions: {exc}")
            continue
        if found.pinned is None:
            problems.append(f"{where}: {found.version_problem('')}")
            continue
        form = f"a list of exact versions, e.g. [\"{found.pinned}\"]"
        if not isinstance(listed, list) or not listed:
            problems.append(f"{where}: expected {form}, got {listed!r}")
            continue
        bad = [f"{where}: {v!r} is not a version string; expected {form} (quote it)" for v in listed
               if not isinstance(v, str)]
        bad += [f"{where}: {problem}" for v in listed
                if isinstance(v, str) and (problem := found.version_problem(v)) is not None]
        bad += [f"{where}: version {v!r} is listed twice" for v in sorted({v for v in listed if listed.count(v) > 1})]
        problems += bad
        if not bad:
            out[found.name] = tuple(listed)
    return out


def with_versions(entry: TestEntry, platform: str, versions: Mapping[str, tuple[str, ...]],
                  data_dir: Path, prequantized: bool = False) -> list[TestEntry]:
    """One entry per combination of the chosen versions of the toolchains the test would use on ``platform`` (the
    toolchains it may run with that produce its precision, and the one that quantizes it for them unless its
    checkpoint is ``prequantized``), each carrying its versions; the entry itself when it uses none of them."""
    if not versions:
        return [entry]
    uses: set[str] = set()
    for name in (entry.toolchain,) if entry.toolchain is not None else current().device_types[platform].toolchains:
        found = toolchains.driver(name, data_dir)
        if entry.precision in found.precisions():
            uses.add(name)
            if not prequantized and found.takes_quantized_checkpoint(entry.precision) and (
                    maker := toolchains.quantizer(entry.precision, data_dir)) is not None:
                uses.add(maker.name)
    chosen = sorted(t for t in versions if t in uses)
    if not chosen:
        return [entry]
    return [dataclasses.replace(entry, toolchain_versions=tuple(zip(chosen, combo, strict=True)))
            for combo in itertools.product(*(versions[t] for t in chosen))]


def _block_pairs(path: Path, name: str, block: _Block, base: dict[str, Any], where: str, catalog: Catalog,
                 problems: list[str]) -> list[tuple[TestEntry, str]]:
    """One block's (entry, platform) pairs; its problems are appended to ``problems``."""
    found = len(problems)
    for model in block.models:
        if model not in catalog:
            problems.append(f"{path}: {where}models: unknown model {model!r}; known: "
                            f"{', '.join(sorted(catalog.sources))}")
    precisions: list[Precision] = []
    for value in block.precisions:
        try:
            precisions.append(Precision.parse(value, what="precision"))
        except ConfigurationError as exc:
            problems.append(f"{path}: {where}precisions: {exc}")
    for value in block.platforms:
        if value not in (types := current().device_types):
            problems.append(f"{path}: {where}platforms: unknown platform {value!r}; valid: {', '.join(types)}")
    chains: list[str | None] = []
    for value in block.toolchains:
        try:
            chains.append(toolchains.parse(value))
        except ConfigurationError as exc:
            problems.append(f"{path}: {where}toolchains: {exc}")
    defaults: dict[str, Any] = {}
    try:
        defaults = EntryDefaults.model_validate({**base, **block.defaults}).model_dump(exclude_none=True)
    except ValidationError as exc:
        problems += [f"{path}: {where}defaults.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                     for e in exc.errors()]
    for key in ("max_seq_len", "max_batch_size", "max_input_len"):
        if key not in defaults and not any(key in p for p in problems[found:]):
            problems.append(f"{path}: {where}defaults: missing {key} (engine limits for every combination)")
    if len(problems) > found:
        return []
    pairs: list[tuple[TestEntry, str]] = []
    for model in block.models:
        for precision in precisions:
            try:
                spec = TestSpec.model_validate({**defaults, "model": model, "precision": precision.value})
            except ValidationError as exc:
                problems += [f"{path}: {where}{model} {precision}: {e['msg']}" for e in exc.errors()]
                continue
            feats, feature_problems = variant_features(spec, catalog)
            if feature_problems:
                problems += [f"{path}: {where}defaults.{field}: {why}" for field, why in feature_problems]
                continue
            for chain in chains or [None]:
                entry = dataclasses.replace(_entry(name, spec, str(path), feats), toolchain=chain)
                pairs += [(row, platform) for row in variant_rows(entry) for platform in block.platforms]
    return pairs


def _entry(list_name: str, spec: TestSpec, source: str, feats: Features = PLAIN) -> TestEntry:
    assert spec.precision is not None  # a matrix block names its precisions
    return TestEntry(
        list_name=list_name, model=spec.model, precision=spec.precision, max_seq_len=spec.max_seq_len,
        max_batch_size=spec.max_batch_size, max_input_len=spec.max_input_len, stages=tuple(spec.stages),
        timeouts=spec.timeouts(), lm_head_precision=spec.lm_head_precision,
        kv_cache_precision=spec.kv_cache_precision, case=spec.case, source=source, features=feats,
    )


INSTALL_HEARTBEAT_S = 20.0  # how often a long install says it is still working (the first one takes minutes)


@contextmanager
def still_working(what: str, every_s: float = INSTALL_HEARTBEAT_S) -> Iterator[None]:
    """A line every ``every_s`` seconds while the block runs (``<what>: still working, 40 s``): a first install
    is minutes of pip, which says nothing meanwhile."""
    stop = threading.Event()
    t0 = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            log.warning("%s: still working, %.0f s", what, time.monotonic() - t0)

    thread = threading.Thread(target=beat, daemon=True, name="still-working")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def installing_toolchains(make: Callable[[], Plan], data_dir: Path, wheels: WheelSource | None = None) -> Plan:
    """``make()``; when a job it skips would run once the toolchains it needs were installed (those whose driver
    can install itself: ``Availability.installable``), install them under ``data_dir`` (one-time, minutes; from
    where ``wheels`` says: the store's mirror or the registry) and plan again. An install that fails leaves those
    jobs skipped with its reason (e.g. the package registry unreachable, or no mirror where only one may be used)."""
    plan = make()
    skipped = {job.key for job in plan.jobs if job.decision is Decision.SKIPPED}
    if not skipped:
        return plan
    with assuming_installed():
        would_run = [job for job in make().runnable() if job.key in skipped]
    needed = {(name, job.entry.toolchain_versions) for job in would_run
              for name in (job.toolchain, job.quantizer) if name is not None}
    for name, pins in sorted(needed):
        found = toolchains.driver(name, data_dir, dict(pins))
        if not found.environment.available().ok:
            t0 = time.monotonic()
            log.warning("installing toolchain %s for %d job(s) that need it (one-time)", name,
                        sum(name in (job.toolchain, job.quantizer) for job in would_run))
            with still_working(f"installing toolchain {name}"):
                problem = found.environment.install(wheels)
            log.warning("toolchain %s: %s after %.0f s", name, f"not installed ({problem})" if problem else "installed",
                        time.monotonic() - t0)
    return make() if needed else plan


def plan_matrix(path: Path, inventory: Inventory, catalog: Catalog, *, data_dir: Path,
                today: dt.date | None = None) -> Plan:
    """The matrix's plan for the farm whose state is under ``data_dir`` (its installed toolchains)."""
    from edgefarm.test_lists.loader import load_list

    matrix = load_matrix(path, catalog)
    pairs = list(matrix.pairs)
    for share in matrix.lists:
        pairs += [(e, p) for e, p in _list_pairs(load_list(share.name, today=today), inventory, catalog, today)
                  if share.takes(e)]
    carried = {m: catalog.get(m).checkpoint_precision() is not None for m in {e.model for e, _ in pairs}} \
        if matrix.versions else {}
    pairs = [(e, p) for entry, p in pairs
             for e in with_versions(entry, p, matrix.versions, data_dir, carried.get(entry.model, False))]
    plan = _plan(matrix.name, "nightly", pairs, inventory, catalog, data_dir)
    plan.quantize_on = matrix.quantize_on
    return plan


def plan_test_list(tlist: TestList, inventory: Inventory, catalog: Catalog, *, data_dir: Path,
                   today: dt.date | None = None) -> Plan:
    return _plan(tlist.name, tlist.stage.value, _list_pairs(tlist, inventory, catalog, today), inventory, catalog,
                 data_dir)


def plan_entries(name: str, kind: str, pairs: Iterable[tuple[TestEntry, str]], inventory: Inventory,
                 catalog: Catalog, *, data_dir: Path) -> Plan:
    """A plan of entries made elsewhere than a list file (a bring-up's rows), decided as a list's are."""
    return _plan(name, kind, pairs, inventory, catalog, data_dir)


def _list_pairs(tlist: TestList, inventory: Inventory, catalog: Catalog,
                today: dt.date | None) -> list[tuple[TestEntry, str]]:
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
    return pairs


def _resolved(decided: _Decided) -> dict[str, str | None]:
    """The versions a job that runs hands its stages (read once here; a version that cannot be read is the
    toolchain's problem to report when its stage runs)."""
    out: dict[str, str | None] = {}
    for key, found in (("toolchain", decided.driver), ("quantizer", decided.quantizer)):
        if found is None:
            continue
        if key == "quantizer":
            out["quantizer"] = found.name
        try:
            out[f"{key}_version"] = found.environment.host_version()
        except EdgeLLMError:
            out[f"{key}_version"] = None
    return out


def _plan(name: str, kind: str, pairs: Iterable[tuple[TestEntry, str]], inventory: Inventory, catalog: Catalog,
          data_dir: Path) -> Plan:
    plan = Plan(name=name, kind=kind)
    seen: set[str] = set()
    decided_jobs: dict[str, Job] = {}
    refused: list[str] = []
    carried: dict[str, QuantConfig | None] = {}  # per model: the quantization its checkpoint already carries
    sizer = Sizer()
    for entry, platform in pairs:
        source = catalog.get(entry.model)
        try:  # a pre-quantized checkpoint's precision is its own (the catalog decides, as for lists validate)
            row_precision(source, entry.precision, entry.stages)
            if entry.model not in carried:
                found = source.quantization()
                carried[entry.model] = found if found is not None and found.is_quantized else None
        except ConfigurationError as exc:
            if (line := f"{entry.source}: {exc}") not in refused:
                refused.append(line)
            continue
        decided = _decide(entry, platform, inventory, catalog, data_dir, carried[entry.model])
        sized = sizer.size(entry, source.config(), decided.toolchain, platform, source_group(source))
        if decided.decision in (Decision.RUN, Decision.SKIPPED) and not set(entry.stages) <= stages.host_stages() \
                and (too_big := fit_problem(sized, current().device_types[platform])) is not None:
            decided = _Decided(Decision.NOT_APPLICABLE, decided.toolchain, too_big)
        job = Job(entry=entry, platform=platform, decision=decided.decision, toolchain=decided.toolchain,
                  reason=decided.reason, devices=decided.devices, **_resolved(decided),
                  prequantized=prequantized_evidence(source) if carried[entry.model] is not None else None,
                  memory=memory_json(sized))
        if job.key in seen:
            raise ConfigurationError(f"{entry.source}: test {job.test_id} on {platform} appears twice")
        if entry.after is not None and job.decision is Decision.RUN:  # planned only when the one before runs
            first = decided_jobs.get(job_key(entry.after, platform))
            if first is None or first.decision is not Decision.RUN:
                why = "is not in the plan" if first is None else f"is {first.decision.value}: {first.reason}"
                job = dataclasses.replace(job, decision=Decision.SKIPPED,
                                          reason=f"runs after {job_key(entry.after, platform)}, which {why}")
        seen.add(job.key)
        decided_jobs[job.key] = job
        plan.jobs.append(job)
        if job.decision is Decision.RUN:
            plan.sources.setdefault(job.model, source)
            if source.base is not None:  # the float model its accuracy reference is computed from
                plan.sources.setdefault(source.base.name, source.base)
            for part in entry.features.part_models().values():  # a draft, an adapter, a vocabulary map
                plan.sources.setdefault(part, catalog.get(part))
    if refused:
        raise ConfigurationError("\n".join(refused))
    return plan

