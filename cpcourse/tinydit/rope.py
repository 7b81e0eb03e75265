"""3D rotary position embeddings for video tokens, right under a T split.

    python -m pytest tests/unit/test_video_rope.py -q

A token at frame t, row y, column x of the latent grid rotates pairs of its head-dim channels
by angles `pos * freq`: the first `pairs_t` channel pairs by t, the next `pairs_hw` by y, the
last `pairs_hw` by x (`pairs_hw = (D // 2) // 3`, `pairs_t` the rest). Attention scores then
depend only on position differences, which is why rotary is the video default (Wan, HunyuanVideo,
Cosmos, Step-Video).

Rotary embeddings are RoFormer's (Su et al. 2021, https://arxiv.org/abs/2104.09864, base
10000); the split over (t, y, x) is Wan's (diffusers' `WanRotaryPosEmbed`: y and x get
2 * (D // 6) channels each, t the rest).

Under CP each rank holds frames `[t0, t0 + T_r)`: it must rotate by the GLOBAL frame index
t0 + t, not its local t. Rotating by the local index (every shard starting at 0) is the classic
silent bug: every rank's outputs look plausible, and the model sees P copies of frames 0..T_r-1.
`frame_offset` in `cpcourse.video` gives t0.
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import require


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Channel pairs given to (t, y, x) for head dim D (even): t gets what the thirds leave."""
    require(head_dim % 2 == 0 and head_dim >= 6,
            f"3D rotary needs an even head dim >= 6, got {head_dim}")
    pairs = head_dim // 2
    hw = pairs // 3
    return pairs - 2 * hw, hw, hw


def _freqs(pairs: int, base: float) -> torch.Tensor:
    return base ** (-torch.arange(pairs, dtype=torch.float64) / pairs)


def rope_angles(frames: int, height: int, width: int, head_dim: int, frame_offset: int = 0,
                base: float = 10000.0, row_offset: int = 0) -> torch.Tensor:
    """Angles `[T, S, D/2]` (float64) for frames `frame_offset .. frame_offset + frames - 1`
    of an `height x width` token grid (S = height * width, (y, x) row-major) whose first row is
    global row `row_offset` (a rank holding a band of rows)."""
    t = torch.arange(frame_offset, frame_offset + frames)
    y = torch.arange(row_offset, row_offset + height).repeat_interleave(width)
    x = torch.arange(width).repeat(height)
    grid = torch.stack([t[:, None].expand(-1, height * width), y[None].expand(frames, -1),
                        x[None].expand(frames, -1)], dim=-1)  # [T, S, 3]: (t, y, x) per token
    return rope_angles_at(grid, head_dim, base)


def rope_angles_at(positions: torch.Tensor, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angles `[..., D/2]` (float64) for tokens at `positions [..., 3]`, their (t, y, x): what a
    rank holding any set of tokens (a piece of a frame, say) rotates by."""
    pt, ph, pw = rope_split(head_dim)
    pos = positions.to(torch.float64)
    # [..., 1] x [pairs] per axis, joined: [..., pt + ph + pw] = [..., D/2]
    return torch.cat([pos[..., i, None] * _freqs(n, base)
                      for i, n in enumerate((pt, ph, pw))], dim=-1)


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2i, 2i+1) of `x [..., T, S, D]` by `angles [T, S, D/2]`."""
    require(x.shape[-3:-1] == angles.shape[:2] and x.shape[-1] == 2 * angles.shape[-1],
            f"x [..., T, S, D] {tuple(x.shape)} does not match angles [T, S, D/2] "
            f"{tuple(angles.shape)}")
    cos, sin = (f(angles).to(device=x.device, dtype=x.dtype) for f in (torch.cos, torch.sin))
    even, odd = x[..., 0::2], x[..., 1::2]  # [..., T, S, D/2] each
    # [..., T, S, D/2, 2] -> [..., T, S, D]: each rotated pair back in place
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_3d(x: torch.Tensor, height: int, width: int, frame_offset: int = 0,
            base: float = 10000.0, row_offset: int = 0) -> torch.Tensor:
    """3D rotary on a video `[B, H, T_r, S, D]` whose first frame is global frame `frame_offset`.

    Under CP pass `frame_offset = cpcourse.video.frame_offset(T, rank, P)`; then the shards of
    `rope_3d(whole)` equal `rope_3d(shard, frame_offset=t0)` exactly.
    """
    require(x.dim() == 5, f"x must be [B, H, T, S, D], got {tuple(x.shape)}")
    require(x.shape[3] == height * width,
            f"S = {x.shape[3]} tokens per frame but height * width = {height * width}")
    return apply_rope(x, rope_angles(x.shape[2], height, width, x.shape[-1], frame_offset, base,
                                     row_offset))
