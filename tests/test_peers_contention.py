"""benchmarks/peers.py --contention's own machinery: the competing job starts, spins in its own session and leaves no
process behind; the ratios and targets are read from the rounds; a bad --load-procs is named."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import peers_contention


def test_competing_load_spins_in_its_own_session_and_is_gone_after():
    with peers_contention.CompetingLoad(2) as load:
        pids = [p.pid for p in load._p]
        assert len(pids) == 2
        assert all(os.getsid(pid) == pid != os.getsid(0) for pid in pids)  # another tenant's job, not ours
        time.sleep(0.3)
    assert len(load.result["rates"]) == 2 and all(r > 0 for r in load.result["rates"])
    assert load.result["cpus"] > 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _case(tok_s: float, ttft_ms: float) -> dict:
    return {"decode_tokens_per_s": tok_s, "ttft_ms": ttft_ms, "decode_cpu_per_wall": 1.0, "loadavg_1m_before": 1.0,
            "others_busy_cpus": 0.1}


def _stack(quiet: float, contended: float) -> dict:
    return {"cases": {"quiet": _case(quiet, 100.0), "contended": _case(contended, 200.0)}}


def test_targets_and_paired_ratios_come_from_the_rounds(capsys):
    rounds = [{"stacks": {"edgellm": _stack(10.0, 4.0), "onnxruntime-genai": _stack(10.0, 10.0)}},
              {"stacks": {"edgellm": _stack(12.0, 5.0), "onnxruntime-genai": _stack(10.0, 10.0)}}]
    # the medians bench_model keeps per stack and case (load and other tenants' CPUs per round)
    stacks = {s: {case: {**_case(v, ms), "loadavg_1m_before": [1.0, 2.0], "others_busy_cpus": [0.1, None]}
                  for case, v, ms in (("quiet", q, 100.0), ("contended", c, 200.0))}
              for s, q, c in (("edgellm", 11.0, 4.5), ("onnxruntime-genai", 10.0, 10.0))}
    results = {"m": {"stacks": stacks, "rounds": rounds}}
    peers_contention.summarize(results)
    m = results["m"]
    assert m["ratios"]["quiet"]["decode_speedup"] == pytest.approx(1.1)
    assert m["ratios"]["contended"]["decode_speedup_per_round"] == pytest.approx([0.4, 0.5])
    assert m["targets"]["quiet: decode >= 1.0x onnxruntime-genai"] == {"target": 1.0, "measured": pytest.approx(1.1),
                                                                      "met": True}
    assert m["targets"]["contended: decode >= 0.9x onnxruntime-genai"]["met"] is False
    assert "MISSED" in capsys.readouterr().out


def test_reopened_session_records_its_choice_per_case():
    opened: list[str] = []

    def run(n: int):
        return iter(range(n))

    def reopen() -> dict:
        opened.append("x")
        return {"intra_op_spinning": {"spinning": False}}
    run.reopen = reopen  # type: ignore[attr-defined]
    case = peers_contention.timed_case(run, 4, 0, reopen=True)
    assert opened == ["x"] and case["session_options"] == {"intra_op_spinning": {"spinning": False}}
    assert "session_options" not in peers_contention.timed_case(run, 4, 0)


def test_auto_is_compared_with_both_fixed_settings(capsys):
    names = ("edgellm", "edgellm-nospin", "edgellm-spin", "onnxruntime-genai")
    rates = dict(zip(names, ((10.0, 8.0), (8.0, 8.0), (10.0, 4.0), (10.0, 8.0)), strict=True))
    rounds = [{"stacks": {s: _stack(*rates[s]) for s in names}}]
    stacks = {s: {case: {**_case(v, 100.0), "loadavg_1m_before": [1.0], "others_busy_cpus": [0.1]}
                  for case, v in zip(peers_contention.CASES, rates[s], strict=True)} for s in names}
    for case, spun in (("quiet", True), ("contended", False)):
        stacks["edgellm"][case] |= {"spinning_chosen": [spun], "idle_cpus_at_open": [1.9 if spun else 0.4]}
    results = {"m": {"stacks": stacks, "rounds": rounds}}
    peers_contention.summarize(results)
    r = results["m"]["ratios"]
    assert r["quiet"]["edgellm / edgellm-nospin decode"] == pytest.approx(1.25)
    assert r["contended"]["edgellm / edgellm-spin decode"] == pytest.approx(2.0)
    assert r["contended"]["edgellm-spin / onnxruntime-genai decode"] == pytest.approx(0.5)
    assert "contended: edgellm spinning chosen per round [False] from idle CPUs [0.4]" in capsys.readouterr().out


def test_bad_load_procs_is_named(tmp_path):
    import peers

    with pytest.raises(SystemExit, match=r"--load-procs 0: the competing job needs at least 1 process"):
        peers.main(["--contention", "--load-procs", "0", "--output", str(tmp_path / "x.json")])
