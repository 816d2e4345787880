"""Issue 39 item 2: per-shape tuning data for the torch-CUDA decode kernels, on one GPU, in one call.

    python3 benchmarks/gpu_sweep.py --output OUT.json [--shape qwen2.5-0.5b] [--quick]

For each decode GEMV of the model shape (qkv, o_proj, gate|up with SiLU, down) at 1 and 16 rows it times the
shipped configuration (``kernels.gemv``) and a grid of (BN, BK, split target, warps, stages) with the weights
rotated over enough copies that the L2 cache cannot hold them (a decode step reads every weight from HBM once), each
timed as a CUDA graph of many launches (as the decoder replays them). It also times decode attention: the shipped
split (``kernels.attention_split``) against one pass per query head and other splits, over 128..2048 columns.
(Call 1's data, before these shipped, also timed a norm folded into the next GEMV: slower than the two kernels.)
Prints a table per shape and writes the JSON (times, the best configuration, its bytes per second against the
measured copy bandwidth, the machine and its load).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgellm.backends.torch_cuda import kernels as k

SHAPES = {  # hidden, intermediate, query heads, kv heads, head dim, layers
    "qwen2.5-0.5b": (896, 4864, 14, 2, 64, 24),
    "llama-3.2-1b": (2048, 8192, 32, 8, 64, 16),
}
COPIES_BYTES = 256 << 20  # weights rotated over at least this many bytes (H100/H200 L2: 50-60 MB)


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 10 / (time.perf_counter() - t0)


def graph_time_us(fn, n_calls: int) -> float:
    """Median microseconds of one ``fn`` call, from CUDA graphs of ``n_calls`` calls replayed."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n_calls):
            fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1000 / n_calls)
    return sorted(times)[len(times) // 2]


def launch_gemv(x, w, out, bias, *, n, silu, partial, bn, bk, split_target, warps, stages):
    m, kk = x.shape
    bm = 16
    n_blocks, m_blocks = triton.cdiv(n, bn), triton.cdiv(m, bm)
    split = 1
    if partial:
        split = max(1, min(triton.cdiv(kk, bk), split_target // max(1, n_blocks * m_blocks)))
    k_per = triton.cdiv(triton.cdiv(kk, split), bk) * bk
    split = triton.cdiv(kk, k_per)
    k._gemv_kernel[(n_blocks, split, m_blocks)](
        x, w, bias if bias is not None else x, out, m, n, kk, x.stride(0), w.stride(0), K_PER=k_per, BM=bm, BN=bn,
        BK=bk, SILU=silu, HAS_BIAS=bias is not None and not partial, PARTIAL=partial, IEEE=False,
        num_warps=warps, num_stages=stages)
    return split


def sweep_gemv(name, kk, n_out, silu, partial, rows, quick, bandwidth):
    width = 2 * n_out if silu else n_out
    w_bytes = kk * width * 2
    copies = max(2, COPIES_BYTES // w_bytes)
    ws = [torch.randn(kk, width, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    results = []
    bns = (32, 64, 128, 256) if quick else (16, 32, 64, 128, 256)
    bks = (64, 128, 256) if quick else (32, 64, 128, 256)
    targets = (132, 264) if partial else (0,)
    warps_l = (4, 8) if quick else (2, 4, 8)
    stages_l = (3,) if quick else (2, 3, 4, 5)
    for m in rows:
        x = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
        ref = None
        shipped = None
        for bn, bk, target, warps, stages in itertools.chain(
                [("shipped", None, None, None, None)], itertools.product(bns, bks, targets, warps_l, stages_l)):
            if bn != "shipped" and silu and bn > 128:
                continue
            def run(w, bn=bn, bk=bk, target=target, warps=warps, stages=stages, x=x, m=m):
                if bn == "shipped":
                    return k.gemv(x, w, silu=silu, partial=partial)
                split = 1
                if partial:  # the split launch_gemv chooses, for the output's shape
                    blocks = triton.cdiv(m, 16) * triton.cdiv(n_out, bn)
                    split = max(1, min(triton.cdiv(kk, bk), target // max(1, blocks)))
                    split = triton.cdiv(kk, triton.cdiv(triton.cdiv(kk, split), bk) * bk)
                out = (torch.empty((split, m, n_out), dtype=torch.float32, device="cuda") if partial
                       else torch.empty((m, n_out), dtype=x.dtype, device="cuda"))
                launch_gemv(x, w, out, None, n=n_out, silu=silu, partial=partial, bn=bn, bk=bk, split_target=target,
                            warps=warps, stages=stages)
                return out

            it = itertools.cycle(ws)
            try:
                us = graph_time_us(lambda run=run, it=it: run(next(it)), copies)
            except Exception as exc:  # a configuration Triton cannot compile (shared memory): recorded, skipped
                results.append({"rows": m, "bn": bn, "bk": bk, "split_target": target, "warps": warps,
                                "stages": stages, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                continue
            got = run(ws[0])
            got = (got.sum(0) if partial else got).float()
            if ref is None:
                ref = got
            err = float((got - ref).abs().max())
            row = {"rows": m, "bn": bn, "bk": bk, "split_target": target, "warps": warps, "stages": stages,
                   "us": round(us, 3), "gb_s": round(w_bytes / us / 1e3, 1),
                   "fraction_of_copy": round(w_bytes / (us * 1e-6) / bandwidth, 3), "max_abs_vs_shipped": err}
            if bn == "shipped":
                shipped = row
            results.append(row)
        del x, ref
        best = min((r for r in results if r["rows"] == m and "us" in r and r["bn"] != "shipped"),
                   key=lambda r: r["us"])
        print(f"{name:10s} rows={m:2d} K={kk:5d} N={width:6d}  shipped {shipped['us']:7.2f} us "
              f"({shipped['fraction_of_copy']:.0%})  best {best['us']:7.2f} us ({best['fraction_of_copy']:.0%}) "
              f"bn={best['bn']} bk={best['bk']} split={best['split_target']} warps={best['warps']} "
              f"stages={best['stages']} err={best['max_abs_vs_shipped']:.3g}", flush=True)
    del ws
    torch.cuda.empty_cache()
    return results


def sweep_attention(n_q, n_kv, d, layers, columns):
    """Shipped decode attention at batch 1 and 16 over ``columns`` cache columns, per layer call, rotating layers."""
    out = []
    cap = max(columns) + 16
    for b in (1, 16):
        kvs = [torch.randn(2, b, n_kv, cap, d, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        q = torch.randn(b, n_q, d, device="cuda", dtype=torch.bfloat16)
        valid = torch.ones(b, cap, dtype=torch.bool, device="cuda")
        for n in columns:
            col = torch.tensor([n - 1], dtype=torch.int64, device="cuda")
            it = itertools.cycle(kvs)

            def call(it=it, q=q, valid=valid, col=col):
                k.decode_attention(q, next(it), valid, col, (n_q, n_kv, d), 0.125)
            us = graph_time_us(call, layers * 4)
            row = {"batch": b, "columns": n, "shipped_us": round(us, 3), "shipped": list(k.attention_split(b))}
            ref = k.decode_attention(q, kvs[0], valid, col, (n_q, n_kv, d), 0.125, 1, max(16, min(256, 8192 // d)))
            ref = ref.float()
            for splits, block_t in itertools.chain([(1, max(16, min(256, 8192 // d)))],
                                                   itertools.product((4, 8, 16, 32), (32, 64, 128))):
                def call2(it=it, q=q, valid=valid, col=col, splits=splits, block_t=block_t):
                    k.decode_attention(q, next(it), valid, col, (n_q, n_kv, d), 0.125, splits, block_t)
                row[f"split{splits}_t{block_t}_us"] = round(graph_time_us(call2, layers * 4), 3)
                got = k.decode_attention(q, kvs[0], valid, col, (n_q, n_kv, d), 0.125, splits, block_t)
                row[f"split{splits}_t{block_t}_max_abs"] = float((got.float() - ref).abs().max())
            best = min((key for key in row if key.startswith("split") and key.endswith("_us")), key=row.get)
            print(f"attention b={b:2d} columns={n:5d} shipped {us:6.2f} us  best {best} {row[best]:6.2f} us "
                  f"(max abs {row[best.replace('_us', '_max_abs')]:.3g})", flush=True)
            out.append(row)
        del kvs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--quick", action="store_true", help="a smaller grid")
    args = ap.parse_args()
    h, f, n_q, n_kv, d, layers = SHAPES[args.shape]
    load = os.getloadavg()
    bw = copy_bandwidth()
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name} sm{props.major}{props.minor} copy {bw / 1e12:.2f} TB/s load {load}", flush=True)
    t0 = time.perf_counter()
    gemvs = {
        "qkv": sweep_gemv("qkv", h, (n_q + 2 * n_kv) * d, False, True, (1, 16), args.quick, bw),
        "o_proj": sweep_gemv("o_proj", n_q * d, h, False, True, (1, 16), args.quick, bw),
        "gate_up": sweep_gemv("gate_up", h, f, True, False, (1, 16), args.quick, bw),
        "down": sweep_gemv("down", f, h, False, True, (1, 16), args.quick, bw),
    }
    attention = sweep_attention(n_q, n_kv, d, layers, (128, 256, 1024, 2048))
    result = {"what": "issue 39 item 2: decode kernel configurations per shape", "shape": args.shape,
              "command": " ".join(sys.argv), "machine": {"gpu": props.name, "sm": f"{props.major}.{props.minor}",
                                                         "copy_bytes_per_s": bw, "torch": torch.__version__,
                                                         "triton": triton.__version__,
                                                         "python": platform.python_version(),
                                                         "load_before": load, "load_after": os.getloadavg()},
              "seconds": round(time.perf_counter() - t0, 1), "gemv": gemvs, "attention": attention}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
