"""Content-addressed artifact store (sha256) on a local directory or an S3 bucket; knows nothing of the database."""

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import (
           ArtifactRef,
           ArtifactStore,
           CorruptArtifactError,
           MissingArtifactError,
           Store,
           StoreError,
)

__all__ = ["ArtifactKind", "ArtifactRef", "ArtifactStore", "CorruptArtifactError", "MissingArtifactError", "Packing",
           "Store", "StoreError"]
