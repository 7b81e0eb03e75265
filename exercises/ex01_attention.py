# Yours to edit. Generated from solutions/ex01_attention.py by tools/make_exercises.py
# stub-sha256: 7b5f57bde9cdf90a (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 01, attention on one device: the direct way, then with its log-sum-exp,
and a bug hunt in a "safe" attention.

    python -m pytest tests/graded --ex 01.1 --impl exercises   # 01.1, 01.2, 01.3

Check your answer in a notebook with `cpcourse.check("01.1")`, or from a shell with
`cpcourse grade`. The library's own versions are `cpcourse.attention.reference_attention` and
`cpcourse.attention.attention_with_lse`.
"""

from __future__ import annotations

import torch


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float | None = None) -> torch.Tensor:
    """Attention the direct way: `softmax(q k^T * scale) v`, materialising every score.

    q: [B, H, Lq, D], k: [B, H, Lk, D], v: [B, H, Lk, Dv] -> out [B, H, Lq, Dv] (q's dtype).
    scale defaults to 1 / sqrt(D). Row i of the softmax is over the keys (the last dimension of
    the [B, H, Lq, Lk] score matrix): each query's weights sum to 1 over all keys.
    You may use torch.softmax here; inputs have moderate values (no overflow to worry about).
    """
    # Exercise 01.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 01.1 naive_attention: read notebook 01, \"Naive attention\". Hint: "
        "the formula of section 2: score every query against every key (scaled; mind "
        "the default when no scale is given), turn each query's row of scores into "
        "weights that sum to 1 over the keys, i.e. over the last dimension, then take "
        "the weighted average of the values. (2 more: cpcourse.hint(\"01.1\"))"
    )


def attention_and_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention and the log-sum-exp of each query's scores, safe for huge logits.

    q: [B, H, Lq, D], k: [B, H, Lk, D], v: [B, H, Lk, Dv] -> (out [B, H, Lq, Dv],
    lse [B, H, Lq]) where, with s = q k^T * scale (scale defaults to 1 / sqrt(D)),
        lse[b, h, i] = log(sum_j exp(s[b, h, i, j]))
        out[b, h, i] = sum_j exp(s[b, h, i, j] - lse[b, h, i]) * v[b, h, j].
    Two things the formulas above do not survive, and you decide how to handle them:
    - scores can reach 1e4 in magnitude, where exp overflows even in float64 (section 6 shows
      why and how far each dtype goes); the result must still be exact to float32 rounding, and
      torch.logsumexp / torch.softmax are off limits (the graded test switches them off);
    - a rank of a ring may hold no keys at all (Lk = 0, notebook 04). Return what makes this
      empty result vanish when `cpcourse.attention.merge_attention` merges it with any other
      result over the same queries (no NaN, no inf in out).
    Compute in float32 (or float64 for float64 inputs); return out in q's dtype, lse in float32
    (float64 for float64 inputs).
    """
    # Exercise 01.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 01.2 attention_and_lse: read notebook 01, \"The log-sum-exp\". Hint: "
        "the max trick of section 6: shift each row of scores by its own largest "
        "value before exponentiating (every exponent is then at most 0), normalise by "
        "the sum of the shifted exponentials, and add the shift back when taking the "
        "log. Work in float32 (float64 stays float64) and cast only the results, as "
        "the docstring says. (2 more: cpcourse.hint(\"01.2\"))"
    )


def attention_global_max_buggy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               scale: float | None = None) -> torch.Tensor:
    """A "numerically safe" attention from a blog post that is wrong (do not copy it).

    It subtracts the largest score before exponentiating, so exp never overflows, it computes
    in float32, and it passed the random tests it came with. Exercise 01.3: find inputs on
    which it is wrong.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    p = torch.exp(scores - scores.max())
    return ((p @ v.float()) / p.sum(dim=-1, keepdim=True)).to(q.dtype)


def inputs_that_break_it() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs on which `attention_global_max_buggy` is wrong, though every score is modest.

    Return (q, k, v), float32: q [B, H, Lq, D], k and v [B, H, Lk, D], every size between 1 and
    64, all values finite, every score q k^T / sqrt(D) within [-64, 64] (modest scores: float32's
    exp overflows only past 88.7), on which `attention_global_max_buggy(q, k, v)` returns a
    value that is not finite or is off by more than 1e-3 from the true attention.
    """
    # Exercise 01.3: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 01.3 inputs_that_break_it: read notebook 01, \"Bug hunt: a safe "
        "attention that is not\". Hint: section 6 subtracts a maximum for a reason. "
        "Read the buggy code: which maximum does it subtract, taken over which "
        "dimensions? Then ask what float32's exp returns for a number far below zero, "
        "and which query's row would be left with nothing to normalise by. (2 more: "
        "cpcourse.hint(\"01.3\"))"
    )
