"""The block-causal mask and the chunk assignments: work and ring traffic against closed forms.

    python -m pytest tests/unit/test_causal.py -q

Single process, no torch.distributed: `tests/dist/test_causal_cp.py` runs the attention and the
KV cache on P ranks.
"""

from fractions import Fraction

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from cpcourse import causal
from cpcourse.support.errors import InputError

worlds = st.integers(1, 6)


@given(st.integers(1, 9), st.integers(1, 4), st.integers(1, 3))
def test_the_mask_lets_each_token_see_its_chunk_and_earlier_ones(frames, chunk, tpf):
    mask = causal.block_causal_mask(frames, chunk, tpf)
    frame = torch.arange(frames * tpf) // tpf
    want = (frame[None, :] // chunk) <= (frame[:, None] // chunk)
    assert mask.dtype == torch.bool and mask.shape == (frames * tpf, frames * tpf)
    assert torch.equal(mask, want)
    sizes = causal.chunk_sizes(causal.chunk_of_frames(frames, chunk, tpf))
    assert sizes[:-1] == [chunk * tpf] * (len(sizes) - 1)  # only the last chunk may be short
    assert 0 < sizes[-1] <= chunk * tpf and sum(sizes) == frames * tpf
    # the work of the chunks is the mask's area, chunk by chunk
    assert sum(causal.chunk_work(sizes)) == int(mask.sum())


@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), worlds,
       st.sampled_from(causal.SCHEMES))
def test_every_scheme_deals_every_chunk_once(sizes, world, scheme):
    if world > len(sizes):
        return
    a = causal.assign_chunks(len(sizes), world, scheme, sizes)
    assert len(a) == world and all(mine and mine == sorted(mine) for mine in a)
    assert sorted(c for mine in a for c in mine) == list(range(len(sizes)))
    assert sum(causal.rank_work(a, sizes)) == sum(causal.chunk_work(sizes))
    layout = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    tokens = torch.cat([causal.rank_tokens(layout, a, r) for r in range(world)])
    assert sorted(tokens.tolist()) == list(range(sum(sizes)))
    for r, t in enumerate(causal.ring_traffic(a, sizes)):  # a ring brings every other token
        assert t["useful"] + t["wasted"] == sum(sizes) - len(causal.rank_tokens(layout, a, r))


@given(st.integers(1, 6), st.integers(1, 4))
def test_equal_chunks_work_and_waste_closed_forms(world, m):
    """C = 2Pm equal chunks (k = C/P per rank), chunk i costs i + 1: contiguous rank r does
    k^2 r + k(k+1)/2, striped k(r+1) + P k(k-1)/2, zigzag C(C+1)/(2P) on every rank; a ring
    wastes 1/2 (contiguous) and 1/4 (zigzag) of its traffic whatever P > 1 and m."""
    p, c = world, 2 * world * m
    sizes = [1] * c
    k = c // p  # chunks per rank, contiguous and striped
    contiguous = causal.rank_work(causal.assign_chunks(c, p, "contiguous"), sizes)
    assert contiguous == [k * r * k + k * (k + 1) // 2 for r in range(p)]
    striped = causal.rank_work(causal.assign_chunks(c, p, "striped"), sizes)
    assert striped == [k * (r + 1) + p * k * (k - 1) // 2 for r in range(p)]
    zigzag = causal.rank_work(causal.assign_chunks(c, p, "zigzag"), sizes)
    assert zigzag == [c * (c + 1) // 2 // p] * p
    if p > 1:
        waste = {s: causal.wasted_fraction(causal.ring_traffic(causal.assign_chunks(c, p, s),
                                                               sizes))
                 for s in ("contiguous", "zigzag")}
        assert waste == {"contiguous": 0.5, "zigzag": 0.25}


def test_the_research_notes_table_comes_out_of_the_code():
    """P = 4, 8 chunks: max/mean work 15/9, 9/9, 12/9; ring waste 12 and 6 of 24 chunk hops."""
    sizes = [1] * 8
    got = {s: causal.assign_chunks(8, 4, s, sizes) for s in causal.SCHEMES}
    ratio = {s: Fraction(max(w := causal.rank_work(a, sizes)) * len(w), sum(w))
             for s, a in got.items()}
    assert ratio["contiguous"] == Fraction(15, 9) and ratio["zigzag"] == 1
    assert ratio["striped"] == Fraction(12, 9) and ratio["greedy"] == 1
    wasted = {s: sum(t["wasted"] for t in causal.ring_traffic(got[s], sizes))
              for s in ("contiguous", "zigzag")}
    assert wasted == {"contiguous": 12, "zigzag": 6}
    assert causal.imbalance(causal.rank_work(got["contiguous"], sizes)) == pytest.approx(15 / 9)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=14), worlds)
def test_greedy_stays_within_the_list_scheduling_bound(sizes, world):
    """Largest-first to the least loaded: max <= mean + (1 - 1/P) * the largest chunk's work."""
    if world > len(sizes):
        return
    work = causal.rank_work(causal.assign_chunks(len(sizes), world, "greedy", sizes), sizes)
    every = causal.chunk_work(sizes)
    assert max(work) * world <= sum(every) + (world - 1) * max(every)


@pytest.mark.parametrize("call, words", [
    (lambda: causal.assign_chunks(3, 4, "zigzag"), "world 4 is larger than the 3 chunks"),
    (lambda: causal.assign_chunks(8, 2, "spiral"), "scheme must be one of"),
    (lambda: causal.assign_chunks(4, 2, "greedy", [1, 2]), "sizes must give 4"),
    (lambda: causal.block_causal_mask(4, 0, 2), "chunk must be > 0"),
    (lambda: causal.chunk_sizes(torch.tensor([0, 2, 2])), "without gaps"),
    (lambda: causal.check_design("ulysses", 3, 2), "must divide the head count"),
    (lambda: causal.check_design("pass-x", 4, 2), "design must be one of"),
])
def test_bad_input_names_what_to_change(call, words):
    with pytest.raises(InputError, match=words):
        call()
    causal.check_design("pass-q", 3, 2)  # the sequence-sharded designs take any head count


def test_the_buggy_ring_is_right_contiguous_and_wrong_under_zigzag():
    """Exercise 14.2's bug is real, and hides where a learner first looks: the colleague's ring
    is exact when every rank holds a contiguous run, and drops a block under zigzag."""
    from solutions.ex14_causal import ring_block_causal_buggy

    layout = causal.chunk_of_frames(4, 1, 2)
    q, k, v = (torch.randn(1, 1, 8, 4, generator=torch.Generator().manual_seed(i),
                           dtype=torch.float64) for i in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=causal.block_causal_mask(4, 1, 2))
    errors = {}
    for scheme in ("contiguous", "zigzag"):
        assignment = causal.assign_chunks(4, 2, scheme)
        outs, _ = ring_block_causal_buggy(q, k, v, layout, assignment)
        errors[scheme] = max(float((out - want[:, :, causal.rank_tokens(layout, assignment, r)])
                                   .abs().max()) for r, out in enumerate(outs))
    assert errors["contiguous"] < 1e-12 and errors["zigzag"] > 1e-3, errors


def test_run_causal_refuses_before_any_process_starts():
    from cpcourse.runs.causal_cp import run_causal

    with pytest.raises(InputError, match="longer than the clip"):
        run_causal(2, frames=4, chunk=5)
    with pytest.raises(InputError, match="heads"):
        run_causal(2, heads=0)


@given(st.lists(st.integers(1, 9), min_size=1, max_size=14), worlds)
def test_balanced_keeps_the_token_split_and_never_loses_to_zigzag(sizes, world):
    """Chunk counts per rank as torch.tensor_split gives them (MagiAttention's |B_j| = n / P),
    and, for equal chunks, a busiest rank no busier than zigzag's."""
    n = len(sizes)
    if world > n:
        return
    got = causal.assign_chunks(n, world, "balanced", sizes)
    assert [len(m) for m in got] == [len(t) for t in torch.arange(n).tensor_split(world)]
    equal = [1] * n
    mine = max(causal.rank_work(causal.assign_chunks(n, world, "balanced"), equal))
    assert mine <= max(causal.rank_work(causal.assign_chunks(n, world, "zigzag"), equal))

