"""The ring's backward: each rank's gradients of its own q, k, v shards, from the saved lse.

    python -m pytest tests/dist/test_cp_backward.py -q     # against one process's autograd

Called by `cpcourse.ring.RingAttention.backward`; `saved` is the forward's (q, k, v, out, lse):
q and out `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`, lse `[B, H, Lq_r]`. Each block's
probabilities are recomputed from that lse (`cpcourse.attention.backward`), never stored.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.attention import accumulator_dtype
from cpcourse.attention.backward import attention_backward_from_lse, row_delta
from cpcourse.ring.comm import RingCall, RingComm, gather_kv
from cpcourse.support.groups import tracked


def ring_backward(saved: tuple, dout: torch.Tensor, kv_lens: list[int], call: RingCall) -> tuple:
    """The ring's backward: P steps of recompute-and-accumulate, P hops.

    dQ of this rank's queries is a sum over every K/V block: it stays here, like the forward's
    out. dK and dV of a block are sums over every rank's QUERIES, which never move, so the
    block's gradient accumulators travel with it: each block goes round as `[K, V, dK, dV]`
    (packed, one message, in the accumulator dtype), gains one rank's share at each step, and
    takes one more hop than the forward (P, not P - 1) to come home with its sums complete.
    Cost against the forward: twice the elements per hop (float32 for half inputs: 4x the
    bytes of bf16 K/V), one more hop, and two such buffers per rank. Compute comes before
    each hop: a block cannot leave before this rank has added its share.
    """
    q, k, v, out, lse = saved
    world = len(kv_lens)
    acc = accumulator_dtype(q.dtype)
    comm = RingComm(call.group, call.rank, world, kv_lens, (*k.shape[:2], k.shape[3], acc),
                    k.device, parts=4)
    blk = comm.load(k, v)  # [4, B, H, Lk_r, D]: K, V, dK, dV
    blk[2:].zero_()
    delta = row_delta(out, dout)  # [B, H, Lq_r]: rowsum(dO o O), once for every block
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)  # [B, H, Lq_r, D]
    for step in range(world):
        part, dk, dv = attention_backward_from_lse(q, blk[0], blk[1], dout, lse, delta,
                                                   call.scale)
        dq += part
        blk[2] += dk  # [B, H, Lk_(rank - step), D]
        blk[3] += dv
        comm.next_block(step)
        comm.exchange(step)
        comm.wait(step)
        blk = comm.advance()
    return dq, blk[2], blk[3]  # after P hops the block is this rank's own again


def allgather_backward(saved: tuple, dout: torch.Tensor, kv_lens: list[int],
                       call: RingCall) -> tuple:
    """All-gather K/V again (kept nowhere between the passes: memory over bytes), the whole
    backward here, then every rank's dK/dV contributions summed (one all-reduce of the padded
    `[P, 2, B, H, max L_r, D]`, which gloo takes where it has no reduce-scatter) and this rank's
    slice kept."""
    q, k, v, out, lse = saved
    world, rank = len(kv_lens), call.rank
    full, _ = gather_kv(k, v, kv_lens, call.group)  # [2, B, H, L, D]
    dq, dk, dv = attention_backward_from_lse(q, full[0], full[1], dout, lse,
                                             row_delta(out, dout), call.scale)
    b, h, _, d = k.shape
    padded = dk.new_zeros(world, 2, b, h, max(kv_lens), d)  # [P, 2, B, H, max L_r, D]
    for r, (a, n) in enumerate(zip(torch.tensor(kv_lens).cumsum(0).tolist(), kv_lens,
                                   strict=True)):
        padded[r, 0, :, :, :n] = dk[:, :, a - n:a]  # rank r's slice of dK [B, H, L, D]
        padded[r, 1, :, :, :n] = dv[:, :, a - n:a]
    with tracked("all_reduce (dK/dV)", group=call.group):
        dist.all_reduce(padded, group=call.group)
    return dq, padded[rank, 0, :, :, : kv_lens[rank]], padded[rank, 1, :, :, : kv_lens[rank]]
