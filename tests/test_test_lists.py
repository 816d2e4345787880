"""Test list files: schema, selector, includes, waivers, and ``edgefarm lists validate``."""

from __future__ import annotations

import datetime as dt
import shutil
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.stages import Stage
from edgefarm.test_lists import (
    PlatformCatalog,
    TestListError,
    known_platforms,
    list_names,
    load_list,
    validate_paths,
)
from edgefarm.test_lists.catalog import Catalog
from edgefarm.test_lists.loader import LISTS_DIR
from edgellm.errors import ConfigurationError
from edgellm.types import Precision

BROKEN = Path(__file__).parent / "data" / "test_lists_broken"
SHIPPED = ["l0_checkpoint_export", "l0_pipeline_h200", "l0_pipeline_orin", "l0_pipeline_thor", "l0_pipeline_x86cpu",
           "l0_variant_export", "l1_pipeline_x86cpu"]
TODAY = dt.date(2026, 11, 30)
runner = CliRunner()


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


LIST = """\
    name: {name}
    stage: l0
    description: a test list
    platforms:
      {selector}
    defaults:
      max_seq_len: 256
      max_batch_size: 2
      max_input_len: 128
    tests:
      - model: stories260K
        precision: fp32
      - model: meta-llama/Llama-3.2-1B-Instruct
        precision: fp16
        case: smoke
{extra}"""


def make_list(directory: Path, name: str = "mine", selector: str = "terms: [x86-cpu]", extra: str = "") -> Path:
    return write(directory, f"{name}.yml", LIST.format(name=name, selector=selector, extra=extra))


# ------------------------------------------------------------------------- shipped lists


def test_shipped_lists_validate_through_the_cli() -> None:
    result = runner.invoke(app, ["lists", "validate"])
    assert result.exit_code == 0, result.output
    assert "ERROR" not in result.output
    assert "OK: 7 list(s)" in result.output
    assert "platforms: orin, thor, x86-cpu, x86-h200" in result.output


def test_shipped_lists_content() -> None:
    assert list_names() == SHIPPED
    report = validate_paths(today=TODAY)
    assert report.errors == [] and report.warnings == []
    assert {w.waiver.bug for w in report.waivers} == {
        "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/187",
        "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/216",
    }
    cpu = load_list("l0_pipeline_x86cpu")
    ids = cpu.test_ids
    assert "stories260K-fp32-mxsl256-mxbs2-mxil128" in ids and "stories260K-fp16-mxsl256-mxbs2-mxil128" in ids
    assert {e.model for e in cpu.entries} >= {"tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"}
    assert all(e.stages == (Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.ACCURACY) for e in cpu.entries)
    l1 = load_list("l1_pipeline_x86cpu")
    assert all(Stage.BENCH in e.stages for e in l1.entries)
    orin = load_list("l0_pipeline_orin")
    assert {e.precision for e in orin.entries} == {Precision.FP16, Precision.INT4_AWQ}
    assert "Qwen2.5-0.5B-Instruct-fp16-mxsl4096-mxbs4-mxil2048" in orin.test_ids  # from the shared fragment
    thor = load_list("l0_pipeline_thor").entries_for("thor", today=TODAY)
    waived = {e.test_id for e in thor if e.waived}
    assert waived == {"Qwen3-0.6B-nvfp4-mxsl4096-mxbs4-mxil2048"}  # by the directory-wide waivers.yml
    assert load_list("l0_pipeline_h200").platforms == ("x86-h200",)
    # the layout models (real widths, random weights) have rows of their own in the Orin and Thor lists
    # (issue 35: Gemma-3 1B's and Phi-4-mini's at fp16 on both)
    assert {e.model for e in orin.entries if e.model.endswith("-layout")} == {
        "qwen2.5-0.5b-layout", "llama-3.2-1b-layout", "gemma-3-1b-layout", "phi-4-mini-layout"}
    assert {(e.model, e.precision) for e in thor if e.model.endswith("-layout")} == {
        ("qwen2.5-0.5b-layout", Precision.FP16), ("qwen2.5-0.5b-layout", Precision.FP8),
        ("qwen2.5-0.5b-layout", Precision.NVFP4), ("qwen3-0.6b-layout", Precision.NVFP4),
        ("gemma-3-1b-layout", Precision.FP16), ("phi-4-mini-layout", Precision.FP16)}
    # every float catalog model x five precisions, host stages only; not the layout models (quantizing their real
    # widths takes minutes per method on 2 cores: their quantized rows are the hardware lists'); a pre-quantized one
    # at its own precision
    exports = load_list("l0_checkpoint_export")
    # the variant parts (drafts, adapters, vocabularies, the VLM) and the EAGLE3 base are l0_variant_export's rows
    sources = {m: s for m, s in Catalog.load().sources.items() if s.kind != "synth_variant" and m != "tiny-llama-4l"}
    assert {(e.model, e.precision) for e in exports.entries} == {
        (m, p) for m, s in sources.items() if not m.endswith("-layout") and s.base is None
        for p in (Precision.FP16, Precision.FP8, Precision.INT4_AWQ, Precision.INT8_SQ, Precision.NVFP4)} | {
        (m, s.checkpoint_precision()) for m, s in sources.items() if s.base is not None}
    assert all(set(e.stages) <= {Stage.QUANTIZE, Stage.EXPORT} for e in exports.entries)


def test_known_platforms_come_from_device_types() -> None:
    assert known_platforms() == {"x86-cpu", "x86-h200", "x86-a30", "x86-rtx5080", "orin", "thor", "orin-nano-8gb",
                                 "orin-nx-16gb", "agx-orin-32gb"}
    catalog = PlatformCatalog.from_dir()
    assert catalog.device_types and "orin" in catalog and catalog.names == sorted(known_platforms())


def test_a_list_is_checked_by_the_same_capability_the_plan_uses(tmp_path: Path) -> None:
    """An Orin test with an fp8 KV cache is refused naming the field and the hardware's reason (what the plan
    would record as not applicable); so is an LM head the hardware has no format for."""
    path = write(tmp_path, "mine.yml", """\
        name: mine
        stage: l0
        description: capability
        platforms: {terms: [orin]}
        defaults: {max_seq_len: 256, max_batch_size: 2, max_input_len: 128}
        tests:
          - {model: stories260K, precision: int4_awq, kv_cache_precision: fp8}
          - {model: stories260K, precision: int4_awq, lm_head_precision: nvfp4}
          - {model: stories260K, precision: fp8}
        """)
    with pytest.raises(ConfigurationError) as caught:
        load_list(path)
    text = str(caught.value)
    assert "kv_cache_precision: orin (SM87) does not support a fp8 KV cache (needs SM89+)" in text
    assert "lm_head_precision: orin (SM87) does not support a nvfp4 LM head (needs SM100+)" in text
    assert "precision: orin (SM87) does not support fp8 (needs SM89+)" in text


# ------------------------------------------------------------------------- broken lists

BROKEN_REASONS = [
    # bad YAML syntax: file and line, never skipped
    "bad_syntax.yml:6: invalid YAML: while parsing a flow sequence (started at line 5)",
    # unknown top-level key, bad list stage
    "bad_entries.yml:4: colour: unknown key 'colour'; valid: name, stage, description, platforms",
    "bad_entries.yml:2: stage: Input should be 'l0' or 'l1', got 'l2'",
    # unknown platform term, glob matching nothing
    "bad_entries.yml:6: platforms.terms: unknown platform 'orin2'; known: agx-orin-32gb, orin, orin-nano-8gb, "
    "orin-nx-16gb, thor, x86-a30, x86-cpu",
    "bad_entries.yml:7: platforms.wildcards: wildcard 'jetson-*' matches no known platform",
    # unknown precision
    "bad_entries.yml:14: tests[0] (Qwen2.5-0.5B-Instruct): precision: unknown precision 'fp7'; valid: fp32, fp16",
    # max_input_len > max_seq_len (the limit comes from defaults)
    "bad_entries.yml:15: tests[1] (Qwen2.5-0.5B-Instruct): max_input_len 8192 > max_seq_len 4096",
    # duplicate test id: same short name from another org
    "bad_entries.yml:23: tests[3] Llama-3.2-1B-Instruct-int4_awq-lmfp16-mxsl2048-mxbs4-mxil1024: duplicate test id "
    "(first at ",
    # a model the catalog does not have
    "bad_entries.yml:23: tests[3] Llama-3.2-1B-Instruct-int4_awq-lmfp16-mxsl2048-mxbs4-mxil1024: model: unknown "
    "model 'other-org/Llama-3.2-1B-Instruct'; the model catalog ",
    # unknown key in an entry
    "tests[4] (Qwen3-0.6B): max_seqlen: unknown key 'max_seqlen'; valid: precision,",
    # stage order, and a stage whose input is not produced
    "tests[5] (Qwen3-0.6B): stages build, export, infer are not in pipeline order",
    "tests[6] (Qwen3-0.6B): stage infer needs build, which is not in stages",
    # platform capability (test_lists.capability: the plan's answer too)
    "tests[7] Mistral-7B-v0.3-fp8-mxsl4096-mxbs4-mxil2048: precision: orin (SM87) does not support fp8 (needs SM89+)",
    "tests[7] Mistral-7B-v0.3-fp8-mxsl4096-mxbs4-mxil2048: precision: x86-a30 (SM80) does not support fp8 "
    "(needs SM89+)",
    "tests[7] Mistral-7B-v0.3-fp8-mxsl4096-mxbs4-mxil2048: precision: fp8 is emulated on x86-cpu (no fp8 GEMM kernel)",
    "tests[2] Llama-3.2-1B-Instruct-int4_awq-lmfp16-mxsl2048-mxbs4-mxil1024: lm_head_precision: toolchain edgellm-ort: "
    "LM-head precision 'fp16' is not supported by export at int4_awq",
    # waivers: bad URL is an error; expired and unused are warnings
    "bad_entries.yml:48: waivers[2]: bug: bug 'not-a-url' is not an http(s) URL",
    # a placeholder link is no link (issue 23: waivers without a real link are refused)
    "bad_entries.yml:51: waivers[3]: bug: bug 'https://github.com/example/edgellm-farm/issues/3' is a placeholder link "
    "(owner 'example')",
    "WARNING tests/data/test_lists_broken/bad_entries.yml:41: expires: waiver 'Qwen3-0.6B-*' "
    "(https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/1) expired on 2020-01-31",
    "WARNING tests/data/test_lists_broken/bad_entries.yml:44: pattern: waiver 'Gemma-*' "
    "(https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/2) matches no test",
    # includes: a cycle and a missing file
    "fragments/loop_b.yml:1: include: include cycle: loop_a.yml -> loop_b.yml -> loop_a.yml",
    "cycle.yml:6: include: included file 'fragments/missing.yml' not found",
    # name must equal the stem
    "wrong_name.yml:1: name: name 'not_the_stem' must equal the file name stem 'wrong_name'",
]


def test_broken_lists_report_every_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(BROKEN.parent.parent.parent)  # paths in the report are as given: relative to the repo
    result = runner.invoke(app, ["lists", "validate", "tests/data/test_lists_broken", "--today", "2026-11-30"])
    assert result.exit_code == 2, result.output
    missing = [r for r in BROKEN_REASONS if r not in result.output]
    assert not missing, f"not reported: {missing}\n--- output:\n{result.output}"
    errors = [line for line in result.output.splitlines() if line.startswith("ERROR ")]
    assert len(errors) == 22, result.output
    assert "FAILED: 22 error(s), 3 warning(s) in 4 file(s)" in result.output
    assert "Traceback" not in result.output


def test_each_broken_file_alone_still_fails(tmp_path: Path) -> None:
    for name in ("bad_syntax.yml", "bad_entries.yml", "cycle.yml", "wrong_name.yml"):
        report = validate_paths([BROKEN / name], today=TODAY)
        assert report.errors and not report.lists, name
        with pytest.raises(TestListError) as err:
            load_list(BROKEN / name)
        assert len(err.value.problems) == len(report.errors), name


# ------------------------------------------------------------------------- schema details


def test_entries_defaults_timeouts_and_sources(tmp_path: Path) -> None:
    tl = load_list(make_list(tmp_path))
    first, second = tl.entries
    assert first.test_id == "stories260K-fp32-mxsl256-mxbs2-mxil128"
    assert second.test_id == "Llama-3.2-1B-Instruct-fp16-mxsl256-mxbs2-mxil128-smoke"
    assert second.model == "meta-llama/Llama-3.2-1B-Instruct"
    assert first.timeouts == {Stage.EXPORT: 1200, Stage.BUILD: 1200, Stage.INFER: 6000, Stage.ACCURACY: 6000}
    assert first.source.endswith("mine.yml:11")
    extra = """\
      - model: stories260K
        precision: fp16
        stages: [export, build, infer, bench]
        timeout: 90
      - model: stories260K
        precision: fp16
        case: per_stage
        timeout: {build: 30}
"""
    tl = load_list(make_list(tmp_path, "more", extra=extra))
    assert tl.entries[2].timeouts == dict.fromkeys((Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.BENCH), 90)
    assert tl.entries[3].timeout(Stage.BUILD) == 30 and tl.entries[3].timeout(Stage.INFER) == 6000


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("      - {model: stories260K, precision: fp16, case: a, timeout: 7000}",
         "timeout.all_stages: Input should be less than or equal to 6000, got 7000"),
        ("      - {model: stories260K, precision: fp16, case: a, timeout: {deploy: 5}}",
         "timeout.per_stage.deploy.[key]: unknown stage 'deploy'"),
        ("      - {model: stories260K, precision: fp16, case: a, stages: [quantize, export]}",
         "stage quantize makes no sense for precision fp16"),
        ("      - {model: stories260K, precision: fp16, case: a, stages: []}", "stages is empty"),
        ("      - {model: stories260K, precision: fp16, case: a, stages: [export, export]}", "or repeat one"),
        ("      - {model: stories260K, precision: fp16, case: a, stages: [export, build, accuracy]}",
         "stage accuracy needs infer"),
        ("      - {model: stories260K, precision: fp16, case: a, stages: [export, deploy]}",
         "unknown stage 'deploy'; valid: reference, quantize, export"),
        ("      - {model: stories260K, precision: fp16, case: a, max_batch_size: 0}", "greater than or equal to 1"),
        ("      - {model: stories260K, precision: fp16, case: a, max_batch_size: '4'}", "valid integer"),
        ("      - {model: stories260K, precision: fp16, case: fp8kv}", "may not start with 'fp8kv'"),
        ("      - {model: 'a/b/c', precision: fp16}", "neither a Hugging Face id"),
        ("      - {model: Foo-mxsl3, precision: fp16}", "reserve"),
        ("      - {model: stories260K, precision: fp16, kv_cache_precision: fp8, case: b}",
         "x86-cpu (CPU) does not support a fp8 KV cache (supported: fp32, fp16)"),
        ("      - {model: stories260K, precision: fp16, lm_head_precision: nvfp4, case: b}",
         "x86-cpu (CPU) does not support a nvfp4 LM head (supported: fp32, fp16, int8_wo, int4_wo)"),
        ("      - just a string", "tests[2]: must be a mapping"),
        ("      - {model: stories260K}", "tests[2] (stories260K): precision: model 'stories260K': no precision given, "
                                       "and its checkpoint is not quantized; give precision (one of fp32"),
    ],
)
def test_entry_problems(tmp_path: Path, extra: str, needle: str) -> None:
    report = validate_paths([make_list(tmp_path, extra=extra + "\n")], today=TODAY)
    text = "\n".join(map(str, report.errors))
    assert len(report.errors) == 1 and needle in text, text


def test_duplicate_yaml_key_and_non_mapping_and_empty(tmp_path: Path) -> None:
    dup = write(tmp_path, "dup.yml", "name: dup\nname: dup\n")
    assert "dup.yml:2: invalid YAML: while constructing a mapping (started at line 1) duplicate key 'name'" in str(
        validate_paths([dup]).errors[0]
    )
    seq = write(tmp_path, "seq.yml", "- 1\n- 2\n")
    assert "a test list must be a mapping" in str(validate_paths([seq]).errors[0])
    empty = write(tmp_path, "empty.yml", "name: empty\nstage: l0\ndescription: x\nplatforms: {terms: [orin]}\n")
    assert "the list has no tests" in str(validate_paths([empty]).errors[0])
    nothing = write(tmp_path, "nothing.yml", LIST.format(name="nothing", selector="labels: [jetson]", extra=""))
    assert "selects no platform" in "\n".join(map(str, validate_paths([nothing]).errors))
    assert "no such file or directory" in str(validate_paths([tmp_path / "nope.yml"]).errors[0])


def test_include_merges_tests_and_defaults(tmp_path: Path) -> None:
    write(tmp_path, "frags/base.yml", """\
        defaults: {max_seq_len: 1024, max_batch_size: 8, max_input_len: 512, stages: [export, build]}
        include: [more.yml]
        tests:
          - {model: tiny-qwen2, precision: fp32}
        """)
    write(tmp_path, "frags/more.yml", "tests:\n  - {model: tiny-qwen3, precision: fp32}\n")
    path = write(tmp_path, "inc.yml", """\
        name: inc
        stage: l1
        description: uses a fragment
        platforms: {terms: [x86-cpu]}
        include: [frags/base.yml]
        defaults: {max_batch_size: 1}
        tests:
          - {model: stories260K, precision: fp32}
        """)
    tl = load_list(path)
    # the list's own defaults win over the fragment's; fragment tests come first
    assert tl.test_ids == [
        "tiny-qwen3-fp32-mxsl1024-mxbs1-mxil512",
        "tiny-qwen2-fp32-mxsl1024-mxbs1-mxil512",
        "stories260K-fp32-mxsl1024-mxbs1-mxil512",
    ]
    assert tl.entries[0].stages == (Stage.EXPORT, Stage.BUILD)
    assert tl.entries[0].source.startswith(str(tmp_path / "frags" / "more.yml"))


# ------------------------------------------------------------------------- selector


def test_selector_terms_wildcards_labels(tmp_path: Path) -> None:
    catalog = PlatformCatalog.from_dir()
    tl = load_list(make_list(tmp_path, selector="{wildcards: ['x86-[ch]*'], labels: [fast]}"), platforms=catalog)
    assert tl.platforms == ("x86-cpu", "x86-h200")
    assert tl.selects("x86-h200") and not tl.selects("x86-a30") and not tl.selects("orin")
    assert tl.entries_for("orin", today=TODAY) == []
    assert [e.test_id for e in tl.entries_for("x86-h200", today=TODAY)] == tl.test_ids
    assert tl.accepts_device("x86-cpu", ["fast", "big"]) == (True, [])
    ok, reasons = tl.accepts_device("orin", [])
    assert not ok and len(reasons) == 2
    assert "platform 'orin' is not selected by mine" in reasons[0] and "lacks label(s) fast" in reasons[1]


def test_explicit_known_platforms(tmp_path: Path) -> None:
    path = make_list(tmp_path, selector="{terms: [alpha], wildcards: ['b*']}")
    tl = load_list(path, platforms={"alpha", "beta", "gamma"})
    assert tl.platforms == ("alpha", "beta")
    with pytest.raises(TestListError) as err:
        load_list(path)  # against the real device types: neither exists
    text = str(err.value)
    assert "unknown platform 'alpha'" in text and "wildcard 'b*' matches no known platform" in text


def test_load_list_by_name(tmp_path: Path) -> None:
    make_list(tmp_path, "one")
    assert load_list("one", lists_dir=tmp_path).name == "one"
    with pytest.raises(ConfigurationError, match=r"unknown test list 'two'; known: one"):
        load_list("two", lists_dir=tmp_path)
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_list(tmp_path / "two.yml")


# ------------------------------------------------------------------------- waivers

WAIVERS = """\
    waivers:
      - pattern: "stories260K-fp32-*"
        platforms: ["x86-c*"]
        bug: https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/7
        expires: 2026-06-30
        reason: placeholder
"""


def test_waiver_applies_until_expiry_inclusive(tmp_path: Path) -> None:
    tl = load_list(make_list(tmp_path, extra=textwrap.indent(textwrap.dedent(WAIVERS), "    ")))
    on_day = tl.entries_for("x86-cpu", today=dt.date(2026, 6, 30))
    assert [e.waived for e in on_day] == [True, False]
    assert on_day[0].waiver is not None and on_day[0].waiver.bug.endswith("/issues/7")
    after = tl.entries_for("x86-cpu", today=dt.date(2026, 7, 1))
    assert [e.waived for e in after] == [False, False] and after[0].waiver is None
    assert tl.expired_waivers(dt.date(2026, 6, 30)) == []
    assert [w.pattern for w in tl.expired_waivers(dt.date(2026, 7, 1))] == ["stories260K-fp32-*"]


def test_waiver_platform_scope_and_shared_waivers_file(tmp_path: Path) -> None:
    make_list(tmp_path, selector="{terms: [x86-cpu, x86-h200]}")
    write(tmp_path, "waivers.yml", WAIVERS.replace("2026-06-30", "2099-01-01"))
    tl = load_list("mine", lists_dir=tmp_path)
    assert [e.waived for e in tl.entries_for("x86-cpu", today=TODAY)] == [True, False]
    assert [e.waived for e in tl.entries_for("x86-h200", today=TODAY)] == [False, False]  # outside its scope
    assert list_names(tmp_path) == ["mine"]  # waivers.yml is not a list


def test_expired_and_unused_waivers_are_warnings(tmp_path: Path) -> None:
    make_list(tmp_path)
    write(tmp_path, "waivers.yml", WAIVERS + """\
      - pattern: "Gemma-*"
        bug: https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/8
        expires: 2099-01-01
""")
    report = validate_paths([tmp_path], today=TODAY)
    assert report.errors == [] and len(report.lists) == 1
    assert [w.waiver.pattern for w in report.expired] == ["stories260K-fp32-*"]
    text = "\n".join(map(str, report.warnings))
    assert "expired on 2026-06-30" in text and "waiver 'Gemma-*'" in text and "matches no test" in text
    result = runner.invoke(app, ["lists", "validate", str(tmp_path), "--today", "2026-11-30"])
    assert result.exit_code == 0, result.output
    assert "WARNING" in result.output and "waivers: 1 active, 1 expired; 2 warning(s)" in result.output
    strict = runner.invoke(app, ["lists", "validate", str(tmp_path), "--today", "2026-11-30", "--strict"])
    assert strict.exit_code == 2 and "FAILED: 0 error(s), 2 warning(s)" in strict.output
    bad_day = runner.invoke(app, ["lists", "validate", str(tmp_path), "--today", "30/11/2026"])
    assert bad_day.exit_code == 2 and "is not a date YYYY-MM-DD" in bad_day.output


def test_waiver_problems_are_errors(tmp_path: Path) -> None:
    write(tmp_path, "waivers.yml", """\
        waivers:
          - pattern: "*"
            platforms: [mars]
            bug: https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/9
            expires: 2099-01-01
          - pattern: "*"
            expires: soon
            owner: me
        """)
    report = validate_paths([tmp_path / "waivers.yml"], today=TODAY)
    text = "\n".join(map(str, report.errors))
    assert ("waivers.yml:3: waivers[0]: platforms: unknown platform 'mars'; known: agx-orin-32gb, orin, "
            "orin-nano-8gb") in text
    assert "waivers[1]: bug: required key is missing" in text
    assert "waivers[1]: expires: Input should be a valid date" in text
    assert "waivers[1]: owner: unknown key 'owner'; valid: pattern, platforms, bug, expires, reason" in text


def test_every_model_is_checked_against_the_catalog_beside_the_lists(tmp_path: Path) -> None:
    """Without their catalog entries, l0_pipeline_h200's models are an error naming file:line and the catalog."""
    lists = tmp_path / "lists"
    shutil.copytree(LISTS_DIR, lists)
    catalog = lists / "models.yml"
    text = catalog.read_text()
    for name in ("meta-llama/Llama-3.1-8B-Instruct", "mistralai/Mistral-7B-v0.3"):
        start = text.index(f"  {name}:")
        text = text[:start] + text[text.index("\n", text.index("path:", start)) + 1:]
    catalog.write_text(text)
    result = runner.invoke(app, ["lists", "validate", str(lists)])
    assert result.exit_code == 2, result.output
    h200 = (lists / "l0_pipeline_h200.yml").read_text().splitlines()
    line = h200.index("  - model: mistralai/Mistral-7B-v0.3") + 1
    names = ", ".join(sorted(Catalog.load(catalog).sources))
    assert (f"ERROR {lists / 'l0_pipeline_h200.yml'}:{line}: tests[1] Mistral-7B-v0.3-fp8-mxsl8192-mxbs4-mxil4096"
            f"-fp8kv: model: unknown model 'mistralai/Mistral-7B-v0.3'; the model catalog {catalog} has: {names}"
            in result.output.splitlines())
    assert "unknown model 'meta-llama/Llama-3.1-8B-Instruct'" in result.output
    assert "FAILED: 12 error(s)" in result.output  # and 5 precisions of each in l0_checkpoint_export
