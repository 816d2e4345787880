"""A variant part belongs to the base it was made for (issue 40 item 5): an EAGLE3 draft, LoRA adapter or reduced
vocabulary whose catalog ``base:`` is another model, and a draft, adapter or vocabulary named as a row's model, are
refused by ``lists validate`` (exit 2), each naming its line, the part's base and what would be valid."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.test_lists.catalog import CATALOG_FILE, Catalog

HEADER = """name: pairs
stage: l0
description: variant parts paired with rows
platforms: {terms: [thor]}
defaults: {max_seq_len: 256, max_batch_size: 2, max_input_len: 128, stages: [export]}
tests:
"""


def _validate(tmp_path: Path, *rows: str) -> tuple[int, str]:
    path = tmp_path / "pairs.yml"
    path.write_text(HEADER + "".join(f"  - {row}\n" for row in rows))
    result = CliRunner().invoke(app, ["lists", "validate", str(path)])
    return result.exit_code, " ".join(result.output.split())


def test_a_draft_made_for_another_base_is_refused_naming_its_line_and_the_valid_draft(tmp_path: Path) -> None:
    code, out = _validate(
        tmp_path,
        "{model: tiny-llama-4l, precision: fp16, speculative: {method: eagle3, draft: tiny-llama-4l-eagle3}}",  # ok
        "{model: tiny-llama, precision: fp16, speculative: {method: eagle3, draft: tiny-llama-4l-eagle3}}")
    assert code == 2, out
    assert ("pairs.yml:8" in out and "speculative.draft 'tiny-llama-4l-eagle3' was made for 'tiny-llama-4l' (its "
            "catalog base:), not for 'tiny-llama'; the catalog has no eagle3 draft made for 'tiny-llama'") in out, out
    assert "pairs.yml:7" not in out and "Traceback" not in out


def test_an_adapter_or_vocabulary_made_for_another_base_is_refused(tmp_path: Path) -> None:
    code, out = _validate(
        tmp_path,
        "{model: tiny-llama-4l, precision: fp16, lora: {adapter: tiny-llama-lora-r4}}",
        "{model: tiny-llama-4l, precision: fp16, reduced_vocab: tiny-llama-vocab256}")
    assert code == 2, out
    assert "lora.adapter 'tiny-llama-lora-r4' was made for 'tiny-llama' (its catalog base:), not for " \
           "'tiny-llama-4l'" in out, out
    assert "reduced_vocab 'tiny-llama-vocab256' was made for 'tiny-llama' (its catalog base:), not for " \
           "'tiny-llama-4l'" in out, out
    assert "pairs.yml:7" in out and "pairs.yml:8" in out


def test_a_draft_adapter_or_vocabulary_is_never_a_row_s_model(tmp_path: Path) -> None:
    code, out = _validate(
        tmp_path,
        "{model: tiny-llama-4l-eagle3, precision: fp16, speculative: {method: eagle3, draft: tiny-llama-4l-eagle3}}",
        "{model: tiny-llama-lora-r4, precision: fp16}",
        "{model: tiny-llama-vocab256, precision: fp16}")
    assert code == 2, out
    for line, name, role, base in ((7, "tiny-llama-4l-eagle3", "eagle3 draft", "tiny-llama-4l"),
                                   (8, "tiny-llama-lora-r4", "lora adapter", "tiny-llama"),
                                   (9, "tiny-llama-vocab256", "reduced vocab", "tiny-llama")):
        assert f"pairs.yml:{line}" in out, out
        assert (f"model {name!r} is a {role} in the catalog; a row's model names a checkpoint (name it in a row of "
                f"{base!r})") in out, out


def test_a_part_with_no_base_in_the_catalog_cannot_be_paired(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft at a path (its role read from its files) with no ``base:``: its pairing is unproven, so refused."""
    raw = yaml.safe_load(CATALOG_FILE.read_text())
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"]}')
    raw["models"]["tiny-llama-4l-eagle3"] = {"path": str(draft)}
    catalog = tmp_path / "lists" / "models.yml"
    catalog.parent.mkdir()
    catalog.write_text(yaml.safe_dump(raw))
    load = Catalog.load.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(Catalog, "load", classmethod(lambda cls, _=CATALOG_FILE, **kw: load(cls, catalog, **kw)))
    code, out = _validate(
        tmp_path,
        "{model: tiny-llama-4l, precision: fp16, speculative: {method: eagle3, draft: tiny-llama-4l-eagle3}}")
    assert code == 2, out
    assert "speculative.draft 'tiny-llama-4l-eagle3' names no base: in the catalog, so its pairing with " \
           "'tiny-llama-4l' cannot be checked; give it base:" in out, out


def test_the_shipped_variant_list_still_validates() -> None:
    result = CliRunner().invoke(app, ["lists", "validate", str(CATALOG_FILE.parent / "l0_variant_export.yml")])
    assert result.exit_code == 0, result.output
