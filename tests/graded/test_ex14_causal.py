"""Graded tests of notebook 14: the zigzag assignment of chunks to ranks, and a skipping ring for
block-causal attention that must skip only what no query needs.

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


@pytest.mark.ex("14.1")
@FIXTURE_OK
@given(n_chunks=st.integers(1, 40), data=st.data())
def test_zigzag_pairs_runs_from_both_ends(impl, n_chunks, data):
    mod = impl("ex14_causal")
    world = data.draw(st.integers(1, n_chunks))
    got = mod.zigzag_assignment(n_chunks, world)
    assert isinstance(got, list) and len(got) == world, f"one list per rank, got {got!r}"
    assert sorted(c for mine in got for c in mine) == list(range(n_chunks)), (
        f"every chunk exactly once: {got}")
    assert got == assign_chunks(n_chunks, world, "zigzag"), (
        f"zigzag_assignment({n_chunks}, {world}) = {got}: each rank takes the run at its rank "
        "from the start and the run at its rank from the end, runs cut by tensor_split")


@pytest.mark.ex("14.1")
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_zigzag_balances_a_multiple_of_two_runs_per_rank(impl, world):
    mod = impl("ex14_causal")
    n = 2 * world * 3
    work = [sum(i + 1 for i in mine) for mine in mod.zigzag_assignment(n, world)]
    assert len(set(work)) == 1, f"{n} chunks on {world} ranks: work per rank {work}"


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
