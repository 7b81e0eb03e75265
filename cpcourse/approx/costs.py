"""Bytes each rank sends per denoising step under each method: the formula the counter is held to.

    python -c "from cpcourse.approx.costs import *; from cpcourse.tinydit.training import \
shapes_config as s; print(bytes_per_step('displaced', s(), (1, 3, 8, 32, 32), 2, 0))"

With guidance the model runs on a batch of 2B; L = T*S tokens, L_r = L / P a rank's; d = hidden
(= H * D); e = bytes per element; L layers of attention. Per step, per rank:

    exact, displaced   L * 2 * 2B * L_r * d * e * (P - 1)   every layer all-gathers its K/V
                                                          (displaced: one step later)
    naive              the same in the warm-up steps, 0 after
    pipefusion         2B * L * d * e to the next stage (ranks < P-1); the last stage
                       broadcasts the prediction: 2B * L * C*p*p * e * (P - 1)
    asyncdiff          2B * L * d * e * (P - 1): each rank broadcasts its component's output
    fbcache            + 2 doubles all-reduced (16 * 2 (P - 1) / P bytes) per step after the first

The patch methods send the same bytes as exact CP (displaced only moves them off the critical
path); pipefusion and asyncdiff send hidden states once per step instead of K/V in every layer.
"""

from __future__ import annotations

from cpcourse.support.errors import positive_int, require
from cpcourse.tinydit.model import DiTConfig

COSTED = ("exact", "naive", "displaced", "pipefusion", "asyncdiff")


def bytes_per_step(method: str, cfg: DiTConfig, shape, world: int, rank: int, step: int,
                   warmup: int = 0, elem_bytes: int = 4) -> int:
    """What rank `rank` of `world` sends at step `step` (0-based) of `method` ("exact", "naive",
    "displaced", "pipefusion", "asyncdiff"), for latents `shape` [B, C, T, Hl, Wl]."""
    require(method in COSTED, f"method must be exact, naive, displaced, pipefusion or "
            f"asyncdiff, got {method!r}")
    world = positive_int("world", world)
    require(isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < world,
            f"rank must be in [0, {world}), got {rank!r}")
    step = positive_int("step", step, allow_zero=True)
    warmup = positive_int("warmup", warmup, allow_zero=True)
    require(len(shape) == 5, f"shape must be latents [B, C, T, Hl, Wl], got {tuple(shape)}")
    b, c, t, hl, wl = (positive_int("shape", n) for n in shape)
    tokens = t * (hl // cfg.patch) * (wl // cfg.patch)
    batch = 2 * b  # conditional and unconditional passes in one batch
    layers = cfg.depth  # one temporal or full attention per block talks to other ranks
    if world == 1:
        return 0
    kv = layers * 2 * batch * (tokens // world) * cfg.hidden * elem_bytes * (world - 1)
    if method in ("exact", "displaced"):
        return kv
    if method == "naive":
        return kv if step < warmup else 0
    hidden = batch * tokens * cfg.hidden * elem_bytes
    if method == "asyncdiff":
        return hidden * (world - 1)
    if method == "pipefusion":
        patch_dim = cfg.in_channels * cfg.patch ** 2
        return hidden if rank < world - 1 else batch * tokens * patch_dim * elem_bytes * (world - 1)
    raise ValueError(f"method must be exact, naive, displaced, pipefusion or asyncdiff, "
                     f"got {method!r}")


def cache_bytes_per_step(world: int, step: int) -> int:
    """The first-block cache's all-reduce of (change, size) as doubles: none at step 0."""
    world = positive_int("world", world)
    step = positive_int("step", step, allow_zero=True)
    return 0 if step == 0 or world == 1 else 2 * (world - 1) * 16 // world
