"""Does the checkpoint fit each platform a bring-up asked for: the plan's estimate of its engine
(``devices.memory_fit``, from the model's config alone) against the usable memory of the platform's device type,
stated in the report for every platform, also where the ladder stopped before the pipeline or ran the export alone
(no device: the plan does not refuse a host-only row for its size)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from edgefarm.devices.memory_fit import Sizer, fit_problem, source_group
from edgefarm.registries import current
from edgefarm.tasks.bringup import Rung
from edgefarm.test_lists.catalog import ModelSource
from edgefarm.test_lists.testlist import TestEntry
from edgellm.errors import ConfigurationError


def planned_toolchains(climbed: Iterable[Rung]) -> dict[str, str]:
    """The toolchain the pipeline rung's plan chose per platform (none before the pipeline ran)."""
    rows = next((r.evidence.get("rows") for r in climbed if r.name == "pipeline"), None) or []
    return {row["platform"]: row["toolchain"] for row in rows if row.get("toolchain")}


def memory_fit(pairs: Sequence[tuple[TestEntry, str]], source: ModelSource,
               chosen: dict[str, str]) -> list[dict[str, Any]]:
    """One entry per (row, platform): the estimate (GB), the device type's memory and usable memory, whether it
    fits (None: the config could not be sized here) and why, sized with the toolchain the plan chose there (its
    device type's first before the plan ran)."""
    try:
        config = source.config()
    except ConfigurationError:  # unreadable here: the inventory rung reports why
        config = None
    sizer = Sizer()
    out = []
    for entry, platform in pairs:
        kind = current().device_types[platform]
        toolchain = chosen.get(platform) or kind.toolchains[0]
        found = sizer.size(entry, config, toolchain, platform, source_group(source))
        problem = fit_problem(found, kind)
        if found is None:
            reason = "not sized: the model's config could not be read or describes no decoder the library sizes"
        else:
            reason = problem or (f"needs {found.estimate_gb:.3g} GB; {kind.name} has {kind.usable_memory_gb:g} GB "
                                 "usable")
        out.append({"platform": platform, "toolchain": toolchain, "precision": str(entry.precision),
                    "estimate_gb": None if found is None else found.estimate_gb,
                    "memory_gb": kind.memory_gb, "usable_gb": kind.usable_memory_gb,
                    "fits": None if found is None else problem is None, "reason": reason})
    return out
