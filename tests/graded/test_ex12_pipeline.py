"""Graded tests of notebook 12: the halo of a stack of convolutions, and the same noise on every
rank of a sampler that replicates the latent.

    python -m pytest tests/graded --ex 12.1 --impl solutions
"""

import random

import pytest
import torch
import torch.nn.functional as F

from cpcourse.course.testing import assert_close
from cpcourse.tinydit.sampling import initial_noise


def _stack(layers, seed):
    """Random float64 weights for `layers`, and the function that runs them `[1, 2, H, W]`."""
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(2, 2, int(la[4:]), int(la[4:]), generator=gen, dtype=torch.float64)
               if la.startswith("conv") else None for la in layers]

    def run(x):
        for la, w in zip(layers, weights, strict=True):
            if w is None:
                x = F.interpolate(x, scale_factor=int(la[2:]), mode="nearest")
            else:
                x = torch.tanh(F.conv2d(x, w, padding=w.shape[-1] // 2))
        return x
    return run


def _exact_with(run, x, start, stop, halo, scale):
    """Do rows [start, stop) of the input plus `halo` rows each side give the output's rows?"""
    want = run(x)[:, :, start * scale:stop * scale]
    got = run(x[:, :, start - halo:stop + halo])
    got = got[:, :, halo * scale:got.shape[2] - halo * scale]
    return bool((got - want).abs().max() < 1e-9)


def _random_layers(rng):
    """Up to 6 layers, at most two of them upsampling (the tensors stay small)."""
    layers = [rng.choice(["conv1", "conv3", "conv3", "conv5"]) for _ in range(rng.randint(0, 6))]
    for _ in range(rng.randint(0, 2)):
        layers.insert(rng.randint(0, len(layers)), rng.choice(["up2", "up3"]))
    return layers


@pytest.mark.ex("12.1")
def test_halo_rows_is_the_fewest_that_are_exact(impl):
    mod = impl("ex12_pipeline")
    rng = random.Random(0)
    for case in range(40):
        layers = _random_layers(rng)
        halo = mod.halo_rows(list(layers))
        scale = 1
        for la in layers:
            scale *= int(la[2:]) if la.startswith("up") else 1
        assert isinstance(halo, int) and 0 <= halo <= 20, f"{layers}: got {halo!r}"
        run = _stack(layers, case)
        x = torch.randn(1, 2, 2 * 20 + 5, 2, generator=torch.Generator().manual_seed(case),
                        dtype=torch.float64)
        start, stop = 20, 25  # a rank far from the video's edges: its halo is real rows
        assert _exact_with(run, x, start, stop, halo, scale), (
            f"{layers}: {halo} rows from each neighbour are too few; the rank's output rows "
            "differ from one process's")
        assert halo == 0 or not _exact_with(run, x, start, stop, halo - 1, scale), (
            f"{layers}: {halo} rows is more than needed ({halo - 1} already give exact rows)")


@pytest.mark.ex("12.1")
def test_halo_rows_examples(impl):
    mod = impl("ex12_pipeline")
    cases = {(): 0, ("conv3",): 1, ("conv3", "conv3"): 2, ("conv5",): 2, ("up2", "conv3"): 1,
             ("conv3", "up2", "conv3", "conv3"): 2, ("conv3",) * 3 + ("up2",): 3,
             ("up2", "conv3", "conv3", "conv3"): 2}
    for layers, want in cases.items():
        assert mod.halo_rows(list(layers)) == want, f"halo_rows({list(layers)})"


def _velocity(x, t):
    """A stand-in transformer that mixes frames, so a patchwork shows: [B, C, T, H, W]."""
    return x - (1 - t) * x.mean(dim=2, keepdim=True).tanh()


def _one_process(shape, seed, steps, churn=0.5, velocity=_velocity):
    """The stochastic sampler on one process: Euler from t = 1 to 0 on the whole latent, fresh
    noise from one generator (seeded seed + 1) scaled by churn * t after every step but the
    last."""
    x = initial_noise(shape, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        x = x + float(times[i + 1] - times[i]) * velocity(x, float(times[i]))
        if i < steps - 1:
            x = x + churn * float(times[i + 1]) * torch.randn(shape, generator=gen,
                                                              dtype=torch.float64).to(x.dtype)
    return x


@pytest.mark.ex("12.2")
def test_replicated_sample_is_one_process_at_any_rank_count(impl):
    mod = impl("ex12_pipeline")
    rng = random.Random(2)
    for _ in range(12):
        frames = rng.randint(1, 9)
        shape = (1, rng.randint(1, 3), frames, rng.randint(1, 4), rng.randint(1, 4))
        seed, steps = rng.randint(0, 10**6), rng.randint(1, 4)
        churn = rng.choice([0.0, 0.3, 1.0])
        want = _one_process(shape, seed, steps, churn)
        for world in range(1, min(frames, 4) + 1):
            torch.manual_seed(rng.randint(0, 10**6))  # the global RNG must not matter
            got = mod.replicated_sample(_velocity, shape, seed, world, steps, churn)
            assert_close(got, want, atol=1e-6, rtol=1e-6, dims=("B", "C", "T", "H", "W"),
                         name=f"rank 0's copy, {world} ranks, shape {shape}, seed {seed}, "
                              f"{steps} steps, churn {churn}",
                         hint="every rank must start from the same whole noise, and draw the "
                              "same noise inside the loop")


@pytest.mark.ex("12.2")
def test_replicated_sample_starts_from_the_library_noise(impl):
    mod = impl("ex12_pipeline")
    shape, seed = (1, 2, 5, 3, 3), 7
    got = mod.replicated_sample(lambda x, t: torch.zeros_like(x), shape, seed, 3, 2, 0.0)
    assert_close(got, initial_noise(shape, seed), atol=0, rtol=0,
                 dims=("B", "C", "T", "H", "W"), name="a sampler whose velocity is zero",
                 hint="with v = 0 and no churn the sample is the starting noise: "
                      "initial_noise(shape, seed)")

