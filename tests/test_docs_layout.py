"""A toolchain's own page layout from evidence (pages/docs_layout.py), here TensorRT Edge-LLM's (its driver's
docs_layout): golden pages of a fixed database and
of fixed evidence rows, hostile names that keep the Markdown structure, and a checkpoint with only failing evidence
that is never listed. Regenerate the golden files after an intended change with
``EDGEFARM_UPDATE_GOLDEN=1 pytest tests/test_docs_layout.py`` and review the diff of ``tests/golden/edge-llm/``."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

import pytest

from edgefarm.pages.docs_layout import (
    CheckpointInfo,
    Evidence,
    PlatformInfo,
    checkpoint_id,
    coverage,
    render_support_matrix,
    render_supported_models,
    write_layout_pages,
)
from edgefarm.results.recorder import Recorder
from edgefarm.results.support import Support, SupportStatus
from edgefarm.toolchains.base import driver

LAYOUT = driver("tensorrt-edgellm").docs_layout()
assert LAYOUT is not None

GOLDEN = Path(__file__).parent / "golden" / "edge-llm"
TRT = ("tensorrt-edgellm", "0.11.0")
ORT = ("edgellm-ort", "0.1.0+onnxruntime-1.22.0")
PIPELINE = ("export", "build", "infer", "accuracy")
ORIN_ENV: dict[str, object] = {"where": "device", "device": "orin-1", "platform": "orin", "system": "Linux", "jetpack":
            {"version": "6.2.1", "source": "dpkg nvidia-jetpack"}, "l4t": {"release": "36.4.3"},
            "cuda": {"version": "12.6.68"}, "packages": {"tensorrt": "10.3.0.30-1+cuda12.5"}}
WAIVER = "waived until 2027-01-31 (https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/187)"
DRAFT = "AngelSlim/Qwen3-0.6B_eagle3"
BASE = "Qwen/Qwen3-0.6B"


def _check(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("EDGEFARM_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text()


def _row(rec: Recorder, run: int, model: str, precision: str, platform: str, stages: dict[str, str], *,
         toolchain: tuple[str, str] = TRT, reason: str | None = None, route: str | None = None,
         variant: str = "", environment: dict[str, object] | None = None) -> None:
    extra = {"variant": variant} if variant else {}
    for stage, status in stages.items():
        on_device = stage not in ("quantize", "export")
        ran = status in ("pass", "fail", "error")
        rec.record_result(run, model=model, precision=precision, platform=platform, stage=stage,
                          test_id=f"{model}-{precision}{'-' + variant if variant else ''}", status=status,
                          device=f"{platform}-1" if on_device and ran else "orchestrator", toolchain=toolchain[0],
                          toolchain_version=toolchain[1] if ran else None,
                          reason=None if status == "pass" else reason,
                          route=route if on_device and ran else None,
                          environment=environment if on_device and ran else None, **extra)


def build_db(path: Path) -> str:
    """Three published nightly runs on orin, thor and x86-cpu (x86-a30, x86-h200 and x86-rtx5080 never tested)."""
    from edgefarm.results.db import make_engine
    from edgefarm.results.migrate import upgrade

    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    passed = dict.fromkeys(PIPELINE, "pass")
    build_failed = {"export": "pass", "build": "fail", "infer": "skipped", "accuracy": "skipped"}
    for n in (1, 2, 3):
        run = rec.start_run("nightly", "schedule", "abc123",
                            started_at=dt.datetime(2026, 11, 26 + n, 2, tzinfo=dt.UTC))
        # L0 covered, with the board's environment
        _row(rec, run, BASE, "fp16", "orin", passed, environment=ORIN_ENV)
        # failing since run 2 (a streak over runs 2 and 3), after a pass in run 1
        _row(rec, run, BASE, "int8_sq", "orin", passed if n == 1 else build_failed,
             reason="TensorRT: no int8 kernel for this layer", environment=ORIN_ENV)
        # export-only evidence: implemented
        _row(rec, run, BASE, "int4_awq", "thor",
             {"quantize": "pass", "export": "pass", "build": "skipped", "infer": "skipped", "accuracy": "skipped"},
             reason="no device of platform thor in the inventory")
        # not applicable on orin
        _row(rec, run, BASE, "fp8", "orin", dict.fromkeys(PIPELINE, "not_applicable"),
             reason="fp8 needs SM89+; orin is SM87")
        # a checkpoint with failing evidence only: never listed
        _row(rec, run, "meta-llama/Llama-3.2-1B-Instruct", "fp16", "orin", build_failed,
             reason="engine build ran out of memory")
        # a synthetic model: checkpoint-direct on thor, waived on x86-cpu
        _row(rec, run, "tiny-qwen3", "fp16", "thor", passed, route="direct")
        _row(rec, run, "tiny-qwen3", "fp32", "x86-cpu", dict.fromkeys(PIPELINE, "waived"), toolchain=ORT,
             reason=WAIVER)
        # a pre-quantized checkpoint
        _row(rec, run, "tiny-qwen3-128-int4-awq", "int4_awq", "x86-cpu", passed, toolchain=ORT)
        # variant rows: an EAGLE3 draft and its base, a LoRA adapter
        _row(rec, run, DRAFT, "fp16", "orin", passed, variant=f"spec=eagle3-draft:{BASE}")
        _row(rec, run, BASE, "fp16", "orin", passed, variant=f"spec=eagle3-base:{DRAFT}")
        _row(rec, run, "tiny-qwen3", "fp16", "thor", passed, variant="lora=tiny-lora:r4:inserted")
        rec.finish_run(run, "failed", finished_at=dt.datetime(2026, 11, 26 + n, 3, tzinfo=dt.UTC))
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("edgellm-pages")
    models = root / "models" / "Qwen3-0.6B"  # the orchestrator's models dir holds this one (read, not copied)
    models.mkdir(parents=True)
    (models / "config.json").write_text('{"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}')
    url = build_db(root / "edgefarm.db")
    from edgefarm.results.db import make_engine

    engine = make_engine(url)
    old = os.environ.get("EDGEFARM_MODELS_DIR")
    os.environ["EDGEFARM_MODELS_DIR"] = str(root / "models")
    try:
        summary = write_layout_pages(engine, root / "docs", LAYOUT, generated_at="2026-12-01T04:00:00+00:00",
                                      db_label="SQLite", data_dir=root / "data")
    finally:
        engine.dispose()
        if old is None:
            del os.environ["EDGEFARM_MODELS_DIR"]
        else:
            os.environ["EDGEFARM_MODELS_DIR"] = old
    assert summary["pages"] == ["edge-llm/supported-models.md", "edge-llm/support-matrix.md"]
    out = {name: (root / "docs" / "edge-llm" / name).read_text() for name in ("supported-models.md",
                                                                            "support-matrix.md")}
    for text in out.values():
        assert str(root) not in text
    return out


@pytest.mark.parametrize("page", ["supported-models.md", "support-matrix.md"])
def test_pages_of_a_fixed_database_match_the_golden_files(pages: dict[str, str], page: str) -> None:
    _check(f"db-{page}", pages[page])


def test_evidence_of_the_fixed_database(pages: dict[str, str]) -> None:
    md, matrix = pages["supported-models.md"], pages["support-matrix.md"]
    assert "([run 3](../runs/run-3.md#qwen-qwen3-0-6b-fp16-orin-" in md  # the row's section of its run page
    md = re.sub(r"(run-\d+\.md)#[a-z0-9-]+", r"\1", md)
    assert "<summary><b>Qwen3</b></summary>" in md and "`model_type: qwen3`" in md
    qwen = md.split("[Qwen/Qwen3-0.6B](https://huggingface.co/Qwen/Qwen3-0.6B)", 1)[1].split("\n- ", 1)[0]
    assert "`orin` FP16, tensorrt-edgellm 0.11.0: ✓ L0 covered ([run 3](../runs/run-3.md))" in qwen
    assert ("`orin` INT8_SQ: ✗ failing since run 2 (latest [run 3](../runs/run-3.md)): TensorRT: no int8 kernel "
            "for this layer") in qwen
    assert "`thor` INT4_AWQ, tensorrt-edgellm 0.11.0: ◇ implemented (export verified only)" in qwen
    assert "FP8" not in qwen  # not applicable there: counted in the matrix, not listed
    assert "`thor` FP16, tensorrt-edgellm 0.11.0: ◆ checkpoint-direct only" in md
    # the x86-cpu rows edgellm-ort ran (a waived one, an L0-covered pre-quantized one) are not this toolchain's
    # evidence: its pages never list them (the fixed-evidence pages below show both kinds rendered)
    assert "`x86-cpu`" not in md and "tiny-qwen3-128-int4-awq" not in md and "edgellm-ort" not in md
    assert "Llama-3.2-1B" not in md  # only failing evidence: not listed
    header = "| Platform | Level | OS / SDK | CUDA Toolkit | TensorRT | Build location | Precision constraint |"
    assert header in matrix
    orin = next(line for line in matrix.splitlines() if "(`orin`)" in line)
    assert orin.split(" | ")[1:] == ["Official", "JetPack 6.2.1 (L4T 36.4.3)", "12.6.68", "10.3.0.30", "Device",
                                     "FP16, INT8_SQ, INT4_AWQ, INT4_GPTQ only |"]
    a30 = next(line for line in matrix.splitlines() if "(`x86-a30`)" in line)
    assert a30.split(" | ")[1:6] == ["Developer", "not recorded", "not recorded", "not recorded", "Workstation"]


# -- fixed evidence rows (pure rendering) ----------------------------------------------------------------------------
def _ev(model: str, precision: str, platform: str, status: SupportStatus, *, variant: str = "",
        made_by: str | None = "tensorrt-edgellm 0.11.0", since_run: int | None = None, reason: str | None = None,
        until: dt.date | None = None, link: str | None = None) -> Evidence:
    return Evidence(model, precision, platform, Support(status, since_run, reason, until, link, run_id=3),
                    toolchain=made_by.split()[0] if made_by else None, made_by=made_by, variant=variant)


EVIDENCE = [
    _ev(BASE, "fp16", "orin", SupportStatus.L0_COVERED),
    _ev(BASE, "int8_sq", "orin", SupportStatus.FAILING, since_run=2, reason="build: no int8 kernel"),
    _ev(BASE, "int4_awq", "thor", SupportStatus.IMPLEMENTED),
    _ev(BASE, "fp8", "orin", SupportStatus.NOT_APPLICABLE, reason="fp8 needs SM89+"),
    _ev(BASE, "fp16", "orin", SupportStatus.L0_COVERED, variant=f"spec=eagle3-base:{DRAFT}"),
    _ev("meta-llama/Llama-3.2-1B-Instruct", "fp16", "orin", SupportStatus.FAILING, since_run=1, reason="oom"),
    _ev("tiny-qwen3", "fp16", "thor", SupportStatus.CHECKPOINT_DIRECT),
    _ev("tiny-qwen3", "fp32", "x86-cpu", SupportStatus.WAIVED, made_by="edgellm-ort 0.1.0", reason=WAIVER,
        until=dt.date(2027, 1, 31), link="https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/187"),
    _ev("tiny-qwen3", "fp32", "x86-cpu", SupportStatus.SKIPPED, made_by="edgellm-ort 0.1.0",
        variant="components=llm+visual", reason="no visual encoder"),
    _ev("tiny-qwen3-128-int4-awq", "int4_awq", "x86-cpu", SupportStatus.L0_COVERED, made_by="edgellm-ort 0.1.0"),
    _ev(DRAFT, "fp16", "orin", SupportStatus.L0_COVERED, variant=f"spec=eagle3-draft:{BASE}"),
    _ev("tiny-qwen3", "fp16", "thor", SupportStatus.L0_COVERED, variant="lora=tiny-lora:r4:inserted"),
    _ev("tiny-qwen3", "fp16", "thor", SupportStatus.IMPLEMENTED, variant="vocab=tiny-vocab:256"),
    _ev("tiny-qwen3", "fp16", "thor", SupportStatus.FAILING, variant="fp8emb", since_run=3,
        reason="hidden size 64 is not a multiple of 128"),
]
CHECKPOINTS = {
    BASE: CheckpointInfo(BASE, "qwen3"),
    "tiny-qwen3": CheckpointInfo("tiny-qwen3", "qwen3"),
    "tiny-qwen3-128-int4-awq": CheckpointInfo("tiny-qwen3-128-int4-awq", "qwen3", "int4_awq", "tiny-qwen3-128"),
    "meta-llama/Llama-3.2-1B-Instruct": CheckpointInfo("meta-llama/Llama-3.2-1B-Instruct", "llama"),
}
PLATFORMS = [
    PlatformInfo("orin", "NVIDIA Jetson AGX Orin", "Official", "JetPack 6.2.1", "12.6.68", "10.3.0.30", "Device",
                 "FP16, INT8_SQ only", ("fp16", "int8_sq"), environment_run=3),
    PlatformInfo("thor", "NVIDIA Jetson Thor", "Official", build_location="Device",
                 precision_constraint="FP16, FP8, INT4_AWQ only", precisions=("fp16", "fp8", "int4_awq")),
    PlatformInfo("x86-cpu", "x86-64 CPU", "Developer", build_location="Workstation",
                 precision_constraint="FP32, INT4_AWQ only", precisions=("fp32", "int4_awq")),
    PlatformInfo("x86-a30", "NVIDIA A30", "Developer", build_location="Workstation",
                 precision_constraint="FP16 only", precisions=("fp16",)),
]


def test_pages_of_fixed_evidence_match_the_golden_files() -> None:
    when = "2026-12-01T04:00:00+00:00"
    md = render_supported_models(EVIDENCE, CHECKPOINTS, generated_at=when, db_label="SQLite", layout=LAYOUT)
    matrix = render_support_matrix(PLATFORMS, EVIDENCE, generated_at=when, db_label="SQLite", layout=LAYOUT)
    _check("supported-models.md", md)
    _check("support-matrix.md", matrix)
    assert "| Draft checkpoint | Base model | Evidence (extension) |" in md
    assert (f"| [{DRAFT}](https://huggingface.co/{DRAFT}) | [{BASE}](https://huggingface.co/{BASE}) | `orin` FP16"
            in md)
    assert "## LoRA Adapters (extension)" in md and "## Reduced Vocabulary (extension)" in md
    assert "## FP8 Embedding (extension)" not in md  # its only row fails: not listed
    assert "## Multimodal Components (extension)" not in md  # skipped only
    assert "Llama" not in md


def test_coverage_counts_never_tested_and_not_applicable_platforms() -> None:
    counts = coverage(PLATFORMS, EVIDENCE)
    a30 = counts["x86-a30"]
    # nothing ran there: each (model, precision, variant) tested elsewhere is never tested at fp16, else n/a
    fp16 = {(e.model, e.variant) for e in EVIDENCE if e.precision == "fp16"}
    others = {(e.model, e.precision, e.variant) for e in EVIDENCE if e.precision != "fp16"}
    assert a30[SupportStatus.NEVER_TESTED] == len(fp16) and a30[SupportStatus.NOT_APPLICABLE] == len(others)
    assert counts["orin"][SupportStatus.L0_COVERED] == 3 and counts["orin"][SupportStatus.FAILING] == 2


def test_a_checkpoint_with_only_failing_evidence_is_not_listed() -> None:
    rows = [_ev("org/broken", "fp16", "orin", SupportStatus.FAILING, since_run=1, reason="boom"),
            _ev("org/broken", "fp16", "thor", SupportStatus.WAIVED, until=dt.date(2027, 1, 1)),
            _ev("org/broken", "fp8", "orin", SupportStatus.NOT_APPLICABLE),
            _ev("org/broken", "fp16", "x86-cpu", SupportStatus.SKIPPED)]
    md = render_supported_models(rows, {}, generated_at="t", db_label="SQLite", layout=LAYOUT)
    assert "broken" not in md and "No checkpoint has passing or export evidence yet." in md
    listed = render_supported_models([*rows, _ev("org/broken", "int4_awq", "thor", SupportStatus.IMPLEMENTED)], {},
                                     generated_at="t", db_label="SQLite", layout=LAYOUT)
    assert "[org/broken](https://huggingface.co/org/broken)" in listed and "✗ failing since run 1" in listed


_PIPE = re.compile(r"(?<!\\)\|")  # a cell separator: a pipe without a backslash
_RAW_TAG = re.compile(r"(?<!\\)<(?:script|!--)|(?<![\\\n])</details")  # markup that was not escaped
HOSTILE = "evil|name</details>\n## Injected <script>x</script> [a](http://e.example) `code` *em* <!--"


def _structure(md: str) -> list[str]:
    """The lines that make a page's structure: headings, HTML block lines and table rows' column counts."""
    out = []
    for line in md.splitlines():
        if line.startswith(("#", "<", "</")):
            out.append(line)
        elif line.startswith("|"):
            out.append(f"| x{len(_PIPE.findall(line))}")
    return out


def test_hostile_names_keep_the_markdown_structure() -> None:
    plain = [_ev("org/model", "fp16", "orin", SupportStatus.L0_COVERED),
             _ev("org/model", "fp16", "orin", SupportStatus.L0_COVERED, variant="spec=eagle3-draft:org/base"),
             _ev("org/model", "fp16", "orin", SupportStatus.L0_COVERED, variant="lora=a:r4:inserted")]
    hostile = [Evidence(HOSTILE, e.precision, e.platform, Support(SupportStatus.L0_COVERED, run_id=3,
                                                                  reason=HOSTILE),
                        made_by=HOSTILE, variant=e.variant.replace("org/base", HOSTILE).replace("a:", HOSTILE + ":"))
               for e in plain]
    info = {HOSTILE: CheckpointInfo(HOSTILE, HOSTILE, "int4_awq", HOSTILE)}
    want = render_supported_models(plain, {"org/model": CheckpointInfo("org/model", HOSTILE, "int4_awq", "b")},
                                   generated_at="t", db_label="x", layout=LAYOUT)
    got = render_supported_models(hostile, info, generated_at="t", db_label="x", layout=LAYOUT)
    assert _structure(got) == _structure(want)
    assert not _RAW_TAG.search(got) and "](http://e" not in got and "\n## Injected" not in got
    assert "&lt;script&gt;" in got  # the family name inside <summary> is HTML-escaped
    platforms = [PlatformInfo(HOSTILE, HOSTILE, "Official", HOSTILE, HOSTILE, HOSTILE, "Device", HOSTILE)]
    matrix = render_support_matrix(platforms, hostile, generated_at=HOSTILE, db_label=HOSTILE, layout=LAYOUT)
    rows = [line for line in matrix.splitlines() if line.startswith("|")]
    assert len({len(_PIPE.findall(line)) for line in rows[:3]}) == 1
    assert not _RAW_TAG.search(matrix) and "\n## Injected" not in matrix
    assert checkpoint_id("org/a..b") == "org/a..b" and checkpoint_id("tiny") == "`tiny`"
