"""The toolchain version recorded is the one read back from the device, never the one planned (issue 24 item 12):
the stand-in boards' tools always report the pinned release, so a driver answering with its plan went unseen. Here
the device's build is another release than the pinned one (chosen by a matrix), and what its CMakeCache.txt says
wins over the inventory."""

from __future__ import annotations

from typing import Any

import pytest

from edgefarm.devices.inventory import Device
from edgefarm.toolchains.tensorrt_edgellm.driver import PINNED_VERSION, TensorrtEdgellm

BUILD = {"build_dir": "/opt/e/build-0.10.0", "trt_package_dir": "/opt/trt", "plugin_path": "/opt/e/p.so"}


def _orin(version: str | None, standin: bool) -> Device:
    block: dict[str, Any] = {**BUILD, "standin": standin}
    if version is not None:
        block["version"] = version
    return Device(id="orin-1", type="orin", work_dir="/w", host="127.0.0.1", toolchains={"tensorrt-edgellm": block})


def _env(read: str | None) -> dict[str, Any]:
    """The agent's facts of the device: the release its build's CMakeCache.txt names."""
    return {"toolchains": {"tensorrt-edgellm": {"builds": {BUILD["build_dir"]: {"version": read} if read else {}}}}}


@pytest.mark.parametrize("standin", [False, True])
def test_a_chosen_release_is_recorded_as_the_device_has_it_not_as_pinned(standin: bool) -> None:
    assert PINNED_VERSION != "0.10.0"
    driver = TensorrtEdgellm(pins={"tensorrt-edgellm": "0.10.0"})
    device = _orin("0.10.0", standin)
    suffix = "+standin" if standin else ""
    assert driver.device().device_version(device, _env("0.10.0")) == "0.10.0" + suffix
    # the build's CMakeCache.txt is what ran (the agent's check refuses a device where it disagrees with the
    # inventory, but the record never takes the inventory's or the plan's word over the device's)
    assert driver.device().device_version(device, _env("0.10.1")) == "0.10.1" + suffix
    assert driver.device().device_facts_problem(device, _env("0.10.1")["toolchains"]["tensorrt-edgellm"]) is not None


def test_without_a_read_back_the_inventory_says_it() -> None:
    driver = TensorrtEdgellm(pins={"tensorrt-edgellm": "0.10.0"})
    assert driver.device().device_version(_orin("0.10.0", False), _env(None)) == "0.10.0"
