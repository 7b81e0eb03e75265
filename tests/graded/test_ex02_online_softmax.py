"""Graded tests of notebook 02's exercises: the online softmax, blockwise attention, the merge,
and blocks that break a buggy online softmax (02.4).

    python -m pytest tests/graded/test_ex02_online_softmax.py --impl exercises

References: float64 `torch.logsumexp` for 02.1, `cpcourse.attention.reference_attention` in
float64 for 02.2 and 02.3; the partial results merged in 02.3 come from the library's
`attention_with_lse`, so only the merge is yours.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from cpcourse.attention import (
    TOLERANCES,
    TOLERANCES_LARGE_LOGITS,
    attention_with_lse,
    reference_attention,
)
from cpcourse.course import load
from cpcourse.course.testing import assert_close
from cpcourse.support.peak_memory import peak_memory

DIMS = ("B", "H", "L", "D")
LSE_DIMS = ("B", "H", "L")
HINT_21 = ("m_new = max(m, block.amax(-1)); s = s * exp(m - m_new) + exp(block - "
           "m_new[..., None]).sum(-1): rescale the old sum whenever the max grows")
HINT_22 = ("per block: m_new = max(m, rowmax(s)); c = exp(m - m_new); l = l * c + p.sum(-1); "
           "acc = acc * c[..., None] + p @ v_blk; finally out = acc / l, lse = m + log(l)")
HINT_23 = ("lse = logaddexp(lse_a, lse_b); out = exp(lse_a - lse) * out_a + exp(lse_b - lse) "
           "* out_b, with lse replaced by 0 where it is -inf and empty sides masked by where()")


def qkv(b, h, lq, lk, d, dtype=torch.float32, seed=0, logit=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64) * logit
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ref(q, k, v, scale=None):
    return reference_attention(q.double(), k.double(), v.double(), scale)


def once(blocks):
    """A generator: the blocks can be walked exactly once, like K/V arriving over a ring."""
    yield from blocks


def check_stats(m, s, x, name_dtype=torch.float32):
    x64 = x.double()
    want_m = x64.amax(-1)
    assert m.dtype == name_dtype and s.dtype == name_dtype, (
        f"got m {m.dtype}, s {s.dtype}: keep the running max and sum in {name_dtype}")
    assert_close(m, want_m, atol=0, rtol=0, name="m (the row max)", hint=HINT_21)
    assert_close(s, torch.exp(x64 - want_m[..., None]).sum(-1), atol=1e-6, rtol=2e-6,
                 name="s (sum of exp(x - m))", hint=HINT_21)


# --- 02.1 the online softmax ----------------------------------------------------------------------

@pytest.mark.ex("02.1")
def test_stats_in_one_pass_any_blocks(impl):
    mod = impl("ex02_online_softmax")
    rng = random.Random(0)
    for n in (1, 2, 5, 64, 97, 200):
        x = torch.randn(3, 2, n, generator=torch.Generator().manual_seed(n)) * 5
        for _ in range(4):  # random block boundaries, blocks of 1 column up to the whole row
            cuts = sorted(rng.sample(range(1, n), rng.randint(0, min(8, n - 1))))
            edges = [0, *cuts, n]
            blocks = [x[..., a:b] for a, b in zip(edges[:-1], edges[1:], strict=True)]
            check_stats(*mod.online_softmax_stats(once(blocks)), x)


@pytest.mark.ex("02.1")
def test_stats_when_the_max_keeps_growing(impl):
    # An increasing row: every block raises the max, so the old sum must be rescaled each time.
    mod = impl("ex02_online_softmax")
    x = torch.linspace(-30.0, 60.0, 91).reshape(1, 91)
    check_stats(*mod.online_softmax_stats(once(x.split(4, dim=-1))), x)


@pytest.mark.ex("02.1")
def test_stats_with_logits_of_1e4(impl):
    mod = impl("ex02_online_softmax")
    x = torch.tensor([[1e4, -1e4, 9999.0, 3.0, 10002.5], [-5e3, -5e3, -5e3, -5e3, -5e3]])
    m, s = mod.online_softmax_stats(once(x.split(2, dim=-1)))
    assert torch.isfinite(s).all(), f"s = {s.tolist()}: exponentiate x - m, never x itself"
    check_stats(m, s, x)


@pytest.mark.ex("02.1")
def test_stats_of_bf16_blocks_are_float32(impl):
    mod = impl("ex02_online_softmax")
    x = (torch.randn(4, 300, generator=torch.Generator().manual_seed(3)) * 4).bfloat16()
    check_stats(*mod.online_softmax_stats(once(x.split(16, dim=-1))), x)


# --- 02.2 blockwise attention ---------------------------------------------------------------------

@pytest.mark.ex("02.2")
@pytest.mark.parametrize("block", [1, 7, 32, 500])
def test_blockwise_matches_reference(impl, block):
    mod = impl("ex02_online_softmax")
    q, k, v = qkv(2, 3, 29, 97, 24, seed=block)
    out, lse = mod.blockwise_attention(q, k, v, block)
    want, tol = ref(q, k, v), TOLERANCES[torch.float32]
    assert_close(lse, want[1], atol=tol["lse"][0], rtol=tol["lse"][1], dims=LSE_DIMS,
                 name=f"lse (block_size={block})", hint=HINT_22)
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                 name=f"out (block_size={block})", hint=HINT_22)


@pytest.mark.ex("02.2")
def test_blockwise_with_scale_large_logits_and_no_keys(impl):
    mod = impl("ex02_online_softmax")
    q, k, v = qkv(1, 2, 21, 64, 32, seed=3, logit=1800.0)
    out, lse = mod.blockwise_attention(q, k, v, 16)
    want, tol = ref(q, k, v), TOLERANCES_LARGE_LOGITS[torch.float32]
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                 name="out (scores ~1e4)", hint="exp(s - m_new), never exp(s)")
    q, k, v = qkv(1, 2, 21, 40, 32, seed=4)
    out, lse = mod.blockwise_attention(q, k, v, 16, scale=0.3)
    want, tol = ref(q, k, v, 0.3), TOLERANCES[torch.float32]
    assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                 name="out (scale=0.3)", hint="use the scale given; D ** -0.5 only for None")
    out, lse = mod.blockwise_attention(q, k[:, :, :0], v[:, :, :0], 16)
    assert_close(out, torch.zeros_like(q), atol=0, rtol=0, dims=DIMS, name="out (no keys)",
                 hint="no keys: out = 0 (return acc without dividing by l = 0)")
    assert torch.isneginf(lse).all(), f"no keys: lse must be -inf, got {lse.flatten()[:4]}"


@pytest.mark.ex("02.2")
def test_blockwise_never_builds_the_full_score_matrix(impl):
    mod = impl("ex02_online_softmax")
    b, h, length, d, block = 1, 2, 768, 32, 64
    q, k, v = qkv(b, h, length, length, d, seed=8)
    with torch.no_grad():
        (out, _), peak = peak_memory(mod.blockwise_attention, q, k, v, block)
    full = b * h * length * length * 4
    assert peak < full / 2, (
        f"blockwise_attention held {peak / 1e6:.1f} MB at its peak; the full {length} x "
        f"{length} score matrix is {full / 1e6:.1f} MB. Work one [Lq, {block}] tile at a time.")
    tol = TOLERANCES[torch.float32]
    assert_close(out, ref(q, k, v)[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                 name="out", hint=HINT_22)


# --- 02.3 merging two partial results -------------------------------------------------------------

@pytest.mark.ex("02.3")
@pytest.mark.parametrize("lk", [2, 37, 120])
def test_merge_of_two_halves_is_the_whole(impl, lk):
    mod = impl("ex02_online_softmax")
    q, k, v = qkv(2, 3, 9, lk, 16, seed=lk)
    want, tol = ref(q, k, v), TOLERANCES[torch.float32]
    for c in sorted({0, 1, lk // 3, lk // 2, lk - 1, lk}):  # c = 0 or lk: one side is empty
        a = attention_with_lse(q, k[:, :, :c], v[:, :, :c])
        b = attention_with_lse(q, k[:, :, c:], v[:, :, c:])
        for swap in (False, True):
            out, lse = mod.merge_partials(*b, *a) if swap else mod.merge_partials(*a, *b)
            what = f"keys split at {c} of {lk}{', sides swapped' if swap else ''}"
            assert_close(lse, want[1], atol=tol["lse"][0], rtol=tol["lse"][1], dims=LSE_DIMS,
                         name=f"lse ({what})", hint=HINT_23)
            assert_close(out, want[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                         name=f"out ({what})", hint=HINT_23)


@pytest.mark.ex("02.3")
def test_merge_ignores_an_empty_side_even_if_its_out_is_nan(impl):
    mod = impl("ex02_online_softmax")
    q, k, v = qkv(1, 2, 7, 30, 8, seed=5)
    out, lse = attention_with_lse(q, k, v)
    nan_out, no_keys = torch.full_like(out, math.nan), torch.full_like(lse, -math.inf)
    for args in ((out, lse, nan_out, no_keys), (nan_out, no_keys, out, lse)):
        got_out, got_lse = mod.merge_partials(*args)
        hint = "a side with lse = -inf has weight 0: mask its out with torch.where (0 * NaN = NaN)"
        assert_close(got_out, out, atol=1e-6, rtol=1e-6, dims=DIMS, name="out", hint=hint)
        assert_close(got_lse, lse, atol=1e-6, rtol=1e-6, dims=LSE_DIMS, name="lse", hint=hint)


@pytest.mark.ex("02.3")
def test_merge_of_two_empty_sides_is_zero_and_minus_inf(impl):
    mod = impl("ex02_online_softmax")
    out, lse = torch.zeros(1, 2, 5, 4), torch.full((1, 2, 5), -math.inf)
    got_out, got_lse = mod.merge_partials(out, lse, out, lse)
    hint = "logaddexp(-inf, -inf) = -inf; then exp(-inf - (-inf)) is NaN: subtract 0 there"
    assert_close(got_out, out, atol=0, rtol=0, dims=DIMS, name="out", hint=hint)
    assert_close(got_lse, lse, atol=0, rtol=0, dims=LSE_DIMS, name="lse", hint=hint)


@pytest.mark.ex("02.3")
def test_merge_of_far_apart_lse_and_bf16_inputs(impl):
    mod = impl("ex02_online_softmax")
    out_a, out_b = torch.ones(1, 1, 2, 3), torch.full((1, 1, 2, 3), 5.0)
    lse_a, lse_b = torch.tensor([[[1e4, -1e4]]]), torch.tensor([[[0.0, 0.0]]])
    out, lse = mod.merge_partials(out_a, lse_a, out_b, lse_b)
    assert_close(out, torch.tensor([[[[1.0] * 3, [5.0] * 3]]]), dims=DIMS, name="out",
                 hint="never exp(lse) itself: exp(1e4) = inf; use differences lse_x - lse")
    assert_close(lse, torch.tensor([[[1e4, 0.0]]]), dims=LSE_DIMS, name="lse", hint=HINT_23)
    q, k, v = qkv(1, 2, 33, 50, 16, dtype=torch.bfloat16, seed=9)
    a = attention_with_lse(q, k[:, :, :20], v[:, :, :20])
    b = attention_with_lse(q, k[:, :, 20:], v[:, :, 20:])
    out, lse = mod.merge_partials(*a, *b)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32, (
        f"merging bf16 partials returned out {out.dtype}, lse {lse.dtype}: work and return "
        "in float32 (a ring merges many times; cast to bf16 once, at the end)")
    tol = TOLERANCES[torch.bfloat16]
    assert_close(out, ref(q, k, v)[0], atol=tol["out"][0], rtol=tol["out"][1], dims=DIMS,
                 name="out", hint=HINT_23)


# --- 02.4 bug hunt: blocks that break an online softmax -------------------------------------------

@pytest.mark.ex("02.4")
def test_blocks_break_the_block_max_online_softmax(impl):
    mod = impl("ex02_online_softmax")
    blocks = mod.blocks_that_break_it()
    assert isinstance(blocks, list | tuple) and blocks and all(
        isinstance(b, torch.Tensor) for b in blocks), \
        f"blocks_that_break_it() returned {blocks!r}: return a list of tensors [R, n_i]"
    shapes = [tuple(b.shape) for b in blocks]
    assert all(b.dtype == torch.float32 and b.dim() == 2 for b in blocks), \
        f"blocks of shapes {shapes}, dtypes {[str(b.dtype) for b in blocks]}: want float32 [R, n_i]"
    rows = {s[0] for s in shapes}
    assert len(rows) == 1 and 1 <= shapes[0][0] <= 8 and all(s[1] >= 1 for s in shapes), \
        f"blocks of shapes {shapes}: the same R rows (1 to 8) in every block, at least 1 column"
    assert len(blocks) <= 16 and sum(s[1] for s in shapes) <= 256, \
        f"{len(blocks)} blocks, {sum(s[1] for s in shapes)} columns: at most 16 and 256"
    x = torch.cat(blocks, dim=-1)
    assert torch.isfinite(x).all() and float(x.abs().max()) <= 50, (
        f"values reach {float(x.abs().max()):.4g}: keep every value finite and within [-50, 50] "
        "(modest scores: the point is that this bug needs nothing larger)")
    x64 = x.double()
    want_m = x64.amax(-1)
    want_s = torch.exp(x64 - want_m[..., None]).sum(-1)
    buggy = load("solutions", "ex02_online_softmax").online_softmax_stats_blockmax_buggy
    m, s = (t.double() for t in buggy(iter(blocks)))
    err = max(float(((m - want_m).abs() / want_m.abs().clamp_min(1)).nan_to_num(math.inf).max()),
              float(((s - want_s).abs() / want_s).nan_to_num(math.inf).max()))
    assert err > 1e-3, (
        f"on these blocks the buggy online softmax is right (relative error {err:.2g}). Which "
        "number is its sum kept relative to, which way can that reference move from one block "
        "to the next, and how large can the rescaling factor then get in float32?")
