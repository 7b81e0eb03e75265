"""cpcourse.attention.backward: the blockwise backward from the saved lse against autograd.

    python -m pytest tests/unit/test_attention_backward.py -q
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse.attention import attention_with_lse
from cpcourse.attention.backward import (
    attention_backward_from_lse,
    blockwise_attention_backward,
    row_delta,
)
from cpcourse.support.tolerance import tolerance


def autograd64(q, k, v, dout, scale=None):
    """One process's float64 autograd through softmax(scale q k^T) v."""
    q, k, v = (x.double().clone().requires_grad_() for x in (q, k, v))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    (torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v).backward(dout.double())
    return q.grad, k.grad, v.grad


def inputs(b, h, lq, lk, d, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
            for s in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d), (b, h, lq, d))]


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), h=st.integers(1, 3), lq=st.integers(1, 40), lk=st.integers(1, 40),
       d=st.sampled_from([2, 5, 8, 16]), block=st.integers(1, 45), seed=st.integers(0, 999),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       scale=st.sampled_from([None, 0.3]))
def test_blockwise_backward_equals_autograd(b, h, lq, lk, d, block, seed, dtype, scale):
    q, k, v, dout = inputs(b, h, lq, lk, d, seed, dtype)
    out, lse = attention_with_lse(q, k, v, scale=scale)
    got = blockwise_attention_backward(q, k, v, out, dout, lse, scale=scale, block=block)
    want = autograd64(q, k, v, dout, scale)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == dtype and g.shape == w.shape
        # the one rule: a sum over blocks in another order, relative to the gradients' size
        tol = tolerance("ring", str(dtype).split(".")[1], scale=float(w.abs().max()))
        assert float((g.double() - w).abs().max()) <= tol


def test_a_block_of_no_keys_adds_nothing_and_a_row_without_keys_is_zero_not_nan():
    q, k, v, dout = inputs(1, 2, 5, 0, 8, 0, torch.float32)
    lse = torch.full((1, 2, 5), float("-inf"))
    dq, dk, dv = attention_backward_from_lse(q, k, v, dout, lse, torch.zeros(1, 2, 5))
    assert dq.abs().max() == 0 and dk.shape == (1, 2, 0, 8) and dv.shape == (1, 2, 0, 8)
    _, k, v, _ = inputs(1, 2, 5, 3, 8, 1, torch.float32)
    dq, dk, dv = attention_backward_from_lse(q, k, v, dout, lse, torch.zeros(1, 2, 5))
    assert torch.isfinite(dq).all() and dk.abs().max() == 0 and dv.abs().max() == 0


def test_delta_is_rowsum_of_p_times_dp():
    q, k, v, dout = inputs(1, 1, 6, 9, 4, 3, torch.float64)
    p = torch.softmax(q @ k.transpose(-2, -1) / 2, -1)
    out = p @ v
    assert torch.allclose(row_delta(out, dout), (p * (dout @ v.transpose(-2, -1))).sum(-1))
