"""Graded tests of notebook 14: an assignment of chunks to ranks that keeps the tokens even and
never loses to zigzag, and a skipping ring for block-causal attention that must skip only what
no query needs.

    python -m pytest tests/graded --ex 14.1 --impl solutions
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.causal import (
    SCHEMES,
    assign_chunks,
    block_causal_mask,
    chunk_of_frames,
    chunk_sizes,
    rank_tokens,
)
from cpcourse.course.testing import assert_close

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)


def _busiest(assignment) -> int:
    return max(sum(i + 1 for i in mine) for mine in assignment)


@pytest.mark.ex("14.1")
@FIXTURE_OK
@given(n_chunks=st.integers(1, 40), data=st.data())
def test_balanced_keeps_tokens_even_and_never_loses_to_zigzag(impl, n_chunks, data):
    mod = impl("ex14_causal")
    world = data.draw(st.integers(1, n_chunks))
    got = mod.balanced_assignment(n_chunks, world)
    assert isinstance(got, list) and len(got) == world, f"one list per rank, got {got!r}"
    assert sorted(c for mine in got for c in mine) == list(range(n_chunks)), (
        f"every chunk exactly once: {got}")
    assert all(list(mine) == sorted(mine) for mine in got), f"ascending ids per rank: {got}"
    counts = [len(t) for t in torch.arange(n_chunks).tensor_split(world)]
    assert [len(mine) for mine in got] == counts, (
        f"balanced_assignment({n_chunks}, {world}) = {got}: chunks per rank "
        f"{[len(m) for m in got]}, but the token rule (tensor_split) gives {counts}")
    zigzag = assign_chunks(n_chunks, world, "zigzag")
    assert _busiest(got) <= _busiest(zigzag), (
        f"balanced_assignment({n_chunks}, {world}) = {got}: busiest rank {_busiest(got)} units, "
        f"zigzag {zigzag} manages {_busiest(zigzag)}")


@pytest.mark.ex("14.1")
@pytest.mark.parametrize("n,world,best",
                         [(10, 4, 15), (6, 4, 6), (12, 5, 17), (14, 4, 27), (11, 3, 22)])
def test_balanced_beats_zigzag_where_zigzag_is_not_perfect(impl, n, world, best):
    mod = impl("ex14_causal")
    got = mod.balanced_assignment(n, world)
    zigzag = assign_chunks(n, world, "zigzag")
    assert _busiest(got) <= best, (
        f"{n} chunks on {world} ranks: your busiest rank does {_busiest(got)} units (zigzag "
        f"{_busiest(zigzag)}); {best} is reachable with the same chunk counts")


def _reference(q, k, v, frames, chunk, tpf):
    mask = block_causal_mask(frames, chunk, tpf)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.ex("14.2")
@FIXTURE_OK
@given(frames=st.integers(1, 9), chunk=st.integers(1, 3), tpf=st.integers(1, 3),
       scheme=st.sampled_from(SCHEMES), data=st.data())
def test_skipping_ring_is_exact_and_skips_only_unneeded_blocks(impl, frames, chunk, tpf,
                                                              scheme, data):
    mod = impl("ex14_causal")
    chunk = min(chunk, frames)
    layout = chunk_of_frames(frames, chunk, tpf)
    sizes = chunk_sizes(layout)
    world = data.draw(st.integers(1, min(4, len(sizes))))
    assignment = assign_chunks(len(sizes), world, scheme, sizes)
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 10**6)))
    q, k, v = (torch.randn(1, 2, layout.numel(), 4, generator=gen, dtype=torch.float64)
               for _ in range(3))
    want = _reference(q, k, v, frames, chunk, tpf)
    outs, blocks = mod.ring_block_causal(q, k, v, layout, assignment)
    for r in range(world):
        where = f"{scheme}, P={world}, chunks {assignment}, rank {r}"
        assert_close(outs[r], want[:, :, rank_tokens(layout, assignment, r)], atol=1e-10,
                     rtol=1e-10, dims=("B", "H", "L", "D"), name=f"rank {r}'s output ({where})",
                     hint="a skipped block may hold keys a query of this rank needs")
        needed = [(r - s) % world for s in range(world)
                  if min(assignment[(r - s) % world]) <= max(assignment[r])]
        assert blocks[r] == needed, (
            f"{where}: computed the blocks of ranks {blocks[r]}, but exactly {needed} hold keys "
            "its queries may see (skip the rest: they are the ring's wasted work)")
