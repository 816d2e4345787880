"""A test's variant features from its list entry, checked against the model catalog, and the rows they make.

``speculative: {method: eagle3, draft: D}`` on an entry of base B makes two rows: B's (variant ``eagle3 base``,
exported to hand its draft hidden states) and D's (variant ``eagle3 draft``, ``after`` B's: planned only when B's
job runs, and each of its stages runs only once B's same stage passed). The catalog says what each named part is
(``ModelSource.role``), a LoRA adapter's rank and a reduced vocabulary's size.
"""

from __future__ import annotations

import dataclasses

from edgefarm.test_lists.catalog import Catalog, ModelSource
from edgefarm.test_lists.schema import TestSpec
from edgefarm.test_lists.testlist import TestEntry
from edgefarm.vocabulary.variant import (
    DEFAULT_COMPONENTS,
    PLAIN,
    Features,
    Lora,
    ReducedVocab,
    SpecMethod,
    SpecRole,
    Speculative,
)
from edgellm.errors import ConfigurationError


def features(spec: TestSpec, catalog: Catalog) -> tuple[Features, list[tuple[str, str]]]:
    """The entry's features and every (field, problem) found: a named part unknown to the catalog or of another
    role, a rank or size the catalog cannot tell."""
    problems: list[tuple[str, str]] = []
    lineage = _lineage(spec.model, catalog)
    if lineage and (own := catalog.get(spec.model).role) != "checkpoint":
        made_for = catalog.get(spec.model).base
        problems.append(("model", f"model {spec.model!r} is a {own.replace('_', ' ')} in the catalog; a row's model "
                                  f"names a checkpoint" + (f" (name it in a row of {made_for.name!r})" if made_for
                                                           else "")))
        lineage = ()

    def part(field: str, name: str, role: str) -> bool:
        if name not in catalog:
            problems.append((field, f"unknown model {name!r} in {field}; the model catalog {catalog.path} has: "
                                    f"{', '.join(sorted(catalog.sources))}"))
            return False
        found = catalog.get(name).role
        if found != role:
            problems.append((field, f"{field} {name!r} is a {found.replace('_', ' ')} in the catalog; {field} names "
                                    f"a {role.replace('_', ' ')}"))
            return False
        if lineage and (why := _made_for_another(field, name, role, spec.model, lineage, catalog)) is not None:
            problems.append((field, why))
            return False
        return True

    speculative = lora = vocab = None
    if (sp := spec.speculative) is not None:
        if sp.method is SpecMethod.EAGLE3:
            assert sp.draft is not None  # the schema requires it
            if part("speculative.draft", sp.draft, "eagle3_draft"):
                speculative = Speculative(sp.method, SpecRole.BASE, sp.draft)
        else:
            speculative = Speculative(sp.method, SpecRole.BASE, spec.model)
    if (lo := spec.lora) is not None and part("lora.adapter", lo.adapter, "lora_adapter"):
        rank = catalog.get(lo.adapter).lora_rank()
        if rank is None:
            problems.append(("lora.adapter", f"the rank of LoRA adapter {lo.adapter!r} is unknown here (its "
                                             "adapter_config.json cannot be read)"))
        else:
            lora = Lora(lo.adapter, rank, lo.mode)
    if spec.reduced_vocab is not None and part("reduced_vocab", spec.reduced_vocab, "reduced_vocab"):
        size = catalog.get(spec.reduced_vocab).vocab_size()
        if size is None:
            problems.append(("reduced_vocab", f"the size of reduced vocabulary {spec.reduced_vocab!r} is unknown here "
                                              "(its reduced_vocab.json cannot be read)"))
        else:
            vocab = ReducedVocab(spec.reduced_vocab, size)
    try:
        made = Features(speculative=speculative, lora=lora, reduced_vocab=vocab,
                        fp8_embedding=bool(spec.fp8_embedding),
                        components=tuple(spec.components) if spec.components else DEFAULT_COMPONENTS)
    except ConfigurationError as exc:
        problems.append(("components", str(exc)))
        made = PLAIN
    return made, problems


def _lineage(model: str, catalog: Catalog) -> tuple[str, ...]:
    """``model`` and the models it was made from (the catalog's ``base:``: a pre-quantized checkpoint's float
    model): a part made for any of them fits its rows. Empty when the catalog does not know ``model``."""
    if model not in catalog:
        return ()
    found: list[str] = []
    src: ModelSource | None = catalog.get(model)
    while src is not None and src.name not in found:
        found.append(src.name)
        src = src.base
    return tuple(found)


def _made_for_another(field: str, name: str, role: str, model: str, lineage: tuple[str, ...],
                      catalog: Catalog) -> str | None:
    """Why part ``name`` does not belong with rows of ``model`` (a draft, adapter or vocabulary is made for one
    base: its catalog ``base:``), naming the parts that do; None when it does."""
    made_for = catalog.get(name).base
    if made_for is not None and made_for.name in lineage:
        return None
    fits = sorted(n for n, src in catalog.sources.items()
                  if src.base is not None and src.base.name in lineage and src.role == role)
    valid = f"valid for {model!r}: {', '.join(fits)}" if fits else f"the catalog has no {role.replace('_', ' ')} " \
                                                                    f"made for {model!r}"
    if made_for is None:
        return (f"{field} {name!r} names no base: in the catalog, so its pairing with {model!r} cannot be checked; "
                f"give it base: (the model it was made for); {valid}")
    return f"{field} {name!r} was made for {made_for.name!r} (its catalog base:), not for {model!r}; {valid}"


def rows(entry: TestEntry) -> list[TestEntry]:
    """The entry, and the draft row an EAGLE3 base makes (after the base, with the base's limits and stages)."""
    sp = entry.features.speculative
    if sp is None or sp.method is not SpecMethod.EAGLE3 or sp.role is not SpecRole.BASE:
        return [entry]
    draft = dataclasses.replace(
        entry, model=sp.pair, features=Features(speculative=Speculative(sp.method, SpecRole.DRAFT, entry.model)),
        after=entry.test_id, waived=False, waiver=None)
    return [entry, draft]
