#!/usr/bin/env python3
"""The farm's agent on a device: one self-contained file, run with the board's own ``python3``.

The farm pushes this file into the device cache (``<work_dir>/cache/<sha256 of this file>``) and runs it as
``python3 -I -S <that path> SUBCOMMAND ...``; nothing else of ours is installed on the board. It needs Python 3.8+
(JetPack 5's) and the standard library only, on Linux (aarch64, x86_64). It may run the board's own tools
(``nvpmodel``, ``jetson_clocks``, ``nvidia-smi``), found on PATH, always with an argv list, ``LC_ALL=C`` and a short
timeout; each is optional: a tool that is absent, fails or times out makes its fields null, never a crash.

Every subcommand prints ONE JSON object on one line of stdout (keys sorted). On failure (exit 2, 3, 4) it prints
nothing on stdout and one line ``agent: <kind>: <message>`` on stderr; a "no" answer (exit 1) prints its JSON and
one line ``agent: check: ...`` or ``agent: evict: ...`` on stderr.

Exit codes:
  0  done, and the answer is yes (``check`` found no problem, ``evict`` got the cache under the limit)
  1  done, and the answer is no: ``check`` found problems, or ``evict`` could not get under ``--max-bytes``
     because what is left is in use or kept (its JSON still comes on stdout and says why)
  2  bad input: an unknown option, a name that is not a sha256, a path outside ``--within``, a symlink where a
     file or directory was asked for, a missing path to hash or entry to touch
  3  infrastructure: a read or write failed (permissions, I/O, a full disk), or the cache lock was not free in time
  4  a bug in this agent (the message names the exception and the line)

``env [--root DIR] [--work-dir DIR] [--dpkg GLOB ...]``: what a benchmark result depends on. ``--root``
(default ``$AGENT_SYSROOT`` or ``/``; a test seam for a fake board) prefixes every file read; tools come from PATH;
``--work-dir`` (default the current directory) is where the free disk is measured; ``--dpkg`` adds packages to
"packages". Host names and user names are never printed. Keys:
  schema                  1 (this layout)
  python                  "3.10.12"; python_implementation "CPython"
  system, machine         "Linux", "aarch64" (machine: /proc/sys/kernel/arch, else uname)
  kernel, kernel_build    uname's release and version
  libc                    "glibc 2.35"
  cpu_count, cpus_usable  os.cpu_count() and the CPUs this process may run on
  cpu_model               /proc/cpuinfo "model name" (x86; aarch64 kernels print none)
  board_model             /proc/device-tree/model, else /sys/devices/virtual/dmi/id/product_name
  memory_total_bytes, memory_available_bytes   /proc/meminfo MemTotal, MemAvailable
  disk_total_bytes, disk_free_bytes            the file system holding --work-dir
  l4t        {"release": "36.4.3", "source", "board", "eabi", "gcid", "date", "kernel_variant"}: from
             /etc/nv_tegra_release (R<major> + "." + REVISION), else the dpkg version of nvidia-l4t-core
  jetpack    {"version": "6.2.1", "source"}: dpkg nvidia-jetpack, else a table of L4T releases (source "l4t table")
  packages   {name: dpkg version} of the installed packages named in DPKG_PACKAGES (the platform: L4T, JetPack,
             CUDA, cuDNN, the driver) or matching a ``--dpkg`` glob (a toolchain names its own runtime's
             packages: this file names none), read from /var/lib/dpkg/status directly ({} when none is there)
  cuda       {"version": "12.6.68", "source"}: /usr/local/cuda/version.json, version.txt, then dpkg
             cuda-toolkit-X-Y, cuda-runtime-X-Y, cuda-cudart-X-Y (the highest X-Y)
  gpu_driver {"version": "540.4.0", "source"}: /proc/driver/nvidia/version, else nvidia-smi
  gpus       [{"index", "name", "driver_version", "compute_cap", "memory_total_mib", "sm_clock_mhz",
             "sm_clock_max_mhz", "mem_clock_mhz", "mem_clock_max_mhz", "persistence_mode", "power_limit_w",
             "temperature_c"}] from nvidia-smi (a field the driver does not support is null)
  power_mode {"name": "MAXN", "id": 0, "source": "nvpmodel -q"}
  clocks_locked  true when the online CPUs, the GPU and the EMC all run at their max; false when one of them is
             known to run below it; null when that cannot be decided. From ``jetson_clocks --show`` (it needs
             root), else from sysfs when a GPU devfreq node exists (cpufreq policy*/scaling_cur_freq against
             scaling_max_freq, the GPU devfreq node and the EMC clock below)
  clocks     {"source", "cpu_online", "cpu_at_max" (CPUs, or cpufreq policies when the source is sysfs),
             "gpu": {"cur_hz", "min_hz", "max_hz"}, "emc": {...}}
  gpu_clock  {"device", "devices", "cur_hz", "min_hz", "max_hz", "governor", "source"}: /sys/class/devfreq/<name>
             for a name holding one of GPU_DEVFREQ_HINTS (17000000.ga10b or 17000000.gpu on Orin, gpu-gpc-0 on Thor)
  emc_clock  {"cur_hz", "min_hz", "max_hz", "source"}: /sys/class/devfreq/bwmgr (Hz), else
             /sys/kernel/debug/bpmp/debug/clk/emc/{rate,min_rate,max_rate} (debugfs, root only)
  thermal    [{"zone": "thermal_zone0", "type": "cpu-thermal", "temp_c": 45.5}] from /sys/class/thermal
  unavailable  [{"field", "why"}]: every field above that is null (and every null inside thermal, gpu_clock,
             emc_clock), with the reason; the paths named are relative to --root
  Not read: tegrastats (a sampler that runs until killed; the same temperatures and clocks come from sysfs).

``check [--tool NAME=PATH ...] [--lib DIR ...] [--needs-lib GLOB ...] [--file PATH ...] [--build-dir DIR ...]
[--cmake-key KEY ...]``: whether each tool exists and is executable (a PATH without "/" is looked up on PATH), each
library dir is a directory, each ``--needs-lib`` glob (a file name pattern such as ``libcudart.so*``) matches a file
in at least one ``--lib`` dir, and each ``--file`` is a regular file (a symlink to one counts). Each ``--build-dir``
is a CMake build directory: its ``CMakeCache.txt`` is read for the project's name and version
(``CMAKE_PROJECT_NAME``, ``CMAKE_PROJECT_VERSION``), its build type, the source dir (``CMAKE_HOME_DIRECTORY``)
and the ``--cmake-key`` entries asked for; the source's git revision is read from its ``.git`` (HEAD, the ref it
names, packed-refs; no git binary needed). Keys: ok, problems (one line each, naming the path and what is wrong),
tools {NAME: resolved path or null}, libs {GLOB: the first matching path or null}, builds {DIR: {"project",
"version", "build_type", "source_dir", "revision", "cache": {KEY: value}}} (null where not found; a missing
``CMakeCache.txt`` is a problem).

``hash PATH [--within DIR]``: sha256 of a file, or the tree digest of a directory: the sha256 of the lines that
``cd PATH && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum`` prints (so it equals ``sha256sum``
of a ``.sha256sums`` seal made that way; an empty directory hashes the empty text). Names holding a backslash or a
newline are escaped as sha256sum does; a name holding a carriage return is refused (coreutils before 9.0 and after
write it differently). Symlinks anywhere and special files are refused, never followed; with ``--within``, a PATH
not strictly inside DIR is refused. Keys: kind ("file" or "tree"), sha256, files, bytes; with ``--list`` also
listing [{"path": "./a/b", "sha256", "bytes"}] (a tree's files, in digest order). ``--seal FILE`` (trees only) writes
those sha256sum lines to FILE atomically while hashing (so ``sha256sum FILE`` is the digest): the seal of a cache
entry, made without reading the files twice.

``oom [--root DIR] [--last N]``: the kernel's OOM-killer records a job can be told from, read from the kernel log
files under the root (``var/log/kern.log``, ``var/log/syslog``; ``dmesg`` needs root on most boards and is not
run), the last N (default 5), oldest first, and the memory now. Keys: kills [{"pid", "comm", "total_vm_kb",
"anon_rss_kb", "line"}], sources (the files read), memory_total_bytes, memory_available_bytes.

``cache usage|evict|touch``: the device cache is a directory of entries named by their sha256 (a file or a
directory), each with an optional seal ``<sha>.sha256sums``; uploads in progress are ``.<sha>.partial-*`` (listed,
never counted as entries, never removed). Names given on the command line must be 64 lowercase hex digits (so
never "..", "/" or an absolute path); a symlink in the cache is never an entry and never followed. A missing cache
directory is an empty cache.
  Last use of an entry: the latest of its own mtime and ctime (ctime moves when the entry is renamed into place,
  so a fresh upload counts as used even when tar restored an old mtime) and the mtimes of its in-use markers.
  In-use markers: files ``<cache>/.inuse/<sha>.<tag>`` (any tag, e.g. a job id). A marker holds whitespace-
  separated ``key=value`` words, all optional: ``pid=<pid>`` and ``boot=<contents of
  /proc/sys/kernel/random/boot_id>``. The entry is in use while one of its markers is active: its pid is alive
  (and, when boot= is given, on this boot), or the marker was modified less than the TTL ago (``--ttl-s``,
  default MARKER_TTL_S = 6 h; touching a marker extends it). A job marks an entry and runs on it with
  ``sh -c 'mkdir -p cache/.inuse && printf "pid=%s boot=%s\\n" $$ "$(cat /proc/sys/kernel/random/boot_id)"
  > cache/.inuse/<sha>.<job> && exec <tool> ...'`` (exec keeps the pid) and removes the marker when done; a marker
  left by a crash stops counting once its pid is gone and the TTL has passed.
  ``cache usage --cache DIR [--ttl-s S]``: keys exists, entries (LRU first: {"sha256", "kind", "bytes" (the
  regular files' sizes plus the seal's), "files", "sealed", "last_use" (epoch s), "in_use", "in_use_by" (active
  marker tags), "markers": [{"tag", "pid", "pid_alive", "age_s", "active"}]}), total_bytes, entry_count, partials
  [{"name", "bytes", "mtime"}], partial_bytes, other [{"name", "why"}] (what is neither), ttl_s.
  ``cache evict --cache DIR --max-bytes N [--keep SHA ...] [--ttl-s S] [--dry-run]``: under an exclusive lock
  (``<cache>/.lock``; two evicts never interleave), removes least-recently-used entries (each with its seal and
  markers) until the total is at most N, never one in use or kept. An entry is first renamed to
  ``.<sha>.evicting-<pid>`` and its markers are read again; marked meanwhile, it is put back. Stale markers of
  missing entries and what an interrupted evict left are removed too. Keys: ok, dry_run, max_bytes, total_bytes
  (after), freed_bytes, removed [{"sha256", "bytes", "last_use"}], blocked [{"sha256", "bytes", "why"}] (passed
  over while still above N), markers_removed, leftovers_removed. Exit 1 when it could not get under N.
  ``cache touch --cache DIR SHA``: sets the entry's mtime to now (its last use). Keys: sha256, last_use.
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


def _int(text):
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def _number(text):
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


def _upstream(version):
    """The upstream part of a Debian version: "1:10.3.0.30-1+cuda12.5" -> "10.3.0.30"."""
    version = version.split(":", 1)[1] if re.match(r"\d+:", version) else version
    return version.rsplit("-", 1)[0] if "-" in version else version


def _scrub(text):
    """Tool messages go out without this machine's host name or user name (whole words)."""
    secrets = {os.uname().nodename, os.environ.get("USER", ""), os.environ.get("LOGNAME", "")}
    with contextlib.suppress(Exception):
        import pwd
        secrets.add(pwd.getpwuid(os.getuid()).pw_name)
    for secret in sorted(s for s in secrets if len(s) >= 2):
        text = re.sub(r"(?<![\w.-])" + re.escape(secret) + r"(?![\w-])", "<redacted>", text)
    return text


def _first_line(data):
    for line in data.decode("utf-8", "replace").splitlines():
        if line.strip():
            return _scrub(line.strip()[:200])
    return ""


def _run_tool(name, args, timeout=TOOL_TIMEOUT_S):
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


class SysRoot:
    """Reads the board's files under a root directory; names in messages are relative to the root."""

    def __init__(self, root):
        self.root = root

    def path(self, rel):
        return os.path.join(self.root, rel.lstrip("/"))

    def read(self, rel, limit=1 << 20):
        """(text, None) or (None, why)."""
        try:
            with open(self.path(rel), "rb") as f:
                data = f.read(limit)
        except FileNotFoundError:
            return None, f"{rel} not found"
        except OSError as exc:
            return None, f"{rel}: {exc.strerror or exc}"
        return data.decode("utf-8", "replace"), None

    def listdir(self, rel):
        try:
            return sorted(os.listdir(self.path(rel)))
        except OSError:
            return []


class Report:
    def __init__(self):
        self.data = {}
        self.unavailable = []

    def put(self, field, value, why=None):
        self.data[field] = value
        if value is None:
            self.missing(field, why or "unknown")

    def missing(self, field, why):
        self.unavailable.append({"field": field, "why": why})


# -------------------------------------------------------------------------------------------------------- parsers


def parse_tegra_release(text):
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


def parse_dpkg_status(lines, wanted=DPKG_PACKAGES.match):
    """{package: version} of the installed packages for whose name ``wanted(name)`` is true."""
    found = {}
    name = version = status = None

    def flush():
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


def parse_meminfo(text):
    values = {}
    for line in text.splitlines():
        match = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    return values


def parse_cuda_version(text, json_file):
    if json_file:
        try:
            version = json.loads(text).get("cuda", {}).get("version")
        except (ValueError, AttributeError):
            return None
        return version if isinstance(version, str) and version else None
    match = re.search(r"CUDA Version\s+(\d+(?:\.\d+)*)", text)
    return match.group(1) if match else None


def parse_driver_version(text):
    """/proc/driver/nvidia/version: the first dotted number after "NVRM version:"."""
    match = re.search(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|\Z)", text)
    return match.group(1) if match else None


def parse_nvpmodel(text):
    """``nvpmodel -q``: "NV Power Mode: MAXN" then the mode number on the next line (warnings may come first)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        match = re.match(r"NV Power Mode\s*:\s*(\S.*)\Z", line)
        if match:
            mode_id = int(lines[i + 1]) if i + 1 < len(lines) and re.match(r"\d+\Z", lines[i + 1]) else None
            return {"name": match.group(1).strip(), "id": mode_id}
    return None


def _freqs(words):
    kv = dict(re.findall(r"(\w+)=(\S+)", words))
    return {"cur_hz": _int(kv.get("CurrentFreq", "")), "min_hz": _int(kv.get("MinFreq", "")),
            "max_hz": _int(kv.get("MaxFreq", "")), "online": kv.get("Online", "1") == "1"}


def parse_jetson_clocks(text):
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


def decide_locked(cpus, gpu, emc):
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


def parse_nvidia_smi(text, fields):
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row:
            continue
        values = dict(zip(fields, (v.strip() for v in row)))  # noqa: B905 (zip's strict= is Python 3.10+)
        gpu = {}
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


# ------------------------------------------------------------------------------------------------------------ env


def _env_host(report, sysroot, work_dir):
    uname = os.uname()
    report.put("python", platform.python_version())
    report.put("python_implementation", platform.python_implementation())
    report.put("system", uname.sysname)
    # the kernel's own answer (sysctl kernel.arch, Linux 5.x+) read through the root, so a fake board's root says
    # what its board is; uname's where the file is absent
    arch, _ = sysroot.read("/proc/sys/kernel/arch")
    report.put("machine", arch.strip() if arch and arch.strip() else uname.machine)
    report.put("kernel", uname.release)
    report.put("kernel_build", uname.version)
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        libc = None
    report.put("libc", libc or None, "confstr CS_GNU_LIBC_VERSION unknown (not glibc)")
    report.put("cpu_count", os.cpu_count(), "os.cpu_count() unknown")
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    report.put("cpus_usable", usable, "sched_getaffinity unavailable")

    text, why = sysroot.read("/proc/cpuinfo")
    model = None
    if text is not None:
        match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        model = match.group(1).strip() if match else None
        why = "no 'model name' in /proc/cpuinfo (aarch64 kernels print none)"
    report.put("cpu_model", model, why)

    board, whys = None, []
    for rel in ("/proc/device-tree/model", "/sys/devices/virtual/dmi/id/product_name"):
        text, why = sysroot.read(rel)
        board = text.replace("\x00", "").strip() if text is not None else None
        if board:
            break
        whys.append(why or f"{rel} is empty")
    report.put("board_model", board or None, "; ".join(whys))

    text, why = sysroot.read("/proc/meminfo")
    mem = parse_meminfo(text) if text is not None else {}
    for field, key in (("memory_total_bytes", "MemTotal"), ("memory_available_bytes", "MemAvailable")):
        report.put(field, mem.get(key), why or f"no {key} in /proc/meminfo")

    try:
        usage = shutil.disk_usage(work_dir)
        total, free, why = usage.total, usage.free, None
    except OSError as exc:
        total, free, why = None, None, f"work dir: {exc.strerror or exc}"
    report.put("disk_total_bytes", total, why)
    report.put("disk_free_bytes", free, why)


def _pick_highest(packages, pattern):
    """(name, version) of the package matching ``pattern`` (groups = numbers) with the highest numbers."""
    best = None
    for name, version in packages.items():
        match = re.match(pattern, name)
        if match:
            key = tuple(int(g) for g in match.groups())
            if best is None or key > best[0]:
                best = (key, name, version)
    return (best[1], best[2]) if best else (None, None)


def _env_versions(report, sysroot, globs):
    packages, dpkg_why = None, None
    path = sysroot.path("/var/lib/dpkg/status")
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            packages = dict(sorted(parse_dpkg_status(f, lambda name: bool(DPKG_PACKAGES.match(name)) or any(
                fnmatch.fnmatchcase(name, g) for g in globs)).items()))
    except FileNotFoundError:
        dpkg_why = "/var/lib/dpkg/status not found"
    except OSError as exc:
        dpkg_why = f"/var/lib/dpkg/status: {exc.strerror or exc}"
    report.put("packages", packages, dpkg_why)
    pkgs = packages or {}

    def from_dpkg(*names):
        for name in names:
            if name in pkgs:
                return name, pkgs[name]
        return None, None

    def no_pkg(what):
        return dpkg_why or f"no {what} package installed in dpkg"

    text, why = sysroot.read("/etc/nv_tegra_release")
    l4t = parse_tegra_release(text) if text is not None else None
    if l4t:
        l4t["source"] = "/etc/nv_tegra_release"
    else:
        whys = [why or "/etc/nv_tegra_release: no '# R<n> (...), REVISION: x.y' line"]
        name, version = from_dpkg("nvidia-l4t-core")
        if name:
            l4t = {"release": _upstream(version), "source": "dpkg nvidia-l4t-core", "board": None, "eabi": None,
                   "gcid": None, "date": None, "kernel_variant": None}
        whys.append(no_pkg("nvidia-l4t-core"))
        why = "; ".join(whys)
    report.put("l4t", l4t, why)

    name, version = from_dpkg("nvidia-jetpack")
    jetpack, why = None, None
    if name:
        jetpack = {"version": re.split(r"[+~-]", _upstream(version))[0], "source": "dpkg nvidia-jetpack"}
    elif l4t:
        release = l4t["release"]
        mapped = JETPACK_OF_L4T.get(release) or JETPACK_OF_L4T.get(".".join(release.split(".")[:2]))
        jetpack = {"version": mapped, "source": "l4t table"} if mapped else None
        why = f"{no_pkg('nvidia-jetpack')}; L4T {release} is not in the agent's table"
    else:
        why = f"{no_pkg('nvidia-jetpack')}; L4T unknown"
    report.put("jetpack", jetpack, why)

    cuda, whys = None, []
    for rel, is_json in (("/usr/local/cuda/version.json", True), ("/usr/local/cuda/version.txt", False)):
        text, why = sysroot.read(rel)
        found = parse_cuda_version(text, is_json) if text is not None else None
        if found:
            cuda = {"version": found, "source": rel}
            break
        whys.append(why or f"{rel}: no CUDA version in it")
    if cuda is None:
        for prefix in ("cuda-toolkit", "cuda-runtime", "cuda-cudart"):
            name, version = _pick_highest(pkgs, re.escape(prefix) + r"-(\d+)-(\d+)\Z")
            if name:
                cuda = {"version": _upstream(version), "source": f"dpkg {name}"}
                break
        whys.append(no_pkg("cuda-toolkit-X-Y, cuda-runtime-X-Y or cuda-cudart-X-Y"))
    report.put("cuda", cuda, "; ".join(whys))


def _env_gpu(report, sysroot):
    text, proc_why = sysroot.read("/proc/driver/nvidia/version")
    driver = None
    if text is not None:
        found = parse_driver_version(text)
        driver = {"version": found, "source": "/proc/driver/nvidia/version"} if found else None
        proc_why = "/proc/driver/nvidia/version: no 'NVRM version: ... <n.n.n>'"

    gpus, smi_why = None, None
    fields = NVIDIA_SMI_FIELDS
    for attempt in range(2):
        out, smi_why = _run_tool("nvidia-smi", [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                                 NVIDIA_SMI_TIMEOUT_S)
        if out is not None:
            gpus = parse_nvidia_smi(out, fields) or None
            smi_why = None if gpus else "nvidia-smi listed no GPU"
            break
        if attempt == 1 or "valid field" not in (smi_why or ""):
            break
        fields = tuple(f for f in NVIDIA_SMI_FIELDS if f != "compute_cap")  # older drivers lack compute_cap
    report.put("gpus", gpus, smi_why)
    if driver is None and gpus and gpus[0].get("driver_version"):
        driver = {"version": gpus[0]["driver_version"], "source": "nvidia-smi"}
    report.put("gpu_driver", driver, f"{proc_why}; {smi_why or 'nvidia-smi gave no driver version'}")


def _devfreq(sysroot, name):
    base = f"/sys/class/devfreq/{name}"
    values = {}
    for key, leaf in (("cur_hz", "cur_freq"), ("min_hz", "min_freq"), ("max_hz", "max_freq")):
        text, _ = sysroot.read(f"{base}/{leaf}")
        values[key] = _int(text) if text is not None else None
    text, _ = sysroot.read(f"{base}/governor")
    values["governor"] = text.strip() if text else None
    values["source"] = base
    return values


def _env_clocks(report, sysroot):
    out, why = _run_tool("nvpmodel", ["-q"])
    mode = parse_nvpmodel(out) if out is not None else None
    if mode:
        mode["source"] = "nvpmodel -q"
    report.put("power_mode", mode, why or "nvpmodel -q printed no 'NV Power Mode: <name>' line")

    names = [n for n in sysroot.listdir("/sys/class/devfreq") if any(h in n.lower() for h in GPU_DEVFREQ_HINTS)]
    gpu_clock = None
    if names:
        gpu_clock = _devfreq(sysroot, names[0])
        gpu_clock.update(device=names[0], devices=names)
        for key in ("cur_hz", "min_hz", "max_hz", "governor"):
            if gpu_clock[key] is None:
                report.missing(f"gpu_clock.{key}", f"{gpu_clock['source']}: not readable")
    hints = ", ".join(GPU_DEVFREQ_HINTS)
    report.put("gpu_clock", gpu_clock, f"no GPU node in /sys/class/devfreq (a name holding {hints})")

    emc_clock, whys = None, []
    bwmgr = _devfreq(sysroot, "bwmgr")
    if bwmgr["cur_hz"] is not None:
        del bwmgr["governor"]
        emc_clock = bwmgr
    else:
        whys.append("/sys/class/devfreq/bwmgr/cur_freq not readable")
        base = "/sys/kernel/debug/bpmp/debug/clk/emc"
        rate, why = sysroot.read(f"{base}/rate")
        if rate is not None and _int(rate) is not None:
            emc_clock = {"cur_hz": _int(rate), "source": base}
            for key, leaf in (("min_hz", "min_rate"), ("max_hz", "max_rate")):
                text, _ = sysroot.read(f"{base}/{leaf}")
                emc_clock[key] = _int(text) if text is not None else None
        else:
            whys.append(f"{why} (debugfs, root only)" if why else f"{base}/rate is not a number")
    if emc_clock:
        for key in ("min_hz", "max_hz"):
            if emc_clock[key] is None:
                report.missing(f"emc_clock.{key}", f"{emc_clock['source']}: not readable")
    report.put("emc_clock", emc_clock, "; ".join(whys))

    out, jc_why = _run_tool("jetson_clocks", ["--show"])
    clocks, locked, why = None, None, None
    if out is not None:
        shown = parse_jetson_clocks(out)
        locked, why = decide_locked(shown["cpus"], shown["gpu"], shown["emc"])
        online = [c for c in shown["cpus"] if c["online"]]
        clocks = {"source": "jetson_clocks --show", "cpu_online": len(online),
                  "cpu_at_max": sum(1 for c in online if c["cur_hz"] is not None and c["cur_hz"] == c["max_hz"]),
                  "gpu": shown["gpu"], "emc": shown["emc"]}
        why = f"jetson_clocks --show: {why}" if why else None
    elif gpu_clock is not None:
        cpus = []
        for policy in sysroot.listdir("/sys/devices/system/cpu/cpufreq"):
            if re.match(r"policy\d+\Z", policy):
                cur, _ = sysroot.read(f"/sys/devices/system/cpu/cpufreq/{policy}/scaling_cur_freq")
                top, _ = sysroot.read(f"/sys/devices/system/cpu/cpufreq/{policy}/scaling_max_freq")
                cur, top = _int(cur) if cur else None, _int(top) if top else None
                cpus.append({"cur_hz": cur * 1000 if cur is not None else None,
                             "max_hz": top * 1000 if top is not None else None, "min_hz": None, "online": True})

        def unit(values):
            return None if values is None else {k: values.get(k) for k in ("cur_hz", "min_hz", "max_hz")}

        locked, why = decide_locked(cpus, unit(gpu_clock), unit(emc_clock))
        clocks = {"source": "sysfs", "cpu_online": len(cpus),
                  "cpu_at_max": sum(1 for c in cpus if c["cur_hz"] is not None and c["cur_hz"] == c["max_hz"]),
                  "gpu": unit(gpu_clock), "emc": unit(emc_clock)}
        why = f"{jc_why}; sysfs: {why}" if why else None
    else:
        why = f"{jc_why}; no GPU devfreq node to read the clocks from instead"
        jc_why = why
    report.put("clocks_locked", locked, why)
    report.put("clocks", clocks, jc_why)


def _env_thermal(report, sysroot):
    zones = [n for n in sysroot.listdir("/sys/class/thermal") if re.match(r"thermal_zone\d+\Z", n)]
    zones.sort(key=lambda n: int(n[len("thermal_zone"):]))
    thermal = []
    for zone in zones:
        kind, _ = sysroot.read(f"/sys/class/thermal/{zone}/type")
        temp, why = sysroot.read(f"/sys/class/thermal/{zone}/temp")
        milli = _int(temp) if temp is not None else None
        if milli is None:
            report.missing(f"thermal.{zone}", why or f"/sys/class/thermal/{zone}/temp is not a number")
        thermal.append({"zone": zone, "type": kind.strip() if kind else None,
                        "temp_c": None if milli is None else milli / 1000.0})
    report.put("thermal", thermal or None, "no /sys/class/thermal/thermal_zone*")


def cmd_env(args):
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
    sysroot, report = SysRoot(root), Report()
    report.put("schema", SCHEMA)
    _env_host(report, sysroot, work_dir)
    _env_versions(report, sysroot, globs)
    _env_gpu(report, sysroot)
    _env_clocks(report, sysroot)
    _env_thermal(report, sysroot)
    report.data["unavailable"] = report.unavailable
    return report.data, 0, None


# ---------------------------------------------------------------------------------------------------------- check


def cmd_check(args):
    problems, tools, libs = [], {}, {}
    for spec in args.tool or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise BadInput(f"--tool {spec!r}: expected NAME=PATH")
        if name in tools:
            raise BadInput(f"--tool {name}: given twice")
        tools[name] = None
        if "/" not in path:
            found = shutil.which(path)
            if found is None:
                problems.append(f"tool {name}: {path} not found on PATH")
                continue
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
            tools[name] = path
    lib_dirs = []
    for lib in args.lib or []:
        if not os.path.exists(lib):
            problems.append(f"lib dir {lib} does not exist")
        elif not os.path.isdir(lib):
            problems.append(f"lib dir {lib} is not a directory")
        else:
            lib_dirs.append(lib)
    if args.needs_lib and not args.lib:
        raise BadInput("--needs-lib needs at least one --lib DIR to search")
    for pattern in args.needs_lib or []:
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
            problems.append(f"library {pattern}: no such file in {', '.join(args.lib)}")
    for path in args.file or []:
        if not os.path.lexists(path):
            problems.append(f"file {path} does not exist")
        elif not os.path.exists(path):
            problems.append(f"file {path} is a dangling symlink")
        elif not os.path.isfile(path):
            problems.append(f"file {path} is not a regular file")
    builds = {}
    for build in args.build_dir or []:
        builds[build] = _cmake_build(build, args.cmake_key or [], problems)
    note = f"check: {len(problems)} problem(s), the first: {problems[0]}" if problems else None
    return ({"ok": not problems, "problems": problems, "tools": tools, "libs": libs, "builds": builds},
            (1 if problems else 0), note)


CMAKE_ENTRY = re.compile(r"([A-Za-z_][A-Za-z0-9_.+-]*):[A-Z]+=(.*)\Z")


def _cmake_build(build, keys, problems):
    """What a CMake build dir's CMakeCache.txt and its source's git say about it (module doc: check)."""
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


def _git_revision(source):
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


def _common_dir(git):
    try:
        with open(os.path.join(git, "commondir"), encoding="utf-8") as f:
            return os.path.join(git, f.read(4096).strip())
    except OSError:
        return git


# ----------------------------------------------------------------------------------------------------------- hash


def _show(path):
    return os.fsdecode(path).encode("utf-8", "backslashreplace").decode("utf-8")


def _sha256_open(path):
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


def tree_files(top):
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


def tree_digest(top, listing=None, seal=None):
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


def _inside(path, within):
    base = os.path.realpath(within)
    real = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
    return real != base and os.path.commonpath([real, base]) == base


def cmd_hash(args):
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


def cmd_oom(args):
    root = args.root or os.environ.get("AGENT_SYSROOT") or "/"
    if args.last < 1:
        raise BadInput(f"--last {args.last}: must be at least 1")
    sysroot, kills, sources = SysRoot(root), [], []
    for rel in OOM_LOGS:
        text, _ = sysroot.read(rel, limit=1 << 24)
        if text is None:
            continue
        sources.append(rel)
        for line in text.splitlines():
            found = OOM_LINE.search(line)
            if found:
                pid, comm, vm, rss = found.groups()
                kills.append({"pid": int(pid), "comm": comm, "total_vm_kb": int(vm) if vm else None,
                              "anon_rss_kb": int(rss) if rss else None, "line": line.strip()[:500]})
    mem_text, _ = sysroot.read("/proc/meminfo")
    mem = parse_meminfo(mem_text) if mem_text is not None else {}
    return {"kills": kills[-args.last:], "sources": sources, "memory_total_bytes": mem.get("MemTotal"),
            "memory_available_bytes": mem.get("MemAvailable")}, 0, None


# ---------------------------------------------------------------------------------------------------------- cache


def _sha_arg(text, what):
    if not SHA_RE.match(text):
        raise BadInput(f"{what} {text!r}: not a sha256 (64 lowercase hex digits)")
    return text


def _cache_dir(path):
    """The cache dir, or None when it does not exist (an empty cache)."""
    if not os.path.lexists(path):
        return None
    if not os.path.isdir(path):
        raise BadInput(f"--cache {path}: not a directory")
    return path


def _usage_of(path):
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


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _pid_alive(pid):
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


def _read_marker(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        text = f.read(4096).decode("ascii", "replace")
    return dict(re.findall(r"(\w+)=(\S+)", text))


def markers(cache, ttl_s, now, boot):
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


def scan_cache(cache, ttl_s):
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


def _remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


@contextlib.contextmanager
def _cache_lock(cache):
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


def _evict_one(cache, sha, ttl_s):
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


def cmd_cache_usage(args):
    result, _ = scan_cache(_cache_dir(args.cache), args.ttl_s)
    return result, 0, None


def cmd_cache_evict(args):
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


def cmd_cache_touch(args):
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
    def error(self, message):
        raise BadInput(f"{self.prog}: {message}")


def build_parser():
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


def _fail(kind, message):
    sys.stderr.write(f"agent: {kind}: {' '.join(str(message).split())}\n")


def main(argv=None):
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
