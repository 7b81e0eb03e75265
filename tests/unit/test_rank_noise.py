"""The same noise on every rank: the library's noise ignores the global RNG, and the bug shown on
purpose (`cpcourse.tinydit.rank_noise`) breaks the trained model's clip where the tracker sees it.

    python -m pytest tests/unit/test_rank_noise.py -q
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cpcourse.support.errors import InputError
from cpcourse.tinydit.rank_noise import copies_noise, noise_clip, replicated_sample
from cpcourse.tinydit.sampling import initial_noise
from cpcourse.tinydit.training import generate_clip, load_shapes_model


@given(st.integers(0, 2**31), st.integers(0, 2**31), st.integers(0, 50),
       st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 6), st.integers(1, 5),
                 st.integers(1, 5)))
def test_initial_noise_ignores_the_global_rng(seed, global_seed, junk, shape):
    first = initial_noise(shape, seed)
    with torch.random.fork_rng():
        torch.manual_seed(global_seed)
        torch.randn(junk)
        again = initial_noise(shape, seed)
    assert torch.equal(first, again)


@given(st.integers(0, 2**31), st.integers(1, 6))
def test_every_copy_is_the_same_noise_unless_ranks_seed_their_own(seed, world):
    shape = (1, 2, 6, 3, 3)
    same = copies_noise(shape, seed, world, per_rank_noise=False)
    assert all(torch.equal(c, initial_noise(shape, seed)) for c in same)
    own = copies_noise(shape, seed, world, per_rank_noise=True)
    assert len({float(c.sum()) for c in own}) == world


@pytest.fixture(scope="module")
def model():
    return load_shapes_model()


def test_one_noise_on_every_rank_gives_the_one_process_clip(model):
    for world in (2, 4):
        clip, seen = noise_clip("square-up", 1, world, per_rank_noise=False, model=model)
        assert torch.equal(clip, generate_clip(model, "square-up", 1)), world
        assert seen["present_fraction"] == 1.0 and seen["direction"] and seen["shape"]


@pytest.mark.parametrize("world", [2, 4])
def test_per_rank_noise_leaves_static_where_the_tracker_sees_it(model, world):
    """Rank 0's copy is right only in its own frames: the tracker finds the object in 1 / P of
    them and nothing (static) in the rest."""
    clip, seen = noise_clip("circle-right", 0, world, per_rank_noise=True, model=model)
    own = 8 // world
    assert seen["present"] == [True] * own + [False] * (8 - own), seen["present"]
    assert seen["present_fraction"] == 1 / world
    good = generate_clip(model, "circle-right", 0)
    # the static is the difference of two independent noises: far from the clean clip
    assert float((clip[own:] - good[own:]).abs().mean()) > 0.2


def test_bad_input(model):
    with pytest.raises(InputError, match="world 9: more ranks than the 8 frames"):
        replicated_sample(model, (1, 3, 8, 32, 32), 0, (0, 1), 2, 4.0, 9)
    with pytest.raises(InputError, match="seed must be"):
        replicated_sample(model, (1, 3, 8, 32, 32), -1, (0, 1), 2, 4.0, 2)
