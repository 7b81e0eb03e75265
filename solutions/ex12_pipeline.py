"""Exercises of notebook 12, the whole pipeline: the halo a stack of convolutions needs, and a
bug hunt in a sampler whose ranks each hold the whole latent.

    python -m pytest tests/graded --ex 12.1 --impl exercises

The library's split decode is `cpcourse.models.vae.decode_cp` (a halo of one row per
convolution, exchanged before every convolution); its sampler draws the whole noise from one
generator (`cpcourse.tinydit.sampling.initial_noise`). Check yours in the notebook with
`cpcourse.check("12.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.tinydit.sampling import initial_noise


def halo_rows(layers: list[str]) -> int:
    """Rows a rank must receive from EACH neighbour, at the input's resolution, so that it can
    run the whole stack `layers` on its own rows plus that halo with no further exchange and get
    its output rows exactly as one process would.

    layers: applied in order to a `[B, C, H, W]` input split along H; each is "convK" (a K x K
    convolution, K odd, zero padding K // 2: it keeps H) or "upN" (nearest upsampling by the
    integer N: a rank's n rows become N n rows). Nothing else mixes rows.
    Examples: [] -> 0; ["conv3"] -> 1; ["conv3", "conv3"] -> 2; ["conv5"] -> 2;
    ["up2", "conv3"] -> 1; ["conv3", "up2", "conv3", "conv3"] -> 2.
    """
    # BEGIN SOLUTION 12.1 | notebook 12, "The halo of a stack"
    # | hint: work backwards from the output, which needs no halo. Which rows does one layer's
    # | output row read from that layer's input? Carry the count of extra rows from the last
    # | layer to the first.
    # | hint2: ["conv3", "up2", "conv3", "conv3"]: after the last conv 0 extra rows; each conv3
    # | reads one row more on each side, so 1, then 2 at the upsampled level; 2 upsampled rows
    # | above a rank's first row (an even one) come from 1 input row; then conv3: 2.
    # | hint3: h = 0; for layer in reversed(layers): h = h + int(layer[4:]) // 2 if it is a
    # | conv, else -(-h // int(layer[2:])) (the ceiling of h / N); return h.
    halo = 0
    for layer in reversed(layers):
        if layer.startswith("conv"):
            halo += int(layer[4:]) // 2
        else:
            factor = int(layer[2:])
            halo = -(-halo // factor)
    return halo
    # END SOLUTION


def replicated_sample_buggy(velocity, shape: tuple, seed: int, world: int,
                            steps: int) -> torch.Tensor:
    """A pipeline in which every rank holds the WHOLE latent, as a colleague wrote it (do not
    copy it): the ranks are simulated in this process. Right on one rank, static on two.

    Each step, rank r gives the transformer (run under CP) its frames of its own copy; the
    velocity of every frame is gathered, and every rank steps its own copy with it. Rank 0's
    copy is what gets decoded.
    """
    # every rank its own seed, so that no two ranks draw the same numbers
    copies = [initial_noise(shape, seed + rank) for rank in range(world)]
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        frames = [torch.tensor_split(c, world, dim=2)[r] for r, c in enumerate(copies)]
        v = velocity(torch.cat(frames, dim=2), float(times[i]))  # the CP forward, gathered
        copies = [c + float(times[i + 1] - times[i]) * v for c in copies]
    return copies[0]


def replicated_sample(velocity, shape: tuple, seed: int, world: int,
                      steps: int) -> torch.Tensor:
    """`replicated_sample_buggy`, fixed: rank 0's copy `[B, C, T, Hl, Wl]` after `steps` Euler
    steps from t = 1 to t = 0 (times `torch.linspace(1, 0, steps + 1)` in float64).

    velocity(x, t) -> v: the transformer's velocity for the whole latent `x [B, C, T, Hl, Wl]`
    at time t (a float), same shape. Keep the structure (every rank a whole copy, rank r's
    frames of its copy fed to the transformer, the gathered velocity applied to every copy).
    The result must equal the one-process sampler started from `initial_noise(shape, seed)`,
    for any `world` from 1 to the number of frames T, whatever the global RNG's state.
    """
    # BEGIN SOLUTION 12.2 | notebook 12, "Bug hunt: static from a sampler"
    # | hint: on one rank the buggy sampler is right. On two, which frames does the transformer
    # | see from which copy, and what does each copy keep of its own noise after the steps?
    # | Which copies must be equal for rank 0's copy to be the one-process sample?
    # | hint2: world 2, T = 4: the transformer sees frames 0-1 of copy 0 and frames 2-3 of copy
    # | 1. Both copies receive the same velocity, so copy 0 ends as that path plus (copy 0 -
    # | the patchwork) on frames 2-3: the difference of two independent noises, which is the
    # | static. Equal copies make the patchwork equal to every copy.
    # | hint3: copies = [initial_noise(shape, seed)] * world (one seed, the whole shape, for
    # | every rank); the rest of the buggy sampler is right.
    copies = [initial_noise(shape, seed) for _ in range(world)]
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        frames = [torch.tensor_split(c, world, dim=2)[r] for r, c in enumerate(copies)]
        v = velocity(torch.cat(frames, dim=2), float(times[i]))
        copies = [c + float(times[i + 1] - times[i]) * v for c in copies]
    return copies[0]
    # END SOLUTION
