"""``--junit FILE`` of ``edgefarm run`` and ``nightly``: the run as JUnit XML (pytest's ``--junitxml``, read by every
CI system): one test suite per run, one test case per row and stage (``classname`` the row, ``name`` the stage);
a failed row's failing stage carries its root cause, an errored one an ``<error>``, a stage that did not run
``<skipped>`` with why."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from edgefarm.cli.text import visible
from edgellm.files import write_text_atomic

FAILED = ("fail",)
ERRORED = ("error",)
NOT_RUN = ("skipped", "not_applicable", "waived")
MESSAGE_CHARS = 1000


def _text(value: object, limit: int = MESSAGE_CHARS) -> str:
    text = visible(value)  # no control character: XML 1.0 has no way to carry most of them
    return text if len(text) <= limit else text[:limit - 1] + "…"


def junit_xml(result: Mapping[str, Any], suite: str) -> str:
    cases = result.get("results") or []
    causes = {(f["row"], f["stage"]): f for f in result.get("failures") or []}
    tally = {"tests": len(cases), "failures": sum(c["status"] in FAILED for c in cases),
             "errors": sum(c["status"] in ERRORED for c in cases),
             "skipped": sum(c["status"] in NOT_RUN for c in cases)}
    total = sum(float(c.get("duration_s") or 0.0) for c in cases)
    root = ET.Element("testsuites", {k: str(v) for k, v in tally.items()} | {"time": f"{total:.3f}"})
    node = ET.SubElement(root, "testsuite", {"name": _text(f"{suite} run {result.get('run_id')}", 200)}
                         | {k: str(v) for k, v in tally.items()} | {"time": f"{total:.3f}"})
    for c in cases:
        case = ET.SubElement(node, "testcase", {"classname": _text(c["row"], 300), "name": _text(c["stage"], 100),
                                                "time": f"{float(c.get('duration_s') or 0.0):.3f}"})
        cause = causes.get((c["row"], c["stage"]))
        reason = (cause or c).get("reason") or ""
        where = f" on {c['device']}" if c.get("device") else ""
        if c["status"] in FAILED + ERRORED:
            tag = "failure" if c["status"] in FAILED else "error"
            kind = f" ({cause['error_kind']})" if cause and cause.get("error_kind") else ""
            head = "root cause: " if cause else ""
            el = ET.SubElement(case, tag, {"message": _text(f"{head}{c['stage']} {c['status']}{kind}{where}: "
                                                            f"{reason}"), "type": c["status"]})
            logs = (cause or {}).get("logs") or []
            el.text = _text("\n".join([reason, *(f"{'evidence' if x.startswith('report:') else 'log'}: edgefarm "
                                                  f"show {x}" for x in logs)]), 20_000)
        elif c["status"] in NOT_RUN:
            ET.SubElement(case, "skipped", {"message": _text(f"{c['status']}: {reason}" if reason else c["status"])})
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(result: Mapping[str, Any], path: Path, suite: str) -> None:
    write_text_atomic(path, junit_xml(result, suite))
