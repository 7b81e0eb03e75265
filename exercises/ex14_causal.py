# Yours to edit. Generated from solutions/ex14_causal.py by tools/make_exercises.py
# stub-sha256: 4d0a88f60d92bfd3 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 14.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 14.1 balanced_assignment: read notebook 14, \"Who computes what\". "
        "Hint: the chunk counts are fixed by the token rule; within them, place the "
        "dearest chunks first, each where it hurts least. Which rank is that, and "
        "which ranks may still take one? (2 more: cpcourse.hint(\"14.1\"))"
    )


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
    # Exercise 14.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 14.2 ring_block_causal: read notebook 14, \"Bug hunt: a block that "
        "was needed\". Hint: run the buggy ring with P = 2 and 4 chunks under zigzag. "
        "Which block does rank 0 skip, and does any query of rank 0 need a key from "
        "it? (2 more: cpcourse.hint(\"14.2\"))"
    )
