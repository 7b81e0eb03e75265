"""Ulysses (DeepSpeed) attention: trade the sequence split for a head split, attend, trade back.

    python -m cpcourse.cli bench ring --nproc 2 --quick      # Ulysses among the other methods

Each rank starts with a contiguous sequence shard of every head, q, k, v `[B, H, L_r, D]`. One
all-to-all gives each rank the WHOLE sequence for H/P of the heads (`[B, H/P, L, D]`); attention
is then purely local (any kernel, no merge); a second all-to-all returns each rank its own
sequence shard of every head. Each rank keeps the 1/P of its shard that holds its own heads and
sends the other (P-1)/P of its q, k and v shards out, then (P-1)/P of its output shard back:
nearly its whole shard four times, whatever P is. P must divide the number of heads (the ring
has no such limit).
Uneven sequence shards (tensor_split order, including empty ones) ride on the uneven split
sizes of `all_to_all_single`, which gloo and NCCL both accept.
Backward: each all-to-all is a permutation of the tokens x heads, so its gradient is the inverse
permutation, the other all-to-all (`SeqToHeads`, `HeadsToSeq`); between them the local attention
is differentiated by autograd as in one process. Training costs the forward's bytes again, in the
same four all-to-alls transposed, and no new kind of code: the simplest correct CP backward.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from cpcourse.attention import attention_with_lse
from cpcourse.support.errors import InputError, require
from cpcourse.support.groups import agree, require_group, tracked


def _working_sizes(heads: int) -> list[int]:
    return [p for p in range(1, heads + 1) if heads % p == 0]


def seq_to_heads(x: torch.Tensor, lens: list[int], group, what: str) -> torch.Tensor:
    """x `[n, B, H, L_r, D]` (n tensors packed) -> `[n, B, H/P, L, D]`: all heads of my group.

    Chunk j of the send buffer is head group j of my shard; from rank i I receive head group
    `rank` of i's shard, L_i tokens long.
    """
    world = len(lens)
    n, b, h, lr, d = x.shape
    hp = h // world
    # [n, B, H, L_r, D] -> [P, n, B, H/P, L_r, D]: chunk j is head group j, for rank j
    send = x.reshape(n, b, world, hp, lr, d).permute(2, 0, 1, 3, 4, 5).contiguous()
    per_token = n * b * hp * d
    recv = x.new_empty(per_token * sum(lens))  # flat [n * B * H/P * L * D], rank by rank
    with tracked(f"all_to_all_single ({what}: sequence -> heads)", group=group):
        dist.all_to_all_single(recv, send.view(-1),
                               output_split_sizes=[per_token * li for li in lens],
                               input_split_sizes=[per_token * lr] * world, group=group)
    parts = recv.split([per_token * li for li in lens])
    # each rank's [n, B, H/P, L_i, D], joined along the sequence: [n, B, H/P, L, D]
    return torch.cat([p.view(n, b, hp, li, d) for p, li in zip(parts, lens, strict=True)], dim=3)


def heads_to_seq(out: torch.Tensor, lens: list[int], rank: int, group) -> torch.Tensor:
    """out `[B, H/P, L, D]` -> `[B, H, L_rank, D]`: my sequence shard of every head group."""
    world = len(lens)
    b, hp, _, d = out.shape
    send = torch.cat([p.reshape(-1) for p in out.split(lens, dim=2)])  # rank i's [B, H/P, L_i, D]
    per_token = b * hp * d
    recv = out.new_empty(world * per_token * lens[rank])
    with tracked("all_to_all_single (output: heads -> sequence)", group=group):
        dist.all_to_all_single(recv, send, output_split_sizes=[per_token * lens[rank]] * world,
                               input_split_sizes=[per_token * li for li in lens], group=group)
    # [P, B, H/P, L_rank, D] (head group j from rank j) -> [B, H, L_rank, D]
    return recv.view(world, b, hp, lens[rank], d).permute(1, 0, 2, 3, 4).reshape(
        b, world * hp, lens[rank], d)


class SeqToHeads(torch.autograd.Function):
    """`seq_to_heads` with its transpose, `heads_to_seq`, as backward: x `[n, B, H, L_r, D]`
    -> `[n, B, H/P, L, D]`; the gradient `[n, B, H/P, L, D]` goes back to `[n, B, H, L_r, D]`."""

    @staticmethod
    def forward(ctx, x, lens, rank, group, what):
        ctx.lens, ctx.rank, ctx.group, ctx.shape = lens, rank, group, x.shape
        return seq_to_heads(x, lens, group, what)

    @staticmethod
    def backward(ctx, grad):
        n, b, h, lr, d = ctx.shape
        back = heads_to_seq(grad.reshape(n * b, *grad.shape[2:]), ctx.lens, ctx.rank,
                             ctx.group)  # [n*B, H, L_r, D]: n rides in the batch dim
        return back.reshape(n, b, h, lr, d), None, None, None, None


class HeadsToSeq(torch.autograd.Function):
    """`heads_to_seq` with `seq_to_heads` as backward: out `[B, H/P, L, D]` ->
    `[B, H, L_rank, D]`, and the gradient back from `[B, H, L_rank, D]` to `[B, H/P, L, D]`."""

    @staticmethod
    def forward(ctx, out, lens, rank, group):
        ctx.lens, ctx.group = lens, group
        return heads_to_seq(out, lens, rank, group)

    @staticmethod
    def backward(ctx, grad):
        back = seq_to_heads(grad.unsqueeze(0), ctx.lens, ctx.group, "gradient")
        return back[0], None, None, None


def ulysses_attention(q, k, v, group=None, scale=None, stats=None):
    """Attention of this rank's query shard over the whole sequence, by two all-to-alls.

    q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]`: contiguous shards in tensor_split order
    (lengths may differ by rank, and be 0). Returns out `[B, H, Lq_r, D]` in q's dtype. H must be
    divisible by the world size P. Pass a list as `stats` for one record with comm_s, compute_s,
    bytes_sent (payload leaving this rank, its own chunk excluded). Differentiable: every rank
    gets the gradients of its own shards (the all-to-alls' backward is their transpose).
    """
    rank, world = require_group(group, "ulysses_attention")
    shapes = agree(group, q=q, k=k, v=v)
    require(q.dim() == 4 and k.shape == v.shape and q.shape[:2] == k.shape[:2],
            f"q, k, v must be [B, H, L, D] shards with k and v of one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    require(q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point,
            f"q, k, v must share one floating dtype (the all-to-all would promote them): got "
            f"{q.dtype}, {k.dtype}, {v.dtype}")
    heads = q.shape[1]
    if heads % world:
        raise InputError(
            f"ulysses_attention splits the {heads} heads over the {world} ranks, so the world "
            f"size must divide the head count: world sizes that work are "
            f"{', '.join(map(str, _working_sizes(heads)))}; ring_attention has no such limit")
    q_lens, kv_lens = [s[2] for s in shapes["q"]], [s[2] for s in shapes["k"]]
    t0 = time.perf_counter()
    if q_lens == kv_lens:  # self-attention: one all-to-all for q, k and v together
        # [3, B, H, L_r, D] -> [3, B, H/P, L, D]
        qh, kh, vh = SeqToHeads.apply(torch.stack([q, k, v]), q_lens, rank, group, "q, k, v")
    else:
        (qh,) = SeqToHeads.apply(q.unsqueeze(0), q_lens, rank, group, "q")
        kh, vh = SeqToHeads.apply(torch.stack([k, v]), kv_lens, rank, group, "k, v")
    t1 = time.perf_counter()
    out_h, _ = attention_with_lse(qh, kh, vh, scale=scale)  # [B, H/P, Lq, D]: whole sequence
    t2 = time.perf_counter()
    out = HeadsToSeq.apply(out_h, q_lens, rank, group)  # [B, H, Lq_r, D]
    if stats is not None:
        # Everything but my own head group goes out; the output comes back the same way.
        b, d, hp = q.shape[0], q.shape[3], heads // world
        sent = b * hp * d * q.element_size() * (
            (world - 1) * (q_lens[rank] + 2 * kv_lens[rank]) + sum(q_lens) - q_lens[rank])
        stats.append({"step": 0, "rank": rank, "q_tokens": q.shape[2],
                      "kv_tokens": int(sum(kv_lens)), "compute_s": t2 - t1,
                      "comm_s": (t1 - t0) + (time.perf_counter() - t2),
                      "bytes_sent": sent})
    return out
