"""A toolchain implements only the parts it takes part in (``toolchains.parts``): its host stages, its device stages,
its environment. Every registered toolchain's parts implement their interfaces, the driver itself carries no stage's
method, and a toolchain of host stages and an environment only (an exporter: no device stage) registers, plans its
host-only rows and is refused, with the reason, for rows that need a device, without any device step asked of it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import Decision, plan_matrix
from edgefarm.test_lists.catalog import Catalog
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.base import Availability, ToolchainDriver, Variant
from edgefarm.toolchains.parts import DeviceStages, HostStages, ToolchainEnvironment
from edgellm.errors import UnsupportedError
from edgellm.types import Precision
from tests.helpers import toy_toolchain
from tests.helpers.registries import registries_with

REPO = Path(__file__).resolve().parents[1]
HOST_ONLY = "host-only-echo"


def test_every_registered_toolchain_is_made_of_parts_that_implement_their_interfaces() -> None:
    for name in toolchains.names():
        found = toolchains.driver(name)
        parts = {HostStages: found.host_stages, DeviceStages: found.device_stages,
                 ToolchainEnvironment: found.environment}
        for interface, part in parts.items():
            assert isinstance(part, interface), (name, interface.__name__)  # the farm's toolchains take part in all
            assert not type(part).__abstractmethods__, (name, sorted(type(part).__abstractmethods__))
            assert part.toolchain is found and part.name == name
        assert found.host() is found.host_stages and found.device() is found.device_stages
        assert found.device_problem() is None


def test_the_driver_answers_who_it_is_and_leaves_each_stage_to_its_part() -> None:
    """No stage's method is the driver's own: each is its part's, and only there."""
    for interface in (HostStages, DeviceStages, ToolchainEnvironment):
        own = {m for m in vars(interface) if callable(getattr(interface, m)) and not m.startswith("__")}
        both = own & set(dir(ToolchainDriver))
        assert own and not both, (interface.__name__, sorted(both))


class _Installed(ToolchainEnvironment):
    def available(self) -> Availability:
        return Availability(True)

    def host_version(self) -> str:
        return toy_toolchain.VERSION


class HostOnlyEcho(ToolchainDriver):
    """The toy's quantize and export, and nothing on a device: no ``DEVICE_STAGES``."""

    name = HOST_ONLY
    HOST_STAGES = toy_toolchain.ToyHostStages
    ENVIRONMENT = _Installed

    def precisions(self) -> tuple[Precision, ...]:
        return (Precision(toy_toolchain.PRECISION),)

    def quantizes(self) -> tuple[Precision, ...]:
        return (Precision(toy_toolchain.PRECISION),)

    def variant_problem(self, variant: Variant) -> str | None:
        return None


def test_a_toolchain_of_host_stages_only_plans_host_rows_and_refuses_device_rows(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "devices" / "local-cpu"),
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    matrix = tmp_path / "m.yml"
    limits = {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32}
    matrix.write_text(yaml.safe_dump({
        "name": "m", "models": ["stories260K"], "precisions": [toy_toolchain.PRECISION], "platforms": ["x86-cpu"],
        "toolchains": [HOST_ONLY], "defaults": {**limits, "stages": ["quantize", "export"]},
        "extra": [{"models": ["stories260K"], "precisions": [toy_toolchain.PRECISION], "platforms": ["x86-cpu"],
                   "toolchains": [HOST_ONLY],  # another row: its own limits
                   "defaults": {**limits, "max_seq_len": 128, "stages": ["quantize", "export", "build"]}}]}))
    with registries_with(toolchains=[HostOnlyEcho], toolchains_on={"x86-cpu": [HOST_ONLY]}):
        found = toolchains.driver(HOST_ONLY)
        assert found.device_stages is None and isinstance(found.host(), toy_toolchain.ToyHostStages)
        with pytest.raises(UnsupportedError, match=f"toolchain {HOST_ONLY} takes part in no device stage"):
            found.device()
        plan = plan_matrix(matrix, load_inventory(inventory, data_dir=tmp_path), Catalog.load(), data_dir=tmp_path)
    jobs = {tuple(j.entry.stages): j for j in plan.jobs}
    host, device = jobs[("quantize", "export")], jobs[("quantize", "export", "build")]
    assert (host.decision, host.toolchain, host.quantizer, host.devices) == (Decision.RUN, HOST_ONLY, HOST_ONLY, ())
    assert (device.decision, device.toolchain) == (Decision.SKIPPED, HOST_ONLY)
    assert f"toolchain {HOST_ONLY} takes part in no device stage (build, infer, accuracy, bench)" in device.reason
