# Yours to edit. Generated from solutions/ex04_ring.py by tools/make_exercises.py
# stub-sha256: f5e51d54b99c64c0 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 04.0: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 04.0 ring_hop: read notebook 04, \"Your ring on real processes\". "
        "Hint: three questions before any byte moves: who is my successor and "
        "predecessor (as global ranks: p2p calls do not take ranks within a group), "
        "how long is the block that ARRIVES (not mine), and is there anything to send "
        "or receive at all. (2 more: cpcourse.hint(\"04.0\"))"
    )


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
    # Exercise 04.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 04.1 ring_forward: read notebook 04, \"Your ring on real processes\". "
        "Hint: your 03.1 schedule plus the who / how long / when of section 1: the "
        "neighbours as global ranks, every rank's shard length learned once before "
        "the loop, and the send and receive posted together, then the compute on the "
        "block you hold, then the wait. Size the receive buffer for the block that "
        "arrives, and skip sending or receiving an empty block. (2 more: "
        "cpcourse.hint(\"04.1\"))"
    )


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
    # Exercise 04.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 04.2 seq_to_heads: read notebook 04, \"The alternatives: all-gather "
        "and Ulysses\". Hint: Ulysses in section 3 and the docstring: lay out your "
        "flat send buffer so that chunk j is head group j of your shard (the heads "
        "are not the outer dimension, so reorder first). Every chunk you send has the "
        "same size; what arrives from rank i depends on rank i's shard length, known "
        "from every rank's shape. Split sizes count elements, not tokens. Check first "
        "that P divides H. (2 more: cpcourse.hint(\"04.2\"))"
    )


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
    # Exercise 04.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 04.3 ring_forward_padded: read notebook 04, \"Bug hunt: the padded "
        "ring\". Hint: section 4 asks what a row of zeros in K does inside a softmax: "
        "work out the score of a zero key and whether its weight is really nothing. "
        "Keep the padded messages; change only which keys each step attends to, using "
        "the lengths that every rank already knows. (2 more: cpcourse.hint(\"04.3\"))"
    )
