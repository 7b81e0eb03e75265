"""Attention on one device: the float64 reference, the fastest fused kernel, and the lse merge.

    python -m cpcourse.attention         # the memory wall: naive vs fused peak memory, measured
    python -m pytest tests/unit/test_attention.py -q

Layout everywhere: q `[B, H, Lq, D]`, k `[B, H, Lk, D]`, v `[B, H, Lk, Dv]`, out `[B, H, Lq, Dv]`,
and the log-sum-exp of each query's scores, lse `[B, H, Lq]`, in float32 (float64 when the inputs
are float64, so that the reference stays exact). `lse` is what lets partial results over different
key blocks be merged exactly (`merge_attention`), which is all a ring needs.

Backends of `attention_with_lse`, in the order `auto` tries them:
    flash-attn      CUDA, the flash-attn package when importable (fp16/bf16, head dim <= 256)
    sdpa-flash      CUDA, torch's fused flash kernel that also returns the lse (fp16/bf16)
    sdpa-efficient  CUDA, torch's memory-efficient kernel with compute_log_sumexp (fp32 too)
    sdpa-cudnn      CUDA, cuDNN's fused attention through torch (fp16/bf16, head dim <= 128);
                    last of the CUDA kernels in `auto`, so it runs only when asked for by name
    cpu-flash       CPU, the fused kernel SDPA itself runs on CPU, which returns the lse
    torch           anywhere: plain matmul / logsumexp / matmul, chunked over queries
`CPCOURSE_ATTN_BACKEND=name` states a preference (ignored when that backend cannot take the
inputs); `backend=name` insists and raises `InputError` when it cannot.

The teaching versions (v1 naive softmax ... v4 blockwise attention) live in
`cpcourse.online_softmax` and are re-exported here. The chapter's other modules:
`attention.kernels` (each fused kernel's adapter and the backend choice), `attention.backward`
(the backward from the saved lse, notebook 17) and `attention.triton_kernel` (notebook 02's
appendix: the online softmax as one Triton kernel).
"""

from __future__ import annotations

import math

import torch

from cpcourse.attention.kernels import BACKENDS, ENV_BACKEND, FUSED, attention_backend, lse_dtype
from cpcourse.attention.kernels import why_not as backend_refuses
from cpcourse.online_softmax import (  # noqa: F401  (re-exported teaching versions)
    accumulator_dtype,
    attention_v4_blockwise,
    softmax_v1_naive,
    softmax_v2_safe,
    softmax_v3_online,
)
from cpcourse.support.errors import require
from cpcourse.support.qkv import attention_scale, check_qkv

__all__ = ["BACKENDS", "ENV_BACKEND", "TOLERANCES", "TOLERANCES_LARGE_LOGITS", "accumulator_dtype",
           "attention_backend", "attention_v4_blockwise", "attention_with_lse", "merge_attention",
           "reference_attention", "softmax_v1_naive", "softmax_v2_safe", "softmax_v3_online"]

# Tolerances against the float64 reference computed from the same (already rounded) inputs:
# `|got - want| <= atol + rtol * |want|`, keys: input dtype -> {"out": (atol, rtol), "lse": ...}.
# TOLERANCES: unit-variance entries, scaled logits of order 1-10. Worst errors measured over the
# unit tests' shapes (L up to 3k, D 16..256, all CPU backends and v4) sit 4-10x below:
# out 1.4e-6 (fp32), 4.3e-4 (fp16), 3.8e-3 (bf16); lse 7e-7 (fp32), 3e-5 (fp16 and bf16).
TOLERANCES = {
    torch.float64: {"out": (1e-10, 1e-10), "lse": (1e-10, 1e-10)},
    torch.float32: {"out": (1e-5, 1e-5), "lse": (1e-5, 1e-6)},
    torch.float16: {"out": (2e-3, 2e-3), "lse": (1e-4, 1e-5)},
    torch.bfloat16: {"out": (2e-2, 2e-2), "lse": (1e-4, 1e-5)},
}
# Scaled logits up to 1e4 in magnitude: a logit M carries a rounding error of about M * 2^-24
# even in float32 accumulation, which moves the weights of near-tied keys. Measured worst out
# error 4.3e-3 (fp32), 3.5e-3 (fp16), 8.6e-3 (bf16); lse relative error below 1e-6.
TOLERANCES_LARGE_LOGITS = {
    torch.float64: TOLERANCES[torch.float64],
    torch.float32: {"out": (2e-2, 2e-2), "lse": (1e-3, 5e-6)},
    torch.float16: {"out": (2e-2, 2e-2), "lse": (1e-3, 5e-6)},
    torch.bfloat16: {"out": (4e-2, 4e-2), "lse": (1e-3, 5e-6)},
}

# Plain-torch backend: bound the materialised score block to about this many elements.
_TORCH_CHUNK_ELEMS = 1 << 24


def _no_keys(q, v):
    """Zero keys: nothing to average (out = 0), an empty sum (lse = -inf); zero queries: empty."""
    out = q.new_zeros(*q.shape[:3], v.shape[-1], dtype=v.dtype)
    lse = torch.full(q.shape[:3], -math.inf, dtype=lse_dtype(q.dtype), device=q.device)
    return out, lse


def reference_attention(q, k, v, scale=None):
    """Materialised attention (scores `[B, H, Lq, Lk]`, softmax, weighted sum), for tests/teaching.

    Computes in float64 for float64 inputs and in float32 otherwise; returns `(out, lse)` with
    out `[B, H, Lq, Dv]` in the input dtype and lse `[B, H, Lq]` (float32, float64 for float64).
    Memory: exactly one `Lq x Lk` score matrix per head (the softmax runs in place on it), the
    wall the fused kernels remove; `cpcourse.support.peak_memory` measures it against the cost
    model.
    """
    check_qkv(q, k, v)
    if k.shape[2] == 0 or q.shape[2] == 0:
        return _no_keys(q, v)
    acc = accumulator_dtype(q.dtype)
    scores = q.to(acc) @ k.to(acc).transpose(-2, -1)
    scores.mul_(attention_scale(q, scale))
    row_max = scores.amax(dim=-1, keepdim=True)
    scores.sub_(row_max).exp_()                    # in place: no second L x L matrix
    row_sum = scores.sum(dim=-1, keepdim=True)
    out = (scores @ v.to(acc)).div_(row_sum)
    lse = (row_max + torch.log(row_sum)).squeeze(-1)
    return out.to(q.dtype), lse.to(lse_dtype(q.dtype))


def _torch_attention(q, k, v, scale):
    """Plain torch, chunked over queries so the score block stays near `_TORCH_CHUNK_ELEMS`."""
    acc = accumulator_dtype(q.dtype)
    b, h, lq, _ = q.shape
    kt, va = k.to(acc).transpose(-2, -1), v.to(acc)
    rows = max(1, _TORCH_CHUNK_ELEMS // max(1, b * h * k.shape[2]))
    outs, lses = [], []
    for start in range(0, lq, rows):
        scores = (q[:, :, start:start + rows].to(acc) @ kt) * scale
        lse = torch.logsumexp(scores, dim=-1)
        outs.append((torch.exp(scores - lse.unsqueeze(-1)) @ va).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2).to(lse_dtype(q.dtype))


def _kernel(name: str):
    """The function that runs backend `name`: the plain one here, a fused one's adapter."""
    return _torch_attention if name == "torch" else FUSED[name]


def _all_finite(*tensors) -> bool:
    """No NaN or inf in any tensor. A sum allocates one number where isfinite() would allocate a
    mask of the input's size (which the memory tests see); a finite sum that overflows only
    sends the call down the plain path, which is right anyway."""
    acc = torch.float64 if tensors[0].dtype == torch.float64 else torch.float32
    return all(math.isfinite(float(t.detach().sum(dtype=acc))) for t in tensors)


def attention_with_lse(q, k, v, scale=None, backend=None):
    """Attention and its log-sum-exp on the fastest backend that takes the inputs.

    q `[B, H, Lq, D]`, k `[B, H, Lk, D]`, v `[B, H, Lk, Dv]` -> out `[B, H, Lq, Dv]` (input dtype),
    lse `[B, H, Lq]` float32 (float64 for float64 inputs), where
    `lse[b, h, i] = log(sum_j exp(scale * q[b, h, i] . k[b, h, j]))` and `scale` defaults to
    `1 / sqrt(D)`. Zero keys give out = 0 and lse = -inf (the identity of `merge_attention`).
    """
    check_qkv(q, k, v)
    scale = attention_scale(q, scale)
    if k.shape[2] == 0 or q.shape[2] == 0:
        return _no_keys(q, v)
    name = attention_backend(q, k, v, backend)
    if name == "cpu-flash" and backend is None and not _all_finite(q, k, v):
        # The CPU kernel turns a NaN row into out = 0, lse = 0, which then merges as a real
        # block: take the plain path, which lets NaN show where it came from. (A CPU-only check:
        # on CUDA it would cost a device sync on every call.)
        name = "torch"
    if name != "torch":
        # The fused kernels read strided views wrongly (garbage, NaN, different on every call,
        # when the head dim is not unit-stride): hand them a dense copy. A no-op when contiguous.
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    try:
        return _kernel(name)(q, k, v, scale)
    except RuntimeError:
        # A CUDA kernel may still refuse a layout we did not predict; auto mode falls back to the
        # next one that can run, a forced backend reports the failure as it is.
        if backend is not None or name == "torch":
            raise
        rest = [b for b in BACKENDS[BACKENDS.index(name) + 1:]
                if backend_refuses(b, q, k, v) is None]
        return _kernel(rest[0])(q, k, v, scale)


def merge_attention(out_a, lse_a, out_b, lse_b):
    """Merge two partial attentions over disjoint key sets into the attention over their union.

    out_* `[B, H, L, Dv]`, lse_* `[B, H, L]` -> (out, lse) with
    `lse = log(exp(lse_a) + exp(lse_b))` and
    `out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b`.
    Accumulates in float32 whatever the input dtype (float64 stays float64) and returns out and lse
    in that accumulator dtype, so a chain of merges never rounds to bf16 in between: cast out once
    at the end. A side that saw no keys (lse = -inf) contributes nothing, whatever its out holds;
    both sides empty gives out = 0, lse = -inf, never NaN.
    """
    require(all(isinstance(t, torch.Tensor) for t in (out_a, lse_a, out_b, lse_b)),
            "merge_attention takes tensors (out_a, lse_a, out_b, lse_b), got "
            f"{[type(t).__name__ for t in (out_a, lse_a, out_b, lse_b)]}")
    require(out_a.shape == out_b.shape,
            f"out_a and out_b must have one shape, got {tuple(out_a.shape)} and "
            f"{tuple(out_b.shape)}")
    require(lse_a.shape == lse_b.shape == out_a.shape[:-1],
            f"lse_a and lse_b must be out's shape without its last dim {tuple(out_a.shape[:-1])}, "
            f"got {tuple(lse_a.shape)} and {tuple(lse_b.shape)}")
    acc = accumulator_dtype(torch.promote_types(out_a.dtype, lse_a.dtype))
    lse_a, lse_b = lse_a.to(acc), lse_b.to(acc)
    lse = torch.logaddexp(lse_a, lse_b)
    # Where both sides are empty lse is -inf; subtract 0 there so exp(-inf - 0) = 0, not NaN.
    base = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
    w_a = torch.exp(lse_a - base).unsqueeze(-1)
    w_b = torch.exp(lse_b - base).unsqueeze(-1)
    # 0 * NaN is NaN: an empty side's out may be anything, so mask it rather than weight it.
    part_a = torch.where(w_a > 0, out_a.to(acc), 0.0)
    part_b = torch.where(w_b > 0, out_b.to(acc), 0.0)
    return w_a * part_a + w_b * part_b, lse

