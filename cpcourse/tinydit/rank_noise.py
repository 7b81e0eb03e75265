"""The same noise on every rank: the bug that turns part of a multi-GPU video to static.

    python -c "from cpcourse.tinydit.rank_noise import noise_clip; print(noise_clip(world=2)[1])"

The library's samplers (`cpcourse.tinydit.sampling.initial_noise`, `cpcourse.models.sampler`)
draw the whole video's noise `[B, C, T, Hl, Wl]` from a private generator seeded by the user's
seed, on every rank, and each rank keeps its frames: no rank's global RNG state enters, so the
clip is the same at any P (tests/dist/test_dit_cp.py proves it with every rank's global RNG
scrambled first).

Pipelines grown from a one-GPU script often hold the WHOLE latent on every rank instead: each
rank feeds its frames to the transformer under CP, gathers the velocity of every frame, steps
its own copy, and rank 0 decodes its copy. That is correct only when every copy starts from the
same noise. When each rank draws its own (`torch.manual_seed(seed + rank)`, or no seed at all),
the transformer sees a patchwork (rank r's frames of copy r) and every copy receives the same
update, so copy r stays the patchwork's path plus (its noise - the patchwork). Rank 0's copy
is right in its own frames and carries the difference of two independent noises in everyone
else's: static, the symptom users report (SkyReels-V2 #24, MAGI-1 #44, HunyuanVideo-I2V #35).

`replicated_sample` is that pipeline for the tiny model, in one process: the transformer under
CP equals one process on the same frames (tests/dist/test_dit_cp.py), so the patchwork's path is
`sample` on the patchwork, and the copy is that plus the offset. The velocity is what is
gathered, as in flow models that predict it (Wan, HunyuanVideo); the shapes model's x0 becomes
one on the frames the transformer saw, as `sample` turns it. `noise_clip` decodes rank 0's copy
of a prompt's clip and tracks it (`cpcourse.tinydit.moving_shapes.track`).
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import positive_int, require, seed_int
from cpcourse.tinydit.sampling import initial_noise, sample


def copies_noise(shape: tuple, seed: int, world: int, per_rank_noise: bool,
                 dtype=torch.float32) -> list[torch.Tensor]:
    """The starting copy `[B, C, T, Hl, Wl]` of each of `world` ranks: all
    `initial_noise(shape, seed)` (the library's way), or rank r's own `initial_noise(shape,
    seed + r)` when `per_rank_noise` (the bug)."""
    world = positive_int("world", world)
    require(world <= shape[2], f"world {world}: more ranks than the {shape[2]} frames")
    return [initial_noise(shape, seed + (r if per_rank_noise else 0), dtype)
            for r in range(world)]


def replicated_sample(model, shape: tuple, seed: int, label, steps: int, cfg_scale: float,
                      world: int, per_rank_noise: bool = True) -> torch.Tensor:
    """Rank 0's copy `[B, C, T, Hl, Wl]` after `steps` when `world` ranks each hold the whole
    latent (see the module docstring). With `per_rank_noise` False, `sample` from
    `initial_noise(shape, seed)`, whatever `world`."""
    seed = seed_int("seed", seed)
    dtype = next(model.parameters()).dtype
    copies = copies_noise(tuple(shape), seed, world, per_rank_noise, dtype)
    frames = [torch.tensor_split(c, world, dim=2)[r] for r, c in enumerate(copies)]
    patchwork = torch.cat(frames, dim=2)  # rank r feeds the transformer its frames of copy r
    path = sample(model, patchwork, label, steps, cfg_scale)
    # every copy took the same gathered steps: it keeps its offset from the patchwork
    return path + (copies[0] - patchwork)


def noise_clip(prompt: str = "circle-right", seed: int = 0, world: int = 2,
               per_rank_noise: bool = True, model=None) -> tuple[torch.Tensor, dict]:
    """The trained shapes model's clip `[T, 3, H, W]` for `prompt` as rank 0 of `world` ranks
    holding whole copies decodes it, and what the tracker sees in it: `track`'s report with
    `matches` (direction, shape, present_fraction: the frames with one object) merged in."""
    from cpcourse.tinydit.moving_shapes import matches, parse_prompt, track
    from cpcourse.tinydit.training import (
        FRAMES,
        SAMPLE_STEPS,
        SIZE,
        load_shapes_model,
        to_clip,
    )

    model = model or load_shapes_model()
    shape = (1, model.cfg.in_channels, FRAMES, SIZE, SIZE)
    latents = replicated_sample(model, shape, seed, parse_prompt(prompt), SAMPLE_STEPS, 4.0,
                                world, per_rank_noise)
    clip = to_clip(latents)
    report = track(clip)
    return clip, {**report, **matches(prompt, report)}
