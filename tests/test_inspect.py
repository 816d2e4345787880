"""``edgellm inspect`` on the session checkpoints (all clean) and on corrupted copies (exit 2, one line each)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgellm.checkpoint import Checkpoint
from edgellm.cli import main
from edgellm.errors import CheckpointError
from tests.fixtures.checkpoints import Ckpts
from tests.st_helpers import by_offset, rewrite, set_field

CLEAN = ["stories", "llama", "llama_rope3", "mistral", "qwen2", "qwen3", "qwen2_tied_bf16_sharded", "llama_fp16"]
FAMILY = {"stories": "llama", "llama": "llama", "llama_rope3": "llama", "mistral": "mistral", "qwen2": "qwen2",
          "qwen3": "qwen3", "qwen2_tied_bf16_sharded": "qwen2", "llama_fp16": "llama"}
DTYPE = {"qwen2_tied_bf16_sharded": "BF16", "llama_fp16": "F16"}
Q_PROJ = "model.layers.1.self_attn.q_proj.weight"
SHARDED = "qwen2_tied_bf16_sharded"


def inspect(capsys: pytest.CaptureFixture[str], ckpt: Path, out: Path) -> tuple[int, str, str, dict[str, Any]]:
    rc = main(["inspect", str(ckpt), "--output", str(out)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err, json.loads(out.read_text())


@pytest.mark.parametrize("name", CLEAN)
def test_clean_checkpoints_inspect_ok(name: str, ckpts: Ckpts, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    import transformers

    path = getattr(ckpts, name)
    rc, out, err, inv = inspect(capsys, path, tmp_path / "inv.json")
    assert (rc, err) == (0, ""), err
    assert inv["ok"] is True and inv["problems"] == []
    assert inv["family"] == FAMILY[name]
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert inv["parameters"] == sum(p.numel() for p in model.parameters())
    assert set(inv["dtypes"]) == {DTYPE.get(name, "F32")}
    assert inv["bytes"] == sum(v["bytes"] for v in inv["dtypes"].values())
    rec = inv["reconciliation"]
    assert rec["matched"] == rec["expected"] and not rec["missing"] and not rec["unexpected"]
    n = inv["config"]["num_hidden_layers"]
    patterns = {p["pattern"]: p for p in inv["patterns"]}
    q = patterns[f"model.layers.{{0..{n - 1}}}.self_attn.q_proj.weight"]
    assert q["count"] == n and q["shapes"] == [[inv["config"]["num_attention_heads"] * inv["config"]["head_dim"],
                                                inv["config"]["hidden_size"]]]
    assert sum(p["count"] for p in inv["patterns"]) == inv["tensor_count"]
    assert ("lm_head.weight" in patterns) != inv["config"]["tie_word_embeddings"]
    assert inv["sharded"] == (name == SHARDED) and (len(inv["shards"]) > 1) == (name == SHARDED)
    assert inv["quantization"]["method"] == "none"
    assert "status      OK" in out and f"model.layers.{{0..{n - 1}}}.mlp.down_proj.weight" in out


def test_load_tensor_after_validation(ckpts: Ckpts, tmp_path: Path) -> None:
    ck = Checkpoint.open(ckpts.qwen2_tied_bf16_sharded)
    ck.validate()
    expected = {}
    for f in sorted(ckpts.qwen2_tied_bf16_sharded.glob("*.safetensors")):
        expected.update(load_file(f))
    for name, info in ck.tensors.items():
        t = ck.load_tensor(name)
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == info.shape
        assert torch.equal(t, expected[name])
    with pytest.raises(CheckpointError, match="no such tensor"):
        ck.load_tensor("lm_head.weight")
    # A file changed after its header was validated is refused, not read.
    bad = ckpts.copy("llama", tmp_path / "llama")
    ck = Checkpoint.open(bad)
    with (bad / "model.safetensors").open("ab") as f:
        f.write(b"\0" * 4)
    with pytest.raises(CheckpointError, match="changed since its header was validated"):
        ck.load_tensor(Q_PROJ)
    # A checkpoint with problems is never read.
    set_field(bad / "model.safetensors", Q_PROJ, "dtype", "F12")
    set_field(bad / "model.safetensors", "model.norm.weight", "shape", [-1])
    ck = Checkpoint.open(bad)
    assert len(ck.problems) == 2
    with pytest.raises(CheckpointError, match=r"unknown dtype 'F12'.*\(and 1 more problem"):
        ck.load_tensor("model.norm.weight")


# --- corruptions ---------------------------------------------------------------------------------------------


def truncate_data(d: Path) -> None:
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size - 1000])


def truncate_header(d: Path) -> None:
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[:100])


def absurd_length(d: Path) -> None:
    p = d / "model.safetensors"
    p.write_bytes((2**60).to_bytes(8, "little") + p.read_bytes()[8:])


def not_json(d: Path) -> None:
    p = d / "model.safetensors"
    blob = p.read_bytes()
    p.write_bytes(blob[:8] + b"\x00garbage" + blob[17:])


def overlap(d: Path) -> None:
    def mutate(h: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
        second = by_offset(h)[1]
        h[second]["data_offsets"] = [x - 4 for x in h[second]["data_offsets"]]
        return h, data

    rewrite(d / "model.safetensors", mutate)


def hole(d: Path) -> None:
    def mutate(h: dict[str, Any], data: bytes) -> tuple[dict[str, Any], bytes]:
        names = by_offset(h)
        for n in names[1:]:
            h[n]["data_offsets"] = [x + 16 for x in h[n]["data_offsets"]]
        cut = h[names[0]]["data_offsets"][1]
        return h, data[:cut] + b"\0" * 16 + data[cut:]

    rewrite(d / "model.safetensors", mutate)


def duplicate_name(d: Path) -> None:
    def mutate(h: dict[str, Any], data: bytes) -> tuple[bytes, bytes]:
        raw = json.dumps(h)
        entry = json.dumps(h["model.norm.weight"])
        return (raw[:-1] + f', "model.norm.weight": {entry}}}').encode(), data

    rewrite(d / "model.safetensors", mutate)


def resave(d: Path, change: Callable[[dict[str, torch.Tensor]], None], file: str = "model.safetensors") -> None:
    tensors = load_file(d / file)
    change(tensors)
    save_file(tensors, d / file, metadata={"format": "pt"})


def edit_index(d: Path, change: Callable[[dict[str, str]], None]) -> None:
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    change(idx["weight_map"])
    p.write_text(json.dumps(idx))


def shard_of(d: Path, tensor: str) -> str:
    return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"][tensor]


def in_two_shards(d: Path) -> None:
    first = shard_of(d, "model.embed_tokens.weight")
    other = shard_of(d, "model.norm.weight")
    assert first != other
    emb = load_file(d / first)["model.embed_tokens.weight"]
    resave(d, lambda t: t.update({"model.embed_tokens.weight": emb}), file=other)


def write_json(d: Path, name: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    p = d / name
    p.write_text(json.dumps(change(json.loads(p.read_text()) if p.exists() else {})))


L = "model.safetensors"
CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None], list[str]]] = {
    "truncated_data": ("llama", truncate_data, [
        f"problem: {L}: tensor ", "lie outside the", "data section"]),
    "truncated_header": ("llama", truncate_header, [f"problem: {L}: header length", "(truncated file)"]),
    "absurd_header_length": ("llama", absurd_length, [f"problem: {L}: header length {2**60} exceeds the",
                                                      "-byte cap"]),
    "header_not_json": ("llama", not_json, [f"problem: {L}: header is not valid UTF-8 JSON"]),
    "overlap": ("llama", overlap, [f"problem: {L}: tensor ",
                                   "data_offsets [131068, 262140] overlap tensor 'lm_head.weight'"]),
    "hole": ("llama", hole, [f"problem: {L}: tensor ", "hole: bytes ["]),
    "unknown_dtype": ("llama", lambda d: set_field(d / L, Q_PROJ, "dtype", "F12"),
                      [f"problem: {L}: tensor '{Q_PROJ}': unknown dtype 'F12'; known: BF16, BOOL"]),
    "negative_shape": ("llama", lambda d: set_field(d / L, Q_PROJ, "shape", [-64, 64]),
                       [f"problem: {L}: tensor '{Q_PROJ}': shape [-64, 64] must be a list of non-negative"]),
    "span_mismatch": ("llama", lambda d: set_field(d / L, Q_PROJ, "shape", [64, 32]),
                      [f"problem: {L}: tensor '{Q_PROJ}': data_offsets span 16384 bytes but shape [64, 32] x F32 "
                       "needs 8192"]),
    "duplicate_name": ("llama", duplicate_name, [f"problem: {L}: header is not valid: duplicate key "
                                                 "'model.norm.weight'"]),
    "missing_layer_weight": ("llama", lambda d: resave(d, lambda t: t.pop(Q_PROJ)),
                             [f"problem: tensor '{Q_PROJ}': missing: family llama needs it with shape [64, 64]"]),
    "wrong_shape": ("llama", lambda d: resave(d, lambda t: t.update({Q_PROJ: torch.zeros(64, 32)})),
                    [f"problem: {L}: tensor '{Q_PROJ}': wrong shape [64, 32]; family llama expects [64, 64]"]),
    "unexplained_extra": ("llama", lambda d: resave(d, lambda t: t.update({"model.extra.weight": torch.zeros(2)})),
                          [f"problem: {L}: tensor 'model.extra.weight': unexplained tensor: family llama does not "
                           "use it, it is not tied, and no ignore rule matches it"]),
    "int_weight_unquantized": ("llama", lambda d: resave(d, lambda t: t.update(
        {Q_PROJ: torch.zeros(64, 64, dtype=torch.int8)})),
        [f"problem: {L}: tensor '{Q_PROJ}': dtype I8 is not a float type", "declares no quantization"]),
    "broken_config": ("llama", lambda d: (d / "config.json").write_text("{"),
                      ["problem: ", "config.json: config.json is not valid JSON"]),
    "unknown_quant_algo": ("llama", lambda d: write_json(d, "hf_quant_config.json", lambda _: {
        "quantization": {"quant_algo": "W3A5"}}), ["problem: ", "hf_quant_config.json: unknown quant_algo 'W3A5'; "
                                                    "known: FP8, INT8_SQ, MXFP8, NVFP4"]),
    "quantized_without_scales": ("llama", lambda d: write_json(d, "hf_quant_config.json", lambda _: {
        "quantization": {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}}),
        [f"problem: {L}: tensor '{Q_PROJ}': declared fp8-quantized", "but stored as unpacked float F32 [64, 64]; "
         "fp8 stores weight F8_E4M3 [64, 64], weight_scale [] (scalar), input_scale [] (scalar)"]),
    "hf_awq_format_unread": ("llama", lambda d: write_json(d, "config.json", lambda c: {
        **c, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}),
        ["problem: checkpoint declares int4_awq quantization", "only ModelOpt's unified format",
         f"problem: {L}: tensor '{Q_PROJ}': declared int4_awq-quantized but has no scale tensor"]),
    "missing_shard": (SHARDED, lambda d: (d / shard_of(d, Q_PROJ)).unlink(),
                      ["problem: model-0000", "shard named by model.safetensors.index.json for",
                       "tensor(s) does not exist"]),
    "index_names_absent_tensor": (SHARDED, lambda d: edit_index(d, lambda m: m.update(
        {"model.ghost.weight": m[Q_PROJ]})), ["tensor 'model.ghost.weight': model.safetensors.index.json maps this "
                                              "tensor to 'model-0000", "which does not contain it"]),
    "tensor_absent_from_index": (SHARDED, lambda d: edit_index(d, lambda m: m.pop(Q_PROJ)),
                                 [f"tensor '{Q_PROJ}': tensor is in the shard but absent from "
                                  "model.safetensors.index.json"]),
    "shard_path_traversal": (SHARDED, lambda d: edit_index(d, lambda m: m.update({Q_PROJ: "../" + m[Q_PROJ]})),
                             [f"problem: model.safetensors.index.json: tensor '{Q_PROJ}': shard name '../model-0000",
                              "is not a plain file name inside the checkpoint directory"]),
    "shard_absolute_path": (SHARDED, lambda d: edit_index(d, lambda m: m.update({Q_PROJ: "/etc/x.safetensors"})),
                            ["shard name '/etc/x.safetensors' is not a plain file name"]),
    "tensor_in_two_shards": (SHARDED, in_two_shards, ["tensor 'model.embed_tokens.weight': tensor is stored in two "
                                                      "shards ('model-0000"]),
    "stale_shard": (SHARDED, lambda d: (d / "model-extra.safetensors").write_bytes((d / shard_of(d, Q_PROJ))
                                                                                    .read_bytes()),
                    ["problem: model-extra.safetensors: safetensors file is not named by model.safetensors.index"]),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_exit_2_with_reason(case: str, ckpts: Ckpts, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    base, corrupt, needles = CORRUPTIONS[case]
    d = ckpts.copy(base, tmp_path / "ck")
    corrupt(d)
    out = tmp_path / "inv.json"
    out.write_text("stale")
    rc, _, err, inv = inspect(capsys, d, out)
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    problem_lines = [ln for ln in lines if ln.startswith("problem: ")]
    assert problem_lines and len(problem_lines) == len(lines) - 1, err
    assert lines[-1].startswith(f"edgellm inspect: {d}: {len(problem_lines)} problem(s)")
    for needle in needles:
        assert any(needle in ln for ln in problem_lines), f"{needle!r} not in:\n{err}"
    assert inv["ok"] is False and len(inv["problems"]) == len(problem_lines)
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_unknown_model_type_is_a_finding_unless_a_family_is_required(ckpts: Ckpts, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    d = ckpts.copy("llama", tmp_path / "ck")
    write_json(d, "config.json", lambda c: {**c, "model_type": "gpt9", "architectures": []})
    rc, out, err, inv = inspect(capsys, d, tmp_path / "inv.json")
    assert (rc, err) == (0, "") and inv["ok"] is True and inv["family"] is None
    assert "finding: no_registered_family: unknown model_type 'gpt9'" in out
    rc = main(["inspect", str(d), "--require-family"])
    err = capsys.readouterr().err
    assert rc == 2 and ("problem: unknown model_type 'gpt9'; registered: gemma2, gemma3_text, llama, mistral, phi3, "
                        "qwen2, qwen3") in err


def test_problems_are_collected_across_files(ckpts: Ckpts, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    d = ckpts.copy(SHARDED, tmp_path / "ck")
    q_shard = shard_of(d, Q_PROJ)
    set_field(d / q_shard, Q_PROJ, "dtype", "F12")
    edit_index(d, lambda m: m.update({"model.ghost.weight": m["model.norm.weight"]}))
    resave(d, lambda t: t.update({"model.extra.weight": torch.zeros(2, dtype=torch.bfloat16)}),
           file=shard_of(d, "model.norm.weight"))
    rc, _, _, inv = inspect(capsys, d, tmp_path / "inv.json")
    assert rc == 2
    for needle in (f"{q_shard}: tensor '{Q_PROJ}': unknown dtype 'F12'", "tensor 'model.ghost.weight'",
                   "tensor 'model.extra.weight': tensor is in the shard but absent",
                   "tensor 'model.extra.weight': unexplained tensor"):
        assert any(needle in p for p in inv["problems"]), (needle, inv["problems"])


def test_missing_directory_and_no_weights(tmp_path: Path, capsys: pytest.CaptureFixture[str], ckpts: Ckpts) -> None:
    rc, _, err, inv = inspect(capsys, tmp_path / "nope", tmp_path / "a.json")
    assert rc == 2 and "checkpoint directory not found" in err and inv["ok"] is False
    d = ckpts.copy("llama", tmp_path / "bin")
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    rc, _, err, _ = inspect(capsys, d, tmp_path / "b.json")
    assert rc == 2 and "no model.safetensors or model.safetensors.index.json (found pytorch_model.bin: only " \
        "safetensors is supported)" in err


def test_inspection_reads_no_tensor_data(ckpts: Ckpts, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read during Checkpoint.open stays within the 8-byte prefix and the header."""
    import builtins
    import io

    reads: list[tuple[str, int]] = []
    real_open = builtins.open

    class Spy(io.BufferedReader):
        def read(self, n: int | None = -1) -> bytes:  # type: ignore[override]
            pos = self.tell()
            data = super().read(n)
            reads.append((self.name, pos + len(data)))
            return data

    def spy_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "b" in mode and str(file).endswith(".safetensors"):
            return Spy(io.FileIO(file, "rb"))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(Path, "open", lambda self, mode="r", *a, **k: spy_open(self, mode, *a, **k))
    ck = Checkpoint.open(ckpts.stories)
    assert ck.ok
    header_end = 8 + ck.headers["model.safetensors"].header_bytes
    assert reads and max(end for _, end in reads) <= header_end < ck.headers["model.safetensors"].file_size
