"""Tensor parallelism for diffusers' Wan transformer: heads and FFN columns over the tp ranks.

    python -m cpcourse.cli models --arch wan --nproc 4 --layout tp=2,ring=2 --compare

The same Megatron split as `cpcourse.tensor_parallel` (read that first), on Wan's own modules:
    attn1, attn2   to_q, to_k, to_v column-parallel by heads (contiguous: each projection is its
                   own Linear with a `[heads, head_dim]` output), to_out[0] row-parallel
    ffn            net[0].proj column-parallel, net[2] row-parallel
One thing is new: Wan normalises q and k with an RMSNorm ACROSS all heads (`norm_q`, `norm_k`
over heads x head_dim), so a rank holding some heads cannot normalise alone. Each rank sums the
squares of its share, one all-reduce of `[B, L, 1]` adds the shares, and every rank divides by
the full width: exact, and tiny next to the activations. A Wan block therefore makes three large
all-reduces (self-attention, cross-attention, FFN: 3 x `[B, L, hidden]`) and four small ones
(q and k of each attention). Image-conditioned Wan (I2V: `add_k_proj`) is refused: its image
keys are not split here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from cpcourse.support.errors import InputError
from cpcourse.support.groups import comm_device, require_group, tracked
from cpcourse.tensor_parallel import ColumnParallelLinear, RowParallelLinear, span


class TPRMSNorm(nn.Module):
    """RMSNorm over features split across `group`: x `[..., F/tp]` -> `[..., F/tp]`."""

    def __init__(self, norm: nn.RMSNorm, cols: torch.Tensor, group):
        super().__init__()
        self.group = group
        self.full = norm.normalized_shape[0]
        self.eps = norm.eps
        self.weight = None if norm.weight is None else nn.Parameter(
            norm.weight.detach()[cols].clone(), requires_grad=False)

    def forward(self, x):
        squares = x.float().pow(2).sum(dim=-1, keepdim=True)  # [..., 1]: this rank's share
        device = comm_device(self.group)
        buf = squares.to(device)
        with tracked("all_reduce (RMSNorm across heads)", group=self.group):
            dist.all_reduce(buf, group=self.group)
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        y = (x.float() * torch.rsqrt(buf.to(x.device) / self.full + eps)).to(x.dtype)
        return y if self.weight is None else y * self.weight


def _split_attention(attn, rank: int, tp: int, group) -> None:
    if attn.add_k_proj is not None:
        raise InputError("tensor parallel for image-conditioned Wan (I2V, add_k_proj) is not "
                         "built: use a layout with tp=1 for it")
    if getattr(attn, "fused_projections", False):
        raise InputError("this Wan has fused q/k/v projections: unfuse them before TP")
    if attn.heads % tp:
        raise InputError(f"tensor parallel splits Wan's {attn.heads} heads over {tp} ranks, "
                         f"which does not divide them")
    cols = span(attn.to_q.out_features, rank, tp)
    kv_cols = span(attn.to_k.out_features, rank, tp)
    attn.to_q = ColumnParallelLinear(attn.to_q, cols)
    attn.to_k = ColumnParallelLinear(attn.to_k, kv_cols)
    attn.to_v = ColumnParallelLinear(attn.to_v, kv_cols)
    attn.norm_q = TPRMSNorm(attn.norm_q, cols, group)
    attn.norm_k = TPRMSNorm(attn.norm_k, kv_cols, group)
    attn.to_out[0] = RowParallelLinear(attn.to_out[0], cols, group)
    attn.heads //= tp


def tensor_parallel_wan(model, group):
    """Split a diffusers `WanTransformer3DModel`'s blocks over the ranks of `group`, in place.

    Call on every rank of `group` with the same weights. Everything outside the blocks
    (patch embedding, condition embedders, the output norm and projection) stays replicated.
    """
    if type(model).__name__ != "WanTransformer3DModel":
        raise InputError(f"tensor parallel in cpcourse.models is built for Wan; "
                         f"{type(model).__name__} takes layouts with tp=1")
    rank, tp = require_group(group, "tensor_parallel_wan")
    if getattr(model, "_cpcourse_tp", 1) != 1:
        raise InputError("this model is already tensor-parallel: build a fresh one")
    for block in model.blocks:
        _split_attention(block.attn1, rank, tp, group)
        _split_attention(block.attn2, rank, tp, group)
        fc1, fc2 = block.ffn.net[0].proj, block.ffn.net[2]
        cols = span(fc1.out_features, rank, tp)
        block.ffn.net[0].proj = ColumnParallelLinear(fc1, cols)
        block.ffn.net[2] = RowParallelLinear(fc2, cols, group)
    model._cpcourse_tp = tp
    return model
