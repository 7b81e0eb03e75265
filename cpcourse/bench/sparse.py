"""`cpcourse bench sparse`: sparse attention under CP, every method x mask x balance, one launch.

    cpcourse bench sparse --nproc 4 --json

Each row is one `cpcourse sparse --compare` run (`cpcourse.runs.sparse`): its error against the
dense masked reference, work per rank and imbalance (with and without the greedy deal), bytes
per rank against a dense collective's, the fraction of blocks skipped. The last rows send the
radial run's K/V (and Ulysses' q, out) as bf16, fp8 per token-and-head and fp8 with one
calibrated scale: bytes (scales counted) and error against the exact run. All rows share one
launch (`rank_cases`).
"""

from __future__ import annotations

import json

from cpcourse.support.errors import ArgumentParser

KEYS = ("method", "mask", "balance", "comm_dtype", "max_abs_err", "tolerance",
        "within_tolerance", "work_per_rank", "imbalance", "imbalance_unbalanced",
        "bytes_per_rank", "dense_bytes_per_rank", "skipped_fraction", "density")


def requests(nproc: int, seed: int, size: tuple[int, int, int]) -> list:
    from cpcourse.runs.sparse import MASKS, METHODS, SparseRequest
    from cpcourse.sparse.cp import BALANCES

    grid = dict(frames=size[0], height=size[1], width=size[2], seed=seed, nproc=nproc)
    rows = [SparseRequest(method=m, mask=mk, balance=b, **grid)
            for m in METHODS for mk in MASKS for b in BALANCES]
    return rows + [SparseRequest(method=m, mask="radial", comm_dtype=c, **grid)
                   for m in METHODS for c in ("bf16", "fp8", "fp8-tensor")]


def main(argv: list[str]) -> int:
    from cpcourse.launch import check_nproc, launch
    from cpcourse.runs.sparse import report

    p = ArgumentParser(prog="cpcourse bench sparse", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=4, help="ranks (4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frames", type=int, default=8, help="token grid frames (8)")
    p.add_argument("--height", type=int, default=8, help="token grid rows (8)")
    p.add_argument("--width", type=int, default=8, help="token grid cols (8)")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    reqs = requests(check_nproc(args.nproc), args.seed, (args.frames, args.height, args.width))
    per_rank = launch("cpcourse.runs.sparse:rank_cases", args.nproc, timeout=args.timeout,
                      args=(reqs,), stream=False, threads=1)
    rows = []
    for i, req in enumerate(reqs):
        rep = report(req, [r[i] for r in per_rank])
        rows.append({k: rep[k] for k in KEYS})
    out = {"nproc": args.nproc, "grid": [args.frames, args.height, args.width], "rows": rows}
    if args.json:
        print(json.dumps(out, allow_nan=False))
        return 0
    print(f"sparse attention on {args.nproc} ranks, grid {out['grid']} tokens")
    print(f"{'method':8s} {'mask':7s} {'balance':7s} {'comm':10s} {'max err':>9s} "
          f"{'imbalance':>10s} {'bytes/dense':>12s} {'skipped':>8s}")
    for r in rows:
        ratio = sum(r["bytes_per_rank"]) / max(1, sum(r["dense_bytes_per_rank"]))
        print(f"{r['method']:8s} {r['mask']:7s} {r['balance']:7s} {r['comm_dtype']:10s} "
              f"{r['max_abs_err']:9.2e} {r['imbalance']:10.3f} {ratio:12.3f} "
              f"{r['skipped_fraction']:8.1%}")
    return 0
