"""``inspect_checkpoint``: the inventory of any checkpoint, of a registered family or not.

A checkpoint of a registered family is opened as ``Checkpoint`` (reconciled against its family). One whose
model_type (or an architecture) no family registers is still inventoried from its config and headers (tensors,
dtypes, shapes, shards, config, quantization block); "no registered family" is then a *finding*, and a *problem*
(the checkpoint is not usable) only when the caller requires a family. Every hardening of ``Checkpoint.open``
applies on both paths: the same header, index and config readers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgellm.checkpoint.checkpoint import Checkpoint
from edgellm.checkpoint.inventory import build_inventory, family_free_inventory
from edgellm.checkpoint.tensors import read_tensor_files
from edgellm.config import ModelConfig, QuantConfig, read_json_object
from edgellm.errors import CheckpointError, ConfigurationError
from edgellm.models.base import NoFamilyError, is_registered_model_type

NO_FAMILY = "no_registered_family"  # finding kinds
CONFIG_NOT_READ = "config_not_read"


def inspect_checkpoint(ckpt_dir: Path | str, *, require_family: bool = False) -> dict[str, Any]:
    """The inventory (``edgellm.inventory`` JSON) of ``ckpt_dir``. Raises ``ConfigurationError`` when there is no
    inventory to give (no directory, no weights, an unreadable config or quantization block, a registered family's
    config it refuses); every other problem is listed in ``problems``, and ``ok`` is false."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise CheckpointError("checkpoint directory not found", file=str(root))
    raw = read_json_object(root / "config.json", what="config.json")
    config_problem: str | None = None
    try:
        return build_inventory(Checkpoint.open(root))
    except NoFamilyError as exc:
        no_family = str(exc)
    except ConfigurationError as exc:
        if is_registered_model_type(raw.get("model_type")):
            raise
        # a model_type no family registers, whose config edgellm's decoder view does not read either
        no_family = f"model_type {raw.get('model_type')!r}: no registered family"
        config_problem = str(exc)
    return _family_free(root, raw, no_family, config_problem, require_family)


def _family_free(root: Path, raw: dict[str, Any], no_family: str, config_problem: str | None,
                 require_family: bool) -> dict[str, Any]:
    files = read_tensor_files(root)
    quant = QuantConfig.load(root, raw)
    config: ModelConfig | None = None
    if config_problem is None:
        try:
            config = ModelConfig.from_dict(raw, source=str(root / "config.json"))
        except ConfigurationError as exc:
            config_problem = str(exc)
    findings = [{"kind": NO_FAMILY, "message": no_family}]
    if config_problem is not None:
        findings.append({"kind": CONFIG_NOT_READ,
                         "message": f"config.json is not a decoder config edgellm reads ({config_problem}); "
                                    f"'config' is null, 'config_json' holds it as written"})
    problems = [f"{no_family} (--require-family)"] if require_family else []
    return family_free_inventory(root, raw, files, quant, config, findings, problems)
