"""Bytes one GPU holds for one layout of a real model: the loop's parts and the pipeline's phases.

    cpcourse plan --model hunyuanvideo-13b --gpus 8 --gpu h100 --layout ulysses=8 --json

`memory_bytes` is the memory part of `cpcourse.planner.deployment.cost` (its module docstring
gives the counts): the transformer's weights (sharded by FSDP, split by tp), the activations of
the n tokens a GPU holds, the ring's, the grid's and the all-to-all's buffers, then the phases
of the whole pipeline (`cpcourse.planner.pipeline_memory`) those parts add up to.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from cpcourse.planner.pipeline_memory import Residency, phases, released_bytes
from cpcourse.support.dtypes import nbytes
from cpcourse.support.layout import Layout

BYTES = nbytes("bf16")  # bf16 weights and activations


def tokens_per_rank(tok, layout: Layout) -> int:
    """n: the tokens one GPU holds, the sequence split over ring x ulysses."""
    return math.ceil(tok.sequence_length / (layout.ring * layout.ulysses))


@dataclass(frozen=True)
class Memory:
    """Bytes on one GPU: the denoising loop's parts (weights, activations, the ring's and the
    all-to-all's buffers), the rest of the pipeline, and the phases they add up to
    (`cpcourse.planner.pipeline_memory`)."""

    weights: int
    activations: int
    ring_buffers: int
    all_to_all_buffers: int
    text_encoder: float
    vae: float
    vae_decode: float
    phases: dict
    phase_parts: dict
    counted: dict
    released_dtypes: str | None
    pipeline: dict = field(default_factory=dict)  # pipeline_memory.phases' whole answer

    @property
    def per_gpu(self) -> float:
        """The largest phase on the busiest GPU."""
        return max(self.phases.values())

    def parts(self) -> dict:
        """Bytes by part: `breakdown.memory_bytes` of `cost`."""
        return {"weights": self.weights, "activations": self.activations,
                "ring_buffers": self.ring_buffers, "all_to_all_buffers": self.all_to_all_buffers,
                "text_encoder": self.text_encoder, "vae": self.vae, "vae_decode": self.vae_decode}

    def as_dict(self) -> dict:
        return asdict(self)


def memory_bytes(model, tok, layout: Layout, fsdp: bool, released: bool,
                 residency: Residency, vae_ranks: int = 1) -> Memory:
    """Bytes per GPU, part by part and phase by phase (see the module docstring)."""
    r, u, t, world = layout.ring, layout.ulysses, layout.tp, layout.world
    n = tokens_per_rank(tok, layout)
    h, layers = model.hidden, model.layers
    (dit_b, _, _), dtype_source = released_bytes(model) if released else ((BYTES,) * 3, None)
    weights = model.params_b * 1e9 * dit_b
    # FSDP gathers one layer at a time in the compute dtype (bf16)
    sharded = fsdp and world > 1
    weights_gpu = (weights / world + model.block_params / layers * BYTES if sharded
                   else weights / t)
    acts = n * (3 * h + (3 * h + model.ffn) / t) * BYTES
    ring_buf = 2 * 2 * n * h / t * BYTES if r > 1 else 0
    if layout.grid:  # the gathered Q (C shards) and K/V (R shards), the partials in fp32
        rows, cols = layout.grid
        ring_buf = (cols + 2 * rows) * n * h / t * BYTES + cols * n * h / t * 4
    a2a_buf = 2 * 3 * n * h / t * BYTES if u > 1 else 0
    pipe = phases(model, tok, transformer=weights_gpu, loop=acts + ring_buf + a2a_buf,
                  shards=world if sharded else 1, released=released, residency=residency,
                  vae_ranks=vae_ranks)
    return Memory(weights=int(weights_gpu), activations=int(acts), ring_buffers=int(ring_buf),
                  all_to_all_buffers=int(a2a_buf), text_encoder=pipe["text_encoder"],
                  vae=pipe["vae"], vae_decode=pipe["vae_decode"], phases=pipe["phases"],
                  phase_parts=pipe["parts"], counted=pipe["counted"],
                  released_dtypes=dtype_source, pipeline=pipe)
