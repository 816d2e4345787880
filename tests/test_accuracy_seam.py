"""The accuracy seam: every toolchain scores through ``edgellm.accuracy``'s public API (``score``,
``perplexity_from_reductions``, ``WindowReductions``), never through edgellm's private names; and that API gives the
numbers the private comparisons give, from full logits and from per-window reductions alike."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from edgellm import BUNDLED_TEXT_FILE
from edgellm.accuracy import (
    WindowReductions,
    _compare_greedy,
    _compare_logits,
    _compare_perplexity,
    _make_checks,
    perplexity_from_reductions,
    score,
)
from edgellm.errors import ConfigurationError
from edgellm.reference import ReferenceSettings, compute_reference, window_nll
from edgellm.thresholds import resolve_thresholds
from edgellm.types import Precision

REPO = Path(__file__).resolve().parents[1]
TOOLCHAINS = REPO / "toolchains"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_edgellm(module: str | None) -> bool:
    return module is not None and (module == "edgellm" or module.startswith("edgellm."))


def private_edgellm_uses(source: str) -> list[str]:
    """Each use of a private edgellm name in ``source``: imported (``from edgellm.x import _y``, a private module
    ``edgellm._x``) or reached as an attribute of a name bound by an edgellm import (``acc._y``)."""
    tree = ast.parse(source)
    found, bound = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_edgellm(alias.name):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"line {node.lineno}: import {alias.name}")
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _is_edgellm(node.module):
            assert node.module is not None
            if any(_private(part) for part in node.module.split(".")):
                found.append(f"line {node.lineno}: from {node.module}")
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scan_sees_each_way_of_reaching_a_private_name() -> None:
    assert private_edgellm_uses("from edgellm.accuracy import _make_checks\n")
    assert private_edgellm_uses("from edgellm import accuracy as acc\nacc._compare_logits(1, 2, {})\n")
    assert private_edgellm_uses("import edgellm.accuracy\nedgellm.accuracy._check('a', 1, 1, '==')\n")
    assert private_edgellm_uses("from edgellm.types import _ChoiceEnum\n")
    assert private_edgellm_uses("import edgellm._secret\n")
    clean = ("from edgellm.accuracy import score\nfrom toolchains.edgellm import driver\nself._x = driver._y\n"
             "from . import _local\n")
    assert private_edgellm_uses(clean) == []


def test_no_toolchain_uses_a_private_name_of_edgellm() -> None:
    files = sorted(TOOLCHAINS.rglob("*.py"))
    assert len(files) > 20  # the scan reads the toolchains, not an empty folder
    bad = {str(f.relative_to(REPO)): uses for f in files
           if (uses := private_edgellm_uses(f.read_text(encoding="utf-8")))}
    assert bad == {}, f"toolchains reach edgellm's private names (use its public API): {bad}"


def _reductions(engine: object, windows: list[list[int]]) -> WindowReductions:
    """What a device ships for a large vocabulary: per window, the NLL sum and the argmax but the last position."""
    logits = [engine.logits(w) for w in windows]  # type: ignore[attr-defined]
    return WindowReductions(np.asarray([window_nll(e, w)[0] for e, w in zip(logits, windows, strict=True)]),
                            [np.argmax(e[:-1], axis=-1) for e in logits])


def test_score_gives_the_numbers_of_the_private_comparisons(stories_engine) -> None:
    from edgellm.runtime import Engine

    settings = ReferenceSettings(text_file=BUNDLED_TEXT_FILE, max_tokens=512, greedy_tokens=16)
    ref = compute_reference(stories_engine.ckpt_dir, settings, "cpu")
    engine = Engine.open(stories_engine.engine_dir)
    limits = resolve_thresholds(Precision.FP32, None, {})
    source = dict(engine_dir="e", checkpoint="c", reference_file=None, engine_backend="ort", config_differences={})
    report = score(engine, ref, limits, Precision.FP32, **source)  # type: ignore[arg-type]

    # the old path: the private comparisons, assembled as the onnxruntime-genai toolchain assembled them
    timings: dict[str, float] = {}
    logits = _compare_logits(engine, ref, timings)
    greedy = _compare_greedy(engine, ref, timings)
    ppl = _compare_perplexity(engine, ref, ref.windows(), timings)
    tokenizer_ok = [engine.encode(p) for p in ref.prompts] == ref.prompt_ids and engine.encode(ref.text) == ref.text_ids
    checks = _make_checks(limits, logits=logits, greedy=greedy, ppl=ppl, tokenizer_ok=tokenizer_ok, tok_detail="")
    assert report["checks"] == {c.name: c.to_json() for c in checks}
    assert report["passed"] and report["failed_checks"] == []
    assert report["logits"] == logits["per_prompt"]
    assert (report["engine_perplexity"], report["reference_perplexity"], report["perplexity_tokens"]) == \
        (ppl["engine"], ppl["reference"], ppl["tokens"])
    assert [g["matched"] for g in report["greedy"]] == [g["matched"] for g in greedy]
    assert {"tokenize_engine_s", "logits_engine_s", "greedy_engine_s", "perplexity_engine_s"} <= set(
        report["timings"])

    # from per-window reductions (a device's large-vocabulary file): the same numbers
    windows = ref.windows()
    reduced = score(engine, ref, limits, Precision.FP32, reductions=_reductions(engine, windows),
                    **source)  # type: ignore[arg-type]
    assert reduced["engine_perplexity"] == pytest.approx(report["engine_perplexity"], rel=1e-12)
    assert reduced["checks"]["top1_agreement"] == report["checks"]["top1_agreement"]
    assert reduced["passed"] and set(reduced["checks"]) == set(report["checks"])
    from_sums = perplexity_from_reductions(ref, windows, _reductions(engine, windows))
    assert from_sums["top1_agreement"] == ppl["top1_agreement"] and from_sums["tokens"] == ppl["tokens"]

    short = WindowReductions(np.zeros(len(windows) - 1), [np.zeros(len(w) - 1, np.int64) for w in windows[:-1]])
    with pytest.raises(ConfigurationError, match="window NLLs"):
        perplexity_from_reductions(ref, windows, short)
