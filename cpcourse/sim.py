"""The ring, simulated: P virtual ranks in one process, with a trace of every compute and transfer.

    python -m cpcourse.sim            # prints the schedule and the trace of a 4-rank ring

`simulate_ring(q, k, v, world)` splits the whole sequence like `torch.tensor_split`, gives each
virtual rank its shard and runs the ring exactly as `cpcourse.ring` does on real processes: at
step s rank r attends its queries to the K/V block it holds (`attention_with_lse`), folds it in
with `merge_attention`, then passes the block to rank r + 1 through a mailbox and takes the one
rank r - 1 left it. Nothing about the schedule is hard-coded: which block is where emerges from
the passing, and the trace records it. Milliseconds for any P, no processes, no network.

Trace events (`Event`): "compute" (rank, step, q_block, kv_block, tokens, flops) and "send" /
"recv" (rank, peer, the block that travels, payload bytes: K and V of that block). `timeline`
turns a trace into start/end times per rank from a compute rate and a link bandwidth, with or
without overlap, for the per-rank timeline figure. `compute_path` times the ring's arithmetic
(P^2 blocks and merges on one device) against one fused call: `cpcourse bench ring
--compute-only`, the GPU check of whether splitting the work costs anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.attention import attention_with_lse, merge_attention
from cpcourse.support.errors import positive_float, positive_int, require


@dataclass(frozen=True)
class Event:
    """One thing a virtual rank did at one ring step.

    kind: "compute" | "send" | "recv". kv_block: whose K/V block was computed on or travelled.
    peer: the other rank of a send (destination) or recv (source). nbytes: payload of a
    send/recv (K and V of the block), 0 for compute. flops: 4 * B * H * Lq * Lk * D for compute.
    """

    kind: str
    step: int
    rank: int
    kv_block: int
    q_block: int = -1
    peer: int = -1
    nbytes: int = 0
    q_tokens: int = 0
    kv_tokens: int = 0
    flops: int = 0


@dataclass
class SimResult:
    """out `[B, H, L, D]` (the shards' outputs concatenated), lse `[B, H, L]`, the trace."""

    out: torch.Tensor
    lse: torch.Tensor
    events: list[Event]
    world: int
    shard_sizes: list[int]

    def shard_outputs(self) -> list[torch.Tensor]:
        return list(torch.split(self.out, self.shard_sizes, dim=2))


def ring_schedule(world: int) -> list[list[int]]:
    """schedule[step][rank] = the K/V block rank holds at that step: (rank - step) mod P."""
    world = positive_int("world", world)
    return [[(rank - step) % world for rank in range(world)] for step in range(world)]


def simulate_ring(q, k, v, world: int, scale=None, attention=attention_with_lse,
                  merge=merge_attention) -> SimResult:
    """Ring attention over `world` virtual ranks. q, k, v: the WHOLE sequence `[B, H, L, D]`.

    `attention(q, k, v, scale=) -> (out, lse)` and `merge(out_a, lse_a, out_b, lse_b)` default
    to cpcourse.attention's; pass your own to test them inside the ring.
    """
    world = positive_int("world", world)
    require(q.dim() == 4 and k.dim() == 4 and k.shape == v.shape,
            f"q, k, v must be [B, H, L, D] with k and v of one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    qs = torch.tensor_split(q, world, dim=2)
    held = [(r, torch.stack([kb, vb])) for r, (kb, vb) in
            enumerate(zip(torch.tensor_split(k, world, dim=2),
                          torch.tensor_split(v, world, dim=2), strict=True))]
    acc: list = [None] * world
    events: list[Event] = []
    b, h, _, d = q.shape
    for step in range(world):
        for rank in range(world):
            block, kv = held[rank]
            o, lse = attention(qs[rank], kv[0], kv[1], scale=scale)
            acc[rank] = (o, lse) if acc[rank] is None else merge(*acc[rank], o, lse)
            events.append(Event("compute", step, rank, block, q_block=rank,
                                q_tokens=qs[rank].shape[2], kv_tokens=kv.shape[3],
                                flops=4 * b * h * qs[rank].shape[2] * kv.shape[3] * d))
        if step == world - 1:
            break  # the last block is used, not passed on
        mailbox: list = [None] * world
        for rank in range(world):
            dst, (block, kv) = (rank + 1) % world, held[rank]
            nbytes = kv.numel() * kv.element_size()
            events.append(Event("send", step, rank, block, peer=dst, nbytes=nbytes))
            mailbox[dst] = held[rank]
        for rank in range(world):
            block, kv = mailbox[rank]
            events.append(Event("recv", step, rank, block, peer=(rank - 1) % world,
                                nbytes=kv.numel() * kv.element_size()))
        held = mailbox
    out = torch.cat([o.to(q.dtype) for o, _ in acc], dim=2)
    lse = torch.cat([lse for _, lse in acc], dim=2)
    return SimResult(out, lse, events, world, [x.shape[2] for x in qs])


def bytes_sent(events: list[Event], world: int) -> list[int]:
    """Payload bytes each rank sent over the whole ring."""
    total = [0] * world
    for e in events:
        if e.kind == "send":
            total[e.rank] += e.nbytes
    return total


def block_grid(events: list[Event], world: int) -> list[list[int]]:
    """grid[q_block][kv_block] = the step at which that pair was computed (the block grid)."""
    grid = [[-1] * world for _ in range(world)]
    for e in events:
        if e.kind == "compute":
            grid[e.q_block][e.kv_block] = e.step
    return grid


def timeline(events: list[Event], world: int, flops_per_s: float, bytes_per_s: float,
             overlap: bool = True, latency_s: float = 0.0) -> list[dict]:
    """Start and end of each rank's compute and communication at each step, in seconds.

    A transfer from rank r - 1 to r starts once both are in the step (overlap) or have finished
    computing (blocking) and takes latency_s + bytes / bytes_per_s; a step ends when its compute
    and both of its transfers (in and out) are done. Returns dicts with rank, step, kind
    ("compute" | "comm"), start, end.
    """
    flops_per_s, bytes_per_s = positive_float("flops_per_s", flops_per_s), positive_float(
        "bytes_per_s", bytes_per_s)
    comp = {(e.rank, e.step): e.flops / flops_per_s for e in events if e.kind == "compute"}
    comm = {(e.rank, e.step): (latency_s + e.nbytes / bytes_per_s) if e.nbytes else 0.0
            for e in events if e.kind == "send"}  # keyed by the sender
    steps = 1 + max(e.step for e in events)
    start, rows = [0.0] * world, []
    for step in range(steps):
        ready = [start[r] + (0.0 if overlap else comp[(r, step)]) for r in range(world)]
        xfer_end = {}
        for r in range(world):  # transfer r -> r + 1
            if (r, step) in comm:
                nxt = (r + 1) % world
                t0 = max(ready[r], ready[nxt])
                xfer_end[r] = t0 + comm[(r, step)]
                rows.append({"rank": r, "step": step, "kind": "comm", "start": t0,
                             "end": xfer_end[r]})
        end = []
        for r in range(world):
            done = start[r] + comp[(r, step)]
            rows.append({"rank": r, "step": step, "kind": "compute", "start": start[r],
                         "end": done})
            end.append(max([done] + [xfer_end[x] for x in (r, (r - 1) % world)
                                     if x in xfer_end]))
        start = end
    return rows


def compute_path(seq_len: int, world: int, heads: int, head_dim: int, device: str,
                 repeats: int) -> dict:
    """The ring's arithmetic without the network: every (query shard, K/V shard) block of P
    virtual ranks through attention_with_lse + merge_attention, on one device, against one
    fused attention_with_lse over the whole sequence. Same FLOPs; the ratio is what splitting
    into P^2 blocks and merging costs. bf16 on CUDA, float32 on CPU."""
    import statistics
    import time

    from cpcourse.attention import attention_backend

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, heads, seq_len, head_dim, generator=g, device=device, dtype=dtype)
               for _ in range(3))
    qs, ks, vs = (torch.tensor_split(x, world, dim=2) for x in (q, k, v))

    def ring():
        outs = []
        for r in range(world):
            acc = None
            for step in range(world):
                b = (r - step) % world
                o, lse = attention_with_lse(qs[r], ks[b], vs[b])
                acc = (o, lse) if acc is None else merge_attention(*acc, o, lse)
            outs.append(acc[0])
        return outs

    def timed(fn):
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    fused_s = timed(lambda: attention_with_lse(q, k, v))
    ring_s = timed(ring)
    diff = float((torch.cat(ring(), dim=2).float() - attention_with_lse(q, k, v)[0].float())
                 .abs().max())
    return {"compute_only": True, "device": device, "dtype": str(dtype).replace("torch.", ""),
            "backend": attention_backend(qs[0], ks[0], vs[0]), "nproc": world,
            "seq_len": seq_len, "heads": heads, "head_dim": head_dim,
            "threads": torch.get_num_threads() if device == "cpu" else None,
            "fused_seconds": fused_s, "ring_compute_seconds": ring_s,
            "fused_over_ring": fused_s / ring_s, "target_min": 0.9, "max_abs_diff": diff}


def _demo() -> None:
    world = 4
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 10, 8, generator=g) for _ in range(3))
    res = simulate_ring(q, k, v, world)
    print("schedule[step][rank] = K/V block held:")
    for step, row in enumerate(ring_schedule(world)):
        print(f"  step {step}: {row}")
    for e in res.events:
        print(f"  {e}")
    print("bytes sent per rank:", bytes_sent(res.events, world))


if __name__ == "__main__":
    _demo()
