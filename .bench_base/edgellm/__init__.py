"""edgellm: checkpoint inspection, export, engine build, runtime and accuracy checks for edge LLMs.

This package imports nothing from the farm (tasks/, flows/, devices/, artifacts/, results/).
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

ASSETS_DIR = Path(__file__).resolve().parent / "assets"
BUNDLED_MODEL_DIR = ASSETS_DIR / "stories260K"
BUNDLED_TEXT_FILE = ASSETS_DIR / "tinystories-valid-sample.txt"
