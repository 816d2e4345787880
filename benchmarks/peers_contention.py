"""`peers.py --contention`: edgellm vs onnxruntime-genai decode on the CPU, quiet and under a competing CPU job.

Each stack runs in its own worker process (the same worker as peers.py: same thread count, one untimed warm-up
generation) that times one generation on the machine as it is ("quiet") and one while a competing job runs
("contended"): ``--load-procs`` busy processes (a pure-Python integer loop each: deterministic, no memory traffic,
one core each), started before the timed generation (the worker waits until every one is spinning) and stopped right
after it. Rounds alternate the stacks and the order of the two cases, so load from elsewhere on a shared machine hits
all alike; the medians over rounds are compared as ratios edgellm / onnxruntime-genai (decode tokens/s; TTFT as
theirs / ours), with the median of the per-round (paired) ratios beside them.

edgellm opens its ONNX Runtime session with intra-op spinning "auto" (edgellm.backends.thread_policy: spin only
with an idle CPU per intra-op thread, measured at open); its worker opens the session again in each case after the
competing job has started (then one untimed warm-up generation), so the choice is made under that case's load, as by
a service opened on a host already running its other job. edgellm-nospin and edgellm-spin open the same engine once
with spinning off / on: the fixed settings the choice picks from (edgellm-spin's contended case is also what "auto"
costs when the load comes after the session chose to spin: ONNX Runtime cannot change spinning on an open session).

Every timed generation records the load average before it, the machine's busy CPUs during it (from /proc/stat), the
worker's own CPU time (a stack whose intra-op threads spin burns CPU time while it waits), and the competing job's
work rate (the share of the CPUs it got). The machine is shared: "quiet" means no competing job of ours, not an idle
machine; the JSON says how busy it was.

    PYTHONPATH=. .venv/bin/python benchmarks/peers.py --contention [--models qwen2.5-0.5b-shape] [--repeats 5]
        [--load-procs 2] [--threads 2] [--quick] [--output benchmarks/results/peers-contention.json]

``--quick``: stories260K and the 0.5B shape, one round of 16 new tokens (onnxruntime-genai cannot run stories260K:
its CPU GroupQueryAttention needs a head size that is a multiple of 16, and stories260K's is 8; reported as n/a).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import peers  # noqa: E402  # the builds, prompts and the worker of the side-by-side benchmark

# edgellm: its default session (spinning "auto", chosen under each case's load); edgellm-nospin / edgellm-spin: the
# same engine with spinning off / on whatever the load (the A/B of edgellm.backends.ort.INTRA_OP_SPINNING's choices)
STACKS = ("edgellm", "edgellm-nospin", "edgellm-spin", "onnxruntime-genai")
FIXED_SPINNING = ("edgellm-nospin", "edgellm-spin")
REOPENED = ("edgellm",)  # stacks whose session is opened again under each case's load
CASES = ("quiet", "contended")
# edgellm decode / onnxruntime-genai decode, per case
TARGETS = {"contended": 0.9, "quiet": 1.0}
DEFAULT_OUTPUT = peers.REPO / "benchmarks" / "results" / "peers-contention.json"
QUICK_MODELS = ("stories260K", "qwen2.5-0.5b-shape")


# ------------------------------------------------------------------------------------- the competing job ----
def spin_main() -> int:
    """One busy process: counts in a pure-Python loop until SIGTERM (or its parent is gone), then prints its rate
    (iterations per second) and the CPU seconds it got."""
    stop = False

    def handle(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handle)
    parent = os.getppid()
    print("ready", flush=True)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while not stop:
        n += 1
        if n % 1_000_000 == 0 and os.getppid() != parent:  # orphaned: never outlive the worker
            break
    wall = time.perf_counter() - t0
    print(json.dumps({"rate": n / wall, "cpu_s": time.process_time() - c0, "wall_s": wall}), flush=True)
    return 0


class CompetingLoad:
    """``procs`` spinning processes while the ``with`` block runs; ``result`` afterwards: their rates and CPU."""

    def __init__(self, procs: int) -> None:
        self.procs = procs
        self.result: dict[str, Any] = {}
        self._p: list[subprocess.Popen[str]] = []

    def __enter__(self) -> CompetingLoad:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--spin"]
        try:
            for _ in range(self.procs):
                # its own session, hence its own scheduler autogroup: another tenant's job, not a thread of ours
                self._p.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True))
            for p in self._p:
                if p.stdout is None or p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"competing process {p.pid} did not start (exit {p.poll()})")
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop()

    def _stop(self) -> None:
        for p in self._p:
            if p.poll() is None:
                p.terminate()
        done = []
        for p in self._p:
            out, _ = p.communicate(timeout=30)
            lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
            if lines:
                done.append(json.loads(lines[-1]))
        self._p = []
        # CPUs it got: each process's CPU seconds over its own lifetime (a reopened session's warm-up included)
        self.result = {"procs": self.procs, "rates": [d["rate"] for d in done],
                       "cpus": sum(d["cpu_s"] / d["wall_s"] for d in done if d["wall_s"] > 0)}


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def timed_case(run: Any, new_tokens: int, procs: int, reopen: bool = False) -> dict[str, Any]:
    """One timed generation (``peers._timed_stream``), under ``procs`` competing processes (0: none), with the
    machine's state around it; ``reopen``: the session is opened again (and warmed up) once the competing job runs,
    its settings recorded."""
    load = os.getloadavg()[0]
    competing = CompetingLoad(procs) if procs else None
    if competing is not None:
        competing.__enter__()
    session = None
    try:
        if reopen:
            session = run.reopen()
            peers._timed_stream(lambda: run(min(8, new_tokens)))  # warm-up of the new session
        b0, t0 = _cpu_jiffies()
        r = peers._timed_stream(lambda: run(new_tokens))
        b1, t1 = _cpu_jiffies()
    finally:
        if competing is not None:
            competing.__exit__(None, None, None)
    ncpu = os.cpu_count() or 1
    wall = r["ttft_s"] + r["decode_s"]
    out = {"ttft_ms": r["ttft_s"] * 1e3, "new_tokens": r["new_tokens"],
           "decode_tokens_per_s": (r["new_tokens"] - 1) / r["decode_s"] if r["new_tokens"] > 1 else None,
           "decode_cpu_per_wall": r["decode_cpu_s"] / r["decode_s"] if r["decode_s"] else None,
           "loadavg_1m_before": load,
           "machine_busy_cpus": ncpu * (b1 - b0) / (t1 - t0) if t1 > t0 else None}
    if session is not None:
        out["session_options"] = session
    if competing is not None:
        res = competing.result
        out["competing"] = {"procs": res["procs"], "rates": res["rates"], "cpus": res["cpus"]}
    if out["machine_busy_cpus"] is not None:
        # what neither this worker nor our competing job used: the machine's other tenants
        own = (r["ttft_cpu_s"] + r["decode_cpu_s"]) / wall + out.get("competing", {}).get("cpus", 0.0)
        out["others_busy_cpus"] = max(0.0, out["machine_busy_cpus"] - own)
    return out


def worker_main(args: argparse.Namespace) -> int:
    """One stack: load, warm up, then the two cases in ``args.cases`` order; JSON to ``args.result``."""
    prompt = json.loads(Path(args.prompt_file).read_text())
    t0 = time.perf_counter()
    run = peers.WORKERS[args.worker](Path(args.model_dir), prompt, args.new_tokens, args.threads)
    load_s = time.perf_counter() - t0
    peers._timed_stream(lambda: run(min(8, args.new_tokens)))  # warm-up
    cases = {c: timed_case(run, args.new_tokens, args.load_procs if c == "contended" else 0,
                           reopen=args.worker in REOPENED)
             for c in args.cases.split(",")}
    result: dict[str, Any] = {"load_s": load_s, "cases": cases, "peak_rss_bytes": peers._peak_rss()}
    if args.worker.startswith("edgellm"):
        # what the worker's session was opened with, as it recorded it (the reopened ones: per case, above)
        result["session_options"] = run.settings()
    Path(args.result).write_text(json.dumps(result, indent=2))
    return 0


# -------------------------------------------------------------------------------------------- orchestrator ----
def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from edgellm.config import ModelConfig

    ckpt = peers.prepare_checkpoint(name, args.data_dir)
    cfg = ModelConfig.load(ckpt)
    work = args.data_dir / "work" / f"{name}-contention"
    work.mkdir(parents=True, exist_ok=True)
    prompt = peers.prompt_ids(ckpt, args.prompt_len)
    prompt_file = work / "prompt.json"
    prompt_file.write_text(json.dumps(prompt))
    out: dict[str, Any] = {"checkpoint": str(ckpt), "parameters": cfg.num_parameters_estimate, "stacks": {}}
    ready: dict[str, Path] = {}
    for stack in ("edgellm", "onnxruntime-genai"):
        print(f"[{name}] {stack}: build ...", flush=True)
        b = (peers._build_edgellm(ckpt, work, args, len(prompt)) if stack == "edgellm"
             else peers._build_onnxruntime_genai(ckpt, work, args, len(prompt)))
        # edgellm-nospin and edgellm-spin open edgellm's engine
        for s in ((stack, *FIXED_SPINNING) if stack == "edgellm" else (stack,)):
            if "error" in b:
                out["stacks"][s] = {"error": peers._explain(s, cfg, b["error"])}
                print(f"[{name}] {s}: n/a ({out['stacks'][s]['error']})", flush=True)
                continue
            ready[s] = b["model_dir"]
            out["stacks"][s] = {"build_s": b["build_s"]}
    rounds: list[dict[str, Any]] = []
    for r in range(args.repeats):
        # alternate both the stack order and which case comes first
        order = list(ready) if r % 2 == 0 else list(ready)[::-1]
        cases = CASES if r % 2 == 0 else CASES[::-1]
        this: dict[str, Any] = {"round": r + 1, "order": order, "cases_order": list(cases), "stacks": {}}
        for stack in order:
            if "error" in out["stacks"][stack]:
                continue
            print(f"[{name}] {stack}: round {r + 1}/{args.repeats} ({', '.join(cases)}) ...", flush=True)
            result = work / f"{stack}.result.json"
            result.unlink(missing_ok=True)
            _, err = peers._run_cmd([sys.executable, str(Path(peers.__file__).resolve()), "--contention",
                                     "--worker", stack, "--model-dir", str(ready[stack]),
                                     "--prompt-file", str(prompt_file), "--new-tokens", str(args.new_tokens),
                                     "--threads", str(args.threads), "--load-procs", str(args.load_procs),
                                     "--cases", ",".join(cases), "--result", str(result)],
                                    work / f"{stack}.run.log", args.threads)
            if err:
                out["stacks"][stack]["error"] = peers._explain(stack, cfg, err)
                print(f"[{name}] {stack}: n/a ({out['stacks'][stack]['error']})", flush=True)
                continue
            this["stacks"][stack] = json.loads(result.read_text())
        rounds.append(this)
    out["rounds"] = rounds
    for stack, entry in out["stacks"].items():
        runs = [rd["stacks"][stack] for rd in rounds if stack in rd["stacks"]]
        if "error" in entry or not runs:
            continue
        for case in CASES:
            xs = [x["cases"][case] for x in runs]
            rates = [x["decode_tokens_per_s"] for x in xs if x["decode_tokens_per_s"] is not None]
            cpu = [x["decode_cpu_per_wall"] for x in xs if x["decode_cpu_per_wall"] is not None]
            entry[case] = {"ttft_ms": statistics.median(x["ttft_ms"] for x in xs),
                           "decode_tokens_per_s": statistics.median(rates) if rates else None,
                           "decode_cpu_per_wall": statistics.median(cpu) if cpu else None,
                           "loadavg_1m_before": [x["loadavg_1m_before"] for x in xs],
                           "others_busy_cpus": [x.get("others_busy_cpus") for x in xs]}
            chosen = [x["session_options"]["intra_op_spinning"] for x in xs if "session_options" in x]
            if chosen:  # the "auto" choice per round, and the idle CPUs it was made from
                entry[case]["spinning_chosen"] = [c["spinning"] for c in chosen]
                entry[case]["idle_cpus_at_open"] = [(c["contention"] or {}).get("idle_cpus") for c in chosen]
        entry["peak_rss_bytes"] = max(x["peak_rss_bytes"] for x in runs)
        if "session_options" in runs[0]:
            entry["session_options"] = runs[0]["session_options"]
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def summarize(results: dict[str, Any]) -> None:
    """Ratios and targets per model, in place; print the table."""
    hdr = (f"{'model':<20} {'stack':<18} {'case':<10} {'TTFT ms':>9} {'decode tok/s':>13} {'CPU/wall':>9} "
           f"{'load 1m':>12} {'others CPUs':>12}")
    print("\n" + hdr + "\n" + "-" * len(hdr))
    for model, m in results.items():
        for stack, e in m["stacks"].items():
            if "error" in e:
                print(f"{model:<20} {stack:<18} n/a ({e['error'][:90]})")
                continue
            for case in CASES:
                c = e.get(case)
                if not c:
                    continue
                loads = "-".join(f"{x:.1f}" for x in (min(c["loadavg_1m_before"]), max(c["loadavg_1m_before"])))
                others = [x for x in c["others_busy_cpus"] if x is not None]
                oth = f"{statistics.median(others):.2f}" if others else "-"
                cpu = f"{c['decode_cpu_per_wall']:.2f}" if c["decode_cpu_per_wall"] is not None else "-"
                print(f"{model:<20} {stack:<18} {case:<10} {c['ttft_ms']:>9.1f} "
                      f"{c['decode_tokens_per_s'] or 0:>13.2f} {cpu:>9} {loads:>12} {oth:>12}")
        ours, theirs = m["stacks"].get("edgellm", {}), m["stacks"].get("onnxruntime-genai", {})
        ratios: dict[str, Any] = {}
        targets: dict[str, Any] = {}
        if "error" in ours or "error" in theirs or not ours or not theirs:
            ratios["n/a"] = ours.get("error") or theirs.get("error") or "a stack did not run"
        else:
            for case in CASES:
                paired = []
                for rd in m["rounds"]:
                    a, b = rd["stacks"].get("edgellm"), rd["stacks"].get("onnxruntime-genai")
                    if a and b:
                        paired.append(_ratio(a["cases"][case]["decode_tokens_per_s"],
                                             b["cases"][case]["decode_tokens_per_s"]))
                paired_ok = [p for p in paired if p is not None]
                decode = _ratio(ours[case]["decode_tokens_per_s"], theirs[case]["decode_tokens_per_s"])
                ratios[case] = {"decode_speedup": decode,
                                "decode_speedup_paired_median": statistics.median(paired_ok) if paired_ok else None,
                                "decode_speedup_per_round": paired,
                                "ttft_speedup": _ratio(theirs[case]["ttft_ms"], ours[case]["ttft_ms"])}
                if decode is not None:
                    targets[f"{case}: decode >= {TARGETS[case]}x onnxruntime-genai"] = {
                        "target": TARGETS[case], "measured": decode, "met": decode >= TARGETS[case]}
            for name in STACKS:
                e = m["stacks"].get(name, {})
                if "error" not in e and e.get("contended"):
                    ratios[f"{name} contended / quiet decode"] = _ratio(e["contended"]["decode_tokens_per_s"],
                                                                       e["quiet"]["decode_tokens_per_s"])
            for fixed in FIXED_SPINNING:
                e = m["stacks"].get(fixed, {})
                if "error" in e or not e.get("contended"):
                    continue
                # the A/B: edgellm's choice vs spinning fixed off / on, and those vs the peer
                for case in CASES:
                    ratios[case][f"edgellm / {fixed} decode"] = _ratio(ours[case]["decode_tokens_per_s"],
                                                                      e[case]["decode_tokens_per_s"])
                    ratios[case][f"{fixed} / onnxruntime-genai decode"] = _ratio(
                        e[case]["decode_tokens_per_s"], theirs[case]["decode_tokens_per_s"])
        m["ratios"], m["targets"] = ratios, targets
    print()
    for model, m in results.items():
        r = m["ratios"]
        if "n/a" in r:
            print(f"{model}: edgellm vs onnxruntime-genai: n/a ({str(r['n/a'])[:100]})")
            continue
        for case in CASES:
            x = r[case]
            paired = x["decode_speedup_paired_median"]
            print(f"{model}: {case}: edgellm / onnxruntime-genai decode {x['decode_speedup']:.2f}x "
                  f"(paired per round {paired:.2f}x), TTFT speedup {x['ttft_speedup']:.2f}x")
            for k in [f"{a} decode" for f in FIXED_SPINNING for a in (f"edgellm / {f}", f"{f} / onnxruntime-genai")]:
                if x.get(k) is not None:
                    print(f"{model}: {case}: {k} {x[k]:.2f}x")
            chosen = m["stacks"]["edgellm"][case].get("spinning_chosen")
            if chosen is not None:
                idle = m["stacks"]["edgellm"][case]["idle_cpus_at_open"]
                print(f"{model}: {case}: edgellm spinning chosen per round {chosen} from idle CPUs {idle}")
        for k in (f"{s} contended / quiet decode" for s in STACKS):
            if r.get(k) is not None:
                print(f"{model}: {k}: {r[k]:.2f}")
        for t, v in m["targets"].items():
            print(f"{model}: target {t}: measured {v['measured']:.2f}x {'MET' if v['met'] else 'MISSED'}")


def main(args: argparse.Namespace) -> int:
    if args.worker:
        return worker_main(args)
    if args.load_procs < 1:
        raise SystemExit(f"--load-procs {args.load_procs}: the competing job needs at least 1 process")
    if args.quick:
        args.repeats, args.new_tokens = 1, 16
    models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else (
        list(QUICK_MODELS) if args.quick else ["qwen2.5-0.5b-shape"])
    bad = [m for m in models if m not in peers.MODELS]
    if bad or not models:
        raise SystemExit(f"unknown model {', '.join(bad) or '(none given)'}; models: {', '.join(peers.MODELS)}")
    args.data_dir = args.data_dir.resolve()
    load_at_start = os.getloadavg()
    results = {m: bench_model(m, args) for m in models}
    summarize(results)
    report = {
        "settings": {"precision": "fp32", "batch_size": 1, "prompt_len": args.prompt_len,
                     "new_tokens": args.new_tokens, "repeats": args.repeats, "threads": args.threads,
                     "greedy": True, "quick": args.quick,
                     "edgellm_spinning": "edgellm: 'auto', its session opened again under each case's load; "
                                         "edgellm-nospin / edgellm-spin: off / on, opened once",
                     "competing_job": f"{args.load_procs} processes, each a pure-Python integer loop (one CPU "
                                      f"each, no memory traffic), started before and stopped after each contended "
                                      f"timed generation"},
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "loadavg_at_start": load_at_start,
                    "loadavg_at_end": os.getloadavg(), "python": platform.python_version(),
                    "shared": "other sessions' tests and builds ran on this machine during the benchmark: "
                              "'quiet' means without our competing job, see loadavg_1m_before and "
                              "others_busy_cpus per timed generation"},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "models": results,
    }
    from edgellm.files import write_json_atomic

    write_json_atomic(args.output, json.loads(json.dumps(report, default=str)))
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--spin"]:
        sys.exit(spin_main())
    raise SystemExit("run through benchmarks/peers.py --contention")
