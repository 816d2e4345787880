"""Bring-up rungs 5 and 6 (issue 21): a reference with the hidden states after the first N layers
(``edgellm reference --layers N``), and the few-layer numeric test (``edgellm layers-check``): the checkpoint cut to
N layers through edgellm's own export -> ONNX Runtime route against it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from edgellm.checkpoint import Checkpoint
from edgellm.checkpoint.truncate import truncate_checkpoint
from edgellm.cli import main
from edgellm.errors import ConfigurationError
from edgellm.reference import ReferenceSettings, checkpoint_digest, compute_reference, load_reference
from tests.fixtures.checkpoints import Ckpts
from tests.helpers.foreign import make_olmo2

SMALL = ["--greedy-tokens", "2", "--max-tokens", "32", "--window", "16"]


def _reference(ckpt: Path, out: Path, *flags: str) -> Path:
    assert main(["reference", str(ckpt), "--output", str(out), *SMALL, *flags]) == 0
    return out


@pytest.fixture(scope="module")
def refs(ckpts: Ckpts, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("layer-refs")
    return {"stories": _reference(ckpts.stories, d / "stories2.npz", "--layers", "2"),
            "qwen3": _reference(ckpts.qwen3, d / "qwen3_1.npz", "--layers", "1"),
            "stories_plain": _reference(ckpts.stories, d / "stories0.npz")}


def test_reference_stores_the_hidden_states_after_n_layers(refs: dict[str, Path], ckpts: Ckpts,
                                                           tmp_path: Path) -> None:
    import torch
    import transformers

    ref = load_reference(refs["stories"])
    assert ref.layers == 2 and ref.settings["layers"] == 2
    assert ref.checkpoint_sha256 == checkpoint_digest(ckpts.stories)
    assert "revision" in ref.header["checkpoint"]
    assert [h.shape for h in ref.hidden] == [(len(ids), 64) for ids in ref.prompt_ids]
    assert [lg.shape for lg in ref.layer_logits] == [(len(ids), 512) for ids in ref.prompt_ids]
    # the layer-N logits are what transformers computes on the checkpoint truncated to N layers
    truncate_checkpoint(ckpts.stories, tmp_path / "t2", 2)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "t2", dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ref.prompt_ids[0]]), output_hidden_states=True)
    np.testing.assert_allclose(out.logits[0].numpy(), ref.layer_logits[0], atol=1e-4)
    assert not np.allclose(ref.layer_logits[0], ref.prompt_logits[0], atol=1e-2)  # not the full model's
    assert load_reference(refs["stories_plain"]).layers == 0


def test_reference_layers_out_of_range_exit_2(ckpts: Ckpts, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reference", str(ckpts.stories), "--output", str(tmp_path / "r.npz"), "--layers", "6"]) == 2
    assert "--layers 6: checkpoint" in capsys.readouterr().err and not (tmp_path / "r.npz").exists()
    with pytest.raises(ConfigurationError, match=r"--layers -1: must be an integer >= 1"):
        compute_reference(ckpts.stories, ReferenceSettings(layers=-1))


def test_truncate_checkpoint_keeps_only_the_first_layers(ckpts: Ckpts, tmp_path: Path) -> None:
    info = truncate_checkpoint(ckpts.stories, tmp_path / "t", 2)
    assert (info["layers"], info["of_layers"]) == (2, 5)
    with safe_open(str(tmp_path / "t" / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert "model.layers.1.mlp.up_proj.weight" in names and not any(n.startswith("model.layers.2.") for n in names)
    assert json.loads((tmp_path / "t" / "config.json").read_text())["num_hidden_layers"] == 2
    assert Checkpoint.open(tmp_path / "t").ok and (tmp_path / "t" / "tokenizer.json").is_file()
    for bad in (0, 6):
        with pytest.raises(ConfigurationError, match=rf"--layers {bad}: checkpoint .* has 5 decoder layers; "
                                                     r"valid: 1\.\.5"):
            truncate_checkpoint(ckpts.stories, tmp_path / f"bad{bad}", bad)


@pytest.mark.parametrize("name,layers", [("stories", 2), ("qwen3", 1)])
def test_registered_family_passes_the_few_layer_check(name: str, layers: int, refs: dict[str, Path],
                                                      ckpts: Ckpts, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    rc = main(["layers-check", str(getattr(ckpts, name)), "--reference", str(refs[name]), "--layers", str(layers),
               "--output", str(out), "--work-dir", str(tmp_path)])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["schema"] == "edgellm.layers-check/1" and report["passed"] is True
    assert report["layers"] == layers and report["family"] == name.replace("stories", "llama")
    assert set(report["checks"]) == {"logits_max_abs_diff", "logits_min_cosine", "hidden_max_abs_diff",
                                     "hidden_min_cosine"}
    assert report["hidden"]["observable"] is True and report["logits"]["max_abs_diff"] < 1e-3
    assert report["route"] == {"export": "edgellm export", "precision": "fp32", "backend": "ort"}
    assert report["truncated"]["dropped_tensors"] > 0
    # every kept layer compared with transformers on the truncated checkpoint (issue 36), none diverging
    assert [e["layer"] for e in report["layers_compared"]] == list(range(layers))
    assert report["first_divergent_layer"] is None and report["layers_summary"].startswith(f"layers 0-{layers - 1}")
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # the work dir is cleaned up
    assert json.loads(capsys.readouterr().out)["passed"] is True


def test_a_wrong_layer_output_fails_with_the_numbers(refs: dict[str, Path], ckpts: Ckpts, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A reference whose layer-2 results are really layer 3's: the truncated engine disagrees, exit 1."""
    ref2 = load_reference(refs["stories"])
    ref3 = compute_reference(ckpts.stories, ReferenceSettings(layers=3, greedy_tokens=2, max_tokens=32, window=16))
    wrong = dataclasses.replace(ref2, hidden=ref3.hidden, layer_logits=ref3.layer_logits)
    wrong.save(tmp_path / "wrong.npz")
    rc = main(["layers-check", str(ckpts.stories), "--reference", str(tmp_path / "wrong.npz"),
               "--output", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "few-layer check failed after 2 layer(s): logits_max_abs_diff = " in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["passed"] is False
    assert {"logits_max_abs_diff", "hidden_max_abs_diff"} <= set(report["failed_checks"])
    assert report["checks"]["logits_max_abs_diff"]["value"] > 1e-3


def test_an_ill_conditioned_lm_head_leaves_the_hidden_states_unchecked(refs: dict[str, Path], ckpts: Ckpts,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from edgellm import layers_check

    monkeypatch.setattr(layers_check, "MAX_LM_HEAD_CONDITION", 1.0)
    report = layers_check.layers_check(ckpts.stories, refs["stories"])
    assert report["passed"] is True and set(report["checks"]) == {"logits_max_abs_diff", "logits_min_cosine"}
    assert report["hidden"]["observable"] is False
    assert "lm_head model.embed_tokens.weight [512, 64] has condition number" in report["hidden"]["why"]


def test_layers_check_bad_inputs_exit_2(refs: dict[str, Path], ckpts: Ckpts, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> str:
        assert main(["layers-check", *args]) == 2
        return capsys.readouterr().err

    stories, ref = str(ckpts.stories), str(refs["stories"])
    assert f"reference file {refs['stories_plain']} stores no hidden states" in run(
        stories, "--reference", str(refs["stories_plain"]))
    assert f"--layers 3: reference file {ref} stores the hidden states after 2 layer(s); valid: 2" in run(
        stories, "--reference", ref, "--layers", "3")
    assert f"reference file {refs['qwen3']} was made from checkpoint sha256" in run(
        stories, "--reference", str(refs["qwen3"]))
    assert f"{tmp_path / 'nope'}: checkpoint directory not found" in run(str(tmp_path / "nope"), "--reference", ref)
    assert "bad limits: min_cosine=2.0" in run(stories, "--reference", ref, "--min-cosine", "2")
    assert f"reference file {tmp_path / 'none.npz'} not found" in run(stories, "--reference",
                                                                      str(tmp_path / "none.npz"))
    foreign = make_olmo2(tmp_path / "foreign")
    assert "unknown model_type 'olmo2'; registered: gemma2, gemma3_text, llama, mistral, phi3, qwen2, qwen3" in run(
        str(foreign), "--reference", ref)


@pytest.mark.parametrize("family,overrides", [
    ("gemma2", {"final_logit_softcapping": 2.0}),  # its layer-2 logits reach ~1: a cap of 2 bends them by up to ~9%
    ("gemma3_text", {}),
])
def test_the_few_layer_check_takes_the_final_norm_and_logits_of_the_family(family: str, overrides: dict[str, float],
                                                                          tmp_path: Path) -> None:
    """Gemma's final norm scales by (1 + w), its residual after attention is read by pre_feedforward_layernorm
    (sandwich norms) and Gemma-2 soft-caps its final logits: the reference's layer-N logits are the model's own
    (capping included), the engine's hidden state is recovered through the family's maths (not Llama's RMSNorm and
    plain logits), and every layer's residual stream is found in the engine's graph, whose (1 + w) norms carry no
    checkpoint names."""
    import torch
    import transformers

    from edgellm.synth import make_checkpoint

    ckpt = make_checkpoint(tmp_path / family, family, tie_word_embeddings=True, **overrides)
    ref_file = _reference(ckpt, tmp_path / "ref.npz", "--layers", "2")
    ref = load_reference(ref_file)
    truncate_checkpoint(ckpt, tmp_path / "t2", 2)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "t2", dtype=torch.float32).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ref.prompt_ids[0]]))
    np.testing.assert_allclose(out.logits[0].numpy(), ref.layer_logits[0], atol=1e-5)
    out_file = tmp_path / "report.json"
    assert main(["layers-check", str(ckpt), "--reference", str(ref_file), "--output", str(out_file),
                 "--work-dir", str(tmp_path)]) == 0
    report = json.loads(out_file.read_text())
    assert report["passed"] is True and report["family"] == family and report["hidden"]["observable"] is True
    assert report["checks"]["hidden_max_abs_diff"]["value"] < 1e-4
    assert report["checks"]["logits_max_abs_diff"]["value"] < 1e-4
    assert [sorted(e["parts"]) for e in report["layers_compared"]] == [["attention", "mlp"]] * 2
    assert report["first_divergent_layer"] is None and report["layers_summary"].startswith("layers 0-1 within")
