# Yours to edit. Generated from solutions/ex02_online_softmax.py by tools/make_exercises.py
# stub-sha256: 43309b98b0f77020 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 02, the online softmax and the merge: attention one block at a time,
and a bug hunt in an online softmax.

    python -m pytest tests/graded --ex 02.1 --impl exercises   # 02.1, 02.2, 02.3, 02.4

Check your answer in a notebook with `cpcourse.check("02.1")`, or from a shell with
`cpcourse grade`. The library's own versions live in `cpcourse.online_softmax`
(`online_softmax_stats`, `attention_v4_blockwise`) and `cpcourse.attention.merge_attention`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def online_softmax_stats(blocks: Iterable[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax normaliser of a row seen ONCE, block by block: its max and its sum.

    blocks: an iterable (it may be a generator you can only walk once) of tensors [..., n_i],
    consecutive column blocks of a row x = cat(blocks, dim=-1); every block has the same leading
    shape [...] and at least one column. Returns (m, s), each [...], in float32 (float64 for
    float64 blocks):
        m = max_j x[..., j]        s = sum_j exp(x[..., j] - m)
    so that softmax(x) = exp(x - m) / s and logsumexp(x) = m + log(s).
    Keep a running max and a running sum; when a block raises the max from m_old to m_new, the
    sum so far was relative to m_old: multiply it by exp(m_old - m_new) before adding the block.
    """
    # Exercise 02.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 02.1 online_softmax_stats: read notebook 02, \"The online softmax\". "
        "Hint: one pass, as in section 2: carry a running max and a running sum from "
        "block to block. The sum so far was measured against the old max, so when a "
        "block raises the max, rescale the old sum before adding the new block's "
        "terms. The blocks may come from a generator: walk them once, and create the "
        "state from the first block's leading shape and dtype. (2 more: "
        "cpcourse.hint(\"02.1\"))"
    )


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_size: int,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over K/V in blocks of `block_size` keys, holding one [Lq, block] tile at a time.

    q: [B, H, Lq, D], k: [B, H, Lk, D], v: [B, H, Lk, Dv] -> (out [B, H, Lq, Dv] in q's dtype,
    lse [B, H, Lq] float32, float64 for float64 inputs); scale defaults to 1 / sqrt(D).
    Keys arrive a block at a time, as over a ring: keep per query row, in float32 (float64 for
    float64 inputs), 02.1's running max and sum and the unnormalised output acc = sum_j
    exp(s_j - m) v_j over the keys seen so far. How acc follows a moving max, and what out and
    lse are at the end, is yours to derive (notebook 02, section 3). Never build the full
    [Lq, Lk] score matrix (a test measures memory). With no keys (Lk = 0), return what merges as
    nothing (exercise 01.2).
    """
    # Exercise 02.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 02.2 blockwise_attention: read notebook 02, \"Blockwise attention\". "
        "Hint: section 3 adds a third running quantity to the online softmax of 02.1: "
        "the unnormalised weighted sum of the values. All three share one rescaling "
        "factor per block. Take the keys a slice at a time, so only one tile of "
        "scores ever exists; divide once at the very end, and treat the case of no "
        "keys separately (docstring). (2 more: cpcourse.hint(\"02.2\"))"
    )


def merge_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                   lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge attention over key set A and over key set B into attention over A and B together.

    out_a, out_b: [B, H, L, Dv]; lse_a, lse_b: [B, H, L] -> (out [B, H, L, Dv], lse [B, H, L]):
        lse = log(exp(lse_a) + exp(lse_b))
        out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b
    Work and return in float32 whatever the inputs (float64 stays float64): a ring merges many
    times and must not round to bf16 in between. Never compute exp(lse) itself (lse can be 1e4).
    A side that saw no keys has lse = -inf: it must contribute nothing, even if its out holds
    NaN; when both sides are -inf, return out = 0 and lse = -inf, never NaN.
    """
    # Exercise 02.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 02.3 merge_partials: read notebook 02, \"Merging two partial "
        "results\". Hint: the merge formula of section 4: combine the two log-sum-exps "
        "in a stable way (never exponentiate an lse by itself), weight each side by "
        "its share of the total, and handle the traps the exercise text names: a side "
        "with no keys must add nothing even when its output holds NaN, and two empty "
        "sides give 0 and -inf, never NaN. Work in float32. (2 more: "
        "cpcourse.hint(\"02.3\"))"
    )


def online_softmax_stats_blockmax_buggy(blocks: Iterable[torch.Tensor]
                                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """An online softmax that passes random tests and is wrong (do not copy it).

    Same inputs and outputs as `online_softmax_stats`. It keeps its running sum relative to the
    max of the block it has just read rather than the running max (each block's terms are then
    exp(x - its own max), as in a plain safe softmax), rescales the sum whenever that reference
    moves, and converts the sum to the overall max at the end. In exact arithmetic that is the
    same sum. Exercise 02.4: find blocks on which it is wrong.
    """
    m = ref = s = None
    for block in blocks:
        block = block.to(torch.promote_types(block.dtype, torch.float32))
        block_max = block.amax(dim=-1)
        terms = torch.exp(block - block_max.unsqueeze(-1)).sum(dim=-1)
        if ref is None:
            m, ref, s = block_max, block_max, terms
            continue
        s = s * torch.exp(ref - block_max) + terms
        m, ref = torch.maximum(m, block_max), block_max
    return m, s * torch.exp(ref - m)


def blocks_that_break_it() -> list[torch.Tensor]:
    """Blocks of one row on which `online_softmax_stats_blockmax_buggy` is wrong.

    Return a list of float32 tensors [R, n_i] (the same R rows in each, 1 <= R <= 8, 1 <= n_i;
    at most 16 blocks and 256 columns in all), every value within [-50, 50], on which the
    buggy function's (m, s) is not finite or differs from the true max and sum of exp(x - m)
    of the whole row by more than a relative 1e-3.
    """
    # Exercise 02.4: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 02.4 blocks_that_break_it: read notebook 02, \"Bug hunt: the wrong "
        "running reference\". Hint: compare the buggy code with the online softmax of "
        "section 2. In both, the sum so far is rescaled when the reference moves; "
        "which way can the buggy reference move, and how large can its rescaling "
        "factor then get? Random blocks rarely find out: choose the order of the "
        "blocks on purpose. (2 more: cpcourse.hint(\"02.4\"))"
    )
