"""Which free device a stage with a choice of devices (a build) asks for first (tasks.device_exec.preferred): builds
spread evenly over a platform's devices (each brings the infer/accuracy/bench runs pinned to its engine) and keep off
the ones this run's pinned stages wait for; run_stage's counting of placements and waits is exercised by
tests/test_farm_scale.py (stages per device of each platform)."""

from __future__ import annotations

import threading
from collections import Counter
from types import SimpleNamespace
from typing import Any

from edgefarm.devices.inventory import Device
from edgefarm.tasks.device_exec import PLACEMENT_SLACK, PLACEMENT_WAIT_S, _waiting_for, placeable, preferred

DEVICES = [Device(id=f"orin-{i}", type="orin", work_dir="/w", host="127.0.0.1", user="u", port=22)
           for i in range(1, 4)]


def _farm(**kw: Any) -> Any:
    return SimpleNamespace(bad_devices=set(), pinned_waiting=Counter(), held_slots={}, placed=Counter(),
                           slots_freed=threading.Condition(), **kw)


def _ids(devices: list[Device]) -> list[str]:
    return [d.id for d in devices]


def test_builds_go_to_the_device_this_run_placed_fewest_on_not_the_lowest_id() -> None:
    farm = _farm()
    assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-2", "orin-3"]
    farm.placed.update(["orin-1", "orin-1", "orin-2"])
    assert _ids(preferred(farm, DEVICES)) == ["orin-3", "orin-2", "orin-1"]


def test_nine_builds_arriving_one_by_one_land_three_on_each_device() -> None:
    """Each build takes the first device in the order (every device free when it comes): three each, where the
    momentary state alone (nothing held, nothing waiting between builds) sent all nine to orin-1."""
    farm = _farm()
    for _ in range(9):
        farm.placed[preferred(farm, DEVICES)[0].id] += 1
    assert farm.placed == Counter({"orin-1": 3, "orin-2": 3, "orin-3": 3})


def test_fewer_placed_comes_before_fewer_pinned_waiting_then_fewer_slots_held_and_failed_devices_last() -> None:
    farm = _farm()
    farm.placed.update(["orin-2"] * 5)
    with _waiting_for(farm, [DEVICES[0]]):  # an infer pinned to orin-1's engine is waiting for it
        # orin-1 and orin-3 placed alike: the one nothing waits for first
        assert _ids(preferred(farm, DEVICES)) == ["orin-3", "orin-1", "orin-2"]
        farm.placed["orin-3"] += 1  # fewer placed first, waited for or not
        assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-3", "orin-2"]
        farm.placed["orin-1"] += 1
        farm.held_slots["orin-3"] = 1
        farm.bad_devices.add("orin-2")
        assert _ids(preferred(farm, DEVICES)) == ["orin-3", "orin-1", "orin-2"]
    assert farm.pinned_waiting["orin-1"] == 0  # no longer waiting: slots held decide between equals
    assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-3", "orin-2"]


def test_an_unpinned_stage_counts_as_waiting_for_nothing() -> None:
    farm = _farm()
    with _waiting_for(farm, ()):
        assert sum(farm.pinned_waiting.values()) == 0
        assert _ids(preferred(farm, DEVICES)) == ["orin-1", "orin-2", "orin-3"]


def test_a_build_waits_for_a_device_this_run_placed_fewer_on_rather_than_pile_onto_a_free_one() -> None:
    """orin-1 is busy with this run's own stage (not free) and was placed on least: a free device may take the build
    only while it has at most PLACEMENT_SLACK more placements; past that, none is placeable (the build waits)."""
    assert PLACEMENT_SLACK == 1
    farm = _farm()
    busy, free = DEVICES[0], DEVICES[1:]
    farm.placed.update({"orin-1": 2, "orin-2": 3, "orin-3": 4})
    assert _ids(placeable(farm, DEVICES, free, set())) == ["orin-2"]
    farm.placed["orin-2"] += 1
    assert placeable(farm, DEVICES, free, set()) == []  # both free ones are 2 ahead of orin-1: wait for it
    farm.placed["orin-1"] += 1
    assert _ids(placeable(farm, DEVICES, free, set())) == ["orin-2", "orin-3"]
    assert busy not in placeable(farm, DEVICES, free, set())  # never a device that is not free


def test_a_device_another_run_holds_or_that_failed_holds_no_build_back() -> None:
    farm = _farm()
    farm.placed.update({"orin-2": 3, "orin-3": 3})  # orin-1: none placed
    assert placeable(farm, DEVICES, DEVICES[1:], set()) == []
    # the database refused orin-1 to this stage (another run's leases fill it): it does not count
    assert _ids(placeable(farm, DEVICES, DEVICES[1:], {"orin-1"})) == ["orin-2", "orin-3"]
    farm.bad_devices.add("orin-1")  # failed in this run: does not count either, and stays a last resort
    assert _ids(placeable(farm, DEVICES, DEVICES, set())) == ["orin-1", "orin-2", "orin-3"]
    assert _ids(preferred(farm, placeable(farm, DEVICES, DEVICES, set()))) == ["orin-2", "orin-3", "orin-1"]


def test_a_build_waits_a_bounded_time_then_any_free_device_will_do() -> None:
    """orin-1 (least placed) is busy with one long stage of this run: builds wait for it at most PLACEMENT_WAIT_S,
    then the free devices take them, so one long stage never idles the rest of the platform."""
    farm = _farm()
    farm.placed.update({"orin-2": 2, "orin-3": 2})
    assert placeable(farm, DEVICES, DEVICES[1:], set(), waited_s=PLACEMENT_WAIT_S - 1) == []
    assert _ids(placeable(farm, DEVICES, DEVICES[1:], set(), waited_s=PLACEMENT_WAIT_S)) == ["orin-2", "orin-3"]
