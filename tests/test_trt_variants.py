"""NVIDIA's real tensorrt-edgellm exporter (and its LoRA tools) on tiny checkpoints of each row variant, on the CPU:
EAGLE3 base and draft, LoRA inserted and merged, a reduced vocabulary, an FP8 embedding table and the components of a
Qwen2.5-VL; each export checked by ``toolchains.tensorrt_edgellm.variants.check_variant_export``, and each check shown
to fail on an export that lacks what it looks for.

Every export runs once for the module (two at a time); a missing toolchain fails the session (``trt_env``).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgefarm.test_lists.catalog import Catalog
from edgefarm.toolchains.tensorrt_edgellm.export import export
from edgefarm.toolchains.tensorrt_edgellm.variants import (
    FEATURE_REASONS,
    FEATURES,
    LORA_DIR,
    MTP_REASON,
    VariantInputs,
    after_export,
    check_merged_lora,
    check_variant_export,
    exporter_args,
    lora_binding_problems,
    prepare_checkpoint,
    safetensors_header,
)
from edgefarm.vocabulary.variant import (
    FEATURE_NAMES,
    PLAIN,
    Component,
    Features,
    Lora,
    LoraMode,
    ReducedVocab,
    SpecMethod,
    SpecRole,
    Speculative,
)
from edgellm.errors import ConfigurationError, TestFailure
from edgellm.synth import make_checkpoint
from edgellm.synth_variants import (
    make_eagle3_draft,
    make_lora_adapter,
    make_qwen2_5_vl,
    make_reduced_vocab,
    special_token_ids,
)

RANK = 4
REDUCED = 128
LAYERS = 4  # an EAGLE3 base reads layers [2, n//2, n-3]
EAGLE_BASE = Features(speculative=Speculative(SpecMethod.EAGLE3, SpecRole.BASE, "tiny-llama4-eagle3"))
EAGLE_DRAFT = Features(speculative=Speculative(SpecMethod.EAGLE3, SpecRole.DRAFT, "tiny-llama4"))
LORA_INSERTED = Features(lora=Lora("tiny-llama4-lora", RANK, LoraMode.INSERTED))
LORA_MERGED = Features(lora=Lora("tiny-llama4-lora", RANK, LoraMode.MERGED))
VOCAB = Features(reduced_vocab=ReducedVocab("tiny-llama4-vocab", REDUCED))
FP8_EMBEDDING = Features(fp8_embedding=True)
VISUAL = Features(components=(Component.LLM, Component.VISUAL))


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@dataclass(frozen=True)
class Checkpoints:
    base: Path  # tiny Llama, 4 layers, fp16
    draft: Path  # its EAGLE3 draft (draft vocabulary: half the base's)
    lora: Path  # PEFT adapter on o/gate/up/down, rank RANK
    vocab: Path  # vocabulary map of REDUCED ids
    qwen3_128: Path  # the catalog's tiny-qwen3-128 (hidden 128: FP8 embedding blocks)
    vl: Path  # tiny Qwen2.5-VL


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    root = tmp_path_factory.mktemp("variant-ckpts")
    base = make_checkpoint(root / "llama4", "llama", dtype="fp16", num_hidden_layers=LAYERS)
    return Checkpoints(base=base, draft=make_eagle3_draft(base, root / "draft"),
                       lora=make_lora_adapter(base, root / "lora", rank=RANK),
                       vocab=make_reduced_vocab(base, root / "vocab", size=REDUCED),
                       qwen3_128=Catalog.load().get("tiny-qwen3-128").locate(root / "catalog"),
                       vl=make_qwen2_5_vl(root / "vl"))


@dataclass(frozen=True)
class Exported:
    root: Path  # the exporter's output dir: llm/, visual/ ...
    argv: list[str]
    wall_s: float  # the exporter's own run
    log: Path
    extra_s: float = 0.0  # merge-lora / insert-lora + process-lora around it
    error: str = ""  # an export expected to fail: why it did


@pytest.fixture(scope="module")
def exports(trt_env: Path, ckpts: Checkpoints, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Exported]:
    """Every variant exported once, two at a time (2-core hosts)."""
    root = tmp_path_factory.mktemp("variant-exports")
    inputs = VariantInputs(draft=ckpts.draft, lora=ckpts.lora, vocab=ckpts.vocab)

    def run(name: str, checkpoint: Path, features: Features, extra: tuple[str, ...] = ()) -> Exported:
        start = time.monotonic()
        source = prepare_checkpoint(trt_env, checkpoint, features, inputs, root / f"{name}.work",
                                    log=root / f"{name}.tools.log")
        merge_s = time.monotonic() - start
        result = export(trt_env, source, root / name, extra_args=[*exporter_args(features, inputs), *extra])
        return Exported(result.onnx_dir.parent, result.argv, result.wall_s, result.log, merge_s)

    jobs: dict[str, Callable[[], Exported]] = {
        "plain": lambda: run("plain", ckpts.base, PLAIN),
        "eagle_base": lambda: run("eagle_base", ckpts.base, EAGLE_BASE),
        "eagle_draft": lambda: run("eagle_draft", ckpts.draft, EAGLE_DRAFT),
        "lora_merged": lambda: run("lora_merged", ckpts.base, LORA_MERGED),
        "vocab": lambda: run("vocab", ckpts.base, VOCAB),
        "fp8_embedding": lambda: run("fp8_embedding", ckpts.qwen3_128, FP8_EMBEDDING),
        "visual": lambda: run("visual", ckpts.vl, VISUAL),
        # Features cannot say "llm only" apart from the default (which exports what the checkpoint has): the flag
        "llm_only": lambda: run("llm_only", ckpts.vl, PLAIN, ("--components", "thinker")),
    }
    def refused(name: str, checkpoint: Path, flag: str) -> Exported:
        start = time.monotonic()
        with pytest.raises(TestFailure) as failed:
            export(trt_env, checkpoint, root / name, extra_args=[flag])
        return Exported(root / name, [flag], time.monotonic() - start, root / name, error=str(failed.value))

    jobs["mtp_refused"] = lambda: refused("mtp_refused", ckpts.base, "--mtp")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        done = {name: f.result() for name, f in futures.items()}
    # inserted LoRA: the plain export, then insert-lora and process-lora on a copy of it
    plain = done["plain"]
    copy = root / "lora_inserted" / "onnx"
    shutil.copytree(plain.root, copy)
    start = time.monotonic()
    after_export(trt_env, copy, LORA_INSERTED, inputs, log=root / "lora_inserted.tools.log")
    done["lora_inserted"] = Exported(copy, plain.argv, plain.wall_s, plain.log, time.monotonic() - start)
    return done


def _loaded(log: Path) -> tuple[int, int]:
    """The exporter's 'Loaded N tensors, skipped M' for the LLM (its loader never fails on missing keys)."""
    found = re.search(r"Loaded (\d+) tensors, skipped (\d+)", log.read_text(encoding="utf-8", errors="replace"))
    assert found, f"no loader summary in {log}"
    return int(found[1]), int(found[2])


def _llm_config(e: Exported) -> dict[str, object]:
    data: dict[str, object] = json.loads((e.root / "llm" / "config.json").read_text(encoding="utf-8"))
    return data


# --- each variant's export has its structure


@pytest.mark.parametrize(("name", "features"), [
    ("plain", PLAIN), ("eagle_base", EAGLE_BASE), ("eagle_draft", EAGLE_DRAFT), ("lora_inserted", LORA_INSERTED),
    ("lora_merged", LORA_MERGED), ("vocab", VOCAB), ("fp8_embedding", FP8_EMBEDDING), ("visual", VISUAL),
    ("llm_only", PLAIN)])
def test_variant_export_has_its_structure(exports: dict[str, Exported], name: str, features: Features) -> None:
    assert check_variant_export(exports[name].root, features) == []


def test_flags_reach_the_exporter(exports: dict[str, Exported], ckpts: Checkpoints) -> None:
    assert exports["eagle_base"].argv[3:] == ["--eagle-base", "--eagle-draft-dir", str(ckpts.draft)]
    assert exports["eagle_draft"].argv[3:] == []  # a draft is known by its config
    assert exports["vocab"].argv[3:] == ["--reduced-vocab-dir", str(ckpts.vocab)]
    assert exports["fp8_embedding"].argv[3:] == ["--fp8-embedding"]
    assert exports["visual"].argv[3:] == ["--components", "thinker,visual"]
    assert exports["plain"].argv[3:] == exports["lora_merged"].argv[3:] == []


def test_eagle3_pair(exports: dict[str, Exported], ckpts: Checkpoints) -> None:
    base, draft = _llm_config(exports["eagle_base"]), _llm_config(exports["eagle_draft"])
    assert (base["spec_decode_type"], base["engine_role"]) == ("eagle3", "base")
    assert base["eagle_hidden_state_layers"] == [2, LAYERS // 2, LAYERS - 3]
    assert (draft["spec_decode_type"], draft["engine_role"]) == ("eagle3", "draft")
    assert draft["draft_vocab_size"] == 256 and draft["base_model_hidden_size"] == 3 * 64
    assert safetensors_header(exports["eagle_draft"].root / "llm" / "d2t.safetensors")["d2t"]["shape"] == [256]
    # every tensor of both checkpoints was read (the loader skips unknown keys without a word)
    assert _loaded(exports["eagle_base"].log) == (3 + 9 * LAYERS, 0)
    assert _loaded(exports["eagle_draft"].log) == (14, 0)


def test_reduced_vocab_map_is_copied(exports: dict[str, Exported], ckpts: Checkpoints) -> None:
    from safetensors.torch import load_file

    llm = exports["vocab"].root / "llm"
    copied = load_file(str(llm / "vocab_map.safetensors"))["vocab_map"]
    assert copied.tolist() == load_file(str(ckpts.vocab / "vocab_map.safetensors"))["vocab_map"].tolist()
    assert json.loads((llm / "reduced_vocab.json").read_text()) == {"vocab_size": 512, "reduced_vocab_size": REDUCED}
    assert _llm_config(exports["vocab"])["vocab_size"] == 512  # the embedding stays full size


def test_fp8_embedding_dtype(exports: dict[str, Exported]) -> None:
    fp8 = safetensors_header(exports["fp8_embedding"].root / "llm" / "embedding.safetensors")
    assert (fp8["embedding"]["dtype"], fp8["embedding"]["shape"]) == ("F8_E4M3", [512, 128])
    assert fp8["embedding_scale"]["dtype"] == "F32" and fp8["embedding_scale"]["shape"] == [512, 1]
    plain = safetensors_header(exports["plain"].root / "llm" / "embedding.safetensors")
    assert plain["embedding"]["dtype"] == "F16" and "embedding_scale" not in plain


def test_vision_language_components(exports: dict[str, Exported]) -> None:
    visual = exports["visual"].root
    assert sorted(p.name for p in visual.iterdir()) == ["llm", "visual"]
    config = json.loads((visual / "visual" / "config.json").read_text())
    assert config["model_type"] == "qwen2_5_vl" and config["image_token_id"] == 502
    assert (visual / "visual" / "preprocessor_config.json").is_file()
    assert _llm_config(exports["visual"])["image_token_id"] == 502
    assert sorted(p.name for p in exports["llm_only"].root.iterdir()) == ["llm"]
    assert _loaded(exports["visual"].log) == (27, 30)  # the LLM's tensors; the 30 visual ones are the encoder's


def test_merged_lora_weights_are_base_plus_delta(exports: dict[str, Exported], ckpts: Checkpoints) -> None:
    merged = exports["lora_merged"].root.parent.parent / "lora_merged.work" / "merged"
    assert check_merged_lora(ckpts.base, merged, ckpts.lora) == []
    assert _loaded(exports["lora_merged"].log) == (3 + 9 * LAYERS, 0)


def test_inserted_lora_outputs(exports: dict[str, Exported]) -> None:
    root = exports["lora_inserted"].root
    assert (root / "llm" / "lora_model.onnx").is_file() and (root / LORA_DIR / "config.json").is_file()
    header = safetensors_header(root / LORA_DIR / "processed_adapter_model.safetensors")
    assert len(header) == 2 * 4 * LAYERS  # A and B of o/gate/up/down in each layer
    assert header["model.layers.0.mlp.down_proj.lora_A.weight"]["shape"] == [128, RANK]  # [in, r]
    assert header["model.layers.0.mlp.down_proj.lora_B.weight"]["shape"] == [RANK, 64]  # [r, out]


def test_inserted_lora_inputs_do_not_bind_to_the_processed_adapter_and_the_check_says_so(
        exports: dict[str, Exported]) -> None:
    """tensorrt-edgellm 0.11.0 (torch 2.13 exporter): fp16 linears export as MatMul nodes named node_linear_N, and
    insert-lora names a MatMul's LoRA inputs after its node ('ode_linear_3.lora_A.weight'; only a Gemm gets its
    module's name), never after the modules process-lora writes ('model.layers.0.mlp.down_proj.lora_A.weight'): the
    binding check reports every adapter module, so the inserted row fails with that reason (a fixed exporter makes
    this test fail: then the row passes and this test is turned around)."""
    problems = lora_binding_problems(exports["lora_inserted"].root)
    assert len(problems) == 1 and " have none (e.g. model.layers.0." in problems[0], problems
    assert "the graph's LoRA stems are e.g. ode_linear" in problems[0], problems


def test_export_wall_times(exports: dict[str, Exported]) -> None:
    times = {name: (round(e.wall_s, 1), round(e.extra_s, 1)) for name, e in exports.items() if not e.error}
    print("export wall s, tool s:", json.dumps(times))
    assert all(wall < 600 for wall, _ in times.values()), times


# --- each check fails on an export without what it looks for


def test_plain_export_is_no_eagle_base(exports: dict[str, Exported]) -> None:
    problems = check_variant_export(exports["plain"].root, EAGLE_BASE)
    assert any("expected an output hidden_states" in p and "logits" in p for p in problems), problems
    assert any("spec_decode_type 'eagle3', engine_role 'base'; found 'none', 'llm'" in p for p in problems), problems


def test_eagle_base_is_no_draft_nor_plain(exports: dict[str, Exported]) -> None:
    problems = check_variant_export(exports["eagle_base"].root, EAGLE_DRAFT)
    assert any("expected a draft input hidden_states_input" in p for p in problems), problems
    assert any("d2t.safetensors; not written" in p for p in problems), problems
    plain = check_variant_export(exports["eagle_base"].root, PLAIN)
    assert any("no hidden_states output in a plain LLM graph" in p for p in plain), plain


def test_plain_export_has_no_reduced_vocab(exports: dict[str, Exported]) -> None:
    problems = check_variant_export(exports["plain"].root, VOCAB)
    assert f"expected logits over the reduced vocabulary ({REDUCED}); found last dim 512" in problems, problems
    assert any("reduced_vocab_size 128; found None" in p for p in problems), problems
    assert any("reduced_vocab_size 128" in p for p in check_variant_export(exports["vocab"].root, PLAIN))


def test_fp8_check_reads_the_dtype(exports: dict[str, Exported]) -> None:
    problems = check_variant_export(exports["plain"].root, FP8_EMBEDDING)
    assert "expected embedding dtype F8_E4M3 (fp8_embedding); found F16" in problems, problems
    assert check_variant_export(exports["fp8_embedding"].root, PLAIN) == [
        "expected an fp16 embedding table (no fp8_embedding); found F8_E4M3"]


def test_component_checks(exports: dict[str, Exported]) -> None:
    problems = check_variant_export(exports["llm_only"].root, VISUAL)
    assert any("expected component visual" in p and "missing model.onnx" in p for p in problems), problems
    extra = check_variant_export(exports["visual"].root, Features(components=(Component.LLM, Component.AUDIO)))
    assert any("also found visual/" in p for p in extra), extra


def test_visual_output_width_is_checked(exports: dict[str, Exported], tmp_path: Path) -> None:
    copy = tmp_path / "onnx"
    shutil.copytree(exports["visual"].root, copy, ignore=shutil.ignore_patterns("*.data"))
    config = json.loads((copy / "llm" / "config.json").read_text())
    (copy / "llm" / "config.json").write_text(json.dumps({**config, "hidden_size": 96}))  # not the visual's 64
    problems = check_variant_export(copy, VISUAL)
    assert any("visual output's last dim = the LLM's hidden size 96" in p for p in problems), problems


def test_lora_checks(exports: dict[str, Exported], ckpts: Checkpoints) -> None:
    missing = check_variant_export(exports["plain"].root, LORA_INSERTED)
    assert any("expected insert-lora's graph" in p for p in missing), missing
    other_rank = Features(lora=Lora("tiny-llama4-lora", 8, LoraMode.INSERTED))
    assert any("rank 8; found ranks [4]" in p
               for p in check_variant_export(exports["lora_inserted"].root, other_rank))
    unmerged = check_merged_lora(ckpts.base, ckpts.base, ckpts.lora)
    assert len(unmerged) == 4 * LAYERS and "= base + B@A*2; off by up to" in unmerged[0], unmerged


# --- without the exporter


def test_feature_declaration() -> None:
    assert set(FEATURE_NAMES) >= FEATURES
    assert "speculative.mtp.base" not in FEATURES and "components.audio" not in FEATURES
    for name in ("speculative.mtp.base", "speculative"):  # features_problem looks up the first part
        assert FEATURE_REASONS[name] == MTP_REASON
    assert "Qwen3.5" in MTP_REASON and "Nemotron-H" in MTP_REASON


def test_mtp_reason_is_the_exporters(exports: dict[str, Exported]) -> None:
    """The reason MTP rows are refused quotes what the exporter says on a checkpoint without MTP layers."""
    quoted = MTP_REASON.split("stops with ")[1].strip("'")
    assert quoted in exports["mtp_refused"].error, exports["mtp_refused"].error


def test_refused_and_incomplete_variants() -> None:
    mtp = Features(speculative=Speculative(SpecMethod.MTP, SpecRole.BASE, "x"))
    with pytest.raises(ConfigurationError, match="MTP only from checkpoints that carry MTP layers"):
        exporter_args(mtp, VariantInputs())
    with pytest.raises(ConfigurationError, match=r"no vocab_map\.safetensors"):
        exporter_args(VOCAB, VariantInputs())
    with pytest.raises(ConfigurationError, match="EAGLE3 draft"):
        exporter_args(Features(speculative=EAGLE_DRAFT.speculative, fp8_embedding=True), VariantInputs())
    with pytest.raises(ConfigurationError, match="not resolved"):
        exporter_args(LORA_MERGED, VariantInputs())
    assert exporter_args(PLAIN, VariantInputs()) == [] and exporter_args(EAGLE_BASE, VariantInputs()) == [
        "--eagle-base"]


def test_synthetic_variants_are_deterministic(ckpts: Checkpoints, tmp_path: Path) -> None:
    import transformers

    for make, src in ((lambda out: make_eagle3_draft(ckpts.base, out), ckpts.draft),
                      (lambda out: make_lora_adapter(ckpts.base, out, rank=RANK), ckpts.lora)):
        again = make(tmp_path / src.name)
        for f in src.glob("*.safetensors"):
            assert (again / f.name).read_bytes() == f.read_bytes()
    assert special_token_ids(ckpts.base) == [0, 1, 2]  # unk, bos, eos of the bundled tokenizer
    config = transformers.AutoConfig.from_pretrained(ckpts.vl)
    assert config.model_type == "qwen2_5_vl" and config.vision_config.out_hidden_size == config.text_config.hidden_size
    with pytest.raises(ConfigurationError, match="needs >= 4 decoder layers"):
        make_eagle3_draft(make_checkpoint(tmp_path / "two", "llama"), tmp_path / "d")
