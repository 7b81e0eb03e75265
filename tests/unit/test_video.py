"""Video layouts, one-process video attentions, 3D rotary and the byte cost model (no processes)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cpcourse import video
from cpcourse.course.testing import assert_close
from cpcourse.planner import video_costs
from cpcourse.support.errors import InputError
from cpcourse.tinydit.rope import rope_3d, rope_angles, rope_split


def _brute(q, k, v, same):
    """float64 attention over an explicit key mask `same(i, j)` on the flattened (t, s) tokens."""
    b, h, t, s, d = q.shape
    qf, kf, vf = (x.reshape(b, h, t * s, d).double() for x in (q, k, v))
    scores = qf @ kf.transpose(-1, -2) / math.sqrt(d)
    idx = torch.arange(t * s)
    mask = same(idx[:, None], idx[None, :], s)
    scores = scores.masked_fill(~mask, float("-inf"))
    return (scores.softmax(-1) @ vf).reshape(b, h, t, s, d)


def _video(b=2, h=3, t=5, s=7, d=8, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, s, d, generator=gen, dtype=dtype) for _ in range(3)]


def test_spatial_temporal_full_match_masked_brute_force():
    q, k, v = _video()
    assert_close(video.spatial_attention(q, k, v),
                 _brute(q, k, v, lambda i, j, s: i // s == j // s), atol=1e-10, rtol=1e-10)
    assert_close(video.temporal_attention(q, k, v),
                 _brute(q, k, v, lambda i, j, s: i % s == j % s), atol=1e-10, rtol=1e-10)
    assert_close(video.full_attention(q, k, v),
                 _brute(q, k, v, lambda i, j, s: torch.ones_like(i == j)), atol=1e-10, rtol=1e-10)


def test_float32_within_documented_tolerance_of_float64():
    q, k, v = _video(dtype=torch.float32)
    for fn in (video.spatial_attention, video.temporal_attention, video.full_attention):
        assert_close(fn(q, k, v), fn(q.double(), k.double(), v.double()).float(),
                     atol=2e-5, rtol=2e-5)


@given(b=st.integers(1, 2), h=st.integers(1, 3), t=st.integers(1, 6), s=st.integers(1, 6),
       world=st.integers(1, 5))
def test_fold_and_shard_round_trip(b, h, t, s, world):
    x = torch.randn(b, h, t, s, 4)
    assert torch.equal(video.batch_to_frames(video.frames_to_batch(x), b, t), x)
    assert torch.equal(video.batch_to_positions(video.positions_to_batch(x), b, s), x)
    shards = [video.frame_shard(x, r, world) for r in range(world)]
    assert torch.equal(torch.cat(shards, dim=2), x)
    want = [len(c) for c in torch.tensor_split(torch.arange(t), world)]
    assert [sh.shape[2] for sh in shards] == want
    assert [video.frame_offset(t, r, world) for r in range(world)] == \
        [sum(sh.shape[2] for sh in shards[:r]) for r in range(world)]


def test_joint_attention_matches_concatenated_sequence():
    q, k, v = _video(t=3, s=4)
    tq, tk, tv = (torch.randn(2, 3, 5, 8, dtype=torch.float64) for _ in range(3))
    out_v, out_t = video.joint_attention(q, k, v, tq, tk, tv)
    cat = lambda a, t: torch.cat([a.reshape(2, 3, 12, 8), t], dim=2)  # noqa: E731
    ref = torch.softmax(cat(q, tq) @ cat(k, tk).transpose(-1, -2) / math.sqrt(8), -1) @ cat(v, tv)
    assert_close(out_v.reshape(2, 3, 12, 8), ref[:, :, :12], atol=1e-10, rtol=1e-10)
    assert_close(out_t, ref[:, :, 12:], atol=1e-10, rtol=1e-10)


def test_bad_shapes_raise_input_error():
    q, k, v = _video()
    with pytest.raises(InputError, match=r"\[B, H, T, S, D\]"):
        video.spatial_attention(q[0], k, v)
    with pytest.raises(InputError, match="share"):
        video.temporal_attention(q, k[:, :, :2], v)
    with pytest.raises(InputError, match="process group"):
        video.temporal_attention_cp(q, k, v)


# --- 3D rotary ----------------------------------------------------------------------------------

@pytest.mark.parametrize("t,world", [(7, 3), (5, 2), (2, 4), (8, 4)])
def test_rope_shards_equal_whole_with_global_offset(t, world):
    x = torch.randn(1, 2, t, 12, 16, dtype=torch.float64)
    whole = rope_3d(x, 3, 4)
    for r in range(world):
        mine = rope_3d(video.frame_shard(x, r, world), 3, 4,
                       frame_offset=video.frame_offset(t, r, world))
        assert torch.equal(mine, video.frame_shard(whole, r, world))
    if world > 1 and t > world:  # the classic bug: every shard rotated from frame 0
        wrong = rope_3d(video.frame_shard(x, world - 1, world), 3, 4)
        assert not torch.allclose(wrong, video.frame_shard(whole, world - 1, world))


def test_rope_scores_depend_on_position_differences_only():
    d = 12
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    ones = lambda x, t0: rope_3d(x.expand(1, 1, 1, 6, d).clone(), 2, 3, frame_offset=t0)  # noqa
    a = (ones(q, 3)[0, 0, 0, 4] * ones(k, 1)[0, 0, 0, 1]).sum()
    b = (ones(q, 10)[0, 0, 0, 4] * ones(k, 8)[0, 0, 0, 1]).sum()
    assert abs(a - b) < 1e-12
    assert rope_split(16) == (4, 2, 2) and rope_angles(2, 2, 3, 12).shape == (2, 6, 6)
    with pytest.raises(InputError, match="even head dim"):
        rope_split(7)


# --- the byte cost model -------------------------------------------------------------------------

def test_byte_model_by_hand():
    # T=4, S=6, P=2: rank 0 holds frames 0-1 and (after all-to-all) positions 0-2.
    assert video_costs.temporal_all_to_all_bytes(1, 1, 4, 6, 1, 2, 0, 1) == 3 * 2 * 3 + 2 * 3
    # ring: P-1 = 1 hop carrying K and V of 2 frames x 6 positions
    assert video_costs.temporal_ring_bytes(1, 1, 4, 6, 1, 2, 0, 1) == 2 * 2 * 6
    assert video_costs.full_ring_bytes(1, 1, 4, 6, 1, 2, 1, 1) == 2 * 12
    assert video_costs.full_ulysses_bytes(1, 2, 4, 6, 1, 2, 0, 1) == 3 * 12 * 1 + 12 * 1
    for fn in video_costs.PREDICTORS.values():
        assert fn(2, 4, 9, 10, 8, 1, 0) == 0  # one rank sends nothing


def test_all_to_all_moves_far_less_than_the_ring():
    rows = {r["method"] + "/" + r["attention"]: r
            for r in video_costs.video_bytes_table(1, 16, 30, 3600, 72, 8)}
    assert rows["all_to_all/temporal"]["total_bytes"] * 1.5 < rows["ring/temporal"]["total_bytes"]
    with pytest.raises(InputError, match="no cost model"):
        video_costs.predicted_bytes("spatial", "ring", (1, 1, 1, 1, 1), 1, 0)


def test_mixed_dtypes_are_refused_like_the_ring_does():
    """The all-to-all paths used to promote a float64 v silently; every path refuses instead."""
    q = torch.randn(1, 2, 3, 4, 8)
    for fn in (video.spatial_attention, video.temporal_attention, video.full_attention):
        with pytest.raises(InputError, match="one floating dtype"):
            fn(q, q, q.double())


_X = torch.randn(1, 2, 4, 3, 8)
_TEXT3 = torch.randn(1, 5, 8)


@pytest.mark.parametrize("call", [
    lambda: video.frame_shard(_X, 5, 2), lambda: video.frame_shard(_X, 0, 0),
    lambda: video.frame_shard([1, 2], 0, 1), lambda: video.frame_offset(4, 5, 2),
    lambda: video.joint_attention(_X, _X, _X, _TEXT3, _TEXT3, _TEXT3),
], ids=["rank_past_world", "world_0", "a_list", "offset_rank_past_world", "text_3d"])
def test_api_misuse_is_an_input_error(call):
    """Bad ranks, worlds, non-tensors and 3-d text used to surface as IndexError or RuntimeError
    from deep inside torch."""
    with pytest.raises(InputError):
        call()


def test_shard_and_merge_misuse_is_an_input_error():
    from cpcourse import attention
    from cpcourse.support import shards as dist

    for call in (lambda: dist.shard(torch.randn(1, 2, 5, 4), -1, 2),
                 lambda: dist.shard(None, 0, 1),
                 lambda: attention.merge_attention(None, None, None, None)):
        with pytest.raises(InputError):
            call()
