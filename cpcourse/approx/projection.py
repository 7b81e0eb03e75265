"""What each approximate method would save on a real model and a real GPU link, per step.

    python -c "from cpcourse.approx.projection import *; print(project('wan2.1-t2v-14b','h100',8))"

On a 2-core CPU communication is a few per cent of a step, so the wall clock there cannot show
what stale activations buy. This prices one denoising step of a real preset at its default video
on `world` GPUs of one node with the planner's own numbers (`cpcourse.planner.deployment.cost`
for the compute of a rank's share, the GPU's intra-node link for the bytes), under each method's
traffic, as `cpcourse.approx.costs` counts it for the tiny model (bf16 here):

    exact       every layer all-gathers K and V: (P - 1) / P of 2 N hidden per layer and forward,
                blocking (the layer waits for it): all of it exposed
    displaced   the same bytes, started after a layer and awaited at that layer one step later:
                exposed only where they take longer than the step's compute
    naive       nothing after the warm-up
    pipefusion  each stage sends its N x hidden activations to the next once per forward, while
                the next patch computes: exposed only beyond a stage's compute
    asyncdiff   each component broadcasts its N x hidden output once per step, awaited one step
                later: exposed only beyond the step's compute
    ring        the course's exact ring (`cost`'s ring_exposed), for scale
Compute is what one GPU of the ring layout does per step (its linear, attention, merge and
element-wise seconds); a pipeline stage does the same share of the work, cut by layers instead.
"""

from __future__ import annotations

from cpcourse.planner.deployment import BYTES, cost
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.tokens import as_preset, model_tokens
from cpcourse.support.errors import positive_int, require
from cpcourse.support.layout import Layout

__all__ = ["project"]
COMPUTE_PARTS = ("linear", "attention", "ring_merge", "elementwise")


def project(model, gpu: str, world: int) -> dict:
    """Per method: {"bytes_per_step", "comm_seconds", "exposed_seconds"} for one rank, beside
    "compute_seconds" (one step of a rank's compute) and the link used. See the module doc."""
    m, g = as_preset(model), get_gpu(gpu)
    world = positive_int("world", world)
    require(world > 1, "project needs at least 2 GPUs: on one there is nothing to send")
    tok = model_tokens(m.id)
    c = cost(m.id, tok, g.id, Layout(ring=world), world)
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
    out = {"model": m.id, "gpu": g.id, "world": world, "link": link.id,
           "compute_seconds": compute, "methods": {}}
    for method, nbytes in sent.items():
        comm = nbytes / rate
        hides = method in ("displaced", "asyncdiff", "pipefusion")
        out["methods"][method] = {"bytes_per_step": int(nbytes), "comm_seconds": comm,
                                  "exposed_seconds": max(0.0, comm - compute) if hides else comm}
    # the ring sends the same K/V, a block per hop, each hop hidden behind that block's attention
    out["methods"]["ring"] = {"bytes_per_step": int(kv), "comm_seconds": kv / rate,
                              "exposed_seconds": forwards * per["ring_exposed"]}
    return out
