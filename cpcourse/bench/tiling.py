"""`cpcourse bench tiling`: Attention2D on grids of 4 and 9 processes against one process.

    cpcourse bench tiling --json
    cpcourse bench tiling --grids 1x4,2x2,4x1 --tokens 101 --dtype fp64 --json

Per grid (`cpcourse.runs.tiling`): max_abs_err against float64 attention, the tolerance and
whether it holds, the busiest rank's bytes per call measured and predicted by the formula
(`cpcourse.planner.costs.tiling_bytes_per_rank`), and seconds. On a CPU the seconds say little;
the bytes are the lesson: the square grid moves the least once P > 4.
"""

from __future__ import annotations

import json

from cpcourse.support.errors import ArgumentParser


def main(argv: list[str]) -> int:
    from cpcourse.runs.tiling import DTYPES, TilingRequest, parse_grids, run

    p = ArgumentParser(prog="cpcourse bench tiling", description=__doc__.split("\n")[0])
    p.add_argument("--grids", default="1x4,2x2,4x1,3x3", help="RxC,... (default 1x4,2x2,4x1,3x3)")
    p.add_argument("--tokens", type=int, default=37)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    req = TilingRequest(grids=parse_grids(a.grids), tokens=a.tokens, heads=a.heads,
                        head_dim=a.head_dim, dtype=a.dtype, seed=a.seed)
    report = run(req)
    if a.json:
        print(json.dumps(report))
        return 0
    print(f"{'grid':>5} {'P':>3} {'max_abs_err':>12} {'tolerance':>10} {'bytes/rank':>11} "
          f"{'predicted':>10} {'seconds':>8}")
    for t in report["tilings"]:
        print(f"{t['grid']:>5} {t['world']:>3} {t['max_abs_err']:12.2e} {t['tolerance']:10.1e} "
              f"{t['bytes_per_rank']:11d} {t['predicted_bytes_per_rank']:10d} "
              f"{t['seconds']:8.4f}")
    return 0
