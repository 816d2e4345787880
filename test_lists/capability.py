"""The one answer to "can this platform run this variant of this model with this toolchain": ``capability(platform,
toolchain, variant, shape) -> Capability``. The plan (matrices and test lists), ``edgefarm lists validate`` and
anything else that asks use it, so a combination is refused for the same reason everywhere.

In order, the first refusal wins:
  1. the device type's hardware: the weight precision (``precisions``, ``refuses``, the SM it needs), the KV cache
     (``kv_cache_precisions``) and the LM head (``lm_head_precisions``);
  2. the toolchain (when one is named): the platform runs it (the type's ``toolchains``), it produces the precision,
     and it can give the LM head and KV cache asked for (``ToolchainDriver.variant_problem``);
  3. the model (when its shape is known: ``ModelSource.shape()``, read from its config without its weights): the
     toolchain's kernels take it on the type's SM (``ToolchainDriver.model_problem``: e.g. a head size no attention
     kernel of the toolchain has). A model whose shape cannot be read is decided by 1 and 2 alone.
Whether the toolchain is installed here, or a device of the platform exists, is not a capability (the plan records
those rows as skipped, not as not applicable).

It sits above the device types and the toolchains, since it asks both (``devices`` asks no toolchain), and beside the
plan's other inputs: the plan (``flows.plan``) and the list validator (``test_lists.validate``) import it from here,
and ``flows`` imports ``test_lists``, so it could not live in ``flows`` without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefarm.registries import Registries, current
from edgefarm.toolchains import base as toolchains
from edgefarm.vocabulary.model import ModelShape
from edgefarm.vocabulary.variant import Variant


@dataclass(frozen=True)
class Capability:
    ok: bool
    reason: str = ""  # why not (names the platform or toolchain and what is valid); empty when ok

    def __bool__(self) -> bool:
        return self.ok


def hardware(platform: str, variant: Variant, *, registries: Registries | None = None) -> Capability:
    """Whether the platform's hardware runs the variant at all (any toolchain); the platform is a device type of
    ``registries`` (default: the farm's)."""
    dtype = (registries or current()).device_type(platform)
    ok, why = dtype.supports(variant.precision)
    if not ok:
        return Capability(False, why)
    if variant.kv_cache is not None and not (kv := dtype.supports_kv_cache(variant.kv_cache))[0]:
        return Capability(False, kv[1])
    if variant.lm_head is not None and not (head := dtype.supports_lm_head(variant.lm_head))[0]:
        return Capability(False, head[1])
    return Capability(True)


def capability(platform: str, toolchain: str | None, variant: Variant, shape: ModelShape | None = None, *,
               registries: Registries | None = None) -> Capability:
    """Whether ``platform`` can run ``variant`` with ``toolchain`` (None: with any of the platform's toolchains;
    the reason is then the preferred toolchain's), for a model of ``shape`` (None: unknown; no model limit asked).
    The platform is a device type of ``registries`` (default: the farm's)."""
    found = hardware(platform, variant, registries=registries)
    if not found:
        return found
    dtype = (registries or current()).device_type(platform)
    if toolchain is None:
        reasons = [c for name in dtype.toolchains
                   if not (c := capability(platform, name, variant, shape, registries=registries))]
        return Capability(True) if len(reasons) < len(dtype.toolchains) else reasons[0]
    name = toolchains.parse(toolchain)
    if name not in dtype.toolchains:
        return Capability(False, f"{dtype.label} does not run toolchain {name} (runs: {', '.join(dtype.toolchains)})")
    driver = toolchains.driver(name)
    problem = driver.precision_problem(variant.precision)
    if problem is not None:
        return Capability(False, problem)
    problem = driver.variant_problem(variant) or driver.features_problem(variant.features)
    if problem is None and shape is not None:
        problem = driver.model_problem(shape, dtype.sm, variant)
    return Capability(False, problem) if problem is not None else Capability(True)
