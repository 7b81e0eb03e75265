"""From the textbook softmax to blockwise attention: the four teaching versions, numbered.

    python -m cpcourse.online_softmax

v1 naive       exp(x) / sum(exp(x)): overflows as soon as a logit passes ~88 in float32.
v2 safe        subtract the row max first: two passes over the row (max, then sum).
v3 online      one pass keeping a running max m and a running sum s; when the max grows, the sum
               so far is rescaled by exp(m_old - m_new). This is what lets attention stream K/V.
v4 blockwise   attention over K/V blocks with a running max, running sum and a running weighted sum
               of V: the whole of FlashAttention's idea, without the kernel engineering.
Each is checked against `cpcourse.attention.reference_attention` in tests/unit/test_attention.py.
"""

from __future__ import annotations

import math

import torch

from cpcourse.support.errors import positive_int, require


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums and lse are kept in: float32 for fp16/bf16/fp32, float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def softmax_v1_naive(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """`exp(x) / sum(exp(x))` along `dim`. Correct on paper; inf/inf = NaN once exp overflows."""
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def softmax_v2_safe(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax along `dim` with the max subtracted first (pass 1: max; pass 2: exp and sum).

    `exp(x - max) <= 1`, so nothing overflows, and the result is unchanged because the factor
    `exp(-max)` cancels between numerator and denominator.
    """
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def online_softmax_stats(x: torch.Tensor, block_size: int = 1, trace: list | None = None):
    """One pass over the last dim of `x` `[..., N]` in blocks: returns the row max and
    `sum(exp(x - max))`, each `[...]`, in the accumulator dtype.

    Invariant after each block: `s == sum over the columns seen so far of exp(x - m)`.
    A new block with max `m_b` moves the max to `m_new = max(m, m_b)`; the old terms were
    relative to `m`, so `s` is multiplied by `exp(m - m_new)` before the block's terms are added.
    If `trace` is a list, `(m, s)` after each block is appended to it (for the figures).
    """
    block_size = positive_int("block_size", block_size)
    acc = accumulator_dtype(x.dtype)
    m = torch.full(x.shape[:-1], -math.inf, dtype=acc, device=x.device)
    s = torch.zeros(x.shape[:-1], dtype=acc, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size].to(acc)
        m_new = torch.maximum(m, block.amax(dim=-1))
        s = s * torch.exp(m - m_new) + torch.exp(block - m_new.unsqueeze(-1)).sum(dim=-1)
        m = m_new
        if trace is not None:
            trace.append((m.clone(), s.clone()))
    return m, s


def softmax_v3_online(x: torch.Tensor, block_size: int = 1) -> torch.Tensor:
    """Softmax along the last dim whose normaliser (max and sum) comes from ONE pass over `x`.

    `x` `[..., N]` -> `[..., N]` in x's dtype. The normalisation itself, `exp(x - m) / s`, is the
    one further elementwise step; in attention it is folded into the weighted sum of V (see v4).
    """
    m, s = online_softmax_stats(x, block_size)
    return (torch.exp(x.to(m.dtype) - m.unsqueeze(-1)) / s.unsqueeze(-1)).to(x.dtype)


def attention_v4_blockwise(q, k, v, block_size: int, scale=None, acc_dtype=None,
                           trace: list | None = None):
    """Attention over K/V in blocks of `block_size` keys, never holding more than `Lq x block_size`
    scores: q `[B, H, Lq, D]`, k `[B, H, Lk, D]`, v `[B, H, Lk, Dv]` -> (out `[B, H, Lq, Dv]`
    in q's dtype, lse `[B, H, Lq]`).

    Running state per query row: max `m`, sum `l = sum exp(score - m)`, and `acc = sum
    exp(score - m) * v`. A block rescales `l` and `acc` by `exp(m_old - m_new)` and adds its own
    terms; at the end `out = acc / l` and `lse = m + log(l)`. The state is kept in `acc_dtype`
    (default float32, float64 for float64 inputs); passing bfloat16 shows why it must not be.
    If `trace` is a list, `(m, l, correction, acc)` after each block is appended to it (copies):
    `correction = exp(m_old - m_new)` is the factor that block applied to the old `l` and `acc`,
    and `acc / l` is the output over the keys seen so far.
    """
    block_size = positive_int("block_size", block_size)
    require(q.dim() == k.dim() == v.dim() == 4, "q, k, v must be 4-d tensors [B, H, L, D]")
    require(k.shape[2] == v.shape[2],
            f"k and v need the same number of keys: {k.shape[2]} != {v.shape[2]}")
    acc_dtype = accumulator_dtype(q.dtype) if acc_dtype is None else acc_dtype
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qa = q.to(acc_dtype)
    m = torch.full(q.shape[:3], -math.inf, dtype=acc_dtype, device=q.device)
    l = torch.zeros(q.shape[:3], dtype=acc_dtype, device=q.device)  # noqa: E741  (the paper's name)
    acc = torch.zeros(*q.shape[:3], v.shape[-1], dtype=acc_dtype, device=q.device)
    for start in range(0, k.shape[2], block_size):
        kb = k[:, :, start:start + block_size].to(acc_dtype)
        vb = v[:, :, start:start + block_size].to(acc_dtype)
        scores = (qa @ kb.transpose(-2, -1)).mul_(scale)
        m_new = torch.maximum(m, scores.amax(dim=-1))
        correction = torch.exp(m - m_new)          # exp(-inf) = 0 on the first block
        p = scores.sub_(m_new.unsqueeze(-1)).exp_()  # in place: one Lq x block tile at a time
        l.mul_(correction).add_(p.sum(dim=-1))
        acc.mul_(correction.unsqueeze(-1)).add_(p @ vb)
        m = m_new
        if trace is not None:
            trace.append((m.clone(), l.clone(), correction, acc.clone()))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if k.shape[2] == 0:
        return acc.to(q.dtype), m.to(lse_dtype)    # out = 0, lse = -inf
    out = acc / l.unsqueeze(-1)
    return out.to(q.dtype), (m.to(lse_dtype) + torch.log(l.to(lse_dtype)))


if __name__ == "__main__":
    row = torch.tensor([1.0, 3.0, 100.0, 2.0])  # exp(100) overflows float32
    for fn in (softmax_v1_naive, softmax_v2_safe, softmax_v3_online):
        print(f"{fn.__name__:18s}", fn(row))
