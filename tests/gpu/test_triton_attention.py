"""The course's Triton attention kernel against `cpcourse.attention`: `pytest -m gpu`.

    python -m pytest -m gpu tests/gpu/test_triton_attention.py -q   # on a CUDA machine with Triton

Tolerances are the library's (`cpcourse.attention.TOLERANCES`) against float64 from the same
rounded inputs. fp16 and bf16 only: the kernel rounds the probabilities to the input dtype for
the second matmul, as FlashAttention does, which those tolerances allow (bf16 out 2e-2, fp16
2e-3; lse is accumulated in float32: 1e-4). fp32 inputs go through `tl.dot` in TF32 (10
mantissa bits), whose logits miss fp32's lse tolerance, so fp32 is not claimed.
"""

from __future__ import annotations

import pytest
import torch

from cpcourse import attention as A
from cpcourse.attention import triton_kernel as T

# the gpu mark and the CUDA skip come from tests/gpu/conftest.py; Triton is this file's own need
pytestmark = pytest.mark.skipif(T.why_not() is not None, reason=str(T.why_not()))
DTYPES = (torch.float16, torch.bfloat16)


def _qkv(lq, lk, d, dtype, seed, h=3):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, h, n, d, generator=gen, dtype=torch.float64).to(dtype)
            for n in (lq, lk, lk)]


def _close(got, want, dtype, part):
    atol, rtol = A.TOLERANCES[dtype][part]
    err = (got.double().cpu() - want).abs()
    assert bool((err <= atol + rtol * want.abs()).all()), f"{part}: max error {float(err.max())}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lq, lk, d", [(1, 1, 64), (37, 65, 64), (130, 200, 128),
                                       (257, 129, 128), (64, 300, 32)])
def test_out_and_lse_match_float64(dtype, lq, lk, d):
    q, k, v = _qkv(lq, lk, d, dtype, seed=lq + lk + d)
    want_o, want_s = A.attention_with_lse(q.double(), k.double(), v.double())
    got_o, got_s = T.attention_with_lse_triton(q.cuda(), k.cuda(), v.cuda())
    assert got_o.dtype == dtype and got_s.dtype == torch.float32
    assert got_o.shape == want_o.shape and got_s.shape == want_s.shape
    _close(got_o, want_o, dtype, "out")
    _close(got_s, want_s, dtype, "lse")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_its_blocks_merge_into_one_call(dtype):
    """What the ring does with it: two key blocks' (out, lse), merged, equal the whole."""
    q, k, v = (t.cuda() for t in _qkv(77, 203, 128, dtype, seed=5))
    a = T.attention_with_lse_triton(q, k[:, :, :90], v[:, :, :90])
    b = T.attention_with_lse_triton(q, k[:, :, 90:], v[:, :, 90:])
    out, lse = A.merge_attention(*a, *b)
    want_o, want_s = A.attention_with_lse(*(t.double().cpu() for t in (q, k, v)))
    _close(out.to(dtype), want_o, dtype, "out")
    _close(lse, want_s, dtype, "lse")


def test_it_matches_sdpa_at_a_video_shape():
    """A ring block of Wan 14B's shape (40 heads of 128, 9,450 tokens), against SDPA's pick."""
    q, k, v = (torch.randn(1, 40, 9450, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    got_o, got_s = T.attention_with_lse_triton(q, k, v)
    want_o, want_s = A.attention_with_lse(q, k, v)
    assert float((got_o.float() - want_o.float()).abs().max()) < 2e-2
    assert float((got_s - want_s.float()).abs().max()) < 1e-3


def test_bad_inputs_are_refused():
    q = torch.randn(1, 1, 8, 48, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(A.InputError, match="power"):
        T.attention_with_lse_triton(q, q, q)
