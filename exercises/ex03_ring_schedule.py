# Yours to edit. Generated from solutions/ex03_ring_schedule.py by tools/make_exercises.py
# stub-sha256: f19d9ec6a1d0ba18 (how the generator tells your edits from its output)
# ruff: noqa: F401, F841, E501
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
    # Exercise 03.1: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 03.1 ring_step: read notebook 03, \"The schedule\". Hint: section 2: "
        "every step, each block moves one rank forward around the ring, so trace a "
        "block number backwards to find what rank r holds after `step` passes. What r "
        "receives is what its left neighbour holds now. Only the last step passes "
        "nothing: there the three send and receive keys are None. (2 more: "
        "cpcourse.hint(\"03.1\"))"
    )


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
    # Exercise 03.2: write your code here, then delete the raise.
    raise NotImplementedError(
        "Exercise 03.2 ring_layer_seconds: read notebook 03, \"A per-rank timeline\". "
        "Hint: section 5 and the pictures of section 3: count the ring's steps and "
        "its hops (does the last step send anything?), price one step's compute and "
        "one hop, and decide what one step costs when the hop runs beside the compute "
        "and when it waits for it. With an even split every rank keeps in step with "
        "its neighbours. (2 more: cpcourse.hint(\"03.2\"))"
    )
