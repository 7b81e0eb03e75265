"""Exercises of notebook 07, a tiny video DiT under CP: what must not depend on P.

    python -m pytest tests/graded --ex 07.1 --impl exercises

A model under CP must give the same sample at P = 1, 2, 4. Two things break that silently:
positions computed from local frame numbers, and noise drawn per rank. The library's versions
are `cpcourse.tinydit.rope.rope_3d(..., frame_offset=)` and
`cpcourse.tinydit.sampling.initial_noise`. Exercise
07.3 is a bug hunt: a rank's set-up that passes every test at 8 frames and is wrong at 5.
"""

from __future__ import annotations

import torch

from cpcourse.tinydit.model import CPContext, frame_embedding, patchify
from cpcourse.tinydit.rope import apply_rope, rope_angles


def rope_on_shard(x: torch.Tensor, height: int, width: int, frames: int, rank: int,
                  world: int) -> torch.Tensor:
    """3D rotary on this rank's frames `[B, H, T_r, S, D]` of a `frames`-frame video.

    The frames are split like tensor_split(frames, world); rank r's first frame is global frame
    t0 = sum of the frames of ranks 0..r-1. Rotate by global positions:
    `apply_rope(x, rope_angles(T_r, height, width, D, frame_offset=t0))`.
    """
    # BEGIN SOLUTION 07.1 | notebook 07, "Positions under CP"
    # | hint: section 2: rotate by global positions. The only new ingredient is this rank's first
    # | global frame, the total held by the ranks before it under the tensor_split rule (as in
    # | exercise 06.1). Give it to the angle builder as its frame offset; the number of frames and
    # | the head dimension are the local tensor's.
    # | hint2: frames = 8, world = 2: rank 1 holds frames 4-7, so t0 = 4 (the notebook's cell).
    # | frames = 7, world = 3: sizes [3, 2, 2]; rank 2 has T_r = 2 and t0 = 5. frames = 2, world =
    # | 3: rank 2 holds nothing and t0 = 2.
    # | hint3: t0 = rank * (frames // world) + min(rank, frames % world); apply_rope(x,
    # | rope_angles(x.shape[2], height, width, x.shape[-1], frame_offset=t0)).
    base, extra = divmod(frames, world)
    t0 = rank * base + min(rank, extra)
    return apply_rope(x, rope_angles(x.shape[2], height, width, x.shape[-1], frame_offset=t0))
    # END SOLUTION


def local_noise(shape: tuple, seed: int, rank: int, world: int) -> torch.Tensor:
    """This rank's frames of the starting noise of a `[B, C, T, Hl, Wl]` latent video.

    Must equal frames [t0, t0 + T_r) of the noise one process draws: float64 normal samples from
    `torch.Generator().manual_seed(seed)` over the WHOLE shape, then cast to float32. (Seeding
    each rank with seed + rank, or drawing only T_r frames, gives a different video for each P.)
    """
    # BEGIN SOLUTION 07.2 | notebook 07, "The same noise at any P"
    # | hint: the noise must not depend on P: every rank reproduces exactly what one process draws
    # | (the whole shape, one generator seeded with `seed`, float64 samples cast to float32, as the
    # | docstring says) and keeps only its own frames along time, split by the usual rule.
    # | hint2: shape (1, 4, 8, 16, 16) on P = 2: both ranks draw all 8 frames; rank 0 keeps frames
    # | 0-3, rank 1 frames 4-7, and the two joined on dim 2 equal the P = 1 noise. With T = 5 frames
    # | on P = 2, rank 0 keeps 3 and rank 1 keeps 2. Seeding rank 1 with seed + 1 would give it
    # | numbers that differ from frames 4-7 of the P = 1 draw.
    # | hint3: gen = torch.Generator().manual_seed(seed); whole = torch.randn(shape, generator=gen,
    # | dtype=torch.float64).float(); return torch.tensor_split(whole, world,
    # | dim=2)[rank].contiguous().
    gen = torch.Generator().manual_seed(seed)
    whole = torch.randn(shape, generator=gen, dtype=torch.float64).float()
    return torch.tensor_split(whole, world, dim=2)[rank].contiguous()
    # END SOLUTION


def shard_embed_buggy(model, latents: torch.Tensor, rank: int, world: int):
    """A rank's set-up of the tiny DiT's forward that looks right and is not (do not copy it).

    Its author checked it on the notebook's 8-frame clips at P = 2 and 4: the same tokens as
    one process, to the bit. Run it on 5 frames over 2 ranks and compare.
    """
    p = model.cfg.patch
    tokens = patchify(torch.tensor_split(latents, world, dim=2)[rank], p)  # [B, T_r, S, C p p]
    t_r = tokens.shape[1]
    ctx = CPContext(frame_offset=rank * t_r, grid=(latents.shape[3] // p, latents.shape[4] // p))
    x = model.embed(tokens)
    idx = torch.arange(ctx.frame_offset, ctx.frame_offset + t_r)
    fe = model.frame_proj(frame_embedding(idx, model.cfg.hidden).to(x.dtype))
    return x + fe[None, :, None], ctx


def shard_embed(model, latents: torch.Tensor, rank: int, world: int):
    """`shard_embed_buggy`, fixed: what rank `rank` of `world` feeds the first block.

    model: a `cpcourse.tinydit.model.TinyVideoDiT` with `cfg.frame_embed` (the shapes model's
    design); latents `[B, C, T, Hl, Wl]`: the whole video (every rank holds it: exercise 07.2).
    Returns (x `[B, T_r, S, hidden]`: this rank's frames, patch-embedded, plus the frame embedding;
    ctx: the `cpcourse.tinydit.model.CPContext` its blocks rotate q and k with). Joined over the
    ranks, x must equal what one process computes for the whole video, and rotating by ctx must give
    one process's rotary rows, for ANY number of frames and ranks. Keep the buggy version's
    steps and find what makes it wrong.
    """
    # BEGIN SOLUTION 07.3 | notebook 07, "Bug hunt: right at 8 frames, wrong at 5"
    # | hint: the buggy version uses one number for both positions (rotary and frame embedding),
    # | so it is consistent, and every clip of this notebook has 8 frames on 1, 2 or 4 ranks.
    # | Ask which quantity in its offset is this rank's own, and whether the ranks before it hold
    # | as many frames as this one does when P does not divide T.
    # | hint2: 5 frames on 2 ranks split [3, 2]: rank 1 holds frames 3 and 4, but the buggy offset
    # | is rank * T_r = 1 * 2 = 2, so it embeds and rotates them as frames 2 and 3. With 8 frames
    # | on 2 ranks ([4, 4]) rank * T_r = 4 is right, which is why the author's test passed.
    # | hint3: the first frame is what the ranks before hold, not rank * (my count): ctx =
    # | CPContext(frame_offset=cpcourse.video.frame_offset(T, rank, world), grid=...), i.e. rank
    # | * (T // world) + min(rank, T % world); the rest of the buggy version is right.
    p = model.cfg.patch
    frames = latents.shape[2]
    tokens = patchify(torch.tensor_split(latents, world, dim=2)[rank], p)
    t_r = tokens.shape[1]
    base, extra = divmod(frames, world)
    t0 = rank * base + min(rank, extra)  # frames held by the ranks before this one
    ctx = CPContext(frame_offset=t0, grid=(latents.shape[3] // p, latents.shape[4] // p))
    x = model.embed(tokens)
    idx = torch.arange(t0, t0 + t_r)
    fe = model.frame_proj(frame_embedding(idx, model.cfg.hidden).to(x.dtype))
    return x + fe[None, :, None], ctx
    # END SOLUTION
