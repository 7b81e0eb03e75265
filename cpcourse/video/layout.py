"""A video's layouts: one axis folded into the batch, the frames sharded along T.

    python -m pytest tests/unit/test_video.py -q

q, k, v `[B, H, T, S, D]` (T latent frames, S = h * w tokens per frame, (t, h, w) order).
Spatial attention sees each frame as one problem (`frames_to_batch`), temporal attention each
spatial position (`positions_to_batch`), full 3D attention the flattened sequence
(`flatten_video`); under CP a rank holds the frames `torch.tensor_split(range(T), P)[rank]`
(`frame_shard`, `frame_offset`, `gather_frames`). `cpcourse.video` re-exports all of them.
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import require
from cpcourse.support.groups import agree, forward_only, gather_uneven, require_group
from cpcourse.support.shards import check_rank, shard, shard_offsets, shard_sizes


def frames_to_batch(x: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, S, D]` -> `[B*T, H, S, D]`: each frame is one attention problem over S."""
    b, h, t, s, d = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, h, s, d)


def batch_to_frames(x: torch.Tensor, b: int, t: int) -> torch.Tensor:
    """Inverse of `frames_to_batch`: `[B*T, H, S, D]` -> `[B, H, T, S, D]`."""
    _, h, s, d = x.shape
    return x.reshape(b, t, h, s, d).permute(0, 2, 1, 3, 4)


def positions_to_batch(x: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, S, D]` -> `[B*S, H, T, D]`: each spatial position is one problem over T."""
    b, h, t, s, d = x.shape
    return x.permute(0, 3, 1, 2, 4).reshape(b * s, h, t, d)


def batch_to_positions(x: torch.Tensor, b: int, s: int) -> torch.Tensor:
    """Inverse of `positions_to_batch`: `[B*S, H, T, D]` -> `[B, H, T, S, D]`."""
    _, h, t, d = x.shape
    return x.reshape(b, s, h, t, d).permute(0, 2, 3, 1, 4)


def flatten_video(x: torch.Tensor) -> torch.Tensor:
    """`[B, H, T, S, D]` -> `[B, H, T*S, D]` in (t, s) order: the sequence of a full-3D model."""
    b, h, t, s, d = x.shape
    return x.reshape(b, h, t * s, d)


# --- sharding along T --------------------------------------------------------------------------

def frame_shard(x: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """Rank `rank`'s frames of a whole video `[B, H, T, S, D]` -> `[B, H, T_r, S, D]`."""
    require(isinstance(x, torch.Tensor) and x.dim() == 5, "frame_shard needs a video "
            f"[B, H, T, S, D], got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x)}")
    return shard(x, rank, world, dim=2)


def frame_offset(frames: int, rank: int, world: int) -> int:
    """Global index of rank `rank`'s first frame (what its rotary positions start from)."""
    check_rank(rank, world)
    return shard_offsets(shard_sizes(frames, world))[rank]


def gather_frames(x: torch.Tensor, group=None) -> torch.Tensor:
    """All ranks' frames `[B, H, T_r, S, D]` -> the whole video `[B, H, T, S, D]` on every rank.

    T_r may differ by one across ranks (and be 0): gloo cannot all-gather unequal sizes, so each
    rank pads its frames to the largest shard, all-gathers, and drops the padding.
    """
    require_group(group, "gather_frames")
    forward_only("gather_frames", x, use="cpcourse.cp_boundaries.gather_sequence")
    sizes = [s[2] for s in agree(group, seq_dim=2, x=x)["x"]]
    return gather_uneven(x, sizes, dim=2, group=group, what="gather_frames")
