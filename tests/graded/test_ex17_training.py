"""Graded tests of notebook 17: one key block's backward from the saved lse, and the ring's
backward with the K/V bug fixed, both against float64 autograd.

    python -m pytest tests/graded --ex 17.1 --impl solutions
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpcourse.attention import attention_with_lse
from cpcourse.attention.backward import row_delta
from cpcourse.course.testing import assert_close

FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=30)
DIMS = ("B", "H", "L", "D")


def _inputs(b, h, lq, lk, d, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64)
            for s in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d), (b, h, lq, d))]


def _autograd(q, k, v, dout):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    (torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1) @ v).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.ex("17.1")
@FIXTURE_OK
@given(b=st.integers(1, 2), h=st.integers(1, 3), lq=st.integers(1, 23), lk=st.integers(1, 40),
       d=st.sampled_from([2, 5, 8]), cuts=st.lists(st.integers(0, 40), max_size=4),
       seed=st.integers(0, 10**6))
def test_block_gradients_sum_to_autograd(impl, b, h, lq, lk, d, cuts, seed):
    mod = impl("ex17_training")
    q, k, v, dout = _inputs(b, h, lq, lk, d, seed)
    out, lse = attention_with_lse(q, k, v)
    delta, scale = row_delta(out, dout), d ** -0.5
    edges = sorted({0, lk, *(min(c, lk) for c in cuts)})
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for a, z in zip(edges, edges[1:], strict=False):
        part, dk, dv = mod.block_backward(q, k[:, :, a:z], v[:, :, a:z], dout, lse, delta, scale)
        dq += part
        dks.append(dk)
        dvs.append(dv)
    want = _autograd(q, k, v, dout)
    hint = ("a block's probabilities use the WHOLE row's lse (passed in), never the block's "
            "own softmax")
    for name, got, w in (("dq", dq, want[0]), ("dk", torch.cat(dks, 2), want[1]),
                         ("dv", torch.cat(dvs, 2), want[2])):
        assert_close(got, w, atol=1e-10, rtol=1e-8, dims=DIMS, hint=hint,
                     name=f"{name} (keys cut at {edges})")


@pytest.mark.ex("17.2")
@FIXTURE_OK
@given(world=st.integers(1, 4), extra=st.integers(0, 7), d=st.sampled_from([3, 8]),
       seed=st.integers(0, 10**6))
def test_the_fixed_ring_backward_equals_autograd(impl, world, extra, d, seed):
    mod = impl("ex17_training")
    length = world + extra  # uneven shards as often as not
    q, k, v, dout = _inputs(1, 2, length, length, d, seed)
    got = mod.ring_backward(q, k, v, dout, world)
    want = _autograd(q, k, v, dout)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert_close(g, w, atol=1e-10, rtol=1e-8, dims=DIMS,
                     name=f"{name} ({world} ranks, L = {length})",
                     hint="at step s rank r holds block (r - s) mod P: recompute from THAT "
                          "block's K and V")
