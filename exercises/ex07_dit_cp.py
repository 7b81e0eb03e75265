# Yours to edit. Generated from solutions/ex07_dit_cp.py by tools/make_exercises.py
# stub-sha256: c2dd254eba9fb43e (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 07.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 07.1 rank_inputs: read notebook 07, \"Find every input that depends "
        "on P\". Hint: go through the buggy version line by line and ask of each "
        "value: does one process compute this same number for these frames? Three of "
        "them depend on P (the first two show at P = 2 already, the third only when P "
        "does not divide the frames). (2 more: cpcourse.hint(\"07.1\"))"
    )
