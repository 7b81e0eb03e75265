"""Attention2D on real gloo processes: every grid of P = 1..4 and 3x3, against one process.

    python -m pytest tests/dist/test_tiling.py -q

Two launches: 4 ranks run P = 1, 2, 3 on subgroups (the `group` argument) and P = 4 on the world;
9 ranks run 3x3 and 9x1 on tiny cases.
Each runs every case (every grid of P, seeded random sizes including lengths
below P, cross-attention, float32 and float64) against one-process float64 attention; the ranks
return numbers and the assertions happen here, so a failure names the case. Measured bytes per
collective must equal `tiling_bytes_per_rank` exactly, and the degenerate grid (P, 1) must move the
same bytes as the ring's all-gather path. Bad grids are refused on every rank before any
collective, and the group still works afterwards.
"""

import pytest
import torch

from cpcourse.launch import launch
from cpcourse.planner.costs import tiling_bytes_per_rank

pytestmark = pytest.mark.dist

TOL = {"float32": 1e-5, "float64": 1e-12, "bfloat16": 2e-2}  # max |out - ref|, outputs O(1)


def _grids(world: int) -> list[tuple[int, int]]:
    return [(r, world // r) for r in range(1, world + 1) if world % r == 0]


def _cases(world: int, rng) -> list[tuple]:
    """(name, B, H, Lq, Lk, D, dtype, seed)."""
    cases = [("uneven", 1, 2, 4 * world + 3, 4 * world + 3, 8, "float32", 1),
             ("fp64", 2, 1, 3 * world + 1, 3 * world + 1, 5, "float64", 2),
             ("shorter_than_world", 1, 2, max(1, world - 1), max(1, world - 1), 4, "float32", 3),
             ("cross", 1, 1, 2 * world + 1, world + 2, 4, "float64", 4)]
    if world == 4:  # half precision: the partials travel in float32
        cases.append(("bf16", 1, 2, 5 * world + 1, 5 * world + 1, 16, "bfloat16", 5))
    if world <= 4:
        for i in range(2):
            n = rng.randint(1, 8 * world)
            cases.append((f"random{i}", rng.randint(1, 2), rng.choice([1, 2, 4]), n, n,
                          rng.choice([3, 8, 16]), rng.choice(["float32", "float64"]),
                          rng.randrange(2**20)))
    return cases


def grid_cases(plan):
    """Runs on every rank. plan: {P: (cases, grids)}; P below the world runs on the subgroup of
    ranks 0 .. P - 1. Then bad grids on the world, which must be refused alike everywhere."""
    import torch.distributed as dist

    from cpcourse.support.errors import InputError
    from cpcourse.tiling import attention_2d

    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []
    # P = 1 last: torch's subgroups made with local synchronisation (attention_2d's, in a
    # subgroup) time out after a one-rank group made the usual way (torch 2.13)
    for p, (cases, grids) in sorted(plan.items(), key=lambda kv: (kv[0] == 1, kv[0])):
        group = dist.new_group(list(range(p))) if p < world else None  # every rank makes it
        if rank < p:
            rows += [{"world": p, **row} for row in _run(cases, grids, group, rank, p)]
    mine = [torch.randn(1, 2, 3, 4) for _ in range(3)]
    for bad in [(0, world), (world, 2), (-1, -world), "2x2"]:
        try:
            attention_2d(*mine, grid=bad)
            rows.append({"case": "bad_grid", "grid": bad, "error": None})
        except InputError as exc:
            rows.append({"case": "bad_grid", "grid": bad, "error": str(exc)})
    out = attention_2d(*mine)  # the default (squarest) grid, after the refusals
    rows.append({"case": "after_refusals", "grid": None, "shape_ok": out.shape == (1, 2, 3, 4)})
    dist.barrier()
    return rows


def _run(cases, grids, group, rank, world):
    from cpcourse.attention import reference_attention
    from cpcourse.ring import ring_attention
    from cpcourse.support.shards import shard
    from cpcourse.tiling import attention_2d

    rows = []
    for name, b, h, lq, lk, d, dtype, seed in cases:
        dt = getattr(torch, dtype)
        g = torch.Generator().manual_seed(seed)
        whole = [torch.randn(b, h, n, d, generator=g, dtype=torch.float64).to(dt).double()
                 for n in (lq, lk, lk)]
        want = shard(reference_attention(*whole)[0], rank, world)
        mine = [shard(x, rank, world).to(dt) for x in whole]
        for grid in grids:
            stats = []
            out = attention_2d(*mine, grid=grid, group=group, stats=stats)
            rows.append({"case": name, "grid": grid, "dtype": dtype,
                         "err": float((out.double() - want).abs().max()) if out.numel() else 0.0,
                         "shape_ok": out.shape == want.shape and out.dtype == dt,
                         "ops": [s["op"] for s in stats],
                         "bytes": sum(s["bytes_sent"] for s in stats),
                         "recv": sum(s["bytes_recv"] for s in stats)})
        stats = []
        ring_attention(*mine, mode="allgather", group=group, stats=stats)
        rows.append({"case": name, "grid": "ring-allgather",
                     "bytes": sum(s["bytes_sent"] for s in stats)})
    return rows


@pytest.mark.parametrize("world", [4, 9])
def test_attention_2d_on_every_grid(world, cases_rng):
    plan = {p: (_cases(p, cases_rng), _grids(p)) for p in (1, 2, 3, 4)} if world == 4 else \
        {9: (_cases(9, cases_rng), [(3, 3), (9, 1)])}
    results = launch(f"{__file__}:grid_cases", world, timeout=180, args=(plan,), stream=False)
    worst = {}  # (P, case, grid) -> the most bytes any rank sent
    for rank, rows in enumerate(results):
        for row in rows:
            where = f"rank {rank} {row['case']} grid {row['grid']}"
            if row["case"] == "bad_grid":
                assert row["error"] and "\n" not in row["error"], where
                continue
            if row["case"] == "after_refusals":
                assert row["shape_ok"], where
                continue
            key = (row["world"], row["case"], row["grid"])
            worst[key] = max(worst.get(key, 0), row["bytes"])
            if row["grid"] == "ring-allgather":
                continue
            dtype = dict((c[0], c[6]) for c in plan[row["world"]][0])[row["case"]]
            assert row["shape_ok"] and row["err"] <= TOL[dtype], (where, row)
            rows_, cols = row["grid"]
            assert len(row["ops"]) == (cols > 1) * 2 + (rows_ > 1), (where, row["ops"])
            assert row["bytes"] == row["recv"], where  # each gather and the all-to-all: both ways
    for (p, name, grid), sent in worst.items():
        _, b, h, lq, lk, d, dtype, _ = next(c for c in plan[p][0] if c[0] == name)
        if grid == "ring-allgather":  # (P, 1) is the ring's all-gather path, byte for byte
            assert worst[p, name, (p, 1)] == sent, (p, name)
        elif lq == lk:  # the formula is the busiest rank's
            e = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
            assert sent == tiling_bytes_per_rank("attn2d", lq, h, d, p, grid, e, b), (p, name, grid)


def test_bench_tiling_reports_every_grid_with_exact_bytes():
    from cpcourse.runs.tiling import TilingRequest, run

    report = run(TilingRequest(grids=((1, 2), (2, 1)), tokens=5, heads=1, head_dim=4,
                               dtype="fp64"))
    assert [t["grid"] for t in report["tilings"]] == ["1x2", "2x1"]
    for t in report["tilings"]:
        assert set(t) >= {"max_abs_err", "tolerance", "within_tolerance", "bytes_per_rank",
                          "predicted_bytes_per_rank", "seconds"}
        assert t["within_tolerance"] and t["bytes_per_rank"] == t["predicted_bytes_per_rank"]
