"""Attention kernels as deployed at the released shapes; the ring's split cost at its true shape.

    cpcourse bench gpu --parts attention,ring --json   # on a CUDA machine, about 70 s
    cpcourse bench gpu --dry-run --parts attention,ring --json   # CPU, tiny sizes

`attention_part` times every kernel that runs at three released self-attention shapes (a
shape's tokens are its video tokens plus its text tokens where the model joins them):
  Wan2.1 14B     40 heads x 128, 75,600 tokens (720p x 81 frames: 21 x 45 x 80 latent patches)
  HunyuanVideo   24 heads x 128, 119,056 tokens (118,800 video + 256 text), unmasked; with its
                 text key-padding mask (what diffusers runs: flash refuses a mask); and with the
                 padding dropped, as the released code's flash-attn varlen call does
  CogVideoX-5B   48 heads x 64, 17,776 tokens (13 x 30 x 45 video + 226 text)
The kernels: `cpcourse.attention`'s (SDPA's flash, cuDNN, memory-efficient; flash-attn if
installed), SDPA's math kernel where its score matrix fits, and the course's Triton kernel
(`cpcourse.attention.triton_kernel`). flash-attn's wheels are not measured: FlashAttention-2
must be compiled for hours and FlashAttention-4's CUTLASS DSL libraries exceed the 64 MiB of
files that can be carried to the GPU machine. Beside each shape: the planner's seconds for its
kernels (fa2, fa3, sdpa) at their planned share of the bf16 peak.

`ring_part` is what one ring rank computes: n = L / P queries against P key blocks of n (the
rank's own and P - 1 arriving), each block's (out, lse) folded in place into an fp32 running
output, the fold the planner charges (`MERGE_BYTES_PER_ELEMENT` bytes per element of out),
against one call over all P n keys; P = 2, 4, 8 at Wan 14B's shape, per kernel.
"""

from __future__ import annotations

import math
import time

import torch

from cpcourse.attention import attention_with_lse, triton_kernel
from cpcourse.planner.deployment import MERGE_BYTES_PER_ELEMENT
from cpcourse.planner.hardware import KERNELS, get_gpu, kernel_efficiency
from cpcourse.support.errors import InputError
from tools.gpu_check.kernels import backends_present, median, timed

# (label, preset, heads, head dim, tokens, text tokens at the end of the sequence)
REAL_SHAPES = (("wan14b", "wan2.1-t2v-14b", 40, 128, 75_600, 0),
               ("hunyuanvideo", "hunyuanvideo-13b", 24, 128, 119_056, 256),
               ("cogvideox5b", "cogvideox-5b", 48, 64, 17_776, 226))
TINY_SHAPES = (("wan14b", "wan2.1-t2v-14b", 2, 16, 97, 0),
               ("hunyuanvideo", "hunyuanvideo-13b", 2, 16, 113, 16),
               ("cogvideox5b", "cogvideox-5b", 3, 16, 71, 9))
# HunyuanVideo pads its prompt to 256 tokens; how many are padding depends on the prompt. Half
# is assumed (a mid-length prompt); the mask's cost hardly depends on the count.
PADDED_SHARE = 0.5
MATH_MAX_SCORE_BYTES = 8e9  # SDPA's math kernel materialises H x L x L scores: beyond, skipped
PLANNER_KERNEL = {"sdpa-flash": "fa2", "flash-attn": "fa2", "sdpa-cudnn": "sdpa"}
FLASH_ATTN_NOTE = ("flash-attn's FA2/FA3/FA4 not measured: FlashAttention-2 must be compiled for "
                   "hours, FlashAttention-4's CUTLASS DSL libraries exceed the 64 MiB of files "
                   "that can be carried to the GPU machine")
ERRORS = (RuntimeError, InputError, ValueError)


def _qkv(heads: int, length: int, head_dim: int, dtype, device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(1, heads, length, head_dim, generator=gen, device=device, dtype=dtype)
            for _ in range(3)]


def _error(exc) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"


def kernels_here(device, dtype) -> list[str]:
    """The lse-returning kernels that run here: `cpcourse.attention`'s, then the Triton one."""
    return backends_present(device, dtype) + ([] if triton_kernel.why_not() else ["triton"])


def call(name: str, q, k, v):
    """(out, lse) from kernel `name`; 'triton' is the course's own."""
    if name == "triton":
        try:
            return triton_kernel.attention_with_lse_triton(q, k, v)
        except (InputError, RuntimeError):
            raise
        except Exception as exc:  # Triton's compiler raises its own types: record, go on
            raise RuntimeError(f"triton: {type(exc).__name__}: {exc}") from exc
    return attention_with_lse(q, k, v, backend=name)


def _sdpa(q, k, v, backend: str, mask=None):
    """SDPA held to one of its kernels ('math', 'cudnn', 'efficient', 'flash'); out only."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION,
             "efficient": SDPBackend.EFFICIENT_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    with sdpa_kernel(which[backend]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def timing(fn, device, repeat: int, flops: float, peak: float) -> dict:
    secs = timed(fn, device, warmup=1, repeat=repeat)
    mid = median(secs)
    return {"seconds": mid, "seconds_min": min(secs), "seconds_max": max(secs),
            "tflops": flops / mid / 1e12, "share_of_peak": flops / mid / 1e12 / peak}


def predictions(gpu_id: str, flops: float) -> dict:
    """The planner's seconds for `flops` of attention under each kernel it knows, on gpu_id."""
    peak = get_gpu(gpu_id).bf16_tflops * 1e12
    out = {}
    for k in KERNELS:
        eff, source = kernel_efficiency(gpu_id, k)
        out[k] = {"seconds": flops / (peak * eff) if eff else None, "share": eff,
                  "source": source}
    return out


def _row(name, fn, device, repeat, flops, peak, pred) -> dict:
    row = {"kernel": name}
    try:
        row.update(timing(fn, device, repeat, flops, peak))
        k = PLANNER_KERNEL.get(name)
        if k and pred[k]["seconds"]:
            row.update(planner_kernel=k, predicted_seconds=pred[k]["seconds"],
                       measured_over_predicted=row["seconds"] / pred[k]["seconds"])
    except ERRORS as exc:
        row["error"] = _error(exc)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def _shape_rows(shape, device, dtype, repeat, peak, gpu_id) -> dict:
    label, model, heads, d, n, text = shape
    q, k, v = _qkv(heads, n, d, dtype, device, seed=n)
    flops = 4 * heads * n * n * d
    pred = predictions(gpu_id, flops)
    rows = [_row(name, lambda name=name: call(name, q, k, v), device, repeat, flops, peak, pred)
            for name in kernels_here(device, dtype)]
    if heads * n * n * 4 <= MATH_MAX_SCORE_BYTES:
        rows.append(_row("sdpa-math", lambda: _sdpa(q, k, v, "math"), device, repeat, flops,
                         peak, pred))
    else:
        rows.append({"kernel": "sdpa-math", "skipped": f"its {heads} x {n}^2 scores would need "
                     f"{heads * n * n * 4 / 1e9:.0f} GB"})
    out = {"model": model, "heads": heads, "head_dim": d, "tokens": n, "flops": flops,
           "predicted": pred, "rows": rows, "agreement": _agreement(q, k, v, device)}
    if text:
        out["masked"] = _masked(q, k, v, text, device, repeat, peak, pred, flops)
    return out


def _agreement(q, k, v, device) -> dict:
    """Each kernel's largest out and lse difference from the first one's, at this shape (the
    Triton kernel's check at the real size; its tolerance test is tests/gpu)."""
    names = kernels_here(device, q.dtype)
    out = {}
    try:
        ref_o, ref_s = call(names[0], q, k, v)
        for name in names[1:]:
            o, s = call(name, q, k, v)
            out[name] = {"against": names[0],
                         "max_out_diff": float((o.float() - ref_o.float()).abs().max()),
                         "max_lse_diff": float((s.float() - ref_s.float()).abs().max())}
            o = s = None
    except ERRORS as exc:
        out["error"] = _error(exc)
    return out


def _masked(q, k, v, text, device, repeat, peak, pred, flops) -> dict:
    """HunyuanVideo's text padding: SDPA with a key-padding mask, and the padding dropped."""
    pad = int(text * PADDED_SHARE)
    n = k.shape[2]
    mask = torch.ones(1, 1, 1, n, device=device, dtype=torch.bool)
    mask[..., n - pad:] = False
    rows = [_row(f"sdpa-{b}+mask", lambda b=b: _sdpa(q, k, v, b, mask), device, repeat, flops,
                 peak, pred) for b in (("cudnn", "efficient") if device.type == "cuda"
                                       else ("math",))]
    kk, vv = k[:, :, :n - pad].contiguous(), v[:, :, :n - pad].contiguous()
    # Dropping the padded keys is what flash-attn's varlen call does; the FLOPs are fewer
    keep = flops * (n - pad) / n
    rows += [_row(f"{name}, padding dropped", lambda name=name: call(name, q, kk, vv), device,
                  repeat, keep, peak, pred) for name in kernels_here(device, q.dtype)]
    return {"padded_text_tokens": pad, "padded_share_assumed": PADDED_SHARE,
            "note": "the +mask rows return no lse (SDPA's API); FLOPs counted over all keys",
            "rows": rows}


def attention_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'attention': per released shape, every kernel's seconds and share of peak."""
    dtype = torch.float32 if dry else torch.bfloat16
    peak = get_gpu(gpu_id).bf16_tflops
    shapes = []
    for shape in (TINY_SHAPES if dry else REAL_SHAPES):
        if time.monotonic() > deadline:
            shapes.append({"model": shape[1], "skipped": "past the --budget"})
            continue
        shapes.append(_shape_rows(shape, device, dtype, repeat, peak, gpu_id))
    return {"dtype": str(dtype), "peak_tflops": peak, "shapes": shapes,
            "triton": triton_kernel.why_not() or "compiled and timed",
            "flash_attn_wheels": FLASH_ATTN_NOTE}


def fold(out, lse, o, s) -> None:
    """One block folded into the fp32 running (out, lse) in place (the in-place merge the
    planner prices): lse' = lse + softplus(s - lse), out' = out - sigmoid(s - lse) (out - o)."""
    d = s - lse
    out.sub_(torch.sigmoid(d).unsqueeze(-1) * (out - o.float()))
    lse.sub_(torch.nn.functional.logsigmoid(-d))


def ring_blocks(name: str, q, k, v, p: int):
    """What one ring rank computes: q against p key blocks, each folded in as it arrives."""
    out = lse = None
    for kb, vb in zip(k.chunk(p, dim=2), v.chunk(p, dim=2), strict=True):
        o, s = call(name, q, kb, vb)
        if out is None:
            out, lse = o.float(), s.float().clone()
        else:
            fold(out, lse, o, s)
    return out, lse


def _ring_row(name, p, q, k, v, device, repeat, hbm, pred) -> dict:
    n, heads, d = q.shape[2], q.shape[1], q.shape[3]
    row = {"kernel": name, "blocks": p, "queries": n, "keys": k.shape[2]}
    try:
        fused = median(timed(lambda: call(name, q, k, v), device, repeat=repeat))
        split = median(timed(lambda: ring_blocks(name, q, k, v, p), device, repeat=repeat))
        o, s = call(name, q, k[:, :, :n], v[:, :, :n])
        acc, lse = o.float(), s.float().clone()
        folds = median(timed(lambda: [fold(acc, lse, o, s) for _ in range(p - 1)], device,
                             repeat=repeat))
        planned = (p - 1) * MERGE_BYTES_PER_ELEMENT * n * heads * d / hbm
        ref, ref_lse = call(name, q, k, v)
        got, got_lse = ring_blocks(name, q, k, v, p)
        row.update(seconds_fused=fused, seconds_split=split, ratio=split / fused,
                   seconds_folds=folds, predicted_fold_seconds=planned,
                   folds_over_predicted=folds / planned,
                   max_abs_diff=float((got - ref.float()).abs().max()),
                   max_lse_diff=float((got_lse - ref_lse.float()).abs().max()))
        kern = PLANNER_KERNEL.get(name)
        if kern and pred[kern]["seconds"]:  # the planner's rank: P blocks' FLOPs + P - 1 folds
            row.update(planner_kernel=kern,
                       predicted_split_seconds=pred[kern]["seconds"] + planned,
                       split_over_predicted=split / (pred[kern]["seconds"] + planned))
    except ERRORS as exc:
        row["error"] = _error(exc)
    return row


def ring_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'ring': per kernel and P, a ring rank's blocks + folds over one fused call."""
    dtype = torch.float32 if dry else torch.bfloat16
    _, model, heads, d, total, _ = (TINY_SHAPES if dry else REAL_SHAPES)[0]
    hbm = get_gpu(gpu_id).hbm_tbps * 1e12
    rows = []
    for p in (2, 4, 8):
        n = math.ceil(total / p)
        q = _qkv(heads, n, d, dtype, device, seed=p)[0]
        k, v = _qkv(heads, p * n, d, dtype, device, seed=p + 1)[1:]
        for name in kernels_here(device, dtype):
            if time.monotonic() > deadline:
                rows.append({"kernel": name, "blocks": p, "skipped": "past the --budget"})
                continue
            rows.append(_ring_row(name, p, q, k, v, device, repeat, hbm,
                                  predictions(gpu_id, 4 * heads * n * p * n * d)))
        q = k = v = None
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": model, "heads": heads, "head_dim": d, "tokens": total, "dtype": str(dtype),
            "merge_bytes_per_element": MERGE_BYTES_PER_ELEMENT, "hbm_tbps": hbm / 1e12,
            "rows": rows}
