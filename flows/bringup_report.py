"""A bring-up's report, in the shape the field asks for: the checkpoint's revision, the route each platform's
engine took, the hardware it ran on, the weight reconciliation per toolchain, every rung with its status and
evidence, and the gaps (what was not proven, and why). ``report.json`` (schema ``edgefarm.bringup/1``) and
``report.md`` (the same, for people; every value escaped) are written atomically into the report directory."""

from __future__ import annotations

import json
import os
import platform as host_platform
import shutil
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgefarm.pages.docs_render import write_atomic
from edgefarm.pages.escape import markdown_text
from edgefarm.results.models import ResultStatus
from edgefarm.tasks.bringup import LAYERS_DIR, RUNG_FILES, RUNGS, Rung
from edgellm.errors import ConfigurationError
from edgellm.reference import checkpoint_digest, checkpoint_revision

if TYPE_CHECKING:
    from edgefarm.flows.bringup import Request

SCHEMA = "edgefarm.bringup/1"
# every name the ladder writes in its report directory (rungs 1-6, then the report)
EVIDENCE_FILES = (*RUNG_FILES, "report.json", "report.md")
EXIT_PASSED, EXIT_FAILED = 0, 1  # bad input: 2 (ConfigurationError, before any rung)
_SHOWN = {ResultStatus.PASS: "✓ pass", ResultStatus.FAIL: "✗ fail", ResultStatus.ERROR: "✗ error",
          ResultStatus.NOT_APPLICABLE: "– not applicable", ResultStatus.SKIPPED: "· not climbed"}


def build_report(req: Request, climbed: list[Rung], run_id: int, run_page: Path,
                 fit: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``fit``: per platform, the engine's estimated memory against its device type's usable memory
    (``flows.bringup_fit.memory_fit``)."""
    stopped = next((r for r in climbed if r.stops), None)
    by_name = {r.name: r for r in climbed}
    config = json.loads((req.checkpoint / "config.json").read_text(encoding="utf-8"))
    pipeline = by_name.get("pipeline")
    rows = (pipeline.evidence.get("rows") if pipeline is not None else None) or []
    return {
        "schema": SCHEMA,
        "result": "failed" if stopped is not None else "passed",
        "exit_code": EXIT_FAILED if stopped is not None else EXIT_PASSED,
        "stopped_at": None if stopped is None else {"rung": RUNGS.index(stopped.name) + 1, "name": stopped.name,
                                                    "reason": stopped.reason},
        "checkpoint": {"path": str(req.checkpoint), "sha256": checkpoint_digest(req.checkpoint),
                       "revision": checkpoint_revision(req.checkpoint), "model_type": config.get("model_type"),
                       "architectures": config.get("architectures") or []},
        "model": req.source.name,
        "platforms": list(req.platforms),
        "layers": req.layers,
        "run_id": run_id,
        "run_page": str(run_page),
        "route": _routes(rows),
        "hardware": _hardware(req, rows),
        "memory_fit": fit or [],
        "registries": _registries(by_name.get("registry")),
        "reconciliation": _reconciliation(by_name.get("reconciliation")),
        "rungs": [r.to_json() for r in climbed],
        "gaps": _gaps(climbed),
    }


def clear_planted(report_dir: Path) -> None:
    """Before any rung, every name the ladder writes in ``report_dir`` is removed: a link or node someone planted
    (unlinked, never followed) and a previous ladder's files and ``layers/``, so the directory holds only this
    ladder's evidence; a directory where a file goes is refused (exit 2). The evidence is then written to fresh
    files (``tasks.bringup``)."""
    for name in (*EVIDENCE_FILES, LAYERS_DIR):
        path = report_dir / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode) and name == LAYERS_DIR:
            shutil.rmtree(path)  # a previous ladder's work; links inside are removed, not followed
        elif stat.S_ISDIR(st.st_mode):
            raise ConfigurationError(f"--report {report_dir}: {name} is a directory; the bring-up writes a file "
                                     f"there: remove it or give another --report")
        else:
            path.unlink()


def write_report(req: Request, climbed: list[Rung], run_id: int, run_page: Path,
                 fit: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    report = build_report(req, climbed, run_id, run_page, fit)
    report["report_dir"] = str(req.report_dir.resolve())
    write_atomic(req.report_dir / "report.json", json.dumps(report, indent=1, sort_keys=True, default=str) + "\n")
    write_atomic(req.report_dir / "report.md", render_markdown(report))
    return report


def _routes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        st = row.get("stages") or {}
        build = st.get("build") or {}
        if row["decision"] != "run":
            route = None
        elif not build:
            route = "export only"
        else:
            route = "checkpoint-direct" if build.get("route") == "direct" else "ONNX"
        out.append({"platform": row["platform"], "precision": row["precision"], "toolchain": row["toolchain"],
                    "route": route, "decision": row["decision"]})
    return out


def _hardware(req: Request, rows: list[dict[str, Any]]) -> dict[str, Any]:
    devices: dict[str, list[str]] = {}
    for row in rows:
        for stage in (row.get("stages") or {}).values():
            if stage.get("device"):
                devices.setdefault(row["platform"], [])
                if stage["device"] not in devices[row["platform"]]:
                    devices[row["platform"]].append(stage["device"])
    standin = sorted({row["platform"] for row in rows for s in (row.get("stages") or {}).values() if s.get("standin")})
    return {"host": {"machine": host_platform.machine(), "system": host_platform.system(), "cpus": os.cpu_count(),
                     "python": sys.version.split()[0]},
            "devices": devices, "standin_platforms": standin}


def _registries(rung: Rung | None) -> dict[str, Any]:
    """What each toolchain's own registry does with the model_type (registered, its default model, or refused); an
    adviser's (a toolchain of no requested platform) marked ``advice``."""
    if rung is None:
        return {}
    out = {}
    advice = {n: f for n, f in (rung.evidence.get("advice") or {}).items() if f.get("offered")}
    for name, found in [*(rung.evidence.get("toolchains") or {}).items(), *advice.items()]:
        if found.get("offered"):
            out[name] = {"offered": True, "advice": bool(found.get("advice")), "ok": found.get("ok"),
                         **{k: found.get(k) for k in ("toolchain_version", "model_type", "status", "model_class",
                                                       "layout_family", "reason")}}
        else:
            out[name] = {"offered": False}
    return out


def _reconciliation(rung: Rung | None) -> dict[str, Any]:
    """Each toolchain's reconciliation; an adviser's (a toolchain of no requested platform) marked ``advice``."""
    if rung is None:
        return {}
    out = {}
    advice = {n: f for n, f in (rung.evidence.get("advice") or {}).items() if f.get("offered")}
    for name, found in [*(rung.evidence.get("toolchains") or {}).items(), *advice.items()]:
        if not found.get("offered"):
            out[name] = {"offered": False}
            continue
        out[name] = {"offered": True, "advice": bool(found.get("advice")), "ok": found.get("ok"),
                     "model": found.get("model"),
                     "expected": found.get("expected"), "matched": found.get("matched"),
                     "missing": sorted(found.get("missing") or {}), "unexpected": found.get("unexpected") or [],
                     "shape_mismatches": found.get("shape_mismatches") or [], "problems": found.get("problems") or []}
    return out


def _gaps(climbed: list[Rung]) -> list[str]:
    gaps: list[str] = []
    for rung in climbed:
        if rung.status is ResultStatus.NOT_APPLICABLE:
            gaps.append(f"{rung.name}: {rung.reason}")
        for name, found in (rung.evidence.get("toolchains") or {}).items():
            if not found.get("offered"):
                gaps.append(f"{rung.name}: {name} offers no such check")
        for name, found in (rung.evidence.get("advice") or {}).items():
            if str(found.get("reason") or "").startswith("not usable here"):
                gaps.append(f"{rung.name}: no advice from {name} ({found['reason']})")
        for name in (rung.evidence.get("structural") or {}):
            gaps.append(f"few_layers: {name}'s few-layer export checked structurally only (numerics need its device)")
        gaps += [f"pipeline: {g}" for g in rung.evidence.get("gaps") or []]
    if any(r.status is ResultStatus.SKIPPED for r in climbed):
        gaps.append("rungs after the one that failed were not climbed")
    return gaps


def render_markdown(report: dict[str, Any]) -> str:
    t = markdown_text
    ck = report["checkpoint"]
    stopped = report["stopped_at"]
    verdict = ("**Passed**: every rung climbed." if stopped is None else
               f"**Failed** at rung {stopped['rung']} ({t(stopped['name'])}): {t(stopped['reason'])}")
    lines = [f"# Bring-up of {t(report['model'])}", "", verdict, "",
             f"- checkpoint: `{t(ck['path'])}`", f"- sha256: `{ck['sha256']}`",
             f"- revision: {t(ck['revision'] or 'none recorded')}", f"- model_type: {t(ck['model_type'])}",
             f"- platforms: {t(', '.join(report['platforms']))}; few-layer test: {report['layers']} layer(s)",
             f"- run: {report['run_id']} ([run page]({_link(report['run_page'], report.get('report_dir'))}))", "",
             "## Rungs", "", "| # | Rung | Status | Seconds | Reason |", "|---|---|---|---|---|"]
    for i, rung in enumerate(report["rungs"], start=1):
        lines.append(f"| {i} | {t(rung['title'])} | {_SHOWN[ResultStatus(rung['status'])]} | "
                     f"{rung['duration_s']:.1f} | {t(rung['reason'] or '')} |")
    lines += ["", "## Route", "", "| Platform | Precision | Toolchain | Route |", "|---|---|---|---|"]
    for r in report["route"]:
        lines.append(f"| {t(r['platform'])} | {t(r['precision'])} | {t(r['toolchain'])} | "
                     f"{t(r['route'] or r['decision'])} |")
    lines += ["", "## Memory fit", "",
              "| Platform | Toolchain | Precision | Estimate GB | Usable GB (of total) | Fits |",
              "|---|---|---|---|---|---|"]
    for f in report.get("memory_fit") or []:
        fits = {True: "✓ fits", False: "✗ does not fit", None: "not sized"}[f["fits"]]
        estimate = "-" if f["estimate_gb"] is None else f"{f['estimate_gb']:.2f}"
        lines.append(f"| {t(f['platform'])} | {t(f['toolchain'])} | {t(f['precision'])} | {estimate} | "
                     f"{f['usable_gb']:g} of {f['memory_gb']:g} | {fits}: {t(f['reason'])} |")
    hw = report["hardware"]
    lines += ["", "## Hardware", "", f"- host: {t(hw['host']['machine'])} {t(hw['host']['system'])}, "
              f"{hw['host']['cpus']} CPUs, Python {t(hw['host']['python'])}"]
    lines += [f"- {t(p)}: {t(', '.join(ids))}" for p, ids in sorted(hw["devices"].items())]
    if hw["standin_platforms"]:
        lines.append(f"- stand-in tools on: {t(', '.join(hw['standin_platforms']))} (never evidence of support)")
    lines += ["", "## Registries", "", "| Toolchain | Version | model_type | Status | Class | Why |",
              "|---|---|---|---|---|---|"]
    for name, reg in sorted((report.get("registries") or {}).items()):
        if not reg["offered"]:
            lines.append(f"| {t(name)} | | | not offered | | |")
            continue
        shown = f"{name} (advice)" if reg.get("advice") else name
        lines.append(f"| {t(shown)} | {t(reg['toolchain_version'] or '')} | {t(reg['model_type'] or '')} | "
                     f"{t(reg['status'] or '')}{'' if reg['ok'] else ' ✗'} | {t(reg['model_class'] or '-')} | "
                     f"{t(reg['reason'] or '')} |")
    lines += ["", "## Reconciliation", "", "| Toolchain | Model | Matched | Missing | Unexpected | Problems |",
              "|---|---|---|---|---|---|"]
    for name, rec in sorted(report["reconciliation"].items()):
        if not rec["offered"]:
            lines.append(f"| {t(name)} | not offered | | | | |")
            continue
        shown = f"{name} (advice)" if rec.get("advice") else name
        lines.append(f"| {t(shown)} | {t(rec['model'])} | {rec['matched']}/{rec['expected']} | "
                     f"{t(', '.join(rec['missing']) or '-')} | {t(', '.join(rec['unexpected']) or '-')} | "
                     f"{t('; '.join(rec['problems']) or '-')} |")
    lines += ["", "## Gaps", ""] + ([f"- {t(g)}" for g in report["gaps"]] or ["- none"])
    lines += ["", f"Evidence files (this directory): {', '.join(_files(report))}", ""]
    return "\n".join(lines)


def _link(target: str, report_dir: str | None) -> str:
    """``target`` relative to the report directory (the two move together inside a data dir), URL-quoted."""
    from urllib.parse import quote

    return quote(os.path.relpath(target, report_dir) if report_dir else target)


def _files(report: dict[str, Any]) -> list[str]:
    found = ["report.json"]
    for rung in report["rungs"]:
        ev = rung["evidence"]
        if isinstance(ev.get("file"), str):
            found.append(ev["file"])
        numeric = ev.get("numeric")
        if isinstance(numeric, dict) and isinstance(numeric.get("file"), str):
            found.append(numeric["file"])
    return [markdown_text(f) for f in found]

