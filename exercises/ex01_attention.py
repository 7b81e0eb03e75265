# Yours to edit. Generated from solutions/ex01_attention.py by tools/make_exercises.py
# stub-sha256: 94d1c091d9153e1c (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
"""Exercises of notebook 01, attention on one device: the direct way, then with its log-sum-exp.

    python -m pytest tests/graded --ex 01.1 --impl exercises

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
    Scores can reach 1e4 in magnitude, where exp overflows even in float64: subtract each row's
    maximum m before exponentiating, and add it back to the log (lse = m + log(sum exp(s - m))).
    Do not call torch.logsumexp or torch.softmax: writing the max trick yourself is the point.
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
