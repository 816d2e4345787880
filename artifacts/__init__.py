"""Content-addressed artifact store (sha256) on a local directory; knows nothing of the database."""

from artifacts.kinds import ArtifactKind, Packing
from artifacts.store import ArtifactRef, ArtifactStore, CorruptArtifactError, MissingArtifactError

__all__ = ["ArtifactKind", "ArtifactRef", "ArtifactStore", "CorruptArtifactError", "MissingArtifactError", "Packing"]
