"""Validate test list files and build TestList objects, collecting EVERY problem before reporting.

Each problem names the file, line, entry (index and test id when known), field and reason. YAML that does not parse
is an error naming its line, never skipped. Every test's model must be in the model catalog (``models.yml`` beside the
lists). Expired waivers and waivers that match nothing are warnings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from edgefarm.test_lists.catalog import Catalog, row_precision
from edgefarm.test_lists.ids import short_model_name
from edgefarm.test_lists.platforms import PlatformCatalog
from edgefarm.test_lists.schema import EntryDefaults, FragmentHeader, ListHeader, Selector, TestSpec, WaiversHeader
from edgefarm.test_lists.testlist import TestEntry, TestList
from edgefarm.test_lists.variants import features, rows
from edgefarm.test_lists.waivers import SourcedWaiver, Waiver
from edgefarm.vocabulary.variant import PLAIN, Features
from edgellm.errors import ConfigurationError
from edgellm.yamlio import LineDict, YamlSyntaxError, line_of, read_yaml

if TYPE_CHECKING:
    from edgefarm.registries import Registries

WAIVERS_STEM = "waivers"
CATALOG_STEM = "models"  # the model catalog lives beside the lists; neither it nor waivers.yml is a list
NOT_LISTS = (WAIVERS_STEM, CATALOG_STEM)


@dataclass(frozen=True)
class Problem:
    file: Path
    reason: str
    line: int | None = None
    where: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        loc = f"{self.file}:{self.line}" if self.line else str(self.file)
        return ": ".join([loc, *(p for p in (self.where, self.field) if p), self.reason])


@dataclass
class Report:
    files: list[Path] = field(default_factory=list)
    lists: list[TestList] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    waivers: list[SourcedWaiver] = field(default_factory=list)
    today: dt.date = field(default_factory=dt.date.today)

    @property
    def expired(self) -> list[SourcedWaiver]:
        return [w for w in self.waivers if w.waiver.is_expired(self.today)]

    @property
    def ok(self) -> bool:
        return not self.errors


def _pydantic_problems(
    exc: ValidationError, model: type[BaseModel], file: Path, raw: Any, where: str | None, prefix: tuple = ()
) -> list[Problem]:
    out = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        out.append(
            Problem(
                file=file,
                reason=_reason(err, model),
                line=line_of(raw, (*prefix, *loc)),
                where=where,
                field=".".join(str(p) for p in (loc if where else (*prefix, *loc))) or None,
            )
        )
    return out


def _reason(err: Any, model: type[BaseModel]) -> str:
    kind, loc, value = err["type"], tuple(err["loc"]), err.get("input")
    if kind == "extra_forbidden":
        for part in loc[:-1]:  # descend to the nested model that owns the key, for the list of valid keys
            annotation = model.model_fields[part].annotation if part in model.model_fields else None
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return f"unknown key {loc[-1]!r}"
            model = annotation
        return f"unknown key {loc[-1]!r}; valid: {', '.join(model.model_fields)}"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if isinstance(value, str | int | float | bool) or value is None:
        return f"{err['msg']}, got {value!r}"
    return str(err["msg"])


def _validate(model: type[BaseModel], data: Any, file: Path, raw: Any, where: str | None, prefix: tuple = ()):
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, _pydantic_problems(exc, model, file, raw, where, prefix)


class Validator:
    """Validates list, fragment and waiver files against one platform catalog and one 'today'; the platforms (when
    none are given), the models (when no catalog is) and the device types rows are sized for are ``registries``'
    (default: the farm's)."""

    def __init__(self, platforms: PlatformCatalog | Iterable[str] | None = None, today: dt.date | None = None,
                 models: Catalog | None = None, *, registries: Registries | None = None):
        self.registries = registries
        if platforms is None and registries is not None:
            platforms = PlatformCatalog(frozenset(registries.device_types), device_types=True)
        self.catalog = PlatformCatalog.coerce(platforms)
        self.today = today or dt.date.today()
        self.models = models if models is not None else Catalog.load(registries=registries)
        from edgefarm.devices.memory_fit import Sizer

        self._sizer = Sizer()  # each row's memory, sized once (the reserve table read once)

    # ---------------------------------------------------------------- platforms
    def _selection(
        self, names: Sequence[str], file: Path, raw: Any, loc: tuple, errors: list[Problem], where: str | None = None
    ) -> set[str]:
        """Resolve names and globs to known platforms; every unknown name or empty glob is an error."""
        known = ", ".join(self.catalog.names)
        picked: set[str] = set()
        for i, name in enumerate(names):
            glob = any(c in name for c in "*?[")
            matched = self.catalog.matching(name) if glob else ([name] if name in self.catalog else [])
            if not matched:
                what = f"wildcard {name!r} matches no known platform" if glob else f"unknown platform {name!r}"
                field = str(loc[-1]) if where else ".".join(map(str, loc))
                errors.append(Problem(file, f"{what}; known: {known}", line_of(raw, (*loc, i)), where, field))
            picked.update(matched)
        return picked

    def _capability_problems(self, spec: TestSpec, platforms: Iterable[str],
                             feats: Features = PLAIN) -> list[tuple[str, str]]:
        """(field, reason) for each selected platform that cannot run the test (``test_lists.capability``: the one
        answer the plan gives too), naming the first field that fails there. The model's own limits (its shape
        against the toolchains' kernels) are asked as the plan asks them: when a stage runs on the device and the
        catalog can read the model's shape here."""
        if not self.catalog.device_types:
            return []
        from edgefarm import stages
        from edgefarm.test_lists.capability import capability
        from edgefarm.vocabulary.variant import Variant

        shape = None
        if spec.model in self.models and not set(spec.stages) <= stages.host_stages():
            shape = self.models.get(spec.model).shape()
        out = []
        for name in sorted(platforms):
            whole = Variant(spec.precision, spec.lm_head_precision, spec.kv_cache_precision)
            steps = [("precision", Variant(spec.precision), None),
                     ("kv_cache_precision", Variant(spec.precision, kv_cache=spec.kv_cache_precision), None),
                     ("lm_head_precision", whole, None)]
            if not feats.plain:  # the variant's features, named by the first one the entry gives
                given = next(f for f in ("speculative", "lora", "reduced_vocab", "fp8_embedding", "components")
                             if getattr(spec, f) is not None)
                whole = dataclasses.replace(whole, features=feats)
                steps.append((given, whole, None))
            if shape is not None:
                steps.append(("model", whole, shape))
            for fname, variant, model in steps:
                found = capability(name, None, variant, model, registries=self.registries)
                if not found:
                    out.append((fname, found.reason))
                    break
        return out

    def _fit_notes(self, spec: TestSpec, platforms: Iterable[str]) -> list[str]:
        """For each platform the row's engine cannot fit (``devices.memory_fit``, as the plan asks it, when a stage
        runs on the device): "not applicable on P: needs ...". The plan marks such rows not applicable; validation
        warns, since a list may name several platforms of which only some are too small."""
        from edgefarm import stages

        if not self.catalog.device_types or spec.model not in self.models or spec.precision is None \
                or set(spec.stages) <= stages.host_stages():
            return []
        return [f"not applicable on {name}: {why}" for name in sorted(platforms)
                if (why := self._fit_problem(spec, name)) is not None]

    def _fit_problem(self, spec: TestSpec, platform: str) -> str | None:
        """Why the row's engine cannot fit ``platform``'s memory (``devices.memory_fit``, as the plan asks it)."""
        from edgefarm.devices.memory_fit import fit_problem, source_group
        from edgefarm.registries import current

        source = self.models.get(spec.model)
        dtype = (self.registries or current()).device_types[platform]
        toolchain = getattr(spec, "toolchain", None) or dtype.toolchains[0]
        found = self._sizer.size(spec, source.config(), toolchain, platform, source_group(source))
        return fit_problem(found, dtype)

    # ---------------------------------------------------------------- includes
    def _defaults(self, raw: LineDict, file: Path, errors: list[Problem]) -> dict[str, Any]:
        data = raw.get("defaults")
        if data is None:
            return {}
        if not isinstance(data, dict):
            errors.append(Problem(file, "must be a mapping of entry fields", line_of(raw, ("defaults",)), None,
                                  "defaults"))
            return {}
        _, problems = _validate(EntryDefaults, data, file, raw, "defaults", ("defaults",))
        errors += problems
        bad = {p.field.split(".")[0] for p in problems if p.field}
        return {k: v for k, v in data.items() if k not in bad}

    def _includes(
        self, raw: LineDict, file: Path, stack: list[Path], errors: list[Problem]
    ) -> tuple[dict[str, Any], list[tuple[Path, int, Any]]]:
        defaults: dict[str, Any] = {}
        tests: list[tuple[Path, int, Any]] = []
        includes = raw.get("include") or []
        for i, inc in enumerate(includes if isinstance(includes, list) else []):
            if not isinstance(inc, str) or not inc:
                continue  # the header reports it
            line = line_of(raw, ("include", i))
            shown = Path(os.path.normpath(file.parent / inc))
            target = shown.resolve()
            if target in stack:
                chain = " -> ".join(p.name for p in [*stack[stack.index(target):], target])
                errors.append(Problem(file, f"include cycle: {chain}", line, None, "include"))
                continue
            if not target.is_file():
                errors.append(Problem(file, f"included file {inc!r} not found (looked for {shown})", line, None,
                                      "include"))
                continue
            try:
                frag = read_yaml(shown)
            except YamlSyntaxError as exc:
                errors.append(Problem(shown, exc.reason, exc.line))
                continue
            if not isinstance(frag, LineDict):
                errors.append(Problem(shown, "an included fragment must be a mapping with 'tests'/'defaults'", 1))
                continue
            _, problems = _validate(FragmentHeader, frag, shown, frag, None)
            errors += problems
            nested_defaults, nested_tests = self._includes(frag, shown, [*stack, target], errors)
            defaults.update(nested_defaults)
            defaults.update(self._defaults(frag, shown, errors))
            tests += nested_tests
            own = frag.get("tests")
            tests += [(shown, j, t) for j, t in enumerate(own if isinstance(own, list) else [])]
        return defaults, tests

    # ---------------------------------------------------------------- waivers
    def _waivers(self, raw: LineDict, file: Path, errors: list[Problem]) -> list[SourcedWaiver]:
        items = raw.get("waivers")
        out = []
        for i, item in enumerate(items if isinstance(items, list) else []):
            waiver, problems = _validate(Waiver, item, file, raw, f"waivers[{i}]", ("waivers", i))
            errors += problems
            if waiver is not None:
                before = len(errors)
                self._selection(waiver.platforms, file, raw, ("waivers", i, "platforms"), errors, f"waivers[{i}]")
                if len(errors) == before:
                    out.append(SourcedWaiver(waiver=waiver, file=file, line=line_of(raw, ("waivers", i))))
        return out

    def _waiver_warnings(self, waivers: list[SourcedWaiver], cases: list[tuple[str, str]]) -> list[Problem]:
        """``cases``: every (test id, platform) the waivers could apply to."""
        warnings = []
        for sw in waivers:
            w = sw.waiver
            if w.is_expired(self.today):
                warnings.append(Problem(sw.file, f"{w.describe()} expired on {w.expires.isoformat()}; it no longer "
                                        "waives anything: renew it or remove it", sw.line, None, "expires"))
            if not any(w.matches(tid, plat) for tid, plat in cases):
                warnings.append(Problem(sw.file, f"{w.describe()} matches no test", sw.line, None, "pattern"))
        return warnings

    # ---------------------------------------------------------------- files
    def list_file(self, file: Path) -> tuple[TestList | None, list[Problem], list[Problem]]:
        """Validate one list file: (the list if it has no errors, errors, warnings)."""
        errors: list[Problem] = []
        try:
            raw = read_yaml(file)
        except YamlSyntaxError as exc:
            return None, [Problem(file, exc.reason, exc.line)], []
        if not isinstance(raw, LineDict):
            reason = "a test list must be a mapping with name, stage, description, platforms, tests"
            return None, [Problem(file, reason, 1)], []
        header, problems = _validate(ListHeader, raw, file, raw, None)
        errors += problems
        name = raw.get("name")
        if isinstance(name, str) and name != file.stem:
            errors.append(Problem(file, f"name {name!r} must equal the file name stem {file.stem!r}",
                                  line_of(raw, ("name",)), None, "name"))
        selector = header.platforms if header else _validate(Selector, raw.get("platforms"), file, raw, None)[0]
        platforms: set[str] = set()
        if selector is not None:
            platforms |= self._selection(selector.terms, file, raw, ("platforms", "terms"), errors)
            platforms |= self._selection(selector.wildcards, file, raw, ("platforms", "wildcards"), errors)

        defaults, tests = self._includes(raw, file, [file.resolve()], errors)
        defaults.update(self._defaults(raw, file, errors))
        own = raw.get("tests")
        tests += [(file, i, t) for i, t in enumerate(own if isinstance(own, list) else [])]

        entries: list[TestEntry] = []
        first_seen: dict[str, str] = {}
        fit_notes: list[Problem] = []  # rows that cannot fit a platform's memory (warnings: the plan decides)
        for src, i, item in tests:
            where = f"tests[{i}]"
            if not isinstance(item, dict):
                errors.append(Problem(src, "must be a mapping with model, precision, max_seq_len, ...",
                                      line_of(raw if src == file else None, ("tests", i)), where))
                continue
            if isinstance(item.get("model"), str):
                where += f" ({short_model_name(item['model'])})"
            spec, problems = _validate(TestSpec, {**defaults, **item}, src, item, where)
            errors += problems
            if spec is None:
                continue
            if spec.model in self.models:
                try:  # a pre-quantized checkpoint's precision is its own (the catalog decides it for the plan too)
                    precision = row_precision(self.models.get(spec.model), spec.precision, spec.stages)
                except ConfigurationError as exc:
                    field = "stages" if "stage quantize" in str(exc) else "precision"
                    errors.append(Problem(src, str(exc), line_of(item, (field,)) or line_of(item, ()), where, field))
                    continue
                spec = spec.model_copy(update={"precision": precision})
            elif spec.precision is None:  # its precision cannot be known: reported now, the entry is not made
                errors.append(Problem(src, f"unknown model {spec.model!r}; the model catalog {self.models.path} has: "
                                           f"{', '.join(sorted(self.models.sources))}",
                                      line_of(item, ("model",)), where, "model"))
                continue
            feats, feature_problems = features(spec, self.models)
            entry = _entry(str(name), spec, f"{src}:{line_of(item, ())}", feats)
            where = f"tests[{i}] {entry.test_id}"
            if spec.model not in self.models:
                errors.append(Problem(src, f"unknown model {spec.model!r}; the model catalog {self.models.path} has: "
                                           f"{', '.join(sorted(self.models.sources))}",
                                      line_of(item, ("model",)), where, "model"))
            for fname, reason in feature_problems:
                errors.append(Problem(src, reason, line_of(item, (fname.split(".")[0],)), where, fname))
            for fname, reason in self._capability_problems(spec, platforms, feats):
                errors.append(Problem(src, reason, line_of(item, (fname,)), where, fname))
            fit_notes += [Problem(src, why, line_of(item, ()), where, "memory")
                          for why in self._fit_notes(spec, platforms)]
            for row in rows(entry):
                if row.test_id in first_seen:
                    errors.append(Problem(src, f"duplicate test id{'' if row is entry else ' ' + row.test_id} "
                                               f"(first at {first_seen[row.test_id]})",
                                          line_of(item, ()), where))
                    continue
                first_seen[row.test_id] = row.source
                entries.append(row)
        if not tests and isinstance(raw.get("tests", []), list):
            errors.append(Problem(file, "the list has no tests (give 'tests' or 'include')", 1, None, "tests"))

        waivers = self._waivers(raw, file, errors)
        cases = [(e.test_id, p) for e in entries for p in platforms]
        warnings = fit_notes + self._waiver_warnings(waivers, cases)
        if errors or header is None:
            return None, errors, warnings
        test_list = TestList(
            name=header.name,
            stage=header.stage,
            description=header.description,
            path=file,
            selector=header.platforms,
            platforms=tuple(sorted(platforms)),
            entries=tuple(entries),
            waivers=tuple(waivers),
        )
        return test_list, errors, warnings

    def waivers_file(
        self, file: Path, lists: Iterable[TestList] | None
    ) -> tuple[list[SourcedWaiver], list[Problem], list[Problem]]:
        """Validate a directory-wide waivers.yml; ``lists`` (None: skip the matches-nothing check)."""
        try:
            raw = read_yaml(file)
        except YamlSyntaxError as exc:
            return [], [Problem(file, exc.reason, exc.line)], []
        if raw is None:
            return [], [], []
        if not isinstance(raw, LineDict):
            return [], [Problem(file, "waivers.yml must be a mapping with a 'waivers' list", 1)], []
        errors: list[Problem] = []
        _, problems = _validate(WaiversHeader, raw, file, raw, None)
        errors += problems
        waivers = self._waivers(raw, file, errors)
        warnings: list[Problem] = []
        if lists is not None:
            cases = [(e.test_id, p) for tl in lists for e in tl.entries for p in tl.platforms]
            warnings = self._waiver_warnings(waivers, cases)
        return waivers, errors, warnings


def _entry(list_name: str, spec: TestSpec, source: str, feats: Features = PLAIN) -> TestEntry:
    assert spec.precision is not None  # filled in from the catalog (row_precision) before
    return TestEntry(
        list_name=list_name,
        model=spec.model,
        precision=spec.precision,
        max_seq_len=spec.max_seq_len,
        max_batch_size=spec.max_batch_size,
        max_input_len=spec.max_input_len,
        stages=tuple(spec.stages),
        timeouts=spec.timeouts(),
        lm_head_precision=spec.lm_head_precision,
        kv_cache_precision=spec.kv_cache_precision,
        case=spec.case,
        source=source,
        features=feats,
    )
