"""What each approximate method costs on a real model and a real GPU, per step and per rank, on
three axes: the bytes it sends, what of them the step waits on, and the memory it holds.

    python -c "from cpcourse.approx.projection import *; print(project('wan2.1-t2v-14b','h100',8))"

On a 2-core CPU communication is a few per cent of a step, so the wall clock there cannot show
what stale activations buy. This prices one denoising step of a real preset (at its default
video, or the TokenCount `tok`) on `world` GPUs of one node with the planner's own numbers
(`cpcourse.planner.deployment.cost` for the compute of a rank's share, the GPU's intra-node
link for the bytes), under each method's traffic, as `cpcourse.approx.costs` counts it for the
tiny model (bf16 here). N tokens, h hidden, L layers, F forwards per step (2 with CFG batched):

    exact       every layer all-gathers K and V: (P - 1) / P of 2 N h per layer and forward,
                blocking (the layer waits for it): all of it exposed
    displaced   the same bytes, started after a layer and awaited at that layer one step later:
                exposed only where they take longer than the step's compute
    naive       nothing after the warm-up
    pipefusion  each stage sends its N x h activations to the next once per forward, while
                the next patch computes: exposed only beyond a stage's compute
    asyncdiff   each component broadcasts its N x h output once per step, awaited one step
                later: exposed only beyond the step's compute
    ring        the course's exact ring (`cost`'s ring_exposed), for scale

Memory per rank (`memory_per_rank`), bf16, the transformer only (text encoder and VAE are
notebook 12's): weights held, the buffer of stale activations kept from one step to the next,
and the activations of the tokens a rank works on (the planner's per-token count):

    exact, ring, naive  all weights; no stale buffer (exact's gathered K/V of one layer, 2 N h F,
                        and the ring's two blocks in flight are transient: counted as buffer)
    displaced   all weights; EVERY layer's K/V of the WHOLE sequence from the last step,
                L x 2 N h F (DistriFusion's price: its buffer does not shrink with P)
    pipefusion  1/P of the weights (its stage); its stage's layers' K/V of the whole sequence,
                (L / P) x 2 N h F; activations of one patch of N / P tokens
    asyncdiff   1/P of the weights (its component); last step's input and output of a component,
                2 N h F; activations of the whole sequence (every rank runs all N tokens)
Compute is what one GPU of the ring layout does per step (its linear, attention, merge and
element-wise seconds); every method does the same 1/P of the model's work per step, cut by
tokens (the patch methods) or by layers (pipefusion, asyncdiff).
"""

from __future__ import annotations

from cpcourse.planner.deployment import BYTES, cost
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.tokens import as_preset, model_tokens
from cpcourse.support.errors import positive_int, require
from cpcourse.support.layout import Layout

__all__ = ["memory_per_rank", "project"]
COMPUTE_PARTS = ("linear", "attention", "ring_merge", "elementwise")
PROJECTED = ("exact", "displaced", "naive", "pipefusion", "asyncdiff", "ring")


def _ring_cost(model, gpu_id: str, world: int, tok) -> tuple:
    """(preset, tokens, the planner's `cost` of a ring over `world` GPUs of one node)."""
    m = as_preset(model)
    tok = model_tokens(m.id) if tok is None else tok
    return m, tok, cost(m.id, tok, get_gpu(gpu_id).id, Layout(ring=world), world)


def memory_per_rank(model, world: int, tok=None, gpu: str = "h100") -> dict:
    """Bytes one rank of `world` holds under each method: {method: {"weights", "stale",
    "activations", "total"}} (see the module doc). `tok`: a TokenCount (default: the preset's
    video). `gpu` only picks the planner's cost entry; the bytes do not depend on it."""
    world = positive_int("world", world)
    m, tok, c = _ring_cost(model, gpu, world, tok)
    n, h, layers = tok.sequence_length, m.hidden, m.layers
    forwards = c["forwards_per_step"]
    acts_per_token = c["breakdown"]["memory_bytes"]["activations"] / c["tokens_per_rank"]
    weights = c["breakdown"]["memory_bytes"]["weights"]
    kv_layer = 2 * n * h * BYTES * forwards   # one layer's K and V of the whole sequence
    ring_blocks = 2 * 2 * -(-n // world) * h * BYTES * forwards
    held = {  # method: (weights, stale or in-flight buffer, tokens worked on at once)
        "exact": (weights, kv_layer, -(-n // world)),
        "ring": (weights, ring_blocks, -(-n // world)),
        "naive": (weights, 0, -(-n // world)),
        "displaced": (weights, layers * kv_layer, -(-n // world)),
        "pipefusion": (weights / world, -(-layers // world) * kv_layer, -(-n // world)),
        "asyncdiff": (weights / world, 2 * n * h * BYTES * forwards, n),
    }
    out = {}
    for method, (w, stale, tokens) in held.items():
        acts = acts_per_token * tokens
        out[method] = {"weights": int(w), "stale": int(stale), "activations": int(acts),
                       "total": int(w + stale + acts)}
    return out


def project(model, gpu: str, world: int, tok=None) -> dict:
    """Per method: {"bytes_per_step", "comm_seconds", "exposed_seconds", "memory_bytes",
    "fits"} for one rank, beside "compute_seconds" (one step of a rank's compute), the link used
    and the GPU's "hbm_bytes". See the module doc."""
    g = get_gpu(gpu)
    world = positive_int("world", world)
    require(world > 1, "project needs at least 2 GPUs: on one there is nothing to send")
    m, tok, c = _ring_cost(model, g.id, world, tok)
    per = c["breakdown"]["per_forward_seconds"]
    forwards = c["forwards_per_step"]
    compute = forwards * sum(per[k] for k in COMPUTE_PARTS)
    link = get_link(g.intra_link)
    rate = link.effective_gbps * 1e9
    n = tok.sequence_length
    kv = forwards * m.layers * 2 * -(-n // world) * m.hidden * BYTES * (world - 1)
    hidden = forwards * n * m.hidden * BYTES
    sent = {"exact": kv, "displaced": kv, "naive": 0, "pipefusion": hidden,
            "asyncdiff": hidden * (world - 1)}
    mem = memory_per_rank(m, world, tok, g.id)
    out = {"model": m.id, "gpu": g.id, "world": world, "link": link.id, "tokens": n,
           "compute_seconds": compute, "forwards_per_step": forwards,
           "hbm_bytes": g.hbm_bytes, "methods": {}}
    for method, nbytes in sent.items():
        comm = nbytes / rate
        hides = method in ("displaced", "asyncdiff", "pipefusion")
        out["methods"][method] = {"bytes_per_step": int(nbytes), "comm_seconds": comm,
                                  "exposed_seconds": max(0.0, comm - compute) if hides else comm}
    # the ring sends the same K/V, a block per hop, each hop hidden behind that block's attention
    out["methods"]["ring"] = {"bytes_per_step": int(kv), "comm_seconds": kv / rate,
                              "exposed_seconds": forwards * per["ring_exposed"]}
    for method, row in out["methods"].items():
        row["memory_bytes"] = mem[method]["total"]
        row["fits"] = mem[method]["total"] <= g.hbm_bytes
    return out
