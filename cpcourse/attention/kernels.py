"""The fused attention kernels behind `cpcourse.attention.attention_with_lse`, and the choice.

    python -m pytest tests/unit/test_attention.py -q -k backend

Each adapter is the only place its private op's signature appears, and returns out
`[B, H, Lq, Dv]` in the input dtype and lse `[B, H, Lq]` (float32; float64 for float64 inputs).
`why_not(name, q, k, v)` says why a backend cannot take given inputs (None: it can), and
`attention_backend` picks the first that can, in `BACKENDS` order (the table in
`cpcourse.attention`'s docstring); `CPCOURSE_ATTN_BACKEND` states a preference.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from cpcourse.support.errors import InputError, require

BACKENDS = ("flash-attn", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "cpu-flash", "torch")
_CPU_ORDER = ("cpu-flash", "torch")  # the CUDA kernels never take CPU tensors: skip asking
ENV_BACKEND = "CPCOURSE_ATTN_BACKEND"


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The lse's dtype for inputs of `dtype`: float64 keeps the reference exact."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cpu_flash(q, k, v, scale):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, scale=scale)
    return out, lse.to(lse_dtype(q.dtype))


def _sdpa_flash(q, k, v, scale):
    res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False,
                                                             scale=scale)
    return res[0], res[1][..., : q.shape[2]].float()


def _sdpa_efficient(q, k, v, scale):
    res = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, scale=scale)
    # The kernel pads lse's last dim up to a multiple of 32: keep the real queries only.
    return res[0], res[1][..., : q.shape[2]].float()


def _sdpa_cudnn(q, k, v, scale):
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, scale=scale)
    lse = res[1]
    # cuDNN keeps a trailing unit dim on lse ([B, H, Lq, 1]); some versions drop it.
    lse = lse[..., 0] if lse.dim() == 4 else lse
    return res[0], lse[..., : q.shape[2]].float()


def _flash_attn(q, k, v, scale):
    from flash_attn import flash_attn_func

    # flash-attn wants [B, L, H, D]; transposes are views (it only needs a unit last stride).
    res = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          softmax_scale=scale, return_attn_probs=True)
    return res[0].transpose(1, 2), res[1][..., : q.shape[2]].float()


# backend -> adapter (q, k, v, scale) -> (out, lse); "torch" is `cpcourse.attention`'s own
FUSED = {"flash-attn": _flash_attn, "sdpa-flash": _sdpa_flash,
         "sdpa-efficient": _sdpa_efficient, "sdpa-cudnn": _sdpa_cudnn, "cpu-flash": _cpu_flash}


def why_not(name: str, q, k, v) -> str | None:
    """None when backend `name` takes these inputs, else the reason it does not."""
    d, dv, half = q.shape[-1], v.shape[-1], (torch.float16, torch.bfloat16)
    if name == "torch":
        return None
    if 0 in q.shape or 0 in k.shape or 0 in v.shape:
        # An empty batch, head or head dim kills the process (SIGFPE) inside the CPU kernel.
        return "an empty dimension (the fused kernels crash on empty tensors)"
    if name == "cpu-flash":
        if q.device.type != "cpu":
            return f"it runs on CPU tensors, these are on {q.device}"
        return None if d == dv else f"it needs v's head dim equal to q's ({dv} != {d})"
    if q.device.type != "cuda":
        return f"it runs on CUDA tensors, these are on {q.device}"
    if name == "flash-attn" and importlib.util.find_spec("flash_attn") is None:
        return "the flash_attn package is not installed"
    if name in ("flash-attn", "sdpa-flash"):
        if q.dtype not in half:
            return f"it takes fp16/bf16, got {q.dtype}"
        if max(d, dv) > 256 or d % 8 or dv % 8:
            return f"it takes head dims <= 256 that are multiples of 8, got {d}/{dv}"
        return None
    if name == "sdpa-cudnn":
        if q.dtype not in half:
            return f"it takes fp16/bf16, got {q.dtype}"
        if max(d, dv) > 128 or d % 8 or dv % 8:
            return f"it takes head dims <= 128 that are multiples of 8, got {d}/{dv}"
        if not torch.backends.cudnn.is_available():
            return "torch was built without cuDNN"
        return None
    if q.dtype == torch.float64:  # sdpa-efficient
        return "it takes fp32/fp16/bf16, got float64"
    if d % 8 or dv % 8:
        return f"it needs head dims that are multiples of 8, got {d}/{dv}"
    return None


def attention_backend(q, k=None, v=None, backend=None) -> str:
    """The backend `attention_with_lse(q, k, v, backend=backend)` runs; k, v default to q."""
    k = q if k is None else k
    v = k if v is None else v
    if backend is not None:
        require(backend in BACKENDS,
                f"unknown attention backend {backend!r}: use one of {BACKENDS}")
        reason = why_not(backend, q, k, v)
        if reason:
            raise InputError(f"backend {backend!r} cannot run these inputs: {reason}; "
                             "pass backend=None to choose automatically")
        return backend
    preferred = os.environ.get(ENV_BACKEND, "").strip()
    if preferred:
        require(preferred in BACKENDS,
                f"{ENV_BACKEND}={preferred!r} is not a backend: use one of {BACKENDS}")
        if why_not(preferred, q, k, v) is None:
            return preferred
    candidates = _CPU_ORDER if q.device.type == "cpu" else BACKENDS
    return next(name for name in candidates if why_not(name, q, k, v) is None)
