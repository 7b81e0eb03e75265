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
    # BEGIN SOLUTION 01.1 | notebook 01, "Naive attention"
    # | hint: the formula of section 2: score every query against every key (scaled; mind the
    # | default when no scale is given), turn each query's row of scores into weights that sum to 1
    # | over the keys, i.e. over the last dimension, then take the weighted average of the values.
    # | hint2: one head, D = 4 so the default scale is 1/2; q = [[1, 0, 0, 0]], keys [[2, 0, 0, 0],
    # | [0, 0, 0, 0]], values [[1], [0]]: scores [1, 0], weights [e/(e+1), 1/(e+1)] = [0.731,
    # | 0.269], output 0.731. With Lq = 3 and Lk = 5 the score matrix is [B, H, 3, 5] and each of
    # | its 3 rows sums to 1 after the softmax.
    # | hint3: scale = D ** -0.5 when scale is None; scores = (q @ k.transpose(-2, -1)) * scale;
    # | return torch.softmax(scores, dim=-1) @ v.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    return torch.softmax(scores, dim=-1) @ v
    # END SOLUTION


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
    # BEGIN SOLUTION 01.2 | notebook 01, "The log-sum-exp"
    # | hint: the max trick of section 6: shift each row of scores by its own largest value before
    # | exponentiating (every exponent is then at most 0), normalise by the sum of the shifted
    # | exponentials, and add the shift back when taking the log. Work in float32 (float64 stays
    # | float64) and cast only the results, as the docstring says.
    # | hint2: a row of scores [1000, 998] with values [[1], [3]]: exp(1000) is inf even in float64,
    # | but with m = 1000 the shifted terms are [1, exp(-2)] = [1, 0.1353], sum 1.1353; weights
    # | [0.8808, 0.1192]; out = 0.8808 * 1 + 0.1192 * 3 = 1.2384; lse = 1000 + log(1.1353) =
    # | 1000.1269.
    # | An empty block (Lk = 0) holds no weight at all: its lse is log(0).
    # | hint3: m = s.amax(-1, keepdim=True); p = exp(s - m); l = p.sum(-1, keepdim=True); out = (p @
    # | v) / l; lse = (m + log(l)).squeeze(-1); out in q's dtype. Lk = 0: out zeros, lse -inf.
    acc = torch.promote_types(q.dtype, torch.float32)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    if k.shape[-2] == 0:  # no key: weight 0, so lse = log 0 and out is 0 (merging adds nothing)
        return (q.new_zeros(*q.shape[:-1], v.shape[-1]),
                torch.full(q.shape[:-1], float("-inf"), dtype=lse_dtype))
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * scale
    row_max = scores.amax(dim=-1, keepdim=True)
    p = torch.exp(scores - row_max)
    row_sum = p.sum(dim=-1, keepdim=True)
    out = (p @ v.to(acc)) / row_sum
    lse = (row_max + torch.log(row_sum)).squeeze(-1)
    return out.to(q.dtype), lse.to(lse_dtype)
    # END SOLUTION


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
    # BEGIN SOLUTION 01.3 | notebook 01, "Bug hunt: a safe attention that is not"
    # | hint: section 6 subtracts a maximum for a reason. Read the buggy code: which maximum does
    # | it subtract, taken over which dimensions? Then ask what float32's exp returns for a number
    # | far below zero, and which query's row would be left with nothing to normalise by.
    # | hint2: in float32, exp(-80) = 1.8e-35 but exp(-104) = 0 (below the smallest subnormal,
    # | 1.4e-45). Two queries with score rows [3, 1] and [-2, -4]: one max for the whole tensor,
    # | 3, leaves the second row exp(-5) and exp(-7), small but fine. Make that gap larger than
    # | 104 and the second row's sum is 0, its weights 0 / 0.
    # | hint3: D = 1 (scale 1), q = [[60], [-60]] as [1, 1, 2, 1], k = ones [1, 1, 3, 1]: the
    # | global max is 60, the second row's scores sit 120 below it, exp(-120) = 0 in float32, and
    # | its output is 0 / 0 = NaN.
    q = torch.tensor([60.0, -60.0]).view(1, 1, 2, 1)
    k = torch.ones(1, 1, 3, 1)
    v = torch.arange(3.0).view(1, 1, 3, 1)
    return q, k, v
    # END SOLUTION
