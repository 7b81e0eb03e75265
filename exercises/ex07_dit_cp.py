# Yours to edit. Generated from solutions/ex07_dit_cp.py by tools/make_exercises.py
# stub-sha256: 412081d1c00136aa (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 07, a tiny video DiT under CP: what must not depend on P.

    python -m pytest tests/graded --ex 07.1 --impl exercises

A model under CP must give the same sample at P = 1, 2, 4. Two things break that silently:
positions computed from local frame numbers, and noise drawn per rank. The library's versions
are `cpcourse.rope.rope_3d(..., frame_offset=)` and `cpcourse.sampling.initial_noise`.
"""

from __future__ import annotations

import torch

from cpcourse.rope import apply_rope, rope_angles


def rope_on_shard(x: torch.Tensor, height: int, width: int, frames: int, rank: int,
                  world: int) -> torch.Tensor:
    """3D rotary on this rank's frames `[B, H, T_r, S, D]` of a `frames`-frame video.

    The frames are split like tensor_split(frames, world); rank r's first frame is global frame
    t0 = sum of the frames of ranks 0..r-1. Rotate by global positions:
    `apply_rope(x, rope_angles(T_r, height, width, D, frame_offset=t0))`.
    """
    # Exercise 07.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 07.1 rope_on_shard: read notebook 07, \"Positions under CP\". Hint: "
        "section 2: rotate by global positions. The only new ingredient is this "
        "rank's first global frame, the total held by the ranks before it under the "
        "tensor_split rule (as in exercise 06.1). Give it to the angle builder as its "
        "frame offset; the number of frames and the head dimension are the local "
        "tensor's. (2 more: cpcourse.hint(\"07.1\"))"
    )


def local_noise(shape: tuple, seed: int, rank: int, world: int) -> torch.Tensor:
    """This rank's frames of the starting noise of a `[B, C, T, Hl, Wl]` latent video.

    Must equal frames [t0, t0 + T_r) of the noise one process draws: float64 normal samples from
    `torch.Generator().manual_seed(seed)` over the WHOLE shape, then cast to float32. (Seeding
    each rank with seed + rank, or drawing only T_r frames, gives a different video for each P.)
    """
    # Exercise 07.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 07.2 local_noise: read notebook 07, \"The same noise at any P\". "
        "Hint: the noise must not depend on P: every rank reproduces exactly what one "
        "process draws (the whole shape, one generator seeded with `seed`, float64 "
        "samples cast to float32, as the docstring says) and keeps only its own "
        "frames along time, split by the usual rule. (2 more: cpcourse.hint(\"07.2\"))"
    )
