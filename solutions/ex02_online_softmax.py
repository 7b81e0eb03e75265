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
    # BEGIN SOLUTION 02.1 | notebook 02, "The online softmax"
    # | hint: one pass, as in section 2: carry a running max and a running sum from block to block.
    # | The sum so far was measured against the old max, so when a block raises the max, rescale the
    # | old sum before adding the new block's terms. The blocks may come from a generator: walk them
    # | once, and create the state from the first block's leading shape and dtype.
    # | hint2: the row [1, 3, 2, 5] in blocks [1, 3] and [2, 5]. After block 1: m = 3, s = exp(-2) +
    # | exp(0) = 1.1353. Block 2 raises the max to 5: s = 1.1353 * exp(3 - 5) + exp(2 - 5) + exp(5 -
    # | 5) = 0.1537 + 0.0498 + 1 = 1.2034, the same as the direct sum of exp(x - 5) over the row.
    # | Result m = 5, s = 1.2034.
    # | hint3: start m = -inf, s = 0 (float32); per block: m_new = max(m, block.amax(-1)); s = s *
    # | exp(m - m_new) + exp(block - m_new[..., None]).sum(-1); m = m_new.
    m = s = None
    for block in blocks:
        acc = torch.promote_types(block.dtype, torch.float32)
        block = block.to(acc)
        if m is None:
            m = torch.full(block.shape[:-1], -math.inf, dtype=acc, device=block.device)
            s = torch.zeros(block.shape[:-1], dtype=acc, device=block.device)
        m_new = torch.maximum(m, block.amax(dim=-1))
        s = s * torch.exp(m - m_new) + torch.exp(block - m_new.unsqueeze(-1)).sum(dim=-1)
        m = m_new
    return m, s
    # END SOLUTION


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
    # BEGIN SOLUTION 02.2 | notebook 02, "Blockwise attention"
    # | hint: section 3 adds a third running quantity to the online softmax of 02.1: the
    # | unnormalised weighted sum of the values. All three share one rescaling factor per block.
    # | Take the keys a slice at a time, so only one tile of scores ever exists; divide once at the
    # | very end, and treat the case of no keys separately (docstring).
    # | hint2: one query, scale 1, block_size 1, scores [0, 2], values [1, 3]. Block 1: m = 0, l =
    # | 1, acc = 1. Block 2: m_new = 2, factor exp(0 - 2) = 0.1353, p = 1; l = 0.1353 + 1 = 1.1353;
    # | acc = 1 * 0.1353 + 3 = 3.1353; out = 3.1353 / 1.1353 = 2.7616 (= 0.1192 * 1 + 0.8808 * 3);
    # | lse = 2 + log(1.1353) = 2.1269. Lk = 29 in blocks of 7: slices start at 0, 7, 14, 21, 28,
    # | the last one key long.
    # | hint3: for start in range(0, Lk, block_size): s = q @ k_blk^T * scale; m_new = max(m,
    # | s.amax(-1)); c = exp(m - m_new) (0 on the first block); p = exp(s - m_new[..., None]); l = l
    # | * c + p.sum(-1); acc = acc * c[..., None] + p @ v_blk; m = m_new. Then out = acc / l[...,
    # | None], lse = m + log(l); Lk = 0 returns acc (zeros) and m (-inf).
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qa = q.to(acc_dtype)
    m = torch.full(q.shape[:3], -math.inf, dtype=acc_dtype, device=q.device)
    l = torch.zeros(q.shape[:3], dtype=acc_dtype, device=q.device)  # noqa: E741
    acc = torch.zeros(*q.shape[:3], v.shape[-1], dtype=acc_dtype, device=q.device)
    for start in range(0, k.shape[2], block_size):
        k_blk = k[:, :, start:start + block_size].to(acc_dtype)
        v_blk = v[:, :, start:start + block_size].to(acc_dtype)
        scores = (qa @ k_blk.transpose(-2, -1)) * scale
        m_new = torch.maximum(m, scores.amax(dim=-1))
        correction = torch.exp(m - m_new)
        p = torch.exp(scores - m_new.unsqueeze(-1))
        l = l * correction + p.sum(dim=-1)  # noqa: E741
        acc = acc * correction.unsqueeze(-1) + p @ v_blk
        m = m_new
    if k.shape[2] == 0:
        return acc.to(q.dtype), m.to(lse_dtype)
    return (acc / l.unsqueeze(-1)).to(q.dtype), (m + torch.log(l)).to(lse_dtype)
    # END SOLUTION


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
    # BEGIN SOLUTION 02.3 | notebook 02, "Merging two partial results"
    # | hint: the merge formula of section 4: combine the two log-sum-exps in a stable way (never
    # | exponentiate an lse by itself), weight each side by its share of the total, and handle the
    # | traps the exercise text names: a side with no keys must add nothing even when its output
    # | holds NaN, and two empty sides give 0 and -inf, never NaN. Work in float32.
    # | hint2: lse_a = log 1 = 0, lse_b = log 3 = 1.0986: lse = log(1 + 3) = 1.3863; weights exp(0 -
    # | 1.3863) = 0.25 and exp(1.0986 - 1.3863) = 0.75; out_a = 2, out_b = 6 give out = 0.5 + 4.5 =
    # | 5. If lse_b = -inf: lse = lse_a, weight_b = 0, but 0 * NaN = NaN, so mask out_b first. If
    # | both are -inf: lse = -inf and exp(-inf - (-inf)) is NaN, so subtract 0 there instead.
    # | hint3: lse = torch.logaddexp(lse_a, lse_b); base = where(lse is -inf, 0, lse); w_x =
    # | exp(lse_x - base)[..., None]; out = w_a * where(w_a > 0, out_a, 0) + w_b * where(w_b > 0,
    # | out_b, 0).
    acc = torch.promote_types(torch.promote_types(out_a.dtype, lse_a.dtype), torch.float32)
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(lse_a, lse_b)
    base = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - base).unsqueeze(-1)
    w_b = torch.exp(lse_b - base).unsqueeze(-1)
    part_a = torch.where(w_a > 0, out_a.to(acc), 0.0)
    part_b = torch.where(w_b > 0, out_b.to(acc), 0.0)
    return w_a * part_a + w_b * part_b, lse
    # END SOLUTION


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
    # BEGIN SOLUTION 02.4 | notebook 02, "Bug hunt: the wrong running reference"
    # | hint: compare the buggy code with the online softmax of section 2. In both, the sum so far
    # | is rescaled when the reference moves; which way can the buggy reference move, and how
    # | large can its rescaling factor then get? Random blocks rarely find out: choose the order
    # | of the blocks on purpose.
    # | hint2: float32 exp overflows past 88.7 (notebook 01). Blocks [[0, 1]] then [[-20]]: the
    # | reference falls from 1 to -20, so the sum is multiplied by exp(1 - (-20)) = exp(21) =
    # | 1.3e9, then by exp(-21) at the end: large but finite, and the answer is right. A fall of
    # | more than 88.7 between one block's max and the next one's is another story.
    # | hint3: [torch.tensor([[50.0]]), torch.tensor([[-50.0]])]: the reference falls from 50 to
    # | -50, the factor exp(50 - (-50)) = exp(100) is inf in float32, and so is the sum returned.
    return [torch.tensor([[50.0]]), torch.tensor([[-50.0]])]
    # END SOLUTION
