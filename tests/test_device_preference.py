"""Which free device a stage asks for first (tasks.device_exec.preferred): builds spread over a platform's devices and
keep off the ones this run's pinned stages (infer/accuracy/bench on the device holding their engine) wait for."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

from edgefarm.devices.inventory import Device
from edgefarm.tasks.device_exec import _waiting_for, preferred

DEVICES = [Device(id=f"orin-{i}", type="orin", work_dir="/w", host="127.0.0.1", user="u", port=22)
           for i in range(1, 4)]


def _farm(**kw: Any) -> Any:
    return SimpleNamespace(bad_devices=set(), pinned_waiting=Counter(), held_slots={}, granted=Counter(),
                           slots_freed=threading.Condition(), **kw)


def _ids(devices: list[Device]) -> list[str]:
    return [d.id for d in devices]


def test_ties_go_to_the_device_this_run_was_granted_least_not_the_lowest_id() -> None:
    farm = _farm()
    assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-2", "orin-3"]
    farm.granted.update(["orin-1", "orin-1", "orin-2"])
    assert _ids(preferred(farm, DEVICES)) == ["orin-3", "orin-2", "orin-1"]


def test_a_device_that_pinned_stages_wait_for_comes_after_its_idle_peers_and_failed_ones_last() -> None:
    farm = _farm()
    farm.granted.update(["orin-2"] * 5)
    with _waiting_for(farm, [DEVICES[0]]):  # an infer pinned to orin-1's engine is waiting for it
        assert _ids(preferred(farm, DEVICES)) == ["orin-3", "orin-2", "orin-1"]
        farm.bad_devices.add("orin-3")
        assert _ids(preferred(farm, DEVICES)) == ["orin-2", "orin-1", "orin-3"]
    assert farm.pinned_waiting["orin-1"] == 0  # no longer waiting: back in the usual order
    farm.bad_devices.clear()
    assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-3", "orin-2"]


def test_fewer_slots_held_comes_before_fewer_grants_and_an_unpinned_stage_counts_as_waiting_for_nothing() -> None:
    farm = _farm()
    farm.held_slots["orin-1"] = 1
    farm.granted.update(["orin-2", "orin-3", "orin-3"])
    with _waiting_for(farm, ()):
        assert sum(farm.pinned_waiting.values()) == 0
        assert _ids(preferred(farm, DEVICES)) == ["orin-2", "orin-3", "orin-1"]
