"""Rotary tables of a frame shard: positions start at the shard's first global frame.

    python -m pytest tests/unit/test_models.py -q -k rotary

A model under CP sees only its own latent frames f0 .. f0 + nf - 1. Calling the model's rotary
module on the shard would number them 0 .. nf - 1 on every rank: no error, just a wrong video
(notebook 08 measures how wrong). These functions build the shard's rows of the full table
directly, without the full table: its memory falls as 1/P like the tokens'.
Token order in all three models is (frame, row, column), so a frame shard is one token range.
"""

from __future__ import annotations

import torch

from cpcourse.support.errors import require


def wan_rope_shard(rope, f0: int, nf: int, pph: int, ppw: int):
    """Wan's (cos, sin), each `[1, nf * pph * ppw, 1, D]`, for latent frames f0 .. f0 + nf - 1.

    `rope` is the model's `WanRotaryPosEmbed`: `freqs_cos` / `freqs_sin` `[max_seq_len, D]`
    hold the frame, row and column parts side by side (widths `t_dim`, `h_dim`, `w_dim`). Row
    `i` of a part is position `i` on that axis. Equals rows f0 * pph * ppw onward of
    `rope(latents)` for the whole video.
    """
    require(f0 >= 0 and nf >= 1 and f0 + nf <= rope.max_seq_len
            and max(pph, ppw) <= rope.max_seq_len,
            f"Wan's rotary table has {rope.max_seq_len} positions per axis: frames {f0} .. "
            f"{f0 + nf - 1} and a {pph} x {ppw} grid need rope_max_seq_len >= "
            f"{max(f0 + nf, pph, ppw)}")
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    tables = []
    for full in (rope.freqs_cos, rope.freqs_sin):
        t, h, w = full.split(sizes, dim=1)  # [max_seq_len, t_dim], [.., h_dim], [.., w_dim]
        # each axis' rows broadcast over the (nf, pph, ppw) grid: [nf, pph, ppw, D]
        grid = torch.cat([t[f0:f0 + nf].view(nf, 1, 1, -1).expand(nf, pph, ppw, -1),
                          h[:pph].view(1, pph, 1, -1).expand(nf, pph, ppw, -1),
                          w[:ppw].view(1, 1, ppw, -1).expand(nf, pph, ppw, -1)], dim=-1)
        tables.append(grid.reshape(1, nf * pph * ppw, 1, -1))  # [1, L_r, 1, D]
    return tables[0], tables[1]


def hunyuan_rope_shard(rope, f0: int, nf: int, pph: int, ppw: int, device=None):
    """HunyuanVideo's (cos, sin), each `[nf * pph * ppw, D]`, for latent frames f0 .. f0 + nf - 1.

    `rope` is the model's `HunyuanVideoRotaryPosEmbed`: per axis, a 1-D table of the axis'
    positions (`rope.rope_dim` channels each, base `rope.theta`), concatenated over channels.
    """
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    axes = [torch.arange(f0, f0 + nf, device=device, dtype=torch.float32),
            torch.arange(pph, device=device, dtype=torch.float32),
            torch.arange(ppw, device=device, dtype=torch.float32)]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=0)  # [3, nf, pph, ppw]
    parts = [get_1d_rotary_pos_embed(rope.rope_dim[i], grid[i].reshape(-1), rope.theta,
                                     use_real=True) for i in range(3)]
    # per axis [L_r, rope_dim[i]] -> [L_r, D]
    return torch.cat([c for c, _ in parts], dim=1), torch.cat([s for _, s in parts], dim=1)


def slice_tokens(table, tok0: int, n: int, dim: int):
    """Rows tok0 .. tok0 + n - 1 along `dim` of a tensor or of each tensor in a tuple."""
    if isinstance(table, (tuple, list)):
        return type(table)(slice_tokens(t, tok0, n, dim) for t in table)
    return table.narrow(dim, tok0, n)
