"""Where the farm keeps its state, resolved once per command: flag, else environment, else the embedded default."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devices.inventory import default_inventory_dir
from edgellm import __version__
from edgellm.errors import ConfigurationError
from results.db import data_dir as default_data_dir
from results.db import resolve_url

QUANTIZE_DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Settings:
    db_url: str
    data_dir: Path
    inventory_dir: Path
    docs_dir: Path
    quantize_device: str = "cpu"  # where the quantizer runs on the orchestrating host ($EDGEFARM_QUANTIZE_DEVICE)
    # the share of a checkpoint's linears a quantization method may leave in float ($EDGEFARM_MAX_UNQUANTIZED_SHARE)
    max_unquantized_share: float = 0.0

    @classmethod
    def resolve(cls, *, db: str | None = None, data_dir: str | Path | None = None,
                inventory: str | Path | None = None, docs_dir: str | Path | None = None) -> Settings:
        if data_dir is not None:
            os.environ["EDGEFARM_DATA_DIR"] = str(Path(data_dir).resolve())
        root = Path(data_dir).resolve() if data_dir is not None else default_data_dir().resolve()
        root.mkdir(parents=True, exist_ok=True)
        inv = Path(inventory) if inventory is not None else default_inventory_dir()
        docs = Path(docs_dir) if docs_dir is not None else Path(os.environ.get("EDGEFARM_DOCS_DIR") or root / "docs")
        return cls(db_url=resolve_url(db), data_dir=root, inventory_dir=inv.resolve(), docs_dir=docs.resolve(),
                   quantize_device=_quantize_device(), max_unquantized_share=_max_unquantized_share())


def _quantize_device() -> str:
    value = os.environ.get("EDGEFARM_QUANTIZE_DEVICE") or "cpu"
    if value not in QUANTIZE_DEVICES:
        raise ConfigurationError(f"bad EDGEFARM_QUANTIZE_DEVICE {value!r}; valid: {', '.join(QUANTIZE_DEVICES)}")
    return value


def _max_unquantized_share() -> float:
    raw = os.environ.get("EDGEFARM_MAX_UNQUANTIZED_SHARE") or "0"
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ConfigurationError(f"bad EDGEFARM_MAX_UNQUANTIZED_SHARE {raw!r}; valid: a fraction in [0, 1]")
    return value


def code_version() -> str:
    """The git commit of this checkout when there is one, else the edgellm version."""
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f"edgellm-{__version__}"
    sha = out.stdout.strip()
    if out.returncode != 0 or not sha:
        return f"edgellm-{__version__}"
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    return f"{sha}{'-dirty' if dirty else ''}"
