"""The arithmetic of a decode split along height: halo bytes and each rank's share of the peak.

    python -c "from cpcourse.support.height_split import *; print(peak_share([4, 4, 3]))"

A convolution with `pad` rows of height padding, run on a rank's rows `[..., h, W]`, needs the
`pad` rows just above and below them: each rank sends its `pad` edge rows to each neighbour it
has (the first and last rank have one, the others two) and fills the picture's edges itself.
The library's split (`cpcourse.models.vae.halo`) counts what it sent with `halo_bytes`, and the
planner (`cpcourse.planner.parallel_vae`) prices a released VAE's decode with the same function,
so the two cannot disagree. No torch here: the planner only counts.
"""

from __future__ import annotations

from math import prod

from cpcourse.support.errors import require

SPATIAL = 8  # pixels per latent row in both video VAEs the course splits


def neighbours(rank: int, world: int) -> int:
    """How many neighbours rank `rank` of `world` ranks in a row has: 0, 1 or 2."""
    require(0 <= rank < world, f"rank {rank} is not one of {world} ranks")
    return (rank > 0) + (rank < world - 1)


def halo_bytes(shape: tuple[int, ...], pad: int, elem_bytes: int, rank: int, world: int) -> int:
    """Bytes rank `rank` sends for one exchange before a convolution: `pad` rows of a tensor
    `shape = [..., h, W]` (height second to last, already padded in time and width) to each
    neighbour."""
    row = prod(shape[:-2]) * shape[-1]
    return pad * row * elem_bytes * neighbours(rank, world)


def peak_share(sizes: list[int]) -> float:
    """The busiest rank's share of one process's decode peak: the peak sits at full resolution,
    where a rank holds 8 n rows of activations plus a halo row on each side while a convolution
    runs, so about (8 n_max + 2) / (8 H_lat) for latent rows `sizes` (H_lat = their sum)."""
    return (SPATIAL * max(sizes) + 2) / (SPATIAL * sum(sizes))
