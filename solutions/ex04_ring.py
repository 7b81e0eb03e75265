"""Exercises of notebook 04, the ring on real processes: one hop, the ring forward, Ulysses'
all-to-all, and a bug hunt.

    python -m pytest tests/graded --ex 04.1 --impl exercises

Every rank holds a contiguous shard of the sequence, `[B, H, L_r, D]`, split like
`torch.tensor_split` (the first L % P ranks hold one token more; a rank may hold none). These
functions run on every rank of a process group (under `cpcourse.launch` or `%%torchrun`).
Building blocks from the library: `cpcourse.attention.attention_with_lse` (out and lse of one
block), `cpcourse.attention.merge_attention` (fold two partial results),
`cpcourse.support.groups.agree` (every rank's shapes: `agree(group, k=k)["k"][r][2]` is rank r's
shard length) and `cpcourse.support.groups.global_rank` (point-to-point calls take global ranks,
not ranks in `group`). The library's versions: `cpcourse.ring.ring_attention`,
`cpcourse.ulysses.ulysses_attention`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.attention import attention_with_lse, merge_attention
from cpcourse.support.errors import require
from cpcourse.support.groups import agree, global_rank, require_group


def ring_hop(block: torch.Tensor, group=None) -> torch.Tensor:
    """One hop of the ring: send this rank's block to rank r + 1, receive rank r - 1's.

    block `[2, B, H, L_r, D]`: this rank's K and V stacked (one message per hop). Returns the
    block of rank (r - 1) mod P, `[2, B, H, L_{r-1}, D]`: its length is THAT rank's shard
    length, which differs from yours when P does not divide L (and may be 0). On one rank the
    block comes back to itself. Send and receive together
    (`dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])`,
    peers as global ranks), skip an empty send or receive, and wait before returning.
    """
    # BEGIN SOLUTION 04.0 | notebook 04, "Your ring on real processes"
    # | hint: three questions before any byte moves: who is my successor and predecessor (as
    # | global ranks: p2p calls do not take ranks within a group), how long is the block that
    # | ARRIVES (not mine), and is there anything to send or receive at all.
    # | hint2: L = 7 on P = 3 gives lengths [3, 2, 2]: rank 1 holds 2 tokens and receives rank
    # | 0's 3, so its buffer is [2, B, H, 3, D]. L = 3 on P = 4 gives [1, 1, 1, 0]: rank 3 sends
    # | nothing and rank 0 receives nothing, and each side must know it or the other waits.
    # | hint3: lens = [s[3] for s in agree(group, seq_dim=3, block=block)["block"]]; nxt =
    # | block.new_empty(*block.shape[:3], lens[(rank - 1) % P], block.shape[4]); post the
    # | non-empty P2POps with dist.batch_isend_irecv, wait on every request, return nxt.
    rank, world = require_group(group, "ring_hop")
    lens = [s[3] for s in agree(group, seq_dim=3, block=block)["block"]]
    if world == 1:
        return block.clone()
    dst, src = global_rank(group, (rank + 1) % world), global_rank(group, (rank - 1) % world)
    nxt = block.new_empty(*block.shape[:3], lens[(rank - 1) % world], block.shape[4])
    ops = []
    if block.numel():
        ops.append(dist.P2POp(dist.isend, block.contiguous(), dst, group))
    if nxt.numel():
        ops.append(dist.P2POp(dist.irecv, nxt, src, group))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    return nxt
    # END SOLUTION


def ring_forward(q, k, v, group=None, scale=None):
    """Ring attention, forward: this rank's queries over the whole sharded sequence.

    q `[B, H, Lq_r, D]`, k and v `[B, H, Lk_r, D]` (this rank's shards; lengths differ across
    ranks and may be 0). Returns out `[B, H, Lq_r, D]` in q's dtype, equal to this rank's rows
    of softmax(q_all k_all^T * scale) v_all; scale defaults to 1/sqrt(D).
    At step s (0 <= s < P) rank r holds the K/V block of rank (r - s) mod P: attend to it with
    `attention_with_lse`, fold it in with `merge_attention`, and (except at the last step) send
    it to rank r + 1 while receiving the next block from rank r - 1 with
    `dist.batch_isend_irecv([dist.P2POp(dist.isend, ...), dist.P2POp(dist.irecv, ...)])`.
    The receive buffer must have the length of the block that arrives, not of the one you hold.
    Skip the send or receive of an empty block (both sides know every length).
    """
    # BEGIN SOLUTION 04.1 | notebook 04, "Your ring on real processes"
    # | hint: your 03.1 schedule plus the who / how long / when of section 1: the neighbours as
    # | global ranks, every rank's shard length learned once before the loop, and the send and
    # | receive posted together, then the compute on the block you hold, then the wait. Size the
    # | receive buffer for the block that arrives, and skip sending or receiving an empty block.
    # | hint2: L = 7 tokens on P = 3: lengths [3, 2, 2]. Rank 1 at step 0 holds its own block (2
    # | tokens) and receives block 0, which has 3 tokens: its buffer needs 3, not 2. Rank 0 holds
    # | blocks 0, 2, 1 at steps 0, 1, 2 and sends nothing at step 2. L = 2 on P = 3: lengths [1, 1,
    # | 0]; at step 0 rank 2 has nothing to send and rank 0 nothing to receive.
    # | hint3: lens = [s[2] for s in agree(group, k=k)["k"]]; block = (rank - step) % P; nxt =
    # | k.new_empty(2, B, H, lens[(block - 1) % P], D) (K and V stacked); post the non-empty
    # | isend/irecv with dist.batch_isend_irecv; attention_with_lse on the block held,
    # | merge_attention into (out, lse); wait on the requests, then cur = nxt.
    rank, world = require_group(group, "ring_forward")
    lens = [s[2] for s in agree(group, k=k)["k"]]
    dst, src = global_rank(group, (rank + 1) % world), global_rank(group, (rank - 1) % world)
    b, h, _, d = k.shape
    cur = torch.stack([k, v])  # K and V travel together: one message per hop
    out = lse = None
    for step in range(world):
        block = (rank - step) % world
        reqs, nxt = [], None
        if step < world - 1:
            nxt = k.new_empty(2, b, h, lens[(block - 1) % world], d)
            ops = []
            if cur.numel():
                ops.append(dist.P2POp(dist.isend, cur, dst, group))
            if nxt.numel():
                ops.append(dist.P2POp(dist.irecv, nxt, src, group))
            reqs = dist.batch_isend_irecv(ops) if ops else []
        o, l_ = attention_with_lse(q, cur[0], cur[1], scale=scale)  # overlaps the transfer
        out, lse = (o, l_) if out is None else merge_attention(out, lse, o, l_)
        for req in reqs:
            req.wait()
        if nxt is not None:
            cur = nxt
    return out.to(q.dtype)
    # END SOLUTION


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """Ulysses' first all-to-all: from a sequence shard of every head to every token of a head
    group.

    x `[B, H, L_r, D]`: this rank's contiguous sequence shard (tensor_split order, lengths may
    differ and be 0), all H heads. Returns `[B, H/P, L, D]`: the WHOLE sequence for heads
    rank * H/P .. (rank + 1) * H/P - 1. One `dist.all_to_all_single(output, input,
    output_split_sizes, input_split_sizes, group=group)` on flat 1-D tensors: chunk j of your
    input is head group j of your shard; from rank i you receive head group `rank` of rank i's
    shard (B * H/P * L_i * D elements); put the received pieces in sequence order.
    Raise `cpcourse.support.errors.InputError` when P does not divide H.
    """
    # BEGIN SOLUTION 04.2 | notebook 04, "The alternatives: all-gather and Ulysses"
    # | hint: Ulysses in section 3 and the docstring: lay out your flat send buffer so that chunk j
    # | is head group j of your shard (the heads are not the outer dimension, so reorder first).
    # | Every chunk you send has the same size; what arrives from rank i depends on rank i's shard
    # | length, known from every rank's shape. Split sizes count elements, not tokens. Check first
    # | that P divides H.
    # | hint2: B = 1, H = 4, D = 1, P = 2, L = 3 split [2, 1], so H/P = 2. Rank 0 sends 1 * 2 * 2 *
    # | 1 = 4 elements to each rank (heads 0-1 to itself, heads 2-3 to rank 1); rank 1 sends 2 to
    # | each. Rank 0 receives [4, 2] elements: heads 0-1 of tokens 0-1, then of token 2; viewed [1,
    # | 2, 2, 1] and [1, 2, 1, 1], joined on dim 2 into [1, 2, 3, 1].
    # | hint3: send = x.reshape(B, P, H/P, L_r, D).transpose(0, 1).contiguous().view(-1); input
    # | split sizes [B * H/P * L_r * D] * P, output split sizes B * H/P * L_i * D per rank i; view
    # | received piece i as [B, H/P, L_i, D] and cat on dim 2.
    rank, world = require_group(group, "seq_to_heads")
    b, h, lr, d = x.shape
    require(h % world == 0, f"seq_to_heads: {h} heads do not split over {world} ranks; use a "
            f"world size that divides {h}")
    lens = [s[2] for s in agree(group, x=x)["x"]]
    hp = h // world
    send = x.reshape(b, world, hp, lr, d).transpose(0, 1).contiguous().view(-1)
    counts = [b * hp * n * d for n in lens]
    recv = x.new_empty(sum(counts))
    dist.all_to_all_single(recv, send, output_split_sizes=counts,
                           input_split_sizes=[b * hp * lr * d] * world, group=group)
    pieces = recv.split(counts)
    return torch.cat([p.view(b, hp, n, d) for p, n in zip(pieces, lens, strict=True)], dim=2)
    # END SOLUTION


def ring_forward_padded_buggy(q, k, v, group=None, scale=None):
    """A ring that passes a weak test and is wrong (do not copy it): find the bug.

    To keep every message the same size (gloo's collectives like that, and equal buffers are
    easy to reuse) it pads each K/V block with zeros to the longest shard before the ring
    starts. With even shards nothing is padded and every test passes; run it on 7 tokens over
    3 ranks and compare.
    """
    rank, world = require_group(group, "ring_forward_padded_buggy")
    lens = [s[2] for s in agree(group, k=k)["k"]]
    dst, src = global_rank(group, (rank + 1) % world), global_rank(group, (rank - 1) % world)
    b, h, lr, d = k.shape
    cur = k.new_zeros(2, b, h, max(lens), d)
    cur[0, :, :, :lr], cur[1, :, :, :lr] = k, v
    out = lse = None
    for step in range(world):
        reqs, nxt = [], None
        if step < world - 1:
            nxt = torch.empty_like(cur)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, dst, group),
                                           dist.P2POp(dist.irecv, nxt, src, group)])
        o, l_ = attention_with_lse(q, cur[0], cur[1], scale=scale)
        out, lse = (o, l_) if out is None else merge_attention(out, lse, o, l_)
        for req in reqs:
            req.wait()
        if nxt is not None:
            cur = nxt
    return out.to(q.dtype)


def ring_forward_padded(q, k, v, group=None, scale=None):
    """`ring_forward_padded_buggy`, fixed: same padded messages, right answer on uneven shards.

    Same inputs and output as `ring_forward`. Keep the padding (every message max(L_r) tokens
    long) and find what the buggy version gets wrong with it.
    """
    # BEGIN SOLUTION 04.3 | notebook 04, "Bug hunt: the padded ring"
    # | hint: section 4 asks what a row of zeros in K does inside a softmax: work out the score of a
    # | zero key and whether its weight is really nothing. Keep the padded messages; change only
    # | which keys each step attends to, using the lengths that every rank already knows.
    # | hint2: 7 tokens on 3 ranks: lengths [3, 2, 2], every message padded to 3. Rank 0 at step 1
    # | holds block 2: 2 real keys and 1 zero key. The zero key scores 0, so it takes weight exp(0 -
    # | lse) > 0 while adding a zero value: with scores [1, 1, 0] each real key gets e / (2e + 1) =
    # | 0.42 instead of 0.5. On 9 = 3 + 3 + 3 tokens nothing is padded and the bug hides.
    # | hint3: a zero key is not 'no key'. n = lens[(rank - step) % P]; attend to cur[0, :, :, :n]
    # | and cur[1, :, :, :n] only (the rest of the block is padding); skip the exchange when the
    # | padded block is empty.
    rank, world = require_group(group, "ring_forward_padded")
    lens = [s[2] for s in agree(group, k=k)["k"]]
    dst, src = global_rank(group, (rank + 1) % world), global_rank(group, (rank - 1) % world)
    b, h, lr, d = k.shape
    cur = k.new_zeros(2, b, h, max(lens), d)
    cur[0, :, :, :lr], cur[1, :, :, :lr] = k, v
    out = lse = None
    for step in range(world):
        reqs, nxt = [], None
        if step < world - 1 and cur.numel():
            nxt = torch.empty_like(cur)
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, cur, dst, group),
                                           dist.P2POp(dist.irecv, nxt, src, group)])
        n = lens[(rank - step) % world]  # the real tokens of the block held; the rest is padding
        o, l_ = attention_with_lse(q, cur[0, :, :, :n], cur[1, :, :, :n], scale=scale)
        out, lse = (o, l_) if out is None else merge_attention(out, lse, o, l_)
        for req in reqs:
            req.wait()
        if nxt is not None:
            cur = nxt
    return out.to(q.dtype)
    # END SOLUTION
