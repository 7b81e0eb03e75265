"""Tensor parallelism for the course's tiny DiT: `cpcourse.tensor_parallel`'s layers on its blocks.

    cpcourse generate --nproc 2 --layout tp=2 --compare --json

Mirrors `cpcourse.models.tp`, which does the same for diffusers' Wan.
"""

from __future__ import annotations

from cpcourse.support.errors import InputError
from cpcourse.support.groups import require_group
from cpcourse.tensor_parallel import ColumnParallelLinear, RowParallelLinear, head_rows, span
from cpcourse.tinydit.model import TinyVideoDiT


def tensor_parallel(model, group):
    """Split a `cpcourse.tinydit.model.TinyVideoDiT`'s blocks over the ranks of `group`, in place.

    Attention: qkv column-parallel by heads, proj row-parallel; MLP: fc1 column-parallel, fc2
    row-parallel. Everything else (embeddings, modulation, norms, the output layer) stays
    replicated: small, and per token. The heads must divide by the group's size.
    """
    if not isinstance(model, TinyVideoDiT):
        raise InputError(f"tensor_parallel takes a cpcourse.tinydit.model.TinyVideoDiT, got "
                         f"{type(model).__name__}")
    rank, tp = require_group(group, "tensor_parallel")
    cfg = model.cfg
    if getattr(model, "tp", 1) != 1:
        raise InputError("this model is already tensor-parallel: build a fresh one")
    d = cfg.head_dim
    for block in model.blocks:
        for attn in block.attns:
            rows = head_rows(cfg.heads, d, rank, tp)
            attn.qkv = ColumnParallelLinear(attn.qkv, rows)  # [.., hidden] -> [.., 3 * H/tp * D]
            # [.., H/tp * D] -> [.., hidden], summed over the group (one all-reduce)
            attn.proj = RowParallelLinear(attn.proj, head_rows(cfg.heads, d, rank, tp, 1), group)
            attn.heads = cfg.heads // tp
        fc1, fc2 = block.mlp[0], block.mlp[2]
        cols = span(fc1.out_features, rank, tp)
        block.mlp[0] = ColumnParallelLinear(fc1, cols)
        block.mlp[2] = RowParallelLinear(fc2, cols, group)
    model.tp = tp
    return model


def all_reduces_per_step(cfg) -> int:
    """All-reduces one forward makes under TP: one per attention and one per MLP, per block."""
    return cfg.depth * ((2 if cfg.attention == "factored" else 1) + 1)
