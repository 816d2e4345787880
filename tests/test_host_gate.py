"""The host gate (tasks/host_gate.py): a benchmark on a device of this host holds it exclusive, every other stage on
this host shared; threads and separate processes alike; a waiting benchmark blocks new shared entries; the wait is
bounded by an infrastructure error naming who holds the gate."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from edgefarm.devices.inventory import Device
from edgefarm.tasks.host_gate import HostGate, HostGateTimeout, shares_host
from edgellm.errors import BugError, InfrastructureError

REPO = Path(__file__).resolve().parents[1]


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_an_exclusive_hold_never_overlaps_a_shared_one_and_shared_ones_overlap(tmp_path: Path) -> None:
    gate = HostGate(tmp_path)
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def hold(mode: str, pause: float) -> None:
        with getattr(gate, mode)(mode):
            t0 = time.monotonic()
            time.sleep(pause)
            with lock:
                spans.append((mode, t0, time.monotonic()))

    threads = [threading.Thread(target=hold, args=(mode, 0.15))
               for mode in ("shared", "shared", "exclusive", "shared", "exclusive", "shared", "shared")]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert len(spans) == 7
    exclusive = [(a, b) for m, a, b in spans if m == "exclusive"]
    others = [(m, (a, b)) for m, a, b in spans]
    for span in exclusive:
        assert [m for m, o in others if o != span and _overlaps(span, o)] == [], spans
    shared = [(a, b) for m, a, b in spans if m == "shared"]
    assert any(_overlaps(x, y) for i, x in enumerate(shared) for y in shared[i + 1:]), "shared holds never overlapped"


def test_a_waiting_exclusive_blocks_new_shared_entries(tmp_path: Path) -> None:
    gate = HostGate(tmp_path)
    order: list[str] = []
    first_in, release_first = threading.Event(), threading.Event()

    def first() -> None:
        with gate.shared("first"):
            first_in.set()
            release_first.wait(5)
        order.append("first out")

    def bench() -> None:
        with gate.exclusive("bench"):
            order.append("bench in")
            time.sleep(0.1)
            order.append("bench out")

    def late() -> None:
        with gate.shared("late"):
            order.append("late in")

    threads = [threading.Thread(target=first)]
    threads[0].start()
    assert first_in.wait(5)
    threads.append(threading.Thread(target=bench))
    threads[1].start()
    time.sleep(0.2)  # the bench waits for the first to drain
    threads.append(threading.Thread(target=late))
    threads[2].start()
    time.sleep(0.3)
    assert order == [], "the late shared entry went past a waiting benchmark"
    release_first.set()
    for t in threads:
        t.join(5)
    assert order == ["first out", "bench in", "bench out", "late in"]


def test_the_wait_is_bounded_and_names_who_holds_the_gate(tmp_path: Path) -> None:
    gate = HostGate(tmp_path)
    with gate.shared("host stage export"):
        errors: list[BaseException] = []

        def bench() -> None:
            try:
                with HostGate(tmp_path, wait_s=0.3).exclusive("bench-0-m on local-cpu"):
                    pass
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=bench)
        t.start()
        t.join(5)
    [err] = errors
    assert isinstance(err, HostGateTimeout) and isinstance(err, InfrastructureError)
    assert "bench-0-m on local-cpu waited 0 s to enter exclusive" in str(err), err
    assert "host stage export (shared, pid" in str(err), err
    with HostGate(tmp_path, wait_s=0.3).exclusive("bench again"):  # the gate is free again, nothing left behind
        pass
    assert not list((tmp_path / "holders").glob("*.json"))


def test_nested_holds_of_one_thread(tmp_path: Path) -> None:
    gate = HostGate(tmp_path, wait_s=0.5)
    with (gate.shared("outer"), gate.shared("inner"),  # no wait for itself
          pytest.raises(BugError, match="exclusive while this thread holds it shared"), gate.exclusive("bench")):
        pass
    with gate.exclusive("bench"), gate.shared("a stage the benchmark runs"):
        pass


_CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from edgefarm.tasks.host_gate import HostGate, HostGateTimeout
    directory, mode, wait, hold = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    try:
        with getattr(HostGate(Path(directory), wait_s=wait), mode)("child " + mode):
            print("in", flush=True)
            time.sleep(hold)
        print("out", flush=True)
    except HostGateTimeout as exc:
        print(exc, flush=True)
        sys.exit(3)
""")


def _child(directory: Path, mode: str, wait: float, hold: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(directory), mode, str(wait), str(hold)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)


def test_two_processes_respect_the_gate(tmp_path: Path) -> None:
    child = _child(tmp_path, "shared", 5, 1.5)  # another run's stage on this host
    assert child.stdout is not None and child.stdout.readline().strip() == "in"
    with (pytest.raises(HostGateTimeout, match=r"held by: child shared \(shared, pid \d+"),
          HostGate(tmp_path, wait_s=0.3).exclusive("bench")):
        pass
    t0 = time.monotonic()
    with HostGate(tmp_path, wait_s=10).exclusive("bench"):  # enters once the other process's stage ended
        assert child.stdout.readline().strip() == "out"  # it had left before the benchmark entered
        entered = time.monotonic() - t0
        other = _child(tmp_path, "shared", 0.5, 0)  # and the other process's next stage waits for the benchmark
        out, _ = other.communicate(timeout=30)
    assert entered > 0.3
    assert other.returncode == 3 and "child shared waited" in out and "held by: bench (exclusive" in out, out
    assert child.wait(10) == 0


def test_which_devices_share_the_host() -> None:
    base = {"type": "x86-cpu", "work_dir": "w"}
    assert shares_host(Device(id="l", transport="local", **base))
    ssh = {**base, "transport": "ssh", "user": "u"}
    assert shares_host(Device(id="s", host="127.0.0.1", **ssh))
    assert shares_host(Device(id="s", host="localhost", **ssh))
    assert not shares_host(Device(id="s", host="orin-7.lab", **ssh))
