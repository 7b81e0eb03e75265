"""Exercises of notebook 17, training under CP: the attention backward of one key block from the
saved lse, and a bug hunt in a ring's backward.

    python -m pytest tests/graded --ex 17.1 --impl exercises

The library's versions are `cpcourse.attention.backward.attention_backward_from_lse` and the
backward of `cpcourse.ring.RingAttention`. Check yours in the notebook with
`cpcourse.check("17.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.attention import attention_with_lse
from cpcourse.attention.backward import attention_backward_from_lse, row_delta


def block_backward(q, k, v, dout, lse, delta, scale):
    """One key block's share of the attention gradients, from what the forward saved.

    q `[B, H, Lq, D]` (float64), k and v `[B, H, Lk, D]`: ONE block of the keys; dout
    `[B, H, Lq, D]` the gradient of the whole output; lse `[B, H, Lq]` the log-sum-exp of each
    query's scores over ALL keys (every block, not only this one); delta `[B, H, Lq]` =
    rowsum(dout * out) with out the whole output; scale the softmax scale. Returns (dq_part
    `[B, H, Lq, D]`, dk `[B, H, Lk, D]`, dv `[B, H, Lk, D]`): summing dq_part over the blocks of
    any partition of the keys gives dq, and dk, dv are this block's keys' gradients.
    Rows whose lse is -inf never occur here (every query sees at least one key overall).
    """
    # BEGIN SOLUTION 17.1 | notebook 17, "The backward, one block at a time"
    # | hint: this block's probabilities are exp(scores - lse) with the WHOLE row's lse: exact,
    # | no max and no normaliser of the block's own. Then dV, dP, dS, dQ, dK as in section 1.
    # | hint2: one query, keys in two blocks with scores [0, ln 3]: lse = ln 4 and the first
    # | block's p is exp(0 - ln 4) = 0.25, not 1 (its own softmax); dS = p * (dP - delta).
    # | hint3: p = torch.exp(q @ k.mT * scale - lse[..., None]); dv = p.mT @ dout;
    # | ds = p * (dout @ v.mT - delta[..., None]); return ds @ k * scale, ds.mT @ q * scale, dv
    p = torch.exp(q @ k.transpose(-2, -1) * scale - lse.unsqueeze(-1))
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
    # END SOLUTION


def _forward_shards(q, k, v, dout, world):
    """Each simulated rank's shards and what its forward saved: (qs, ks, vs, ds, outs, lses)."""
    qs, ks, vs, ds = (x.tensor_split(world, dim=2) for x in (q, k, v, dout))
    saved = [attention_with_lse(qs[r], k, v) for r in range(world)]  # out, lse over all keys
    return qs, ks, vs, ds, [s[0] for s in saved], [s[1] for s in saved]


def ring_backward_buggy(q, k, v, dout, world: int):
    """The ring's backward, the `world` ranks simulated in this process, as a colleague wrote it
    (do not copy it). q, k, v, dout `[B, H, L, D]` whole, split like tensor_split; returns the
    whole (dq, dk, dv). Right at world = 1, wrong on more ranks.
    """
    qs, ks, vs, ds, outs, lses = _forward_shards(q, k, v, dout, world)
    scale = q.shape[-1] ** -0.5
    # block j = [K_j, V_j, dK_j, dV_j] starts at rank j; travelling[r] is the block rank r holds
    travelling = [[ks[j], vs[j], torch.zeros_like(ks[j]), torch.zeros_like(vs[j])]
                  for j in range(world)]
    dq = [torch.zeros_like(x) for x in qs]
    for _ in range(world):
        for r in range(world):
            kb, vb, dkb, dvb = travelling[r]
            part, dk, dv = attention_backward_from_lse(qs[r], ks[r], vs[r], ds[r], lses[r],
                                                       row_delta(outs[r], ds[r]), scale)
            dq[r] += part
            dkb += dk
            dvb += dv
        travelling = [travelling[(r - 1) % world] for r in range(world)]  # to rank r + 1
    # after `world` hops every block is home: travelling[j] is block j
    return (torch.cat(dq, 2), torch.cat([b[2] for b in travelling], 2),
            torch.cat([b[3] for b in travelling], 2))


def ring_backward(q, k, v, dout, world: int):
    """`ring_backward_buggy` with its bug fixed: the whole (dq, dk, dv) of attention over
    q, k, v `[B, H, L, D]` (float64) with upstream gradient dout, the `world` ranks simulated
    in this process, shards as tensor_split cuts them (uneven lengths included).
    """
    # BEGIN SOLUTION 17.2 | notebook 17, "Bug hunt: the K/V a step uses"
    # | hint: at step s rank r holds block (r - s) mod P, and its dK/dV accumulators travel with
    # | it. Which K and V does each step's recomputation read? Compare with the forward's ring.
    # | hint2: with 2 ranks, rank 0 at step 1 holds block 1: its probabilities must come from
    # | K_1 and V_1. The buggy loop uses K_0, V_0 again (diffusers #14265); with uneven shards
    # | its dK even has the wrong shape.
    # | hint3: in the loop, call attention_backward_from_lse(qs[r], kb, vb, ...) with the
    # | travelling block's kb, vb instead of ks[r], vs[r].
    qs, ks, vs, ds, outs, lses = _forward_shards(q, k, v, dout, world)
    scale = q.shape[-1] ** -0.5
    travelling = [[ks[j], vs[j], torch.zeros_like(ks[j]), torch.zeros_like(vs[j])]
                  for j in range(world)]
    dq = [torch.zeros_like(x) for x in qs]
    for _ in range(world):
        for r in range(world):
            kb, vb, dkb, dvb = travelling[r]
            part, dk, dv = attention_backward_from_lse(qs[r], kb, vb, ds[r], lses[r],
                                                       row_delta(outs[r], ds[r]), scale)
            dq[r] += part
            dkb += dk
            dvb += dv
        travelling = [travelling[(r - 1) % world] for r in range(world)]
    return (torch.cat(dq, 2), torch.cat([b[2] for b in travelling], 2),
            torch.cat([b[3] for b in travelling], 2))
    # END SOLUTION
