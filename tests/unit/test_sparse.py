"""cpcourse.sparse: the masks, the block-sparse kernel against dense masked attention in float64.

    python -m pytest tests/unit/test_sparse.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse import sparse as S
from cpcourse.attention import merge_attention
from cpcourse.support.errors import InputError

dims = st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 5))


def qkv(grid, heads=2, d=8, dtype=torch.float64, seed=0, b=1):
    g = torch.Generator().manual_seed(seed)
    length = math.prod(grid)
    return [torch.randn(b, heads, length, d, generator=g, dtype=torch.float64).to(dtype)
            for _ in range(3)]


def masks(q, k, grid, tile, heads):
    n = math.prod(S.tile_counts(grid, tile))
    return {"tile": S.sliding_tile_mask(grid, tile, (3, 3, 3), heads),
            "radial": S.radial_mask(grid, tile, heads),
            "topk": S.topk_mask(q, k, grid, tile, [1 + h % n for h in range(heads)])}


@settings(max_examples=30, deadline=None)
@given(grid=dims, tile=dims, heads=st.integers(1, 3), seed=st.integers(0, 2**16),
       which=st.sampled_from(["tile", "radial", "topk"]))
def test_block_sparse_equals_dense_masked(grid, tile, heads, seed, which):
    q, k, v = qkv(grid, heads, seed=seed)
    mask = masks(q, k, grid, tile, heads)[which]
    bm = S.BlockMask(mask, grid, tile)
    want = S.masked_attention(q, k, v, bm)
    stats = {}
    got = S.block_sparse_attention(q, k, v, bm, stats=stats)
    torch.testing.assert_close(got[0], want[0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(got[1], want[1], atol=1e-12, rtol=1e-12)
    sizes = S.tile_sizes(grid, tile)
    assert stats["work"] == int((mask * sizes[:, None] * sizes[None, :]).sum())
    assert stats["blocks"] + stats["skipped"] == mask.numel()


@settings(max_examples=20, deadline=None)
@given(grid=dims, tile=dims, seed=st.integers(0, 2**16), cut=st.floats(0, 1))
def test_partial_key_sets_merge_to_the_whole(grid, tile, seed, cut):
    """Keys split anywhere (a tile cut in two included): the partials merge exactly."""
    q, k, v = qkv(grid, 2, seed=seed)
    mask = S.BlockMask(S.radial_mask(grid, tile, 2), grid, tile)
    length = q.shape[2]
    perm = torch.randperm(length, generator=torch.Generator().manual_seed(seed))
    a, b = perm[: int(cut * length)], perm[int(cut * length):]
    pa = S.block_sparse_attention(q, k[:, :, a], v[:, :, a], mask, k_ids=a)
    pb = S.block_sparse_attention(q, k[:, :, b], v[:, :, b], mask, k_ids=b)
    out, lse = merge_attention(*pa, *pb)
    want = S.masked_attention(q, k, v, mask)
    torch.testing.assert_close(out, want[0], atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, want[1], atol=1e-12, rtol=1e-12)


def test_float32_within_the_one_kernel_tolerance():
    grid, tile = (3, 5, 7), (2, 2, 3)
    q, k, v = qkv(grid, 3, dtype=torch.float32, seed=3, b=2)
    mask = S.BlockMask(S.topk_mask(q, k, grid, tile, [1, 3, 6]), grid, tile)
    want = S.masked_attention(q.double(), k.double(), v.double(), mask)
    got = S.block_sparse_attention(q, k, v, mask)
    assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
    assert (got[0].double() - want[0]).abs().max() < 1e-5


def test_masks_keep_the_own_tile_and_topk_differs_by_head():
    grid, tile = (4, 4, 4), (1, 2, 2)
    q, k, _ = qkv(grid, 3)
    for mask in masks(q, k, grid, tile, 3).values():
        assert mask.dtype == torch.bool and mask.diagonal(dim1=1, dim2=2).all()
    m = S.topk_mask(q, k, grid, tile, [1, 4, 16])
    assert m.sum((1, 2)).tolist()[0] < m.sum((1, 2)).tolist()[2]
    r = S.radial_mask((8, 8, 8), (1, 2, 2))[0]
    # the radial reach shrinks with temporal distance: fewer kept blocks to far frames
    per_dt = r.view(8, 16, 8, 16).sum((1, 3)).diagonal(offset=0)
    assert per_dt.tolist() == sorted(per_dt.tolist())  # all equal on the diagonal
    assert r.view(8, 16, 8, 16)[0, :, 7].sum() < r.view(8, 16, 8, 16)[0, :, 1].sum()


def test_bad_masks_are_refused_in_one_line():
    grid, tile = (2, 2, 2), (1, 1, 2)
    q, k, v = qkv(grid, 2)
    good = S.radial_mask(grid, tile, 2)
    with pytest.raises(InputError, match=r"mask must be \[heads=1, n_tiles=4"):
        S.BlockMask(good[:1, :3], grid, tile)
    with pytest.raises(InputError, match="bm has 1 heads, q 2"):
        S.block_sparse_attention(q, k, v, S.BlockMask(good[:1], grid, tile))
    bad = good.clone()
    bad[1, 3] = False
    with pytest.raises(InputError, match=r"head 1, query tile 3\) keeps no key") as info:
        S.BlockMask(bad, grid, tile)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="grid"):
        S.masked_attention(q, k, v, S.BlockMask(good[:, :2, :2], (2, 1, 2), tile))
    with pytest.raises(InputError, match="tile"):
        S.tile_counts(grid, (1, 0, 1))


def test_running_max_skip_depends_on_the_visiting_order():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 24, 8, generator=g) * 3
    k, v = (torch.randn(1, 2, 24, 8, generator=g) for _ in range(2))
    blocks = list(torch.arange(24).tensor_split(4))
    exact, none = S.running_max_skip(q, k, v, blocks, float("inf"))
    bm = S.BlockMask(torch.ones(2, 1, 1, dtype=torch.bool), (1, 1, 24), (1, 1, 24))
    torch.testing.assert_close(exact, S.masked_attention(q.double(), k.double(), v.double(),
                                                         bm)[0], atol=1e-12, rtol=1e-12)
    assert none == 0.0
    forward, skipped = S.running_max_skip(q, k, v, blocks, 2.0)
    backward, _ = S.running_max_skip(q, k, v, blocks[::-1], 2.0)
    assert skipped > 0 and (forward - exact).abs().max() > 1e-3
    assert (forward - backward).abs().max() > 1e-3   # the same rule, another order


def test_greedy_deals_balance_and_the_ring_knows_who_needs_what():
    from cpcourse.sparse import cp as C

    assert C.greedy_assign([8, 7, 6, 5, 4, 3, 2, 1], 2) == [[0, 3, 4, 7], [1, 2, 5, 6]]
    assert C.contiguous(5, 2) == [[0, 1, 2], [3, 4]]
    assert C.imbalance([3, 1]) == 1.5 and C.imbalance([0, 0]) == 1.0
    grid, tile = (4, 2, 2), (1, 2, 2)                        # one tile per frame
    local = S.BlockMask(S.sliding_tile_mask(grid, tile, (3, 2, 2), 1), grid, tile)
    ids = C.tokens_of_ranks(local, 4)
    need = C.ring_needs(local, ids)                          # a halo: neighbours only
    assert need.tolist() == [[True, True, False, False], [True, True, True, False],
                             [False, True, True, True], [False, False, True, True]]
    # a one-way mask: frame 3's queries keep frame 0's keys, not the reverse
    one_way = torch.eye(4, dtype=torch.bool)[None].clone()
    one_way[0, 3, 0] = True
    need = C.ring_needs(S.BlockMask(one_way, grid, tile), ids)
    assert need[0, 3] and not need[3, 0]
    q, k, _ = qkv(grid, 4)
    topk = S.BlockMask(S.topk_mask(q, k, grid, tile, [1, 1, 4, 4]), grid, tile)
    plain = C.heads_of_ranks(topk, 2)
    dealt = C.heads_of_ranks(topk, 2, "greedy")
    assert C.imbalance(C.predicted_work(topk, "ulysses", dealt)) < \
        C.imbalance(C.predicted_work(topk, "ulysses", plain))
    with pytest.raises(InputError, match="do not split over 3 ranks"):
        C.heads_of_ranks(topk, 3)
