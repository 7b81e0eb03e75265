"""What one layout of a real model costs on real GPUs: seconds per step, fixed seconds, bytes.

    cpcourse plan --model hunyuanvideo-13b --gpus 8 --gpu h100 --layout ulysses=8 --json

`cost(...)` prices a `cpcourse.support.layout.Layout` (cfg x ring x ulysses x tp) term by term,
composing three parts, each a frozen dataclass with `as_dict()`: `compute_seconds` (`Compute`:
linear, elementwise, attention, merge), `comm_seconds` (`Communication`: ulysses, ring, tp, fsdp,
cfg, with their links) and `memory_bytes` (`Memory`: weights, activations, buffers, the phases).
Every rate is a GPU's peak times a share measured elsewhere (the facts sheet names where); every
volume is counted from what the code of the real systems sends. Nothing is fitted to the published
runs that `cpcourse plan --validate` compares with. Per forward of one GPU, holding n = N / (R U) of
the N tokens, the model's `hidden` split over T tp ranks:
    linear     2 n P_tok / T FLOPs (P_tok: the block weights a video token meets, `block_params`
               less a cross-attention's K/V weights, which meet the text, 2 N_text (2 hidden^2)
               per layer, instead) at peak x matmul_efficiency
    elementwise  e n + e0 bytes (same tool: what norms, modulations, rotary and activations read
               and write) at HBM bandwidth x the share a copy reaches (measured on an H200);
               zero where not derived. An H200 profile put this work at 13-24% of a forward
    attention  4 n N hidden / T per layer (+ 4 n N_text hidden / T for cross-attention) at
               peak x the kernel's efficiency (FA2, FA3, SDPA by architecture)
    merge      the ring folds R - 1 blocks into its running output: 26 bytes moved per element
               of n x hidden / T per fold (an in-place merge, counted below), at memory
               bandwidth, or, where more, the split cost the H200 measured for attention cut
               into R blocks (1.05x, 1.12x, 1.25x at 2, 4, 8: `hardware.split_ratio`) less one,
               times the attention: small blocks pay what they pay
    ulysses    4 all-to-alls per layer (q, k, v, out) of (U - 1) / U x n hidden / T x 2 bytes,
               exposed (xDiT and yunchang wait on them)
    ring       R - 1 hops of K/V, 2 x n hidden / T x 2 bytes each, overlapped with that block's
               attention: only what the hop takes longer is exposed
    attn2d     a layout's `attn2d` = "RxC" runs the ring dim as an Attention2D grid instead: the
               bytes of `cpcourse.planner.costs.tiling_bytes_per_rank("attn2d", ...)` for the
               whole sequence with H / (U T) heads on R x C ranks, per layer, all exposed (no
               published engine overlaps them yet: TRT-LLM blog 25); C - 1 merges, not R - 1
    tp         the all-reduces each block really has (cross-attention blocks 3, joint blocks 2,
               HunyuanVideo's single-stream blocks 1), 2 (T - 1) / T x n hidden x 2 bytes, exposed
    fsdp       weights sharded over all GPUs (Wan's --dit_fsdp): each layer's weights gathered
               per forward, (W - 1) / W of them, overlapped with the layer's compute
    cfg        one all-gather of the predicted latents per step (CFG-parallel)
Every collective also pays its latency, NCCL's floor (3.5 us) per message it sends in sequence
(`cpcourse.planner.collectives.latency_rounds`: an all-to-all of U ranks U - 1, a ring all-reduce
2 (T - 1), a hop 1); `Communication.latency` is their sum, and the interval's slow end prices one
collective at what torch.distributed took (`cpcourse.planner.uncertainty`).
Each group uses the link it crosses: consecutive ranks inside a node talk over the GPU's own
intra-node link (NVLink, or PCIe on boxes without it), a group wider than a node over InfiniBand.
Fixed costs, once per video and on one GPU (`cpcourse.planner.fixed_costs`): the VAE decode, FLOPs
counted from diffusers' own VAE class (tools/derive_vae_flops.py) at the share of peak that
published decode times show (10-16%, not the matmul rate); the text encoder's 2 P_text tokens
FLOPs per prompt, priced where the encoder lives (`cpcourse.planner.text_encoder`). They are
serial: no published run's code divides them over its GPUs; `parallel_vae` splits the decode
over the layout's GPUs (`cpcourse.planner.parallel_vae`), leaving its link time serial.
Memory per GPU: weights (all experts of an MoE resident) / T, or / W plus one gathered layer
under FSDP; the residual stream n x hidden (TP does not divide it), the per-head tensors
n x (3 hidden + ffn) / T, the ring's two K/V buffers, the all-to-all's buffers; and the rest of
the pipeline, phase by phase (`cpcourse.planner.pipeline_memory`): the text encoder, the VAE and its
decode's working set. `per_gpu_bytes` is the largest phase on the busiest GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cpcourse.planner import uncertainty
from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.planner.deployment_memory import (  # noqa: F401 (re-exported)
    BYTES,
    Memory,
    memory_bytes,
    tokens_per_rank,
)
from cpcourse.planner.facts import dit_derived_costs, facts
from cpcourse.planner.fixed_costs import OncePerVideo, fixed_seconds, once_keys
from cpcourse.planner.hardware import copy_efficiency, get_gpu, kernel_efficiency, link_for
from cpcourse.planner.overheads import collective_latency, link_rate, split_ratio
from cpcourse.planner.pipeline_memory import RESIDENT, Residency
from cpcourse.planner.tokens import ModelPreset, as_preset
from cpcourse.support.layout import Layout

# One fold of a ring block into the running fp32 output, as an in-place merge does it (e.g.
# ring-flash-attn's out -= sigmoid(block_lse - lse) * (out - block_out)): the block's bf16 out
# cast up (read 2, write 4), out scaled in place (read 4, write 4), the block added in (read
# 4 + 4, write 4); the lse rows are 1/D of that.
MERGE_BYTES_PER_ELEMENT = 26
def block_params(model: ModelPreset | str) -> float:
    """The parameters of the blocks one token meets (`cpcourse.planner.tokens.ModelPreset`'s
    `block_params`: derived from diffusers' own module where counted, else the facts sheet's
    estimate)."""
    return as_preset(model).block_params


def all_reduces_per_forward(model: ModelPreset | str, layers: int, text_joint: bool) -> int:
    """TP all-reduces in one forward of `layers` blocks, as the blocks have them (see the module
    docstring): the facts sheet's count where the model's blocks are not all alike
    (HunyuanVideo's dual- and single-stream blocks), else 2 per joint block, 3 per cross."""
    model = as_preset(model)
    if model.tp_all_reduces_src:
        return model.tp_all_reduces_per_forward
    return layers * (2 if text_joint else 3)


def tp_allreduce_bytes(n: int, hidden: int, tp: int) -> float:
    """Bytes one GPU sends in one TP all-reduce of its [n, hidden] bf16 hidden state, as a ring
    all-reduce does it: 2 (tp - 1) / tp of the tensor."""
    return 2 * (tp - 1) / tp * n * hidden * BYTES


def _cross_attention(model, tok) -> bool:
    return not model.text_joint and tok.text_tokens > 0


@dataclass(frozen=True)
class Compute:
    """Seconds of one forward on one GPU that compute, not wait (the docstring's linear,
    elementwise, attention and merge), and the rates they ran at."""

    linear: float
    attention: float
    ring_merge: float
    elementwise: float
    matmul_rate: float  # FLOP/s: peak x matmul_efficiency
    attention_rate: float  # FLOP/s: peak x the kernel's efficiency (0 where it has none)
    kernel_efficiency: float | None
    kernel_source: str | None
    derived: bool  # linear and element-wise work counted by tools/derive_dit_costs.py

    def as_dict(self) -> dict:
        return asdict(self)


def compute_seconds(model, tok, gpu, layout: Layout, kernel: str) -> Compute:
    """The compute terms of one forward on one GPU (see the module docstring)."""
    eff, eff_source = kernel_efficiency(gpu.id, kernel)
    defaults = facts()["calculator_defaults"]
    matmul = gpu.bf16_tflops * 1e12 * float(defaults["matmul_efficiency"])
    attn_rate = uncertainty.rate("kernel_share", gpu.bf16_tflops * 1e12 * (eff or 0.0))
    r, t = layout.ring, layout.tp
    n_seq, n_text = tok.sequence_length, tok.text_tokens
    cross = _cross_attention(model, tok)
    n = tokens_per_rank(tok, layout)
    h, layers = model.hidden, model.layers
    p_block = model.block_params
    kv_cross = 2 * h * h * layers if cross else 0  # cross-attention K/V weights meet the text
    linear_flops = 2 * n * (p_block - kv_cross) / t + 2 * n_text * kv_cross / t
    derived = dit_derived_costs().get(model.id)
    elem_bytes = (derived["elementwise_bytes_per_token"] * n + derived["elementwise_bytes_fixed"]
                  if derived else 0.0)  # not derived for this model: not priced
    attn_flops = layers * 4 * n * n_seq * h / t + (layers * 4 * n * n_text * h / t if cross else 0)
    linear_s, attn_s = linear_flops / matmul, (attn_flops / attn_rate if eff else math.inf)
    hbm = gpu.hbm_tbps * 1e12
    folds = layout.grid[1] - 1 if layout.grid else r - 1  # a grid's owner merges C partials
    merge_s = layers * folds * MERGE_BYTES_PER_ELEMENT * n * h / t / hbm
    # attention cut into folds + 1 blocks costs more than fused (short kernels, a merge each):
    # the H200's measured overhead, unless the merge's bytes alone cost more (fast edge: bytes)
    split = split_ratio(folds + 1)[0] if folds else 1.0
    if uncertainty.current() != "fast":
        merge_s = max(merge_s, (split - 1.0) * attn_s)
    # norms, modulations, rotary, activations: memory-bound, at a copy's share of HBM (TP splits
    # some of these tensors and not others: not divided, an upper bound under TP)
    elem_s = elem_bytes / uncertainty.rate("elementwise", hbm * copy_efficiency()[0])
    return Compute(linear=linear_s, attention=attn_s, ring_merge=merge_s, elementwise=elem_s,
                   matmul_rate=matmul, attention_rate=attn_rate, kernel_efficiency=eff,
                   kernel_source=eff_source, derived=bool(derived))


@dataclass(frozen=True)
class Communication:
    """Seconds one forward waits on its links (the docstring's ulysses, ring, tp and fsdp), the
    CFG exchange once per step, and the link each group crosses (None where it does not send)."""

    ulysses: float  # all-to-alls, bytes and latency (alpha), exposed
    ring_exposed: float
    tp_allreduce: float
    fsdp_exposed: float
    cfg_exchange: float  # per step, not per forward
    links: dict
    tp_all_reduces_per_forward: int
    attn2d: float = 0.0  # the grid's gathers and all-to-all, exposed (a ring layout: 0)
    latency: float = 0.0  # of the terms above, what the collectives' alphas add per forward

    def as_dict(self) -> dict:
        return asdict(self)


def comm_seconds(model, tok, gpu, layout: Layout, gpus_per_node: int, compute: Compute,
                 fsdp: bool) -> Communication:
    """The communication terms, each on the link it crosses, bytes over bandwidth plus each
    collective's latency (`_alpha`); the ring's hops and FSDP's gathers hide behind `compute`
    only as far as they are shorter (see the module docstring)."""
    c, r, u, t, world = layout.cfg, layout.ring, layout.ulysses, layout.tp, layout.world
    n = tokens_per_rank(tok, layout)
    h, layers = model.hidden, model.layers
    uly_link = link_for(u * t, gpus_per_node, gpu)
    ring_link = link_for(r * u * t, gpus_per_node, gpu)  # the ring spans ring x ulysses x tp
    tp_link = link_for(t, gpus_per_node, gpu)
    world_link = link_for(world, gpus_per_node, gpu)
    lat_a2a = layers * 4 * collective_latency("all_to_all", u)
    uly_s = layers * 4 * (u - 1) / u * n * h / t * BYTES / link_rate(uly_link) + lat_a2a
    ring_s = attn2d_s = lat_ring = 0.0
    if layout.grid:
        rows, cols = layout.grid
        moved = tiling_bytes_per_rank("attn2d", tok.sequence_length, model.heads // (u * t),
                                      h // model.heads, r, layout.grid, BYTES)
        # Q gathered along the row, K and V along the column, the partials home along the row
        lat_ring = layers * 2 * (collective_latency("all_gather", cols)
                                 + collective_latency("all_gather", rows))
        attn2d_s = layers * moved / link_rate(ring_link) + lat_ring
    elif r > 1:
        hop = 2 * n * h / t * BYTES / link_rate(ring_link) + collective_latency("send_recv", 2)
        block = (4 * u * n * n * h / t / compute.attention_rate if compute.kernel_efficiency
                 else math.inf)
        ring_s = layers * (r - 1) * max(0.0, hop - block)
        lat_ring = min(ring_s, layers * (r - 1) * collective_latency("send_recv", 2))
    reduces = model.tp_all_reduces_per_forward
    lat_tp = reduces * collective_latency("all_reduce", t)
    tp_s = reduces * tp_allreduce_bytes(n, h, t) / link_rate(tp_link) + lat_tp
    fsdp_s = 0.0
    if fsdp and world > 1:
        gather = (model.block_params / layers * BYTES * (world - 1) / world
                  / link_rate(world_link) + collective_latency("all_gather", world))
        layer_compute = (compute.linear + compute.attention) / layers
        fsdp_s = layers * max(0.0, gather - layer_compute)
    latent = tok.latent_frames * tok.latent_height * tok.latent_width * model.latent_channels
    cfg_s = (latent * BYTES / link_rate(world_link) + collective_latency("all_gather", 2)
             if c == 2 else 0.0)
    links = {"ulysses": uly_link.id if u > 1 else None,
             "ring": ring_link.id if r > 1 and not layout.grid else None,
             "tp": tp_link.id if t > 1 else None, "cfg": world_link.id if c == 2 else None,
             "fsdp": world_link.id if fsdp and world > 1 else None}
    if layout.grid:
        links["attn2d"] = ring_link.id
    return Communication(ulysses=uly_s, ring_exposed=ring_s, tp_allreduce=tp_s,
                         fsdp_exposed=fsdp_s, cfg_exchange=cfg_s, links=links,
                         tp_all_reduces_per_forward=reduces if t > 1 else 0, attn2d=attn2d_s,
                         latency=lat_a2a + lat_ring + lat_tp)


def cost(model: ModelPreset | str, tok, gpu_id: str, layout: Layout, gpus_per_node: int, *,
         kernel: str | None = None, fsdp: bool = False, steps: int = 50, released: bool = False,
         residency: Residency = RESIDENT, parallel_vae: bool = False) -> dict:
    """Seconds and bytes of `layout` for `tok` (a `cpcourse.planner.tokens.TokenCount`): its
    compute, communication and memory (see above), composed. `kernel`: the GPU's default
    (`cpcourse.planner.hardware.default_kernel`) unless given; `parallel_vae`: the decode split
    over the layout's GPUs (`cpcourse.planner.parallel_vae`)."""
    model, gpu = as_preset(model), get_gpu(gpu_id)
    kernel = kernel or gpu.kernel
    comp = compute_seconds(model, tok, gpu, layout, kernel)
    comm = comm_seconds(model, tok, gpu, layout, gpus_per_node, comp, fsdp)
    vae_ranks = layout.world if parallel_vae else 1
    mem = memory_bytes(model, tok, layout, fsdp, released, residency, vae_ranks)
    # 3-way guidance (Open-Sora 2.0) on 2 CFG groups: one group runs two forwards a step
    forwards = -(-model.cfg_forwards // layout.cfg)
    per_forward = {"linear": comp.linear, "attention": comp.attention,
                   "ring_merge": comp.ring_merge, "ulysses": comm.ulysses,
                   "ring_exposed": comm.ring_exposed, "tp_allreduce": comm.tp_allreduce,
                   "fsdp_exposed": comm.fsdp_exposed, "elementwise": comp.elementwise}
    if layout.grid:  # a new key only where it applies: ring layouts keep their keys as they were
        per_forward["attn2d"] = comm.attn2d
    step_s = forwards * sum(per_forward.values()) + comm.cfg_exchange
    prompts = model.cfg_forwards  # one text encode per guided forward (Open-Sora 2.0: 3)
    once = fixed_seconds(model, tok, gpu.id, comp.matmul_rate, prompts, OncePerVideo(
        text_encoder=residency.place, text_encoder_bytes=mem.pipeline["text_encoder_weights"],
        vae_ranks=vae_ranks, gpus_per_node=gpus_per_node,
        vae_elem_bytes=mem.pipeline["vae_elem_bytes"]))
    fixed = once["seconds"]
    return {
        "layout": layout.as_dict(), "tokens_per_rank": tokens_per_rank(tok, layout),
        "kernel": kernel, "kernel_efficiency": comp.kernel_efficiency,
        "kernel_source": comp.kernel_source, "links": comm.links,
        "forwards_per_step": forwards, "seconds_per_step": step_s,
        "seconds_fixed": sum(fixed.values()), "seconds_total": steps * step_s + sum(fixed.values()),
        "per_gpu_bytes": int(mem.per_gpu), "fits": mem.per_gpu <= gpu.hbm_bytes,
        **once_keys(once, mem.phase_parts, mem.pipeline, layout.world,
                    steps * step_s + sum(fixed.values())),
        "breakdown": {"per_forward_seconds": per_forward, "cfg_exchange_seconds": comm.cfg_exchange,
                      "comm_latency_seconds": comm.latency,
                      "fixed_seconds": fixed, "memory_bytes": mem.parts(),
                      "memory_phases": mem.phases, "memory_phase_parts": mem.phase_parts,
                      "memory_counted": mem.counted, "released_dtypes": mem.released_dtypes,
                      "residency": {"offload": residency.offload,
                                    "text_encoder_cpu": residency.text_encoder_cpu,
                                    "text_encoder": residency.place},
                      "tp_all_reduces_per_forward": comm.tp_all_reduces_per_forward,
                      "linear_derived": comp.derived, "elementwise_counted": comp.derived,
                      "vae_counted": once["vae_flops"] is not None,
                      "vae_decode_flops": once["vae_flops"], "vae_share_of_peak": once["vae_share"],
                      "vae_share_source": once["vae_source"], "text_encoder": once["text_encoder"]},
    }
