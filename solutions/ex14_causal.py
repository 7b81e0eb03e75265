"""Exercises of notebook 14, autoregressive video under CP: an assignment of chunks to ranks that
keeps the tokens even and beats zigzag where zigzag is not perfect, and a bug hunt in a ring
that skips the blocks a rank does not need.

    python -m pytest tests/graded --ex 14.1 --impl exercises

The library's versions are `cpcourse.causal.assign_chunks` and
`cpcourse.causal.block_causal_attention_cp`. Check yours in the notebook with
`cpcourse.check("14.1")`.
"""

from __future__ import annotations

import torch

from cpcourse.attention import merge_attention
from cpcourse.causal import rank_tokens


def balanced_assignment(n_chunks: int, world: int) -> list[list[int]]:
    """The chunks (ascending ids) each of `world` ranks holds, under a block-causal mask over
    `n_chunks` equal chunks (chunk i costs i + 1 units: it attends to itself and to every
    earlier chunk), such that
    - the tokens stay balanced: rank r holds as many chunks as `torch.tensor_split` gives it
      (the first n_chunks % world ranks one more), so the linear layers and memory are even;
    - the busiest rank's work is as low as you can make it, and never higher than zigzag's
      (`cpcourse.causal.assign_chunks(n_chunks, world, "zigzag")`), which is perfect when
      2 * world divides n_chunks but not otherwise: 10 chunks on 4 ranks give zigzag's busiest
      rank 16 units where 15 is possible, 6 chunks on 4 ranks 9 where 6 is.
    1 <= world <= n_chunks. Example: (4, 2) -> [[0, 3], [1, 2]].
    """
    # BEGIN SOLUTION 14.1 | notebook 14, "Who computes what"
    # | hint: the chunk counts are fixed by the token rule; within them, place the dearest
    # | chunks first, each where it hurts least. Which rank is that, and which ranks may still
    # | take one?
    # | hint2: 10 chunks, 4 ranks: counts 3, 3, 2, 2; costs 10, 9, ..., 1. Dealing the dearest
    # | chunk to the least-loaded rank that still has room gives loads 15, 14, 13, 13: the two
    # | ranks with a third chunk end up with the cheap ones.
    # | hint3: room = [len(t) for t in torch.arange(n_chunks).tensor_split(world)]; for i from
    # | n_chunks - 1 down to 0: r = the rank with len(mine[r]) < room[r] of least load (on a
    # | tie, the one with fewer places left: 6 chunks on 4 ranks then reach 6, not 7); give it i.
    room = [len(t) for t in torch.arange(n_chunks).tensor_split(world)]
    mine: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in range(n_chunks - 1, -1, -1):  # the dearest chunk first
        # least loaded; on a tie the rank with fewer places left (fewer cheap chunks to come)
        r = min((r for r in range(world) if len(mine[r]) < room[r]),
                key=lambda r: (load[r], room[r] - len(mine[r]), r))
        mine[r].append(i)
        load[r] += i + 1
    return [sorted(m) for m in mine]
    # END SOLUTION


def masked_attention_with_lse(q, k, v, mask):
    """Attention of q `[B, H, Lq, D]` over k, v `[B, H, Lk, D]` where `mask [Lq, Lk]` (bool) is
    True, with its lse `[B, H, Lq]`. A row that may see no key gets lse = -inf (its out is
    ignored by `merge_attention`). Given: not part of the exercise."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, -torch.inf)
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(0.0)
    return weights @ v, lse


def ring_block_causal_buggy(q, k, v, chunk_of_token, assignment):
    """A ring for block-causal attention that skips the blocks a rank does not need, as a
    colleague wrote it (do not copy it). The ranks are simulated in this process. Right when
    every rank holds a contiguous run of chunks; wrong under zigzag.
    """
    world, outs, blocks = len(assignment), [], []
    chunk = torch.as_tensor(chunk_of_token)
    for r in range(world):
        mine = rank_tokens(chunk, assignment, r)
        out = torch.zeros_like(q[:, :, mine])
        lse = torch.full(q.shape[:2] + (len(mine),), -torch.inf, dtype=q.dtype)
        seen = []
        for step in range(world):
            src = (r - step) % world
            # the block of src holds no key any of my queries may see: skip it, send nothing
            if min(assignment[src]) > min(assignment[r]):
                continue
            theirs = rank_tokens(chunk, assignment, src)
            mask = chunk[mine][:, None] >= chunk[theirs][None, :]
            o, s = masked_attention_with_lse(q[:, :, mine], k[:, :, theirs], v[:, :, theirs],
                                             mask)
            out, lse = merge_attention(out, lse, o, s)
            seen.append(src)
        outs.append(out)
        blocks.append(seen)
    return outs, blocks


def ring_block_causal(q, k, v, chunk_of_token, assignment):
    """`ring_block_causal_buggy`, fixed. For each simulated rank r: the block-causal attention of
    its queries, built as the ring builds it, one block per source rank in the order r, r - 1,
    r - 2, ... (mod P), skipping every block that holds no key any query of rank r may see.

    q, k, v: `[B, H, L, D]` for the whole clip (float64 in the tests); chunk_of_token: `[L]`
    (long, non-decreasing: `cpcourse.causal.chunk_of_frames`); assignment: P lists of chunk
    ids, every chunk in exactly one (any scheme of `cpcourse.causal.assign_chunks`).
    A query of chunk i may see a key of chunk j when j <= i.
    Returns (outs, blocks): outs[r] `[B, H, L_r, D]`, rank r's tokens in the order of
    `cpcourse.causal.rank_tokens`, equal to one process's masked attention; blocks[r] the
    source ranks whose block rank r computed, in ring order, and no others.
    """
    # BEGIN SOLUTION 14.2 | notebook 14, "Bug hunt: a block that was needed"
    # | hint: run the buggy ring with P = 2 and 4 chunks under zigzag. Which block does rank 0
    # | skip, and does any query of rank 0 need a key from it?
    # | hint2: zigzag with P = 2 and 4 chunks gives rank 0 chunks 0 and 3, rank 1 chunks 1
    # | and 2. The test compares the other rank's first chunk with rank 0's FIRST chunk, so it
    # | skips rank 1's block, which the queries of chunk 3 need. A block is needed when its
    # | first chunk is at or before this rank's LAST chunk.
    # | hint3: skip when min(assignment[src]) > max(assignment[r]); the rest of the buggy ring
    # | is right.
    world, outs, blocks = len(assignment), [], []
    chunk = torch.as_tensor(chunk_of_token)
    for r in range(world):
        mine = rank_tokens(chunk, assignment, r)
        out = torch.zeros_like(q[:, :, mine])
        lse = torch.full(q.shape[:2] + (len(mine),), -torch.inf, dtype=q.dtype)
        seen = []
        for step in range(world):
            src = (r - step) % world
            if min(assignment[src]) > max(assignment[r]):
                continue
            theirs = rank_tokens(chunk, assignment, src)
            mask = chunk[mine][:, None] >= chunk[theirs][None, :]
            o, s = masked_attention_with_lse(q[:, :, mine], k[:, :, theirs], v[:, :, theirs],
                                             mask)
            out, lse = merge_attention(out, lse, o, s)
            seen.append(src)
        outs.append(out)
        blocks.append(seen)
    return outs, blocks
    # END SOLUTION
