"""The farm's registries with a test's additions: extra toolchains registered, extra or changed device types, built
and installed (``registries.using``) for the block, and everything taken back after it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager

from edgefarm.devices import site
from edgefarm.devices.types import DeviceType
from edgefarm.registries import Registries, build, using
from edgefarm.toolchains import base


@contextmanager
def registries_with(*, device_types: Iterable[DeviceType] = (),
                    toolchains: Iterable[type[base.ToolchainDriver]] = (),
                    toolchains_on: Mapping[str, Iterable[str]] | None = None) -> Iterator[Registries]:
    """The farm's registries (the configured site directory's) with ``toolchains`` registered, ``device_types``
    added (one of an existing name replaces it), and each device type of ``toolchains_on`` also naming those
    toolchains (last in its order of preference, as its YAML would list them)."""
    with ExitStack() as undo:
        for cls in toolchains:
            base.register_toolchain(cls)
            undo.callback(base.unregister_toolchain, cls.name)
        built = build(site.current()).with_device_types(*device_types)
        named = [built.device_types[name].model_copy(update={"toolchains": (*built.device_types[name].toolchains,
                                                                            *added)})
                 for name, added in (toolchains_on or {}).items()]
        yield undo.enter_context(using(built.with_device_types(*named)))
