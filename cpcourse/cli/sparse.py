"""`cpcourse sparse`: block-sparse attention over a video token grid on P ranks.

    cpcourse sparse --nproc 4 --method ring --mask radial --balance greedy --compare --json

Seeded q, k, v over a --frames x --height x --width token grid, a block mask (tile: a sliding
3-D window; radial: reach halving with temporal distance; topk: per-head top-k of pooled
scores, heads of different density), run by Ulysses (heads local) or the skipping ring, with
the work dealt as is or greedily (`cpcourse.sparse.cp`). `--comm-dtype` sends K/V (and q, out
for Ulysses) as bf16 or fp8. JSON keys: work_per_rank, imbalance, imbalance_unbalanced,
bytes_per_rank, dense_bytes_per_rank, skipped_fraction, density, seconds, tokens_per_rank, and
with --compare max_abs_err, tolerance, within_tolerance, exact, mask_matches_one_process.
"""

from __future__ import annotations

import json

from cpcourse.runs.sparse import SparseRequest, run
from cpcourse.support.errors import ArgumentParser
from cpcourse.support.modes import ALWAYS
from cpcourse.support.request_flags import (
    add_request_flags,
    mode_table,
    request_conditions,
    request_from_args,
)


def build_parser():
    """The flags are SparseRequest's fields (`cpcourse.support.request_flags`), and --compare."""
    p = ArgumentParser(prog="cpcourse sparse", description=__doc__.split("\n")[0])
    add_request_flags(p, SparseRequest)
    p.add_argument("--compare", action="store_true",
                   help="check against dense masked attention in float64")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


# Where each flag acts (see cpcourse.support.modes): every flag of `sparse` always acts.
MODE_FLAGS = mode_table(SparseRequest) | {"compare": ALWAYS}


def mode_conditions(args) -> dict[str, tuple[bool, str]]:
    """No flag of `sparse` depends on another."""
    return request_conditions(SparseRequest, args)


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    req = request_from_args(parser, SparseRequest, args, MODE_FLAGS)
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
