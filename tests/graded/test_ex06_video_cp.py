"""Graded tests of notebook 06: temporal sharding, gathering, the all-to-all, the 3D ring, text.

    python -m pytest tests/graded --ex 06.3 --impl solutions

Distributed exercises run on 3 processes (uneven splits; some cases with fewer frames than
ranks). The learner's function is first called once here, outside any process group: an
untouched stub raises its NotImplementedError in this process, where the grader can see it.
"""

import pytest
import torch

from cpcourse import video
from cpcourse.course.testing import assert_close
from cpcourse.launch import launch

WORLD = 3
DIMS = ("B", "H", "T", "S", "D")


def _video(shape, seed, n=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(n)]


def rank_worker(impl_name, exercise, shapes):
    """On every rank: run the exercise on each shape; return (got, want) pairs as float64."""
    import torch.distributed as dist

    from cpcourse.course import load

    mod = load(impl_name, "ex06_video_cp")
    rank, world = dist.get_rank(), dist.get_world_size()
    pairs = []
    for i, shape in enumerate(shapes):
        q, k, v = _video(shape, seed=i)
        mine = [video.frame_shard(x, rank, world).float() for x in (q, k, v)]
        if exercise == "06.2":
            got, want = mod.gather_frames(mine[0]), q.float()
        elif exercise == "06.3":
            got = mod.time_to_space(mine[0], shape[2])
            want = torch.tensor_split(q.float(), world, dim=3)[rank]
        elif exercise == "06.4":
            got = mod.full_attention_ring(*mine)
            want = video.frame_shard(video.full_attention(q, k, v), rank, world)
        else:  # 06.5: text tokens replicated on every rank
            tq, tk, tv = (x[:, :, 0] for x in _video((shape[0], shape[1], 1, 5, shape[4]), 50 + i))
            ref_v, ref_t = video.joint_attention(q, k, v, tq, tk, tv)
            texts = [x.float() for x in (tq, tk, tv)]
            got = mod.joint_attention_cp(*mine, *texts)
            want = (video.frame_shard(ref_v, rank, world), ref_t)
            buggy = mod.joint_attention_cp_buggy(*mine, *texts)
            pairs.append(("buggy text", buggy[1].double(), ref_t))
            pairs.append(("video", got[0].double(), want[0]))
            got, want = got[1], want[1]
        pairs.append((str(shape), got.double(), want.double()))
    return pairs


def _run(impl, exercise, shapes, tol):
    results = launch(f"{__file__}:rank_worker", WORLD, timeout=60,
                     args=(impl, exercise, shapes), stream=False)
    for rank, pairs in enumerate(results):
        for name, got, want in pairs:
            if name == "buggy text":
                continue
            assert got.shape == want.shape, \
                f"rank {rank}, case {name}: shape {tuple(got.shape)}, want {tuple(want.shape)}"
            assert_close(got, want, atol=tol, rtol=tol, name=f"rank {rank} {name}",
                         dims=DIMS if got.dim() == 5 else None)
    return results


@pytest.fixture
def impl_name(request):
    """"exercises" or "solutions": which the ranks load (they cannot share the impl fixture)."""
    return request.config.getoption("--impl")


SHAPES = [(1, 2, 7, 5, 8), (2, 1, 4, 4, 6), (1, 2, 2, 7, 8)]  # T, S uneven; T = 2 < P = 3


@pytest.mark.ex("06.1")
def test_shard_frames_matches_tensor_split(impl):
    mod = impl("ex06_video_cp")
    for t in range(1, 10):
        for world in range(1, 6):
            x = torch.randn(2, 1, t, 3, 2)
            total = 0
            for r in range(world):
                local, offset = mod.shard_frames(x, r, world)
                want = torch.tensor_split(x, world, dim=2)[r]
                assert offset == total, f"rank {r} of {world}, T={t}: offset {offset}, want {total}"
                assert_close(local, want, dims=DIMS, name=f"rank {r} of {world}, T={t}: frames")
                total += want.shape[2]


@pytest.mark.ex("06.2")
def test_gather_frames_on_three_ranks(impl_name):
    _run(impl_name, "06.2", SHAPES, 0.0)


@pytest.mark.ex("06.3")
def test_time_to_space_on_three_ranks(impl_name):
    _run(impl_name, "06.3", SHAPES, 0.0)


@pytest.mark.ex("06.4")
def test_full_ring_on_a_video(impl_name):
    _run(impl_name, "06.4", SHAPES, 2e-5)


@pytest.mark.ex("06.5")
def test_text_tokens_counted_once(impl_name):
    results = _run(impl_name, "06.5", SHAPES[:2], 2e-5)
    # the bug is real: with the text counted 3 times the text rows move far beyond tolerance
    worst = max(float((got - want).abs().max()) for pairs in results
                for name, got, want in pairs if name == "buggy text")
    assert worst > 1e-3
