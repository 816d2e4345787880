"""The intra-op spinning policy (edgellm.backends.thread_policy): "auto" spins only with an idle CPU per thread, from
/proc/stat samples less this process's own CPU time; True / False decide without measuring; anything else is refused;
the session an engine opens with records the choice and the contention it was made from."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm.backends import thread_policy
from edgellm.backends.ort import OrtBackend
from edgellm.backends.thread_policy import Contention, choose_spinning, contention_from_stat, measure_contention
from edgellm.errors import ConfigurationError
from edgellm.runtime import Engine

SPIN = "session.intra_op.allow_spinning"


def _stat(busy: int, idle: int, cpus: int = 2) -> str:
    """A /proc/stat of ``cpus`` CPUs with ``busy`` user ticks and ``idle`` idle ticks in all (guest ticks, already
    counted in user, must not count twice)."""
    per = [f"cpu{i} {busy // cpus} 0 0 {idle // cpus} 0 0 0 0 0 0" for i in range(cpus)]
    return "\n".join([f"cpu  {busy} 0 0 {idle} 0 0 0 0 {busy} 0", *per, "intr 1 2 3", "ctxt 42"]) + "\n"


def _sampled(busy_ticks: int, idle_ticks: int, own_cpu_s: float = 0.0) -> Contention:
    """Two samples 0.1 s apart on 2 CPUs (20 ticks), ``busy_ticks`` of them busy."""
    c = contention_from_stat(_stat(1000, 5000), _stat(1000 + busy_ticks, 5000 + idle_ticks), own_cpu_s=own_cpu_s,
                             wall_s=0.1)
    assert c is not None
    return c


def test_idle_host_spins():
    c = _sampled(busy_ticks=1, idle_ticks=19)  # daemons: 0.1 CPU
    assert (c.host_cpus, c.usable_cpus, c.source) == (2, 2, "/proc/stat")
    assert c.busy_cpus == pytest.approx(0.1) and c.idle_cpus == pytest.approx(1.9)
    choice = choose_spinning("auto", 2, measure=lambda: c)
    assert choice.spinning and choice.contention == c and "1.90 idle CPUs >= 2" in choice.reason


def test_busy_host_does_not_spin():
    c = _sampled(busy_ticks=12, idle_ticks=8)  # a competing process on one CPU and a bit
    assert c.busy_cpus == pytest.approx(1.2)
    choice = choose_spinning("auto", 2, measure=lambda: c)
    assert not choice.spinning and "0.80 idle CPUs < 2" in choice.reason
    assert choose_spinning("auto", 1, measure=lambda: c).spinning  # one thread still has an idle CPU of its own


def test_this_process_own_cpu_time_is_not_contention():
    # the host was busy 1.5 CPUs, 1.4 of them this process (a previous session's threads, say): the rest is idle
    c = _sampled(busy_ticks=15, idle_ticks=5, own_cpu_s=0.14)
    assert c.busy_cpus == pytest.approx(0.1)
    assert choose_spinning("auto", 2, measure=lambda: c).spinning


def test_affinity_limits_the_idle_cpus():
    c = contention_from_stat(_stat(0, 0, cpus=8), _stat(0, 80, cpus=8), own_cpu_s=0.0, wall_s=0.1, usable_cpus=2)
    assert c is not None and c.host_cpus == 8 and c.idle_cpus == 2.0
    assert not choose_spinning("auto", 4, measure=lambda: c).spinning


def test_explicit_settings_do_not_measure():
    def measure() -> Contention:
        raise AssertionError("an explicit setting measured the host")
    assert choose_spinning(True, 2, measure=measure).spinning is True
    assert choose_spinning(False, 2, measure=measure).spinning is False
    assert choose_spinning(False, 2, measure=measure).as_dict() == {
        "setting": False, "spinning": False, "reason": "explicit", "contention": None}


@pytest.mark.parametrize("bad", ["sometimes", "Auto", 1, 0, None])
def test_bad_setting_is_refused_naming_the_valid_ones(bad):
    with pytest.raises(ConfigurationError) as err:
        choose_spinning(bad, 2)  # type: ignore[arg-type]
    assert str(err.value) == f"intra_op_spinning {bad!r}: must be one of True, False, 'auto'"


def test_unmeasurable_host_does_not_spin(monkeypatch, tmp_path):
    assert not choose_spinning("auto", 1, measure=lambda: None).spinning
    # /proc/stat missing: the 1-minute load average stands in for it
    monkeypatch.setattr(thread_policy.os, "getloadavg", lambda: (1.5, 1.0, 1.0))
    c = measure_contention(0.0, stat=tmp_path / "no-such-stat")
    assert c is not None and c.source == "loadavg 1m" and c.busy_cpus == min(1.5, c.host_cpus)


@pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="no /proc/stat on this host")
def test_measured_on_this_host():
    c = measure_contention(0.05)
    assert c is not None and c.source == "/proc/stat" and 0.0 <= c.idle_cpus <= c.usable_cpus


@pytest.mark.parametrize(("contention", "spins"), [(Contention(2, 2, 0.0, "/proc/stat", 0.1), "1"),
                                                   (Contention(2, 2, 2.0, "/proc/stat", 0.1), "0")])
def test_opened_session_records_the_choice(stories_engine, monkeypatch, contention, spins):
    monkeypatch.setattr(thread_policy, "measure_contention", lambda: contention)
    monkeypatch.setattr(thread_policy, "_recent", {})  # no sample from an earlier open within REUSE_S
    engine = Engine.open(stories_engine.engine_dir, num_threads=2)
    options = engine.session.sess.get_session_options()  # type: ignore[attr-defined]
    assert options.get_session_config_entry(SPIN) == spins
    recorded = engine.session.settings  # type: ignore[attr-defined]
    assert recorded["config_entries"] == {SPIN: spins}
    assert recorded["intra_op_spinning"] == {
        "setting": "auto", "spinning": spins == "1", "reason": choose_spinning("auto", 2, lambda: contention).reason,
        "contention": contention.as_dict()}
    # an explicit setting overrides whatever the host's load is
    forced = OrtBackend().open(engine.engine_dir, engine.manifest, num_threads=2, intra_op_spinning=True)
    assert forced.settings["config_entries"] == {SPIN: "1"}  # type: ignore[attr-defined]
    assert forced.settings["intra_op_spinning"]["reason"] == "explicit"  # type: ignore[attr-defined]


def test_sessions_opened_in_a_row_share_one_sample(monkeypatch) -> None:
    """A run opens many sessions: one sample of the host's load serves those opened within REUSE_S of it."""
    from edgellm.backends import thread_policy

    taken: list[int] = []
    monkeypatch.setattr(thread_policy, "measure_contention",
                        lambda: taken.append(1) or Contention(4, 4, 0.0, "/proc/stat", 0.1))
    monkeypatch.setattr(thread_policy, "_recent", {})
    for _ in range(5):
        assert thread_policy.choose_spinning("auto", 2).spinning
    assert len(taken) == 1
    clock = [thread_policy.time.monotonic() + thread_policy.REUSE_S + 1]
    monkeypatch.setattr(thread_policy.time, "monotonic", lambda: clock[0])
    thread_policy.choose_spinning("auto", 2)
    assert len(taken) == 2
