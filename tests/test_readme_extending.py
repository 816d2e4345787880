"""README's "Extending the farm" names, for each kind of extension, the test that proves its count of files: every
test it names exists (a renamed or deleted proof would leave the table claiming what nothing checks)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_proof_the_extending_table_names_exists() -> None:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Extending the farm"):text.index("\n## ", text.index("## Extending the farm") + 3)]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| to add")]
    assert len(rows) >= 9, rows  # family, backend, quantization method, stage, platform, toolchain, list, ...
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", section)
    assert len({path for path, _ in named}) >= 8
    for path, test in named:
        source = REPO / path
        assert source.is_file(), f"README names {path}, which does not exist"
        if test:
            assert re.search(rf"^def {test}\(", source.read_text(encoding="utf-8"), re.M), f"{path}::{test} is gone"
