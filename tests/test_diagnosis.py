"""``edgellm eval``'s layer comparison and diagnosis on planted faults: a healthy 4-layer engine reports every layer
and no divergence; each fingerprint's fault is planted in a copy of that engine's ONNX graph, weights or tokenizer
(its manifest re-hashed so the engine opens), and eval must name the class and the layer."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellm.accuracy import EvalOptions, run_eval
from edgellm.compiler.files import sha256_file
from edgellm.diagnosis import diagnose

LAYERS = 4


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from edgellm.compiler.build import build_engine
    from edgellm.compiler.export import export_checkpoint
    from edgellm.synth import make_checkpoint

    root = tmp_path_factory.mktemp("diagnosis")
    make_checkpoint(root / "ckpt", "llama", num_hidden_layers=LAYERS)
    export_checkpoint(root / "ckpt", root / "onnx", "fp32")
    build_engine(root / "onnx", root / "engine", "ort")
    return root / "ckpt", root / "engine"


def _eval(ckpt: Path, engine: Path, layers: bool = False) -> dict[str, Any]:
    return run_eval(EvalOptions(engine_dir=engine, checkpoint=ckpt, max_tokens=256, greedy_tokens=8,
                                layers=layers, num_threads=1))


def _rehash(engine: Path) -> None:
    manifest = json.loads((engine / "engine_manifest.json").read_text())
    for name, entry in manifest["files"].items():
        entry.update(bytes=(engine / name).stat().st_size, sha256=sha256_file(engine / name))
    (engine / "engine_manifest.json").write_text(json.dumps(manifest))


def _planted(engine: Path, tmp_path: Path, edit: Any) -> Path:
    """A copy of ``engine`` whose graph ``edit(model, engine_dir)`` changed in place."""
    import onnx

    out = tmp_path / "engine"
    shutil.copytree(engine, out)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    edit(model, out)
    onnx.save_model(model, str(out / "model.onnx"))
    _rehash(out)
    return out


def _replace_initializer(model: Any, base: Path, name: str, change: Any) -> None:
    from onnx import numpy_helper

    for i, t in enumerate(model.graph.initializer):
        if t.name == name:
            array = change(numpy_helper.to_array(t, base_dir=str(base)).copy())
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(array, name))
            return
    raise AssertionError(f"no initializer {name}")


def _rope_tables(model: Any, base: Path, layer: int, change: Any) -> None:
    """Give ``layer``'s RotaryEmbedding nodes their own cos/sin tables, ``change(cos, sin) -> (cos, sin)``."""
    from onnx import numpy_helper

    nodes = [n for n in model.graph.node if n.op_type == "RotaryEmbedding"
             and n.name.startswith(f"/decoder/self_attn{'' if layer == 0 else f'_{layer}'}/")]
    assert len(nodes) == 2
    inits = {t.name: t for t in model.graph.initializer}
    cos = numpy_helper.to_array(inits[nodes[0].input[2]], base_dir=str(base))
    sin = numpy_helper.to_array(inits[nodes[0].input[3]], base_dir=str(base))
    cos, sin = change(cos.copy(), sin.copy())
    model.graph.initializer.extend([numpy_helper.from_array(cos.astype(np.float32), "planted_cos"),
                                    numpy_helper.from_array(sin.astype(np.float32), "planted_sin")])
    for n in nodes:
        n.input[2], n.input[3] = "planted_cos", "planted_sin"


def _tables(positions: np.ndarray, half: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    inv = theta ** (-np.arange(0, half, dtype=np.float64) * 2 / (2 * half))
    freqs = positions[:, None] * inv[None]
    return np.cos(freqs), np.sin(freqs)


def _assert_class(report: dict[str, Any], name: str, layer: int | None, part: str | None) -> None:
    assert not report["passed"]
    d = report["diagnosis"]
    assert (d["class"], d["layer"], d["part"]) == (name, layer, part), (d, report.get("layers_summary"))


def test_healthy_engine_reports_every_layer_and_no_divergence(built: tuple[Path, Path]) -> None:
    ckpt, engine = built
    report = _eval(ckpt, engine, layers=True)
    assert report["passed"]
    assert [e["layer"] for e in report["layers"]] == list(range(LAYERS))
    assert all(set(e["parts"]) == {"attention", "mlp"} and e["nonfinite"] == 0 for e in report["layers"])
    assert max(e["rel_diff"] for e in report["layers"]) <= report["layer_rel_limit"]
    assert report["first_divergent_layer"] is None
    assert report["diagnosis"] is None
    assert report["layers_summary"] == "layers 0-3 within 1e-04"


def test_without_layers_a_passing_eval_compares_no_layers(built: tuple[Path, Path]) -> None:
    ckpt, engine = built
    report = _eval(ckpt, engine)
    assert report["passed"] and "layers" not in report and "diagnosis" not in report


def test_nan_weight_is_nan_upstream_at_its_layer(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built

    def edit(model: Any, base: Path) -> None:
        def nan(a: np.ndarray) -> np.ndarray:
            a[0, 0] = np.nan
            return a
        _replace_initializer(model, base, "model.layers.2.mlp.down_proj.weight", nan)

    report = _eval(ckpt, _planted(engine, tmp_path, edit))  # failing: layers compared without --layers
    _assert_class(report, "nan_upstream", 2, "mlp")
    assert report["layers"][1]["nonfinite"] == 0 and report["layers"][2]["nonfinite"] > 0
    assert report["layers_summary"].startswith("diverges at layer 2 (mlp): rel inf")


def _interleave_layer_1(model: Any, _base: Path) -> None:
    for n in model.graph.node:
        if n.op_type == "RotaryEmbedding" and n.name.startswith("/decoder/self_attn_1/"):
            next(a for a in n.attribute if a.name == "interleaved").i = 1


def test_interleaved_rope_is_pair_layout(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built
    report = _eval(ckpt, _planted(engine, tmp_path, _interleave_layer_1))
    _assert_class(report, "rope_pair_layout", 1, "attention")
    assert report["first_divergent_layer"]["layer"] == 1
    assert report["layers"][0]["rel_diff"] <= report["layer_rel_limit"]


def test_a_stored_reference_with_layer_states_places_the_fault_too(built: tuple[Path, Path], tmp_path: Path) -> None:
    """The farm's way: eval --reference FILE on the device, no transformers there (edgellm reference
    --layer-states); a file without them says why no layer was compared."""
    from edgellm.reference import ReferenceSettings, compute_reference

    ckpt, engine = built
    settings = ReferenceSettings(max_tokens=256, greedy_tokens=8)
    compute_reference(ckpt, dataclasses.replace(settings, layer_states=True)).save(tmp_path / "ref.npz")
    compute_reference(ckpt, settings).save(tmp_path / "plain.npz")
    planted = _planted(engine, tmp_path, _interleave_layer_1)
    report = run_eval(EvalOptions(engine_dir=planted, reference=tmp_path / "ref.npz", num_threads=1))
    _assert_class(report, "rope_pair_layout", 1, "attention")
    assert len(report["layers"]) == LAYERS
    plain = run_eval(EvalOptions(engine_dir=planted, reference=tmp_path / "plain.npz", num_threads=1))
    assert plain["layers"] is None and "--layer-states" in plain["layers_unavailable"]
    assert plain["diagnosis"]["class"] == "unclassified"


def test_wrong_rope_theta_is_position_encoding(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built

    def edit(model: Any, base: Path) -> None:
        def change(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return _tables(np.arange(len(cos), dtype=np.float64), cos.shape[1], 1e8)  # config: 10000
        _rope_tables(model, base, 2, change)

    report = _eval(ckpt, _planted(engine, tmp_path, edit))
    _assert_class(report, "position_encoding", 2, "attention")


def test_rope_changed_past_a_length_is_rope_scaling(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built

    def edit(model: Any, base: Path) -> None:
        def change(cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            # positions >= 32 at a quarter of their angle (a linear scaling that short contexts never see)
            c, s = _tables(np.arange(len(cos), dtype=np.float64) / 4, cos.shape[1], 10000.0)
            cos[32:], sin[32:] = c[32:], s[32:]
            return cos, sin
        _rope_tables(model, base, 0, change)

    report = _eval(ckpt, _planted(engine, tmp_path, edit))
    _assert_class(report, "rope_scaling", 0, "attention")
    assert "wrong from position 32" in report["diagnosis"]["evidence"]


def test_transposed_weight_is_weight_layout(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built

    def edit(model: Any, base: Path) -> None:
        _replace_initializer(model, base, "model.layers.3.self_attn.o_proj.weight", lambda a: a.T.copy())

    report = _eval(ckpt, _planted(engine, tmp_path, edit))
    _assert_class(report, "weight_layout", 3, "attention")
    assert all(e["rel_diff"] <= report["layer_rel_limit"] for e in report["layers"][:3])
    # the same evidence from a quantized engine is a dequantization layout (valid-but-wrong tokens). Planted in a
    # synth_quant int4_awq engine of this random model instead (nibbles swapped, rows permuted), the fault moved the
    # residual stream by less than round-to-nearest int4 itself does (rel 0.25 vs 0.22 healthy): not separable there.
    quantized = diagnose(report, report, quantized=True, limit=report["layer_rel_limit"])
    assert quantized is not None and (quantized["class"], quantized["layer"]) == ("dequantization_layout", 3)


def test_swapped_vocabulary_is_tokenizer_mismatch(built: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, engine = built
    out = tmp_path / "engine"
    shutil.copytree(engine, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    first = json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"]
    from tokenizers import Tokenizer

    from edgellm.reference import PROMPTS  # the prompts every eval tokenizes

    used = Tokenizer.from_file(str(ckpt / "tokenizer.json")).encode(PROMPTS[0]).tokens[:2]
    a, b = used if used[0] != used[1] else (used[0], next(t for t in first if t != used[0]))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(tok))
    _rehash(out)
    report = _eval(ckpt, out)
    _assert_class(report, "tokenizer_mismatch", None, None)
    assert "tokenizer_match" in report["failed_checks"]
