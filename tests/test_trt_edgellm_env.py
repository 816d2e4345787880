"""Toolchain environments (``edgefarm toolchains install | list``) and the shipped calibration text."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.toolchains.tensorrt_edgellm.calibration import CALIBRATION_FILE, calibration_rows, render
from edgefarm.toolchains.tensorrt_edgellm.env import (
    _relocate,
    _swap_into_place,
    check_version,
    health,
    install,
    installed_version,
)
from edgefarm.vocabulary.variant import PLAIN
from edgellm import BUNDLED_TEXT_FILE
from edgellm.errors import ConfigurationError, InfrastructureError
from edgellm.types import Precision

VERSION = "0.11.0"


@pytest.fixture
def registry_down(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip pointed at a closed port, with no config files or local wheel directories to fall back on."""
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "3")
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)


def test_unreachable_registry_fails_with_the_reason_and_leaves_nothing(registry_down: None, tmp_path: Path) -> None:
    with pytest.raises(InfrastructureError, match=r"package registry unreachable at 'install torch==2\.13\.0'"):
        install(tmp_path, VERSION)
    assert list(tmp_path.iterdir()) == []


def test_cli_install_reports_an_unreachable_registry(registry_down: None, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["toolchains", "install", f"tensorrt-edgellm=={VERSION}",
                                      "--data-dir", str(tmp_path)])
    assert result.exit_code == 3, result.output
    assert "error (infrastructure)" in result.output and "package registry unreachable" in result.output
    assert list((tmp_path / "toolchains").iterdir()) == []


def test_cli_install_rejects_bad_specs(tmp_path: Path) -> None:
    for spec, message in (("trtllm==1.0", "unknown toolchain 'trtllm'"),
                          ("tensorrt-edgellm", "give a pinned version"),
                          ("tensorrt-edgellm==0.11;rm", "bad tensorrt-edgellm version '0.11;rm'")):
        result = CliRunner().invoke(app, ["toolchains", "install", spec, "--data-dir", str(tmp_path)])
        assert result.exit_code == 2 and message in result.output, result.output
    with pytest.raises(ConfigurationError):
        check_version("../0.11.0")


def test_list_shows_version_and_health(trt_env: Path, tmp_path: Path) -> None:
    root = tmp_path / "toolchains"
    root.mkdir()
    (root / f"tensorrt-edgellm-{VERSION}").symlink_to(trt_env)
    started = time.monotonic()
    assert install(root, VERSION).healthy  # a healthy environment is reused, not rebuilt
    assert time.monotonic() - started < 120
    result = CliRunner().invoke(app, ["toolchains", "list", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.output)
    assert (row["toolchain"], row["version"], row["healthy"]) == ("tensorrt-edgellm", VERSION, True)
    assert installed_version(trt_env) == VERSION
    (root / "tensorrt-edgellm-0.10.0").mkdir()  # a broken leftover is listed as unhealthy
    with pytest.raises(ConfigurationError, match="no tensorrt-edgellm installed"):
        installed_version(root / "tensorrt-edgellm-0.10.0")
    result = CliRunner().invoke(app, ["toolchains", "list", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 1
    broken = next(r for r in json.loads(result.output) if r["path"].endswith("0.10.0"))
    assert broken["healthy"] is False and "not an environment" in broken["problems"][0]


def test_a_built_environment_works_after_the_move(tmp_path: Path) -> None:
    built, dest = tmp_path / ".tensorrt-edgellm-9.9.9.tmp", tmp_path / "tensorrt-edgellm-9.9.9"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(built)], check=True, timeout=120)
    tool = built / "bin" / "tensorrt-edgellm-quantize"
    tool.write_text(f"#!{built}/bin/python\nimport sys\nprint(sys.prefix)\n")
    tool.chmod(0o755)
    _relocate(built, dest)
    _swap_into_place(built, dest)
    assert not built.exists()
    out = subprocess.run([str(dest / "bin" / "tensorrt-edgellm-quantize")], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == str(dest)
    problems = health(dest).problems
    assert not any("tensorrt-edgellm-quantize" in p for p in problems)  # its script points at dest now
    assert any("import probe failed" in p for p in problems)  # no packages: unhealthy, and says why


def test_shipped_calibration_text_is_made_from_the_bundled_sample() -> None:
    rows = [json.loads(line) for line in CALIBRATION_FILE.read_text(encoding="utf-8").splitlines()]
    assert CALIBRATION_FILE.read_text(encoding="utf-8") == render(
        calibration_rows(BUNDLED_TEXT_FILE.read_text(encoding="utf-8")))
    assert len(rows) >= 50 and all(set(r) == {"article"} and r["article"] for r in rows)


def test_catalog_names_a_chat_template(tmp_path: Path) -> None:
    from edgefarm.test_lists.catalog import Catalog

    (tmp_path / "plain.jinja").write_text("{% for message in messages %}{{ message.content }}{% endfor %}")
    catalog = tmp_path / "models.yml"
    catalog.write_text("models:\n  m:\n    synthetic: {family: qwen3}\n    chat_template: plain.jinja\n"
                       "  n:\n    bundled: stories260K\n    chat_template: missing.jinja\n")
    with pytest.raises(ConfigurationError, match=r"model 'n' chat_template: no file .*missing\.jinja"):
        Catalog.load(catalog)
    catalog.write_text("models:\n  m:\n    synthetic: {family: qwen3}\n    chat_template: plain.jinja\n")
    assert Catalog.load(catalog).get("m").chat_template == tmp_path / "plain.jinja"
    assert Catalog.load().get("tiny-qwen3-128").chat_template is None  # the export default applies


def test_catalog_calibration_samples_reach_the_quantizer_and_its_cache_key(tmp_path: Path) -> None:
    """A model's calibration_samples is the quantizer's --num_samples and part of the quantize key; without it the
    farm's default rows; a value below 1 is refused naming the model and field."""
    from edgefarm.flows.pipeline import job_spec
    from edgefarm.stages.job import CheckpointRef
    from edgefarm.test_lists.catalog import Catalog
    from edgefarm.toolchains.base import driver
    from edgefarm.toolchains.tensorrt_edgellm.host_stages import NUM_SAMPLES

    catalog = tmp_path / "models.yml"
    catalog.write_text("models:\n  m:\n    synthetic: {family: qwen3}\n    calibration_samples: 0\n")
    with pytest.raises(ConfigurationError, match=r"model 'm' calibration_samples: .*greater than or equal to 1"):
        Catalog.load(catalog)
    catalog.write_text("models:\n  m:\n    synthetic: {family: qwen3}\n    calibration_samples: 8\n"
                       "  n:\n    synthetic: {family: qwen3}\n")
    sources = Catalog.load(catalog)

    class _Entry:
        model, precision, test_id, max_seq_len, max_batch_size, max_input_len = "m", Precision.FP8, "t", 64, 1, 32
        stages, timeouts, lm_head_precision, kv_cache_precision, toolchain_versions = ("quantize",), {}, None, None, ()
        features, after = PLAIN, None

    class _Job:
        entry, platform, toolchain = _Entry(), "thor", "tensorrt-edgellm"
        toolchain_version, quantizer, quantizer_version = "0.11.0", "tensorrt-edgellm", "0.11.0"
        prequantized = None
        memory_estimate_gb = None  # the plan's estimate (not sized here)

    ref = CheckpointRef(model="m", path="/nowhere", sha256="0" * 64)
    trt = driver("tensorrt-edgellm")
    keys = [trt.host().quantize_key_inputs(job_spec(_Job(), ref, sources.get(name)), "cpu", "0.11.0") for name in "mn"]
    assert [k["num_samples"] for k in keys] == [8, NUM_SAMPLES]


def test_a_tool_past_its_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    from edgefarm.toolchains.process import run_tool

    marker = tmp_path / "child-survived"
    script = f"sleep 3; touch {marker}"
    with pytest.raises(InfrastructureError, match="sh ran past its 1 s limit and was killed"):
        run_tool(["/bin/sh", "-c", f"({script}) & wait"], env={}, log=tmp_path / "tool.log", timeout=1)
    time.sleep(3.5)
    assert not marker.exists()  # the whole process group went
    done = run_tool([sys.executable, "-c", "b = bytearray(300 * 2**20); print('ok')"], env={},
                    log=tmp_path / "ok.log", timeout=60)
    assert done.returncode == 0 and done.peak_rss_bytes > 300 * 2**20 and "ok" in done.tail()


def test_quantize_options_name_everything_that_changes_the_output() -> None:
    import hashlib

    from edgefarm.toolchains.tensorrt_edgellm.quantize import quantize_options

    fp8 = quantize_options("fp8")
    assert fp8["calibration_sha256"] == hashlib.sha256(CALIBRATION_FILE.read_bytes()).hexdigest()
    assert fp8 != quantize_options("int4_awq") and fp8 != quantize_options("fp8", num_samples=8)
    assert quantize_options("fp8", kv_cache="fp8")["kv_cache"] == "fp8"
    with pytest.raises(ConfigurationError, match="valid: fp8, int4_awq, int8_sq, nvfp4, mxfp8"):
        quantize_options("int4_gptq")
