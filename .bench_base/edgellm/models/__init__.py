"""Model families. ``family_for(config)`` finds one; see base.py for how to add a family."""

from edgellm.models.base import ARCHITECTURES, FAMILIES, IgnoreRule, ModelFamily, family_for, register_family

__all__ = ["ARCHITECTURES", "FAMILIES", "IgnoreRule", "ModelFamily", "family_for", "register_family"]
