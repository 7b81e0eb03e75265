"""One cost model for every collective CP uses: alpha + bytes / bandwidth, per message.

    python -c "from cpcourse.planner.collectives import collective_seconds as c; \
print(c('all_to_all', 8e6, 8, alpha=20e-6, gbps=450))"

The alpha-beta model (Hockney's; the JAX scaling book's "How to think about TPUs/GPUs" uses it
for every collective): a message of n bytes takes `alpha + n / B`, where alpha is the fixed
latency of one message (launch, synchronisation, the first byte's trip) and B the bandwidth one
GPU sends at. A collective is a schedule of messages; its cost is how many messages a rank sends
one after another (each pays alpha) and how many bytes go out of the busiest rank.

With P ranks and `nbytes` as each function says:

    kind            bytes `nbytes` is             messages in sequence   bytes a rank sends
    send_recv       the message                    1                      n
    all_gather      each rank's contribution       P - 1 (ring)           (P - 1) n
    reduce_scatter  each rank's result shard       P - 1 (ring)           (P - 1) n
    all_reduce      the whole tensor               2 (P - 1) (ring)       2 (P - 1) n / P
    all_to_all      what one rank holds            P - 1 (pairwise)       (P - 1) n / P

The all-to-all's P - 1 messages are what gloo sends one after another; NCCL posts them as one
group, so on a switch its latency lies between alpha and (P - 1) alpha: the formula is the
pessimistic end, and `latency_rounds` says how many alphas it charges. All-to-all also needs full
bisection bandwidth (every rank talks to every rank at once): an NVSwitch node has it, a fabric
across nodes often does not, which is why engines keep Ulysses inside a node.

What can hide behind compute (`OVERLAP`) is the other half of the lesson: a ring hop travels
while the previous block's attention runs, an all-gather of K/V can be prefetched a layer ahead
(if memory holds it), but Ulysses' all-to-alls sit on the critical path: attention needs their
output, and the next layer needs attention's.
"""

from __future__ import annotations

from typing import NamedTuple

from cpcourse.support.errors import positive_float, positive_int, require

KINDS = ("send_recv", "all_gather", "reduce_scatter", "all_reduce", "all_to_all")

# Whether a CP engine can hide the collective behind compute, and why: the course's ring
# (notebook 04), diffusers' all-gather "ring" (attention_dispatch.TemplatedRingAttention),
# Ulysses (notebook 05).
OVERLAP = {
    "send_recv": (True, "a ring hop travels while the block before it is attended"),
    "all_gather": (True, "K/V can be gathered a layer ahead, at the cost of holding them"),
    "reduce_scatter": (False, "its result is needed by the next operation"),
    "all_reduce": (False, "its result is needed by the next operation"),
    "all_to_all": (False, "attention needs its output: Ulysses' all-to-alls are exposed"),
}


def latency_rounds(kind: str, world: int) -> int:
    """How many alphas one `kind` collective over `world` ranks pays (messages in sequence)."""
    require(kind in KINDS, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    world = positive_int("world", world)
    if world == 1:
        return 0
    return {"send_recv": 1, "all_reduce": 2 * (world - 1)}.get(kind, world - 1)


def bytes_sent(kind: str, nbytes: float, world: int) -> float:
    """Bytes the busiest rank sends in one `kind` collective (the table in the module doc)."""
    require(kind in KINDS, f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    world = positive_int("world", world)
    require(nbytes >= 0, f"nbytes must be >= 0, got {nbytes}")
    if world == 1:
        return 0.0
    p = world
    return {"send_recv": nbytes, "all_gather": (p - 1) * nbytes,
            "reduce_scatter": (p - 1) * nbytes, "all_reduce": 2 * (p - 1) * nbytes / p,
            "all_to_all": (p - 1) * nbytes / p}[kind]


def collective_seconds(kind: str, nbytes: float, world: int, *, alpha: float,
                       gbps: float) -> dict:
    """Time of one `kind` collective: latency_rounds x alpha + bytes_sent / (gbps x 1e9).

    `alpha` in seconds per message, `gbps` decimal GB/s one rank sends at. Keys: kind, world,
    nbytes, bytes_sent, rounds, latency_s, transfer_s, seconds, overlaps (bool), why."""
    require(alpha >= 0, f"alpha is a latency in seconds, >= 0; got {alpha}")
    gbps = positive_float("gbps", gbps, low=1e-6, high=1e6)
    sent, rounds = bytes_sent(kind, nbytes, world), latency_rounds(kind, world)
    lat, xfer = rounds * alpha, sent / (gbps * 1e9)
    overlaps, why = OVERLAP[kind]
    return {"kind": kind, "world": world, "nbytes": nbytes, "bytes_sent": sent,
            "rounds": rounds, "latency_s": lat, "transfer_s": xfer, "seconds": lat + xfer,
            "overlaps": overlaps, "why": why}


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares (alpha, GB/s) from messages timed alone: `seconds[i]` for `sizes[i]` bytes.

    Needs two sizes at least; a negative intercept (noise on a fast link) is clipped to 0."""
    require(len(sizes) == len(seconds) >= 2 and len(set(sizes)) >= 2,
            "fit_alpha_beta needs timings of at least two different message sizes")
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(seconds) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes, seconds, strict=True)) / sxx
    require(slope > 0, "the timings do not grow with the message size: time larger messages")
    return max(0.0, my - slope * mx), 1.0 / slope / 1e9


def attention_collectives(method: str, tokens_per_rank: int, heads: int, head_dim: int,
                          world: int, dtype_bytes: int = 2) -> list[tuple[str, float, int]]:
    """The collectives one attention layer issues under `method` on `world` ranks, as
    (kind, nbytes, how many), for `collective_seconds`. L = tokens_per_rank, E = H D b.

    ring       P - 1 send_recv of the K/V block, 2 L E each (each can hide behind a block)
    allgather  one all_gather of K and one of V, L E each (diffusers' "ring")
    ulysses    all_to_all of q, k, v and of the output, L E each (exposed)
    """
    require(method in ("ring", "allgather", "ulysses"),
            f"method must be ring, allgather or ulysses, got {method!r}")
    e = positive_int("heads", heads) * positive_int("head_dim", head_dim) * dtype_bytes
    n = positive_int("tokens_per_rank", tokens_per_rank) * e
    world = positive_int("world", world)
    if world == 1:
        return []
    if method == "ring":
        return [("send_recv", 2 * n, world - 1)]
    if method == "allgather":
        return [("all_gather", n, 2)]
    require(heads % world == 0, f"ulysses: {world} ranks do not divide the {heads} heads")
    return [("all_to_all", n, 4)]


def attention_comm_seconds(method: str, tokens_per_rank: int, heads: int, head_dim: int,
                           world: int, *, alpha: float, gbps: float,
                           dtype_bytes: int = 2) -> dict:
    """Total and overlappable communication seconds of one attention layer under `method`
    (`attention_collectives`), each collective priced by `collective_seconds`. Keys: method,
    seconds, overlappable_s, exposed_s (what no schedule can hide), latency_s, bytes_sent."""
    out = {"method": method, "seconds": 0.0, "overlappable_s": 0.0, "exposed_s": 0.0,
           "latency_s": 0.0, "bytes_sent": 0.0}
    for kind, nbytes, count in attention_collectives(method, tokens_per_rank, heads, head_dim,
                                                     world, dtype_bytes):
        c = collective_seconds(kind, nbytes, world, alpha=alpha, gbps=gbps)
        key = "overlappable_s" if c["overlaps"] else "exposed_s"
        out[key] += count * c["seconds"]
        out["seconds"] += count * c["seconds"]
        out["latency_s"] += count * c["latency_s"]
        out["bytes_sent"] += count * c["bytes_sent"]
    return out


class Layer(NamedTuple):
    """One attention layer's size: `tokens` in the whole sequence, `heads` of `head_dim`,
    `dtype_bytes` per element (bf16: 2)."""

    tokens: int
    heads: int
    head_dim: int
    dtype_bytes: int = 2


def layer_seconds(method: str, layer: Layer, world: int, *, flops: float, alpha: float,
                  gbps: float) -> dict:
    """One attention `layer` (even split over `world` ranks) under `method`: its compute at
    `flops` FLOP/s per rank, its communication (`attention_comm_seconds`) and what of it is
    exposed. Ring: a hop hides behind the step beside it, so (P - 1) x max(0, hop - step)
    shows. All-gather: all of it, unless prefetched a layer ahead (memory permitting).
    Ulysses: all of it. Keys: method, compute_s, comm_s, exposed_s, latency_s, seconds."""
    world = positive_int("world", world)
    lq = positive_int("tokens", layer.tokens) / world
    compute = (4 * lq * layer.tokens * layer.head_dim * layer.heads
               / positive_float("flops", flops, low=1.0))
    c = attention_comm_seconds(method, max(1, round(lq)), layer.heads, layer.head_dim, world,
                               alpha=alpha, gbps=gbps, dtype_bytes=layer.dtype_bytes)
    if method == "ring" and world > 1:
        hop, step = c["overlappable_s"] / (world - 1), compute / world
        exposed = (world - 1) * max(0.0, hop - step)
    else:
        exposed = c["seconds"]
    return {"method": method, "compute_s": compute, "comm_s": c["seconds"],
            "exposed_s": exposed, "latency_s": c["latency_s"], "seconds": compute + exposed}


def usp_layer_seconds(layer: Layer, ulysses: int, ring: int, *, flops: float, alpha: float,
                      intra_gbps: float, inter_gbps: float) -> dict:
    """One attention `layer` under USP on `ulysses` x `ring` GPUs: Ulysses' all-to-alls inside
    a group of `ulysses` (at `intra_gbps`, NVLink), then a ring of `ring` groups (at
    `inter_gbps`, one NIC per GPU) in which each GPU carries only heads / ulysses heads, so a
    hop's bytes, and the NIC's floor, divide by `ulysses`. Keys: compute_s, exposed_s (the
    all-to-alls plus what the ring does not hide), ring_bytes_per_gpu, seconds."""
    u, r = positive_int("ulysses", ulysses), positive_int("ring", ring)
    require(layer.heads % u == 0,
            f"usp: a Ulysses degree of {u} must divide the {layer.heads} heads")
    uly = attention_comm_seconds("ulysses", max(1, round(layer.tokens / (u * r))), layer.heads,
                                 layer.head_dim, u, alpha=alpha, gbps=intra_gbps,
                                 dtype_bytes=layer.dtype_bytes)
    per_group = layer._replace(heads=layer.heads // u)
    rg = layer_seconds("ring", per_group, r, flops=flops, alpha=alpha, gbps=inter_gbps)
    ring_bytes = attention_comm_seconds("ring", max(1, round(layer.tokens / r)), per_group.heads,
                                        layer.head_dim, r, alpha=alpha, gbps=inter_gbps,
                                        dtype_bytes=layer.dtype_bytes)["bytes_sent"]
    exposed = uly["exposed_s"] + rg["exposed_s"]
    return {"compute_s": rg["compute_s"], "exposed_s": exposed, "ring_bytes_per_gpu": ring_bytes,
            "seconds": rg["compute_s"] + exposed}
