"""``edgellm inspect CKPT_DIR [--output inventory.json] [--require-family] [--closest]``: validate a checkpoint
from its headers (and a quantized one's scale values) and summarise it.

Any model_type is inventoried; one no family registers is reported as a finding (``finding: ...`` on stdout and in
the inventory's ``findings``), exit 0, unless ``--require-family`` makes it a problem. Exit 0 when the checkpoint has
no problem; 2 otherwise, with every problem on its own stderr line (``problem: <file>: tensor '<name>': <rule>``).
The JSON inventory is written (atomically) either way. ``--closest`` adds ``closest_family``
(``edgellm.checkpoint.closest``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from edgellm.checkpoint import write_json_atomic
from edgellm.checkpoint.inventory import failed_inventory
from edgellm.checkpoint.survey import inspect_checkpoint
from edgellm.errors import EXIT_OK, ConfigurationError, ErrorKind

NAME = "inspect"
HELP = "validate a Hugging Face safetensors checkpoint from its headers and write its inventory (JSON)"
EXIT_PROBLEMS = ErrorKind.CONFIGURATION.exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CKPT_DIR", help="checkpoint directory")
    parser.add_argument("--output", "-o", type=Path, metavar="JSON", help="write the inventory here")
    parser.add_argument("--require-family", action="store_true",
                        help="a checkpoint no registered family takes is a problem (exit 2), not a finding (exit 0)")
    parser.add_argument("--closest", action="store_true",
                        help="add 'closest_family': config.json and tensors compared with every registered family "
                             "(imports transformers' config classes)")


def run(args: argparse.Namespace) -> int:
    try:
        inventory = inspect_checkpoint(args.checkpoint, require_family=args.require_family)
    except ConfigurationError as exc:  # no weights, broken config or quantization: stop at this one problem
        inventory = failed_inventory(args.checkpoint, str(exc))
        if args.output:
            write_json_atomic(args.output, inventory)
        return _report_problems(inventory["problems"], args)
    if args.closest:
        from edgellm.checkpoint.closest import closest_family

        inventory["closest_family"] = closest_family(args.checkpoint)
    if args.output:
        write_json_atomic(args.output, inventory)
    _print_summary(inventory)
    if not inventory["ok"]:
        return _report_problems(inventory["problems"], args)
    return EXIT_OK


def _report_problems(problems: list[str], args: argparse.Namespace) -> int:
    for p in problems:
        print(f"problem: {_one_line(p)}", file=sys.stderr)
    where = f"; inventory: {args.output}" if args.output else ""
    print(f"edgellm inspect: {args.checkpoint}: {len(problems)} problem(s), not usable{where}", file=sys.stderr)
    return EXIT_PROBLEMS


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _layout_line(q: dict[str, Any]) -> str:
    lay = q.get("layout")
    if not lay:
        return ""
    return (f"; {lay['quantized_linears']}/{lay['linears']} linears quantized, "
            + ", ".join(f"{k} {v}" for k, v in sorted(lay["precision_counts"].items())))


def _print_summary(inv: dict[str, Any]) -> None:
    cfg = inv["config"]
    raw = inv["config_json"]
    rec = inv["reconciliation"]
    q = inv["quantization"]
    archs = ", ".join(raw.get("architectures") or []) or "no architectures"
    lines = [
        f"checkpoint  {inv['checkpoint']}",
        f"family      {inv['family'] or 'none registered'} ({raw.get('model_type')}, {archs})",
    ]
    if cfg is not None:
        lines.append(
            f"shape       hidden {cfg['hidden_size']}, ffn {cfg['intermediate_size']}, layers "
            f"{cfg['num_hidden_layers']}, heads {cfg['num_attention_heads']}/{cfg['num_key_value_heads']} kv, "
            f"head_dim {cfg['head_dim']}, vocab {cfg['vocab_size']}, tied {cfg['tie_word_embeddings']}")
    lines += [
        f"parameters  {inv['parameters']:,} ({inv['tensor_count']} tensors, {_human_bytes(inv['bytes'])})",
        "dtypes      " + ", ".join(f"{d} {v['tensors']} tensors {_human_bytes(v['bytes'])}"
                                   for d, v in inv["dtypes"].items()),
        f"quant       {q['method']}" + (f", group size {q['group_size']}" if q["group_size"] else "")
        + (f" (kv cache {q['kv_cache']})" if q["kv_cache"] else "") + _layout_line(q),
        f"shards      {len(inv['shards'])}" + (" (indexed)" if inv["sharded"] else ""),
    ]
    if rec is not None:
        lines.append(f"reconcile   {rec['matched']}/{rec['expected']} matched, {len(rec['missing'])} missing, "
                     f"{len(rec['shape_mismatches'])} wrong shape, {len(rec['unexpected'])} unexplained, "
                     f"{len(rec['tied'])} tied, {len(rec['ignored'])} ignored")
    closest = inv.get("closest_family")
    if closest is not None:
        lines.append(f"closest     {closest['family']}: {closest['classification']}"
                     + (f" (deciding: {', '.join(closest['deciding'])})" if closest["deciding"] else ""))
    lines.append("tensors:")
    for p in inv["patterns"]:
        shapes = " | ".join("x".join(map(str, s)) or "scalar" for s in p["shapes"])
        lines.append(f"  {p['pattern']:<56} {p['count']:>4} x {'/'.join(p['dtypes'])} [{shapes}]")
    if q.get("layer_table"):
        lines.append("linear layers (stored precision):")
        lines.extend(f"  {r['module']:<56} {r['count']:>4} x {r['precision']}" for r in q["layer_table"])
    lines.extend(f"finding: {f['kind']}: {_one_line(f['message'])}" for f in inv["findings"])
    lines.append("status      " + ("OK" if inv["ok"] else f"{len(inv['problems'])} problem(s)")
                 + (f", {len(inv['findings'])} finding(s)" if inv["findings"] else ""))
    print("\n".join(lines))
