"""Exercises of notebook 12, the whole pipeline: the halo a stack of convolutions needs, and a
bug hunt in a stochastic sampler whose ranks each hold the whole latent.

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


def replicated_sample_buggy(velocity, shape: tuple, seed: int, world: int, steps: int,
                            churn: float = 0.5) -> torch.Tensor:
    """A stochastic sampler in which every rank holds the WHOLE latent, as a colleague wrote it
    (do not copy it): the ranks are simulated in this process. Right on one rank.

    Each step, rank r gives the transformer (run under CP) its frames of its own copy; the
    velocity of every frame is gathered, and every rank takes the Euler step on its own copy.
    Like an SDE or a few-step consistency sampler, it then adds fresh noise (after every step
    but the last). Rank 0's copy is what gets decoded. The colleague read section 5 and starts
    every rank from the same noise.
    """
    copies = [initial_noise(shape, seed) for _ in range(world)]  # section 5: one noise
    # the noise drawn inside the loop: a generator per rank, as data-parallel scripts do
    gens = [torch.Generator().manual_seed(seed + 1 + rank) for rank in range(world)]
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        frames = [torch.tensor_split(c, world, dim=2)[r] for r, c in enumerate(copies)]
        v = velocity(torch.cat(frames, dim=2), float(times[i]))  # the CP forward, gathered
        copies = [c + float(times[i + 1] - times[i]) * v for c in copies]
        if i < steps - 1:
            copies = [c + churn * float(times[i + 1]) * torch.randn(
                shape, generator=g, dtype=torch.float64).to(c.dtype)
                for c, g in zip(copies, gens, strict=True)]
    return copies[0]


def replicated_sample(velocity, shape: tuple, seed: int, world: int, steps: int,
                      churn: float = 0.5) -> torch.Tensor:
    """`replicated_sample_buggy`, fixed: rank 0's copy `[B, C, T, Hl, Wl]` after `steps` steps
    from t = 1 to t = 0 (times `torch.linspace(1, 0, steps + 1)` in float64).

    velocity(x, t) -> v: the transformer's velocity for the whole latent `x [B, C, T, Hl, Wl]`
    at time t (a float), same shape. Keep the structure (every rank a whole copy, rank r's
    frames of its copy fed to the transformer, the gathered velocity applied to every copy,
    fresh noise scaled by churn * t_{i+1} added after every step i but the last).
    The result must equal the one-process sampler: start from `initial_noise(shape, seed)`,
    and draw the noise of the steps, in order, from one `torch.Generator()` seeded `seed + 1`
    (`torch.randn(shape, generator=g, dtype=torch.float64)`), for any `world` from 1 to the
    number of frames T, whatever the global RNG's state.
    """
    # BEGIN SOLUTION 12.2 | notebook 12, "Bug hunt: static from a stochastic sampler"
    # | hint: on one rank the buggy sampler is right. On two, the copies start equal; are they
    # | still equal after the first step that adds noise? Which frames of which copy does the
    # | transformer see next?
    # | hint2: world 2, T = 4: after step 0 copy 0 holds noise A, copy 1 noise B. The
    # | transformer sees frames 0-1 of copy 0 and frames 2-3 of copy 1; both copies receive
    # | that patchwork's velocity, so copy 0 keeps A - B on frames 2-3: static that grows with
    # | every noisy step.
    # | hint3: one generator stream for every rank: gens = [torch.Generator().manual_seed(seed
    # | + 1) for _ in range(world)] (each rank draws the same numbers); the rest is right.
    copies = [initial_noise(shape, seed) for _ in range(world)]
    gens = [torch.Generator().manual_seed(seed + 1) for _ in range(world)]
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        frames = [torch.tensor_split(c, world, dim=2)[r] for r, c in enumerate(copies)]
        v = velocity(torch.cat(frames, dim=2), float(times[i]))
        copies = [c + float(times[i + 1] - times[i]) * v for c in copies]
        if i < steps - 1:
            copies = [c + churn * float(times[i + 1]) * torch.randn(
                shape, generator=g, dtype=torch.float64).to(c.dtype)
                for c, g in zip(copies, gens, strict=True)]
    return copies[0]
    # END SOLUTION
