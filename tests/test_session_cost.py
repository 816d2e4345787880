"""The test session's cost report (tests/fixtures/session_cost.py): what issue 39's `make test` target is judged by."""

from __future__ import annotations

import subprocess
import sys

from tests.fixtures.session_cost import cpu_seconds, session_report


def test_the_report_sums_cpu_of_pytest_and_its_children_and_ranks_files_and_phases() -> None:
    phases = [("tests/test_a.py::t1", "setup", 30.0), ("tests/test_a.py::t1", "call", 2.0),
              ("tests/test_b.py::t2[x]", "call", 50.0), ("tests/test_a.py::t3", "teardown", 1.0)]
    r = session_report(100.0, {"self": 10.0, "children": 5.0}, {"self": 70.0, "children": 95.0}, 2,
                       (1.0, 1.0, 1.0), (3.0, 2.0, 1.0), phases, {"passed": 2, "setup failed": 1})
    assert r["cpu_s"] == {"self": 60.0, "children": 90.0, "total": 150.0}
    assert r["busy_cpus_avg"] == 1.5
    assert r["cpu_floor_s"] == 75.0  # 150 CPU seconds cannot take less than 75 s on 2 CPUs
    assert list(r["per_file_s"].items()) == [("tests/test_b.py", 50.0), ("tests/test_a.py", 33.0)]
    assert [(p["test"], p["phase"]) for p in r["slowest"]][:2] == [("tests/test_b.py::t2[x]", "call"),
                                                                     ("tests/test_a.py::t1", "setup")]
    assert r["outcomes"] == {"passed": 2, "setup failed": 1}


def test_cpu_seconds_count_a_child_that_was_waited_for() -> None:
    before = cpu_seconds()
    subprocess.run([sys.executable, "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass"],
                   check=True)
    after = cpu_seconds()
    assert after["children"] - before["children"] >= 0.25
    assert after["self"] >= before["self"]
