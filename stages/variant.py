"""The variant's vocabulary lives in ``vocabulary.variant``; these names stay importable from here."""

from edgefarm.vocabulary.variant import (  # noqa: F401
    DEFAULT_COMPONENTS,
    FEATURE_NAMES,
    ID_TOKEN_PREFIXES,
    PLAIN,
    Component,
    Features,
    Lora,
    LoraMode,
    ReducedVocab,
    SpecMethod,
    SpecRole,
    Speculative,
    describe,
    variant_json,
    variant_key,
)
