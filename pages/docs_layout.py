"""A toolchain's own page layouts (``toolchains.base.DocsLayout``: the toolchain names its product, its pages'
directory and its runtime SDK), generated from evidence only: ``<directory>/supported-models.md`` and
``<directory>/support-matrix.md`` under the docs output dir.

The layout: supported-models lists checkpoint ids per family in ``<details>`` blocks (a ``model_type`` line,
**Original:** and **Pre-quantized:** bullet lists, Hugging Face links) and the speculative drafts in
``| Draft checkpoint | Base model |`` tables; support-matrix has one ``## Platforms`` table of 7 columns. Here a
checkpoint is listed only where a row of it is L0 covered, checkpoint-direct or implemented (export verified only),
and each id is followed by its evidence, with the status vocabulary of ``results/support.py``; only the rows whose
jobs ran with the layout's toolchain are its evidence. What the toolchain's
pages do not have is marked as an extension: the evidence lines and status columns, sections for LoRA,
reduced-vocabulary, FP8-embedding and multimodal-component rows, and the coverage table.

:func:`write_layout_pages` reads the database; :func:`render_supported_models` and :func:`render_support_matrix`
are pure functions of plain dataclasses. Every name and reason is escaped (``pages.escape``) and scrubbed of hosts
and paths (``pages.docs_render.scrub``).
"""

from __future__ import annotations

import html
import json
import logging
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgefarm.devices.types import Arch, DeviceType
from edgefarm.pages.docs_render import precision_order, row_anchor, scrub, shown_toolchain, write_atomic
from edgefarm.pages.escape import markdown_text, safe_link
from edgefarm.registries import current
from edgefarm.results.db import Db, reading
from edgefarm.results.models import RunKind
from edgefarm.results.pages import device_environments
from edgefarm.results.support import NIGHTLY_PAGE_KINDS, Support, SupportStatus, count_statuses, row_supports
from edgefarm.stages.variant import describe
from edgefarm.toolchains.base import DocsLayout

log = logging.getLogger(__name__)
RUN_PAGE = "../runs/run-{}.md"  # a run's evidence page, from the layout's directory (beside runs/)
NOT_RECORDED = "not recorded"
# model_type -> the family's name on the page, in NVIDIA's order; another model_type shows as itself, after these
FAMILY_NAMES: dict[str, str] = {
    "llama": "Llama",
    "mistral": "Mistral",
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3 MoE",
    "phi3": "Phi-3",
    "gemma3_text": "Gemma3",
}
UNKNOWN_FAMILY = "Other checkpoints"  # no model_type could be read here (a checkpoint absent on this host)
# variant parts (stages/variant.py's keys) whose rows have a section of their own, in order: (part, heading)
FEATURE_SECTIONS: tuple[tuple[str, str], ...] = (
    ("lora", "LoRA Adapters"),
    ("vocab", "Reduced Vocabulary"),
    ("fp8emb", "FP8 Embedding"),
    ("components", "Multimodal Components"),
)
EAGLE3_DRAFT = "eagle3-draft"
_HF_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}\Z")
_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=:-]*\Z")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


@dataclass(frozen=True)
class Evidence:
    """One row's support status, as the pages show it."""

    model: str
    precision: str
    platform: str
    support: Support
    toolchain: str | None = None  # the toolchain its jobs ran with
    made_by: str | None = None  # "name version" of what made its latest evidence
    variant: str = ""  # stages/variant.py's key; '' = default
    chosen_versions: str | None = None
    anchor: str | None = None  # its section on its latest run's evidence page


@dataclass(frozen=True)
class CheckpointInfo:
    name: str
    model_type: str | None = None  # None: not readable here
    prequantized: str | None = None  # the precision a pre-quantized checkpoint carries; None: float
    base: str | None = None  # the float model it was quantized from


@dataclass(frozen=True)
class PlatformInfo:
    name: str
    description: str
    level: str
    os_sdk: str = NOT_RECORDED
    cuda: str = NOT_RECORDED
    sdk: str = NOT_RECORDED  # the layout's runtime SDK version
    build_location: str = "Device"
    precision_constraint: str = ""
    precisions: tuple[str, ...] = ()
    environment_run: int | None = None  # the run whose device environment gave OS / CUDA / the SDK


# --- rendering ---------------------------------------------------------------------------------------------------
def checkpoint_id(name: str) -> str:
    """A Hugging Face id (``org/name``) as a link to its model page; a local catalog name as code; anything else as
    escaped text."""
    if _HF_ID.match(name) and ".." not in name:
        return f"[{markdown_text(name)}](https://huggingface.co/{name})"
    if _PLAIN.match(name):
        return f"`{name}`"
    return markdown_text(name)


def _code(name: str) -> str:
    return f"`{name}`" if _PLAIN.match(name) else markdown_text(name)


def _html_text(value: str) -> str:
    """Text inside an HTML block on one line (an HTML block ends at a blank line): escaped, with brackets and
    schemes as entities so that no renderer makes a link of it."""
    text = html.escape(" ".join(_CONTROL.sub(" ", value).split()))
    return text.replace("[", "&#91;").replace("]", "&#93;").replace("://", "&#58;//")


def variant_parts(key: str) -> dict[str, str]:
    """A variant key's parts by name (``spec=eagle3-draft:BASE`` -> {"spec": "eagle3-draft:BASE"}; a flag part
    such as ``fp8emb`` -> {"fp8emb": ""})."""
    out = {}
    for part in filter(None, key.split(";")):
        name, _, value = part.partition("=")
        out[name] = value
    return out


def draft_base(key: str) -> str | None:
    """The base model of an EAGLE3 draft row (``spec=eagle3-draft:BASE``); None for another row."""
    method, _, pair = variant_parts(key).get("spec", "").partition(":")
    return pair if method == EAGLE3_DRAFT and pair else None


def section_of(ev: Evidence) -> str:
    """Where a row is shown: ``draft`` (the EAGLE3 table), a FEATURE_SECTIONS part, else ``family``."""
    if draft_base(ev.variant) is not None:
        return "draft"
    parts = variant_parts(ev.variant)
    return next((part for part, _ in FEATURE_SECTIONS if part in parts), "family")


def _precision(ev: Evidence) -> str:
    text = markdown_text(ev.precision.upper())
    return f"{text} ({markdown_text(describe(ev.variant))})" if ev.variant else text


def status_text(support: Support, anchor: str | None = None) -> str:
    """``<mark> <label>`` with what the status carries: the run (a link to its evidence page, at ``anchor``), since
    when it fails and why, until when it is waived and its bug."""
    s = support
    out = s.status.display
    at = f"#{anchor}" if anchor else ""
    run = f"[run {s.run_id}]({RUN_PAGE.format(s.run_id)}{at})" if s.run_id is not None else None
    if s.status is SupportStatus.FAILING:
        since = f" since run {s.since_run}" if s.since_run is not None else ""
        out += f"{since} (latest {run})" if run else since
    elif s.status is SupportStatus.WAIVED:
        if s.until is not None:
            out += f" until {s.until.isoformat()}"
        if s.link is not None:
            out += f", [bug]({s.link})" if safe_link(s.link) else f", bug {markdown_text(s.link)}"
        elif s.reason:
            out += f": {markdown_text(s.reason)}"
        return out
    elif run:
        out += f" ({run})"
    if s.reason and s.status is not SupportStatus.WAIVED:
        out += f": {markdown_text(s.reason)}"
    return out


def evidence_line(ev: Evidence) -> str:
    """One evidence bullet: platform, precision (and variant), toolchain, status."""
    by = f", {markdown_text(ev.made_by)}" if ev.made_by and ev.support.status.listed else ""
    versions = f" [{markdown_text(ev.chosen_versions)}]" if ev.chosen_versions else ""
    return f"{_code(ev.platform)} {_precision(ev)}{versions}{by}: {status_text(ev.support, ev.anchor)}"


def _shown(rows: Iterable[Evidence]) -> list[Evidence]:
    """The rows shown after a listed checkpoint: all but the not-applicable and never-tested ones, ordered."""
    order = {p: i for i, p in enumerate(precision_order(r.precision for r in rows))}
    kept = [r for r in rows if r.support.status not in (SupportStatus.NOT_APPLICABLE, SupportStatus.NEVER_TESTED)]
    return sorted(kept, key=lambda r: (r.platform, order.get(r.precision, 0), r.variant, r.toolchain or "",
                                       r.chosen_versions or ""))


def _listed(rows: Iterable[Evidence]) -> bool:
    return any(r.support.status.listed for r in rows)


def legend_lines() -> list[str]:
    return [f"- {s.display}{'' if s.display.startswith(s.mark) else f' ({s.mark})'}: {s.meaning}"
            for s in SupportStatus]


def _family_key(model_type: str | None) -> tuple[int, str]:
    names = list(FAMILY_NAMES)
    if model_type is None:
        return (len(names) + 1, "")
    return (names.index(model_type), "") if model_type in FAMILY_NAMES else (len(names), model_type)


def _checkpoint_block(name: str, info: CheckpointInfo, rows: Sequence[Evidence]) -> list[str]:
    note = ""
    if info.prequantized:
        base = f" of {checkpoint_id(info.base)}" if info.base else ""
        note = f" ({markdown_text(info.prequantized.upper())} checkpoint{base})"
    return [f"- {checkpoint_id(name)}{note}", *(f"  - {evidence_line(r)}" for r in _shown(rows))]


def render_supported_models(evidence: Sequence[Evidence], checkpoints: Mapping[str, CheckpointInfo], *,
                            generated_at: str, db_label: str, layout: DocsLayout) -> str:
    """supported-models.md in the toolchain's layout, from evidence rows and what is known of each checkpoint
    (``checkpoints``: by model name; a model missing there is a float checkpoint of unknown family)."""
    by_section: dict[str, dict[str, list[Evidence]]] = defaultdict(lambda: defaultdict(list))
    for ev in evidence:
        by_section[section_of(ev)][ev.model].append(ev)
    lines = [
        "# Supported Models",
        "",
        f"Generated {markdown_text(generated_at)} from the results database ({markdown_text(db_label)}) by "
        "edgellm-farm; do not edit by hand. See the [support matrix](support-matrix.md) for platform coverage.",
        "",
        "A checkpoint is listed only where the farm's evidence shows one of its rows L0 covered, checkpoint-direct or "
        "implemented (export verified only); each id is followed by its evidence per platform and precision "
        f"(extension: {markdown_text(layout.product)}'s page lists ids only).",
        "",
        "## Evidence Legend (extension)",
        "",
        *legend_lines(),
        "",
        "## Text Generation",
        "",
    ]
    families: dict[str | None, list[str]] = defaultdict(list)
    for name, rows in by_section["family"].items():
        if _listed(rows):
            families[checkpoints.get(name, CheckpointInfo(name)).model_type].append(name)
    if not families:
        lines += ["No checkpoint has passing or export evidence yet.", ""]
    for model_type in sorted(families, key=_family_key):
        title = UNKNOWN_FAMILY if model_type is None else FAMILY_NAMES.get(model_type, model_type)
        lines += ["<details>", f"<summary><b>{_html_text(title)}</b></summary>", ""]
        lines += [f"`model_type: {model_type}`" if model_type and _PLAIN.match(model_type)
                  else f"model_type: {markdown_text(model_type or NOT_RECORDED)}", ""]
        names = sorted(families[model_type])
        for heading, prequantized in (("**Original:**", False), ("**Pre-quantized:**", True)):
            group = [n for n in names if bool(checkpoints.get(n, CheckpointInfo(n)).prequantized) is prequantized]
            if not group:
                continue
            lines += [heading, ""]
            for name in group:
                lines += _checkpoint_block(name, checkpoints.get(name, CheckpointInfo(name)),
                                           by_section["family"][name])
            lines.append("")
        lines += ["</details>", ""]
    lines += _draft_section(by_section["draft"])
    for part, heading in FEATURE_SECTIONS:
        lines += _feature_section(heading, by_section[part])
    return "\n".join(lines).rstrip("\n") + "\n"


def _draft_section(drafts: Mapping[str, list[Evidence]]) -> list[str]:
    lines = ["## Speculative Draft Checkpoints", "", "### EAGLE3 Draft Models", ""]
    pairs: dict[tuple[str, str], list[Evidence]] = defaultdict(list)
    for rows in drafts.values():
        for r in rows:
            pairs[(r.model, draft_base(r.variant) or "")].append(r)
    shown = {pair: rows for pair, rows in sorted(pairs.items()) if _listed(rows)}
    if not shown:
        return [*lines, "No EAGLE3 draft has passing or export evidence yet.", ""]
    lines += ["| Draft checkpoint | Base model | Evidence (extension) |", "|---|---|---|"]
    for (draft, base), rows in shown.items():
        for r in _shown(rows):
            line = replace(r, variant="")  # the pair is in the first two columns
            lines.append(f"| {checkpoint_id(draft)} | {checkpoint_id(base)} | {evidence_line(line)} |")
    return [*lines, ""]


def _feature_section(heading: str, rows_by_model: Mapping[str, list[Evidence]]) -> list[str]:
    """Rows of a feature NVIDIA's page has no section for: one table row per evidence row of each listed
    (checkpoint, variant)."""
    entries: dict[tuple[str, str], list[Evidence]] = defaultdict(list)
    for rows in rows_by_model.values():
        for r in rows:
            entries[(r.model, r.variant)].append(r)
    shown = {k: rows for k, rows in sorted(entries.items()) if _listed(rows)}
    if not shown:
        return []
    lines = [f"## {heading} (extension)", "", "| Checkpoint | Variant | Evidence |", "|---|---|---|"]
    for (model, variant), rows in shown.items():
        for r in _shown(rows):
            lines.append(f"| {checkpoint_id(model)} | {markdown_text(describe(variant))} | "
                         f"{evidence_line(replace(r, variant=''))} |")
    return [*lines, ""]


def coverage(platforms: Sequence[PlatformInfo], evidence: Sequence[Evidence]) -> dict[str, dict[SupportStatus, int]]:
    """Per platform, the number of rows per status. A (model, precision, variant) with evidence on some platform
    but no row on this one counts as never tested there, or as not applicable where the platform's device type
    lists no such precision."""
    statuses: dict[str, list[SupportStatus]] = {p.name: [] for p in platforms}
    tested: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for ev in evidence:
        statuses.setdefault(ev.platform, []).append(ev.support.status)
        tested[ev.platform].add((ev.model, ev.precision, ev.variant))
    universe = set().union(*tested.values()) if tested else set()
    known = {p.name: p for p in platforms}
    for name, found in statuses.items():
        info = known.get(name)
        for _, precision, _ in universe - tested[name]:
            fits = info is None or not info.precisions or precision in info.precisions
            found.append(SupportStatus.NEVER_TESTED if fits else SupportStatus.NOT_APPLICABLE)
    return {name: count_statuses(found) for name, found in statuses.items()}


def render_support_matrix(platforms: Sequence[PlatformInfo], evidence: Sequence[Evidence], *, generated_at: str,
                          db_label: str, layout: DocsLayout) -> str:
    """support-matrix.md in the toolchain's layout: ``## Platforms`` with its 7 columns, one row per
    device type, then the coverage of each platform by status (extension)."""
    lines = [
        "# Support Matrix",
        "",
        f"Generated {markdown_text(generated_at)} from the results database ({markdown_text(db_label)}) by "
        "edgellm-farm; do not edit by hand. See [Supported Models](supported-models.md) for checkpoint ids.",
        "",
        "## Platforms",
        "",
        f"| Platform | Level | OS / SDK | CUDA Toolkit | {markdown_text(layout.sdk_column)} | Build location | "
        "Precision constraint |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in platforms:
        cells = (f"{markdown_text(p.description)} ({_code(p.name)})", p.level, p.os_sdk, p.cuda, p.sdk,
                 p.build_location, p.precision_constraint)
        lines.append("| " + " | ".join(markdown_text(c) if i else c for i, c in enumerate(cells)) + " |")
    recorded = [f"{_code(p.name)} (run {p.environment_run})" for p in platforms if p.environment_run is not None]
    lines += [
        "",
        f"`Official`: {markdown_text(layout.official)}. `Developer`: an x86-64 machine (a discrete GPU or the CPU), "
        f"for development and validation. OS / SDK, CUDA Toolkit and {markdown_text(layout.sdk_column)} are what "
        "the latest device environment recorded on the "
        f"platform reported ({', '.join(recorded) if recorded else 'none recorded yet'}); precision constraint: the "
        "precisions its device type declares.",
        "",
        "## Coverage from evidence (extension)",
        "",
        f"Rows (model, precision, variant, toolchain) per status in their latest nightly run, counting only the rows "
        f"{markdown_text(layout.product)} ran ({_code(layout.toolchain)}): a platform it never runs on shows none "
        "here, whatever other toolchains proved there (the farm's own [support matrix](../support-matrix.html) shows "
        "every toolchain's rows).",
        "",
        "| Platform | " + " | ".join(s.display for s in SupportStatus) + " |",
        "|---|" + "---:|" * len(SupportStatus),
    ]
    for name, per in coverage(platforms, evidence).items():
        lines.append(f"| {_code(name)} | " + " | ".join(str(per[s]) for s in SupportStatus) + " |")
    return "\n".join(lines) + "\n"


# --- from the database -------------------------------------------------------------------------------------------
def collect_evidence(db: Db, data_dir: Path | None = None, toolchain: str | None = None,
                     kinds: Collection[RunKind | str] | None = NIGHTLY_PAGE_KINDS) -> list[Evidence]:
    """Every row's support status in its latest nightly-page run (``results.support.NIGHTLY_PAGE_KINDS``; reasons
    scrubbed of hosts and paths); ``toolchain``: only the rows whose jobs ran with it (a toolchain's own pages never
    list what another toolchain proved)."""
    out = []
    for st, support in row_supports(db, kinds=kinds, toolchain=toolchain):
        support = replace(support, reason=scrub(support.reason, data_dir))
        made_by = " ".join(x for x in (st.toolchain, st.toolchain_version) if x) or None
        out.append(Evidence(model=st.key.model, precision=str(st.key.precision), platform=st.key.platform,
                            support=support, toolchain=str(st.key.toolchain), made_by=made_by,
                            variant=st.key.variant, chosen_versions=st.chosen_versions,
                            anchor=row_anchor(st.key.model, str(st.key.precision), st.key.platform,
                                              st.chosen_versions, shown_toolchain(st.key.platform, st.key.toolchain),
                                              st.key.variant)))
    return out


def _model_type_of(path: Path) -> str | None:
    try:
        found = json.loads((path / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and found else None


def checkpoint_info(names: Iterable[str], data_dir: Path | None = None) -> dict[str, CheckpointInfo]:
    """What the catalog knows of each model without materializing a checkpoint: its model_type (a synthetic model's
    family's, a bundled or path checkpoint's config.json where it is here, a pre-quantized one's base's) and whether
    its checkpoint is already quantized. A model outside the catalog: name only."""
    from edgefarm.test_lists.catalog import Catalog, ModelSource
    from edgellm.errors import EdgeLLMError
    from edgellm.models.base import family_named

    catalog = Catalog.load()

    def model_type(src: ModelSource) -> str | None:
        if src.kind == "synth_quant":
            return model_type(src.base) if src.base is not None else None
        if src.kind == "synthetic":
            try:
                return str(family_named(src.spec["family"]).model_types[0])
            except EdgeLLMError:
                return str(src.spec["family"])
        try:
            return _model_type_of(src.locate(data_dir or Path(".")))  # bundled and path: never materialized
        except EdgeLLMError:
            return None

    out = {}
    for name in sorted(set(names)):
        if name not in catalog:
            out[name] = CheckpointInfo(name)
            continue
        src = catalog.get(name)
        try:
            carried = src.checkpoint_precision()
        except EdgeLLMError as exc:
            log.info("no quantization read for %s: %s", name, exc)
            carried = None
        out[name] = CheckpointInfo(name, model_type(src), str(carried) if carried is not None else None,
                                   src.base.name if src.base is not None and carried is not None else None)
    return out


def level(dtype: DeviceType) -> str:
    """Official for a Jetson (aarch64 with a GPU: what edge toolchains are released for), Developer for an x86-64
    machine (a discrete GPU or the CPU), as the vendor's own matrix rates x86-64 Linux GPUs."""
    return "Official" if dtype.arch is Arch.AARCH64 and dtype.sm is not None else "Developer"


def _version(value: Any) -> str | None:
    if isinstance(value, Mapping):
        value = value.get("version")
    return str(value) if value else None


def environment_cells(data: Mapping[str, Any], layout: DocsLayout) -> tuple[str, str, str]:
    """OS / SDK, CUDA Toolkit and the layout's SDK of a device environment (``tasks.environment.device_record``)."""
    jetpack, l4t = _version(data.get("jetpack")), None
    if isinstance(data.get("l4t"), Mapping):
        l4t = data["l4t"].get("release")
    if jetpack:
        os_sdk = f"JetPack {jetpack}" + (f" (L4T {l4t})" if l4t else "")
    elif l4t:
        os_sdk = f"L4T {l4t}"
    else:
        os_sdk = " ".join(str(x) for x in (data.get("system"), f"({data['libc']})" if data.get("libc") else None)
                          if x) or NOT_RECORDED
    return (_plain(os_sdk), _plain(_version(data.get("cuda"))), _plain(layout.sdk_version(data)))


_VERSIONISH = re.compile(r"[A-Za-z0-9][A-Za-z0-9 .+~()_-]{0,60}\Z")


def _plain(value: str | None) -> str:
    """A version or release as a device reported it, when it looks like one (names and versions only: never a
    path or host; ``scrub`` would read a 4-part version as an IP address); else not recorded."""
    return value if value and _VERSIONISH.match(value) else NOT_RECORDED


def platform_infos(environments: Mapping[str, tuple[int, Mapping[str, Any]]], layout: DocsLayout,
                   device_types: Mapping[str, DeviceType] | None = None) -> list[PlatformInfo]:
    """One platform per device type (the registries' by default), in NVIDIA's order: Official ones first, then by
    name."""
    out = []
    if device_types is None:
        device_types = current().device_types
    for name, dtype in device_types.items():
        precisions = tuple(str(p) for p in dtype.precisions)
        run, cells = None, (NOT_RECORDED, NOT_RECORDED, NOT_RECORDED)
        if name in environments:
            run, data = environments[name]
            cells = environment_cells(data, layout)
        out.append(PlatformInfo(
            name=name, description=dtype.description, level=level(dtype), os_sdk=cells[0], cuda=cells[1],
            sdk=cells[2], build_location="Device" if dtype.arch is Arch.AARCH64 else "Workstation",
            precision_constraint=", ".join(p.upper() for p in precisions) + " only", precisions=precisions,
            environment_run=run))
    return sorted(out, key=lambda p: (p.level != "Official", p.name))


def write_layout_pages(engine_or_session: Db, out_dir: Path, layout: DocsLayout, *, generated_at: str,
                       db_label: str, data_dir: Path | None,
                       kinds: Collection[RunKind | str] | None = NIGHTLY_PAGE_KINDS) -> dict[str, Any]:
    """Write ``<out_dir>/<layout.directory>/supported-models.md`` and ``support-matrix.md`` (``out_dir``: the docs
    output dir, whose ``runs/`` pages they link), from each row's latest run of ``kinds`` (the nightly's pages: the
    nightly-page runs; None: any run)."""
    with reading(engine_or_session) as s:
        evidence = collect_evidence(s, data_dir, layout.toolchain, kinds)
        environments = device_environments(s)
    checkpoints = checkpoint_info({ev.model for ev in evidence} | {b for ev in evidence
                                                                   if (b := draft_base(ev.variant))}, data_dir)
    platforms = platform_infos(environments, layout)
    pages = out_dir / layout.directory
    models = render_supported_models(evidence, checkpoints, generated_at=generated_at, db_label=db_label,
                                     layout=layout)
    write_atomic(pages / "supported-models.md", models)
    write_atomic(pages / "support-matrix.md", render_support_matrix(platforms, evidence, generated_at=generated_at,
                                                                    db_label=db_label, layout=layout))
    return {"pages": [f"{layout.directory}/supported-models.md", f"{layout.directory}/support-matrix.md"],
            "rows": len(evidence), "listed_rows": sum(ev.support.status.listed for ev in evidence)}
