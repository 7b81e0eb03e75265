"""Graded tests of notebook 07: every input of a rank's sampling that must not depend on P.

    python -m pytest tests/graded --ex 07.1 --impl solutions

Each output of `rank_inputs`, joined over the ranks, is compared with one process's: the noise
exactly, the embedded tokens to float32 rounding, the context through the rotary rows it gives.
Splits include uneven ones and ranks with no frame.
"""

import pytest
import torch

from cpcourse.course.testing import assert_close
from cpcourse.tinydit.model import DiTConfig, build_model, frame_embedding, patchify
from cpcourse.tinydit.rope import rope_3d
from cpcourse.tinydit.sampling import initial_noise

SPLITS = ((8, 2), (8, 4), (5, 2), (7, 3), (9, 4), (3, 4))


def _model():
    return build_model(DiTConfig(hidden=24, heads=2, depth=1, frame_embed=True), weight_seed=3)


def _one_process(model, shape, seed):
    noise = initial_noise(shape, seed)
    x = model.embed(patchify(noise, model.cfg.patch))
    fe = model.frame_proj(frame_embedding(torch.arange(shape[2]), model.cfg.hidden).float())
    return noise, x + fe[None, :, None]


@pytest.mark.ex("07.1")
def test_the_noise_is_one_process_draw_at_any_p(impl):
    mod = impl("ex07_dit_cp")
    model = _model()
    with torch.no_grad():
        for frames, world in SPLITS:
            shape = (1, 4, frames, 4, 6)
            want, _ = _one_process(model, shape, seed=11)
            got = torch.cat([mod.rank_inputs(model, shape, 11, r, world)[0]
                             for r in range(world)], dim=2)
            assert_close(got, want, atol=0, rtol=0, dims=("B", "C", "T", "H", "W"),
                         name=f"noise joined over {world} ranks, {frames} frames",
                         hint="would one process, drawing the whole video, give these numbers?")


@pytest.mark.ex("07.1")
def test_the_tokens_are_one_process_tokens_at_any_split(impl):
    mod = impl("ex07_dit_cp")
    model = _model()
    with torch.no_grad():
        for frames, world in SPLITS:
            shape = (1, 4, frames, 4, 6)
            _, want = _one_process(model, shape, seed=frames)
            for rank in range(world):
                x = mod.rank_inputs(model, shape, frames, rank, world)[1]
                assert_close(x, torch.tensor_split(want, world, dim=1)[rank], atol=1e-6,
                             rtol=1e-6, dims=("B", "T", "S", "hidden"),
                             name=f"x of rank {rank} of {world}, {frames} frames",
                             hint="the noise these tokens embed, and the frame each row "
                                  "embeds: are both the global ones?")


@pytest.mark.ex("07.1")
def test_the_context_rotates_like_one_process(impl):
    mod = impl("ex07_dit_cp")
    model = _model()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for frames, world in SPLITS:
            shape = (1, 4, frames, 4, 6)
            q = torch.randn(1, 2, frames, 6, 12, generator=gen, dtype=torch.float64)
            whole = rope_3d(q, 2, 3)
            for rank in range(world):
                ctx = mod.rank_inputs(model, shape, 0, rank, world)[2]
                mine = torch.tensor_split(q, world, dim=2)[rank]
                assert_close(rope_3d(mine, *ctx.grid, frame_offset=ctx.frame_offset),
                             torch.tensor_split(whole, world, dim=2)[rank], atol=1e-12,
                             rtol=1e-12, dims=("B", "H", "T", "S", "D"),
                             name=f"q rotated by ctx of rank {rank} of {world}, {frames} frames",
                             hint="ctx.frame_offset: how many frames do the ranks before this "
                                  "one hold, when P does not divide T?")
