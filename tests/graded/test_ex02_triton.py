"""Graded tests of the optional exercise 02.5: the blockwise loop as a Triton kernel.

    python -m pytest tests/graded --ex 02.5 --impl exercises

Needs Triton (`pip install triton`); without it every test here skips, saying so, and
`cpcourse grade` does not count the exercise against a pass. Without a CUDA GPU the kernel runs
in Triton's interpreter on CPU tensors (float32, compared with float64 at the course's float32
tolerance); on a GPU it is compiled and fed bf16 (the library's bf16 tolerances: the kernel
rounds the probabilities to the input dtype for the second matmul, as FlashAttention does).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cpcourse.attention import TOLERANCES, attention_with_lse, merge_attention
from cpcourse.course.testing import assert_close

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton): exercise 02.5 is optional; it runs in "
           "Triton's CPU interpreter or on a CUDA GPU")
DIMS, LSE_DIMS = ("B", "H", "L", "D"), ("B", "H", "L")
GPU = torch.cuda.is_available()
DTYPE = torch.bfloat16 if GPU else torch.float32
HINT = "02.2's loop per tile of query rows; keys past Lk must weigh nothing (mask to -inf)"


def _qkv(b, h, lq, lk, d, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.float64)
               for n in (lq, lk, lk))
    return [t.to(DTYPE).to("cuda" if GPU else "cpu") for t in (q, k, v)]


def _check(got, want, what):
    tol = TOLERANCES[DTYPE]
    assert_close(got[1].double().cpu(), want[1], atol=tol["lse"][0], rtol=tol["lse"][1],
                 dims=LSE_DIMS, name=f"lse, {what}", hint=HINT)
    assert_close(got[0].double().cpu(), want[0], atol=tol["out"][0], rtol=tol["out"][1],
                 dims=DIMS, name=f"out, {what}", hint=HINT)


@pytest.mark.ex("02.5")
@pytest.mark.parametrize("lq, lk, d", [(1, 1, 16), (37, 50, 16), (20, 17, 32), (33, 64, 16)])
def test_out_and_lse_match_float64(impl, lq, lk, d):
    mod = impl("ex02_triton")
    q, k, v = _qkv(1, 2, lq, lk, d, seed=lq + lk)
    got = mod.flash_attention_triton(q, k, v)
    assert got[0].dtype == DTYPE and got[1].dtype == torch.float32, (
        f"out should be {DTYPE} (q's dtype), lse float32; got {got[0].dtype}, {got[1].dtype}")
    _check(got, attention_with_lse(*(t.double().cpu() for t in (q, k, v))),
           f"Lq {lq}, Lk {lk}, D {d}")


@pytest.mark.ex("02.5")
def test_blocks_merge_into_the_whole_and_no_keys_merge_as_nothing(impl):
    mod = impl("ex02_triton")
    q, k, v = _qkv(2, 1, 19, 41, 16, seed=7)
    a = mod.flash_attention_triton(q, k[:, :, :23], v[:, :, :23])
    b = mod.flash_attention_triton(q, k[:, :, 23:], v[:, :, 23:])
    empty = mod.flash_attention_triton(q, k[:, :, :0], v[:, :, :0])
    assert torch.isfinite(empty[0]).all(), "out over no keys holds NaN or inf"
    parts = [(o.double().cpu(), s.double().cpu()) for o, s in (a, empty, b)]
    out, lse = merge_attention(*parts[0], *parts[1])
    out, lse = merge_attention(out, lse, *parts[2])
    _check((out, lse), attention_with_lse(*(t.double().cpu() for t in (q, k, v))),
           "two key blocks and an empty one, merged")
