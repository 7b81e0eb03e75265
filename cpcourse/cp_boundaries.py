"""Where training under CP meets one process's autograd: the scatter, the gather, the loss scale.

    cpcourse train --nproc 4 --cp ring --dp 2 --steps 3 --compare --json

A CP model is sharded after patchify (`scatter_sequence`: every rank keeps its tensor_split
slice of the tokens) and, in training, often gathered before the loss (`gather_sequence`), as
miles_diffusion's USP training of Wan does (PR #21; `shared/research/frontier-research-2.md`
§4). Their backwards follow one convention: each rank's loss is one term of a sum that equals
one process's loss, and a tensor held on several ranks (replicated copies) has as gradient the
SUM of its copies' gradients.
- the scatter's gradient: each rank's slice gradient, all-gathered (the sum of the zero-padded
  slices), so every copy of the replicated input gets the whole gradient;
- the gather's gradient: a slice of the output's gradient, but the output is replicated on every
  rank, so the copies' gradients first reduce (all-reduce SUM), then each rank keeps its slice;
- the loss scale (`loss_weight`): with the same full prediction on each of the sp ranks of a
  data-parallel replica and dp replicas each holding a slice of the batch, each rank's loss is
  its replica's sum of squared errors / (elements in the WHOLE batch) / sp: the 1/(dp x sp) of
  the source, exact when batch slices differ in size. Parameter gradients are then summed over
  all dp x sp ranks (`all_reduce_grads`) and equal one process's batch gradients.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from cpcourse.support.groups import agree, gather_uneven, require_group, tracked
from cpcourse.support.shards import shard_sizes


class ScatterSequence(torch.autograd.Function):
    """x (replicated) -> this rank's tensor_split slice along `dim`; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, dim, group):
        rank, world = require_group(group, "scatter_sequence")
        ctx.dim, ctx.group, ctx.sizes = dim, group, shard_sizes(x.shape[dim], world)
        # [.., L, ..] -> [.., L_r, ..] along dim; a view: the input stays whole
        return torch.tensor_split(x, world, dim=dim)[rank]

    @staticmethod
    def backward(ctx, grad):
        return gather_uneven(grad.contiguous(), ctx.sizes, ctx.dim, ctx.group,
                             "scatter's gradient"), None, None


class GatherSequence(torch.autograd.Function):
    """Shards -> the whole sequence on every rank; backward: all-reduce SUM, keep my slice."""

    @staticmethod
    def forward(ctx, x, dim, group):
        rank, world = require_group(group, "gather_sequence")
        sizes = [s[dim] for s in agree(group, seq_dim=dim, x=x)["x"]]  # refuses mismatches
        ctx.dim, ctx.group, ctx.rank, ctx.world = dim, group, rank, world
        return gather_uneven(x.contiguous(), sizes, dim, group, "gather_sequence")  # L_r -> L

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        with tracked("all_reduce (gather's gradient)", group=ctx.group):
            dist.all_reduce(grad, group=ctx.group)
        return torch.tensor_split(grad, ctx.world, dim=ctx.dim)[ctx.rank], None, None  # L -> L_r


def scatter_sequence(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    """This rank's slice (`torch.tensor_split` order) of `x`, the same whole tensor on every rank,
    e.g. patchified tokens `[B, T, S, C*p*p]` split along frames (dim 1). Differentiable."""
    return ScatterSequence.apply(x, dim, group)


def gather_sequence(x: torch.Tensor, dim: int = 1, group=None) -> torch.Tensor:
    """Every rank's shard along `dim` (tensor_split order; equal elsewhere) -> the whole tensor,
    on each rank. Differentiable: each rank's shard gets the SUM over ranks of its slice of
    their gradients (the copies' gradients reduce)."""
    return GatherSequence.apply(x, dim, group)


def loss_weight(batch: int, per_sample: int, sp: int) -> float:
    """The factor on a rank's sum of squared errors over its replica's samples: 1 / (batch *
    per_sample * sp), `batch` the WHOLE batch (every replica's samples), `per_sample` elements
    in one sample's target. The sum over dp x sp ranks of their losses is then one process's
    mean over the whole batch, whatever the replicas' slice sizes."""
    return 1.0 / (batch * per_sample * sp)


def all_reduce_grads(params, group=None) -> None:
    """Sum every parameter's gradient over the ranks of `group` (all dp x sp ranks), in one
    message: a replicated parameter's gradient is the sum of its copies'."""
    params = [p for p in params if p.requires_grad]
    for p in params:  # a parameter unused on one rank still takes part: every message agrees
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    with tracked("all_reduce (parameter gradients)", group=group):
        dist.all_reduce(flat, group=group)
    for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
        p.grad.copy_(g.view_as(p.grad))
