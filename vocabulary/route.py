"""How an engine was made, for a toolchain with more than one way (recorded per result)."""

from __future__ import annotations

from edgellm.types import ChoiceEnum


class Route(ChoiceEnum):
    """How a toolchain with more than one way to make an engine made it (recorded per result; None: one way)."""

    ONNX = "onnx"  # exported ONNX -> the device's engine builder
    DIRECT = "direct"  # the checkpoint itself -> the device's direct (ONNX-less) engine builder

    @property
    def from_checkpoint(self) -> bool:
        """Whether an engine made this way is built from the checkpoint (not the export) and reads its weights
        from that checkpoint at run time (the checkpoint is staged wherever the engine runs)."""
        return self is Route.DIRECT
