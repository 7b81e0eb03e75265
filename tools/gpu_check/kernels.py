"""The attention kernel's rate at video shapes, and what splitting it into blocks costs.

    cpcourse bench gpu --json            # runs this as one part of the GPU check
    cpcourse bench gpu --dry-run --json  # the same code on the CPU at tiny sizes

`kernel_rates` times `attention_with_lse` on every backend present at one head shape (Wan 14B's
40 heads x 128) and several L: the full 720p sequence (75,600 tokens) and one ring block of it
under CP 2, 4, 8 (L / P tokens attending to L / P keys), plus a round 8,192. TFLOP/s counts the
two matmuls, 4 B H Lq Lk D, over the median time; its share of the card's dense bf16 peak is the
number the planner borrows from papers (FlashAttention-2: 35% of an H100, FlashAttention-3: 70%).
`matmul_rate` is the ceiling a kernel could reach: a large bf16 matmul on the same card.
`split_cost` is the blockwise price the ring pays: the same queries against P key blocks, each
block's (out, lse) merged into the running result, against one fused call over all the keys.
"""

from __future__ import annotations

import math
import time

import torch

from cpcourse.attention import BACKENDS, attention_backend, attention_with_lse, merge_attention
from cpcourse.support.errors import InputError

# Wan2.1 14B at 720p x 81 frames: 21 x 45 x 80 = 75,600 tokens, 40 heads of 128.
REAL = {"heads": 40, "head_dim": 128, "tokens": 75_600, "cp": (1, 2, 4, 8), "extra": (8_192,),
        "split": (2, 4, 8), "matmul": 8_192, "copy_bytes": 4 << 30, "dtype": torch.bfloat16}
TINY = {"heads": 2, "head_dim": 16, "tokens": 96, "cp": (1, 2), "extra": (64,), "split": (2, 3),
        "matmul": 128, "copy_bytes": 1 << 20, "dtype": torch.float32}


def timed(fn, device: torch.device, warmup: int = 1, repeat: int = 3) -> list[float]:
    """Seconds of each of `repeat` calls of fn() after `warmup` untimed ones: CUDA events on a GPU
    (kernels are asynchronous), the host clock on a CPU."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else 0.5 * (xs[mid - 1] + xs[mid])


def _qkv(heads: int, length: int, head_dim: int, dtype, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(1, heads, length, head_dim, generator=gen, device=device, dtype=dtype)
            for _ in range(3)]


def backends_present(device: torch.device, dtype) -> list[str]:
    """The backends of `attention_with_lse` that take `[1, 1, 8, 64]` inputs on this device."""
    probe = torch.empty(1, 1, 8, 64, device=device, dtype=dtype)
    names = []
    for name in BACKENDS:
        if name == "torch" and device.type == "cuda":
            continue  # the teaching fallback: it materialises score blocks, no one deploys it
        try:
            attention_backend(probe, backend=name)
        except InputError:
            continue
        names.append(name)
    return names


def lengths(sizes: dict) -> list[tuple[str, int]]:
    """(label, L) pairs: the full sequence and one ring block of it under each CP degree."""
    out = [(f"cp{p}" if p > 1 else "full", math.ceil(sizes["tokens"] / p)) for p in sizes["cp"]]
    return out + [("round", n) for n in sizes["extra"]]


def kernel_rates(device: torch.device, peak_tflops: float, sizes: dict, repeat: int = 3) -> list:
    """One row per (backend, L): median seconds, TFLOP/s and share of the bf16 peak; a backend
    that fails at run time gets a row with its error instead of stopping the check."""
    rows = []
    dtype = sizes["dtype"]
    for name in backends_present(device, dtype):
        for label, n in lengths(sizes):
            row = {"backend": name, "shape": label, "heads": sizes["heads"],
                   "head_dim": sizes["head_dim"], "tokens": n}
            try:
                qkv = _qkv(sizes["heads"], n, sizes["head_dim"], dtype, device, seed=n)
                secs = median(timed(lambda qkv=qkv, name=name: attention_with_lse(
                    *qkv, backend=name), device, repeat=repeat))
                flops = 4 * sizes["heads"] * n * n * sizes["head_dim"]
                row.update(seconds=secs, tflops=flops / secs / 1e12,
                           share_of_peak=flops / secs / 1e12 / peak_tflops)
            except (RuntimeError, InputError) as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            rows.append(row)
            qkv = None  # free before the next, larger shape
    return rows


def matmul_rate(device: torch.device, n: int, dtype) -> dict:
    """The card's achievable matmul rate: an n x n x n product on random data (zeros run faster
    on some GPUs, and would flatter the ceiling)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen, device=device, dtype=dtype) for _ in range(2))
    secs = median(timed(lambda: a @ b, device, warmup=2, repeat=5))
    return {"n": n, "seconds": secs, "tflops": 2 * n ** 3 / secs / 1e12}


def _blockwise(q, k, v, p: int, name: str):
    """The ring's arithmetic without the ring: attend to each of p key blocks, fold each in."""
    out = lse = None
    for kb, vb in zip(k.tensor_split(p, dim=2), v.tensor_split(p, dim=2), strict=True):
        o, s = attention_with_lse(q, kb, vb, backend=name)
        out, lse = (o.float(), s) if out is None else merge_attention(out, lse, o, s)
    return out.to(q.dtype), lse


def split_cost(device: torch.device, sizes: dict, name: str, repeat: int = 3) -> list:
    """Per P: seconds of P blocks plus P - 1 merges over the seconds of one fused call."""
    dtype = sizes["dtype"]
    q, k, v = _qkv(sizes["heads"], sizes["tokens"], sizes["head_dim"], dtype, device, seed=1)
    fused = median(timed(lambda: attention_with_lse(q, k, v, backend=name), device,
                         repeat=repeat))
    rows = []
    for p in sizes["split"]:
        secs = median(timed(lambda p=p: _blockwise(q, k, v, p, name), device, repeat=repeat))
        rows.append({"backend": name, "tokens": sizes["tokens"], "blocks": p,
                     "seconds_blockwise": secs, "seconds_fused": fused, "ratio": secs / fused})
    return rows


def copy_rate(device: torch.device, nbytes: int) -> dict:
    """The memory ceiling: a device-to-device copy, counting bytes read plus bytes written."""
    x = torch.empty(nbytes // 2, device=device, dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    secs = median(timed(lambda: y.copy_(x), device, warmup=2, repeat=5))
    return {"bytes": 2 * x.numel() * 2, "seconds": secs, "tbps": 4 * x.numel() / secs / 1e12}
