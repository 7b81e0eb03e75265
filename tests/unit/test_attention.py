"""cpcourse.attention and cpcourse.online_softmax against a float64 reference.

    python -m pytest tests/unit/test_attention.py -q
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cpcourse import attention as A
from cpcourse.attention.kernels import FUSED
from cpcourse.support.errors import InputError

CPU_BACKENDS = ("cpu-flash", "torch")
LOW = (torch.float32, torch.float16, torch.bfloat16)


def qkv(b, h, lq, lk, d, dtype=torch.float32, dv=None, seed=0, logit=1.0):
    """Unit-variance q, k, v; `logit` multiplies q so scaled scores reach about `logit * 1`."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64) * logit
    k = torch.randn(b, h, lk, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, lk, d if dv is None else dv, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def ref64(q, k, v, scale=None):
    """The reference on the same (already rounded) inputs, in float64."""
    return A.reference_attention(q.double(), k.double(), v.double(), scale)


def check(out, lse, ref, dtype, table=A.TOLERANCES):
    tol = table[dtype]
    assert out.dtype == dtype and out.shape == ref[0].shape
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(out.double(), ref[0], atol=tol["out"][0], rtol=tol["out"][1])
    torch.testing.assert_close(lse.double(), ref[1], atol=tol["lse"][0], rtol=tol["lse"][1])


# (B, H, Lq, Lk, D): lengths 1 .. a few thousand incl. odd and prime, head dims 16 .. 256
SHAPES = [
    (1, 1, 1, 1, 16), (2, 3, 1, 7, 24), (2, 4, 13, 1, 40), (3, 2, 97, 101, 64),
    (1, 3, 257, 129, 80), (2, 2, 64, 511, 96), (1, 2, 1000, 999, 128), (1, 1, 2053, 2053, 64),
    (1, 2, 300, 700, 160), (1, 1, 129, 389, 256), (2, 2, 50, 3001, 48),
]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backends_match_float64_reference(backend, shape):
    q, k, v = qkv(*shape, seed=sum(shape))
    check(*A.attention_with_lse(q, k, v, backend=backend), ref64(q, k, v), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float64, *LOW], ids=str)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_dtypes_within_stated_tolerance(dtype, backend):
    for i, shape in enumerate([(2, 3, 77, 131, 64), (1, 2, 1024, 1031, 128), (2, 2, 33, 65, 40)]):
        q, k, v = qkv(*shape, dtype=dtype, seed=i)
        check(*A.attention_with_lse(q, k, v, backend=backend), ref64(q, k, v), dtype)


@pytest.mark.parametrize("scale", [None, 0.05, 1.0, 0.3])
def test_scale_given_and_default(scale):
    q, k, v = qkv(2, 2, 31, 47, 72, seed=3)
    ref = ref64(q, k, v, scale)
    if scale is None:  # the default is 1 / sqrt(D)
        torch.testing.assert_close(ref[1], ref64(q, k, v, 1 / math.sqrt(72))[1])
    for backend in CPU_BACKENDS:
        check(*A.attention_with_lse(q, k, v, scale=scale, backend=backend), ref, torch.float32)


@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_logits_up_to_1e4(dtype):
    # q . k / sqrt(D) reaches ~1e4 in magnitude: exp overflows unless the max is subtracted.
    q, k, v = qkv(2, 2, 41, 83, 64, dtype=dtype, seed=5, logit=2500.0)
    ref = ref64(q, k, v)
    scores = (q.double() @ k.double().transpose(-2, -1)) / 8
    assert scores.abs().max() > 1e4
    big = A.TOLERANCES_LARGE_LOGITS
    for backend in CPU_BACKENDS:
        check(*A.attention_with_lse(q, k, v, backend=backend), ref, dtype, big)
    check(*A.attention_v4_blockwise(q, k, v, 16), ref, dtype, big)


@pytest.mark.parametrize("backend", [None, *CPU_BACKENDS])
def test_zero_keys_give_zero_out_and_minus_inf_lse(backend):
    q, k, v = qkv(2, 3, 5, 0, 32, dv=24)
    out, lse = A.attention_with_lse(q, k, v, backend=backend)
    assert out.shape == (2, 3, 5, 24) and torch.equal(out, torch.zeros_like(out))
    assert lse.shape == (2, 3, 5) and torch.isneginf(lse).all()
    for fn in (A.reference_attention, lambda *a: A.attention_v4_blockwise(*a, block_size=4)):
        out2, lse2 = fn(q, k, v)
        assert torch.equal(out2, out) and torch.equal(lse2, lse)


def test_zero_queries_and_value_dim_differs():
    q, k, v = qkv(1, 2, 0, 9, 16)
    out, lse = A.attention_with_lse(q, k, v)
    assert out.shape == (1, 2, 0, 16) and lse.shape == (1, 2, 0)
    q, k, v = qkv(2, 2, 19, 23, 32, dv=48)  # cpu-flash needs Dv == D: auto falls back to torch
    assert A.attention_backend(q, k, v) == "torch"
    check(*A.attention_with_lse(q, k, v), ref64(q, k, v), torch.float32)


def test_backend_is_reported_and_can_be_forced(monkeypatch):
    q, k, v = qkv(1, 2, 8, 8, 16)
    monkeypatch.delenv(A.ENV_BACKEND, raising=False)
    assert A.attention_backend(q) == "cpu-flash"  # CPU tensors: the fused CPU kernel
    assert A.attention_backend(q, backend="torch") == "torch"
    monkeypatch.setenv(A.ENV_BACKEND, "torch")
    assert A.attention_backend(q) == "torch"
    monkeypatch.setenv(A.ENV_BACKEND, "flash-attn")  # a preference that cannot run: auto
    assert A.attention_backend(q) == "cpu-flash"
    with pytest.raises(InputError, match="cannot run these inputs"):
        A.attention_with_lse(q, k, v, backend="sdpa-flash")
    monkeypatch.setenv(A.ENV_BACKEND, "fastest")
    with pytest.raises(InputError, match="not a backend"):
        A.attention_backend(q)
    with pytest.raises(InputError, match="unknown attention backend"):
        A.attention_backend(q, backend="xformers")


@pytest.mark.parametrize("bad", [
    lambda q, k, v: (q[0], k, v),                          # 3-d
    lambda q, k, v: (q, k[:, :1], v[:, :1]),               # heads differ
    lambda q, k, v: (q, k[..., :8], v),                    # head dims of q and k differ
    lambda q, k, v: (q, k, v[:, :, :3]),                   # k and v lengths differ
    lambda q, k, v: (q, k.double(), v),                    # dtypes differ
    lambda q, k, v: (q.long(), k.long(), v.long()),        # not floating
])
def test_bad_input_is_one_clear_error(bad):
    q, k, v = qkv(1, 2, 4, 5, 16)
    for fn in (A.attention_with_lse, A.reference_attention):
        with pytest.raises(InputError):
            fn(*bad(q, k, v))


# --- merge ----------------------------------------------------------------------------------------

def partials(q, k, v, cuts, backend=None):
    """Attention of q over each K/V slice between consecutive cut points."""
    edges = [0, *cuts, k.shape[2]]
    return [A.attention_with_lse(q, k[:, :, a:b], v[:, :, a:b], backend=backend)
            for a, b in zip(edges[:-1], edges[1:], strict=True)]


@settings(max_examples=25)
@given(lk=st.integers(1, 90), data=st.data())
def test_merge_any_split_any_order_equals_full(lk, data):
    q, k, v = qkv(2, 2, 11, lk, 16, seed=lk)
    cuts = sorted(data.draw(st.lists(st.integers(0, lk), max_size=6)))  # repeats = empty blocks
    parts = partials(q, k, v, cuts, backend=data.draw(st.sampled_from([None, "torch"])))
    # Merge in a random order and a random tree shape: pick two, merge, put back, repeat.
    while len(parts) > 1:
        i = data.draw(st.integers(0, len(parts) - 1))
        a = parts.pop(i)
        j = data.draw(st.integers(0, len(parts) - 1))
        b = parts.pop(j)
        parts.append(A.merge_attention(*a, *b) if data.draw(st.booleans())
                     else A.merge_attention(*b, *a))
    check(*parts[0], ref64(q, k, v), torch.float32)


@settings(max_examples=25)
@given(lk=st.integers(1, 40), lq=st.integers(1, 9), seed=st.integers(0, 99),
       dtype=st.sampled_from([torch.float64, *LOW]), garbage=st.sampled_from([0.0, math.nan, 7.0]))
def test_zero_key_block_is_identity_of_merge(lk, lq, seed, dtype, garbage):
    q, k, v = qkv(1, 3, lq, lk, 8, dtype=dtype, seed=seed)
    out, lse = A.attention_with_lse(q, k, v)
    empty_out = torch.full_like(out, garbage)  # an empty side's out is ignored, even NaN
    empty_lse = torch.full_like(lse, -math.inf)
    for merged in (A.merge_attention(out, lse, empty_out, empty_lse),
                   A.merge_attention(empty_out, empty_lse, out, lse)):
        assert merged[0].dtype == A.accumulator_dtype(dtype)
        assert torch.equal(merged[0], out.to(merged[0].dtype))
        assert torch.equal(merged[1], lse.to(merged[1].dtype))


def test_merge_both_empty_is_zero_and_minus_inf_without_nan():
    out = torch.full((1, 2, 3, 4), math.nan)
    lse = torch.full((1, 2, 3), -math.inf)
    m_out, m_lse = A.merge_attention(out, lse, out, lse)
    assert torch.equal(m_out, torch.zeros_like(m_out)) and torch.isneginf(m_lse).all()


def test_merge_accumulates_in_float32_and_checks_shapes():
    q, k, v = qkv(1, 2, 64, 96, 32, dtype=torch.bfloat16)
    (oa, la), (ob, lb) = partials(q, k, v, [40])
    out, lse = A.merge_attention(oa, la, ob, lb)
    assert out.dtype == lse.dtype == torch.float32
    check(out.to(torch.bfloat16), lse, ref64(q, k, v), torch.bfloat16)
    with pytest.raises(InputError):
        A.merge_attention(oa, la, ob[:, :1], lb[:, :1])
    with pytest.raises(InputError):
        A.merge_attention(oa, la[..., :3], ob, lb)


def test_merge_is_stable_for_far_apart_lse():
    # lse 1e4 apart: exp(lse) overflows, the merge must not.
    out_a, out_b = torch.ones(1, 1, 2, 3), torch.full((1, 1, 2, 3), 5.0)
    lse_a, lse_b = torch.tensor([[[1e4, -1e4]]]), torch.tensor([[[0.0, 0.0]]])
    out, lse = A.merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(out, torch.tensor([[[[1.0] * 3, [5.0] * 3]]]))
    torch.testing.assert_close(lse, torch.tensor([[[1e4, 0.0]]]))


# --- teaching versions ----------------------------------------------------------------------------

def test_softmax_versions_match_reference_and_v1_overflows():
    x = torch.randn(3, 5, 257, dtype=torch.float64)
    want = torch.softmax(x, dim=-1)
    torch.testing.assert_close(A.softmax_v1_naive(x), want)
    torch.testing.assert_close(A.softmax_v2_safe(x), want)
    for block in (1, 3, 64, 1000):
        torch.testing.assert_close(A.softmax_v3_online(x, block_size=block), want)
    big = torch.tensor([1.0, 3.0, 100.0, 2.0])  # exp(100) = inf in float32
    assert A.softmax_v1_naive(big).isnan().any()
    for fn in (A.softmax_v2_safe, A.softmax_v3_online):
        torch.testing.assert_close(fn(big), torch.softmax(big, -1))


def test_online_softmax_stats_trace_is_running_max_and_sum():
    from cpcourse.online_softmax import online_softmax_stats

    x = torch.tensor([[0.5, 2.0, -1.0, 4.0, 3.0]], dtype=torch.float64)
    trace = []
    m, s = online_softmax_stats(x, block_size=2, trace=trace)
    assert [t[0].item() for t in trace] == [2.0, 4.0, 4.0]
    for (mi, si), n in zip(trace, (2, 4, 5), strict=True):
        torch.testing.assert_close(si, torch.exp(x[:, :n] - mi).sum(-1))
    torch.testing.assert_close(m + torch.log(s), torch.logsumexp(x, -1))


@pytest.mark.parametrize("block", [1, 7, 64, 5000])
@pytest.mark.parametrize("dtype", [torch.float64, *LOW], ids=str)
def test_v4_blockwise_matches_reference(block, dtype):
    q, k, v = qkv(2, 3, 37, 301, 48, dtype=dtype, seed=block)
    check(*A.attention_v4_blockwise(q, k, v, block, scale=0.2), ref64(q, k, v, 0.2), dtype)


def test_bf16_accumulators_fail_float32_ones_do_not():
    q, k, v = qkv(1, 1, 16, 4096, 64, dtype=torch.bfloat16, seed=1, logit=0.1)
    ref = ref64(q, k, v)
    err = {acc: (A.attention_v4_blockwise(q, k, v, 64, acc_dtype=acc)[1].double() - ref[1])
           .abs().max().item() for acc in (torch.float32, torch.bfloat16)}
    assert err[torch.float32] < 1e-4 < 1e-2 < err[torch.bfloat16]


def test_cuda_adapters_keep_the_contract_on_meta_tensors():
    # The CUDA kernels' adapters run here on shape-only tensors: out [B, H, Lq, Dv] and lse
    # [B, H, Lq] float32 (sdpa-efficient pads lse to a multiple of 32; the adapter trims it).
    q = torch.empty(2, 3, 37, 64, device="meta", dtype=torch.float16)
    k = torch.empty(2, 3, 50, 64, device="meta", dtype=torch.float16)
    for name in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        out, lse = FUSED[name](q, k, k, 0.125)
        assert out.shape == (2, 3, 37, 64) and lse.shape == (2, 3, 37), name
        assert lse.dtype == torch.float32 and out.dtype == torch.float16, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["flash-attn", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn",
                                     "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_cuda_backends_match_reference(backend, dtype):
    q, k, v = (t.cuda() for t in qkv(2, 3, 333, 517, 64, dtype=dtype))
    try:
        out, lse = A.attention_with_lse(q, k, v, backend=backend)
    except InputError as exc:
        pytest.skip(str(exc))
    ref = ref64(q.cpu(), k.cpu(), v.cpu())
    check(out.cpu(), lse.cpu(), ref, dtype)


def _strided(x: torch.Tensor, how: str) -> torch.Tensor:
    """The same values as `x` [B, H, L, D] in another memory layout (a view, not a copy)."""
    if how == "head_dim_last":  # D not unit-stride: stored as [B, H, D, L]
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if how == "heads_inner":  # stored as [B, L, H, D], the layout of most model code
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if how == "sliced":  # every other element of a wider buffer, in L and D
        wide = torch.zeros(*x.shape[:2], 2 * x.shape[2], 2 * x.shape[3], dtype=x.dtype)
        wide[:, :, ::2, ::2] = x
        return wide[:, :, ::2, ::2]
    if how == "expanded":  # one head broadcast to all (stride 0 over H)
        return x[:, :1].expand_as(x)
    raise AssertionError(how)


LAYOUTS = ("head_dim_last", "heads_inner", "sliced", "expanded")


@settings(max_examples=30, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), which=st.sampled_from(["q", "k", "v", "all"]),
       lq=st.integers(1, 40), lk=st.integers(1, 40), d=st.sampled_from([3, 8, 16, 33]),
       h=st.integers(1, 3), dtype=st.sampled_from([torch.float32, torch.float64]),
       seed=st.integers(0, 99))
def test_any_strided_view_gives_the_contiguous_answer(layout, which, lq, lk, d, h, dtype, seed):
    """Regression: fused CPU attention returned garbage (and NaN) for a non-unit-stride head dim."""
    q, k, v = qkv(2, h, lq, lk, d, dtype, seed=seed)
    views = [(_strided(x, layout) if which in (name, "all") else x)
             for name, x in zip("qkv", (q, k, v), strict=True)]
    dense = [x.contiguous() for x in views]
    out, lse = A.attention_with_lse(*views)
    want_out, want_lse = A.attention_with_lse(*dense)
    torch.testing.assert_close(out, want_out, atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)
    check(out, lse, ref64(*dense), dtype)


def test_video_attention_takes_strided_views():
    from cpcourse import video

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 8, 3, 5, generator=g).transpose(-1, -2)  # [B, H, T, S, D], D strided
    dense = x.contiguous()
    for fn in (video.spatial_attention, video.temporal_attention, video.full_attention):
        torch.testing.assert_close(fn(x, x, x), fn(dense, dense, dense), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("backend", [None, "torch"])
@pytest.mark.parametrize("shape", [(2, 0, 5, 7, 8), (0, 2, 5, 7, 8), (2, 2, 5, 7, 0)],
                         ids=["no_heads", "no_batch", "no_head_dim"])
def test_empty_dimensions_are_answered_not_crashed(backend, shape):
    """Regression: H = 0 (or B = 0) killed the process with SIGFPE inside the fused kernel."""
    b, h, lq, lk, d = shape
    q, k, _ = qkv(b, h, lq, lk, d)
    v = torch.randn(b, h, lk, 4)
    out, lse = A.attention_with_lse(q, k, v, backend=backend)
    assert out.shape == (b, h, lq, 4) and lse.shape == (b, h, lq)
    if d == 0:  # every score is 0: a plain average of v, lse = log(Lk)
        torch.testing.assert_close(out, v.mean(dim=2, keepdim=True).expand_as(out))
        torch.testing.assert_close(lse, torch.full_like(lse, math.log(lk)))
    with pytest.raises(InputError, match="empty dimension"):
        A.attention_with_lse(q, k, v[..., :d] if d else v, backend="cpu-flash")


def test_nan_inputs_show_as_nan_not_as_an_empty_block():
    """Regression: the CPU kernel returned out = 0, lse = 0 for a NaN row, which a merge then
    weighs as a real block of keys."""
    q, k, v = qkv(1, 2, 6, 9, 16)
    q[0, 1, 2, 3] = float("nan")
    out, lse = A.attention_with_lse(q, k, v)
    assert torch.isnan(out[0, 1, 2]).all() and torch.isnan(lse[0, 1, 2])
    rows = torch.ones(6, dtype=torch.bool)
    rows[2] = False
    clean_out, clean_lse = A.attention_with_lse(q[:, :, rows], k, v)
    torch.testing.assert_close(out[:, :, rows], clean_out)
    torch.testing.assert_close(lse[:, :, rows], clean_lse)
    k[0, 0, 4, 0] = float("nan")  # a NaN key poisons every query of its head, only that head
    out, lse = A.attention_with_lse(q, k, v)
    assert torch.isnan(lse[0, 0]).all() and torch.isnan(out[0, 0]).all()
    assert torch.isfinite(lse[0, 1, rows]).all()


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "two"])
def test_a_scale_that_is_not_a_finite_number_is_refused(scale):
    q, k, v = qkv(1, 1, 3, 3, 8)
    with pytest.raises(InputError, match="scale must be"):
        A.attention_with_lse(q, k, v, scale=scale)
