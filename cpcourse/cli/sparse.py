"""`cpcourse sparse`: block-sparse attention over a video token grid on P ranks.

    cpcourse sparse --nproc 4 --method ring --mask radial --balance greedy --compare --json

Seeded q, k, v over a --frames x --height x --width token grid, a block mask (tile: a sliding
3-D window; radial: reach halving with temporal distance; topk: per-head top-k of pooled
scores, heads of different density), run by Ulysses (heads local) or the skipping ring, with
the work dealt as is or greedily (`cpcourse.sparse_cp`). `--comm-dtype` sends K/V (and q, out
for Ulysses) as bf16 or fp8. JSON keys: work_per_rank, imbalance, imbalance_unbalanced,
bytes_per_rank, dense_bytes_per_rank, skipped_fraction, density, seconds, tokens_per_rank, and
with --compare max_abs_err, tolerance, within_tolerance, exact, mask_matches_one_process.
"""

from __future__ import annotations

import json

from cpcourse.fp8_comm import COMM_DTYPES
from cpcourse.runs.sparse import DTYPES, MASKS, METHODS, SparseRequest, run
from cpcourse.sparse_cp import BALANCES
from cpcourse.support.errors import ArgumentParser, positive_float
from cpcourse.support.modes import ALWAYS, refuse_inactive


def build_parser():
    p = ArgumentParser(prog="cpcourse sparse", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks (2)")
    p.add_argument("--method", choices=METHODS, default="ulysses")
    p.add_argument("--mask", choices=MASKS, default="radial")
    p.add_argument("--balance", choices=BALANCES, default="none",
                   help="deal heads (ulysses) or query tiles (ring) by kept work (greedy)")
    p.add_argument("--frames", type=int, default=8, help="token grid frames (8)")
    p.add_argument("--height", type=int, default=8, help="token grid rows (8)")
    p.add_argument("--width", type=int, default=8, help="token grid cols (8)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (12)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--comm-dtype", choices=COMM_DTYPES, default="fp32",
                   help="how K/V travel: fp32 (exact), bf16, fp8 (per token-and-head scales), "
                        "fp8-tensor (one calibrated scale)")
    p.add_argument("--compare", action="store_true",
                   help="check against dense masked attention in float64")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# Where each flag acts (see cpcourse.support.modes): every flag of `sparse` always acts.
MODE_FLAGS = {name: ALWAYS for name in ("nproc", "method", "mask", "balance", "frames", "height",
                                        "width", "heads", "seed", "dtype", "comm_dtype",
                                        "compare", "timeout", "json")}


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    """No flag of `sparse` depends on another."""
    return {}


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    refuse_inactive(parser, args, MODE_FLAGS, mode_conditions(args))
    req = SparseRequest(nproc=args.nproc, method=args.method, mask=args.mask,
                        balance=args.balance, frames=args.frames, height=args.height,
                        width=args.width, heads=args.heads, seed=args.seed, dtype=args.dtype,
                        comm_dtype=args.comm_dtype,
                        timeout=positive_float("timeout", args.timeout, high=3600))
    rep = run(req, compare=args.compare)
    if args.json:
        print(json.dumps(rep, allow_nan=False))
        return 0
    mb = 1e6
    print(f"{req.method} on {req.nproc} ranks, {req.mask} mask (density {rep['density']:.2f}), "
          f"balance {req.balance}")
    print(f"  work per rank {[int(w) for w in rep['work_per_rank']]}: imbalance "
          f"{rep['imbalance']:.3f} (unbalanced {rep['imbalance_unbalanced']:.3f})")
    print(f"  bytes sent per rank {[round(b / mb, 3) for b in rep['bytes_per_rank']]} MB "
          f"(dense {[round(b / mb, 3) for b in rep['dense_bytes_per_rank']]} MB), "
          f"{rep['skipped_fraction']:.0%} of blocks skipped")
    if "max_abs_err" in rep:
        ok = "within" if rep["within_tolerance"] else "OUTSIDE"
        print(f"  max |CP - dense masked| = {rep['max_abs_err']:.2e} ({ok} the tolerance "
              f"{rep['tolerance']:.1e}){'' if rep['exact'] else ': ' + rep['why']}")
    return 0
