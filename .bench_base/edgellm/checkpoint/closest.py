"""The registered family closest to a checkpoint, and what kind of change separates them.

Each registered family is compared with the checkpoint two ways:
  * config.json, field by field, against the family's known config: the defaults of the transformers config class
    the family declares (``ModelFamily.hf_config``, the upstream model's own config). Fields every transformers
    config has (``PretrainedConfig``'s) are not compared. A field is *unread* when neither the family's config
    class nor edgellm's decoder view (``ModelConfig``, recorded as it parses this very config) knows it: the
    family's code would ignore it, so one set to anything but null or false decides "new structure";
  * the tensors, reconciled against the parameters the family needs for this config (``reconcile``): a missing,
    unexplained or wrongly shaped tensor is a structural difference, named by its role (layer index as ``{i}``).
The family's own ``check_config`` refusing the config (an activation or RoPE type it does not implement) is
structural too. Then the change is classified:
  ``new structure``               any structural difference (the fields and tensor roles listed in ``deciding``);
  ``alias``                       same structure, the model_type or an architecture is not the family's;
  ``configuration-only variant``  same structure and names; ``deciding`` lists the hyperparameters that differ
                                  from the family's known config (sizes, rope_theta, ...), possibly none.
The closest family is the one with the least change: variant before alias before new structure, then fewest
deciding differences, then a family sharing a name with the checkpoint, then fewest other differences.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from edgellm.checkpoint.tensors import read_tensor_files
from edgellm.config import ModelConfig, QuantConfig, read_json_object
from edgellm.errors import CheckpointError, ConfigurationError, UnsupportedError
from edgellm.models.base import ModelFamily, is_registered_model_type, registered_families

SCHEMA = "edgellm.closest/1"
VARIANT = "configuration-only variant"
ALIAS = "alias"
NEW_STRUCTURE = "new structure"
CLASSIFICATIONS = (VARIANT, ALIAS, NEW_STRUCTURE)  # least change first
NAME_FIELDS = ("model_type", "architectures")
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


class _ReadKeys(dict):  # type: ignore[type-arg]
    """A config dict that records every key looked up (what edgellm's decoder view reads of it)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def known_config(family: type[ModelFamily]) -> dict[str, Any]:
    """The family's known config: its transformers config class's defaults ({} for a family declaring none)."""
    if family.hf_config is None:
        return {}
    import transformers

    return dict(_json(getattr(transformers, family.hf_config)().to_dict()))


def generic_fields() -> frozenset[str]:
    """Fields every transformers config has, whatever the model (not compared)."""
    import transformers

    return frozenset(transformers.PretrainedConfig().to_dict()) | {"transformers_version", "torch_dtype"}


def role(tensor: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``model.layers.{i}.mlp.up_proj.weight``."""
    return _LAYER_INDEX.sub("{i}", tensor)


def _roles(names: Any) -> list[str]:
    return sorted({role(n) for n in names})


def closest_family(ckpt_dir: Path | str) -> dict[str, Any]:
    """The comparison of ``ckpt_dir`` with every registered family (``edgellm.closest/1`` JSON): ``family`` (the
    closest), ``classification``, ``deciding`` (the fields and tensor roles that decide it) and ``candidates`` (one
    entry per family, closest first). Headers only: no tensor data is read."""
    root = Path(ckpt_dir)
    if not root.is_dir():
        raise CheckpointError("checkpoint directory not found", file=str(root))
    raw = read_json_object(root / "config.json", what="config.json")
    view = _ReadKeys(raw)
    cfg: ModelConfig | None = None
    cfg_problem: str | None = None
    try:
        cfg = ModelConfig.from_dict(view, source=str(root / "config.json"))  # type: ignore[arg-type]
    except ConfigurationError as exc:
        cfg_problem = str(exc)
    files = read_tensor_files(root)
    quant = QuantConfig.load(root, raw)
    generic = generic_fields()
    candidates = [_compare(fam, raw, view, cfg, cfg_problem, files.tensors, files.unknown, quant, generic)
                  for fam in registered_families()]
    candidates.sort(key=lambda c: (CLASSIFICATIONS.index(c["classification"]), len(c["deciding"]),
                                   not c["shares_name"], len(c["hyperparameters"]), c["family"]))
    best = candidates[0] if candidates else None
    return {
        "schema": SCHEMA,
        "checkpoint": str(root),
        "model_type": raw.get("model_type"),
        "architectures": raw.get("architectures") or [],
        "registered": is_registered_model_type(raw.get("model_type")),
        "config_problem": cfg_problem,
        "family": best["family"] if best else None,
        "classification": best["classification"] if best else NEW_STRUCTURE,
        "deciding": best["deciding"] if best else [],
        "candidates": candidates,
    }


def _compare(family: type[ModelFamily], raw: dict[str, Any], view: _ReadKeys, cfg: ModelConfig | None,
             cfg_problem: str | None, tensors: Any, unknown: set[str], quant: QuantConfig,
             generic: frozenset[str]) -> dict[str, Any]:
    from edgellm.checkpoint.reconcile import reconcile

    known = known_config(family)
    names = []
    model_type = raw.get("model_type")
    archs = [a for a in raw.get("architectures") or [] if isinstance(a, str)]
    if model_type not in family.model_types:
        names.append({"field": "model_type", "checkpoint": model_type, "family": list(family.model_types)})
    if any(a not in family.architectures for a in archs):
        names.append({"field": "architectures", "checkpoint": archs, "family": list(family.architectures)})
    refused = cfg_problem
    tensor_diff: dict[str, list[str]] = {"missing": [], "unexpected": [], "shape_mismatches": []}
    if cfg is not None:
        try:
            family.check_config(cfg)
            family.sliding_window(cfg)  # what else the family reads of the config (recorded by the view)
        except UnsupportedError as exc:
            refused = str(exc)
        rec = reconcile(tensors, family, cfg, quant, unknown=unknown)
        tensor_diff = {"missing": _roles(rec.missing), "unexpected": _roles(rec.unexpected),
                       "shape_mismatches": _roles(rec.shape_mismatches)}
    understood = set(known) | view.read | generic
    unread = {k: _json(v) for k, v in sorted(raw.items()) if k not in understood}
    hyper = [{"field": k, "checkpoint": _json(v), "family": known[k]} for k, v in sorted(raw.items())
             if k in known and k not in generic and k not in NAME_FIELDS and _json(v) != known[k]]
    structural = [k for k, v in unread.items() if v not in (None, False)]
    structural += [f"{what} tensor {r}" for kind, what in (("missing", "missing"), ("unexpected", "unexpected"),
                                                           ("shape_mismatches", "wrong-shape"))
                   for r in tensor_diff[kind]]
    if refused is not None:
        structural.append(f"config refused: {refused}")
    if structural:
        classification, deciding = NEW_STRUCTURE, structural
    elif names:
        classification, deciding = ALIAS, [n["field"] for n in names]
    else:
        classification, deciding = VARIANT, [h["field"] for h in hyper]
    return {
        "family": family.name,
        "classification": classification,
        "deciding": deciding,
        "shares_name": model_type in family.model_types or any(a in family.architectures for a in archs),
        "known_config": f"transformers.{family.hf_config}" if family.hf_config else None,
        "names": names,
        "unread_fields": unread,
        "hyperparameters": hyper,
        "refused": refused,
        "tensors": tensor_diff,
    }
