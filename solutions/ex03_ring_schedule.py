"""Exercises of notebook 03, the ring simulated: the schedule, who holds and sends what when, and
how long a layer's ring takes.

    python -m pytest tests/graded --ex 03.1 --impl exercises   # 03.1, 03.2

P ranks sit on a ring; rank r passes K/V blocks to rank (r + 1) mod P and receives from rank
(r - 1) mod P. At step 0 every rank holds its own K/V block. The library's simulator
(`cpcourse.sim.simulate_ring`) lets the schedule emerge from the passing and records it in its
trace; here you write the schedule down directly and the notebook checks it against that trace.
"""

from __future__ import annotations


def ring_step(step: int, world: int) -> list[dict]:
    """What every rank does at ring step `step` (0 <= step < world) of a `world`-rank ring.

    Returns one dict per rank, in rank order, with keys:
      "rank":      r
      "holds":     the K/V block (numbered by its owner rank) r computes on at this step
      "send_to":   the rank r passes that block to, or None at the last step (nothing left to pass)
      "recv_from": the rank r receives its next block from, or None at the last step
      "receives":  the block r receives (and computes on at step + 1), or None at the last step
    Example, world = 4, step = 1: rank 0 holds block 3, sends it to rank 1, receives block 2
    from rank 3.
    """
    # BEGIN SOLUTION 03.1 | notebook 03, "The schedule"
    # | hint: section 2: every step, each block moves one rank forward around the ring, so trace a
    # | block number backwards to find what rank r holds after `step` passes. What r receives is
    # | what its left neighbour holds now. Only the last step passes nothing: there the three send
    # | and receive keys are None.
    # | hint2: P = 4, step = 2: ranks 0..3 hold blocks [2, 3, 0, 1]; rank 0 sends to 1 and receives
    # | from 3, which holds block 1, so rank 0 receives block 1 (and indeed holds block 1 at step
    # | 3). At step 3, the last, rank 0 holds block 1 and everything else is None. P = 1: step 0 is
    # | already the last step.
    # | hint3: holds = (r - step) % P; send_to = (r + 1) % P; recv_from = (r - 1) % P; receives = (r
    # | - 1 - step) % P; the last three are None when step == P - 1.
    last = step == world - 1
    plan = []
    for r in range(world):
        prev = (r - 1) % world
        plan.append({"rank": r, "holds": (r - step) % world,
                     "send_to": None if last else (r + 1) % world,
                     "recv_from": None if last else prev,
                     "receives": None if last else (prev - step) % world})
    return plan
    # END SOLUTION


def ring_layer_seconds(world: int, tokens_per_rank: int, heads: int, head_dim: int,
                       bytes_per_element: int, flops_per_s: float, bytes_per_s: float,
                       latency_s: float = 0.0) -> dict:
    """Predict how long one attention layer's ring takes, overlapped and blocking.

    `world` ranks each hold `tokens_per_rank` tokens (an even split), `heads` heads of dimension
    `head_dim`, K and V in `bytes_per_element` bytes per element. Attending Lq queries to a
    block of Lk keys costs 4 * Lq * Lk * head_dim * heads FLOPs at `flops_per_s`; one hop moves
    a block's K and V and costs latency_s + its bytes / bytes_per_s. Return {"overlap": s,
    "blocking": s}: the time at which the last rank finishes, from the start, as
    `cpcourse.sim.timeline` measures the simulated ring (overlap=True and overlap=False).
    """
    # BEGIN SOLUTION 03.2 | notebook 03, "A per-rank timeline"
    # | hint: section 5 and the pictures of section 3: count the ring's steps and its hops (does
    # | the last step send anything?), price one step's compute and one hop, and decide what one
    # | step costs when the hop runs beside the compute and when it waits for it. With an even
    # | split every rank keeps in step with its neighbours.
    # | hint2: P = 3, 1,000 tokens per rank, 1 head of 64, 2 bytes: a step computes 4 * 1000^2 *
    # | 64 = 2.56e8 FLOPs, 2.56 ms at 1e11 FLOP/s; a hop moves 2 * 1000 * 64 * 2 = 256,000 bytes,
    # | 2.56 ms at 1e8 B/s, 3.56 ms with a 1 ms latency. Two steps send, the third does not: 3.56
    # | + 3.56 + 2.56 = 9.68 ms overlapped, 2.56 + 3.56 + 2.56 + 3.56 + 2.56 = 14.8 ms blocking.
    # | hint3: c = 4 L^2 D H / F; t = latency_s + 2 L D H b / B; overlap = (P - 1) * max(c, t) + c;
    # | blocking = (P - 1) * (c + t) + c.
    lq = tokens_per_rank
    compute = 4 * lq * lq * head_dim * heads / flops_per_s
    hop = latency_s + 2 * lq * head_dim * heads * bytes_per_element / bytes_per_s
    hops = world - 1
    return {"overlap": hops * max(compute, hop) + compute,
            "blocking": hops * (compute + hop) + compute}
    # END SOLUTION
