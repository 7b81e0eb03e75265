"""Sending activations in fewer bytes: fp32, bf16 and float8 (e4m3) messages with their scales.

    python -c "from cpcourse.fp8_comm import *; print(codec('fp8').nbytes((2, 4, 16)))"

A CP collective moves q, k, v (and out) between ranks. Engines (xDiT, cache-dit, LightX2V) send
them as float8 e4m3 (1 byte a value, largest 448) with a scale, and dequantize on arrival: about
half the bytes of bf16, outputs no longer bitwise equal. Two scale granularities:
  - per tensor, calibrated once (xDiT: one throwaway forward, then fixed): one float32 per
    message, but a later, larger activation is clipped at 448 x scale;
  - per token and head: one bf16 scale per row of D values (its amax / 448), never clips,
    2 bytes per row on top of D (1.6% at D = 128, 12.5% at the tiny model's D = 16).
A message is one flat uint8 tensor (values, then scales), so the bytes counted are the bytes
sent, scales included, and any backend sends it (gloo on this CPU torch: `gloo_sends_float8`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cpcourse.support.errors import require

E4M3 = torch.float8_e4m3fn
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
COMM_DTYPES = ("fp32", "bf16", "fp8", "fp8-tensor")


@dataclass(frozen=True)
class Codec:
    """How a tensor `[..., D]` travels: `kind` one of COMM_DTYPES; `scale` the calibrated
    per-tensor scale for "fp8-tensor" (values are divided by it, then clipped to +-448)."""

    kind: str = "fp32"
    scale: float | None = None

    def __post_init__(self):
        require(self.kind in COMM_DTYPES, f"comm_dtype must be one of {', '.join(COMM_DTYPES)}, "
                f"got {self.kind!r}")
        require((self.kind == "fp8-tensor") == (self.scale is not None),
                "comm_dtype fp8-tensor needs a calibrated scale (and only it takes one)")
        require(self.scale is None or (math.isfinite(self.scale) and self.scale > 0),
                f"scale must be a positive finite number, got {self.scale!r}")

    @property
    def exact(self) -> bool:
        return self.kind == "fp32"

    def nbytes(self, shape, dtype=torch.float32) -> int:
        """Bytes of the message carrying a tensor of `shape` (scales included)."""
        n = math.prod(shape)
        if self.kind == "fp32":
            return n * torch.empty(0, dtype=dtype).element_size()
        if self.kind == "bf16":
            return 2 * n
        if self.kind == "fp8-tensor":
            return n + 4
        return n + 2 * (n // shape[-1] if shape[-1] else 0)   # one bf16 scale per row

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x `[..., D]` -> a flat uint8 message of `nbytes(x.shape, x.dtype)` bytes."""
        x = x.contiguous()
        if self.kind == "fp32":
            return x.reshape(-1).view(torch.uint8)
        if self.kind == "bf16":
            return x.to(torch.bfloat16).reshape(-1).view(torch.uint8)
        if self.kind == "fp8-tensor":
            scale = torch.tensor([self.scale], dtype=torch.float32)
            vals = _to_e4m3(x.float() / scale)
            return torch.cat([vals.reshape(-1).view(torch.uint8), scale.view(torch.uint8)])
        amax = x.float().abs().amax(dim=-1, keepdim=True)
        # the scale as sent (bf16-rounded) is the one the values are divided by: decode inverts
        # exactly what encode did; an all-zero row gets scale 1
        scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0).to(torch.bfloat16)
        vals = _to_e4m3(x.float() / scale.float())
        return torch.cat([vals.reshape(-1).view(torch.uint8), scale.reshape(-1).view(torch.uint8)])

    def decode(self, buf: torch.Tensor, shape, dtype=torch.float32) -> torch.Tensor:
        """The inverse of `encode` (up to rounding): a tensor of `shape` in `dtype`."""
        n = math.prod(shape)
        if self.kind == "fp32":
            return _view(buf, dtype).reshape(shape)
        if self.kind == "bf16":
            return _view(buf, torch.bfloat16).reshape(shape).to(dtype)
        vals = buf[:n].view(E4M3).float().reshape(shape)
        if self.kind == "fp8-tensor":
            return (vals * _view(buf[n:], torch.float32)).to(dtype)
        scale = _view(buf[n:], torch.bfloat16).float().reshape(*shape[:-1], 1)
        return (vals * scale).to(dtype)


def _view(buf: torch.Tensor, dtype) -> torch.Tensor:
    """buf's bytes as dtype; a slice of a received buffer may start at an odd byte: copy it."""
    if buf.storage_offset() % torch.empty(0, dtype=dtype).element_size():
        buf = buf.clone()
    return buf.view(dtype)


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Clip to e4m3's range, then round: a calibrated scale that is too small clips here."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def codec(kind: str = "fp32", scale: float | None = None) -> Codec:
    return Codec(kind, scale)


def calibrated_scale(amax: float, safety: float = 0.85) -> float:
    """The per-tensor scale from one calibration run's largest |value|: amax / (448 x safety)
    (xDiT's `--fp8_comms_safety_factor` defaults to 0.85: headroom for later, larger values)."""
    require(amax > 0 and math.isfinite(amax), f"amax must be positive and finite, got {amax!r}")
    return float(amax) / (E4M3_MAX * safety)


def roundtrip(x: torch.Tensor, c: Codec) -> torch.Tensor:
    """What arrives when x is sent with codec c (in x's dtype)."""
    return c.decode(c.encode(x), x.shape, x.dtype)


def gloo_sends_float8(group=None) -> bool:
    """Inside ranks: whether this torch's backend moves float8 tensors in a collective (an
    all-gather of one float8 value per rank arriving intact). If not, send the uint8 view."""
    import torch.distributed as dist

    mine = torch.tensor([float(dist.get_rank(group) + 1)]).to(E4M3)
    got = [torch.empty(1, dtype=E4M3) for _ in range(dist.get_world_size(group))]
    try:
        dist.all_gather(got, mine, group=group)
    except (RuntimeError, TypeError, ValueError):
        return False
    return [float(g.float()) for g in got] == [float(r + 1) for r in range(len(got))]


def planted_clipping(growth: float = 4.0, seed: int = 0, shape=(2, 64, 16)) -> dict:
    """A once-calibrated scale meeting a later, larger activation (a planted case).

    Calibrate the per-tensor scale on a first step's activations x0 `shape` (unit normal), then
    send a later step's x1 = growth x (unit normal): values above 448 x scale are clipped. The
    per-token-and-head scale follows each row's own amax and does not clip. Returns the
    fraction of x1's values clipped and the largest |error| of each codec, relative to max |x1|.
    """
    g = torch.Generator().manual_seed(seed)
    first = torch.randn(*shape, generator=g)
    later = torch.randn(*shape, generator=g) * growth
    tensor = Codec("fp8-tensor", calibrated_scale(float(first.abs().max())))
    peak = float(later.abs().max())
    errs = {name: float((roundtrip(later, c) - later).abs().max()) / peak
            for name, c in (("tensor", tensor), ("token", Codec("fp8")))}
    clipped = float((later.abs() > E4M3_MAX * tensor.scale).double().mean())
    return {"growth": growth, "clipped_fraction": clipped,
            "rel_err_calibrated_tensor": errs["tensor"], "rel_err_per_token": errs["token"]}
