"""Config YAML through the one hardened reader: no alias bombs, a size cap, no duplicate keys, anchored ids."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgefarm.devices.inventory import load_inventory
from edgefarm.flows.plan import load_matrix
from edgefarm.test_lists import validate_paths
from edgefarm.test_lists.catalog import Catalog
from edgellm.errors import ConfigurationError
from edgellm.yamlio import MAX_EXPANDED_NODES, MAX_YAML_BYTES, YamlSyntaxError, read_yaml
from tests.test_test_lists import TODAY, make_list, write

EDGEFARM = Path(sys.executable).with_name("edgefarm")
MEMORY_CAP = 1 << 30  # address space for the CLI under test: far below what the bomb would take

# Nine levels of nine aliases: 9**9 (387 million) leaves from about 600 bytes ("billion laughs").
BOMB = "\n".join(
    [
        "name: bomb",
        "stage: l0",
        "description: x",
        "platforms: {terms: [x86-cpu]}",
        'a0: &a0 ["fp32","fp32","fp32","fp32","fp32","fp32","fp32","fp32","fp32"]',
        *(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)),
        "tests:",
        "  - {model: stories260K, precision: *a8}",
        "",
    ]
)


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def test_alias_bomb_is_refused_by_the_cli_under_a_memory_cap(tmp_path: Path) -> None:
    assert len(BOMB.encode()) < 700
    bomb = write(tmp_path, "bomb.yml", BOMB)
    start = time.monotonic()
    proc = subprocess.run(
        [str(EDGEFARM), "lists", "validate", str(bomb)],
        capture_output=True,
        text=True,
        preexec_fn=_cap_memory,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "bomb.yml:5: invalid YAML: anchors and aliases" in proc.stdout, proc.stdout
    assert "MemoryError" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr
    print(f"alias bomb refused by the CLI in {took:.2f} s (process start included)")
    start = time.monotonic()
    with pytest.raises(YamlSyntaxError, match="anchors and aliases"):
        read_yaml(bomb)
    assert time.monotonic() - start < 1.0  # the parse alone stops at the first anchor


def test_alias_bomb_in_a_matrix_is_a_configuration_error(tmp_path: Path) -> None:
    bomb = write(tmp_path, "m.yml", BOMB.replace("tests:\n  - {model: stories260K, precision: *a8}", "models: *a8"))
    with pytest.raises(ConfigurationError, match=r"m\.yml:5: invalid YAML: anchors and aliases"):
        load_matrix(bomb, Catalog.load())


def test_bounded_aliases_where_allowed(tmp_path: Path) -> None:
    small = write(tmp_path, "ok.yaml", "base: &b {x: 1}\nuse: [*b, *b]\n")
    assert read_yaml(small, aliases=True)["use"] == [{"x": 1}, {"x": 1}]
    with pytest.raises(YamlSyntaxError, match=f"aliases expand to over {MAX_EXPANDED_NODES} nodes"):
        read_yaml(write(tmp_path, "bomb.yml", BOMB), aliases=True)


def test_oversized_list_is_refused_at_once(tmp_path: Path) -> None:
    entry = "  - {model: stories260K, precision: fp32, case: c%d}\n"
    text = "name: big\nstage: l0\ndescription: x\nplatforms: {terms: [x86-cpu]}\ntests:\n"
    lines = [text, *(entry % i for i in range(11 * 1024 * 1024 // len(entry)))]
    big = tmp_path / "big.yml"
    big.write_text("".join(lines))
    assert big.stat().st_size > 10 * MAX_YAML_BYTES
    start = time.monotonic()
    report = validate_paths([big], today=TODAY)
    took = time.monotonic() - start
    assert [str(e) for e in report.errors] == [
        f"{big}: is {big.stat().st_size} bytes, over the {MAX_YAML_BYTES}-byte limit for a config file"
    ]
    assert took < 5.0, took  # refused before parsing (parsing it took about a minute)


def test_duplicate_keys_in_matrix_and_inventory_name_the_line(tmp_path: Path) -> None:
    matrix = write(
        tmp_path,
        "m.yml",
        "name: m\nmodels: [stories260K]\nprecisions: [fp32]\nplatforms: [x86-cpu]\nprecisions: [fp16]\n",
    )
    with pytest.raises(ConfigurationError, match=r"m\.yml:5: invalid YAML: .*duplicate key 'precisions'"):
        load_matrix(matrix, Catalog.load())
    inv = tmp_path / "inv"
    write(inv, "box.yaml", "type: x86-cpu\ntransport: local\nwork_dir: /tmp/a\nwork_dir: /tmp/b\n")
    with pytest.raises(ConfigurationError, match=r"box\.yaml:4: invalid YAML: .*duplicate key 'work_dir'"):
        load_inventory(inv, data_dir=tmp_path / "data")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('      - {model: "stories260K\\n", precision: fp32}', "stories260K\\n"),
        ('      - {model: stories260K, precision: fp32, case: "smoke\\n"}', "smoke\\n"),
    ],
)
def test_ids_ending_in_a_newline_are_refused(tmp_path: Path, extra: str, needle: str) -> None:
    report = validate_paths([make_list(tmp_path, extra=extra + "\n")], today=TODAY)
    text = "\n".join(map(str, report.errors))
    assert len(report.errors) == 1 and needle in text, text


def test_matrix_model_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    matrix = write(
        tmp_path, "m.yml", 'name: m\nmodels: ["stories260K\\n"]\nprecisions: [fp32]\nplatforms: [x86-cpu]\n'
    )
    with pytest.raises(ConfigurationError, match="stories260K"):
        load_matrix(matrix, Catalog.load())
