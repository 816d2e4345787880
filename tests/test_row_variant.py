"""Variants are part of a row's key (issue 23): the test-list fields, the plan's ``variant`` object, the EAGLE3 pair
(its draft after its base), the toolchains' declared features, migration 0013 and rows that never collapse."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import Engine, text
from typer.testing import CliRunner

import edgefarm.toolchains.base as base
from edgefarm.cli import app
from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import Decision, plan_test_list
from edgefarm.pages.docs import matrix_rows
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import head_revision, schema_diff, upgrade
from edgefarm.results.queries import latest_status, passing_rows, row_history
from edgefarm.results.recorder import Recorder
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import load_list
from edgefarm.toolchains.tensorrt_edgellm.driver import TensorrtEdgellm, TrtEnvironment
from edgefarm.vocabulary.variant import Features, Lora, LoraMode, SpecMethod, SpecRole, Speculative, variant_key
from edgellm.types import KVCachePrecision
from tests.helpers.registries import registries_with

T0 = "2026-12-01 00:00:00"
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}


def _list(tmp_path: Path, tests: list[dict[str, Any]], platform: str = "thor", name: str = "v") -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"name": name, "stage": "l0", "description": "variants",
                                    "platforms": {"terms": [platform]},
                                    "defaults": {**LIMITS, "stages": ["export"]}, "tests": tests}))
    return path


@pytest.fixture
def trt_available() -> Iterator[None]:
    """TensorRT Edge-LLM's real driver (its real feature declaration), as if installed (planning only)."""

    class InstalledEnvironment(TrtEnvironment):
        def available(self) -> base.Availability:
            return base.Availability(True)

        def host_version(self) -> str:
            return "0.11.0"

    class Installed(TensorrtEdgellm):
        ENVIRONMENT = InstalledEnvironment

    with registries_with(replaced=[Installed]):
        yield


# -- the test list and the plan --------------------------------------------------------------------------------------
def test_the_variant_list_plans_every_variant_as_its_own_row_with_the_eagle3_draft_after_its_base(
        tmp_path: Path, trt_available: None) -> None:
    plan = plan_test_list(load_list("l0_variant_export"), load_inventory(data_dir=tmp_path), Catalog.load(),
                          data_dir=tmp_path)
    jobs = {j.test_id: j for j in plan.jobs}
    assert all(j.decision is Decision.RUN for j in plan.jobs), [(j.test_id, j.reason) for j in plan.jobs]
    variants = {j.entry.variant for j in plan.jobs}
    assert variants == {
        "spec=eagle3-base:tiny-llama-4l-eagle3", "spec=eagle3-draft:tiny-llama-4l",
        "lora=tiny-llama-lora-r4:r4:inserted", "lora=tiny-llama-lora-r4:r4:merged",
        "vocab=tiny-llama-vocab256:256", "fp8emb", "components=llm+visual"}
    base_id = "tiny-llama-4l-fp16-mxsl256-mxbs2-mxil128-eagle3base.tiny_llama_4l_eagle3"
    draft = jobs["tiny-llama-4l-eagle3-fp16-mxsl256-mxbs2-mxil128-eagle3draft.tiny_llama_4l"]
    assert draft.entry.after == base_id and jobs[base_id].entry.after is None
    assert draft.entry.features.speculative == Speculative(SpecMethod.EAGLE3, SpecRole.DRAFT, "tiny-llama-4l")
    # what the run reads besides each row's checkpoint: the draft, the adapter, the vocabulary map
    assert {"tiny-llama-4l-eagle3", "tiny-llama-lora-r4", "tiny-llama-vocab256"} <= set(plan.sources)
    as_json = {j["test_id"]: j for j in plan.to_json()["jobs"]}
    assert as_json[base_id]["variant"] == {
        "key": "spec=eagle3-base:tiny-llama-4l-eagle3", "kv_cache": None, "lm_head": None,
        "speculative": {"method": "eagle3", "role": "base", "pair": "tiny-llama-4l-eagle3"}, "lora": None,
        "reduced_vocab": None, "fp8_embedding": False, "components": ["llm"]}
    lora = next(j for i, j in as_json.items() if "lora.merged" in i)
    assert lora["variant"]["lora"] == {"adapter": "tiny-llama-lora-r4", "rank": 4, "mode": "merged"}


def test_dry_run_json_carries_a_variant_object_for_every_job(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--format", "json", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.output)["jobs"]
    assert jobs and all(set(j["variant"]) >= {"key", "kv_cache", "lm_head", "speculative", "lora", "reduced_vocab",
                                              "fp8_embedding", "components"} for j in jobs)


def test_a_draft_is_skipped_when_its_base_does_not_run(tmp_path: Path, trt_available: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The base must pass before its draft runs: a base the plan does not run takes its draft with it, naming it."""
    path = _list(tmp_path, [{"model": "tiny-llama-4l", "precision": "fp16",
                             "speculative": {"method": "eagle3", "draft": "tiny-llama-4l-eagle3"}}])
    catalog = Catalog.load()
    real_get = catalog.get

    def get(name: str) -> Any:  # the base's checkpoint cannot be had here: its job is skipped
        found = real_get(name)
        if name == "tiny-llama-4l":
            import dataclasses
            return dataclasses.replace(found, kind="path", spec={"path": str(tmp_path / "absent")})
        return found

    monkeypatch.setattr(catalog, "get", get)
    plan = plan_test_list(load_list(path), load_inventory(data_dir=tmp_path), catalog, data_dir=tmp_path)
    by = {j.model: j for j in plan.jobs}
    assert by["tiny-llama-4l"].decision is Decision.SKIPPED
    draft = by["tiny-llama-4l-eagle3"]
    assert draft.decision is Decision.SKIPPED
    assert draft.reason.startswith("runs after tiny-llama-4l-fp16-mxsl256-mxbs2-mxil128-eagle3base.tiny_llama_4l_eagle3"
                                   "@thor, which is skipped: checkpoint not available")


def test_variant_fields_are_checked_against_the_catalog_naming_the_bad_value(tmp_path: Path) -> None:
    path = _list(tmp_path, [
        {"model": "tiny-llama", "precision": "fp16", "lora": {"adapter": "tiny-llama-vocab256"}},
        {"model": "tiny-llama", "precision": "fp16", "reduced_vocab": "no-such-vocab"},
        {"model": "tiny-llama", "precision": "fp16", "speculative": {"method": "eagle3"}},
        {"model": "tiny-llama", "precision": "fp16", "speculative": {"method": "medusa", "draft": "x"}},
        {"model": "tiny-llama", "precision": "fp16", "components": ["visual"], "fp8_embedding": True},
        {"model": "tiny-llama", "precision": "fp16", "lora": {"adapter": "tiny-llama-lora-r4", "mode": "fused"}}])
    result = CliRunner().invoke(app, ["lists", "validate", str(path)])
    assert result.exit_code == 2, result.output
    out = " ".join(result.output.split())
    for expected in (
            "lora.adapter 'tiny-llama-vocab256' is a reduced vocab in the catalog; lora.adapter names a lora adapter",
            "unknown model 'no-such-vocab' in reduced_vocab",
            "eagle3 needs draft",
            "unknown speculative decoding method 'medusa'; valid: eagle3, mtp",
            "components must include llm",
            "unknown LoRA mode 'fused'; valid: inserted, merged"):
        assert expected in out, out
    assert "Traceback" not in result.output


def test_a_toolchain_refuses_the_features_it_does_not_run_with_its_reasons(tmp_path: Path) -> None:
    """edgellm-ort (the CPU's toolchain) declares no variant feature: a LoRA row on x86-cpu is refused by lists
    validate and not applicable in a matrix, with its reason; TensorRT Edge-LLM refuses MTP, naming the families."""
    path = _list(tmp_path, [{"model": "tiny-llama", "precision": "fp32",
                             "lora": {"adapter": "tiny-llama-lora-r4"}}], platform="x86-cpu")
    result = CliRunner().invoke(app, ["lists", "validate", str(path)])
    assert result.exit_code == 2
    assert "toolchain edgellm-ort does not run lora.inserted: its export reads no LoRA adapter" in \
        " ".join(result.output.split())
    mtp = base.driver("tensorrt-edgellm").features_problem(
        Features(speculative=Speculative(SpecMethod.MTP, SpecRole.BASE, "tiny-qwen3")))
    assert mtp is not None and "exports MTP only from checkpoints that carry MTP layers: Qwen3.5" in mtp
    lora = Features(lora=Lora("a", 4, LoraMode.MERGED))
    assert base.driver("tensorrt-edgellm").features_problem(lora) is None
    assert "onnxruntime-genai does not run lora.merged" in str(base.driver("onnxruntime-genai").features_problem(lora))


# -- the results database --------------------------------------------------------------------------------------------
@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    found = make_engine(migrated_db_url)
    yield found
    found.dispose()


def _record(recorder: Recorder, run: int, variant: str, status: str, test_id: str) -> None:
    for stage in ("infer", "accuracy"):
        recorder.record_result(run, model="m", precision="fp16", platform="thor", stage=stage, test_id=test_id,
                               status=status, toolchain="tensorrt-edgellm", toolchain_version="0.11.0",
                               variant=variant)


def test_rows_that_differ_only_in_a_variant_never_collapse(engine: Engine) -> None:
    recorder = Recorder(engine)
    run = recorder.start_run("nightly", trigger="test", code_version="v")
    fp8kv = variant_key(None, KVCachePrecision.FP8)
    _record(recorder, run, "", "pass", "m-fp16-mxsl256-mxbs2-mxil128")
    _record(recorder, run, fp8kv, "fail", "m-fp16-mxsl256-mxbs2-mxil128-fp8kv")
    recorder.finish_run(run, "failed")
    rows = {r.key.variant: r.verdict.value for r in latest_status(engine)}
    assert rows == {"": "pass", "kv=fp8": "fail"}
    assert [k.variant for k in passing_rows(engine)] == [""]
    assert {r.key.variant for r in row_history(engine, "m", "fp16", "thor")} == {"", "kv=fp8"}
    assert {r.variant: r.status for r in matrix_rows(engine)} == {"": "pass", "kv=fp8": "fail"}
    labels = {r.label for r in matrix_rows(engine)}
    assert labels == {"m", "m (kv=fp8)"}  # two table rows, never one cell


def test_a_variant_key_is_checked_when_recorded(engine: Engine) -> None:
    recorder = Recorder(engine)
    run = recorder.start_run("nightly", trigger="test", code_version="v")
    with pytest.raises(Exception, match="bad variant"):
        _record(recorder, run, "x" * 301, "pass", "t")


def test_migration_0013_backfills_the_variant_from_test_ids(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        assert upgrade(engine, "0012") == "0012"
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO runs (id, kind, trigger, code_version, started_at, status, published_at) "
                              "VALUES (1, 'nightly', 't', 'v', :t, 'passed', :t)"), {"t": T0})
            rows = [(1, "m-fp16-mxsl64-mxbs1-mxil32"), (2, "m-int4_awq-lmfp16-mxsl64-mxbs1-mxil32-fp8kv"),
                    (3, "m-int4_awq-mxsl64-mxbs1-mxil32-fp8kv-mycase")]
            conn.execute(text(
                "INSERT INTO results (id, run_id, model, precision, platform, stage, test_id, status, recorded_at, "
                "toolchain, job_toolchain, standin) VALUES (:id, 1, 'm', :p, 'thor', 'infer', :tid, 'pass', :t, "
                "'tensorrt-edgellm', 'tensorrt-edgellm', :f)"),
                [{"id": i, "tid": tid, "p": tid.split("-")[1], "t": T0, "f": False} for i, tid in rows])
        assert upgrade(engine) == head_revision()
        assert schema_diff(engine) == []
        with engine.connect() as conn:
            got = dict(conn.execute(text("SELECT id, variant FROM results")).all())
            latest = sorted(conn.execute(text("SELECT precision, variant FROM row_latest")).all())
        assert got == {1: "", 2: "kv=fp8;lm=fp16", 3: "kv=fp8"}
        assert latest == [("fp16", ""), ("int4_awq", "kv=fp8"), ("int4_awq", "kv=fp8;lm=fp16")]
    finally:
        engine.dispose()


def test_the_logits_width_check_reads_the_runtime_config_of_a_reduced_vocabulary_or_a_draft() -> None:
    """A reduced vocabulary's export (reduced_vocab_size) and an EAGLE3 draft's (draft_vocab_size) narrow the logits:
    the general structure check compared them with vocab_size and failed both (found in the first variant run)."""
    from edgefarm.toolchains.tensorrt_edgellm.onnx_check import _io_problems

    config = {"num_key_value_heads": 2, "head_dim": 8, "hidden_size": 64, "vocab_size": 512}
    inputs = {"inputs_embeds": ["tokens", 64]}
    for extra, width in (({}, 512), ({"reduced_vocab_size": 256}, 256),
                         ({"engine_role": "draft", "draft_vocab_size": 128}, 128)):
        assert _io_problems(inputs, {"logits": ["rows", width]}, {**config, **extra}, 0) == []
        wrong = _io_problems(inputs, {"logits": ["rows", 512 if width != 512 else 256]}, {**config, **extra}, 0)
        assert wrong == [f"logits ['rows', {512 if width != 512 else 256}] does not end in vocab size {width}"]


def test_the_catalogs_variant_parts_are_checked_and_a_path_part_says_what_it_is(tmp_path: Path) -> None:
    """A synth_variant entry names what it writes (and a base when it is made for one, a rank for an adapter, a size
    for a vocabulary); a path entry's role is read from its files: an adapter, a vocabulary map, an EAGLE3 draft."""
    from edgellm.errors import ConfigurationError

    shipped = yaml.safe_load((Path(__file__).resolve().parents[1] / "test_lists" / "models.yml").read_text())
    bad = {"a": {"synth_variant": {"writes": "medusa_heads"}},
           "b": {"synth_variant": {"writes": "lora_adapter", "rank": 4}},
           "c": {"base": "tiny-llama", "synth_variant": {"writes": "lora_adapter"}},
           "d": {"base": "tiny-llama", "synth_variant": {"writes": "reduced_vocab", "size": 64, "rank": 2}}}
    path = tmp_path / "models.yml"
    path.write_text(yaml.safe_dump({"models": {**shipped["models"], **bad}}))
    with pytest.raises(ConfigurationError) as caught:
        Catalog.load(path)
    text = " ".join(str(caught.value).split())
    assert "model 'a' synth_variant: Value error, writes 'medusa_heads' is not one of eagle3_draft, lora_adapter, " \
           "reduced_vocab, qwen2_5_vl" in text
    assert "model 'b': Value error, synth_variant writes lora_adapter for the entry's base: give base" in text
    assert "rank is given for writes: lora_adapter, and only for it" in text
    adapter, vocab, draft = tmp_path / "adapter", tmp_path / "vocab", tmp_path / "draft"
    for d in (adapter, vocab, draft):
        d.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (vocab / "vocab_map.safetensors").write_bytes(b"")
    (vocab / "reduced_vocab.json").write_text(json.dumps({"vocab_size": 512, "reduced_vocab_size": 128}))
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    path.write_text(yaml.safe_dump({"models": {**shipped["models"], "ad": {"path": str(adapter)},
                                               "vo": {"path": str(vocab)}, "dr": {"path": str(draft)}}}))
    catalog = Catalog.load(path)
    assert [catalog.get(n).role for n in ("ad", "vo", "dr", "tiny-llama")] == [
        "lora_adapter", "reduced_vocab", "eagle3_draft", "checkpoint"]
    assert catalog.get("ad").lora_rank() == 8 and catalog.get("vo").vocab_size() == 128
