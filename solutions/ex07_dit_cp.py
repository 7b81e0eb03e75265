"""Exercise of notebook 07, a tiny video DiT under CP: find every input that depends on P.

    python -m pytest tests/graded --ex 07.1 --impl exercises

A model under CP must give the same sample at P = 1, 2, 4. Nothing raises when it does not:
the clip is just different. `rank_inputs_buggy` is a colleague's set-up of what one rank feeds
the model's first block; its P = 4 clip differs from the P = 1 clip. Exercise 07.1 is a
diagnosis: find every input in it that depends on P, and fix each one in `rank_inputs`.
"""

from __future__ import annotations

import torch

from cpcourse.tinydit.model import CPContext, frame_embedding, patchify


def rank_inputs_buggy(model, shape: tuple, seed: int, rank: int, world: int):
    """A rank's start of sampling that looks right and is not (do not copy it).

    Its author checked that P = 1 reproduces the single-process sampler exactly. At P = 4 the
    tracker still sees a shape moving, but not the P = 1 clip.
    """
    frames = shape[2]
    t_r = torch.tensor_split(torch.arange(frames), world)[rank].numel()
    gen = torch.Generator().manual_seed(seed + rank)
    noise = torch.randn((*shape[:2], t_r, *shape[3:]), generator=gen,
                        dtype=torch.float64).float()
    p = model.cfg.patch
    ctx = CPContext(frame_offset=rank * t_r, grid=(shape[3] // p, shape[4] // p))
    x = model.embed(patchify(noise, p))                                   # [B, T_r, S, hidden]
    fe = model.frame_proj(frame_embedding(torch.arange(t_r), model.cfg.hidden).to(x.dtype))
    return noise, x + fe[None, :, None], ctx


def rank_inputs(model, shape: tuple, seed: int, rank: int, world: int):
    """What rank `rank` of `world` feeds the first block when sampling a `shape` video.

    model: a `cpcourse.tinydit.model.TinyVideoDiT` with `cfg.frame_embed` (the shapes model's
    design); shape `[B, C, T, Hl, Wl]`: the whole latent video; frames split over the ranks
    like `torch.tensor_split` (the first T % P ranks hold one more). Returns, as
    `rank_inputs_buggy` does:
    - noise `[B, C, T_r, Hl, Wl]` float32: this rank's frames of the starting noise;
    - x `[B, T_r, S, hidden]`: those frames patch-embedded, plus the frame embedding;
    - ctx: the `cpcourse.tinydit.model.CPContext` its blocks rotate q and k with.
    P = 1 is right as it stands (one process draws `torch.randn(shape)` in float64 from
    `torch.Generator().manual_seed(seed)`, then casts to float32). Joined over the ranks, each
    output must equal what one process computes, for any number of frames and ranks: find
    every place where the buggy version lets P in.
    """
    # BEGIN SOLUTION 07.1 | notebook 07, "Find every input that depends on P"
    # | hint: go through the buggy version line by line and ask of each value: does one
    # | process compute this same number for these frames? Three of them depend on P (the first
    # | two show at P = 2 already, the third only when P does not divide the frames).
    # | hint2: 5 frames on 2 ranks split [3, 2]. Rank 1 holds global frames 3 and 4. Its noise
    # | must be frames 3-4 of the one-process draw (not a draw seeded seed + 1); its frame
    # | embedding rows are those of frames 3 and 4 (not 0 and 1); its rotary offset is 3, where
    # | rank * T_r = 2 (with 8 frames on 2 ranks rank * T_r = 4 is right, which hid it).
    # | hint3: whole = torch.randn(shape, generator=manual_seed(seed), float64).float(); noise =
    # | tensor_split(whole, world, 2)[rank]; t0 = rank * (T // world) + min(rank, T % world);
    # | CPContext(frame_offset=t0, ...); frame_embedding(torch.arange(t0, t0 + T_r), hidden).
    frames = shape[2]
    gen = torch.Generator().manual_seed(seed)
    whole = torch.randn(shape, generator=gen, dtype=torch.float64).float()  # same for every P
    noise = torch.tensor_split(whole, world, dim=2)[rank].contiguous()
    t_r = noise.shape[2]
    base, extra = divmod(frames, world)
    t0 = rank * base + min(rank, extra)  # the frames held by the ranks before this one
    p = model.cfg.patch
    ctx = CPContext(frame_offset=t0, grid=(shape[3] // p, shape[4] // p))
    x = model.embed(patchify(noise, p))
    idx = torch.arange(t0, t0 + t_r)     # global frame indices, as one process numbers them
    fe = model.frame_proj(frame_embedding(idx, model.cfg.hidden).to(x.dtype))
    return noise, x + fe[None, :, None], ctx
    # END SOLUTION
