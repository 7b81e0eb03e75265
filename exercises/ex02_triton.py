# Yours to edit. Generated from solutions/ex02_triton.py by tools/make_exercises.py
# stub-sha256: 59f7e6395879a42f (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Optional exercise of notebook 02: the blockwise loop as one Triton kernel (02.5).

    python -m pytest tests/graded --ex 02.5 --impl exercises     # needs `pip install triton`
    python -m pytest -m gpu tests/gpu/test_ex02_triton.py -q     # the reference, on a CUDA GPU

In the style of Stanford CS336's assignment 2: exercise 02.2's loop, written as a GPU kernel.
Each program of the kernel holds BLOCK_M query rows of one (batch, head), walks the keys in
tiles of BLOCK_N, and keeps the running max, sum and unnormalised output in float32. It returns
the lse beside the output, so its results merge with any other block's
(`cpcourse.attention.merge_attention`), as a ring needs.

Triton is not a dependency of the course, and this exercise is optional: `cpcourse grade`
passes without it, and its graded tests skip, saying why, where Triton is missing. Without a
CUDA GPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set below before Triton
is imported), on CPU tensors, slowly but exactly: that is how it is graded on a laptop.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from cpcourse.support.errors import InputError, require
from cpcourse.support.qkv import attention_scale, check_qkv

if not torch.cuda.is_available():  # no GPU: Triton's interpreter runs the kernel on the CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

triton = tl = None  # imported by build_kernel(): importing this module never needs Triton
_KERNEL = []        # the kernel, built once


def why_not() -> str | None:
    """None when the kernel can run here, else why not (what to install)."""
    if importlib.util.find_spec("triton") is None:
        return ("triton is not installed (pip install triton): exercise 02.5 is optional, and "
                "runs in Triton's CPU interpreter or on a CUDA GPU")
    return None


def interpreted() -> bool:
    """True when kernels run in Triton's interpreter (on CPU tensors), not compiled for a GPU."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def build_kernel():
    """Import Triton and return the `@triton.jit` forward kernel `flash_attention_triton` runs.

    Its signature, as the launcher calls it on a grid (ceil(Lq / BLOCK_M), B * H):

        fwd(Q, K, V, Out, LSE, scale, Lq, Lk,
            sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som,
            H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr)

    Q, K, V, Out are `[B, H, L, D]` tensors with strides (batch, head, row) given, the last
    dimension contiguous; LSE is a contiguous float32 `[B, H, Lq]`. Program (i, bh) computes
    query rows [i * BLOCK_M, (i + 1) * BLOCK_M) of batch bh // H, head bh % H: rows past Lq are
    neither computed into memory nor stored, and the last key tile may run past Lk. It writes
    out (in Out's dtype) and lse = log sum_j exp(s_j) in natural log, float32. With Lk = 0 it
    must write what merges as nothing (exercise 01.2), not NaN.
    """
    # Exercise 02.5: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 02.5 build_kernel: read notebook 02, \"Optional: the loop as a "
        "Triton kernel\". Hint: exercise 02.2's loop, one tile of BLOCK_M query rows "
        "per program: load the q tile once (masked past Lq), then for each key tile "
        "load K transposed and V (masked past Lk), score with tl.dot, push the scores "
        "of keys past Lk to -inf before the row max, rescale the running sum and "
        "output by exp(m - m_new), add the tile's terms. Store out = acc / l and lse "
        "= m + log(l), masked to rows < Lq; rows that saw no key store 0 and -inf. (2 "
        "more: cpcourse.hint(\"02.5\"))"
    )


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           scale: float | None = None, block_m: int | None = None,
                           block_n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_with_lse` on the kernel of `build_kernel()`.

    q `[B, H, Lq, D]`, k and v `[B, H, Lk, D]` (D a power of two, 16 to 256) -> out
    `[B, H, Lq, D]` in q's dtype, lse `[B, H, Lq]` float32 (natural log). CUDA tensors, or CPU
    tensors under Triton's interpreter. Tiles default to 64 x 64 on a GPU, 16 x 16 interpreted.
    """
    reason = why_not()
    require(reason is None, f"cannot run the Triton kernel: {reason}")
    check_qkv(q, k, v)
    d = q.shape[-1]
    require(v.shape[-1] == d and d in (16, 32, 64, 128, 256),
            f"the kernel takes Dv = D, a power of two from 16 to 256; got D {d}, Dv {v.shape[-1]}")
    if (q.device.type == "cuda") == interpreted():
        raise InputError(f"{q.device.type} tensors with TRITON_INTERPRET="
                         f"{os.environ.get('TRITON_INTERPRET', '0')}: give CUDA tensors to a "
                         "compiled kernel, CPU tensors to the interpreter")
    small = 16 if interpreted() else 64
    block_m, block_n = block_m or small, block_n or small
    if not _KERNEL:
        _KERNEL.append(build_kernel())
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    bsz, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(bsz, heads, lq, device=q.device, dtype=torch.float32)
    if lq == 0:
        return out, lse
    grid = ((lq + block_m - 1) // block_m, bsz * heads)
    _KERNEL[0][grid](q, k, v, out, lse, attention_scale(q, scale), lq, lk,
                     q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
                     k.stride(2), v.stride(0), v.stride(1), v.stride(2), out.stride(0),
                     out.stride(1), out.stride(2), H=heads, D=d, BLOCK_M=block_m,
                     BLOCK_N=block_n)
    return out, lse
