"""Shards: a sequence of L tokens split over P ranks like `torch.tensor_split`.

    python -c "from cpcourse.support.shards import shard_sizes; print(shard_sizes(10, 4))"

The first `L % P` ranks hold one token more; ranks may hold zero tokens. DESIGN's contract, and the
one place the split is written: the planner counts with `shard_sizes`, CP code cuts tensors with
`shard`. torch is imported inside `shard`/`unshard` only, so the planner, which only counts, loads
without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cpcourse.support.errors import require

if TYPE_CHECKING:
    import torch


def shard_sizes(length: int, world: int) -> list[int]:
    """Tokens per rank when `length` tokens are split over `world` ranks like tensor_split."""
    require(length >= 0 and world >= 1, f"need length >= 0 and world >= 1, got {length}, {world}")
    base, extra = divmod(length, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def video_shard_sizes(frames: int, per_frame: int, world: int, split: str = "frames") -> list[int]:
    """Video tokens per rank for `frames` latent frames of `per_frame` tokens over `world` ranks:
    whole frames split like tensor_split ("frames"), or the flattened tokens ("tokens"). The
    library's models and the planner both count with this."""
    require(split in ("frames", "tokens"), f"split must be 'frames' or 'tokens', got {split!r}")
    if split == "tokens":
        return shard_sizes(frames * per_frame, world)
    return [n * per_frame for n in shard_sizes(frames, world)]


def shard_offsets(sizes: list[int]) -> list[int]:
    """Start of each rank's shard in the whole sequence (prefix sums of `sizes`)."""
    offsets, total = [], 0
    for s in sizes:
        offsets.append(total)
        total += s
    return offsets


def check_rank(rank: int, world: int) -> None:
    """InputError unless `world` is a whole number >= 1 and `rank` one of 0 .. world - 1."""
    ok = all(isinstance(n, int) and not isinstance(n, bool) for n in (rank, world))
    require(ok and world >= 1 and 0 <= rank < world,
            f"need a rank in 0 .. world - 1 and world >= 1, got rank {rank!r}, world {world!r}")


def shard(x: torch.Tensor, rank: int, world: int, dim: int = 2) -> torch.Tensor:
    """Rank `rank`'s contiguous shard of `x` along `dim` (`[B, H, L, D]` -> `[B, H, L_r, D]`)."""
    import torch

    check_rank(rank, world)
    require(isinstance(x, torch.Tensor) and -x.dim() <= dim < x.dim(),
            f"shard needs a tensor with a dim {dim}, got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    return torch.tensor_split(x, world, dim=dim)[rank].contiguous()


def unshard(shards: list[torch.Tensor], dim: int = 2) -> torch.Tensor:
    """Concatenate per-rank shards back into the whole sequence (inverse of `shard`)."""
    import torch

    return torch.cat(list(shards), dim=dim)
