"""A parallelized model's latents as frame shards: what a `shard_io` model takes and returns.

    python -m cpcourse.cli models --arch wan --nproc 3 --method ring --shard-io --compare

`shard_latents(model, latents)` is this rank's latent frames (whole temporal patches, the same
split as the model's tokens); `gather_latents(model, shard)` puts every rank's frames back
together on each rank. A sampler on a `shard_io` model keeps its state as shards and gathers
once, at the end, instead of after every forward.
"""

from __future__ import annotations

import torch

from cpcourse.models.parallel import cp_state
from cpcourse.models.split import latent_grid
from cpcourse.support.errors import require
from cpcourse.support.groups import all_gather_single, comm_device, gather_uneven
from cpcourse.support.shards import shard_offsets, shard_sizes


def _frame_dim(model) -> int:
    return 1 if type(model).__name__ == "CogVideoXTransformer3DModel" else 2


def shard_latents(model, latents: torch.Tensor) -> torch.Tensor:
    """This rank's latent frames of the whole `latents` (what a shard_io model takes)."""
    cp = cp_state(model)
    require(cp is not None, "shard_latents needs a parallelized model")
    dim = _frame_dim(model)
    frames, _, _ = latent_grid(model, latents)
    sizes = shard_sizes(frames, cp.world)
    require(min(sizes) >= 1, f"only {frames} latent frames for {cp.world} ranks")
    pt = latents.shape[dim] // frames
    start = shard_offsets(sizes)[cp.rank] * pt
    # [B, C, F, H, W] -> [B, C, F_r, H, W] (CogVideoX: dim 1 of [B, F, C, H, W]), whole patches
    return latents.narrow(dim, start, sizes[cp.rank] * pt).contiguous()


def gather_latents(model, shard: torch.Tensor) -> torch.Tensor:
    """Every rank's latent frames -> the whole latents on each (inverse of shard_latents)."""
    cp = cp_state(model)
    require(cp is not None, "gather_latents needs a parallelized model")
    dim = _frame_dim(model)
    moved = shard.movedim(dim, 1)  # [B, F_r, ...]
    flat = moved.reshape(moved.shape[0], moved.shape[1], -1)  # [B, F_r, C*H*W]
    sizes = torch.empty(cp.world, dtype=torch.int64, device=comm_device(cp.group))
    all_gather_single(sizes, torch.tensor([flat.shape[1]], device=sizes.device), group=cp.group)
    whole = gather_uneven(flat, sizes.tolist(), dim=1, group=cp.group)  # [B, F, C*H*W]
    # -> [B, F, C, H, W] -> the model's layout ([B, C, F, H, W]; CogVideoX keeps [B, F, C, H, W])
    return whole.reshape(moved.shape[0], whole.shape[1], *moved.shape[2:]).movedim(1, dim)
