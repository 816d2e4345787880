"""`edgellm bench`: prefill and decode on the session's stories260K engine; bad arguments exit 2."""

from __future__ import annotations

import json

import pytest

from edgellm.cli import main


def _bench(engine_dir, out, *args: str) -> dict:
    rc = main(["bench", "--engine-dir", str(engine_dir), "--output", str(out), *args])
    assert rc == 0
    return json.loads(out.read_text())


def _sane(report: dict, tokens_per_step: int) -> None:
    assert report["tokens_per_step"] == tokens_per_step
    assert report["tokens_per_s"] > 0 and report["tokens_per_s_mean"] > 0
    lat = report["step_latency"]
    assert 0 < lat["min_ms"] <= lat["median_ms"] <= lat["p90_ms"] <= lat["max_ms"]
    assert report["ms_per_token"]["p90"] >= report["ms_per_token"]["median"] > 0
    assert report["ms_per_token"]["median"] == pytest.approx(lat["median_ms"] / tokens_per_step)
    assert report["tokens_per_s"] == pytest.approx(tokens_per_step * 1e3 / lat["median_ms"])
    assert report["peak_rss_bytes"] >= report["peak_rss_bytes_before_open"] > 0


def test_bench_prefill(stories_engine, tmp_path, capsys) -> None:
    r = _bench(stories_engine.engine_dir, tmp_path / "b.json", "--mode", "prefill", "--batch-size", "2",
               "--input-len", "32", "--past-len", "40", "--warmup", "1", "--iterations", "6")
    _sane(r, 2 * 32)
    assert r["mode"] == "prefill" and r["step_latency"]["count"] == 6
    assert r["parameters"] == {**r["parameters"], "batch_size": 2, "input_len": 32, "past_len": 40, "iterations": 6}
    files = [p for p in stories_engine.engine_dir.iterdir() if p.is_file() and p.name != "engine_manifest.json"]
    assert r["engine"]["bytes"] == sum(p.stat().st_size for p in files) > 1_000_000
    assert r["engine"]["precision"] == "fp32"
    assert json.loads(capsys.readouterr().out)["tokens_per_step"] == 64


def test_bench_decode(stories_engine, tmp_path) -> None:
    r = _bench(stories_engine.engine_dir, tmp_path / "b.json", "--mode", "decode", "--batch-size", "3",
               "--past-len", "100", "--warmup", "2", "--iterations", "10")
    _sane(r, 3)
    assert r["mode"] == "decode" and r["step_latency"]["count"] == 10


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--mode", "prefill", "--batch-size", "5"], "--batch-size 5 exceeds the engine's max_batch_size 4"),
        (["--mode", "prefill", "--input-len", "513"], "--input-len 513 exceeds the engine's max_input_len 512"),
        (["--mode", "prefill", "--input-len", "100", "--past-len", "500"],
         "= 600 exceeds the engine's max_seq_len 512"),
        (["--mode", "decode", "--past-len", "512"], "= 513 exceeds the engine's max_seq_len 512"),
        (["--mode", "decode", "--iterations", "0", "--batch-size", "0"], "--batch-size 0: must be >= 1"),
        (["--mode", "decode", "--iterations", "0"], "--iterations 0: must be >= 1"),
        (["--mode", "sideways"], "unknown --mode 'sideways'; valid: prefill, decode"),
    ],
)
def test_bench_bad_arguments_exit_2(stories_engine, tmp_path, capsys, args, needle) -> None:
    out = tmp_path / "b.json"
    assert main(["bench", "--engine-dir", str(stories_engine.engine_dir), "--output", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert "error (configuration)" in err and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_bench_missing_engine_exits_2(tmp_path, capsys) -> None:
    assert main(["bench", "--engine-dir", str(tmp_path / "none"), "--mode", "decode"]) == 2
    assert f"engine dir {tmp_path / 'none'} not found" in capsys.readouterr().err
