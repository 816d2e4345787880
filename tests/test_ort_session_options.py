"""The ONNX Runtime session an engine is opened with: intra-op spinning chosen from the host's load unless asked for (a
spinning pool burns the CPU a shared machine's decode needs: benchmarks/peers_contention.py; the choice itself:
tests/test_ort_thread_policy.py), the settings recorded, the outputs unchanged."""

from __future__ import annotations

import json

import pytest

from edgellm.backends.ort import OrtBackend, session_settings
from edgellm.cli import main
from edgellm.errors import ConfigurationError
from edgellm.runtime import Engine, GenerationRequest

SPIN = "session.intra_op.allow_spinning"


def _entry(engine: Engine, key: str) -> str:
    return str(engine.session.sess.get_session_options().get_session_config_entry(key))  # type: ignore[attr-defined]


def test_engine_session_spins_as_chosen_at_open(stories_engine):
    engine = Engine.open(stories_engine.engine_dir, num_threads=2)
    settings = engine.session.settings  # type: ignore[attr-defined]
    assert settings["intra_op_spinning"]["setting"] == "auto"
    assert _entry(engine, SPIN) == ("1" if settings["intra_op_spinning"]["spinning"] else "0")
    opts = engine.session.sess.get_session_options()  # type: ignore[attr-defined]
    assert (opts.intra_op_num_threads, opts.inter_op_num_threads) == (2, 1)
    fixed = {k: v for k, v in session_settings(2).items() if k not in ("config_entries", "intra_op_spinning")}
    assert {k: v for k, v in settings.items() if k in fixed} == fixed
    assert settings["config_entries"] == {SPIN: _entry(engine, SPIN)}


def test_spinning_on_request_gives_the_same_tokens(stories_engine):
    engine = Engine.open(stories_engine.engine_dir, num_threads=2)
    req = GenerationRequest(id="a", input_ids=engine.encode("Once upon a time"), max_new_tokens=24, temperature=0.0)
    quiet = engine.generate([req])[0].output_ids
    engine.session = OrtBackend().open(engine.engine_dir, engine.manifest, num_threads=2, intra_op_spinning=True)
    assert _entry(engine, SPIN) == "1"
    assert engine.generate([req])[0].output_ids == quiet


def test_bad_spinning_value_is_named():
    with pytest.raises(ConfigurationError, match=r"intra_op_spinning 'yes': must be one of True, False, 'auto'"):
        session_settings(2, intra_op_spinning="yes")


def test_bench_records_the_session_settings(stories_engine, tmp_path):
    out = tmp_path / "bench.json"
    assert main(["bench", "--engine-dir", str(stories_engine.engine_dir), "--output", str(out), "--mode", "decode",
                 "--iterations", "2", "--warmup", "0", "--threads", "1"]) == 0
    session = json.loads(out.read_text())["session"]
    assert session["intra_op_num_threads"] == 1
    chosen = session["intra_op_spinning"]
    assert chosen["setting"] == "auto" and chosen["contention"]["source"] == "/proc/stat"
    assert session["config_entries"] == {SPIN: "1" if chosen["spinning"] else "0"}
