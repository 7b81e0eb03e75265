"""Graded tests of notebook 01's exercises: naive attention, attention with its log-sum-exp, and
inputs that break a "safe" attention (01.3).

    python -m pytest tests/graded/test_ex01_attention.py --impl exercises

Every answer is compared with `cpcourse.attention.reference_attention` computed in float64 on
the same inputs, on odd shapes (Lq != Lk, D != Dv, lengths that are not powers of two).
"""

from __future__ import annotations

import math

import pytest
import torch

from cpcourse.attention import TOLERANCES, TOLERANCES_LARGE_LOGITS, reference_attention
from cpcourse.course import load
from cpcourse.course.testing import assert_close

DIMS = ("B", "H", "L", "D")
LSE_DIMS = ("B", "H", "L")
HINT_11 = ("scores = q @ k.transpose(-2, -1) * scale (scale = D ** -0.5 unless given); "
           "softmax over dim=-1 (the keys); then @ v")
HINT_12 = ("subtract the row max m before exp; lse = m + log(sum exp(s - m)); "
           "out = (exp(s - m) @ v) / sum exp(s - m)")


def qkv(b, h, lq, lk, d, dv=None, dtype=torch.float32, seed=0, logit=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64) * logit
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, lk, dv or d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ref(q, k, v, scale=None):
    return reference_attention(q.double(), k.double(), v.double(), scale)


SHAPES = [(2, 3, 37, 37, 16, 16), (1, 2, 13, 29, 24, 40), (2, 1, 1, 7, 8, 8),
          (1, 4, 101, 53, 64, 32)]


@pytest.mark.ex("01.1")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_naive_matches_reference(impl, shape):
    mod = impl("ex01_attention")
    q, k, v = qkv(*shape, seed=shape[2])
    got = mod.naive_attention(q, k, v)
    tol = TOLERANCES[torch.float32]["out"]
    assert_close(got, ref(q, k, v)[0], atol=tol[0], rtol=tol[1], dims=DIMS, name="out",
                 hint=HINT_11)
    assert got.dtype == q.dtype, f"out is {got.dtype}; return it in q's dtype {q.dtype}"


@pytest.mark.ex("01.1")
def test_naive_uses_the_scale_it_is_given(impl):
    mod = impl("ex01_attention")
    q, k, v = qkv(1, 2, 19, 23, 32, seed=4)
    tol = TOLERANCES[torch.float64]["out"]
    for scale in (0.05, 1.0):
        assert_close(mod.naive_attention(q.double(), k.double(), v.double(), scale=scale),
                     ref(q, k, v, scale)[0], atol=tol[0], rtol=tol[1], dims=DIMS,
                     name=f"out with scale={scale}", hint="multiply the scores by `scale` when "
                     "it is given; use D ** -0.5 only when it is None")


@pytest.mark.ex("01.1")
def test_naive_weights_sum_to_one_over_keys(impl):
    # With v all ones, every output is a weighted average of ones: exactly 1 when each query's
    # weights sum to 1 over the keys. A softmax over the wrong dimension breaks this.
    mod = impl("ex01_attention")
    q, k, _ = qkv(1, 2, 31, 31, 16, seed=7, logit=3.0)
    out = mod.naive_attention(q, k, torch.ones(1, 2, 31, 16))
    assert_close(out, torch.ones(1, 2, 31, 16), atol=1e-5, rtol=1e-5, dims=DIMS, name="out",
                 hint="the softmax must run over the keys: dim=-1 of the [B, H, Lq, Lk] scores")


@pytest.mark.ex("01.2")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_lse_and_out_match_reference(impl, shape):
    mod = impl("ex01_attention")
    q, k, v = qkv(*shape, seed=shape[3])
    out, lse = mod.attention_and_lse(q, k, v)
    want = ref(q, k, v)
    tol = TOLERANCES[torch.float32]
    assert_close(lse, want[1], atol=tol["lse"][0], rtol=tol["lse"][1], dims=LSE_DIMS,
                 name="lse", hint=HINT_12)
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS, name="out",
                 hint=HINT_12)
    assert lse.dtype == torch.float32, f"lse is {lse.dtype}; return it in float32"


@pytest.mark.ex("01.2")
def test_logits_of_1e4_do_not_overflow(impl, monkeypatch):
    mod = impl("ex01_attention")
    q, k, v = qkv(2, 2, 17, 41, 32, seed=1, logit=1800.0)  # scores reach ~1e4
    want = ref(q, k, v)
    # Write the max trick yourself: the library's logsumexp/softmax are switched off here.
    def refuse(*a, **kw):
        raise AssertionError("attention_and_lse must not call logsumexp/softmax: subtract the "
                             "row max yourself")
    for owner, name in ((torch, "logsumexp"), (torch, "softmax"), (torch.Tensor, "logsumexp"),
                        (torch.Tensor, "softmax"), (torch.nn.functional, "softmax")):
        monkeypatch.setattr(owner, name, refuse)
    out, lse = mod.attention_and_lse(q, k, v)
    tol = TOLERANCES_LARGE_LOGITS[torch.float32]
    hint = "exp(1e4) is inf: exponentiate s - rowmax(s), never s itself"
    assert_close(lse, want[1], atol=tol["lse"][0], rtol=tol["lse"][1], dims=LSE_DIMS,
                 name="lse", hint=hint)
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS, name="out",
                 hint=hint)


@pytest.mark.ex("01.2")
@pytest.mark.parametrize("lq", [1, 7])
def test_a_block_with_no_keys_vanishes_in_a_merge(impl, lq):
    """A ring rank with an empty shard: its result must leave any merge unchanged."""
    from cpcourse.attention import merge_attention

    mod = impl("ex01_attention")
    q, k, v = qkv(2, 3, lq, 13, 16, seed=lq)
    out_e, lse_e = mod.attention_and_lse(q, k[:, :, :0], v[:, :, :0])
    assert out_e.shape == (2, 3, lq, 16) and lse_e.shape == (2, 3, lq), (
        f"with no keys, out should be [B, H, Lq, Dv] = (2, 3, {lq}, 16) and lse [B, H, Lq]; got "
        f"{tuple(out_e.shape)} and {tuple(lse_e.shape)}")
    assert torch.isfinite(out_e).all(), "out over no keys holds NaN or inf: a merge spreads it"
    want, empty = ref(q, k, v), (out_e.double(), lse_e.double())
    for order in ("empty first", "empty last"):
        parts = (empty, want) if order == "empty first" else (want, empty)
        out, lse = merge_attention(*parts[0], *parts[1])
        assert_close(lse.double(), want[1].double(), atol=1e-6, rtol=1e-6, dims=LSE_DIMS,
                     name=f"lse after merging the empty block ({order})",
                     hint="the empty block has no weight: what log-sum-exp has a sum of 0?")
        assert_close(out.double(), want[0].double(), atol=1e-6, rtol=1e-6, dims=DIMS,
                     name=f"out after merging the empty block ({order})",
                     hint="the empty block has no weight: what log-sum-exp has a sum of 0?")


@pytest.mark.ex("01.2")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_low_precision_inputs_keep_float32_lse(impl, dtype):
    mod = impl("ex01_attention")
    q, k, v = qkv(1, 3, 45, 70, 32, dtype=dtype, seed=2)
    out, lse = mod.attention_and_lse(q, k, v)
    want_lse = torch.float64 if dtype == torch.float64 else torch.float32
    assert out.dtype == dtype and lse.dtype == want_lse, (
        f"got out {out.dtype}, lse {lse.dtype}; want out {dtype} (q's dtype), lse {want_lse}")
    tol, want = TOLERANCES[dtype], ref(q, k, v)
    assert_close(lse, want[1], atol=tol["lse"][0], rtol=tol["lse"][1], dims=LSE_DIMS,
                 name="lse", hint="compute in float32: q.float() @ k.float().transpose(-2, -1)")
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS, name="out",
                 hint=HINT_12)


# --- 01.3 bug hunt: inputs that break a "safe" attention ------------------------------------------

@pytest.mark.ex("01.3")
def test_inputs_break_the_global_max_attention(impl):
    mod = impl("ex01_attention")
    got = mod.inputs_that_break_it()
    assert isinstance(got, tuple) and len(got) == 3 and all(
        isinstance(x, torch.Tensor) for x in got), \
        f"inputs_that_break_it() returned {type(got).__name__}: return a tuple (q, k, v)"
    q, k, v = got
    for name, x in (("q", q), ("k", k), ("v", v)):
        assert x.dtype == torch.float32 and x.dim() == 4, \
            f"{name} is {x.dtype} with shape {tuple(x.shape)}: want float32 [B, H, L, D]"
        assert all(1 <= n <= 64 for n in x.shape), \
            f"{name} has shape {tuple(x.shape)}: every size between 1 and 64"
        assert torch.isfinite(x).all(), f"{name} holds non-finite values: keep them finite"
    assert q.shape[:2] == k.shape[:2] == v.shape[:2] and k.shape[2] == v.shape[2] \
        and q.shape[3] == k.shape[3], (f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v "
                                       f"{tuple(v.shape)} do not fit [B, H, Lq, D], [B, H, Lk, D]")
    scores = q.double() @ k.double().transpose(-2, -1) * q.shape[-1] ** -0.5
    worst = float(scores.abs().max())
    assert worst <= 64, (f"a score reaches {worst:.4g}: keep every q k^T / sqrt(D) within "
                         "[-64, 64]. Large logits break many things; the point is that this "
                         "bug needs none.")
    want = ref(q, k, v)[0]
    buggy = load("solutions", "ex01_attention").attention_global_max_buggy(q, k, v).double()
    err = float((buggy - want).abs().nan_to_num(math.inf).max())
    assert err > 1e-3, (
        f"on these inputs attention_global_max_buggy is right (max error {err:.2g} against "
        "float64). Read which maximum it subtracts, over which dimensions, and think about "
        "which query row ends up with nothing to normalise by.")
