"""The course's own fused attention kernel, in Triton: out and its log-sum-exp in one pass.

    python -c "from cpcourse.attention.triton_kernel import why_not; print(why_not() or 'ok')"
    cpcourse bench gpu --parts attention --json   # times it beside SDPA's kernels on a GPU

The same online softmax as `cpcourse.online_softmax` (notebook 01), written as one GPU kernel:
each program holds BLOCK_M query rows of one (batch, head) in registers, walks the keys in
blocks of BLOCK_N, and keeps a running max `m`, a running sum `l` and an unnormalised output
`acc` (all float32). At the end `out = acc / l` and `lse = m + log(l)`: the lse the ring needs to
merge blocks (`cpcourse.attention.merge_attention`), which SDPA's public API does not return.
It works in base 2 (`exp2`, the hardware's fast exponential) and converts lse back to natural log.

Importing this module never needs Triton: the kernel is compiled on first use, and `why_not()`
says why it cannot run here (no Triton, no CUDA). Its correctness test against
`cpcourse.attention.attention_with_lse` is `tests/gpu/test_triton_attention.py` (-m gpu).
"""

from __future__ import annotations

import math

import torch

from cpcourse.support.errors import InputError
from cpcourse.support.qkv import attention_scale, check_qkv

_LOG2E = 1.0 / math.log(2.0)
_KERNEL = None  # compiled on first use: importing cpcourse must not need Triton


def why_not() -> str | None:
    """None when the kernel can run here, else the reason in a few words."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton: not installed"
    if not torch.cuda.is_available():
        return "triton: no CUDA device"
    return None


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def fwd(Q, K, V, Out, LSE, qk_scale, Lq, Lk, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn,
            sob, soh, som, H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):
        pid_m, bh = tl.program_id(0), tl.program_id(1)
        b, h = bh // H, bh % H
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                    mask=rows[:, None] < Lq, other=0.0)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        ell = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        for start in range(0, Lk, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            valid = cols < Lk
            kt = tl.load(K + b * skb + h * skh + cols[None, :] * skn + dims[:, None],
                         mask=valid[None, :], other=0.0)                     # [D, BLOCK_N]
            s = tl.dot(q, kt) * qk_scale                                     # base-2 logits
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))  # finite: every block holds a valid key
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m - m_new)           # rescale what was summed under the old max
            ell = ell * alpha + tl.sum(p, 1)
            v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + dims[None, :],
                        mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / ell[:, None]
        keep = rows < Lq
        tl.store(Out + b * sob + h * soh + rows[:, None] * som + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=keep[:, None])
        # back from base 2 to natural log: lse = ln(2) * (m + log2(l))
        tl.store(LSE + bh * Lq + rows, (m + tl.log2(ell)) * 0.6931471805599453, mask=keep)

    return fwd


def kernel_loop_source() -> str:
    """The kernel's loop over key blocks, as source text (notebook 02's appendix prints it
    beside the online softmax it implements)."""
    import inspect
    import textwrap

    src = inspect.getsource(_build)
    return textwrap.dedent(src[src.index("        for start"):src.index("        out = acc")])


def attention_with_lse_triton(q, k, v, scale=None):
    """`attention_with_lse`'s contract on the course's Triton kernel (CUDA, fp16/bf16/fp32).

    q `[B, H, Lq, D]`, k and v `[B, H, Lk, D]` (D a power of two from 16 to 256, Dv = D) ->
    out `[B, H, Lq, D]` in the input dtype, lse `[B, H, Lq]` float32 natural log.
    """
    global _KERNEL
    check_qkv(q, k, v)
    reason = why_not()
    if reason:
        raise InputError(f"the Triton attention kernel cannot run here ({reason})")
    d = q.shape[-1]
    if v.shape[-1] != d or d not in (16, 32, 64, 128, 256) or q.device.type != "cuda":
        raise InputError(f"the Triton kernel takes CUDA tensors with Dv = D in 16..256 (a power "
                         f"of two), got D {d}, Dv {v.shape[-1]} on {q.device.type}")
    if k.shape[2] == 0:
        raise InputError("the Triton kernel needs at least one key")
    _KERNEL = _KERNEL or _build()
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    bsz, heads, lq, lk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    out = torch.empty_like(q)
    lse = torch.empty(bsz, heads, lq, device=q.device, dtype=torch.float32)
    # 128 x 64 tiles: the shape Hopper's tensor cores like at D = 64 and 128 in bf16
    block_m, block_n = 128, 64
    grid = (math.ceil(lq / block_m), bsz * heads)
    _KERNEL[grid](q, k, v, out, lse, attention_scale(q, scale) * _LOG2E, lq, lk,
                  q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1),
                  out.stride(2), H=heads, D=d, BLOCK_M=block_m, BLOCK_N=block_n,
                  num_warps=8 if d >= 128 else 4, num_stages=2 if d >= 128 else 3)
    return out, lse
