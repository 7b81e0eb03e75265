"""Attention2D's arithmetic: grids, tiles, the one-process simulation and the bytes formulas.

    python -m pytest tests/unit/test_tiling_grid.py -q

The real processes are in tests/dist/test_tiling.py; here the tiles must cover the score matrix
exactly once, the simulation must equal float64 attention on any size and grid (hypothesis), and
`cpcourse.planner.costs.tiling_bytes_per_rank` must agree with the course's other counts.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.attention import reference_attention
from cpcourse.mesh import usp_elements
from cpcourse.planner.costs import comm, tiling_bytes_per_rank
from cpcourse.support.errors import InputError
from cpcourse.support.layout import Layout
from cpcourse.support.shards import shard_sizes
from cpcourse.tiling import check_grid, grid_groups, simulate_attention_2d, squarest_grid, tile

GRIDS = [(1, 1), (1, 4), (2, 2), (4, 1), (3, 3), (2, 3), (3, 1), (1, 2)]


@pytest.mark.parametrize("grid", [(0, 4), (4, 0), (-2, -2), (2, 3), (4,), "2x2", (2.0, 2),
                                  (True, 4), None])
def test_bad_grids_are_refused_in_one_line(grid):
    with pytest.raises(InputError) as info:
        check_grid(grid, 4)
    msg = str(info.value)
    assert "\n" not in msg and "(2, 2)" in msg and "(1, 4)" in msg


def test_squarest_grid():
    assert [squarest_grid(p) for p in (1, 4, 8, 9, 7, 72)] == [
        (1, 1), (2, 2), (4, 2), (3, 3), (7, 1), (9, 8)]


@pytest.mark.parametrize("grid", GRIDS)
def test_tiles_cover_the_score_matrix_once(grid):
    rows, cols = grid
    world = rows * cols
    seen = torch.zeros(world, world, dtype=torch.int64)
    for r in range(world):
        q_shards, kv_shards = tile(r, rows, cols)
        assert r in q_shards  # a rank scores (part of) its own queries: it owns a merge
        for m in q_shards:
            seen[m, kv_shards] += 1
    assert bool((seen == 1).all())
    row_groups, col_groups = grid_groups(rows, cols)
    assert sorted(sum(row_groups, [])) == sorted(sum(col_groups, [])) == list(range(world))


def test_degenerate_grids_are_the_all_gathers():
    # (P, 1): every rank its own queries against all keys: all-gather K/V
    assert all(tile(r, 4, 1) == ([r], [0, 1, 2, 3]) for r in range(4))
    # (1, P): all queries against its own keys: all-gather Q
    assert all(tile(r, 1, 4) == ([0, 1, 2, 3], [r]) for r in range(4))


@settings(max_examples=40, deadline=None)
@given(grid=st.sampled_from(GRIDS), b=st.integers(1, 2), h=st.integers(1, 3),
       lq=st.integers(0, 23), lk=st.integers(1, 23), d=st.sampled_from([1, 4, 7]),
       seed=st.integers(0, 2**16), dtype=st.sampled_from([torch.float32, torch.float64]))
def test_simulation_equals_one_process(grid, b, h, lq, lk, d, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(b, h, lk, d, generator=g, dtype=torch.float64).to(dtype)
            for _ in range(2))
    want = reference_attention(q.double(), k.double(), v.double())[0]
    got = simulate_attention_2d(q, k, v, grid)
    assert got.shape == want.shape and got.dtype == dtype
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert got.numel() == 0 or float((got.double() - want).abs().max()) <= tol


def test_bytes_formulas_agree_with_the_calculators():
    # the all-gather and the ring of `cpcourse comm` (even shards: every rank alike)
    c = comm(4096, 8, heads=8, head_dim=64, dtype="bf16", bandwidth_gbps=100)
    assert tiling_bytes_per_rank("ring", 4096, 8, 64, 8) == c["kv_bytes_total"]
    assert tiling_bytes_per_rank("allgather", 4096, 8, 64, 8) == c["allgather_bytes_per_rank"]
    assert tiling_bytes_per_rank("ulysses", 4096, 8, 64, 8) == c["ulysses_bytes_per_rank"]


@pytest.mark.parametrize("tokens,grid,heads", [(37, (2, 2), 4), (50, (3, 2), 6), (7, (4, 2), 2),
                                               (64, (1, 4), 8), (11, (3, 1), 3)])
def test_usp_formula_is_the_worst_rank_of_usp_elements(tokens, grid, heads):
    ring, u = grid
    world = ring * u
    lens = shard_sizes(tokens, world)
    worst = max(sum(usp_elements(2, heads, 5, lens, Layout(ring=ring, ulysses=u), r))
                for r in range(world))
    assert tiling_bytes_per_rank("usp", tokens, heads, 5, world, grid, 4, batch=2) == 4 * worst


def test_attention2d_falls_as_one_over_sqrt_p_while_the_ring_stays_flat():
    s, h, d = 9 * 16 * 1024, 40, 128
    ring = [tiling_bytes_per_rank("ring", s, h, d, p * p) for p in (4, 8, 16)]
    a2d = [tiling_bytes_per_rank("attn2d", s, h, d, p * p, (p, p)) for p in (4, 8, 16)]
    assert max(ring) / min(ring) < 1.4  # 2 (P-1)/P of the sequence's K/V: flat
    assert 1.6 < a2d[0] / a2d[1] < 2.1 and 1.6 < a2d[1] / a2d[2] < 2.1  # x2 per x4 in P
    # the degenerate grid (P, 1) is the all-gather, byte for byte
    assert tiling_bytes_per_rank("attn2d", 37, 3, 8, 4, (4, 1), 4) == \
        tiling_bytes_per_rank("allgather", 37, 3, 8, 4, dtype_bytes=4)


def test_bytes_formula_refuses_what_it_cannot_price():
    with pytest.raises(InputError, match="grid"):
        tiling_bytes_per_rank("attn2d", 10, 2, 4, 4, (3, 1))
    with pytest.raises(InputError, match="method"):
        tiling_bytes_per_rank("zigzag", 10, 2, 4, 4)
    with pytest.raises(InputError, match="heads"):
        tiling_bytes_per_rank("ulysses", 10, 3, 4, 4)


@pytest.mark.parametrize("argv,word", [(["--grids", "2by2"], "grids"),
                                       (["--grids", "5x5"], "processes"),
                                       (["--tokens", "0"], "tokens")])
def test_bench_tiling_refuses_bad_flags_before_any_process(argv, word, capsys):
    from cpcourse.cli import main

    assert main(["bench", "tiling", *argv, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and "\n" not in err
