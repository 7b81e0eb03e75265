"""`cpcourse bench ring --small`: what one ring call costs beyond its attention, at small shards.

    cpcourse bench ring --small --json

A real model calls attention once per layer per step, so a ring call's fixed costs are paid
thousands of times. On 2 ranks with one thread each, for shards of 64, 256 and 1,024 tokens
(B = 1, H = 8, D = 64, float32), this measures the median of many calls of: the ring
(`ring_attention`, overlapped), one block's attention (`attention_with_lse` of the local queries
over one rank's keys), and the ring's parts alone: the shape agreement
(`cpcourse.support.groups.agree`), one merge (the ring's in-place fold,
`cpcourse.ring.fold_into`) and one heartbeat (`cpcourse.support.groups.tracked` enter and exit).
`ratio` = ring / (2 x one block): 1.0 would be a ring with no overhead at all. The ring agrees
shapes only while they change (then each K/V message carries a one-element "changed" flag), so
in a run of same-shape calls `agree_s` is what it no longer pays. With `lens=` a caller that
already knows every rank's shard lengths (a model's CP hooks do) skips agreement and flag; that
variant is measured too.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

SIZES = (64, 256, 1024)


def _medians(probes: dict, calls: int) -> dict[str, float]:
    """Median seconds of each probe, the probes interleaved call by call: a machine that slows
    down or speeds up during the run moves every probe alike, so the ratios hold (taking each
    probe's calls in one stretch gave ratios from 1.16 to 1.80 for the same code)."""
    import torch.distributed as dist

    times: dict[str, list[float]] = {name: [] for name in probes}
    for fn in probes.values():
        fn()  # warm-up
    for _ in range(calls):
        for name, fn in probes.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def _row(n: int, heads: int, head_dim: int, calls: int) -> dict:
    import torch.distributed as dist

    from cpcourse.attention import attention_with_lse
    from cpcourse.ring import fold_into, ring_attention
    from cpcourse.support.groups import agree, tracked

    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, heads, n, head_dim, generator=gen) for _ in range(3))
    o, lse = attention_with_lse(q, k, v)  # o [1, H, n, D], lse [1, H, n]
    run_out, run_lse = o.clone(), lse.clone()  # folding a block into itself keeps it finite

    def beat():
        with tracked("heartbeat probe"):
            pass

    probes = {"ring_s": lambda: ring_attention(q, k, v),
              "ring_known_lens_s": lambda: ring_attention(q, k, v, lens=[n] * world),
              "block_s": lambda: attention_with_lse(q, k, v),
              "agree_s": lambda: agree(None, q=q, k=k, v=v),
              "merge_s": lambda: fold_into(run_out, run_lse, o, lse),
              "heartbeat_s": beat}
    with torch.inference_mode():
        return {"tokens_per_rank": n, **_medians(probes, calls)}


def overhead_rank(sizes: tuple, heads: int, head_dim: int, calls: int) -> list[dict]:
    """Every rank: one row of medians per shard size."""
    return [_row(n, heads, head_dim, calls) for n in sizes]


def run(calls: int = 40, timeout: float = 300.0) -> dict:
    from cpcourse.launch import launch

    results = launch("cpcourse.bench.overhead:overhead_rank", 2, timeout=timeout, threads=1,
                     args=(SIZES, 8, 64, calls), stream=False)
    rows = []
    for i, n in enumerate(SIZES):
        per = [r[i] for r in results]
        row = {k: max(p[k] for p in per) for k in per[0] if k.endswith("_s")}
        row = {"tokens_per_rank": n, **{k: round(v, 7) for k, v in row.items()}}
        row["ratio"] = round(row["ring_s"] / (2 * row["block_s"]), 3)
        row["ratio_known_lens"] = round(row["ring_known_lens_s"] / (2 * row["block_s"]), 3)
        rows.append(row)
    return {"nproc": 2, "heads": 8, "head_dim": 64, "calls": calls, "rows": rows,
            "targets": {"256": 1.6, "1024": 1.10}}


def main(calls: int, as_json: bool) -> int:
    report = run(calls)
    if as_json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print("tokens/rank  ring ms (known lens)  2 x block ms  ratio (known lens)  "
          "agree ms  merge ms  heartbeat ms")
    for r in report["rows"]:
        ms = {k: v * 1e3 for k, v in r.items() if k.endswith("_s")}
        print(f"{r['tokens_per_rank']:>11}  {ms['ring_s']:7.3f} ({ms['ring_known_lens_s']:7.3f})"
              f"  {2 * ms['block_s']:12.3f}  {r['ratio']:5.2f} ({r['ratio_known_lens']:5.2f})"
              f"       {ms['agree_s']:8.3f}  {ms['merge_s']:8.3f}  {ms['heartbeat_s']:12.3f}")
    return 0
