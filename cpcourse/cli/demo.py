"""`cpcourse demo`: ring attention on P local processes, checked against one-process attention.

    cpcourse demo --nproc 4
    cpcourse demo --nproc 3 --seq-len 1000 --json

Every rank builds the same seeded q, k, v `[B, H, L, D]`, keeps its shard (tensor_split order)
and runs `cpcourse.ring.ring_attention`; the ranks send back their output shards and per-step
timings. This process then runs one fused attention over the whole sequence, compares, and
prints one row per ring step: which K/V block each rank held, the slowest rank's compute time,
the longest time a rank spent in communication calls (the exposed part, when overlapped), and the
bytes each rank sent. Runs on a CPU-only machine (gloo, one thread per rank).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cpcourse.launch import check_nproc
from cpcourse.support.dtypes import TORCH_NAMES
from cpcourse.support.errors import ArgumentParser, positive_int
from cpcourse.support.peak_memory import require_fits

DTYPES = ("fp32", "bf16", "fp16")
TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 4e-3}  # max |ring - fused|


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog="cpcourse demo", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4, help="local processes (ranks), default 4")
    p.add_argument("--seq-len", type=int, default=4096, help="whole sequence length L")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    p.add_argument("--mode", default="overlap", choices=["overlap", "blocking", "allgather"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the ring run")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def inputs(spec: dict):
    """The whole q, k, v `[B, H, L, D]` every rank and the checker build from the same seed."""
    import torch

    g = torch.Generator().manual_seed(spec["seed"])
    shape = (spec["batch"], spec["heads"], spec["seq_len"], spec["head_dim"])
    dtype = getattr(torch, spec["dtype"])
    return [torch.randn(shape, generator=g).to(dtype) for _ in range(3)]


def demo_rank(spec: dict) -> dict:
    """What each rank runs: a warm-up call, then the timed ring with per-step stats."""
    import torch.distributed as dist

    from cpcourse.ring import ring_attention
    from cpcourse.support.shards import shard

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (shard(x, rank, world) for x in inputs(spec))
    ring_attention(q, k, v, mode=spec["mode"])  # warm-up: thread pools, first-touch pages
    dist.barrier()
    stats = []
    start = time.perf_counter()
    out = ring_attention(q, k, v, mode=spec["mode"], stats=stats)
    return {"out": out, "seconds": time.perf_counter() - start, "stats": stats}


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


def _to_stderr(line: str) -> None:
    """Rank output goes to stderr: stdout carries only the report (one JSON object with --json)."""
    print(line, end="", file=sys.stderr, flush=True)


def run(spec: dict) -> dict:
    """Launch the ring, check it against fused attention here; returns the report dict."""
    import torch

    from cpcourse.attention import attention_with_lse
    from cpcourse.launch import launch

    t0 = time.perf_counter()
    results = launch("cpcourse.cli.demo:demo_rank", spec["nproc"], timeout=spec["timeout"],
                     args=(spec,), threads=1, stream=_to_stderr)
    launch_s = time.perf_counter() - t0
    q, k, v = inputs(spec)
    want, _ = attention_with_lse(q, k, v)  # the check; the second call is the timed one
    t1 = time.perf_counter()
    attention_with_lse(q, k, v)
    fused_s = time.perf_counter() - t1
    got = torch.cat([r["out"] for r in results], dim=2)
    err = float((got.double() - want.double()).abs().max())
    steps = [s for r in results for s in r["stats"]]
    return {**{key: spec[key] for key in ("nproc", "seq_len", "heads", "head_dim", "batch",
                                          "dtype", "mode")},
            "backend": "gloo", "threads_per_rank": 1,
            "max_abs_err": err, "tolerance": TOLERANCE[spec["dtype"]],
            "ok": err <= TOLERANCE[spec["dtype"]],
            "ring_seconds": max(r["seconds"] for r in results),
            "fused_seconds": fused_s, "fused_threads": torch.get_num_threads(),
            "launch_seconds": launch_s, "steps": steps}


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    spec = {"nproc": check_nproc(args.nproc, "--nproc"),
            "seq_len": positive_int("--seq-len", args.seq_len),
            "heads": positive_int("--heads", args.heads),
            "head_dim": positive_int("--head-dim", args.head_dim),
            "batch": positive_int("--batch", args.batch), "dtype": TORCH_NAMES[args.dtype],
            "mode": args.mode, "seed": args.seed, "timeout": args.timeout}
    # Every rank builds the whole q, k, v and keeps its output; the checker holds the same again.
    elems = spec["batch"] * spec["heads"] * spec["seq_len"] * spec["head_dim"]
    require_fits((spec["nproc"] + 1) * 4 * elems * 4, f"--seq-len {spec['seq_len']} on "
                 f"{spec['nproc']} ranks", "use a smaller --seq-len, --heads or --nproc")
    report = run(spec)
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
