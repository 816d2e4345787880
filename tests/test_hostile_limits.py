"""Engine limits from hostile input (issue 24): a test list asking for 10^20 positions or a billion rows is refused
by ``lists validate``, and ``edgellm build --max-batch-size 0`` is bad input, never the default."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgefarm.test_lists import validate_paths
from edgellm.backends.base import MAX_BATCH_SIZE, MAX_SEQ_LEN, BuildParams
from edgellm.cli import main
from edgellm.errors import ConfigurationError
from tests.test_test_lists import TODAY, make_list


@pytest.mark.parametrize(("field", "value"), [("max_seq_len", 10**20), ("max_seq_len", MAX_SEQ_LEN + 1),
                                              ("max_batch_size", 10**9), ("max_batch_size", MAX_BATCH_SIZE + 1),
                                              ("max_input_len", 10**20)])
def test_lists_validate_refuses_limits_no_engine_has(tmp_path: Path, field: str, value: int) -> None:
    extra = f"      - {{model: stories260K, precision: fp16, case: big, {field}: {value}}}\n"
    report = validate_paths([make_list(tmp_path, extra=extra)], today=TODAY)
    text = "\n".join(map(str, report.errors))
    assert report.errors and f"{field}: " in text and "less than or equal to" in text, text


def test_lists_validate_takes_the_largest_limits(tmp_path: Path) -> None:
    extra = (f"      - {{model: stories260K, precision: fp16, case: big, max_seq_len: {MAX_SEQ_LEN}, "
             f"max_input_len: {MAX_SEQ_LEN}, max_batch_size: {MAX_BATCH_SIZE}}}\n")
    report = validate_paths([make_list(tmp_path, extra=extra)], today=TODAY)
    assert not report.errors, "\n".join(map(str, report.errors))


@given(batch=st.integers(min_value=-2, max_value=4 * MAX_BATCH_SIZE),
       seq=st.integers(min_value=-2, max_value=4 * MAX_SEQ_LEN))
def test_build_params_hold_exactly_the_engine_limits(batch: int, seq: int) -> None:
    ok = 1 <= batch <= MAX_BATCH_SIZE and 1 <= seq <= MAX_SEQ_LEN
    try:
        BuildParams(max_batch_size=batch, max_input_len=1, max_seq_len=seq)
    except ConfigurationError as exc:
        assert not ok, exc
        assert all(f"{k} {v} must be" in str(exc) for k, v in (("max_batch_size", batch), ("max_seq_len", seq))
                   if not 1 <= v <= (MAX_BATCH_SIZE if k == "max_batch_size" else MAX_SEQ_LEN))
    else:
        assert ok


@pytest.mark.parametrize("flag", ["--max-batch-size", "--max-input-len", "--max-seq-len"])
def test_build_zero_is_bad_input_not_the_default(stories_engine, tmp_path: Path, flag: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-batch-size 0`` became 4 (``0 or 4``): a zero is refused naming the flag's field."""
    rc = main(["build", str(stories_engine.onnx_dir), str(tmp_path / "engine"), "--backend", "ort", flag, "0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{flag.removeprefix('--').replace('-', '_')} 0 must be an integer >= 1" in err, err
    assert not (tmp_path / "engine").exists()
