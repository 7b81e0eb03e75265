"""`cpcourse demo`: ring attention on P local processes, checked against one-process attention.

    cpcourse demo --nproc 4
    cpcourse demo --nproc 3 --seq-len 1000 --json

Every rank builds the same seeded q, k, v `[B, H, L, D]`, keeps its shard (tensor_split order)
and runs `cpcourse.ring.ring_attention` (`cpcourse.runs.demo`, whose DemoRequest's fields are
the flags); the ranks send back their output shards and per-step timings. This process then
runs one fused attention over the whole sequence, compares, and prints one row per ring step:
which K/V block each rank held, the slowest rank's compute time, the longest time a rank spent
in communication calls (the exposed part, when overlapped), and the bytes each rank sent. Runs
on a CPU-only machine (gloo, one thread per rank).
"""

from __future__ import annotations

import json

from cpcourse.runs.demo import DemoRequest, run
from cpcourse.support.request_flags import build_parser, request_from_args


def _parser():
    """The flags are DemoRequest's fields (`cpcourse.support.request_flags`)."""
    return build_parser("cpcourse demo", DemoRequest, __doc__.split("\n")[0])


def _table(steps: list[dict], world: int) -> list[str]:
    rows = [f"{'step':>4}  {'K/V block held by rank 0..P-1':<30} {'compute ms':>10} "
            f"{'comm ms':>8}  {'sent kB/rank':>12}"]
    for step in sorted({s["step"] for s in steps}):
        mine = sorted((s for s in steps if s["step"] == step), key=lambda s: s["rank"])
        blocks = " ".join("all" if s["kv_block"] < 0 else str(s["kv_block"]) for s in mine)
        rows.append(f"{step:>4}  {blocks:<30} {1e3 * max(s['compute_s'] for s in mine):>10.1f} "
                    f"{1e3 * max(s['comm_s'] for s in mine):>8.1f}  "
                    f"{max(s['bytes_sent'] for s in mine) / 1e3:>12.1f}")  # kB: SI, as fmt
    return rows


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    report = run(request_from_args(parser, DemoRequest, args))
    if args.json:
        print(json.dumps(report, allow_nan=False))
    else:
        print(f"ring attention ({report['mode']}) on {report['nproc']} processes, gloo, "
              f"1 thread each: B={report['batch']} H={report['heads']} L={report['seq_len']} "
              f"D={report['head_dim']} {report['dtype']}")
        print("\n".join(_table(report["steps"], report["nproc"])))
        verdict = "OK" if report["ok"] else "MISMATCH"
        print(f"max |ring - one-process attention| = {report['max_abs_err']:.2e} "
              f"(tolerance {report['tolerance']:g}): {verdict}")
        print(f"ring {report['ring_seconds']:.3f} s (slowest rank); one process "
              f"({report['fused_threads']} threads) {report['fused_seconds']:.3f} s; "
              f"whole launch {report['launch_seconds']:.1f} s")
    return 0 if report["ok"] else 1
