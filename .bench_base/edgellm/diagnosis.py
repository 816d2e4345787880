"""The class of a wrong output, from what ``edgellm eval`` already measured: the fingerprints of a model bring-up
gone wrong (imp's add-model table), each a check on the report and its layer comparison (edgellm.layer_diff).

The position profile used below is the first divergent (layer, part)'s relative difference per position of the
longest compared sequence. RoPE rotates position 0 by angle 0 (the identity), so a fault in the position encoding
leaves position 0 exact and shows from position 1 on; a fault in weights or their layout shows at every position.
Checked in this order (the first that matches is the class):
  tokenizer_mismatch      ids differ before the model runs: the tokenizer check failed
  nan_upstream            argmax stuck at one token: a non-finite value in some layer (the first one is named)
  rope_scaling            coherent then garbage past a length: exact up to position >= ROPE_SCALING_MIN_POSITION
  rope_pair_layout        fluent but prompt-blind: exact at position 0, wrong at full size from the first positions
                          (every pair rotated the wrong way: positions 1-8 as wrong as the second half)
  position_encoding       digits scrambled: exact at position 0, an error that grows with the position
  dequantization_layout   valid-but-wrong tokens: wrong from position 0 on in a quantized engine
  weight_layout           the same in a float engine (a transposed or permuted weight)
  unclassified            a check failed and no fingerprint matched (the layers agree: look after the last layer)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ROPE_SCALING_MIN_POSITION = 16  # a scaled RoPE that leaves short contexts exact (dynamic NTK, YaRN, llama3)
# Mean error of positions 1-8 over that of the second half at or above which the error is at full size at once
# (pair layout) rather than growing with the position. Measured on tests/test_diagnosis.py's planted faults (4-layer
# tiny-llama, 128-token sequence): interleaved pairs 1.06, RoPE theta 1e8 for 1e4 0.35.
PAIR_LAYOUT_MIN_EARLY = 0.7


@dataclass(frozen=True)
class Fingerprint:
    name: str
    symptom: str
    likely_cause: str


FINGERPRINTS = {f.name: f for f in (
    Fingerprint("tokenizer_mismatch", "ids differ before the model runs", "the engine's tokenizer files"),
    Fingerprint("nan_upstream", "argmax stuck at one token", "NaN/inf logits from a non-finite value upstream"),
    Fingerprint("rope_scaling", "coherent then garbage past a length", "RoPE scaling (rope_scaling settings)"),
    Fingerprint("rope_pair_layout", "fluent but prompt-blind", "RoPE pair layout (interleaved vs half-split)"),
    Fingerprint("position_encoding", "digits scrambled", "position encoding (RoPE frequencies, position ids)"),
    Fingerprint("dequantization_layout", "valid-but-wrong tokens", "dequantization layout (packing, scales)"),
    Fingerprint("weight_layout", "valid-but-wrong tokens", "a weight's layout (transposed, permuted, fused)"),
    Fingerprint("unclassified", "a check failed", "no fingerprint matched; the layers agree with the reference"),
)}


def _first_nonfinite(layers: list[dict[str, Any]]) -> dict[str, Any] | None:
    for entry in layers:
        for part, p in entry.get("parts", {}).items():
            if p.get("nonfinite"):
                return {"layer": entry["layer"], "part": part}
    return None


def diagnose(report: dict[str, Any], layer_result: dict[str, Any] | None, *, quantized: bool,
             limit: float) -> dict[str, Any] | None:
    """The diagnosis of a failing eval ``report`` (None when it passed): class, symptom, likely cause, the layer
    and part where known, and the evidence the class was decided on."""
    if report.get("passed"):
        return None
    failed = set(report.get("failed_checks", []))
    layers = (layer_result or {}).get("layers") or []
    first = (layer_result or {}).get("first_divergent_layer")

    def out(name: str, where: dict[str, Any] | None, evidence: str) -> dict[str, Any]:
        f = FINGERPRINTS[name]
        return {"class": name, "symptom": f.symptom, "likely_cause": f.likely_cause,
                "layer": where["layer"] if where else None, "part": where["part"] if where else None,
                "evidence": evidence}

    if "tokenizer_match" in failed:
        return out("tokenizer_mismatch", None, "the engine's token ids differ from the reference's on the same text")
    nonfinite = _first_nonfinite(layers)
    if nonfinite is not None:
        return out("nan_upstream", nonfinite, f"first non-finite value after layer {nonfinite['layer']} "
                                              f"({nonfinite['part']})")
    if "outputs_finite" in failed:
        return out("nan_upstream", None, "non-finite logits (no layer comparison to place them)")
    if first is None:
        return out("unclassified", None, "no layer comparison" if layer_result is None else
                   "every layer within its limit")
    entry = layers[first["layer"]]["parts"][first["part"]]
    profile = [float(x) for x in entry.get("position_rel_diff", [])]
    if not profile or profile[0] > limit:
        name = "dequantization_layout" if quantized else "weight_layout"
        return out(name, first, f"wrong from position 0 (rel {profile[0] if profile else first['rel_diff']:.1e})")
    bad = next((i for i, x in enumerate(profile) if x > limit), len(profile))
    if bad >= ROPE_SCALING_MIN_POSITION:
        return out("rope_scaling", first, f"positions 0-{bad - 1} within {limit:.0e}, wrong from position {bad}")
    late = profile[len(profile) // 2:]
    early = (sum(profile[1:9]) / len(profile[1:9])) / (sum(late) / len(late)) if len(profile) >= 16 else 0.0
    if early >= PAIR_LAYOUT_MIN_EARLY:
        return out("rope_pair_layout", first, f"position 0 exact, positions 1-8 at {early:.2f}x the second half's "
                                              f"error (full size at once)")
    return out("position_encoding", first, f"position 0 exact, error growing with position (positions 1-8 at "
                                           f"{early:.2f}x the second half's)")


def diagnosis_line(d: dict[str, Any] | None) -> str:
    """"rope_pair_layout (fluent but prompt-blind) at layer 1 (attention)"."""
    if not d:
        return ""
    where = f" at layer {d['layer']} ({d['part']})" if d.get("layer") is not None else ""
    return f"{d['class']} ({d['symptom']}){where}"
