"""Issue 37: bring-up states, for every platform it was asked, the engine's estimated memory against the usable
memory of the platform's device type and whether it fits (``report.json``'s ``memory_fit``, ``report.md``'s table),
also for a platform the plan would not refuse (export only) and before the pipeline ran. Fast: no ladder runs here;
tests/test_bringup_flow.py checks the section of a real climb."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefarm.devices.types import DeviceType
from edgefarm.flows.bringup_fit import memory_fit, planned_toolchains
from edgefarm.flows.bringup_report import render_markdown
from edgefarm.registries import current
from edgefarm.results.models import ResultStatus
from edgefarm.tasks.bringup import Rung
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.testlist import TestEntry
from edgellm.types import Precision
from tests.helpers.registries import registries_with

BIG = """\
models:
  site-llama-big:  # ~140M parameters: 0.5 GB of fp32 weights
    synthetic: {family: llama, seed: 0, hidden_size: 1024, intermediate_size: 2816, num_hidden_layers: 12,
                num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 512}
"""


@pytest.fixture
def tiny_cpu() -> Iterator[str]:
    """A CPU board with 0.1 GB usable, stood in for the test and removed after it."""
    base = current().device_types["x86-cpu"].model_dump()
    with registries_with(device_types=[DeviceType(**{**base, "name": "tiny-cpu", "memory_gb": 0.35,
                                                     "os_reserve_gb": 0.25})]):
        yield "tiny-cpu"


def _entry(model: str) -> TestEntry:
    return TestEntry(list_name="bring-up", model=model, precision=Precision.FP32, stages=("export",), timeouts={},
                     source="bring-up of a test", max_seq_len=256, max_batch_size=2, max_input_len=128)


def test_each_platform_gets_estimate_usable_memory_and_whether_it_fits(tiny_cpu: str, tmp_path: Path) -> None:
    (tmp_path / "lab.yml").write_text(BIG)
    big = Catalog.load(tmp_path / "lab.yml").get("site-llama-big")
    fit = memory_fit([(_entry("site-llama-big"), tiny_cpu), (_entry("site-llama-big"), "x86-cpu")], big, {})
    small, large = fit[1], fit[0]
    assert (large["platform"], large["toolchain"], large["precision"]) == ("tiny-cpu", "edgellm-ort", "fp32")
    assert large["fits"] is False and large["estimate_gb"] > 0.5 and large["usable_gb"] == 0.1
    assert large["reason"] == (f"needs {large['estimate_gb']:.1f} GB; tiny-cpu has 0.1 GB usable (0.35 GB less "
                               "0.25 GB for the OS)")
    assert small["fits"] is True and small["usable_gb"] == current().device_types["x86-cpu"].usable_memory_gb
    assert small["reason"].startswith(f"needs {small['estimate_gb']:.3g} GB; x86-cpu has ")


def test_a_config_that_cannot_be_sized_is_said_never_guessed(tmp_path: Path) -> None:
    (tmp_path / "lab.yml").write_text("models:\n  lab-local:\n    path: " + str(tmp_path / "absent") + "\n")
    source = Catalog.load(tmp_path / "lab.yml").get("lab-local")
    [only] = memory_fit([(_entry("lab-local"), "x86-cpu")], source, {})
    assert only["fits"] is None and only["estimate_gb"] is None and only["reason"].startswith("not sized")


def test_the_plan_s_toolchain_is_the_one_sized_and_the_table_is_escaped() -> None:
    rows = [{"platform": "orin", "toolchain": "tensorrt-edgellm"}, {"platform": "x86-cpu", "toolchain": None}]
    climbed = [Rung("inventory", ResultStatus.PASS, "ok"), Rung("pipeline", ResultStatus.PASS, "ok", {"rows": rows})]
    assert planned_toolchains(climbed) == {"orin": "tensorrt-edgellm"}
    assert planned_toolchains(climbed[:1]) == {}
    report = {"model": "m", "checkpoint": {"path": "/c", "sha256": "0" * 64, "revision": None, "model_type": "llama"},
              "stopped_at": None, "platforms": ["x|y"], "layers": 1, "run_id": 1, "run_page": "/r.md",
              "rungs": [], "route": [], "reconciliation": {}, "gaps": [],
              "hardware": {"host": {"machine": "x86_64", "system": "Linux", "cpus": 2, "python": "3.12"},
                           "devices": {}, "standin_platforms": []},
              "memory_fit": [{"platform": "x|y", "toolchain": "<b>t</b>", "precision": "fp32", "estimate_gb": 9.8,
                              "memory_gb": 8.0, "usable_gb": 6.9, "fits": False,
                              "reason": "needs 9.8 GB; x|y has 6.9 GB usable"}]}
    md = render_markdown(report)
    line = next(x for x in md.splitlines() if x.startswith("| x"))
    assert "| \\<b>t\\</b> |" in line and "x|y" not in line  # markup and a cell's bar, escaped
    assert line.endswith("| 9.80 | 6.9 of 8 | ✗ does not fit: needs 9.8 GB; x\\|y has 6.9 GB usable |"), line
