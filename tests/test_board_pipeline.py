"""The TensorRT path of ``l0_pipeline_orin`` and ``l0_pipeline_thor`` end to end on JetPack-like boards
(tests/fixtures/board.py): sshd hosts with nothing of this project, a stdlib-only ``python3``,
``/etc/nv_tegra_release``, ``nvpmodel``/``jetson_clocks`` and the STAND-IN ``llm_build``/``llm_inference``/
``llm_bench`` that follow NVIDIA's public sources. Real parts around them: the real CLI (``edgefarm run
--priority``), Prefect, NVIDIA's quantizer and exporter on this host, the transformers reference, the results
database, the docs.

The stand-in's answers to the reference prompts are the reference's own greedy continuations (computed here per
model), so every stage of the lists' runnable rows passes, and still no row is supported: a stand-in is never
evidence. The lists' real Hugging Face models have no checkpoint here (skipped, named); their real-shape stand-ins
(``*-layout``: the same attention and MLP widths, random weights, fewer layers) run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices import agent_client
from edgefarm.devices.transport import open_transport
from edgefarm.results.db import make_engine
from edgefarm.results.models import Environment, Result
from edgefarm.test_lists.catalog import Catalog
from edgellm.reference import DEFAULT_GREEDY_TOKENS, checkpoint_digest, load_reference
from edgellm.runtime.tokenizer import TextCodec
from tests.fixtures.board import STANDIN_REVISION, JetsonBoard
from tests.helpers.toolchain_env import link_real_toolchain

# NVIDIA's quantizer and exporter runs are shared with the rest of the session (test_model_shapes.py makes the same
# qwen2.5-0.5b-layout int4_awq at 2 calibration rows; both lists export its fp16): tests/fixtures/toolchain_runs.py
pytestmark = pytest.mark.usefixtures("prefect_harness", "shared_toolchain_runs")
LAYOUTS = {"orin": ("qwen2.5-0.5b-layout", "llama-3.2-1b-layout", "gemma-3-1b-layout", "phi-4-mini-layout"),
           "thor": ("qwen2.5-0.5b-layout", "qwen3-0.6b-layout", "gemma-3-1b-layout", "phi-4-mini-layout")}
_REFERENCES: dict[str, Path] = {}  # checkpoint digest -> its reference (both lists run qwen2.5-0.5b-layout)
# The stand-in boards answer from the float reference, so what the quantized checkpoints learnt from calibration
# decides nothing here: the layout models calibrate on 2 rows instead of the catalog's 8 (calibration_samples), as
# test_model_shapes.py quantizes qwen2.5-0.5b-layout (the same run, shared). The quantizer still runs for real.
CALIBRATION_ROWS = 2
ANSWERS_ONLY_TOKENS = 2  # the fewest perplexity tokens (and window) `edgellm reference` takes


@pytest.fixture(scope="module", autouse=True)
def _few_calibration_rows() -> Iterator[None]:
    original = Catalog.load.__func__

    def load(cls: type[Catalog], *args: Any, **kwargs: Any) -> Catalog:
        catalog = original(cls, *args, **kwargs)
        for name in {n for models in LAYOUTS.values() for n in models} & set(catalog.sources):
            catalog.sources[name] = dataclasses.replace(catalog.sources[name], calibration_samples=CALIBRATION_ROWS)
        return catalog

    mp = pytest.MonkeyPatch()
    mp.setattr(Catalog, "load", classmethod(load))
    yield
    mp.undo()


def _reference(checkpoint: Path, root: Path, name: str) -> Path:
    """The transformers reference's greedy continuations of ``checkpoint`` as the farm's reference stage makes them
    (the same prompts, greedy tokens and process), made once per module. Only the greedy continuations are read:
    the perplexity windows, independent of them, are cut to ANSWERS_ONLY_TOKENS (the farm's 1024 tokens cost 4-8 s
    of CPU per model here, and the farm's reference stage computes its own)."""
    digest = checkpoint_digest(checkpoint)
    if digest not in _REFERENCES:
        ref = root / f"{name}.npz"
        subprocess.run([sys.executable, "-m", "edgellm", "reference", str(checkpoint), "--output", str(ref),
                        "--greedy-tokens", str(DEFAULT_GREEDY_TOKENS), "--max-tokens", str(ANSWERS_ONLY_TOKENS),
                        "--window", str(ANSWERS_ONLY_TOKENS)],
                       check=True, capture_output=True, timeout=900)
        _REFERENCES[digest] = ref
    return _REFERENCES[digest]


def _answers(models: tuple[str, ...], data: Path, root: Path) -> dict[str, Any]:
    """Per model (by its shape, as the stand-in keys them): prompt -> the transformers reference's greedy
    continuation, with the farm's reference settings."""
    catalog = Catalog.load()
    by_shape: dict[str, dict[str, str]] = {}
    for name in models:
        checkpoint = Path(catalog.get(name).locate(data))
        ref = _reference(checkpoint, root, name)
        data_ref, codec = load_reference(ref), TextCodec(checkpoint / "tokenizer.json")
        config = json.loads((checkpoint / "config.json").read_text())
        key = "x".join(str(config[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                                  "num_attention_heads"))
        by_shape[key] = {p: codec.decode([t for t in ids if t not in data_ref.eos_ids])
                         for p, ids in zip(data_ref.prompts, data_ref.greedy_ids, strict=True)}
    return {"by_shape": by_shape}


def _run_list(kind: str, make_board: Callable[..., JetsonBoard], root: Path, trt_env: Path) -> dict[str, Any]:
    board = make_board(kind)
    data, inventory = root / "data", root / "inventory"
    link_real_toolchain(data, trt_env)
    board.write_inventory(inventory)
    board.set_answers(_answers(LAYOUTS[kind], data, root))
    env = {"HF_HUB_OFFLINE": "1", "EDGEFARM_DB_URL": None, "EDGEFARM_MODELS_DIR": str(root / "no-models")}
    result = CliRunner().invoke(app, ["run", "--priority", f"l0_pipeline_{kind}", "--json", "--inventory",
                                      str(inventory), "--data-dir", str(data)], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    text = result.stdout
    summary = json.JSONDecoder().raw_decode(text[text.index('{\n  "run_id"'):])[0]
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    with Session(engine) as s:
        rows = list(s.scalars(select(Result).where(Result.run_id == summary["run_id"])))
        envs = {e.digest: e.data for e in s.scalars(select(Environment))}
    engine.dispose()
    return {"board": board, "summary": summary, "rows": rows, "envs": envs, "data": data, "inventory": inventory}


@pytest.fixture(scope="module")
def orin(make_board: Callable[..., JetsonBoard], tmp_path_factory: pytest.TempPathFactory,
         trt_env: Path) -> dict[str, Any]:
    return _run_list("orin", make_board, tmp_path_factory.mktemp("board-orin"), trt_env)


@pytest.fixture(scope="module")
def thor(make_board: Callable[..., JetsonBoard], tmp_path_factory: pytest.TempPathFactory,
         trt_env: Path) -> dict[str, Any]:
    return _run_list("thor", make_board, tmp_path_factory.mktemp("board-thor"), trt_env)


def _by_row(rows: list[Result]) -> dict[str, dict[str, Result]]:
    out: dict[str, dict[str, Result]] = {}
    for r in rows:
        out.setdefault(r.test_id, {})[str(r.stage)] = r
    return out


def _check_list(run: dict[str, Any], kind: str) -> None:
    by_row = _by_row(run["rows"])
    layout = {t: st for t, st in by_row.items() if t.split("-fp16")[0].split("-int4")[0].split("-fp8")[0]
              .split("-nvfp4")[0] in LAYOUTS[kind]}
    assert len(layout) >= 2, sorted(by_row)
    for test_id, stages in layout.items():
        failed = {s: (r.status.value, r.reason) for s, r in stages.items() if r.status.value != "pass"}
        assert failed == {}, f"{test_id}: {failed}"
        assert all(r.standin for s, r in stages.items() if s not in ("quantize", "export")), test_id
    real = {t: st for t, st in by_row.items() if t not in layout}
    assert real, "the lists' real models are planned too"
    for test_id, stages in real.items():  # no checkpoint here (or waived): named, never run
        assert {r.status.value for r in stages.values()} <= {"skipped", "waived"}, test_id
    # every result row names its environment; the device stages' is the board's, read by the agent
    assert all(r.environment is not None for r in run["rows"])
    board: JetsonBoard = run["board"]
    for r in run["rows"]:
        env = run["envs"][r.environment]
        if r.device == board.id:
            assert env["where"] == "device" and env["l4t"]["release"] == board.kind.l4t
            assert env["jetpack"]["version"] == board.kind.jetpack and env["machine"] == "aarch64"
            assert env["power_mode"]["name"] == "MAXN" and env["clocks_locked"] is True
            build = env["toolchain"]["builds"][0]
            assert (build["version"], build["revision"]) == ("0.11.0", STANDIN_REVISION)
            trt = ".".join(board.kind.trt_version.split(".")[:3])
            assert env["toolchain"]["libs"]["libnvinfer.so.*.*.*"] == f"libnvinfer.so.{trt}"
        else:
            assert env["where"] == "orchestrator"


def test_l0_pipeline_orin_runs_end_to_end_on_a_jetpack_board(orin: dict[str, Any]) -> None:
    _check_list(orin, "orin")


def test_no_engine_bytes_cross_back_and_engines_stay_sealed_on_the_board(orin: dict[str, Any]) -> None:
    board: JetsonBoard = orin["board"]
    moved = orin["summary"]["transfers"][board.id]
    print("transfer counters of the l0_pipeline_orin run:", json.dumps(moved, indent=1))
    assert "llm.engine" not in moved["got_names"]  # the plan files never came back
    assert set(moved["got_names"]) <= {"config.json", "out.json", "e2e_prefill_inputlen128.csv",
                                       "e2e_decode_pastkvlen128.csv", "e2e.csv"}, moved["got_names"]
    builds = [r for r in orin["rows"] if str(r.stage) == "build" and r.status.value == "pass"]
    assert builds and all("stays on " + board.id in r.reason for r in builds)
    device = board.device()
    with open_transport(device) as link:
        usage = agent_client.run(device, link, "cache", "usage", "--cache", "cache")
    engines = [e for e in usage["entries"] if e["kind"] == "dir" and e["sealed"]
               and (board.work_dir / "cache" / e["sha256"] / "llm.engine").is_file()]
    assert len(engines) == len(builds)
    assert not any(e["in_use"] for e in usage["entries"])  # the run's markers went when it ended
    for e in engines:  # each sealed entry's name is the sha256 of its seal: its tree digest
        seal = (board.work_dir / "cache" / f"{e['sha256']}.sha256sums").read_bytes()
        assert hashlib.sha256(seal).hexdigest() == e["sha256"]


def test_the_benchmark_records_the_board_around_it(orin: dict[str, Any]) -> None:
    bench = [r for r in orin["rows"] if str(r.stage) == "bench" and r.status.value == "pass"]
    assert bench
    for r in bench:
        assert r.bench_conditions is None  # MAXN, clocks locked: the type's declared conditions
        around = orin["envs"][r.environment]["bench"]
        assert [a["mode"] for a in around] == ["prefill", "decode"]
        for a in around:
            for when in ("before", "after"):
                assert a[when]["power_mode"]["name"] == "MAXN" and a[when]["clocks_locked"] is True
                assert a[when]["thermal"] and a[when]["gpu_clock"]["cur_hz"] > 0


def test_the_board_passes_devices_check_and_no_standin_row_is_supported(orin: dict[str, Any]) -> None:
    result = CliRunner().invoke(app, ["devices", "check", "--inventory", str(orin["inventory"]), "--json"],
                                env={"EDGEFARM_DB_URL": None})
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)[0]
    assert report["healthy"] and report["python_version"].startswith("3.")
    assert (report["l4t"], report["jetpack"], report["power_mode"], report["clocks_locked"]) == (
        "36.4.3", "6.2", "MAXN", True)
    assert [(t["name"], t["build"], t["version"], t["ok"]) for t in report["toolchains"]] == [
        ("tensorrt-edgellm", "0.11.0", "0.11.0+standin", True)]
    rows = CliRunner().invoke(app, ["query", "--format", "json", "--platform", "orin"],
                              env={"EDGEFARM_DB_URL": f"sqlite:///{orin['data'] / 'edgefarm.db'}"})
    assert rows.exit_code == 0, rows.output
    assert not any(r["status"] == "l0_covered" for r in json.loads(rows.stdout))  # stand-ins are never evidence


def test_l0_pipeline_thor_runs_end_to_end_on_a_jetpack_board(thor: dict[str, Any]) -> None:
    _check_list(thor, "thor")
    moved = thor["summary"]["transfers"][thor["board"].id]
    assert "llm.engine" not in moved["got_names"]
