"""devices/agent.py: the one file the farm pushes to a board and runs with the board's own python3 (3.8+, stdlib
only, ``-I -S``). Each command runs as a subprocess of every Python found here (the system's and the venv's); a fake
board is a temporary root directory plus tiny shell scripts standing in for nvpmodel, jetson_clocks and
nvidia-smi."""

from __future__ import annotations

import ast
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgefarm.devices import agent

AGENT = Path(agent.__file__).resolve()
CONTRACT = AGENT.parents[1] / "docs" / "board-agent.md"  # the agent's protocol contract
DAY = 86400.0


def _runs_the_agent(python: str) -> bool:
    """Whether ``python`` starts isolated and is 3.8+ (a pyenv shim without a chosen version does not start)."""
    try:
        probe = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.version_info >= (3, 8))"],
                               capture_output=True, text=True, check=False, timeout=60)
    except OSError:
        return False
    return probe.stdout.strip() == "True"


def _pythons() -> dict[str, str]:
    """{test id: interpreter}: the system's python3, the venv's, and the oldest the agent supports (3.8, from PATH or
    EDGEFARM_PYTHON38) where this machine has one."""
    found = {}
    if os.access("/usr/bin/python3", os.X_OK) and _runs_the_agent("/usr/bin/python3"):
        found["system-python3"] = "/usr/bin/python3"
    found["venv-python"] = sys.executable
    old = os.environ.get("EDGEFARM_PYTHON38") or shutil.which("python3.8")
    if old and _runs_the_agent(old):
        found["python3.8"] = old
    return found


PYTHONS = _pythons()


@pytest.fixture(params=list(PYTHONS.values()), ids=list(PYTHONS))
def python(request) -> str:
    return request.param


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.rc = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) <= 1, f"more than one stdout line: {proc.stdout!r}"
        self.out = json.loads(lines[0]) if lines else None
        assert len(proc.stderr.splitlines()) <= 1, f"more than one stderr line: {proc.stderr!r}"


def run(python: str, *args: str, path: Path | str | None = None, extra_env: dict | None = None,
        cwd: Path | None = None, script: Path = AGENT) -> Run:
    env = {"PATH": str(path) if path is not None else "/nonexistent", "LC_ALL": "C"}
    env.update(extra_env or {})
    proc = subprocess.run([python, "-I", "-S", str(script), *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120, check=False)
    return Run(proc)


def _sha(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin\n" + body)
    path.chmod(0o755)


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


# ------------------------------------------------------------------------------------------ a static proof


def test_source_is_python38_and_stdlib_only() -> None:
    source = AGENT.read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            imported.add(node.module.split(".")[0])
    assert imported, "no import found: the walk is broken"
    assert sorted(imported - sys.stdlib_module_names - {"__future__"}) == []


def _vermin(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", "--target=3.8-",
                           "--violations", "--no-tips", str(path)], capture_output=True, text=True, check=False)


def test_vermin_finds_nothing_above_python38(tmp_path: Path) -> None:
    proc = _vermin(AGENT)
    assert proc.returncode == 0, f"vermin (pyproject's test extra):\n{proc.stdout}{proc.stderr}"
    assert "Minimum required versions: 3." in proc.stdout
    # and vermin does flag a 3.9+ call (so the pass above means something)
    assert _vermin(_write(tmp_path / "probe.py", 'print("ab".removeprefix("a"))\n')).returncode != 0


def test_runs_from_the_device_cache_under_its_sha(python: str, tmp_path: Path) -> None:
    """The farm runs the file as <work_dir>/cache/<sha256 of the file> (no .py), from any directory."""
    data = AGENT.read_bytes()
    cached = _write(tmp_path / "cache" / hashlib.sha256(data).hexdigest(), data)
    result = run(python, "hash", str(cached), script=cached, cwd=tmp_path)
    assert result.rc == 0, result.stderr
    assert result.out["sha256"] == cached.name


def test_bad_input_is_exit_2_with_one_line(python: str) -> None:
    for args in (["nonsense"], ["cache", "usage"], ["check", "--tool", "no-equals-sign"]):
        result = run(python, *args)
        assert result.rc == 2, args
        assert result.out is None
        assert result.stderr.startswith("agent: bad input: ")


def test_a_bug_is_exit_4_and_an_io_failure_exit_3(monkeypatch, capsys, tmp_path: Path) -> None:
    def boom(args):
        raise ValueError("unexpected")

    monkeypatch.setattr(agent, "cmd_hash", boom)
    assert agent.main(["hash", str(tmp_path)]) == 4
    err = capsys.readouterr().err
    assert err.startswith("agent: bug: ValueError: unexpected (agent.py line ") and err.count("\n") == 1

    def io_error(path):
        raise OSError(errno.EIO, "Input/output error", path)

    monkeypatch.undo()
    monkeypatch.setattr(agent, "_sha256_open", io_error)
    _write(tmp_path / "f", "x")
    assert agent.main(["hash", str(tmp_path / "f")]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err == f"agent: infrastructure: {tmp_path / 'f'}: Input/output error\n"


# ------------------------------------------------------------------------------------------------------ env

TEGRA_RELEASE = ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
                 "DATE: Wed Jan  8 01:49:37 UTC 2025\n")
DPKG_STATUS = """\
Package: bash
Essential: yes
Status: install ok installed
Priority: required
Section: shells
Installed-Size: 1864
Maintainer: Ubuntu Developers <ubuntu-devel-discuss@lists.ubuntu.com>
Architecture: arm64
Version: 5.1-6ubuntu1.1
Description: GNU Bourne Again SHell
 Package: not-a-field (a continuation line)

Package: nvidia-l4t-core
Status: install ok installed
Priority: standard
Section: misc
Installed-Size: 44321
Maintainer: NVIDIA Corporation
Architecture: arm64
Source: nvidia-l4t-core
Version: 36.4.3-20250107174145
Depends: libc6
Description: NVIDIA Core Package
 NVIDIA Core Package.
Homepage: http://developer.nvidia.com/jetson

Package: nvidia-jetpack
Status: install ok installed
Priority: standard
Section: metapackages
Architecture: arm64
Source: nvidia-jetpack (6.2)
Version: 6.2+b77
Depends: nvidia-jetpack-runtime (= 6.2+b77), nvidia-jetpack-dev (= 6.2+b77)
Description: NVIDIA Jetpack Meta Package

Package: tensorrt
Status: install ok installed
Priority: optional
Section: multiverse/devel
Architecture: arm64
Version: 10.3.0.30-1+cuda12.5
Description: Meta package for TensorRT

Package: libnvinfer10
Status: install ok installed
Architecture: arm64
Source: tensorrt
Version: 10.3.0.30-1+cuda12.5
Description: TensorRT runtime libraries

Package: libnvinfer8
Status: deinstall ok config-files
Architecture: arm64
Version: 8.6.2.3-1+cuda12.2
Description: TensorRT runtime libraries (removed)

Package: python3-libnvinfer
Status: install ok installed
Architecture: arm64
Version: 10.3.0.30-1+cuda12.5

Package: cuda-cudart-12-6
Status: install ok installed
Architecture: arm64
Version: 12.6.68-1

Package: cuda-toolkit-12-6
Status: install ok installed
Architecture: arm64
Version: 12.6.11-1

Package: libcudnn9-cuda-12
Status: install ok installed
Architecture: arm64
Version: 9.3.0.75-1
"""
CUDA_VERSION_JSON = {"cuda": {"name": "CUDA SDK", "version": "12.6.11"},
                     "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": "12.6.68"}}
DRIVER_VERSION = ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  540.4.0  Release Build  "
                  "(buildbrain@mobile-u64-6336-d8000)  Tue Jan  7 17:35:12 PST 2025\n"
                  "GCC version:  collect2: error: ld returned 1 exit status\n")
THERMAL = {"cpu-thermal": 52875, "gpu-thermal": 47625, "soc0-thermal": 49062, "tj-thermal": 52875}
NVPMODEL_Q = "NVPM WARN: fan mode is not set!\nNV Power Mode: MAXN\n0\n"


def _jetson_clocks_show(gpu_cur: int = 1300500000) -> str:
    cpus = "".join(f"cpu{i}: Online=1 Governor=schedutil MinFreq=2201600 MaxFreq=2201600 CurrentFreq=2201600 "
                   "IdleStates: WFI=0 c7=0\n" for i in range(12))
    return ("SOC family:tegra234  Machine:NVIDIA Jetson AGX Orin Developer Kit\nOnline CPUs: 0-11\n" + cpus
            + f"GPU MinFreq=1300500000 MaxFreq=1300500000 CurrentFreq={gpu_cur}\n"
            + "EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=1\n"
            + "FAN Dynamic Speed control=active hwmon4 :speed=0\nNV Power Mode: MAXN\n")


NVIDIA_SMI = """\
case "$1" in
  *compute_cap*) echo "0, Orin (nvgpu), 540.4.0, 8.7, [N/A], [N/A], 1300, [N/A], [N/A], Disabled, [N/A], 47";;
  *) exit 9;;
esac
"""


def make_board(root: Path) -> Path:
    """A JetPack 6.2 AGX Orin's files under ``root``."""
    _write(root / "etc/nv_tegra_release", TEGRA_RELEASE)
    _write(root / "var/lib/dpkg/status", DPKG_STATUS)
    _write(root / "usr/local/cuda/version.json", json.dumps(CUDA_VERSION_JSON))
    _write(root / "proc/driver/nvidia/version", DRIVER_VERSION)
    _write(root / "proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    _write(root / "proc/meminfo", "MemTotal:       64335836 kB\nMemFree:        60000000 kB\n"
                                  "MemAvailable:   61234567 kB\nSwapTotal:      32167916 kB\n")
    _write(root / "proc/cpuinfo", "processor\t: 0\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm\n"
                                  "CPU implementer\t: 0x41\nCPU part\t: 0xd42\n")
    for i, (kind, milli) in enumerate(THERMAL.items()):
        _write(root / f"sys/class/thermal/thermal_zone{i}/type", kind + "\n")
        _write(root / f"sys/class/thermal/thermal_zone{i}/temp", f"{milli}\n")
    _write(root / "sys/class/thermal/cooling_device0/type", "pwm-fan\n")
    gpu = root / "sys/class/devfreq/17000000.gpu"
    for leaf, value in (("cur_freq", "1300500000"), ("min_freq", "306000000"), ("max_freq", "1300500000"),
                        ("governor", "nvhost_podgov")):
        _write(gpu / leaf, value + "\n")
    bwmgr = root / "sys/class/devfreq/bwmgr"
    for leaf, value in (("cur_freq", "3199000000"), ("min_freq", "204000000"), ("max_freq", "3199000000"),
                        ("governor", "nvhost_podgov")):
        _write(bwmgr / leaf, value + "\n")
    _write(root / "sys/class/devfreq/15340000.vic/cur_freq", "115200000\n")
    return root


OLD_NVIDIA_SMI = """\
case "$1" in
  *compute_cap*) echo 'Field "compute_cap" is not a valid field to query.' >&2; exit 2;;
  *) echo "0, NVIDIA H200, 550.54.15, 143771, 1980, 1980, 2619, 2619, Enabled, 700.00, 31";;
esac
"""


def make_tools(bin_dir: Path, *, jetson_clocks: str | None = None, nvidia_smi: str = NVIDIA_SMI) -> Path:
    _tool(bin_dir, "nvpmodel", f'[ "$1" = -q ] || exit 2\ncat <<"EOF"\n{NVPMODEL_Q}EOF\n')
    _tool(bin_dir, "jetson_clocks", jetson_clocks if jetson_clocks is not None
          else f'[ "$1" = --show ] || exit 2\ncat <<"EOF"\n{_jetson_clocks_show()}EOF\n')
    _tool(bin_dir, "nvidia-smi", nvidia_smi)
    return bin_dir


def _nulls_listed(out: dict) -> None:
    listed = {u["field"] for u in out["unavailable"]}
    nulls = {k for k, v in out.items() if v is None}
    assert nulls <= listed, f"null but not listed unavailable: {sorted(nulls - listed)}"
    assert all(u["why"] for u in out["unavailable"])


def test_env_reads_every_field_of_a_jetson(python: str, tmp_path: Path) -> None:
    root, bin_dir = make_board(tmp_path / "board"), make_tools(tmp_path / "bin")
    result = run(python, "env", "--root", str(root), "--work-dir", str(tmp_path), "--dpkg", "tensorrt",
                 "--dpkg", "libnvinfer*", "--dpkg", "python3-libnvinfer", path=bin_dir)
    assert result.rc == 0, result.stderr
    out = result.out
    assert out["unavailable"] == [{"field": "cpu_model",
                                   "why": "no 'model name' in /proc/cpuinfo (aarch64 kernels print none)"}]
    assert out["schema"] == 1
    assert out["python"] == subprocess.run([python, "-I", "-S", "-c", "import platform;"
                                            "print(platform.python_version())"],
                                           capture_output=True, text=True, check=True).stdout.strip()
    assert out["system"] == "Linux" and out["machine"] == os.uname().machine and out["kernel"] == os.uname().release
    assert out["cpu_count"] == os.cpu_count() and 1 <= out["cpus_usable"] <= os.cpu_count()
    assert out["board_model"] == "NVIDIA Jetson AGX Orin Developer Kit"
    assert out["memory_total_bytes"] == 64335836 * 1024 and out["memory_available_bytes"] == 61234567 * 1024
    assert 0 < out["disk_free_bytes"] <= out["disk_total_bytes"] == shutil.disk_usage(tmp_path).total
    assert out["l4t"] == {"release": "36.4.3", "source": "/etc/nv_tegra_release", "board": "generic",
                          "eabi": "aarch64", "gcid": "38968081", "date": "Wed Jan  8 01:49:37 UTC 2025",
                          "kernel_variant": None}
    assert out["jetpack"] == {"version": "6.2", "source": "dpkg nvidia-jetpack"}
    assert out["packages"] == {"cuda-cudart-12-6": "12.6.68-1", "cuda-toolkit-12-6": "12.6.11-1",
                               "libcudnn9-cuda-12": "9.3.0.75-1", "libnvinfer10": "10.3.0.30-1+cuda12.5",
                               "nvidia-jetpack": "6.2+b77", "nvidia-l4t-core": "36.4.3-20250107174145",
                               "python3-libnvinfer": "10.3.0.30-1+cuda12.5", "tensorrt": "10.3.0.30-1+cuda12.5"}
    assert out["cuda"] == {"version": "12.6.11", "source": "/usr/local/cuda/version.json"}
    assert out["gpu_driver"] == {"version": "540.4.0", "source": "/proc/driver/nvidia/version"}
    assert out["gpus"] == [{"index": 0, "name": "Orin (nvgpu)", "driver_version": "540.4.0", "compute_cap": "8.7",
                            "memory_total_mib": None, "sm_clock_mhz": None, "sm_clock_max_mhz": 1300,
                            "mem_clock_mhz": None, "mem_clock_max_mhz": None, "persistence_mode": "Disabled",
                            "power_limit_w": None, "temperature_c": 47}]
    assert out["power_mode"] == {"name": "MAXN", "id": 0, "source": "nvpmodel -q"}
    assert out["clocks_locked"] is True
    assert out["clocks"] == {"source": "jetson_clocks --show", "cpu_online": 12, "cpu_at_max": 12,
                             "gpu": {"cur_hz": 1300500000, "min_hz": 1300500000, "max_hz": 1300500000},
                             "emc": {"cur_hz": 3199000000, "min_hz": 204000000, "max_hz": 3199000000}}
    assert out["gpu_clock"] == {"device": "17000000.gpu", "devices": ["17000000.gpu"], "cur_hz": 1300500000,
                                "min_hz": 306000000, "max_hz": 1300500000, "governor": "nvhost_podgov",
                                "source": "/sys/class/devfreq/17000000.gpu"}
    assert out["emc_clock"] == {"cur_hz": 3199000000, "min_hz": 204000000, "max_hz": 3199000000,
                                "source": "/sys/class/devfreq/bwmgr"}
    assert out["thermal"] == [{"zone": f"thermal_zone{i}", "type": kind, "temp_c": milli / 1000}
                              for i, (kind, milli) in enumerate(THERMAL.items())]
    assert "buildbrain" not in result.stdout and str(tmp_path) not in result.stdout
    undocumented = [key for key in out if not re.search(rf"`{key}`", CONTRACT.read_text())]
    assert undocumented == [], "every env key is documented in docs/board-agent.md"


def test_env_on_an_empty_root_with_no_tools_is_all_null_and_exit_0(python: str, tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "bin").mkdir()
    result = run(python, "env", path=tmp_path / "bin", extra_env={"AGENT_SYSROOT": str(tmp_path / "root")})
    assert result.rc == 0, result.stderr
    out = result.out
    board_fields = ["board_model", "cpu_model", "memory_total_bytes", "memory_available_bytes", "l4t", "jetpack",
                    "packages", "cuda", "gpu_driver", "gpus", "power_mode", "clocks_locked", "clocks",
                    "gpu_clock", "emc_clock", "thermal"]
    assert {k: out[k] for k in board_fields} == dict.fromkeys(board_fields)
    _nulls_listed(out)
    why = {u["field"]: u["why"] for u in out["unavailable"]}
    assert why["power_mode"] == "nvpmodel not found on PATH"
    assert why["packages"] == "/var/lib/dpkg/status not found"
    assert "jetson_clocks not found on PATH" in why["clocks_locked"]
    assert why["gpus"] == "nvidia-smi not found on PATH"
    assert str(tmp_path) not in result.stdout  # paths are named relative to the root
    # what the interpreter itself knows is still there
    assert out["python"] and out["machine"] and out["kernel"] and out["cpu_count"] and out["disk_free_bytes"]


def test_env_falls_back_to_sysfs_when_jetson_clocks_needs_root(python: str, tmp_path: Path) -> None:
    root = make_board(tmp_path / "board")
    not_root = 'echo "Error: Run this script($0) as a root user" >&2\nexit 1\n'
    bin_dir = make_tools(tmp_path / "bin", jetson_clocks=not_root)
    for i in range(2):
        _write(root / f"sys/devices/system/cpu/cpufreq/policy{i * 4}/scaling_cur_freq", "2201600\n")
        _write(root / f"sys/devices/system/cpu/cpufreq/policy{i * 4}/scaling_max_freq", "2201600\n")
    out = run(python, "env", "--root", str(root), path=bin_dir).out
    assert out["clocks_locked"] is True
    assert out["clocks"]["source"] == "sysfs" and out["clocks"]["cpu_at_max"] == 2
    _write(root / "sys/devices/system/cpu/cpufreq/policy4/scaling_cur_freq", "729600\n")
    out = run(python, "env", "--root", str(root), path=bin_dir).out
    assert out["clocks_locked"] is False and out["clocks"]["cpu_at_max"] == 1
    # no cpufreq at all: undecided, and why says so
    shutil.rmtree(root / "sys/devices/system/cpu")
    out = run(python, "env", "--root", str(root), path=bin_dir).out
    assert out["clocks_locked"] is None
    why = {u["field"]: u["why"] for u in out["unavailable"]}
    assert why["clocks_locked"].startswith("jetson_clocks --show exited 1: Error: Run this script(")
    assert "no online CPU listed" in why["clocks_locked"]


def test_env_gpu_below_max_is_not_locked(python: str, tmp_path: Path) -> None:
    root = make_board(tmp_path / "board")
    show = f'cat <<"EOF"\n{_jetson_clocks_show(gpu_cur=306000000)}EOF\n'
    out = run(python, "env", "--root", str(root), path=make_tools(tmp_path / "bin", jetson_clocks=show)).out
    assert out["clocks_locked"] is False
    assert out["clocks"]["gpu"]["cur_hz"] == 306000000


def test_env_falls_back_through_versions(python: str, tmp_path: Path) -> None:
    """A board flashed without the JetPack meta package: L4T from dpkg, JetPack from the table, CUDA from dpkg,
    EMC from debugfs, driver from nvidia-smi, and an unreadable thermal zone."""
    root = tmp_path / "board"
    status = DPKG_STATUS.replace("Version: 36.4.3-20250107174145", "Version: 36.4.7-20250918154033")
    status = status.replace("Package: nvidia-jetpack", "Package: nvidia-jetpack-unrelated")
    _write(root / "var/lib/dpkg/status", status)
    _write(root / "usr/local/cuda/version.txt", "CUDA Version 10.2.300\n")
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    _write(emc / "rate", "2133000000\n")
    _write(emc / "max_rate", "3199000000\n")
    _write(root / "sys/class/thermal/thermal_zone0/type", "cv0-thermal\n")
    _write(root / "sys/class/thermal/thermal_zone0/temp", "-\n")
    _write(root / "sys/class/thermal/thermal_zone1/type", "tj-thermal\n")
    _write(root / "sys/class/thermal/thermal_zone1/temp", "41500\n")
    out = run(python, "env", "--root", str(root), path=make_tools(tmp_path / "bin", nvidia_smi=OLD_NVIDIA_SMI)).out
    assert out["l4t"]["release"] == "36.4.7" and out["l4t"]["source"] == "dpkg nvidia-l4t-core"
    assert out["jetpack"] == {"version": "6.2.1", "source": "l4t table"}
    assert out["packages"] == {"cuda-cudart-12-6": "12.6.68-1", "cuda-toolkit-12-6": "12.6.11-1",
                               "libcudnn9-cuda-12": "9.3.0.75-1", "nvidia-l4t-core": "36.4.7-20250918154033"}
    assert out["cuda"] == {"version": "10.2.300", "source": "/usr/local/cuda/version.txt"}
    assert out["gpu_driver"] == {"version": "550.54.15", "source": "nvidia-smi"}
    assert out["gpus"] == [{"index": 0, "name": "NVIDIA H200", "driver_version": "550.54.15", "compute_cap": None,
                            "memory_total_mib": 143771, "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980,
                            "mem_clock_mhz": 2619, "mem_clock_max_mhz": 2619, "persistence_mode": "Enabled",
                            "power_limit_w": 700.0, "temperature_c": 31}]
    assert out["emc_clock"] == {"cur_hz": 2133000000, "min_hz": None, "max_hz": 3199000000,
                                "source": "/sys/kernel/debug/bpmp/debug/clk/emc"}
    assert out["thermal"] == [{"zone": "thermal_zone0", "type": "cv0-thermal", "temp_c": None},
                              {"zone": "thermal_zone1", "type": "tj-thermal", "temp_c": 41.5}]
    listed = {u["field"] for u in out["unavailable"]}
    assert {"thermal.thermal_zone0", "emc_clock.min_hz", "gpu_clock"} <= listed
    _nulls_listed(out)

    # an L4T the table does not hold and no meta package: JetPack unknown, and why says so
    _write(root / "etc/nv_tegra_release", TEGRA_RELEASE.replace("R36", "R35").replace("4.3", "6.0"))
    out = run(python, "env", "--root", str(root), path=tmp_path / "empty").out
    assert out["l4t"]["release"] == "35.6.0" and out["jetpack"] is None
    assert "L4T 35.6.0 is not in the agent's table" in {u["field"]: u["why"] for u in out["unavailable"]}["jetpack"]


def test_env_refuses_a_dpkg_glob_that_is_not_a_package_name(python: str, tmp_path: Path) -> None:
    for bad in ("", "../etc", "Tensor RT", "a/b"):
        result = run(python, "env", "--root", str(tmp_path), "--dpkg", bad)
        assert result.rc == 2 and result.stderr.startswith("agent: bad input: --dpkg "), bad


def test_env_never_prints_the_host_name_from_a_tool(python: str, tmp_path: Path) -> None:
    host = os.uname().nodename
    _tool(tmp_path / "bin", "nvpmodel", f'echo "NVPM ERROR: {host} says no" >&2\nexit 3\n')
    out = run(python, "env", "--root", str(tmp_path), path=tmp_path / "bin").out
    why = {u["field"]: u["why"] for u in out["unavailable"]}["power_mode"]
    assert why == "nvpmodel -q exited 3: NVPM ERROR: <redacted> says no"


def test_a_hanging_tool_times_out(monkeypatch, tmp_path: Path) -> None:
    _tool(tmp_path, "nvpmodel", "sleep 30\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    start = time.monotonic()
    assert agent._run_tool("nvpmodel", ["-q"], timeout=0.3) == (None, "nvpmodel -q timed out after 0.3 s")
    assert time.monotonic() - start < 10


def test_parsers_of_the_documented_formats() -> None:
    thor = agent.parse_tegra_release("# R38 (release), REVISION: 4.0, GCID: 43443517, BOARD: generic, EABI: aarch64, "
                                     "DATE: Wed Dec 31 00:15:19 UTC 2025\n# KERNEL_VARIANT: oot\n")
    assert thor["release"] == "38.4.0" and thor["kernel_variant"] == "oot"
    assert agent.parse_tegra_release("garbage\n") is None
    assert agent.parse_nvpmodel("NV Power Mode: MODE_30W\n2\n") == {"name": "MODE_30W", "id": 2}
    assert agent.parse_nvpmodel("NVPM VERB: Config file: /etc/nvpmodel.conf\nNV Power Mode: 15W\n") == \
        {"name": "15W", "id": None}
    assert agent.parse_driver_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n") == "550.54.15"
    assert agent.parse_driver_version(  # as read on an H200 host
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
        "GCC version:  gcc version 15.3.0 (GCC) \n") == "580.159.04"
    offline = agent.parse_jetson_clocks("cpu0: Online=1 Governor=schedutil MinFreq=729600 MaxFreq=2201600 "
                                        "CurrentFreq=2201600\ncpu1: Online=0 Governor=schedutil\n"
                                        "GPU MinFreq=1 MaxFreq=2 CurrentFreq=2\n"
                                        "EMC MinFreq=1 MaxFreq=2 CurrentFreq=2\n")
    assert agent.decide_locked(offline["cpus"], offline["gpu"], offline["emc"]) == (True, None)
    assert agent.decide_locked([], None, {"cur_hz": 1, "max_hz": 2}) == (False, None)  # known below max wins
    assert agent._upstream("1:10.3.0.30-1+cuda12.5") == "10.3.0.30"


# ------------------------------------------------------------------------------------------- the facts table


def _names_read_from_env(path: Path, calls: set[tuple[str, str]]) -> set[str]:
    """The env keys a farm module reads: string constants given first to a call ``receiver.method(...)`` of
    ``calls`` (or the constants of the tuple a comprehension feeds such a call)."""
    tree = ast.parse(path.read_text())
    loops = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.comprehension) and isinstance(node.target, ast.Name) \
                and isinstance(node.iter, ast.Tuple):
            loops[node.target.id] = [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
    names = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        receiver = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        if (receiver, node.func.attr) not in calls:
            continue
        first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
        elif isinstance(first, ast.Name):
            names.update(loops.get(first.id, []))
    return names


def test_every_env_key_the_farm_reads_is_one_entry_of_the_facts_table() -> None:
    from edgefarm.tasks import environment

    names = [fact.name for fact in agent.FACTS]
    assert len(names) == len(set(names)), "a fact named twice"
    repo = AGENT.parents[1]
    answers = {("answers", m) for m in ("text", "count", "flag", "block")} | {("self", "items")}  # temperatures()
    health = _names_read_from_env(repo / "devices" / "health.py", answers)
    recorded = _names_read_from_env(repo / "tasks" / "environment.py", {("env", "get"), ("before", "get")})
    probe = _names_read_from_env(repo / "toolchains" / "probe.py", {("packaged", "get")})
    assert {"python", "machine", "disk_free_bytes", "thermal", "jetpack", "gpu_driver"} <= health  # the walk works
    assert {"gpus", "power_mode", "clocks_locked"} <= recorded and probe == {"packages"}
    farm = set(environment.STABLE) | set(environment.VOLATILE) | health | probe | (recorded - {"toolchains"})
    assert sorted(farm - set(names)) == [], "read by the farm but made by no fact"
    # every table entry is documented, names only facts gathered before it, and env prints exactly the table
    contract = CONTRACT.read_text()
    for i, fact in enumerate(agent.FACTS):
        assert f"`{fact.name}`" in contract, fact.name
        assert set(fact.needs) <= set(names[:i]), f"{fact.name} needs a fact gathered after it"
    for name in ("FACTS", "Fact", "gather", "Board", "reads", "parse", "default", "needs"):
        assert f"`{name}`" in contract and name in AGENT.read_text(), name


def test_env_prints_exactly_the_facts_of_the_table(monkeypatch, tmp_path: Path) -> None:
    root = make_board(tmp_path / "board")
    monkeypatch.setenv("PATH", str(make_tools(tmp_path / "bin")))
    out = agent.gather(agent.Board(str(root), str(tmp_path)))
    assert sorted(out) == sorted([fact.name for fact in agent.FACTS] + ["unavailable"])
    assert [u["field"] for u in out["unavailable"]] == ["cpu_model"]


def _failing_board(root: Path) -> None:
    """Every file a fact declares exists as a directory (so reading it fails)."""
    for fact in agent.FACTS:
        for read in fact.reads:
            if read.startswith("/") and "*" not in read and read != "/proc/sys/kernel/arch":
                (root / read.lstrip("/")).mkdir(parents=True, exist_ok=True)


@pytest.mark.parametrize("tools", ["absent", "exit 1", "hang"])
def test_a_fact_whose_reads_fail_takes_its_default(monkeypatch, tmp_path: Path, tools: str) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if tools != "absent":
        _failing_board(root)
    for name in ("nvpmodel", "jetson_clocks", "nvidia-smi"):
        _tool(tmp_path / "bin", name, {"absent": "exit 0\n", "exit 1": "exit 1\n", "hang": "sleep 30\n"}[tools])
    monkeypatch.setenv("PATH", str(tmp_path / ("empty" if tools == "absent" else "bin")))
    monkeypatch.setattr(agent, "TOOL_TIMEOUT_S", 0.2)
    monkeypatch.setattr(agent, "NVIDIA_SMI_TIMEOUT_S", 0.2)
    start = time.monotonic()
    out = agent.gather(agent.Board(str(root), str(tmp_path)))
    assert time.monotonic() - start < 30
    why = {u["field"]: u["why"] for u in out["unavailable"]}
    of_the_board = [f for f in agent.FACTS
                    if (f.reads or f.needs) and not any(r.startswith("python:") for r in f.reads)]
    assert len(of_the_board) >= 16
    for fact in of_the_board:
        assert out[fact.name] == fact.default, fact.name
        assert why[fact.name], fact.name
    for fact in agent.FACTS:  # what this interpreter answers is still there
        if fact not in of_the_board and fact.name not in ("libc", "cpus_usable"):
            assert out[fact.name] is not None, fact.name
    if tools == "hang":
        assert why["power_mode"] == "nvpmodel -q timed out after 0.2 s"


def test_a_fact_reads_only_what_its_entry_declares(tmp_path: Path) -> None:
    _write(tmp_path / "a", "1\n")
    _write(tmp_path / "b", "2\n")
    declared = agent.Fact("x", ("/a",), lambda board: (board.read("/a")[0], None))
    assert agent.gather(agent.Board(str(tmp_path)), [declared])["x"] == "1\n"
    for parse in (lambda board: (board.read("/b")[0], None), lambda board: (board.tool("nvpmodel", "-q"), None),
                  lambda board: (board.listdir("/etc"), None), lambda board: (board.fact("x"), None)):
        with pytest.raises(agent.AgentError, match=r"fact y reads .*which its table entry does not"):
            agent.gather(agent.Board(str(tmp_path)), [declared, agent.Fact("y", ("/a",), parse)])


# ---------------------------------------------------------------------------------------------------- check


def test_check_names_every_problem(python: str, tmp_path: Path) -> None:
    _tool(tmp_path / "bin", "good", "exit 0\n")
    plain = _write(tmp_path / "bin" / "plain", "not executable")
    lib = tmp_path / "lib"
    _write(lib / "libnvinfer.so.10.3.0", b"\x7fELF")
    (lib / "libnvinfer.so.10").symlink_to("libnvinfer.so.10.3.0")
    empty_lib = tmp_path / "empty_lib"
    empty_lib.mkdir()
    args = ["check", "--tool", f"build={tmp_path / 'bin' / 'good'}", "--tool", "onpath=good",
            "--tool", f"missing={tmp_path / 'nope'}", "--tool", f"plain={plain}", "--tool", f"dir={lib}",
            "--tool", "ghost=no-such-tool", "--lib", str(lib), "--lib", str(tmp_path / "nolib"),
            "--needs-lib", "libnvinfer.so*", "--needs-lib", "libnvonnxparser.so*",
            "--file", str(tmp_path / "bin" / "good"), "--file", str(tmp_path / "absent.onnx"), "--file", str(lib)]
    result = run(python, *args, path=tmp_path / "bin")
    assert result.rc == 1
    assert result.stderr.startswith("agent: check: 8 problem(s), the first: ")
    out = result.out
    assert out["ok"] is False
    expected = [
        f"tool missing: {tmp_path / 'nope'} does not exist",
        f"tool plain: {plain} is not executable",
        f"tool dir: {lib} is a directory",
        "tool ghost: no-such-tool not found on PATH",
        f"lib dir {tmp_path / 'nolib'} does not exist",
        f"library libnvonnxparser.so*: no such file in {lib}, {tmp_path / 'nolib'}",
        f"file {tmp_path / 'absent.onnx'} does not exist",
        f"file {lib} is not a regular file",
    ]
    assert out["problems"] == expected
    assert out["tools"] == {"build": str(tmp_path / "bin" / "good"), "onpath": str(tmp_path / "bin" / "good"),
                            "missing": None, "plain": None, "dir": None, "ghost": None}
    assert out["libs"] == {"libnvinfer.so*": str(lib / "libnvinfer.so.10"), "libnvonnxparser.so*": None}


def test_check_all_present_is_ok_and_exit_0(python: str, tmp_path: Path) -> None:
    _tool(tmp_path / "bin", "llm_bench", "exit 0\n")
    _write(tmp_path / "lib" / "libnvinfer.so.10", b"\x7fELF")
    result = run(python, "check", "--tool", f"llm_bench={tmp_path / 'bin' / 'llm_bench'}", "--lib",
                 str(tmp_path / "lib"), "--needs-lib", "libnvinfer.so*", "--file", str(tmp_path / "lib" /
                                                                                       "libnvinfer.so.10"))
    assert (result.rc, result.out["ok"], result.out["problems"], result.stderr) == (0, True, [], "")


def test_check_dangling_link_and_needs_lib_without_lib(python: str, tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    out = run(python, "check", "--tool", f"t={tmp_path / 'dangling'}", "--file", str(tmp_path / "dangling")).out
    assert out["problems"] == [f"tool t: {tmp_path / 'dangling'} is a dangling symlink",
                               f"file {tmp_path / 'dangling'} is a dangling symlink"]
    assert run(python, "check", "--needs-lib", "libnvinfer.so*").rc == 2
    assert run(python, "check", "--lib", str(tmp_path), "--needs-lib", "../x*").rc == 2


# ----------------------------------------------------------------------------------------------------- hash


def _pipeline_digest(directory: Path) -> str:
    """What the seal pipeline prints, hashed: ``sha256sum`` of a ``.sha256sums`` file made by it."""
    seal = subprocess.run(["sh", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"],
                          cwd=directory, capture_output=True, check=True).stdout
    return hashlib.sha256(seal).hexdigest()


def _odd_tree(top: Path) -> Path:
    files = {"config.json": b'{"a": 1}', "a b": b"space", "a-b": b"dash", "a.b": b"dot", "a/b": b"nested",
             "a/b c/deep.bin": os.urandom(3 * agent.CHUNK + 17), "empty": b"", "back\\slash": b"bs",
             "new\nline": b"nl", "caf\u00e9": b"utf8", "Z": b"upper", "_u": b"under", ".hidden": b"dot file"}
    for name, data in files.items():
        _write(top / name, data)
    (top / "empty_dir").mkdir()
    bad = top / os.fsdecode(b"latin\xe9")
    _write(bad, b"not utf-8 name")
    return top


def test_hash_of_a_tree_equals_the_seal_pipeline(python: str, tmp_path: Path) -> None:
    top = _odd_tree(tmp_path / "engine")
    result = run(python, "hash", str(top))
    assert result.rc == 0, result.stderr
    files = [p for p in top.rglob("*") if p.is_file()]
    assert result.out == {"kind": "tree", "sha256": _pipeline_digest(top), "files": len(files),
                          "bytes": sum(p.stat().st_size for p in files)}
    assert result.out == run(python, "hash", str(top) + "/").out
    # the seal file beside the entry hashes the same
    seal = subprocess.run(["sh", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"],
                          cwd=top, capture_output=True, check=True).stdout
    _write(tmp_path / "seal.sha256sums", seal)
    assert run(python, "hash", str(tmp_path / "seal.sha256sums")).out["sha256"] == result.out["sha256"]


def test_hash_of_a_file_and_an_empty_dir(python: str, tmp_path: Path) -> None:
    data = os.urandom(2 * agent.CHUNK + 5)
    f = _write(tmp_path / "model.onnx", data)
    assert run(python, "hash", str(f)).out == {"kind": "file", "sha256": hashlib.sha256(data).hexdigest(),
                                                "files": 1, "bytes": len(data)}
    (tmp_path / "empty").mkdir()
    assert run(python, "hash", str(tmp_path / "empty")).out == {
        "kind": "tree", "sha256": hashlib.sha256(b"").hexdigest(), "files": 0, "bytes": 0}


def test_hash_refuses_symlinks_and_paths_outside(python: str, tmp_path: Path) -> None:
    top = tmp_path / "work" / "tree"
    _write(top / "sub" / "real", "x")
    (tmp_path / "outside").write_text("secret")
    (top / "sub" / "link").symlink_to(tmp_path / "outside")
    result = run(python, "hash", str(top))
    assert result.rc == 2 and result.out is None
    assert result.stderr == f"agent: bad input: {top / 'sub' / 'link'}: a symbolic link (refused, never followed)\n"
    (top / "sub" / "link").unlink()
    (tmp_path / "work" / "alias").symlink_to(top)
    assert run(python, "hash", str(tmp_path / "work" / "alias")).rc == 2
    assert run(python, "hash", str(tmp_path / "work" / "alias") + "/").rc == 2
    assert run(python, "hash", str(top), "--within", str(tmp_path / "work")).rc == 0
    for outside in (str(tmp_path / "outside"), str(top / ".." / ".." / "outside"), str(tmp_path / "work")):
        result = run(python, "hash", outside, "--within", str(tmp_path / "work"))
        assert result.rc == 2 and "outside" in result.stderr, outside
    assert run(python, "hash", str(tmp_path / "missing")).rc == 2
    _write(top / "car\riage", "x")
    result = run(python, "hash", str(top))
    assert result.rc == 2 and "carriage return" in result.stderr


# ---------------------------------------------------------------------------------------------------- cache


def _file_entry(cache: Path, data: bytes) -> str:
    sha = hashlib.sha256(data).hexdigest()
    _write(cache / sha, data)
    return sha


def _dir_entry(cache: Path, label: str, files: dict[str, bytes], *, seal: bool = True) -> str:
    sha = _sha(label)
    staging = cache / f".{sha}.partial-{label}"
    for name, data in files.items():
        _write(staging / name, data)
    staging.rename(cache / sha)  # as an upload does: the rename makes it an entry
    if seal:
        sums = subprocess.run(["sh", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"],
                              cwd=cache / sha, capture_output=True, check=True).stdout
        _write(cache / f"{sha}.sha256sums", sums)
    return sha


def _marker(cache: Path, sha: str, tag: str, text: str = "", age_s: float = 0.0) -> Path:
    path = _write(cache / ".inuse" / f"{sha}.{tag}", text)
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_cache_usage_counts_entries_and_lists_partials(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    small = _file_entry(cache, b"x" * 100)
    tree = _dir_entry(cache, "engine", {"rank0.engine": b"e" * 1000, "config.json": b"{}"})
    _write(cache / f".{_sha('up')}.partial-0123456789ab" / "big.bin", b"p" * 5000)
    _write(cache / f".{_sha('up2')}.partial-ba9876543210", b"q" * 50)
    _write(cache / "README", "not an entry")
    _write(cache / f"{_sha('orphan')}.sha256sums", "")
    _marker(cache, small, "job-1", "pid=1")
    result = run(python, "cache", "usage", "--cache", str(cache))
    assert result.rc == 0, result.stderr
    out = result.out
    seal_bytes = (cache / f"{tree}.sha256sums").stat().st_size
    by_sha = {e["sha256"]: e for e in out["entries"]}
    assert set(by_sha) == {small, tree} and out["entry_count"] == 2 and out["exists"] is True
    assert by_sha[small] | {"last_use": 0, "markers": []} == {
        "sha256": small, "kind": "file", "bytes": 100, "files": 1, "sealed": False, "last_use": 0, "in_use": True,
        "in_use_by": ["job-1"], "markers": []}
    assert by_sha[small]["markers"][0] | {"age_s": 0} == {"tag": "job-1", "pid": 1, "pid_alive": True,
                                                          "age_s": 0, "active": True}
    assert by_sha[tree]["kind"] == "dir" and by_sha[tree]["files"] == 2 and by_sha[tree]["sealed"] is True
    assert by_sha[tree]["bytes"] == 1002 + seal_bytes and by_sha[tree]["in_use"] is False
    assert out["total_bytes"] == 100 + 1002 + seal_bytes
    assert sorted(p["bytes"] for p in out["partials"]) == [50, 5000] and out["partial_bytes"] == 5050
    assert out["other"] == [{"name": f"{_sha('orphan')}.sha256sums", "why": "a seal without its entry"},
                            {"name": "README", "why": "not a cache entry"}]
    assert out["ttl_s"] == agent.MARKER_TTL_S
    assert run(python, "cache", "usage", "--cache", str(tmp_path / "none")).out["entries"] == []


def test_cache_evicts_least_recently_used_first(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    a = _dir_entry(cache, "a", {"w": b"a" * 1000})
    time.sleep(0.05)
    b = _file_entry(cache, b"b" * 1000)
    time.sleep(0.05)
    c = _dir_entry(cache, "c", {"w": b"c" * 1000}, seal=False)
    time.sleep(0.05)
    touched = run(python, "cache", "touch", "--cache", str(cache), a)
    assert touched.rc == 0 and touched.out["sha256"] == a
    usage = run(python, "cache", "usage", "--cache", str(cache)).out
    assert [e["sha256"] for e in usage["entries"]] == [b, c, a]
    size_a = usage["entries"][-1]["bytes"]

    dry = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", str(size_a), "--dry-run").out
    assert [r["sha256"] for r in dry["removed"]] == [b, c] and (cache / b).exists()

    result = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", str(size_a))
    assert result.rc == 0, result.stderr
    out = result.out
    assert out["ok"] is True and [r["sha256"] for r in out["removed"]] == [b, c]
    assert out["total_bytes"] == size_a and out["freed_bytes"] == 2000 and out["blocked"] == []
    assert sorted(p.name for p in cache.iterdir()) == sorted([a, f"{a}.sha256sums", ".lock"])
    # under the limit already: nothing to do
    again = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", str(size_a)).out
    assert again["removed"] == [] and again["ok"] is True


def test_cache_never_evicts_in_use_kept_or_partial(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    entries = {}
    for label in ("live-pid", "fresh", "kept", "dead-pid", "old-boot", "free"):
        entries[label] = _file_entry(cache, label.encode() * 100)
        time.sleep(0.02)
    _marker(cache, entries["live-pid"], "job", f"pid={os.getpid()} boot={_boot_id()}\n", age_s=DAY)
    _marker(cache, entries["fresh"], "upload-7")  # no pid, but modified just now
    _marker(cache, entries["dead-pid"], "crashed", f"pid={_dead_pid()}\n", age_s=DAY)
    _marker(cache, entries["old-boot"], "before-reboot", f"pid={os.getpid()} boot=00000000-dead\n", age_s=DAY)
    partial = _write(cache / f".{_sha('p')}.partial-aaaaaaaaaaaa", b"p" * 10_000)
    result = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "0", "--keep", entries["kept"])
    assert result.rc == 1
    assert result.stderr.startswith("agent: evict: ") and "over --max-bytes 0" in result.stderr
    out = result.out
    assert out["ok"] is False
    assert {r["sha256"] for r in out["removed"]} == {entries["dead-pid"], entries["old-boot"], entries["free"]}
    blocked = {b["sha256"]: b["why"] for b in out["blocked"]}
    assert blocked == {entries["live-pid"]: "in use: job", entries["fresh"]: "in use: upload-7",
                       entries["kept"]: "kept (--keep)"}
    assert out["total_bytes"] == sum(len(label) * 100 for label in ("live-pid", "fresh", "kept"))
    assert partial.exists() and partial.stat().st_size == 10_000
    assert sorted(out["markers_removed"]) == sorted([f"{entries['dead-pid']}.crashed",
                                                     f"{entries['old-boot']}.before-reboot"])
    assert sorted(p.name for p in (cache / ".inuse").iterdir()) == sorted(
        [f"{entries['live-pid']}.job", f"{entries['fresh']}.upload-7"])

    # with the TTL down to 0 the fresh marker no longer counts; the live pid still does
    out = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "0", "--ttl-s", "0").out
    assert {r["sha256"] for r in out["removed"]} == {entries["fresh"], entries["kept"]}
    assert [b["sha256"] for b in out["blocked"]] == [entries["live-pid"]]


def test_cache_eviction_fails_when_everything_is_in_use(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    shas = [_file_entry(cache, bytes([i]) * 10) for i in range(3)]
    for i, sha in enumerate(shas):
        _marker(cache, sha, f"job{i}", f"pid={os.getpid()}")
    result = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "5")
    assert result.rc == 1
    assert result.out["ok"] is False and result.out["removed"] == [] and result.out["total_bytes"] == 30
    assert len(result.out["blocked"]) == 3 and all((cache / s).exists() for s in shas)


def test_cache_refuses_names_that_are_not_a_sha(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sha = _file_entry(cache, b"x")
    outside = _write(tmp_path / "outside" / "precious", "keep me")
    link = _sha("link")
    (cache / link).symlink_to(outside.parent)
    for bad in ("../outside", "/etc/passwd", "..", sha.upper(), sha + "/..", ""):
        result = run(python, "cache", "touch", "--cache", str(cache), bad)
        assert result.rc == 2 and result.stderr.startswith("agent: bad input: "), bad
        assert run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "0", "--keep", bad).rc == 2
    result = run(python, "cache", "touch", "--cache", str(cache), link)
    assert result.rc == 2 and "symbolic link" in result.stderr
    assert run(python, "cache", "touch", "--cache", str(cache), _sha("absent")).rc == 2
    usage = run(python, "cache", "usage", "--cache", str(cache)).out
    assert {"name": link, "why": "a symbolic link (never an entry, never followed)"} in usage["other"]
    out = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "0").out
    assert [r["sha256"] for r in out["removed"]] == [sha]
    assert (cache / link).is_symlink() and outside.read_text() == "keep me"
    assert run(python, "cache", "usage", "--cache", str(outside)).rc == 2  # a file is not a cache dir


def test_cache_evict_cleans_leftovers_and_stale_markers(python: str, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _file_entry(cache, b"k")
    leftover = _write(cache / f".{_sha('x')}.evicting-999999" / "f", "half removed")
    stale = _marker(cache, _sha("gone"), "old", "pid=0", age_s=DAY)
    live = _marker(cache, _sha("coming"), "upload")  # an upload marks before its entry lands
    out = run(python, "cache", "evict", "--cache", str(cache), "--max-bytes", "100").out
    assert out["leftovers_removed"] == [leftover.parent.name] and not leftover.parent.exists()
    assert out["markers_removed"] == [stale.name] and not stale.exists() and live.exists()


def test_an_entry_marked_while_being_evicted_is_put_back(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sha = _dir_entry(cache, "busy", {"f": b"data"})
    _marker(cache, sha, "late-job", f"pid={os.getpid()}")
    assert agent._evict_one(str(cache), sha, agent.MARKER_TTL_S) is False
    assert (cache / sha / "f").read_bytes() == b"data" and (cache / f"{sha}.sha256sums").exists()
    assert not [p for p in cache.iterdir() if ".evicting-" in p.name]


def test_evict_waits_for_the_lock_then_fails_as_infrastructure(monkeypatch, capsys, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _file_entry(cache, b"x")
    monkeypatch.setattr(agent, "LOCK_WAIT_S", 0.3)
    with open(cache / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert agent.main(["cache", "evict", "--cache", str(cache), "--max-bytes", "0"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("agent: infrastructure: ") and "another evict" in err
    assert agent.main(["cache", "evict", "--cache", str(cache), "--max-bytes", "0"]) == 0


def test_hash_lists_and_seals_a_tree_in_one_read(python: str, tmp_path: Path) -> None:
    top = _odd_tree(tmp_path / "engine")
    seal = tmp_path / "engine.sha256sums"
    result = run(python, "hash", str(top), "--list", "--seal", str(seal))
    assert result.rc == 0, result.stderr
    pipeline = subprocess.run(["sh", "-c", "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"],
                              cwd=top, capture_output=True, check=True).stdout
    assert seal.read_bytes() == pipeline  # the seal the farm's shell check reads (sha256sum -c)
    assert hashlib.sha256(seal.read_bytes()).hexdigest() == result.out["sha256"] == _pipeline_digest(top)
    listing = result.out["listing"]
    assert len(listing) == result.out["files"] and sum(e["bytes"] for e in listing) == result.out["bytes"]
    assert all(e["path"].startswith("./") and len(e["sha256"]) == 64 for e in listing)
    assert run(python, "hash", str(_write(tmp_path / "f", "x")), "--seal", str(seal)).rc == 2  # files: no seal


def test_check_reads_a_cmake_build_and_its_git_revision(python: str, tmp_path: Path) -> None:
    src = tmp_path / "TensorRT-Edge-LLM"
    build = src / "build"
    _write(build / "CMakeCache.txt", f"# cache\nCMAKE_HOME_DIRECTORY:INTERNAL={src}\n"
                                      "CMAKE_PROJECT_NAME:STATIC=tensorrt_edgellm_sdk\n"
                                      "CMAKE_PROJECT_VERSION:STATIC=0.11.0\nCMAKE_BUILD_TYPE:STRING=Release\n"
                                      "EMBEDDED_TARGET:STRING=jetson-orin\n")
    sha = "c0ffee" * 6 + "abcd"
    _write(src / ".git" / "HEAD", "ref: refs/heads/release/0.11\n")
    _write(src / ".git" / "packed-refs", f"# pack-refs with: peeled\n{sha} refs/heads/release/0.11\n")
    result = run(python, "check", "--build-dir", str(build), "--cmake-key", "EMBEDDED_TARGET")
    assert result.rc == 0, result.stderr
    assert result.out["builds"][str(build)] == {
        "project": "tensorrt_edgellm_sdk", "version": "0.11.0", "build_type": "Release", "source_dir": str(src),
        "revision": sha, "cache": {"EMBEDDED_TARGET": "jetson-orin"}}
    missing = run(python, "check", "--build-dir", str(tmp_path / "nowhere"))
    assert missing.rc == 1 and "cannot read CMakeCache.txt" in missing.out["problems"][0]


def test_oom_reads_the_kernels_kill_records_and_the_memory(python: str, tmp_path: Path) -> None:
    _write(tmp_path / "proc" / "meminfo", "MemTotal:       64349428 kB\nMemAvailable:     123456 kB\n")
    _write(tmp_path / "var" / "log" / "kern.log",
           "Dec  1 10:00:00 jetson kernel: [ 1.0] usb 1-1: new device\n"
           "Dec  1 10:00:01 jetson kernel: [ 2.0] Out of memory: Killed process 4242 (llm_build) "
           "total-vm:31457280kB, anon-rss:29884416kB, file-rss:0kB, shmem-rss:0kB, UID:1000\n")
    result = run(python, "oom", "--root", str(tmp_path))
    assert result.rc == 0, result.stderr
    assert result.out["kills"] == [{"pid": 4242, "comm": "llm_build", "total_vm_kb": 31457280,
                                    "anon_rss_kb": 29884416, "line": result.out["kills"][0]["line"]}]
    assert (result.out["memory_total_bytes"], result.out["memory_available_bytes"]) == (64349428 * 1024,
                                                                                       123456 * 1024)
    assert run(python, "oom", "--root", str(tmp_path / "empty-root-does-not-exist")).rc == 0  # nothing to read


def test_env_reads_the_machine_through_the_root(python: str, tmp_path: Path) -> None:
    _write(tmp_path / "proc" / "sys" / "kernel" / "arch", "aarch64\n")
    assert run(python, "env", "--root", str(tmp_path)).out["machine"] == "aarch64"
    (tmp_path / "bare").mkdir()
    assert run(python, "env", "--root", str(tmp_path / "bare")).out["machine"] == os.uname().machine
