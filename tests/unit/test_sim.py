"""The simulated ring: exact against float64 attention at P = 1..8, and its schedule and bytes.

    python -m pytest tests/unit/test_sim.py -q
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.attention import attention_with_lse, merge_attention, reference_attention
from cpcourse.sim import (
    block_grid,
    bytes_sent,
    ring_schedule,
    simulate_ring,
    timeline,
)
from cpcourse.support.errors import InputError


def _qkv(b, h, lq, lk, d, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=g, dtype=dtype),
            torch.randn(b, h, lk, d, generator=g, dtype=dtype),
            torch.randn(b, h, lk, d, generator=g, dtype=dtype))


@settings(max_examples=40, deadline=None)
@given(world=st.integers(1, 8), b=st.integers(1, 2), h=st.integers(1, 3),
       length=st.integers(1, 40), d=st.integers(1, 17), seed=st.integers(0, 2**16))
def test_the_simulated_ring_equals_attention_in_float64(world, b, h, length, d, seed):
    q, k, v = _qkv(b, h, length, length, d, seed)
    res = simulate_ring(q, k, v, world)
    out, lse = reference_attention(q, k, v)
    torch.testing.assert_close(res.out, out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(res.lse, lse, atol=1e-12, rtol=1e-12)
    assert res.shard_sizes == [len(x) for x in torch.tensor_split(torch.arange(length), world)]


@pytest.mark.parametrize("world", range(1, 9))
def test_float32_within_tolerance_with_uneven_and_empty_shards(world):
    q, k, v = _qkv(1, 2, 5, 5, 8, seed=world)  # at P > 5 some ranks hold no tokens
    res = simulate_ring(q.float(), k.float(), v.float(), world)
    torch.testing.assert_close(res.out.double(), reference_attention(q, k, v)[0],
                               atol=1e-5, rtol=1e-5)


def test_cross_attention_lengths_and_a_custom_merge_are_used():
    q, k, v = _qkv(1, 1, 7, 11, 4, seed=3)
    calls = []

    def merge(*args):
        calls.append(1)
        return merge_attention(*args)

    res = simulate_ring(q, k, v, 3, merge=merge, attention=attention_with_lse)
    torch.testing.assert_close(res.out, reference_attention(q, k, v)[0])
    assert len(calls) == 3 * 2  # every rank merges P - 1 times


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_schedule_every_rank_sees_every_block_once(world):
    sched = ring_schedule(world)
    assert sched[0] == list(range(world))  # step 0: everyone starts with its own block
    for rank in range(world):
        assert sorted(sched[s][rank] for s in range(world)) == list(range(world))
    for step in range(world):
        assert sorted(sched[step]) == list(range(world))  # each block at exactly one rank
    q, k, v = _qkv(1, 1, 2 * world + 1, 2 * world + 1, 4, seed=world)
    events = simulate_ring(q, k, v, world).events
    computed = [[e.kv_block for e in events if e.kind == "compute" and e.step == s]
                for s in range(world)]
    assert computed == sched  # what the simulation did is the schedule
    grid = block_grid(events, world)
    assert all(grid[r][c] == (r - c) % world for r in range(world) for c in range(world))


def test_a_block_travels_to_the_next_rank_each_step():
    world = 4
    q, k, v = _qkv(1, 1, 8, 8, 2, seed=0)
    events = simulate_ring(q, k, v, world).events
    sends = [e for e in events if e.kind == "send"]
    recvs = [e for e in events if e.kind == "recv"]
    assert len(sends) == len(recvs) == world * (world - 1)  # no send after the last step
    for s in sends:
        assert s.peer == (s.rank + 1) % world
        match = [r for r in recvs if r.step == s.step and r.rank == s.peer]
        assert len(match) == 1 and match[0].kv_block == s.kv_block and match[0].peer == s.rank
        assert match[0].nbytes == s.nbytes


@pytest.mark.parametrize("world, length", [(2, 16), (3, 10), (4, 3), (8, 5)])
def test_bytes_sent_per_rank(world, length):
    b, h, d = 2, 3, 4
    q, k, v = _qkv(b, h, length, length, d, seed=1, dtype=torch.float32)
    sizes = [len(x) for x in torch.tensor_split(torch.arange(length), world)]
    per_token = 2 * b * h * d * 4  # K and V, float32
    expected = [per_token * sum(sizes[(r - s) % world] for s in range(world - 1))
                for r in range(world)]  # rank r forwards every block but the one before it
    assert bytes_sent(simulate_ring(q, k, v, world).events, world) == expected


def test_timeline_overlap_hides_communication_when_it_is_shorter():
    q, k, v = _qkv(1, 1, 64, 64, 8, seed=2, dtype=torch.float32)
    events = simulate_ring(q, k, v, 4).events
    flops = sum(e.flops for e in events if e.kind == "compute" and e.rank == 0)
    fast, slow = 1e9, 1e3
    compute_only = flops / fast
    for bw, hidden in ((1e12, True), (slow, False)):
        over = max(r["end"] for r in timeline(events, 4, fast, bw, overlap=True))
        block = max(r["end"] for r in timeline(events, 4, fast, bw, overlap=False))
        assert over <= block + 1e-12
        assert (abs(over - compute_only) < 1e-9) == hidden
    rows = timeline(events, 4, fast, 1e6, overlap=False)
    for r in range(4):  # blocking: a rank's compute steps never overlap its transfers
        mine = sorted((x["start"], x["end"]) for x in rows if x["rank"] == r)
        assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:], strict=False))


def test_bad_input_is_a_clear_error():
    q, k, v = _qkv(1, 1, 4, 4, 2, seed=0)
    with pytest.raises(InputError, match="world must be > 0"):
        simulate_ring(q, k, v, 0)
    with pytest.raises(InputError, match="k and v of one shape"):
        simulate_ring(q, k, v[..., :1], 2)


def test_compute_path_times_the_same_arithmetic():
    from cpcourse.sim import compute_path

    rep = compute_path(seq_len=37, world=3, heads=2, head_dim=8, device="cpu", repeats=1)
    assert rep["max_abs_diff"] <= 1e-5 and rep["fused_seconds"] > 0 and rep["nproc"] == 3
    assert rep["fused_over_ring"] == rep["fused_seconds"] / rep["ring_compute_seconds"]
