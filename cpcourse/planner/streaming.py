"""When sequence parallelism stops paying: one streaming chunk under CP against a pipeline.

    python -c "from cpcourse.planner.streaming import *; print(sp_floor('wan2.1-t2v-14b','h100',4))"

A causal video model generates chunk after chunk, and each forward sees only the new chunk's
tokens (its history comes from the KV cache): Wan 2.1 1.3B at 480p makes 1,560 tokens for one
latent frame (4 video frames). The serving engines that stream such models found sequence
parallelism gives almost nothing there and pipeline the layers instead (StreamDiffusionV2,
arXiv 2511.07399; vLLM-Omni RFC #2280: "SP yields essentially no speedup at 1,536 tokens";
xDiT's CausalWan switches SP off). This module prices both with the planner's own cost model
(`cpcourse.planner.deployment.cost`), per forward of one chunk on P GPUs of one node:

    one GPU   cost(Layout()): linear + attention + element-wise work of the chunk
    CP        cost(Layout(ulysses=P) or Layout(ring=P)): each GPU holds 1/P of the tokens; the
              element-wise work that does not grow with the tokens (timestep and text side) does
              not divide, and each collective pays a latency `alpha` on top of its bytes:
              4 all-to-alls per layer (Ulysses) or P - 1 hops per layer (ring)
    pipeline  the layers split into P stages (the busiest holds ceil(L / P)); a stage sends
              the chunk's activations (n x hidden bf16) to the next stage. With P chunks
              (or denoising steps of chunks at different noise levels, as diffusion forcing and
              StreamDiffusionV2's stream batch have) in flight, a chunk leaves every
              max(stage, send) seconds; a single chunk still takes the whole forward plus the
              P - 1 sends (its latency). Weights are 1/P per GPU, where CP keeps them all.

`alpha` is 0 in the rest of the planner: on a long clip a forward has tens of milliseconds per
collective and the latency is noise. Here it is the point, and the range measured is wide:
`collective_latency_examples()` gives the facts sheet's figures, from NCCL's own small-message
floor to collectives called through torch.distributed. Kernels' lower efficiency on small
matrices is not modelled, so the speedups here are upper bounds.
"""

from __future__ import annotations

from cpcourse.planner.costs import hide_threshold
from cpcourse.planner.deployment import BYTES, cost
from cpcourse.planner.facts import facts
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.tokens import as_preset, model_tokens
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.layout import Layout

__all__ = ["chunk_tokens", "collective_latency_examples", "sp_floor", "stream_cost"]
METHODS = ("ulysses", "ring")


def collective_latency_examples() -> dict:
    """{name: {'seconds', 'source'}}: measured small-message collective latencies."""
    return facts()["calculator_defaults"]["collective_latency"]["examples"]


def chunk_tokens(model, latent_frames: int, height: int | None = None,
                 width: int | None = None):
    """The `TokenCount` of one forward over `latent_frames` new latent frames (a chunk)."""
    m = as_preset(model)
    positive_int("latent frames per chunk", latent_frames)
    frames = (latent_frames - 1) * m.vae_temporal + 1
    return model_tokens(m.id, frames=frames, height=height, width=width)


def _forward(c: dict) -> float:
    return sum(c["breakdown"]["per_forward_seconds"].values())


def stream_cost(model, gpu: str, world: int, latent_frames: int, *, method: str = "ulysses",
                alpha: float = 0.0, height: int | None = None, width: int | None = None) -> dict:
    """Seconds of one chunk's forward on one GPU, under CP (`method`) on `world` GPUs of one
    node, and through a `world`-stage pipeline; `alpha` seconds of latency per collective.
    Keys: tokens, one_gpu_seconds, cp_seconds, cp_speedup, cp_efficiency, cp_comm_seconds
    (exposed bytes + latency), collectives_per_forward, pp_seconds_per_chunk (throughput),
    pp_latency_seconds, pp_speedup, weights_bytes_per_gpu {'cp', 'pipeline'}."""
    m, g = as_preset(model), get_gpu(gpu)
    require(method in METHODS, f"method must be one of {', '.join(METHODS)}, got {method!r}")
    positive_int("world", world)
    require(world <= m.layers, f"a pipeline of {world} stages needs at least {world} layers; "
            f"{m.name} has {m.layers}")
    require(alpha >= 0, f"alpha is a latency in seconds, >= 0; got {alpha}")
    tok = chunk_tokens(m, latent_frames, height, width)
    one = cost(m.id, tok, g.id, Layout(), world)
    lay = Layout(ulysses=world) if method == "ulysses" else Layout(ring=world)
    require(method == "ring" or m.heads % world == 0,
            f"Ulysses over {world} GPUs needs the heads ({m.heads}) to divide: use ring")
    cp = cost(m.id, tok, g.id, lay, world)
    t1, comp = _forward(one), _forward(cp)
    per = cp["breakdown"]["per_forward_seconds"]
    collectives = m.layers * (4 if method == "ulysses" else world - 1) if world > 1 else 0
    cp_s = comp + collectives * alpha
    link = get_link(g.intra_link)
    send = tok.sequence_length * m.hidden * BYTES / (link.effective_gbps * 1e9) + alpha
    stage = t1 * -(-m.layers // world) / m.layers  # the busiest stage's share of the layers
    pp_chunk = max(stage, send) if world > 1 else t1
    weights = one["breakdown"]["memory_bytes"]["weights"]
    return {"model": m.id, "gpu": g.id, "world": world, "method": method, "alpha": alpha,
            "latent_frames": latent_frames, "tokens": tok.sequence_length,
            "one_gpu_seconds": t1, "cp_seconds": cp_s, "cp_speedup": t1 / cp_s,
            "cp_efficiency": t1 / cp_s / world,
            "cp_comm_seconds": per["ulysses"] + per["ring_exposed"] + collectives * alpha,
            "collectives_per_forward": collectives, "link": link.id,
            "pp_seconds_per_chunk": pp_chunk, "pp_latency_seconds": t1 + (world - 1) * send,
            "pp_speedup": t1 / pp_chunk,
            "weights_bytes_per_gpu": {"cp": weights, "pipeline": weights / world}}


def sp_floor(model, gpu: str, world: int, *, method: str = "ulysses", alpha: float = 0.0,
             efficiency: float = 0.8, max_latent_frames: int = 256) -> dict:
    """The fewest tokens per forward at which CP on `world` GPUs reaches `efficiency` (speedup
    / world), scanning chunks of 1, 2, ... latent frames at the model's default size; None when
    no chunk up to `max_latent_frames` does. Beside it, the tokens per forward below which the
    ring cannot hide a hop behind its block's attention at all (world x the GPU's hide
    threshold on its intra-node link, `cpcourse.planner.costs.hide_threshold`)."""
    require(0 < efficiency <= 1, f"efficiency is a share of linear speedup in (0, 1], got "
            f"{efficiency}")
    g = get_gpu(gpu)
    found = None
    for f in range(1, max_latent_frames + 1):
        try:
            c = stream_cost(model, g.id, world, f, method=method, alpha=alpha)
        except InputError:  # a chunk length the VAE's frame rule does not take (CogVideoX)
            continue
        if c["cp_efficiency"] >= efficiency:
            found = c
            break
    hide = hide_threshold(g.id, g.intra_link)
    return {"model": as_preset(model).id, "gpu": g.id, "world": world, "method": method,
            "alpha": alpha, "efficiency": efficiency,
            "tokens": found["tokens"] if found else None,
            "latent_frames": found["latent_frames"] if found else None,
            "ring_hide_tokens": world * hide["tokens"], "link": hide["link"]}
