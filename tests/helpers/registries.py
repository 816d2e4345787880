"""The farm's registries with a test's additions: extra toolchains registered, a registered toolchain's driver
replaced by a stand-in, extra or changed device types, built and installed (``registries.using``) for the block, and
everything taken back after it. The one way a test changes what toolchains are registered."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

from edgefarm.devices.types import DeviceType
from edgefarm.registries import Registries, build, current, using
from edgefarm.toolchains import base


def _swapped(cls: type[base.ToolchainDriver]) -> type[base.ToolchainDriver]:
    """Register ``cls`` in place of the driver of its name; returns the one it replaced."""
    original = base.driver_class(cls.name)
    base.unregister_toolchain(cls.name)
    base.register_toolchain(cls)
    return original


@contextmanager
def registries_with(*, device_types: Iterable[DeviceType] = (),
                    toolchains: Iterable[type[base.ToolchainDriver]] = (),
                    replaced: Iterable[type[base.ToolchainDriver]] = (),
                    toolchains_on: Mapping[str, Iterable[str]] | None = None) -> Iterator[Registries]:
    """The farm's registries (the configured site directory's) with ``toolchains`` registered, each of ``replaced``
    standing in for the registered toolchain of its name (driver instances are made afresh inside and after the
    block), ``device_types`` added (one of an existing name replaces it), and each device type of ``toolchains_on``
    also naming those toolchains (last in its order of preference, as its YAML would list them)."""
    with ExitStack() as undo:
        for cls in toolchains:
            base.register_toolchain(cls)
            undo.callback(base.unregister_toolchain, cls.name)
        for cls in replaced:
            undo.callback(_swapped, _swapped(cls))
        built = build(current().site_dir).with_device_types(*device_types)
        named = [built.device_types[name].model_copy(update={"toolchains": (*built.device_types[name].toolchains,
                                                                            *added)})
                 for name, added in (toolchains_on or {}).items()]
        yield undo.enter_context(using(built.with_device_types(*named)))
