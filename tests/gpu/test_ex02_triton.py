"""The reference answer of exercise 02.5 (a Triton FlashAttention forward) on a GPU: -m gpu.

    python -m pytest -m gpu tests/gpu/test_ex02_triton.py -q   # a CUDA machine with Triton

Against `cpcourse.attention.attention_with_lse` in float64, at the library's bf16 and fp16
tolerances, on odd lengths and a ring block of a released model's shape (Wan 14B: 40 heads of
128). The graded tests (tests/graded/test_ex02_triton.py) run the learner's kernel the same way.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from cpcourse.attention import TOLERANCES, attention_with_lse, merge_attention
from solutions import ex02_triton as T

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available()
                                 or importlib.util.find_spec("triton") is None,
                                 reason="needs a CUDA GPU and triton")]


def _close(got, want, dtype, part):
    atol, rtol = TOLERANCES[dtype][part]
    err = (got.double().cpu() - want).abs()
    assert bool((err <= atol + rtol * want.abs()).all()), f"{part}: max error {float(err.max())}"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("lq, lk, d", [(1, 1, 64), (37, 65, 64), (257, 129, 128), (64, 300, 32)])
def test_reference_kernel_matches_float64(dtype, lq, lk, d):
    gen = torch.Generator().manual_seed(lq + lk)
    q, k, v = (torch.randn(2, 3, n, d, generator=gen, dtype=torch.float64).to(dtype)
               for n in (lq, lk, lk))
    got = T.flash_attention_triton(q.cuda(), k.cuda(), v.cuda())
    want = attention_with_lse(q.double(), k.double(), v.double())
    _close(got[0], want[0], dtype, "out")
    _close(got[1], want[1], dtype, "lse")


def test_a_ring_block_of_wan_14b_and_an_empty_block():
    q, k, v = (torch.randn(1, 40, 9450, 128, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    got = T.flash_attention_triton(q, k, v)
    empty = T.flash_attention_triton(q, k[:, :, :0], v[:, :, :0])
    out, lse = merge_attention(*got, *empty)
    want = attention_with_lse(q, k, v)
    assert float((out.float() - want[0].float()).abs().max()) < 2e-2
    assert float((lse - want[1].float()).abs().max()) < 1e-3
