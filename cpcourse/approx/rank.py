"""What each rank of `cpcourse generate --approx` (and `--cache`) runs: one method, one or more
clips, with the bytes it sent and the seconds it waited on communication.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --json

`approx_rank(req, cases)` reads a `cpcourse.runs.approx.ApproxRequest`: `req.run` (the plain
GenerateRequest: model, shape, steps, guidance), `approx` ("exact", or one of `METHODS`),
`warmup`, `patches`, `cache` (None or "fbcache"), `cache_threshold`, `cache_rule`,
`cache_decide` and `split`; `cases` ([[label, seed], ...]) samples several clips in one launch
(a benchmark). The patch methods (exact, naive, displaced, and the cache) hold the rank's
frames `[B, C, T_r, Hl, Wl]`; pipefusion and asyncdiff hold the whole latent on every rank.
`split` "space" gives the patch methods bands of token rows `[B, C, T, Hl/P, Wl]` instead of frames.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.approx.asyncdiff import AsyncDiffDiT
from cpcourse.approx.displaced import DisplacedAttention
from cpcourse.approx.fbcache import FirstBlockCache
from cpcourse.approx.naive import NaiveAttention
from cpcourse.approx.patches import ExactAttention
from cpcourse.approx.pipefusion import PipeFusionDiT
from cpcourse.support.bytecount import count_bytes
from cpcourse.support.dtypes import torch_dtype
from cpcourse.tinydit.model import CPContext
from cpcourse.tinydit.sampling import initial_noise, sample, spec_model
from cpcourse.video import frame_offset

WHOLE_VIDEO = ("pipefusion", "asyncdiff")  # every rank holds (and returns) the whole latent


def approx_rank(req, cases=None) -> dict:
    """This rank's clips: {"rank", "clips": [{"frames", "bytes", "exposed_seconds",
    "steps_skipped", "changes", "local_changes", "step_seconds"}, ...]}."""
    model = spec_model(req.run)
    cases = cases or [[req.run.cond, req.run.seed]]
    return {"rank": dist.get_rank(), "clips": [_one_clip(model, req, label, seed)
                                               for label, seed in cases]}


def approx_ranks(requests: list, cases=None) -> list[dict]:
    """`approx_rank` of each request in turn, in one launch (a notebook's whole sweep)."""
    return [approx_rank(req, cases) for req in requests]


def _one_clip(model, req, label, seed: int) -> dict:
    rank, world, group = dist.get_rank(), dist.get_world_size(), dist.group.WORLD
    method, run = req.approx, req.run
    b, c, t, hl, wl = run.shape
    grid = (hl // model.cfg.patch, wl // model.cfg.patch)
    noise = initial_noise(tuple(run.shape), seed, torch_dtype(run.dtype))  # [B, C, T, Hl, Wl]
    if method in WHOLE_VIDEO:
        runner = (PipeFusionDiT(model, group, req.warmup, req.patches)
                  if method == "pipefusion" else AsyncDiffDiT(model, group, req.warmup))
        ctx, waits = CPContext(grid=grid), runner
    else:
        split = req.split
        # [B, C, T/P, Hl, Wl] (time) or [B, C, T, Hl/P, Wl] (space)
        noise = torch.tensor_split(noise, world, dim=2 if split == "time" else 3)[rank]
        attention = {"exact": ExactAttention, "naive": NaiveAttention,
                     "displaced": DisplacedAttention}[method]
        waits = attention(model, group, req.warmup, split)
        rows = noise.shape[3] // model.cfg.patch  # this rank's token rows
        ctx = (CPContext(group=group, frame_offset=frame_offset(t, rank, world), grid=grid,
                         attend=waits) if split == "time" else
               CPContext(group=group, grid=(rows, grid[1]), row_offset=rank * rows,
                         attend=waits))
        noise = noise.contiguous()
        runner = model if req.cache is None else FirstBlockCache(
            model, group, req.cache_threshold, req.cache_decide, req.cache_rule)
    times: list[float] = []
    with count_bytes() as sent:  # frames: noise's shape, this rank's part or the whole latent
        frames = sample(runner, noise, label, run.steps, run.cfg_scale, ctx, times)
        waits.close()
    cached = isinstance(runner, FirstBlockCache)
    return {"frames": frames, "bytes": sent.total, "exposed_seconds": waits.exposed,
            "step_seconds": times, "steps_skipped": runner.skipped if cached else 0,
            "changes": runner.changes if cached else [],
            "local_changes": runner.local_changes if cached else []}
