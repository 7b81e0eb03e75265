"""Graded tests of notebook 15: the grid's groups (any valid tiling passes: the groups are a
decision) and the combine step that merges an owner's partial outputs.

    python -m pytest tests/graded --ex 15.1 --impl solutions
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.attention import attention_with_lse, reference_attention
from cpcourse.course.testing import assert_close
from cpcourse.tiling import simulate_attention_2d

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30)
GRIDS = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (3, 3), (2, 3), (3, 2), (1, 5)]


@pytest.mark.ex("15.1")
@pytest.mark.parametrize("grid", GRIDS)
def test_tiles_cover_the_matrix_once_in_groups_of_the_grid(impl, grid):
    rows, cols = grid
    world = rows * cols
    tiles = impl("ex15_tiling").grid_tiles(rows, cols)
    assert len(tiles) == world, f"{grid}: one tile per rank, {world} of them, got {len(tiles)}"
    seen = torch.zeros(world, world, dtype=torch.int64)
    for r, (q_shards, kv_shards) in enumerate(tiles):
        assert len(q_shards) == cols and len(kv_shards) == rows, (
            f"{grid}: rank {r} gathers {len(q_shards)} query and {len(kv_shards)} key shards; "
            f"a {rows}x{cols} grid gathers Q over {cols} ranks and K/V over {rows}")
        assert r in q_shards, (f"{grid}: rank {r} does not score its own queries, so who merges "
                               "their partials?")
        for i in q_shards:
            for j in kv_shards:
                seen[i, j] += 1
    bad = (seen != 1).nonzero().tolist()
    assert not bad, (f"{grid}: blocks (query shard, key shard) scored {seen[bad[0][0], bad[0][1]]}"
                     f" times instead of once: {bad[:4]}")


@pytest.mark.ex("15.1")
@FIXTURE_OK
@given(grid=st.sampled_from(GRIDS), length=st.integers(1, 30), seed=st.integers(0, 10**6))
def test_your_tiles_give_exact_attention(impl, grid, length, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, length, 4, generator=g, dtype=torch.float64) for _ in range(3))
    tiles = impl("ex15_tiling").grid_tiles(*grid)
    got = simulate_attention_2d(q, k, v, grid, tiles=tiles)
    assert_close(got, reference_attention(q, k, v)[0], atol=1e-12, rtol=1e-12,
                 dims=("B", "H", "L", "D"), name=f"Attention2D {grid[0]}x{grid[1]} on your tiles")


def _partials(c, length, seed, empty=()):
    """C partial attentions of the same queries over disjoint key sets, and the whole."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, length, 4, generator=g, dtype=torch.float64)
    keys = [torch.randn(2, 1, 2, 0 if i in empty else 1 + i % 3, 4, generator=g,
                        dtype=torch.float64) for i in range(c)]
    parts = [attention_with_lse(q, kv[0], kv[1]) for kv in keys]
    whole = attention_with_lse(q, torch.cat([kv[0] for kv in keys], 2),
                               torch.cat([kv[1] for kv in keys], 2))
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), whole


@pytest.mark.ex("15.2")
@FIXTURE_OK
@given(c=st.integers(1, 5), length=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_combine_equals_one_call_over_all_keys(impl, c, length, seed):
    outs, lses, (want, want_lse) = _partials(c, length, seed)
    out, lse = impl("ex15_tiling").combine_partials(outs, lses)
    assert_close(out, want, atol=1e-12, rtol=1e-12, dims=("B", "H", "L", "D"),
                 name=f"out merged from {c} partials",
                 hint="every merge after the first needs the lse of what was merged so far")
    assert_close(lse, want_lse, atol=1e-12, rtol=1e-12, dims=("B", "H", "L"),
                 name=f"lse merged from {c} partials")


@pytest.mark.ex("15.2")
def test_combine_skips_partials_over_no_keys_and_runs_a_3x3_grid(impl):
    combine = impl("ex15_tiling").combine_partials
    outs, lses, (want, _) = _partials(4, 5, 7, empty=(0, 2))
    assert_close(combine(outs, lses)[0], want, atol=1e-12, rtol=1e-12,
                 dims=("B", "H", "L", "D"), name="out with two empty partials")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 20, 8, generator=g, dtype=torch.float64) for _ in range(3))
    got = simulate_attention_2d(q, k, v, (3, 3), combine=combine)
    assert_close(got, reference_attention(q, k, v)[0], atol=1e-12, rtol=1e-12,
                 dims=("B", "H", "L", "D"), name="Attention2D 3x3 with your combine")
