"""Graded tests of notebook 07: what a DiT under CP must not let depend on P (07.3: the bug hunt).

    python -m pytest tests/graded --ex 07.1 --impl solutions
"""

import pytest
import torch

from cpcourse.course.testing import assert_close
from cpcourse.tinydit.model import frame_embedding
from cpcourse.tinydit.rope import rope_3d
from cpcourse.tinydit.sampling import initial_noise

DIMS = ("B", "H", "T", "S", "D")


@pytest.mark.ex("07.1")
def test_rope_on_shard_uses_global_frames(impl):
    mod = impl("ex07_dit_cp")
    gen = torch.Generator().manual_seed(0)
    for frames, world in ((7, 3), (5, 2), (2, 4), (9, 4)):
        x = torch.randn(1, 2, frames, 6, 12, generator=gen, dtype=torch.float64)
        whole = rope_3d(x, 2, 3)
        for rank in range(world):
            mine = torch.tensor_split(x, world, dim=2)[rank]
            want = torch.tensor_split(whole, world, dim=2)[rank]
            assert_close(mod.rope_on_shard(mine, 2, 3, frames, rank, world), want,
                         atol=1e-12, rtol=1e-12, dims=DIMS,
                         name=f"rank {rank} of {world}, {frames} frames",
                         hint="rotate by the global frame index: the shard starts at frame t0")


@pytest.mark.ex("07.2")
def test_local_noise_is_the_same_video_for_every_p(impl):
    mod = impl("ex07_dit_cp")
    shape = (1, 4, 7, 4, 6)
    whole = initial_noise(shape, seed=11)
    for world in (1, 2, 3, 4, 8):
        got = torch.cat([mod.local_noise(shape, 11, r, world) for r in range(world)], dim=2)
        assert_close(got, whole, atol=0, rtol=0, dims=("B", "C", "T", "H", "W"),
                     name=f"noise gathered from {world} ranks",
                     hint="draw the whole video's noise with one generator, then keep your frames")


@pytest.mark.ex("07.3")
def test_shard_embed_is_one_process_at_any_split(impl):
    from cpcourse.tinydit.model import DiTConfig, build_model, patchify

    mod = impl("ex07_dit_cp")
    model = build_model(DiTConfig(hidden=24, heads=2, depth=1, frame_embed=True), weight_seed=3)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for frames, world in ((8, 2), (5, 2), (7, 3), (3, 4), (9, 4)):
            latents = torch.randn(1, 4, frames, 4, 6, generator=gen)
            tokens = patchify(latents, 2)
            idx = torch.arange(frames)
            whole = model.embed(tokens) + model.frame_proj(
                frame_embedding(idx, 24).float())[None, :, None]
            q = torch.randn(1, 2, frames, 6, 12, generator=gen, dtype=torch.float64)
            q_whole = rope_3d(q, 2, 3)
            for rank in range(world):
                x, ctx = mod.shard_embed(model, latents, rank, world)
                name = f"rank {rank} of {world}, {frames} frames"
                assert_close(x, torch.tensor_split(whole, world, dim=1)[rank], atol=1e-6,
                             rtol=1e-6, dims=("B", "T", "S", "hidden"), name=f"x, {name}",
                             hint="the frame embedding of a shard's frames, at their global "
                                  "index: where does this rank's first frame sit?")
                q_mine = torch.tensor_split(q, world, dim=2)[rank]
                assert_close(rope_3d(q_mine, *ctx.grid, frame_offset=ctx.frame_offset),
                             torch.tensor_split(q_whole, world, dim=2)[rank], atol=1e-12,
                             rtol=1e-12, dims=DIMS, name=f"q rotated by ctx, {name}",
                             hint="ctx.frame_offset: the frames held by the ranks before this one")
