"""What an artifact is. Shared by the store's references and the results database's artifact table."""

from __future__ import annotations

import enum


class ArtifactKind(enum.StrEnum):
    CHECKPOINT = "checkpoint"
    ONNX = "onnx"
    ENGINE = "engine"
    LOG = "log"
    REPORT = "report"
    OTHER = "other"
    ENGINE_MANIFEST = "engine_manifest"  # an engine that stays on its device: where it is and its digest


class Packing(enum.StrEnum):
    FILE = "file"  # the blob is the file's bytes
    TAR = "tar"  # the blob is a deterministic tar of a directory (see artifacts.store)
