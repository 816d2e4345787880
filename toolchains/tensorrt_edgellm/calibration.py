"""Calibration text the project ships, so quantization never reaches a model hub.

``tensorrt-edgellm-quantize`` calibrates on its default text data set ``cnn_dailymail``, which it downloads unless
``EDGELLM_QUANT_DATASET_CNN_DAILYMAIL`` names a local JSONL file whose rows carry an ``article`` field. The shipped
file is made from the bundled TinyStories sample by :func:`calibration_rows` (a test checks the file is its output).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from edgellm import ASSETS_DIR, BUNDLED_TEXT_FILE

CALIBRATION_FILE = ASSETS_DIR / "calibration" / "tinystories-calib.jsonl"
DATASET = "cnn_dailymail"  # the tool's default text data set, overridden through its environment variable
DATASET_ENV = "EDGELLM_QUANT_DATASET_CNN_DAILYMAIL"
_SENTENCE_END = re.compile(r"(?<=[.!?\"])\s+")
ROW_CHARS = 600  # a few sentences per row: ~60 rows from the sample, each inside a tiny model's context


def calibration_rows(text: str, *, row_chars: int = ROW_CHARS) -> list[str]:
    """Split ``text`` into rows of whole sentences of about ``row_chars`` characters (stories never mix)."""
    rows: list[str] = []
    for story in (s.strip() for s in text.splitlines()):
        current = ""
        for sentence in _SENTENCE_END.split(story):
            if current and len(current) + 1 + len(sentence) > row_chars:
                rows.append(current)
                current = ""
            current = f"{current} {sentence}".strip()
        if current:
            rows.append(current)
    return rows


def render(rows: list[str]) -> str:
    return "".join(json.dumps({"article": row}, ensure_ascii=False) + "\n" for row in rows)


def write_calibration_file(path: Path = CALIBRATION_FILE, source: Path = BUNDLED_TEXT_FILE) -> Path:
    """(Re)make the shipped calibration file from the bundled sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(calibration_rows(source.read_text(encoding="utf-8"))), encoding="utf-8")
    return path


def offline_env(calibration: Path = CALIBRATION_FILE, *, cache_dir: Path) -> dict[str, str]:
    """Environment for the toolchain's commands: local calibration text, no hub, caches under ``cache_dir``."""
    return {
        DATASET_ENV: str(calibration),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(cache_dir / "datasets"),
        "HF_HOME": str(cache_dir / "hf"),
    }


if __name__ == "__main__":
    write_calibration_file()
