"""Decoding latents on P ranks split along height, equal to one process: `decode_cp`.

    python -m pytest tests/dist/test_vae_cp.py -q

    vae = build_vae("wan", seed=0)                     # on every rank, the same weights
    video = decode_cp(vae, latents)                    # latents [B, C, F_lat, H_lat, W_lat]
    video.shape                                        # [B, 3, F, 8 H_lat, 8 W_lat] everywhere

Every rank passes the FULL latents (they are 8 x 8 x 4 / 16 = 16 times smaller per frame than
the video, and a sampler under CP has gathered them anyway) and decodes its `tensor_split` rows
of them; the layers that mix rows are patched for the call (`cpcourse.models.vae.halo`).
`gather=False` returns only the rank's rows of the video `[B, 3, F, 8 n_r, W]`.
"""

from __future__ import annotations

import torch

from cpcourse.models.vae.build import SPATIAL
from cpcourse.models.vae.halo import HeightSplit, patched
from cpcourse.support.errors import positive_int, require
from cpcourse.support.groups import forward_only, gather_uneven, require_group
from cpcourse.support.height_split import peak_share
from cpcourse.support.shards import shard_sizes


def split_rows(height: int, world: int) -> list[int]:
    """Latent rows per rank: `torch.tensor_split` sizes, the first ranks one longer. Every
    rank needs a row: `world` above `height` is an InputError, as on the command line."""
    height, world = positive_int("height", height), positive_int("nproc", world)
    require(world <= height, f"nproc {world}: {height} latent rows cannot be split over "
            f"{world} ranks: use at most {height} ranks, or a taller video")
    return shard_sizes(height, world)


def decode_rows(vae, latents: torch.Tensor, group=None, sync_norm: bool = True):
    """This rank's rows of the decoded video `[B, 3, F, 8 n_r, W]`, and its HeightSplit."""
    _check_latents(vae, latents)
    forward_only("decode_cp", latents)
    rank, world = require_group(group, "decode_cp")
    height = latents.shape[-2]
    require(height >= world, f"decode_cp: {height} latent rows cannot be split over {world} "
            f"ranks: use at most {height} ranks, or a taller video")
    require(not getattr(vae, "use_tiling", False),
            "decode_cp: turn tiling off (vae.disable_tiling()): the split replaces the tiles")
    sizes = split_rows(height, world)
    start = sum(sizes[:rank])
    rows = latents[..., start:start + sizes[rank], :].contiguous()
    split = HeightSplit(group, sizes)
    with patched(vae, split, sync_norm=sync_norm):
        out = vae.decode(rows).sample
    return out, split


def _check_latents(vae, latents) -> None:
    """Latents `[B, C, F_lat, H_lat, W_lat]` with the VAE's channels and dtype, else one line."""
    require(isinstance(latents, torch.Tensor) and latents.dim() == 5, "decode_cp: latents "
            "must be [B, C, F_lat, H_lat, W_lat], got "
            f"{tuple(getattr(latents, 'shape', ()))}")
    cfg = getattr(vae, "config", {})
    channels = cfg.get("z_dim") or cfg.get("latent_channels")
    require(channels is None or latents.shape[1] == channels, f"decode_cp: latents have "
            f"{latents.shape[1]} channels, the VAE takes {channels}")
    dtype = next(vae.parameters()).dtype
    require(latents.dtype == dtype, f"decode_cp: latents are {latents.dtype}, the VAE's "
            f"weights {dtype}: convert one of them")


def decode_cp(vae, latents: torch.Tensor, group=None, gather: bool = True,
              sync_norm: bool = True) -> torch.Tensor:
    """Decode `latents [B, C, F_lat, H_lat, W_lat]` split along height over `group`'s ranks.

    Returns the full video `[B, 3, F, 8 H_lat, 8 W_lat]` on every rank (one all-gather of rows),
    or with `gather=False` this rank's rows. Equal to `vae.decode(latents)` in one process to
    float32 rounding (1e-5), whatever the split; `sync_norm=False` leaves GroupNorm's statistics
    per rank (wrong on purpose: HunyuanVideo's VAE then differs from one process)."""
    out, split = decode_rows(vae, latents, group, sync_norm)
    if not gather:
        return out
    sizes = [n * SPATIAL for n in split.sizes]
    return gather_uneven(out.contiguous(), sizes, dim=3, group=group, what="VAE video rows")


def predicted_peak_per_rank(peak_single: int, sizes: list[int]) -> int:
    """One process's peak scaled to the busiest rank's rows plus its two halo rows.

    About (8 n_max + 2) / (8 H_lat) of it (`cpcourse.support.height_split.peak_share`)."""
    positive_int("peak_single", peak_single, allow_zero=True)
    require(len(sizes) > 0 and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                   for n in sizes),
            f"sizes must be each rank's latent rows (positive), got {sizes}")
    return int(peak_single * peak_share(sizes))
