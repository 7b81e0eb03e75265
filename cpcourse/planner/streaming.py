"""When sequence parallelism stops paying: one streaming chunk under CP against a pipeline.

    python -m cpcourse.planner.streaming     # the verdict over the latency range, Wan 2.1 1.3B

A causal video model generates chunk after chunk. Each forward computes the new chunk's
tokens only, but its queries attend to the chunk itself **and to the cached keys of the chunks
before it**, up to a rolling window: Self-Forcing's cache holds 21 latent frames of Wan 2.1
1.3B (1,560 tokens each at 480p, `SELF_FORCING_CACHE`). The serving engines that stream such
models found that sequence parallelism gives almost nothing at a chunk of one latent frame and
pipeline the layers instead (StreamDiffusionV2, arXiv 2511.07399; vLLM-Omni RFC #2280: "SP yields
essentially no speedup at 1,536 tokens"). This module prices both with the planner's cost model
(`cpcourse.planner.deployment.cost`), per forward of one chunk on P GPUs of one node:

    one GPU   cost(Layout()): linear + attention + element-wise work of the chunk, plus the
              attention of its n queries over the c cached tokens, 4 n c hidden per layer
    CP        cost(Layout(ulysses=P) or Layout(ring=P)): each GPU holds 1/P of the tokens (or of
              the heads) and 1/P of the cache, so the cache attention divides by P too; the
              element-wise work that does not grow with the tokens does not divide; each
              collective pays a latency `alpha` on top of its bytes: 4 all-to-alls per layer
              (Ulysses: the cache is head-sharded and never moves; one alpha each, as NCCL
              posts an all-to-all's P - 1 sends as one group) or P - 1 hops per layer
              (ring, pass-kv: each hop also carries that rank's shard of the cache, and hides
              behind attention over it as the chunk's own hop does)
    pipeline  the layers split into P stages (the busiest holds ceil(L / P)); a stage sends the
              chunk's activations (n x hidden bf16) to the next. One chunk's LATENCY is the
              whole forward plus P - 1 sends: a pipeline never makes one forward faster. Its
              THROUGHPUT depends on how many independent forwards can be in flight at once
              (`in_flight`): one clean-context stream has 1 (chunk k + 1 needs chunk k's final
              K/V, written by a last pass at t = 0), so a pipeline of one stream is slower than
              one GPU. Forwards are independent across streams (users), and across the
              denoising steps of successive chunks only in a model trained on noisy context
              (diffusion forcing; StreamDiffusionV2's stream batch). With k in flight a chunk
              leaves every max(stage, send, latency / k) seconds.

`alpha` is 0 in the rest of the planner: on a long clip a forward has tens of milliseconds per
collective and the latency is noise. Here it decides the verdict, and the range is wide
(`latency_range()`, from the facts sheet's `calculator_defaults.collective_latency`): NCCL
inside a CUDA graph, NCCL's own floor, a typical collective called from eager PyTorch, and one
called through a benchmark script. Kernels' lower efficiency on small matrices is not modelled,
so the speedups here are upper bounds.
"""

from __future__ import annotations

from cpcourse.planner.costs import hide_threshold
from cpcourse.planner.deployment import BYTES, cost
from cpcourse.planner.facts import facts
from cpcourse.planner.hardware import get_gpu, get_link, kernel_efficiency
from cpcourse.planner.tokens import as_preset, model_tokens
from cpcourse.support.errors import InputError, positive_int, require
from cpcourse.support.layout import Layout

__all__ = ["SELF_FORCING_CACHE", "chunk_tokens", "collective_latency_examples", "latency_range",
           "sp_floor", "stream_cost"]
METHODS = ("ulysses", "ring")
# The rolling KV window of a real streaming model, in latent frames (its own chunk included).
SELF_FORCING_CACHE = {
    "latent_frames": 21, "chunk_latent_frames": 3,
    "source": "guandeh17/Self-Forcing pipeline/causal_inference.py: kv_cache_size = 32760 "
              "tokens (21 latent frames x frame_seq_length 1560) per block when local_attn_size "
              "is -1; configs: num_frame_per_block 3, num_training_frames 21"}


def collective_latency_examples() -> dict:
    """{name: {'seconds', 'source'}}: small-message collective latencies, as the facts sheet
    holds them."""
    return facts()["calculator_defaults"]["collective_latency"]["examples"]


def latency_range() -> list[dict]:
    """The facts' latencies as a range, fastest first: [{'name', 'seconds', 'source'}]."""
    ex = collective_latency_examples()
    return sorted(({"name": k, **v} for k, v in ex.items()), key=lambda e: e["seconds"])


def chunk_tokens(model, latent_frames: int, height: int | None = None,
                 width: int | None = None):
    """The `TokenCount` of one forward over `latent_frames` new latent frames (a chunk)."""
    m = as_preset(model)
    positive_int("latent frames per chunk", latent_frames)
    frames = (latent_frames - 1) * m.vae_temporal + 1
    return model_tokens(m.id, frames=frames, height=height, width=width)


def _forward(c: dict) -> float:
    return sum(c["breakdown"]["per_forward_seconds"].values())


def _cache_attention(m, g, kernel: str, queries: int, cached: int) -> float:
    """Seconds one GPU alone spends on n queries' attention over `cached` cached keys, per
    forward: 4 n c hidden FLOPs per layer at the kernel's rate."""
    eff, _ = kernel_efficiency(g.id, kernel)
    require(eff is not None, f"kernel {kernel} does not run on the {g.name}")
    return m.layers * 4 * queries * cached * m.hidden / g.attention_flops(eff)


def _check(m, world: int, method: str, alpha: float, cached: int, in_flight: int) -> None:
    require(method in METHODS, f"method must be one of {', '.join(METHODS)}, got {method!r}")
    positive_int("world", world)
    require(world <= m.layers, f"a pipeline of {world} stages needs at least {world} layers; "
            f"{m.name} has {m.layers}")
    require(method == "ring" or m.heads % world == 0,
            f"Ulysses over {world} GPUs needs the heads ({m.heads}) to divide: use ring")
    require(alpha >= 0, f"alpha is a latency in seconds, >= 0; got {alpha}")
    require(isinstance(cached, int) and cached >= 0, f"cached_frames is the latent frames of "
            f"history in the KV cache, a whole number >= 0; got {cached!r}")
    positive_int("in_flight (independent forwards the pipeline can hold)", in_flight)


def stream_cost(model, gpu: str, world: int, latent_frames: int, *, method: str = "ulysses",
                alpha: float = 0.0, cached_frames: int = 0, in_flight: int = 1) -> dict:
    """Seconds of one chunk's forward (`latent_frames` new latent frames whose queries also see
    `cached_frames` latent frames of cached K/V) on one GPU, under CP (`method`) on `world`
    GPUs of one node, and through a `world`-stage pipeline holding `in_flight` independent
    forwards; `alpha` seconds of latency per collective.
    Keys: tokens, cached_tokens, one_gpu_seconds, cache_attention_seconds (one GPU's share of
    it), cp_seconds, cp_speedup (latency and throughput alike), cp_efficiency, cp_comm_seconds
    (exposed bytes + latency), collectives_per_forward, pp_latency_seconds, pp_latency_speedup
    (< 1: a pipeline never shortens one forward), pp_seconds_per_chunk, pp_throughput_speedup,
    weights_bytes_per_gpu {'cp', 'pipeline'}."""
    m, g = as_preset(model), get_gpu(gpu)
    _check(m, world, method, alpha, cached_frames, in_flight)
    tok = chunk_tokens(m, latent_frames)
    n = tok.sequence_length
    cached = cached_frames * n // latent_frames  # tokens per latent frame x cached frames
    one = cost(m.id, tok, g.id, Layout(), world)
    cp = cost(m.id, tok, g.id, Layout(ulysses=world) if method == "ulysses"
              else Layout(ring=world), world)
    cache_s = _cache_attention(m, g, one["kernel"], n, cached)
    t1 = _forward(one) + cache_s
    per = cp["breakdown"]["per_forward_seconds"]
    # pass-kv: each hop and the attention it hides behind both grow by the cached share
    ring_extra = per["ring_exposed"] * cached / n
    collectives = m.layers * (4 if method == "ulysses" else world - 1) if world > 1 else 0
    cp_s = _forward(cp) + cache_s / world + ring_extra + collectives * alpha
    link = get_link(g.intra_link)
    send = n * m.hidden * BYTES / (link.effective_gbps * 1e9) + alpha
    stage = t1 * -(-m.layers // world) / m.layers  # the busiest stage's share of the layers
    pp_latency = t1 + (world - 1) * send
    pp_chunk = max(stage, send, pp_latency / in_flight) if world > 1 else t1
    weights = one["breakdown"]["memory_bytes"]["weights"]
    return {"model": m.id, "gpu": g.id, "world": world, "method": method, "alpha": alpha,
            "latent_frames": latent_frames, "cached_frames": cached_frames, "tokens": n,
            "cached_tokens": cached, "in_flight": in_flight,
            "one_gpu_seconds": t1, "cache_attention_seconds": cache_s,
            "cp_seconds": cp_s, "cp_speedup": t1 / cp_s, "cp_efficiency": t1 / cp_s / world,
            "cp_comm_seconds": (per["ulysses"] + per["ring_exposed"] + ring_extra
                                + collectives * alpha),
            "collectives_per_forward": collectives, "link": link.id,
            "pp_latency_seconds": pp_latency, "pp_latency_speedup": t1 / pp_latency,
            "pp_seconds_per_chunk": pp_chunk, "pp_throughput_speedup": t1 / pp_chunk,
            "weights_bytes_per_gpu": {"cp": weights, "pipeline": weights / world}}


def sp_floor(model, gpu: str, world: int, *, method: str = "ulysses", alpha: float = 0.0,
             efficiency: float = 0.8, cached_frames: int = 0,
             max_latent_frames: int = 256) -> dict:
    """The fewest tokens per forward at which CP on `world` GPUs reaches `efficiency` (speedup
    / world), scanning chunks of 1, 2, ... latent frames at the model's default size, each
    seeing `cached_frames` cached latent frames; None when no chunk up to `max_latent_frames`
    does. Beside it, the tokens per forward below which the ring cannot hide a hop behind its
    block's attention at all (world x the GPU's hide threshold on its intra-node link,
    `cpcourse.planner.costs.hide_threshold`)."""
    require(0 < efficiency <= 1, f"efficiency is a share of linear speedup in (0, 1], got "
            f"{efficiency}")
    g = get_gpu(gpu)
    found = None
    for f in range(1, max_latent_frames + 1):
        try:
            c = stream_cost(model, g.id, world, f, method=method, alpha=alpha,
                            cached_frames=cached_frames)
        except InputError:  # a chunk length the VAE's frame rule does not take (CogVideoX)
            continue
        if c["cp_efficiency"] >= efficiency:
            found = c
            break
    hide = hide_threshold(g.id, g.intra_link)
    return {"model": as_preset(model).id, "gpu": g.id, "world": world, "method": method,
            "alpha": alpha, "efficiency": efficiency, "cached_frames": cached_frames,
            "tokens": found["tokens"] if found else None,
            "latent_frames": found["latent_frames"] if found else None,
            "ring_hide_tokens": world * hide["tokens"], "link": hide["link"]}


def _demo() -> None:
    wan, cache = "wan2.1-t2v-1.3b", SELF_FORCING_CACHE["latent_frames"]
    print("Wan 2.1 1.3B, 4 H100s, Ulysses, a chunk of 1 latent frame")
    print(f"{'latency':>22} {'no cache':>9} {'cache ' + str(cache - 1):>9}")
    for e in latency_range():
        a, b = (stream_cost(wan, "h100", 4, 1, alpha=e["seconds"], cached_frames=c)["cp_speedup"]
                for c in (0, cache - 1))
        print(f"{e['name']:>14} {e['seconds'] * 1e6:5.1f} us {a:8.2f}x {b:8.2f}x")


if __name__ == "__main__":
    _demo()
