"""The content cache is one step of the generic stage body, declared per stage in the table (``cache=StageCache``).

Moving it there changed no key: for fixed inputs each cached stage's key is the digest it had before (computed on
main before the move and written here), so caches already filled stay valid. The table's ``cache_key`` names exactly
what each key is made of, and each stage's key function hands the body those inputs. The body itself, on a throwaway
cached stage of this module: a miss runs the work and remembers what it made, a hit is trusted only after the store
re-hashed its blob (a corrupt one is evicted: a miss), and a key function may decide the stage without the cache.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.orm import Session

from edgefarm import stages
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.devices.inventory import Device
from edgefarm.results import cache
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.models import CacheEntry, ResultStatus
from edgefarm.stages import REFERENCE, StageCache, StageSpec, Where
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks import stage_work
from edgefarm.tasks.build import build_key, engine_key_inputs
from edgefarm.tasks.common import run_stage
from edgefarm.tasks.export import export_key
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.quantize import quantize_key
from edgefarm.tasks.reference import reference_key, reference_key_inputs
from edgefarm.toolchains.base import driver
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.types import KVCachePrecision, LMHeadPrecision, Precision
from tests.helpers.toolchain_env import link_real_toolchain

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "edgellm" / "assets" / "stories260K"
SHA, ONNX = "ab" * 32, "cd" * 32
ORT_VERSION, TRT_VERSION = "0.5.0+onnxruntime-1.22", "0.11.0"
CTX = FarmContext(run_id=1, db_url="sqlite://", data_dir="/nowhere", inventory_dir="/nowhere")
CPU = Device(id="cpu-1", type="x86-cpu", transport="local", work_dir="/w")
ORIN = Device(id="orin-1", type="orin", work_dir="/w", host="127.0.0.1",
              toolchains={"tensorrt-edgellm": {"build_dir": "/b", "trt_package_dir": "/t", "plugin_path": "/p.so",
                                               "version": "0.11.0", "standin": True}})


ORT, TRT = "edgellm-ort", "tensorrt-edgellm"


def _job(precision: Precision, toolchain: str, platform: str = "x86-cpu", path: str = "/nowhere",
         **variant: Any) -> JobSpec:
    return JobSpec(model="stories260K", precision=precision, platform=platform, toolchain=toolchain, test_id="t",
                   checkpoint=CheckpointRef(model="stories260K", path=path, sha256=SHA), max_seq_len=256,
                   max_batch_size=2, max_input_len=128, stages=("export", "build"), **variant)


INT4 = _job(Precision.INT4_AWQ, ORT)
FP8 = _job(Precision.FP8, TRT, lm_head_precision=LMHeadPrecision.FP8,
           kv_cache_precision=KVCachePrecision.FP8)
ORT_FP32 = _job(Precision.FP32, ORT)
ORT_INT8_HEAD = _job(Precision.INT8_WO, ORT, lm_head_precision=LMHeadPrecision.INT8_WO)
TRT_FP16 = _job(Precision.FP16, TRT)
TRT_ORIN = _job(Precision.FP16, TRT, platform="orin")


@pytest.fixture
def fixed_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """What changes with every edit of the sources or an upgrade, fixed so that keys can be pinned."""

    import edgellm.build_id
    from edgefarm.tasks import reference

    monkeypatch.setattr(edgellm.build_id, "build_id", lambda: "build-1")
    monkeypatch.setattr(reference, "build_id", lambda: "build-1")
    monkeypatch.setattr(reference, "edgellm_version", "0.0.1")
    monkeypatch.setattr(reference, "transformers_version", lambda: "4.0.0")


def _variants() -> dict[str, list[dict[str, Any]]]:
    """Each cached stage's key inputs for fixed jobs, one per kind of key it makes (by toolchain)."""
    ort, trt = driver(ORT), driver(TRT)
    return {
        REFERENCE: [reference_key_inputs(SHA)],
        "quantize": [trt.host().quantize_key_inputs(INT4, CTX.quantize_device, TRT_VERSION),
                     trt.host().quantize_key_inputs(FP8, CTX.quantize_device, TRT_VERSION)],
        "export": [ort.host().export_key_inputs(SHA, ORT_FP32, ORT_VERSION),
                   ort.host().export_key_inputs(SHA, ORT_INT8_HEAD, ORT_VERSION),
                   trt.host().export_key_inputs(SHA, TRT_FP16, TRT_VERSION)],
        "build": [engine_key_inputs(ONNX, ORT_FP32, ORT_VERSION, {"edgellm_build": "build-1"},
                                    ort.device().build_key_inputs(CPU)),
                  engine_key_inputs(ONNX, TRT_ORIN, "0.11.0+standin",
                                    trt.device().runtime_key_inputs({"libs": {"libnvinfer.so.*.*.*":
                                                                     "/usr/lib/libnvinfer.so.10.3.0"}}),
                                    trt.device().build_key_inputs(ORIN))],
    }


# what main computed for these inputs before the cache moved into the generic body (bb2e55e); the TensorRT engine
# key changed once since, on purpose: its device has no edgellm (no edgellm_build), and an engine is the product of
# the board's TensorRT release (the versioned libnvinfer the agent found); the reference key changed once, on purpose:
# its file holds every layer's states since issue 36 (``layer_states``), so older files are not reused
PINNED = {
    REFERENCE: ["8bb608d9faf38aa1fe5382ea5fe6099042883356a89fe4cc0d8f92a353c2f105"],
    "quantize": ["ab708f60d84b91480453e7ce2e0e26a328a3e377f905e5c4693f01f95da6fbaa",
                 "2acf8475a8f377d24db9be9bc24a13503b9a7159204340cc4e9056a4fc9e052e"],
    "export": ["5322f74e529073272193801c2374c1a0e2181d041a77f31ad5706944529421e0",
               "7320fde6c0bb0be729940d132b777ec7211b61de29628939ce4fc887598fd9d6",
               "e6c04384f6f4cbb30d12cf06c5b3bf03f1f0783517597014313c72aad2d17d1f"],
    "build": ["5cbbcf9829cb1210a3f8ce2ce3b1d9fc17a9701ee29ebd0a95371ac1b84daf16",
              "c47b36212e80e7a53fa312f4c3ab09a421e260fee0660cf439ab26ef5512c94d"],
}


@pytest.mark.usefixtures("fixed_builds")
def test_todays_cache_keys_are_unchanged() -> None:
    keys = {stage: [cache.cache_key(inputs) for inputs in variants] for stage, variants in _variants().items()}
    assert keys == PINNED
    assert [s.name for s in stages.STAGES.values() if s.cache is not None] == [REFERENCE, "quantize", "export",
                                                                               "build"]


def test_the_tables_cache_key_names_what_each_key_is_made_of() -> None:
    """``cache_key``: every input besides "stage" that each key has; ``TOOLCHAIN_INPUTS``: the toolchain's driver
    adds its own (a key of a stage without it has exactly the table's inputs)."""
    for stage, variants in _variants().items():
        names = stages.spec(stage).cache_key
        required = {n for n in names if n != stages.TOOLCHAIN_INPUTS}
        for inputs in variants:
            got = set(inputs) - {"stage"}
            assert inputs["stage"] == stage
            assert required <= got, f"{stage}: the table names {required - got}, which its key lacks"
            if stages.TOOLCHAIN_INPUTS not in names:
                assert got == required, f"{stage}: key inputs {sorted(got - required)} are not in the table"
    # what a driver adds differs by toolchain (two keys of one stage made by two toolchains differ in their names)
    export = _variants()["export"]
    assert set(export[0]) != set(export[2])


def test_the_table_refuses_a_cache_without_key_names_and_key_names_without_a_cache() -> None:
    base = StageSpec(name="half", needs=(), where=Where.HOST, cache_key=(), timeout_s=1)
    declared = StageCache(kind=ArtifactKind.OTHER, packing=Packing.FILE, output="x")
    with pytest.raises(ConfigurationError, match="cached stage"):
        stages.register(StageSpec(**{**base.__dict__, "cache_key": ("checkpoint_sha256",)}))
    with pytest.raises(ConfigurationError, match="cached stage"):
        stages.register(StageSpec(**{**base.__dict__, "cache": declared}))
    with pytest.raises(ConfigurationError, match="hands the product on"):
        stages.register(StageSpec(**{**base.__dict__, "cache_key": ("a",),
                                     "cache": StageCache(kind=ArtifactKind.OTHER, packing=Packing.FILE,
                                                         output="")}))
    assert "half" not in stages.STAGES


# -- each stage's key function hands the body the inputs above, as it finds them --------------------------------
@pytest.fixture
def farm_ctx(tmp_path: Path) -> Iterator[FarmContext]:
    """A farm of its own: a migrated SQLite database, a store and the local CPU device."""
    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    db = f"sqlite:///{tmp_path / 'farm.db'}"
    upgrade(make_engine(db))
    ctx = FarmContext(run_id=1, db_url=db, data_dir=str(data), inventory_dir=str(inventory))
    yield ctx
    Farm.close(ctx)


def test_the_key_functions_hand_on_those_inputs(farm_ctx: FarmContext, trt_env: Path) -> None:
    job = _job(Precision.FP32, ORT, path=str(SOURCE))
    ref = reference_key(farm_ctx, job)
    assert isinstance(ref, Keyed) and ref.inputs == reference_key_inputs(SHA)
    assert (ref.toolchain, ref.toolchain_version, ref.device) == (None, None, "orchestrator")

    identity = quantize_key(farm_ctx, job)  # decided without the cache: the source is the checkpoint
    assert isinstance(identity, StageOutcome) and identity.passed and identity.outputs["checkpoint"] == job.checkpoint
    link_real_toolchain(Path(farm_ctx.data_dir), trt_env)
    int4 = dataclasses.replace(_job(Precision.INT4_AWQ, ORT, path=str(SOURCE)), quantizer=TRT)
    quantized = quantize_key(farm_ctx, int4)
    assert isinstance(quantized, Keyed) and quantized.toolchain == TRT
    assert quantized.toolchain_version == TRT_VERSION and quantized.on_hit is not None
    assert quantized.inputs == driver(TRT).host().quantize_key_inputs(INT4, farm_ctx.quantize_device, TRT_VERSION)

    upstream = StageOutcome(stage="quantize", status=ResultStatus.PASS, outputs={"checkpoint": job.checkpoint})
    exported = export_key(farm_ctx, job, upstream)
    version = driver(ORT).environment.host_version()
    assert exported.inputs == driver(ORT).host().export_key_inputs(SHA, job, version)
    assert exported.toolchain_version == version

    onnx = StageOutcome(stage="export", status=ResultStatus.PASS,
                        outputs={"onnx": ArtifactRef(ONNX, 1, ArtifactKind.ONNX, Packing.TAR)})
    built = build_key(farm_ctx, job, onnx)  # probes the local device's `edgellm env` (the toolchain's probe)
    facts = Farm.get(farm_ctx).backend_versions[f"local-cpu\0{ORT}"]
    assert built.inputs == engine_key_inputs(ONNX, job, version, {"edgellm_build": facts["edgellm_build"]}, {})
    assert built.inputs["edgellm_build"] == facts["edgellm_build"] and built.toolchain_version == version
    assert (built.route, built.standin, built.device) == (None, False, None)


# -- the generic body, on a throwaway cached stage ----------------------------------------------------------------
CALLS: list[str] = []


def made_key(ctx: FarmContext, job: JobSpec) -> Keyed | StageOutcome:
    if job.precision is Precision.FP16:
        return StageOutcome(stage="made", status=ResultStatus.NOT_APPLICABLE, reason="decided without the cache")
    return Keyed({"stage": "made", "checkpoint_sha256": job.checkpoint.sha256}, toolchain=ORT,
                 toolchain_version="v-key", device="orchestrator")


def made(ctx: FarmContext, job: JobSpec, *, keyed: Keyed) -> StageOutcome:
    CALLS.append(job.test_id)
    ref = Farm.get(ctx).store.put(f"made from {job.checkpoint.sha256}".encode() * 100, ArtifactKind.OTHER)
    keyed.made(ref, "v-made")
    if job.test_id == "fails-after":
        raise TestFailure("the work failed after it stored its product")
    out = StageOutcome(stage="made", status=ResultStatus.PASS, device="orchestrator", reason="made it")
    out.outputs["product"] = ref
    return out


MADE = StageSpec(name="made", needs=(), where=Where.HOST, cache_key=("checkpoint_sha256",), timeout_s=5,
                 cache=StageCache(kind=ArtifactKind.OTHER, packing=Packing.FILE,
                                  output="product", hit_reason="made cache hit", hit_metric="made_cache_hit"),
                 recorded=False)


@pytest.fixture
def made_stage() -> Iterator[None]:
    stages.register(MADE)
    stage_work.register("made", stage_work.StageWork(made, key=made_key))
    CALLS.clear()
    try:
        yield
    finally:
        stage_work.unregister("made")
        stages.unregister("made")


def _entry(ctx: FarmContext, key: str) -> CacheEntry | None:
    with Session(Farm.get(ctx).engine) as s:
        return s.get(CacheEntry, key)


@pytest.mark.usefixtures("made_stage")
def test_the_body_runs_a_miss_trusts_a_verified_hit_and_heals_a_corrupt_one(farm_ctx: FarmContext) -> None:
    job = _job(Precision.FP32, ORT)
    key = cache.cache_key({"stage": "made", "checkpoint_sha256": SHA})

    first = run_stage(farm_ctx, "made", job, ())
    assert first.passed and not first.cached and CALLS == ["t"] and first.reason == "made it"
    assert first.metrics["made_cache_hit"] == (0.0, "") and first.toolchain_version == "v-key"
    entry = _entry(farm_ctx, key)
    assert entry is not None and entry.sha256 == first.outputs["product"].sha256
    assert (entry.toolchain, entry.toolchain_version, entry.hits) == (ORT, "v-made", 0)

    hit = run_stage(farm_ctx, "made", job, ())
    assert CALLS == ["t"]  # the work did not run
    assert hit.passed and hit.cached and hit.reason == "made cache hit" and hit.device == "orchestrator"
    assert hit.metrics == {"made_cache_hit": (1.0, "")} and hit.toolchain_version == "v-made"  # the entry's
    assert hit.outputs["product"] == first.outputs["product"] and hit.artifacts == []  # no result row: no evidence
    assert _entry(farm_ctx, key).hits == 1  # type: ignore[union-attr]

    store = Farm.get(farm_ctx).store
    blob = store.path(entry.sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"rotted" + blob.read_bytes()[6:])
    healed = run_stage(farm_ctx, "made", job, ())  # no hit on a blob that no longer verifies: made again
    assert not healed.cached and CALLS == ["t", "t"] and store.has(entry.sha256)

    fp16 = run_stage(farm_ctx, "made", _job(Precision.FP16, ORT), ())
    assert fp16.status is ResultStatus.NOT_APPLICABLE and fp16.reason == "decided without the cache"
    assert CALLS == ["t", "t"] and fp16.metrics == {}


@pytest.mark.usefixtures("made_stage")
def test_what_the_work_vouched_for_is_remembered_though_it_failed_after(farm_ctx: FarmContext) -> None:
    job = dataclasses.replace(_job(Precision.FP32, ORT), test_id="fails-after")
    failed = run_stage(farm_ctx, "made", job, ())
    assert failed.status is ResultStatus.FAIL and "after it stored" in (failed.reason or "")
    assert CALLS == ["fails-after"]
    again = run_stage(farm_ctx, "made", job, ())
    assert again.cached and again.passed and CALLS == ["fails-after"]
