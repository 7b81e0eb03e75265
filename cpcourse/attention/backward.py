"""The attention backward from the saved lse: one block of keys at a time, no score matrix kept.

    python -m pytest tests/unit/test_attention_backward.py -q

Layout: q `[B, H, Lq, D]`, k `[B, H, Lk, D]`, v `[B, H, Lk, Dv]`, out and dout `[B, H, Lq, Dv]`,
lse `[B, H, Lq]` (`cpcourse.attention.attention_with_lse`'s). With S = scale * q k^T and
P = softmax(S) = exp(S - lse), out = P v, the gradients are
    dV = P^T dout            dP = dout v^T
    dS = P o (dP - D)        D = rowsum(dout o out)   (= rowsum(P o dP), one number per query)
    dQ = scale * dS k        dK = scale * dS^T q
Every one of them is a sum over key blocks of the same formulas applied to that block, once the
forward has saved out and lse for the WHOLE row: P of a block is exp(S_block - lse), exact, with no
max or normaliser of its own. That is what the ring's backward does on each rank (`cpcourse.ring`):
the forward keeps (out, lse), O(L) per query, and each step recomputes one block's P instead of
storing the `Lq x Lk` probabilities (flash-attention's trade: twice the matmuls, no L^2 memory).
"""

from __future__ import annotations

import math

import torch

from cpcourse.online_softmax import accumulator_dtype

# Materialise the recomputed P for about this many query rows x keys at a time.
_CHUNK_ELEMS = 1 << 22


def row_delta(out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """D = rowsum(dout o out) `[B, H, Lq]`, in the accumulator dtype: computed once per call, it
    stands in for rowsum(P o dP) over ALL keys, which no single block could compute."""
    acc = accumulator_dtype(out.dtype)
    return (dout.to(acc) * out.to(acc)).sum(-1)


def attention_backward_from_lse(q, k, v, dout, lse, delta, scale=None):
    """One key block's share of the gradients: (dq part `[B, H, Lq, D]`, dk `[B, H, Lk, D]`,
    dv `[B, H, Lk, Dv]`), all in the accumulator dtype (float32; float64 for float64 inputs).

    `lse` `[B, H, Lq]` and `delta` `[B, H, Lq]` (`row_delta`) belong to the queries' WHOLE rows
    (every key, not only this block's); summing the dq parts over a partition of the keys into
    blocks gives dQ, and each block's dk, dv are its own keys' gradients. Rows with lse = -inf
    (no keys anywhere) get zero gradients, never NaN.
    """
    acc = accumulator_dtype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    qa, ka, va, da = (t.to(acc) for t in (q, k, v, dout))
    dq = torch.zeros(qa.shape, dtype=acc, device=q.device)
    dk = torch.zeros(ka.shape, dtype=acc, device=q.device)
    dv = torch.zeros(va.shape, dtype=acc, device=q.device)
    if 0 in q.shape[2:3] or 0 in k.shape[2:3] or 0 in q.shape[:2]:
        return dq, dk, dv
    # lse = -inf only where a row saw no key at all: exp(S - inf) = 0 there, not exp(+inf)
    lse = lse.to(acc).masked_fill(torch.isneginf(lse), math.inf).unsqueeze(-1)  # [B, H, Lq, 1]
    delta = delta.to(acc).unsqueeze(-1)  # [B, H, Lq, 1]
    rows = max(1, _CHUNK_ELEMS // max(1, q.shape[0] * q.shape[1] * k.shape[2]))
    for i in range(0, q.shape[2], rows):
        sl = slice(i, i + rows)
        # P = exp(S - lse) `[B, H, rows, Lk]`: the formulas above are FlashAttention-2's
        # backward (Dao 2023, Algorithm 2, https://arxiv.org/abs/2307.08691)
        p = torch.exp((qa[:, :, sl] @ ka.transpose(-2, -1)) * scale - lse[:, :, sl])
        dv += p.transpose(-2, -1) @ da[:, :, sl]  # [B, H, Lk, Dv]
        ds = p.mul_((da[:, :, sl] @ va.transpose(-2, -1)).sub_(delta[:, :, sl]))  # P o (dP - D)
        dq[:, :, sl] = (ds @ ka) * scale  # [B, H, rows, D]
        dk += (ds.transpose(-2, -1) @ qa[:, :, sl]) * scale  # [B, H, Lk, D]
    return dq, dk, dv


def blockwise_attention_backward(q, k, v, out, dout, lse, scale=None, block: int = 64):
    """The whole backward on one device, `block` keys at a time (the ring's loop without the
    ring): (dq, dk, dv) in the inputs' dtype, equal to autograd through `reference_attention`."""
    delta = row_delta(out, dout)
    acc = accumulator_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    dks, dvs = [], []
    for j in range(0, max(k.shape[2], 1), max(1, block)):
        part, dk, dv = attention_backward_from_lse(q, k[:, :, j:j + block], v[:, :, j:j + block],
                                                   dout, lse, delta, scale)
        dq += part
        dks.append(dk)
        dvs.append(dv)
    return dq.to(q.dtype), torch.cat(dks, 2).to(k.dtype), torch.cat(dvs, 2).to(v.dtype)
