"""Real diffusers video VAEs built tiny, seeded random weights (no download), and their latents.

    python -c "from cpcourse.models.vae import build_vae; print(build_vae('wan'))"

`build_vae(arch, seed)` returns diffusers' own class (`AutoencoderKLWan` for "wan",
`AutoencoderKLHunyuanVideo` for "hunyuanvideo") with a narrow, shallow config and the same
blocks as the released checkpoints: causal 3-D convolutions with a per-frame cache (Wan) or
causal time padding (HunyuanVideo), nearest upsampling, a mid-block attention over every pixel,
RMS norm over channels (Wan) or GroupNorm (HunyuanVideo). Both compress 8x in height and width
and 4x in time: a video of F = 4k + 1 frames has k + 1 latent frames.
`example_latents(arch, frames, height, width, seed)` gives the latents `[B, C, F_lat, H_lat,
W_lat]` of a video of `frames` x `height` x `width` pixels.
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import InputError, positive_int, require, seed_int

SPATIAL, TEMPORAL = 8, 4  # the compression of both VAEs (and of the released ones)

TINY = {
    "wan": ("AutoencoderKLWan",
            dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                 temperal_downsample=[False, True, True], latents_mean=[0.0] * 4,
                 latents_std=[1.0] * 4)),
    "hunyuanvideo": ("AutoencoderKLHunyuanVideo",
                     dict(latent_channels=4, block_out_channels=(8, 16, 16, 16),
                          layers_per_block=1, norm_num_groups=4, mid_block_add_attention=True)),
}
ARCHS = tuple(TINY)
DTYPES = (torch.float32, torch.bfloat16, torch.float64)


def _check_dtype(dtype) -> None:
    require(dtype in DTYPES, f"--dtype must be a torch dtype among float32, bfloat16, float64, "
            f"got {dtype!r}")


def check_video_size(arch: str, frames: int, height: int, width: int) -> tuple[int, int, int]:
    """The latent (frames, height, width) of a video the VAE can take; InputError otherwise."""
    require(arch in TINY, f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    for flag, n in (("--frames", frames), ("--height", height), ("--width", width)):
        require(isinstance(n, int) and not isinstance(n, bool), f"{flag} must be a whole "
                f"number, got {n!r}")
    require(frames >= 1 and (frames - 1) % TEMPORAL == 0,
            f"--frames must be {TEMPORAL}k + 1 (1, 5, 9, ...): the VAE decodes one frame, then "
            f"{TEMPORAL} per latent frame; got {frames}")
    for flag, n in (("--height", height), ("--width", width)):
        require(n >= SPATIAL and n % SPATIAL == 0,
                f"{flag} must be a positive multiple of {SPATIAL} (the VAE's spatial "
                f"compression); got {n}")
    return (frames - 1) // TEMPORAL + 1, height // SPATIAL, width // SPATIAL


def build_vae(arch: str, seed: int = 0, dtype=torch.float32):
    """diffusers' own VAE class for `arch`, tiny, with weights drawn from `seed`, in eval mode.

    The same seed gives the same weights in every process, so P ranks that each build it hold
    one model. Parameters are redrawn after construction (normal, std 0.2) because some
    diffusers blocks start at zero, which would make a random VAE decode a constant."""
    if arch not in TINY:
        raise InputError(f"--arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    seed_int("--seed", seed)
    _check_dtype(dtype)
    import diffusers

    cls, config = TINY[arch]
    torch.manual_seed(seed)
    vae = getattr(diffusers, cls)(**config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in vae.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return (vae if dtype == torch.float32 else vae.to(dtype)).eval()


def example_latents(arch: str, frames: int = 5, height: int = 32, width: int = 32,
                    seed: int = 0, batch: int = 1, dtype=torch.float32) -> torch.Tensor:
    """Seeded latents `[B, C, F_lat, H_lat, W_lat]` of a `frames` x `height` x `width` video."""
    f, h, w = check_video_size(arch, frames, height, width)
    seed_int("--seed", seed)
    positive_int("batch", batch)
    _check_dtype(dtype)
    gen = torch.Generator().manual_seed(seed + 1)  # not the weights' stream
    return torch.randn(batch, 4, f, h, w, generator=gen).to(dtype)
