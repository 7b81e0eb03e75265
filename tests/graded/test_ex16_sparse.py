"""Graded tests of notebook 16: dealing heads to ranks by their sparse work, and an FP8 send whose
scale must come from every rank.

    python -m pytest tests/graded --ex 16.1 --impl solutions
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.course.testing import assert_close
from cpcourse.fp8_comm import Codec, calibrated_scale, roundtrip
from cpcourse.sparse.cp import contiguous, greedy_assign, imbalance

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=40)


def _loads(work, deal):
    return [sum(work[h] for h in mine) for mine in deal]


def _check_deal(got, heads, world):
    assert isinstance(got, list) and len(got) == world, f"one list per rank, got {got!r}"
    assert sorted(h for mine in got for h in mine) == list(range(heads)), (
        f"every head exactly once: {got}")
    assert all(len(mine) == heads // world for mine in got), (
        f"Ulysses needs {heads // world} heads on every rank, got {[len(m) for m in got]}")


@pytest.mark.ex("16.1")
def test_a_skewed_head_distribution_is_dealt_evenly(impl):
    mod = impl("ex16_sparse")
    work = [float(2 ** (h // 2)) for h in range(12)][::-1]   # a few dense heads, many sparse
    for world in (2, 3, 4):
        got = mod.balance_heads(work, world)
        _check_deal(got, 12, world)
        plain = imbalance(_loads(work, contiguous(12, world)))
        mine = imbalance(_loads(work, got))
        greedy = imbalance(_loads(work, greedy_assign(work, world)))
        assert plain >= 1.3 and mine <= 1.05 * greedy, (
            f"{world} ranks: loads {_loads(work, got)}, imbalance {mine:.3f} (contiguous "
            f"{plain:.3f}): deal the heaviest heads first, each to the least-loaded rank")


@pytest.mark.ex("16.1")
@FIXTURE_OK
@given(world=st.integers(1, 4), per=st.integers(1, 5), data=st.data())
def test_no_worse_than_the_greedy_deal(impl, world, per, data):
    mod = impl("ex16_sparse")
    work = data.draw(st.lists(st.integers(0, 1000), min_size=world * per,
                              max_size=world * per))
    got = mod.balance_heads([float(w) for w in work], world)
    _check_deal(got, world * per, world)
    best = max(_loads(work, greedy_assign(work, world)))
    assert max(_loads(work, got)) <= best + 1e-9, (
        f"work {work} on {world} ranks: busiest rank {max(_loads(work, got))}, the greedy "
        f"deal's {best}")


def _shards(seed, sizes=(1.0, 3.0, 0.5)):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 5, 16, generator=g) * s for s in sizes]


@pytest.mark.ex("16.2")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_rank_is_clipped(impl, seed):
    mod = impl("ex16_sparse")
    shards = _shards(seed)
    got = mod.fp8_send(shards)
    assert len(got) == len(shards)
    peak = max(float(x.abs().max()) for x in shards)
    for r, (x, y) in enumerate(zip(shards, got, strict=True)):
        # e4m3 keeps 4 significant bits: 2^-4 of the shared scale's range, with headroom
        assert_close(y, x, atol=peak / 8, rtol=0, dims=("B", "L", "D"), name=f"rank {r}",
                     hint="rank 1's values are 3x rank 0's: whose amax set the scale?")


@pytest.mark.ex("16.2")
def test_every_rank_shares_one_scale(impl):
    mod = impl("ex16_sparse")
    shards = _shards(3, sizes=(0.5, 1.0, 4.0, 2.0))
    got = mod.fp8_send(shards)
    shared = Codec("fp8-tensor", calibrated_scale(max(float(x.abs().max()) for x in shards)))
    for r, (x, y) in enumerate(zip(shards, got, strict=True)):
        assert_close(y, roundtrip(x, shared), atol=0, rtol=0, dims=("B", "L", "D"),
                     name=f"rank {r}", hint="one scale for all ranks, from the largest |x| "
                     "anywhere (calibrated_scale of the max over ranks)")
