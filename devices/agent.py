#!/usr/bin/env python3
"""The farm's agent on a device: one self-contained file, run with the board's own ``python3``.

The farm pushes this file into the device cache (``<work_dir>/cache/<sha256 of this file>``) and runs it as
``python3 -I -S <that path> SUBCOMMAND ...``; nothing else of ours is installed on the board. It needs Python 3.8+
(JetPack 5's) and the standard library only, on Linux (aarch64, x86_64). The board's own tools (``nvpmodel``,
``jetson_clocks``, ``nvidia-smi``) are run from PATH with an argv list, ``LC_ALL=C`` and a short timeout; a tool that
is absent, fails or times out makes its facts null, never a crash.

Subcommands: ``env`` (the facts of FACTS below, one table entry per key), ``check``, ``hash``, ``oom`` and
``cache usage|evict|touch``. Each prints ONE JSON object on one line of stdout (keys sorted); on failure nothing on
stdout and one line ``agent: <kind>: <message>`` on stderr. Exit codes: 0 yes, 1 no (``check`` found problems,
``evict`` could not get under ``--max-bytes``; its JSON still comes, with one ``agent: check: ...`` or
``agent: evict: ...`` line on stderr), 2 bad input, 3 infrastructure (I/O, a full disk, the cache lock), 4 a bug
in this agent (the message names the exception and the line).

The contract (every subcommand's options and JSON keys, the cache's layout and in-use markers) is
``docs/board-agent.md``; its names are the names used here.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any, NamedTuple, NoReturn

SCHEMA = 1
TOOL_TIMEOUT_S = 5.0
NVIDIA_SMI_TIMEOUT_S = 15.0
MARKER_TTL_S = 6 * 3600.0
LOCK_WAIT_S = 60.0
CHUNK = 1 << 20
SEAL_SUFFIX = ".sha256sums"
INUSE_DIR = ".inuse"
LOCK_FILE = ".lock"
SHA_RE = re.compile(r"[0-9a-f]{64}\Z")

# dpkg packages always reported under "packages" (whole-name patterns): the platform's, never a toolchain's
DPKG_PACKAGES = re.compile(
    r"(nvidia-l4t-core|nvidia-jetpack"
    r"|cuda-runtime-\d+-\d+|cuda-cudart-\d+-\d+|cuda-toolkit-\d+-\d+|libcudnn\d+(?:-cuda-\d+)?"
    r"|nvidia-driver-\d+)\Z")
DPKG_STATUS = "/var/lib/dpkg/status"
# /sys/class/devfreq names that are a GPU (jetson_stats' list: gv11b, gp10b, ga10b, gb10b, gpu)
GPU_DEVFREQ_HINTS = ("gpu", "ga10b", "gv11b", "gp10b", "gb10b")
# JetPack of an L4T release, where dpkg has no nvidia-jetpack (jetson_stats' table; exact release or "major.minor")
JETPACK_OF_L4T = {"36.4.3": "6.2", "36.4.4": "6.2.1", "36.4.7": "6.2.1", "36.5.0": "6.2.2", "38.2": "7.0",
                  "38.4.0": "7.1", "39.0.0": "7.2 EA", "39.2.0": "7.2"}
NVIDIA_SMI_FIELDS = ("index", "name", "driver_version", "compute_cap", "memory.total", "clocks.sm", "clocks.max.sm",
                     "clocks.mem", "clocks.max.mem", "persistence_mode", "power.limit", "temperature.gpu")
NVIDIA_SMI_KEYS = ("index", "name", "driver_version", "compute_cap", "memory_total_mib", "sm_clock_mhz",
                   "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "persistence_mode", "power_limit_w",
                   "temperature_c")
EMC_DEBUGFS = "/sys/kernel/debug/bpmp/debug/clk/emc"
CPUFREQ = "/sys/devices/system/cpu/cpufreq"


class AgentError(Exception):
    kind = "bug"
    exit_code = 4


class BadInput(AgentError):
    kind = "bad input"
    exit_code = 2


class Infrastructure(AgentError):
    kind = "infrastructure"
    exit_code = 3


# ---------------------------------------------------------------------------------------------------------- helpers


def _int(text: object) -> int | None:
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _number(text: object) -> int | float | None:
    """A number from a tool's field, or None for "[N/A]", "[Not Supported]", "" and the like."""
    text = str(text).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _upstream(version: str) -> str:
    """The upstream part of a Debian version: "1:10.3.0.30-1+cuda12.5" -> "10.3.0.30"."""
    version = version.split(":", 1)[1] if re.match(r"\d+:", version) else version
    return version.rsplit("-", 1)[0] if "-" in version else version


def _scrub(text: str) -> str:
    """Tool messages go out without this machine's host name or user name (whole words)."""
    secrets = {os.uname().nodename, os.environ.get("USER", ""), os.environ.get("LOGNAME", "")}
    with contextlib.suppress(Exception):
        import pwd
        secrets.add(pwd.getpwuid(os.getuid()).pw_name)
    for secret in sorted(s for s in secrets if len(s) >= 2):
        text = re.sub(r"(?<![\w.-])" + re.escape(secret) + r"(?![\w-])", "<redacted>", text)
    return text


def _first_line(data: bytes) -> str:
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return _scrub(line.strip()[:200])
    return ""


def _run_tool(name: str, args: Sequence[str], timeout: float = TOOL_TIMEOUT_S) -> tuple[str | None, str | None]:
    """(stdout text, None) or (None, why): the tool ``name`` from PATH, run with ``args``."""
    path = shutil.which(name)
    if path is None:
        return None, f"{name} not found on PATH"
    env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C"}
    try:
        # its own process group, so a timeout kills what it started too (jetson_clocks is a shell script)
        proc = subprocess.Popen([path, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:
        return None, f"{name}: {exc.strerror or exc}"
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # a descendant left the group and holds the pipes: stop reading them
            proc.stdout.close()
            proc.stderr.close()
            proc.wait()
        return None, f"{name} {' '.join(args)} timed out after {timeout:g} s"
    if proc.returncode != 0:
        said = _first_line(stderr) or _first_line(stdout)
        return None, f"{name} {' '.join(args)} exited {proc.returncode}" + (f": {said}" if said else "")
    return stdout.decode("utf-8", "replace"), None


# -------------------------------------------------------------------------------------------------------- parsers


def parse_tegra_release(text: str) -> dict[str, Any] | None:
    """/etc/nv_tegra_release -> {"release": "36.4.3", "board", "eabi", "gcid", "date", "kernel_variant"} or None."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    head = re.match(r"#\s*R(\d+)\s*\(([^)]*)\)\s*,\s*(.*)\Z", lines[0])
    if not head:
        return None
    fields = {}
    for part in re.split(r",\s*(?=[A-Z_]+\s*:)", head.group(3)):
        key, sep, value = part.partition(":")
        if sep:
            fields[key.strip().upper()] = value.strip()
    for line in lines[1:]:
        more = re.match(r"#\s*([A-Z_]+)\s*:\s*(.*)\Z", line)
        if more:
            fields.setdefault(more.group(1), more.group(2).strip())
    revision = fields.get("REVISION", "")
    if not re.match(r"\d+(\.\d+)*\Z", revision):
        return None
    return {"release": f"{head.group(1)}.{revision}", "board": fields.get("BOARD"), "eabi": fields.get("EABI"),
            "gcid": fields.get("GCID"), "date": fields.get("DATE"), "kernel_variant": fields.get("KERNEL_VARIANT")}


def parse_dpkg_status(lines: Iterable[str], wanted: Callable[[str], object] = DPKG_PACKAGES.match) -> dict[str, str]:
    """{package: version} of the installed packages for whose name ``wanted(name)`` is true."""
    found: dict[str, str] = {}
    name = version = status = None

    def flush() -> None:
        if name and version and status and status.split()[-1] == "installed" and wanted(name):
            found.setdefault(name, version)

    for line in lines:
        if not line.strip():
            flush()
            name = version = status = None
        elif line.startswith("Package:"):
            name = line[8:].strip()
        elif line.startswith("Version:"):
            version = line[8:].strip()
        elif line.startswith("Status:"):
            status = line[7:].strip()
    flush()
    return found


def parse_meminfo(text: str) -> dict[str, int]:
    values = {}
    for line in text.splitlines():
        match = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    return values


def parse_cuda_version(text: str, json_file: bool) -> str | None:
    if json_file:
        try:
            version = json.loads(text).get("cuda", {}).get("version")
        except (ValueError, AttributeError):
            return None
        return version if isinstance(version, str) and version else None
    match = re.search(r"CUDA Version\s+(\d+(?:\.\d+)*)", text)
    return match.group(1) if match else None


def parse_driver_version(text: str) -> str | None:
    """/proc/driver/nvidia/version: the first dotted number after "NVRM version:"."""
    match = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|\Z)", text)
    return match.group(1) if match else None


def parse_nvpmodel(text: str) -> dict[str, Any] | None:
    """``nvpmodel -q``: "NV Power Mode: MAXN" then the mode number on the next line (warnings may come first)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        match = re.match(r"NV Power Mode\s*:\s*(\S.*)\Z", line)
        if match:
            mode_id = int(lines[i + 1]) if i + 1 < len(lines) and re.match(r"\d+\Z", lines[i + 1]) else None
            return {"name": match.group(1).strip(), "id": mode_id}
    return None


def _freqs(words: str) -> dict[str, Any]:
    kv = dict(re.findall(r"(\w+)=(\S+)", words))
    return {"cur_hz": _int(kv.get("CurrentFreq", "")), "min_hz": _int(kv.get("MinFreq", "")),
            "max_hz": _int(kv.get("MaxFreq", "")), "online": kv.get("Online", "1") == "1"}


def parse_jetson_clocks(text: str) -> dict[str, Any]:
    """``jetson_clocks --show`` -> {"cpus": [{cur_hz, min_hz, max_hz, online}] (kHz there), "gpu", "emc"}."""
    cpus, units = [], {}
    for line in text.splitlines():
        line = line.strip()
        cpu = re.match(r"cpu\d+\s*:\s*(.*)\Z", line)
        unit = re.match(r"(GPU|EMC)\s+(.*MaxFreq=.*)\Z", line)
        if cpu:
            freqs = _freqs(cpu.group(1))
            for key in ("cur_hz", "min_hz", "max_hz"):
                freqs[key] = None if freqs[key] is None else freqs[key] * 1000
            cpus.append(freqs)
        elif unit:
            freqs = _freqs(unit.group(2))
            del freqs["online"]
            units[unit.group(1).lower()] = freqs
    return {"cpus": cpus, "gpu": units.get("gpu"), "emc": units.get("emc")}


def decide_locked(cpus: Sequence[dict[str, Any]], gpu: dict[str, Any] | None,
                  emc: dict[str, Any] | None) -> tuple[bool | None, str | None]:
    """(True/False/None, why): locked when every online CPU, the GPU and the EMC run at their max."""
    below, unknown = [], []
    online = [c for c in cpus if c.get("online", True)]
    if not online:
        unknown.append("no online CPU listed")
    for i, cpu in enumerate(online):
        if cpu["cur_hz"] is None or cpu["max_hz"] is None:
            unknown.append(f"CPU {i} has no current or max frequency")
        elif cpu["cur_hz"] < cpu["max_hz"]:
            below.append("CPU")
    for name, unit in (("GPU", gpu), ("EMC", emc)):
        if unit is None or unit.get("cur_hz") is None or unit.get("max_hz") is None:
            unknown.append(f"no {name} current and max frequency")
        elif unit["cur_hz"] < unit["max_hz"]:
            below.append(name)
    if below:
        return False, None
    if unknown:
        return None, "; ".join(dict.fromkeys(unknown))
    return True, None


def parse_nvidia_smi(text: str, fields: Sequence[str]) -> list[dict[str, Any]]:
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        values = dict(zip(fields, (v.strip() for v in row)))  # noqa: B905 (zip's strict= is Python 3.10+)
        gpu: dict[str, Any] = {}
        for field, key in zip(NVIDIA_SMI_FIELDS, NVIDIA_SMI_KEYS):  # noqa: B905
            raw = values.get(field)
            if raw is None or raw.startswith("[") or raw in ("", "N/A"):
                gpu[key] = None
            elif key in ("name", "driver_version", "compute_cap", "persistence_mode"):
                gpu[key] = raw
            else:
                gpu[key] = _number(raw)
        gpus.append(gpu)
    return gpus


# -------------------------------------------------------------------------------------------------- env: the board


class Board:
    """What the facts read: files and directories under the root (``--root``; named relative to it in every
    message), the board's tools on PATH, this interpreter, and the facts gathered before. While a fact is gathered it
    may read only what its table entry declares (``reads``, ``needs``): anything else is a bug in this agent."""

    def __init__(self, root: str, work_dir: str = ".", dpkg_globs: Sequence[str] = ()) -> None:
        self.root = root
        self.work_dir = work_dir
        self.dpkg_globs = tuple(dpkg_globs)
        self.known: dict[str, Any] = {}
        self.whys: dict[str, str] = {}
        self.unavailable: list[dict[str, str]] = []
        self.current: Fact | None = None
        self._once: dict[str, Any] = {}

    def _declared(self, what: str, listing: bool = False) -> None:
        fact = self.current
        if fact is None:
            return
        if listing:
            ok = any(p.startswith(what.rstrip("/") + "/") for p in fact.reads)
        else:
            ok = any(fnmatch.fnmatchcase(what, p) for p in fact.reads)
        if not ok:
            raise AgentError(f"fact {fact.name} reads {what}, which its table entry does not declare")

    def path(self, rel: str) -> str:
        self._declared(rel)
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel: str, limit: int = 1 << 20) -> tuple[str | None, str | None]:
        """(text, None) or (None, why)."""
        try:
            with open(self.path(rel), "rb") as f:
                data = f.read(limit)
        except FileNotFoundError:
            return None, f"{rel} not found"
        except OSError as exc:
            return None, f"{rel}: {exc.strerror or exc}"
        return data.decode("utf-8", "replace"), None

    def listdir(self, rel: str) -> list[str]:
        self._declared(rel, listing=True)
        try:
            return sorted(os.listdir(os.path.join(self.root, rel.lstrip("/"))))
        except OSError:
            return []

    def tool(self, name: str, *args: str, timeout: float | None = None) -> tuple[str | None, str | None]:
        """(stdout, None) or (None, why) of a board tool (module doc)."""
        self._declared("$ " + " ".join((name, *args)))
        return _run_tool(name, args, TOOL_TIMEOUT_S if timeout is None else timeout)

    def fact(self, name: str) -> Any:
        """A fact gathered before (its value; None when missing)."""
        if self.current is not None and name not in self.current.needs:
            raise AgentError(f"fact {self.current.name} reads fact {name}, which its table entry does not need")
        return self.known[name]

    def why(self, name: str) -> str | None:
        """Why a fact gathered before is missing (None when it is not)."""
        self.fact(name)
        return self.whys.get(name)

    def once(self, key: str, compute: Callable[[], Any]) -> Any:
        """What ``compute`` returns, computed once however many facts share it."""
        if key not in self._once:
            self._once[key] = compute()
        return self._once[key]

    def missing(self, field: str, why: str) -> None:
        """A null inside a fact's value (``unavailable`` names it as ``fact.key``)."""
        self.unavailable.append({"field": field, "why": why})


class Fact(NamedTuple):
    """One key of ``env``: what it reads, the parser that turns that into its value (or None and why), and its value
    when what it reads is missing or fails (then ``unavailable`` says why)."""

    name: str
    reads: tuple[str, ...]  # files under the root (globs allowed), "$ tool args" (PATH), "python: ..." (this process)
    parse: Callable[[Board], tuple[Any, str | None]]
    default: Any = None
    needs: tuple[str, ...] = ()  # facts gathered before that it reads


def gather(board: Board, facts: Sequence[Fact] | None = None) -> dict[str, Any]:
    """The facts (FACTS by default, in their order) read from ``board``, plus ``unavailable``."""
    for fact in FACTS if facts is None else facts:
        board.current = fact
        try:
            value, why = fact.parse(board)
        finally:
            board.current = None
        if value is None:
            value = fact.default
            board.whys[fact.name] = why or "unknown"
            board.missing(fact.name, why or "unknown")
        board.known[fact.name] = value
    return {**board.known, "unavailable": board.unavailable}


# ------------------------------------------------------------------------------------------------ env: the parsers


def _value(compute: Callable[[], Any], why: str | None = None) -> Callable[[Board], tuple[Any, str | None]]:
    """A fact this interpreter knows (``why``: said when it answers None)."""
    return lambda board: (compute(), why)


def _machine(board: Board) -> tuple[str, None]:
    # the kernel's own answer (sysctl kernel.arch, Linux 5.x+) read through the root, so a fake board's root says
    # what its board is; uname's where the file is absent
    arch, _ = board.read("/proc/sys/kernel/arch")
    return (arch.strip() if arch and arch.strip() else os.uname().machine), None


def _libc(board: Board) -> tuple[str | None, str]:
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    return libc or None, "confstr CS_GNU_LIBC_VERSION unknown (not glibc)"


def _cpus_usable(board: Board) -> tuple[int | None, str]:
    try:
        return len(os.sched_getaffinity(0)), "sched_getaffinity unavailable"
    except (AttributeError, OSError):
        return None, "sched_getaffinity unavailable"


def _cpu_model(board: Board) -> tuple[str | None, str | None]:
    text, why = board.read("/proc/cpuinfo")
    if text is None:
        return None, why
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    return (match.group(1).strip() if match else None), "no 'model name' in /proc/cpuinfo (aarch64 kernels print none)"


def _board_model(board: Board) -> tuple[str | None, str]:
    found, whys = None, []
    for rel in ("/proc/device-tree/model", "/sys/devices/virtual/dmi/id/product_name"):
        text, why = board.read(rel)
        found = text.replace("\x00", "").strip() if text is not None else None
        if found:
            break
        whys.append(why or f"{rel} is empty")
    return found or None, "; ".join(whys)


def _meminfo(key: str) -> Callable[[Board], tuple[int | None, str]]:
    def parse(board: Board) -> tuple[int | None, str]:
        text, why = board.read("/proc/meminfo")
        mem = parse_meminfo(text) if text is not None else {}
        return mem.get(key), why or f"no {key} in /proc/meminfo"
    return parse


def _disk(index: int) -> Callable[[Board], tuple[int | None, str | None]]:
    """The file system holding the work dir: (total, free)[index]."""
    def measure(board: Board) -> tuple[int | None, int | None, str | None]:
        try:
            usage = shutil.disk_usage(board.work_dir)
        except OSError as exc:
            return None, None, f"work dir: {exc.strerror or exc}"
        return usage.total, usage.free, None

    def parse(board: Board) -> tuple[int | None, str | None]:
        found = board.once("disk", lambda: measure(board))
        return found[index], found[2]
    return parse


def _packages(board: Board) -> tuple[dict[str, str] | None, str | None]:
    def wanted(name: str) -> bool:
        return bool(DPKG_PACKAGES.match(name)) or any(fnmatch.fnmatchcase(name, g) for g in board.dpkg_globs)

    try:
        with open(board.path(DPKG_STATUS), encoding="utf-8", errors="replace") as f:
            return dict(sorted(parse_dpkg_status(f, wanted).items())), None
    except FileNotFoundError:
        return None, f"{DPKG_STATUS} not found"
    except OSError as exc:
        return None, f"{DPKG_STATUS}: {exc.strerror or exc}"


def _from_dpkg(board: Board, name: str) -> str | None:
    """The installed version of the dpkg package ``name`` (None when not installed or dpkg unread)."""
    return (board.fact("packages") or {}).get(name)


def _no_package(board: Board, what: str) -> str:
    return board.why("packages") or f"no {what} package installed in dpkg"


def _pick_highest(packages: dict[str, str], pattern: str) -> tuple[str | None, str | None]:
    """(name, version) of the package matching ``pattern`` (groups = numbers) with the highest numbers."""
    best = None
    for name, version in packages.items():
        match = re.match(pattern, name)
        if match:
            key = tuple(int(g) for g in match.groups())
            if best is None or key > best[0]:
                best = (key, name, version)
    return (best[1], best[2]) if best else (None, None)


def _l4t(board: Board) -> tuple[dict[str, Any] | None, str | None]:
    text, why = board.read("/etc/nv_tegra_release")
    l4t = parse_tegra_release(text) if text is not None else None
    if l4t:
        l4t["source"] = "/etc/nv_tegra_release"
        return l4t, None
    whys = [why or "/etc/nv_tegra_release: no '# R<n> (...), REVISION: x.y' line"]
    version = _from_dpkg(board, "nvidia-l4t-core")
    if version:
        l4t = {"release": _upstream(version), "source": "dpkg nvidia-l4t-core", "board": None, "eabi": None,
               "gcid": None, "date": None, "kernel_variant": None}
    whys.append(_no_package(board, "nvidia-l4t-core"))
    return l4t, "; ".join(whys)


def _jetpack(board: Board) -> tuple[dict[str, Any] | None, str | None]:
    version = _from_dpkg(board, "nvidia-jetpack")
    if version:
        return {"version": re.split(r"[+~-]", _upstream(version))[0], "source": "dpkg nvidia-jetpack"}, None
    l4t = board.fact("l4t")
    if not l4t:
        return None, f"{_no_package(board, 'nvidia-jetpack')}; L4T unknown"
    release = l4t["release"]
    mapped = JETPACK_OF_L4T.get(release) or JETPACK_OF_L4T.get(".".join(release.split(".")[:2]))
    return ({"version": mapped, "source": "l4t table"} if mapped else None,
            f"{_no_package(board, 'nvidia-jetpack')}; L4T {release} is not in the agent's table")


def _cuda(board: Board) -> tuple[dict[str, Any] | None, str]:
    whys = []
    for rel, is_json in (("/usr/local/cuda/version.json", True), ("/usr/local/cuda/version.txt", False)):
        text, why = board.read(rel)
        found = parse_cuda_version(text, is_json) if text is not None else None
        if found:
            return {"version": found, "source": rel}, ""
        whys.append(why or f"{rel}: no CUDA version in it")
    cuda = None
    for prefix in ("cuda-toolkit", "cuda-runtime", "cuda-cudart"):
        name, version = _pick_highest(board.fact("packages") or {}, re.escape(prefix) + r"-(\d+)-(\d+)\Z")
        if name and version:
            cuda = {"version": _upstream(version), "source": f"dpkg {name}"}
            break
    whys.append(_no_package(board, "cuda-toolkit-X-Y, cuda-runtime-X-Y or cuda-cudart-X-Y"))
    return cuda, "; ".join(whys)


def _gpus(board: Board) -> tuple[list[dict[str, Any]] | None, str | None]:
    fields = NVIDIA_SMI_FIELDS
    for attempt in range(2):
        out, why = board.tool("nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              timeout=NVIDIA_SMI_TIMEOUT_S)
        if out is not None:
            gpus = parse_nvidia_smi(out, fields) or None
            return gpus, None if gpus else "nvidia-smi listed no GPU"
        if attempt == 1 or "valid field" not in (why or ""):
            return None, why
        fields = tuple(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")  # older drivers lack compute_cap
    return None, None  # not reached


def _gpu_driver(board: Board) -> tuple[dict[str, Any] | None, str]:
    text, proc_why = board.read("/proc/driver/nvidia/version")
    driver = None
    if text is not None:
        found = parse_driver_version(text)
        driver = {"version": found, "source": "/proc/driver/nvidia/version"} if found else None
        proc_why = "/proc/driver/nvidia/version: no 'NVRM version: ... <n.n.n>'"
    gpus = board.fact("gpus")
    if driver is None and gpus and gpus[0].get("driver_version"):
        driver = {"version": gpus[0]["driver_version"], "source": "nvidia-smi"}
    return driver, f"{proc_why}; {board.why('gpus') or 'nvidia-smi gave no driver version'}"


def _power_mode(board: Board) -> tuple[dict[str, Any] | None, str]:
    out, why = board.tool("nvpmodel", "-q")
    mode = parse_nvpmodel(out) if out is not None else None
    if mode:
        mode["source"] = "nvpmodel -q"
    return mode, why or "nvpmodel -q printed no 'NV Power Mode: <name>' line"


def _devfreq(board: Board, name: str) -> dict[str, Any]:
    base = f"/sys/class/devfreq/{name}"
    values: dict[str, Any] = {}
    for key, leaf in (("cur_hz", "cur_freq"), ("min_hz", "min_freq"), ("max_hz", "max_freq")):
        text, _ = board.read(f"{base}/{leaf}")
        values[key] = _int(text) if text is not None else None
    text, _ = board.read(f"{base}/governor")
    values["governor"] = text.strip() if text else None
    values["source"] = base
    return values


def _gpu_clock(board: Board) -> tuple[dict[str, Any] | None, str]:
    names = [n for n in board.listdir("/sys/class/devfreq") if any(h in n.lower() for h in GPU_DEVFREQ_HINTS)]
    gpu_clock = None
    if names:
        gpu_clock = _devfreq(board, names[0])
        gpu_clock.update(device=names[0], devices=names)
        for key in ("cur_hz", "min_hz", "max_hz", "governor"):
            if gpu_clock[key] is None:
                board.missing(f"gpu_clock.{key}", f"{gpu_clock['source']}: not readable")
    return gpu_clock, f"no GPU node in /sys/class/devfreq (a name holding {', '.join(GPU_DEVFREQ_HINTS)})"


def _emc_clock(board: Board) -> tuple[dict[str, Any] | None, str]:
    emc_clock, whys = None, []
    bwmgr = _devfreq(board, "bwmgr")
    if bwmgr["cur_hz"] is not None:
        del bwmgr["governor"]
        emc_clock = bwmgr
    else:
        whys.append("/sys/class/devfreq/bwmgr/cur_freq not readable")
        rate, why = board.read(f"{EMC_DEBUGFS}/rate")
        if rate is not None and _int(rate) is not None:
            emc_clock = {"cur_hz": _int(rate), "source": EMC_DEBUGFS}
            for key, leaf in (("min_hz", "min_rate"), ("max_hz", "max_rate")):
                text, _ = board.read(f"{EMC_DEBUGFS}/{leaf}")
                emc_clock[key] = _int(text) if text is not None else None
        else:
            whys.append(f"{why} (debugfs, root only)" if why else f"{EMC_DEBUGFS}/rate is not a number")
    if emc_clock:
        for key in ("min_hz", "max_hz"):
            if emc_clock[key] is None:
                board.missing(f"emc_clock.{key}", f"{emc_clock['source']}: not readable")
    return emc_clock, "; ".join(whys)


def _unit(values: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if values is None else {k: values.get(k) for k in ("cur_hz", "min_hz", "max_hz")}


def _at_max(cpus: Sequence[dict[str, Any]]) -> int:
    return sum(1 for c in cpus if c["cur_hz"] is not None and c["cur_hz"] == c["max_hz"])


def _read_clocks(board: Board) -> tuple[bool | None, str | None, dict[str, Any] | None, str | None]:
    """(clocks_locked, why, clocks, why): from ``jetson_clocks --show``, else sysfs when a GPU devfreq node exists."""
    out, jc_why = board.tool("jetson_clocks", "--show")
    gpu_clock, emc_clock = board.fact("gpu_clock"), board.fact("emc_clock")
    if out is not None:
        shown = parse_jetson_clocks(out)
        locked, why = decide_locked(shown["cpus"], shown["gpu"], shown["emc"])
        online = [c for c in shown["cpus"] if c["online"]]
        clocks = {"source": "jetson_clocks --show", "cpu_online": len(online), "cpu_at_max": _at_max(online),
                  "gpu": shown["gpu"], "emc": shown["emc"]}
        return locked, (f"jetson_clocks --show: {why}" if why else None), clocks, jc_why
    if gpu_clock is None:
        why = f"{jc_why}; no GPU devfreq node to read the clocks from instead"
        return None, why, None, why
    cpus = []
    for policy in board.listdir(CPUFREQ):
        if re.match(r"policy\d+\Z", policy):
            cur, _ = board.read(f"{CPUFREQ}/{policy}/scaling_cur_freq")
            top, _ = board.read(f"{CPUFREQ}/{policy}/scaling_max_freq")
            cur_khz, top_khz = _int(cur) if cur else None, _int(top) if top else None
            cpus.append({"cur_hz": cur_khz * 1000 if cur_khz is not None else None,
                         "max_hz": top_khz * 1000 if top_khz is not None else None, "min_hz": None, "online": True})
    locked, why = decide_locked(cpus, _unit(gpu_clock), _unit(emc_clock))
    clocks = {"source": "sysfs", "cpu_online": len(cpus), "cpu_at_max": _at_max(cpus), "gpu": _unit(gpu_clock),
              "emc": _unit(emc_clock)}
    return locked, (f"{jc_why}; sysfs: {why}" if why else None), clocks, jc_why


def _clocks_locked(board: Board) -> tuple[bool | None, str | None]:
    locked, why, _, _ = board.once("clocks", lambda: _read_clocks(board))
    return locked, why


def _clocks(board: Board) -> tuple[dict[str, Any] | None, str | None]:
    _, _, clocks, why = board.once("clocks", lambda: _read_clocks(board))
    return clocks, why


def _thermal(board: Board) -> tuple[list[dict[str, Any]] | None, str]:
    zones = [n for n in board.listdir("/sys/class/thermal") if re.match(r"thermal_zone\d+\Z", n)]
    zones.sort(key=lambda n: int(n[len("thermal_zone"):]))
    thermal = []
    for zone in zones:
        kind, _ = board.read(f"/sys/class/thermal/{zone}/type")
        temp, why = board.read(f"/sys/class/thermal/{zone}/temp")
        milli = _int(temp) if temp is not None else None
        if milli is None:
            board.missing(f"thermal.{zone}", why or f"/sys/class/thermal/{zone}/temp is not a number")
        thermal.append({"zone": zone, "type": kind.strip() if kind else None,
                        "temp_c": None if milli is None else milli / 1000.0})
    return thermal or None, "no /sys/class/thermal/thermal_zone*"


_DEVFREQ = tuple(f"/sys/class/devfreq/*/{leaf}" for leaf in ("cur_freq", "min_freq", "max_freq", "governor"))
_BWMGR = tuple(f"/sys/class/devfreq/bwmgr/{leaf}" for leaf in ("cur_freq", "min_freq", "max_freq", "governor"))
_EMC = (*_BWMGR, *(f"{EMC_DEBUGFS}/{leaf}" for leaf in ("rate", "min_rate", "max_rate")))
_CLOCKS = ("$ jetson_clocks --show", f"{CPUFREQ}/policy*/scaling_cur_freq", f"{CPUFREQ}/policy*/scaling_max_freq")
_NVIDIA_SMI = "$ nvidia-smi --query-gpu=* --format=csv,noheader,nounits"

# The keys of ``env``, in the order they are gathered (and ``unavailable`` lists them); docs/board-agent.md gives the
# shape of each value.
FACTS = (
    Fact("schema", (), _value(lambda: SCHEMA)),
    Fact("python", ("python: platform.python_version()",), _value(platform.python_version)),
    Fact("python_implementation", ("python: platform.python_implementation()",),
         _value(platform.python_implementation)),
    Fact("system", ("python: os.uname().sysname",), _value(lambda: os.uname().sysname)),
    Fact("machine", ("/proc/sys/kernel/arch", "python: os.uname().machine"), _machine),
    Fact("kernel", ("python: os.uname().release",), _value(lambda: os.uname().release)),
    Fact("kernel_build", ("python: os.uname().version",), _value(lambda: os.uname().version)),
    Fact("libc", ("python: os.confstr('CS_GNU_LIBC_VERSION')",), _libc),
    Fact("cpu_count", ("python: os.cpu_count()",), _value(os.cpu_count, "os.cpu_count() unknown")),
    Fact("cpus_usable", ("python: os.sched_getaffinity(0)",), _cpus_usable),
    Fact("cpu_model", ("/proc/cpuinfo",), _cpu_model),
    Fact("board_model", ("/proc/device-tree/model", "/sys/devices/virtual/dmi/id/product_name"), _board_model),
    Fact("memory_total_bytes", ("/proc/meminfo",), _meminfo("MemTotal")),
    Fact("memory_available_bytes", ("/proc/meminfo",), _meminfo("MemAvailable")),
    Fact("disk_total_bytes", ("python: shutil.disk_usage(--work-dir)",), _disk(0)),
    Fact("disk_free_bytes", ("python: shutil.disk_usage(--work-dir)",), _disk(1)),
    Fact("packages", (DPKG_STATUS,), _packages),
    Fact("l4t", ("/etc/nv_tegra_release",), _l4t, needs=("packages",)),
    Fact("jetpack", (), _jetpack, needs=("packages", "l4t")),
    Fact("cuda", ("/usr/local/cuda/version.json", "/usr/local/cuda/version.txt"), _cuda, needs=("packages",)),
    Fact("gpus", (_NVIDIA_SMI,), _gpus),
    Fact("gpu_driver", ("/proc/driver/nvidia/version",), _gpu_driver, needs=("gpus",)),
    Fact("power_mode", ("$ nvpmodel -q",), _power_mode),
    Fact("gpu_clock", _DEVFREQ, _gpu_clock),
    Fact("emc_clock", _EMC, _emc_clock),
    Fact("clocks_locked", _CLOCKS, _clocks_locked, needs=("gpu_clock", "emc_clock")),
    Fact("clocks", _CLOCKS, _clocks, needs=("gpu_clock", "emc_clock")),
    Fact("thermal", ("/sys/class/thermal/thermal_zone*/type", "/sys/class/thermal/thermal_zone*/temp"), _thermal),
)


def cmd_env(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    root = args.root or os.environ.get("AGENT_SYSROOT") or "/"
    if not os.path.isdir(root):
        raise BadInput(f"--root {root}: not a directory")
    work_dir = args.work_dir or "."
    if not os.path.isdir(work_dir):
        raise BadInput(f"--work-dir {work_dir}: not a directory")
    globs = args.dpkg or []
    for glob in globs:
        if not re.match(r"[a-z0-9.+*?\[\]-]+\Z", glob):
            raise BadInput(f"--dpkg {glob!r}: expected a package name or glob such as cuda-cudart-*")
    return gather(Board(root, work_dir, globs)), 0, None


# ---------------------------------------------------------------------------------------------------------- check


def _check_tool(name: str, path: str, problems: list[str]) -> str | None:
    """The tool's resolved path (a PATH without "/" is looked up on PATH), or None with its problem noted."""
    if "/" not in path:
        found = shutil.which(path)
        if found is None:
            problems.append(f"tool {name}: {path} not found on PATH")
            return None
        path = found
    if not os.path.lexists(path):
        problems.append(f"tool {name}: {path} does not exist")
    elif not os.path.exists(path):
        problems.append(f"tool {name}: {path} is a dangling symlink")
    elif os.path.isdir(path):
        problems.append(f"tool {name}: {path} is a directory")
    elif not os.access(path, os.X_OK):
        problems.append(f"tool {name}: {path} is not executable")
    else:
        return path
    return None


def _check_tools(specs: Sequence[str], problems: list[str]) -> dict[str, str | None]:
    tools: dict[str, str | None] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"--tool {spec!r}: expected NAME=PATH")
        if name in tools:
            raise BadInput(f"--tool {name}: given twice")
        tools[name] = _check_tool(name, path, problems)
    return tools


def _check_lib_dirs(dirs: Sequence[str], problems: list[str]) -> list[str]:
    """The library dirs that are directories."""
    found = []
    for lib in dirs:
        if not os.path.exists(lib):
            problems.append(f"lib dir {lib} does not exist")
        elif not os.path.isdir(lib):
            problems.append(f"lib dir {lib} is not a directory")
        else:
            found.append(lib)
    return found


def _check_libs(patterns: Sequence[str], lib_dirs: Sequence[str], given: Sequence[str],
                problems: list[str]) -> dict[str, str | None]:
    """{GLOB: the first file matching it in the first lib dir that holds one, or None}."""
    libs: dict[str, str | None] = {}
    for pattern in patterns:
        if "/" in pattern or not pattern:
            raise BadInput(f"--needs-lib {pattern!r}: expected a file name pattern such as libcudart.so*")
        libs[pattern] = None
        for lib in lib_dirs:
            matches = [n for n in sorted(os.listdir(lib)) if fnmatch.fnmatchcase(n, pattern)
                       and os.path.isfile(os.path.join(lib, n))]
            if matches:
                libs[pattern] = os.path.join(lib, matches[0])
                break
        if libs[pattern] is None:
            problems.append(f"library {pattern}: no such file in {', '.join(given)}")
    return libs


def _check_files(paths: Sequence[str], problems: list[str]) -> None:
    for path in paths:
        if not os.path.lexists(path):
            problems.append(f"file {path} does not exist")
        elif not os.path.exists(path):
            problems.append(f"file {path} is a dangling symlink")
        elif not os.path.isfile(path):
            problems.append(f"file {path} is not a regular file")


def cmd_check(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    problems: list[str] = []
    tools = _check_tools(args.tool or [], problems)
    lib_dirs = _check_lib_dirs(args.lib or [], problems)
    if args.needs_lib and not args.lib:
        raise BadInput("--needs-lib needs at least one --lib DIR to search")
    libs = _check_libs(args.needs_lib or [], lib_dirs, args.lib or [], problems)
    _check_files(args.file or [], problems)
    builds = {build: _cmake_build(build, args.cmake_key or [], problems) for build in args.build_dir or []}
    note = f"check: {len(problems)} problem(s), the first: {problems[0]}" if problems else None
    return ({"ok": not problems, "problems": problems, "tools": tools, "libs": libs, "builds": builds},
            (1 if problems else 0), note)


CMAKE_ENTRY = re.compile(r"([A-Za-z_][A-Za-z0-9_.+-]*):[A-Z]+=(.*)\Z")


def _cmake_build(build: str, keys: Sequence[str], problems: list[str]) -> dict[str, Any]:
    """What a CMake build dir's CMakeCache.txt and its source's git say about it (docs/board-agent.md: check)."""
    out = {"project": None, "version": None, "build_type": None, "source_dir": None, "revision": None,
           "cache": {k: None for k in keys}}
    path = os.path.join(build, "CMakeCache.txt")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 22)
    except OSError as exc:
        problems.append(f"build dir {build}: cannot read CMakeCache.txt ({exc.strerror or exc})")
        return out
    entries = {}
    for line in text.splitlines():
        found = CMAKE_ENTRY.match(line.strip())
        if found:
            entries[found.group(1)] = found.group(2)
    out["project"] = entries.get("CMAKE_PROJECT_NAME")
    out["version"] = entries.get("CMAKE_PROJECT_VERSION")
    out["build_type"] = entries.get("CMAKE_BUILD_TYPE")
    out["source_dir"] = source = entries.get("CMAKE_HOME_DIRECTORY")
    out["cache"] = {k: entries.get(k) for k in keys}
    if source:
        out["revision"] = _git_revision(source)
    return out


def _git_revision(source: str) -> str | None:
    """The commit the source tree's HEAD names (a 40-hex sha), or None (no .git, unreadable, unborn)."""
    git = os.path.join(source, ".git")
    try:
        if os.path.isfile(git):  # a worktree or submodule: "gitdir: <path>"
            with open(git, encoding="utf-8") as f:
                pointer = f.read(4096).strip()
            if not pointer.startswith("gitdir:"):
                return None
            git = os.path.join(source, pointer[len("gitdir:"):].strip())
        with open(os.path.join(git, "HEAD"), encoding="utf-8") as f:
            head = f.read(4096).strip()
        if re.match(r"[0-9a-f]{40}\Z", head):
            return head
        if not head.startswith("ref: "):
            return None
        ref = head[5:].strip()
        if ".." in ref.split("/"):
            return None
        for base in (git, _common_dir(git)):
            try:
                with open(os.path.join(base, ref), encoding="utf-8") as f:
                    sha = f.read(4096).strip()
                if re.match(r"[0-9a-f]{40}\Z", sha):
                    return sha
            except OSError:
                pass
            try:
                with open(os.path.join(base, "packed-refs"), encoding="utf-8") as f:
                    for line in f:
                        parts = line.split()
                        if len(parts) == 2 and parts[1] == ref and re.match(r"[0-9a-f]{40}\Z", parts[0]):
                            return parts[0]
            except OSError:
                pass
    except OSError:
        return None
    return None


def _common_dir(git: str) -> str:
    try:
        with open(os.path.join(git, "commondir"), encoding="utf-8") as f:
            return os.path.join(git, f.read(4096).strip())
    except OSError:
        return git


# ----------------------------------------------------------------------------------------------------------- hash


def _show(path: str | bytes) -> str:
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _sha256_open(path: str | bytes) -> tuple[str, int]:
    """(sha256, bytes) of a regular file, opened without following a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink swapped in
            raise BadInput(f"{_show(path)}: a symbolic link (refused, never followed)") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise BadInput(f"{_show(path)}: not a regular file")
        digest, size = hashlib.sha256(), 0
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def tree_files(top: str | bytes) -> list[bytes]:
    """Relative paths (bytes, "a/b") of the regular files under ``top``; symlinks and special files refused."""
    top = os.fsencode(top)
    found, pending = [], [b""]
    while pending:
        rel_dir = pending.pop()
        with os.scandir(os.path.join(top, rel_dir) if rel_dir else top) as entries:
            for entry in entries:
                rel = rel_dir + b"/" + entry.name if rel_dir else entry.name
                full = os.path.join(top, rel)
                if entry.is_symlink():
                    raise BadInput(f"{_show(full)}: a symbolic link (refused, never followed)")
                if entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                elif entry.is_file(follow_symlinks=False):
                    if b"\r" in rel:
                        raise BadInput(f"{_show(full)}: a carriage return in a file name (its sha256sum line "
                                       "differs between coreutils versions)")
                    found.append(rel)
                else:
                    raise BadInput(f"{_show(full)}: not a regular file or directory")
    return sorted(found, key=lambda rel: b"./" + rel)


def tree_digest(top: str, listing: list[dict[str, Any]] | None = None,
                seal: IO[bytes] | None = None) -> tuple[str, int, int]:
    """(sha256 of the sha256sum lines, file count, total bytes) of the directory ``top``; each file's
    {"path", "sha256", "bytes"} appended to ``listing`` and each line written to ``seal`` (a binary file) when given."""
    digest, total = hashlib.sha256(), 0
    files = tree_files(top)
    for rel in files:
        file_sha, size = _sha256_open(os.path.join(os.fsencode(top), rel))
        total += size
        name = b"./" + rel
        if listing is not None:
            listing.append({"path": _show(name), "sha256": file_sha, "bytes": size})
        line = b""
        if b"\\" in name or b"\n" in name:
            name = name.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
            line = b"\\"
        line += file_sha.encode() + b"  " + name + b"\n"
        digest.update(line)
        if seal is not None:
            seal.write(line)
    return digest.hexdigest(), len(files), total


def _inside(path: str, within: str) -> bool:
    base = os.path.realpath(within)
    real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    return real != base and os.path.commonpath([real, base]) == base


def cmd_hash(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    path = args.path.rstrip("/") or "/"
    if args.within is not None and not _inside(path, args.within):
        raise BadInput(f"{path}: outside {args.within}")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise BadInput(f"{path}: does not exist") from None
    if stat.S_ISLNK(mode):
        raise BadInput(f"{path}: a symbolic link (refused, never followed)")
    if stat.S_ISREG(mode):
        if args.seal is not None:
            raise BadInput(f"--seal: {path} is a file (a seal lists a tree's files)")
        sha, size = _sha256_open(path)
        out = {"kind": "file", "sha256": sha, "files": 1, "bytes": size}
        if args.list:
            out["listing"] = [{"path": os.path.basename(path), "sha256": sha, "bytes": size}]
        return out, 0, None
    if stat.S_ISDIR(mode):
        listing = [] if args.list else None
        if args.seal is None:
            sha, count, size = tree_digest(path, listing)
        else:
            tmp = f"{args.seal}.tmp-{os.getpid()}"
            try:
                with open(tmp, "wb") as seal:
                    sha, count, size = tree_digest(path, listing, seal)
                os.replace(tmp, args.seal)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        out = {"kind": "tree", "sha256": sha, "files": count, "bytes": size}
        if listing is not None:
            out["listing"] = listing
        return out, 0, None
    raise BadInput(f"{path}: not a regular file or directory")


# ------------------------------------------------------------------------------------------------------------ oom

OOM_LINE = re.compile(r"Out of memory: Killed process (\d+) \(([^)]*)\)"
                      r"(?:.*?total-vm:(\d+)kB)?(?:.*?anon-rss:(\d+)kB)?")
OOM_LOGS = ("var/log/kern.log", "var/log/syslog")


def cmd_oom(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    root = args.root or os.environ.get("AGENT_SYSROOT") or "/"
    if args.last < 1:
        raise BadInput(f"--last {args.last}: must be at least 1")
    board, kills, sources = Board(root), [], []
    for rel in OOM_LOGS:
        text, _ = board.read(rel, limit=1 << 24)
        if text is None:
            continue
        sources.append(rel)
        for line in text.splitlines():
            found = OOM_LINE.search(line)
            if found:
                pid, comm, vm, rss = found.groups()
                kills.append({"pid": int(pid), "comm": comm, "total_vm_kb": int(vm) if vm else None,
                              "anon_rss_kb": int(rss) if rss else None, "line": line.strip()[:500]})
    mem_text, _ = board.read("/proc/meminfo")
    mem = parse_meminfo(mem_text) if mem_text is not None else {}
    return {"kills": kills[-args.last:], "sources": sources, "memory_total_bytes": mem.get("MemTotal"),
            "memory_available_bytes": mem.get("MemAvailable")}, 0, None


# ---------------------------------------------------------------------------------------------------------- cache


def _sha_arg(text: str, what: str) -> str:
    if not SHA_RE.match(text):
        raise BadInput(f"{what} {text!r}: not a sha256 (64 lowercase hex digits)")
    return text


def _cache_dir(path: str) -> str | None:
    """The cache dir, or None when it does not exist (an empty cache)."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        raise BadInput(f"--cache {path}: not a directory")
    return path


def _usage_of(path: str) -> tuple[int, int]:
    """(bytes, files) of the regular files at or under ``path``; symlinks are not followed and count nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return 0, 0
    if stat.S_ISREG(st.st_mode):
        return st.st_size, 1
    if not stat.S_ISDIR(st.st_mode):
        return 0, 0
    size = files = 0
    for dirpath, _dirnames, filenames in os.walk(path, onerror=None):
        for name in filenames:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    size += st.st_size
                    files += 1
    return size, files


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    except OSError:
        return False
    return True


def _read_marker(path: str) -> dict[str, str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode("ascii", "replace")
    return dict(re.findall(r"(\w+)=(\S+)", text))


def markers(cache: str, ttl_s: float, now: float, boot: str | None) -> dict[str, list[dict[str, Any]]]:
    """{sha: [marker]} for the files in <cache>/.inuse; a marker is {"tag", "pid", "pid_alive", "age_s", "active",
    "path"}."""
    found = {}
    inuse = os.path.join(cache, INUSE_DIR)
    try:
        names = sorted(os.listdir(inuse))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for name in names:
        match = re.match(r"([0-9a-f]{64})\.(.+)\Z", name, re.S)
        if not match:
            continue
        path = os.path.join(inuse, name)
        try:
            mtime = os.lstat(path).st_mtime
        except FileNotFoundError:
            continue
        words = _read_marker(path)
        pid = _int(words.get("pid", ""))
        alive = None
        if pid is not None:
            alive = _pid_alive(pid) and (words.get("boot") in (None, boot) or boot is None)
        age = now - mtime
        found.setdefault(match.group(1), []).append(
            {"tag": match.group(2), "pid": pid, "pid_alive": alive, "age_s": round(age, 3),
             "active": bool(alive) or age < ttl_s, "path": path, "mtime": mtime})
    return found


def scan_cache(cache: str | None, ttl_s: float) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    now, boot = time.time(), _boot_id()
    result = {"exists": cache is not None, "entries": [], "partials": [], "other": [], "ttl_s": ttl_s,
              "total_bytes": 0, "partial_bytes": 0, "entry_count": 0}
    if cache is None:
        return result, {}
    marks = markers(cache, ttl_s, now, boot)
    names = sorted(os.listdir(cache))
    present = set(names)
    for name in names:
        full = os.path.join(cache, name)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            continue
        if SHA_RE.match(name):
            if stat.S_ISLNK(st.st_mode):
                result["other"].append({"name": name, "why": "a symbolic link (never an entry, never followed)"})
                continue
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                result["other"].append({"name": name, "why": "not a regular file or directory"})
                continue
            size, files = _usage_of(full)
            seal = os.path.join(cache, name + SEAL_SUFFIX)
            try:
                seal_st = os.lstat(seal)
                sealed = stat.S_ISREG(seal_st.st_mode)
                size += seal_st.st_size if sealed else 0
            except FileNotFoundError:
                sealed = False
            own = marks.get(name, [])
            last_use = max([st.st_mtime, st.st_ctime] + [m["mtime"] for m in own])
            active = [m["tag"] for m in own if m["active"]]
            result["entries"].append({
                "sha256": name, "kind": "dir" if stat.S_ISDIR(st.st_mode) else "file", "bytes": size,
                "files": files, "sealed": sealed, "last_use": round(last_use, 6), "in_use": bool(active),
                "in_use_by": active,
                "markers": [{k: m[k] for k in ("tag", "pid", "pid_alive", "age_s", "active")} for m in own]})
        elif name.endswith(SEAL_SUFFIX) and SHA_RE.match(name[:-len(SEAL_SUFFIX)]):
            if name[:-len(SEAL_SUFFIX)] not in present:
                result["other"].append({"name": name, "why": "a seal without its entry"})
        elif name.startswith(".") and ".partial-" in name:
            size, _files = _usage_of(full)
            result["partials"].append({"name": name, "bytes": size, "mtime": round(st.st_mtime, 6)})
            result["partial_bytes"] += size
        elif name in (INUSE_DIR, LOCK_FILE):
            continue
        elif name.startswith(".") and ".evicting-" in name:
            result["other"].append({"name": name, "why": "left by an interrupted evict"})
        else:
            result["other"].append({"name": name, "why": "not a cache entry"})
    result["entries"].sort(key=lambda e: (e["last_use"], e["sha256"]))
    result["total_bytes"] = sum(e["bytes"] for e in result["entries"])
    result["entry_count"] = len(result["entries"])
    return result, marks


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


@contextlib.contextmanager
def _cache_lock(cache: str) -> Iterator[None]:
    fd = os.open(os.path.join(cache, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Infrastructure(f"{cache}: another evict held {LOCK_FILE} for {LOCK_WAIT_S:g} s") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)


def _evict_one(cache: str, sha: str, ttl_s: float) -> bool:
    """Remove the entry, its seal and its markers unless it got marked in use meanwhile; True when removed."""
    src = os.path.join(cache, sha)
    trash = os.path.join(cache, f".{sha}.evicting-{os.getpid()}")
    try:
        os.rename(src, trash)
    except FileNotFoundError:
        return False
    own = markers(cache, ttl_s, time.time(), _boot_id()).get(sha, [])
    if any(m["active"] for m in own):
        try:
            os.rename(trash, src)
        except OSError:
            _remove(trash)  # a new copy took its place meanwhile
        return False
    _remove(os.path.join(cache, sha + SEAL_SUFFIX))
    _remove(trash)
    for marker in own:
        _remove(marker["path"])
    return True


def cmd_cache_usage(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    result, _ = scan_cache(_cache_dir(args.cache), args.ttl_s)
    return result, 0, None


def cmd_cache_evict(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    if args.max_bytes < 0:
        raise BadInput(f"--max-bytes {args.max_bytes}: must be >= 0")
    keep = {_sha_arg(k, "--keep") for k in args.keep or []}
    cache = _cache_dir(args.cache)
    out = {"dry_run": args.dry_run, "max_bytes": args.max_bytes, "removed": [], "blocked": [],
           "markers_removed": [], "leftovers_removed": [], "freed_bytes": 0}
    if cache is None:
        out.update(ok=True, total_bytes=0)
        return out, 0, None
    lock = contextlib.nullcontext() if args.dry_run else _cache_lock(cache)
    with lock:
        if not args.dry_run:
            for name in sorted(os.listdir(cache)):
                if name.startswith(".") and ".evicting-" in name:  # we hold the lock: no evict is running
                    _remove(os.path.join(cache, name))
                    out["leftovers_removed"].append(name)
        scan, marks = scan_cache(cache, args.ttl_s)
        total = scan["total_bytes"]
        for entry in scan["entries"]:
            if total <= args.max_bytes:
                break
            sha = entry["sha256"]
            why = "kept (--keep)" if sha in keep else ("in use: " + ", ".join(entry["in_use_by"])
                                                       if entry["in_use"] else None)
            if why is None and not args.dry_run and not _evict_one(cache, sha, args.ttl_s):
                why = "marked in use (or removed) while being evicted"
            if why:
                out["blocked"].append({"sha256": sha, "bytes": entry["bytes"], "why": why})
                continue
            total -= entry["bytes"]
            out["freed_bytes"] += entry["bytes"]
            out["removed"].append({k: entry[k] for k in ("sha256", "bytes", "last_use")})
            out["markers_removed"] += [f"{sha}.{m['tag']}" for m in marks.get(sha, [])]
        if not args.dry_run:
            scanned = {e["sha256"] for e in scan["entries"]}  # an evicted entry's markers went with it
            for sha, own in sorted(marks.items()):
                if sha in scanned:
                    continue
                for marker in own:
                    if not marker["active"]:
                        _remove(marker["path"])
                        out["markers_removed"].append(f"{sha}.{marker['tag']}")
    out.update(ok=total <= args.max_bytes, total_bytes=total)
    if out["ok"]:
        return out, 0, None
    return out, 1, (f"evict: {total} bytes left, over --max-bytes {args.max_bytes}: "
                    f"{len(out['blocked'])} entr(ies) in use or kept")


def cmd_cache_touch(args: argparse.Namespace) -> tuple[dict[str, Any], int, str | None]:
    sha = _sha_arg(args.sha, "SHA")
    cache = _cache_dir(args.cache)
    if cache is None:
        raise BadInput(f"--cache {args.cache}: does not exist")
    path = os.path.join(cache, sha)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise BadInput(f"{sha}: no such entry in {args.cache}") from None
    if stat.S_ISLNK(st.st_mode):
        raise BadInput(f"{sha}: a symbolic link in {args.cache} (never an entry)")
    os.utime(path, None, follow_symlinks=False)
    st = os.lstat(path)
    return {"sha256": sha, "last_use": round(max(st.st_mtime, st.st_ctime), 6)}, 0, None


# ------------------------------------------------------------------------------------------------------------ CLI


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agent", description="The farm's agent on a device (one JSON object on stdout).")
    sub = parser.add_subparsers(dest="command", required=True)

    env = sub.add_parser("env", help="the machine's environment")
    env.add_argument("--root", help="prefix of every file read (default $AGENT_SYSROOT or /)")
    env.add_argument("--work-dir", help="where free disk is measured (default: the current directory)")
    env.add_argument("--dpkg", action="append", metavar="GLOB", help="also report these dpkg packages")
    env.set_defaults(handler=cmd_env)

    check = sub.add_parser("check", help="tools, library dirs and files exist")
    check.add_argument("--tool", action="append", metavar="NAME=PATH")
    check.add_argument("--lib", action="append", metavar="DIR")
    check.add_argument("--needs-lib", action="append", metavar="GLOB")
    check.add_argument("--file", action="append", metavar="PATH")
    check.add_argument("--build-dir", action="append", metavar="DIR", help="a CMake build dir to read")
    check.add_argument("--cmake-key", action="append", metavar="KEY", help="a CMakeCache.txt entry to report")
    check.set_defaults(handler=cmd_check)

    hash_ = sub.add_parser("hash", help="sha256 of a file, or the tree digest of a directory")
    hash_.add_argument("path")
    hash_.add_argument("--within", metavar="DIR", help="refuse a path outside DIR")
    hash_.add_argument("--list", action="store_true", help="also list every file's sha256 and size")
    hash_.add_argument("--seal", metavar="FILE", help="write a tree's sha256sum lines to FILE")
    hash_.set_defaults(handler=cmd_hash)

    oom = sub.add_parser("oom", help="the kernel's OOM-killer records and the memory now")
    oom.add_argument("--root", help="prefix of every file read (default $AGENT_SYSROOT or /)")
    oom.add_argument("--last", type=int, default=5)
    oom.set_defaults(handler=cmd_oom)

    cache = sub.add_parser("cache", help="the device cache").add_subparsers(dest="cache_command", required=True)
    usage = cache.add_parser("usage")
    evict = cache.add_parser("evict")
    touch = cache.add_parser("touch")
    for p in (usage, evict, touch):
        p.add_argument("--cache", required=True, metavar="DIR")
    for p in (usage, evict):
        p.add_argument("--ttl-s", type=float, default=MARKER_TTL_S, help="in-use marker TTL (default 6 h)")
    evict.add_argument("--max-bytes", type=int, required=True)
    evict.add_argument("--keep", action="append", metavar="SHA")
    evict.add_argument("--dry-run", action="store_true")
    touch.add_argument("sha")
    usage.set_defaults(handler=cmd_cache_usage)
    evict.set_defaults(handler=cmd_cache_evict)
    touch.set_defaults(handler=cmd_cache_touch)
    return parser


def _fail(kind: str, message: object) -> None:
    sys.stderr.write(f"agent: {kind}: {' '.join(str(message).split())}\n")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        result, code, note = args.handler(args)
    except AgentError as exc:
        _fail(exc.kind, exc)
        return exc.exit_code
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(Infrastructure.kind, f"{where}{exc.strerror or exc}")
        return Infrastructure.exit_code
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        line = tb.tb_lineno if tb is not None else "?"
        _fail(AgentError.kind, f"{type(exc).__name__}: {exc} (agent.py line {line})")
        return AgentError.exit_code
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    if note:
        sys.stderr.write(f"agent: {' '.join(note.split())}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
