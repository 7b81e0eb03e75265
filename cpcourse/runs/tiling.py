"""Attention2D on every grid asked for, against one process: errors, bytes and seconds.

    cpcourse bench tiling --json

`run(TilingRequest(...))` launches one set of gloo ranks per world size (P = rows x cols) and on
each runs `cpcourse.tiling.attention_2d` for every grid of that size on the same seeded q, k, v
(`tokens` long, so shards are uneven unless P divides it). Per grid: the largest error of any
rank against float64 attention in one process, the course's tolerance for a merge
(`cpcourse.support.tolerance`), the busiest rank's bytes per call as measured by the function's
own stats and as predicted by `cpcourse.planner.costs.tiling_bytes_per_rank`, and its seconds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from cpcourse.launch import launch
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.request import check_common

DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
DEFAULT_GRIDS = ((1, 4), (2, 2), (4, 1), (3, 3))
MAX_RANKS = 16  # local processes on one machine: a CPU course's limit


def parse_grids(text: str) -> tuple[tuple[int, int], ...]:
    """"1x4,2x2" -> ((1, 4), (2, 2)), or an InputError."""
    grids = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d{1,3})\s*x\s*(\d{1,3})\s*", part)
        if m is None:
            raise InputError(f"grids {text!r}: give RxC,RxC..., e.g. 1x4,2x2,4x1, got "
                             f"{part.strip()!r}")
        grids.append((int(m.group(1)), int(m.group(2))))
    return tuple(grids)


@dataclass(frozen=True)
class TilingRequest:
    """What `cpcourse bench tiling` runs: grids (rows, cols), one self-attention call of
    `tokens` tokens, `heads` heads of `head_dim`, batch 1, in `dtype` (fp32 or fp64)."""

    grids: tuple = DEFAULT_GRIDS
    tokens: int = 37
    heads: int = 2
    head_dim: int = 16
    dtype: str = "fp32"
    seed: int = 0

    def __post_init__(self):
        require(isinstance(self.grids, tuple) and self.grids, "grids: give at least one grid")
        for g in self.grids:
            require(isinstance(g, tuple) and len(g) == 2 and all(
                isinstance(n, int) and n >= 1 for n in g), f"grids: each grid is (rows, cols) "
                f"of whole numbers >= 1, got {g!r}")
            require(g[0] * g[1] <= MAX_RANKS, f"grid {g[0]}x{g[1]} needs {g[0] * g[1]} "
                    f"processes: use grids of at most {MAX_RANKS} ranks")
        for name, most in (("tokens", 1 << 16), ("heads", 256), ("head_dim", 512)):
            value = positive_int(name, getattr(self, name))
            require(value <= most, f"{name} {value}: use at most {most} on a CPU")
        require(self.tokens * self.heads * self.head_dim <= 1 << 24, f"tokens x heads x "
                f"head_dim = {self.tokens * self.heads * self.head_dim}: keep it under 2**24 "
                "(each tensor is that many numbers)")
        require(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got "
                f"{self.dtype!r}")
        check_common(self)  # the seed, as every Request checks it


def _inputs(req: TilingRequest):
    g = torch.Generator().manual_seed(req.seed)
    return [torch.randn(1, req.heads, req.tokens, req.head_dim, generator=g,
                        dtype=torch.float64).to(DTYPES[req.dtype]) for _ in range(3)]


def rank(req: TilingRequest, grids: list) -> list[dict]:
    """On every rank: each grid of this world size; this rank's error, bytes and seconds."""
    import time

    import torch.distributed as dist

    from cpcourse.attention import reference_attention
    from cpcourse.support.shards import shard
    from cpcourse.tiling import attention_2d

    r, world = dist.get_rank(), dist.get_world_size()
    q, k, v = _inputs(req)  # [1, H, L, D] each, the whole sequence on every rank
    # this rank's rows of the float64 reference, and its q, k, v: [1, H, L/P, D] each
    want = shard(reference_attention(q.double(), k.double(), v.double())[0], r, world)
    mine = [shard(x, r, world) for x in (q, k, v)]
    rows = []
    for grid in grids:
        attention_2d(*mine, grid=tuple(grid))  # warm-up: the timed call is the second
        stats = []
        dist.barrier()
        t0 = time.perf_counter()
        out = attention_2d(*mine, grid=tuple(grid), stats=stats)  # [1, H, L/P, D]
        seconds = time.perf_counter() - t0
        err = (out.double() - want).abs()
        rows.append({"grid": list(grid), "err": float(err.max()) if err.numel() else 0.0,
                     "scale": float(want.abs().max()) if want.numel() else 0.0,
                     "bytes": sum(s["bytes_sent"] for s in stats), "seconds": seconds})
    return rows


def run(req: TilingRequest) -> dict:
    """Every grid of the request, one launch per world size; the report `bench tiling` prints."""
    from cpcourse.planner.costs import tiling_bytes_per_rank
    from cpcourse.support.tolerance import tolerance

    worlds: dict[int, list] = {}
    for g in req.grids:
        worlds.setdefault(g[0] * g[1], []).append(list(g))
    report = []
    for world, grids in worlds.items():
        results = launch(f"{__name__}:rank", world, timeout=120, args=(req, grids), stream=False)
        for i, grid in enumerate(grids):
            mine = [rows[i] for rows in results]
            err, scale = max(m["err"] for m in mine), max(m["scale"] for m in mine)
            tol = tolerance("attn2d", req.dtype, scale=scale)
            report.append({
                "grid": f"{grid[0]}x{grid[1]}", "world": world, "max_abs_err": err,
                "tolerance": tol, "within_tolerance": err <= tol,
                "bytes_per_rank": max(m["bytes"] for m in mine),
                "predicted_bytes_per_rank": tiling_bytes_per_rank(
                    "attn2d", req.tokens, req.heads, req.head_dim, world, tuple(grid),
                    torch.tensor([], dtype=DTYPES[req.dtype]).element_size()),
                "seconds": max(m["seconds"] for m in mine)})
    return {"tokens": req.tokens, "heads": req.heads, "head_dim": req.head_dim,
            "dtype": req.dtype, "seed": req.seed, "tilings": report}
