"""Exercise of notebook 03, the ring simulated: the schedule, who holds and sends what when.

    python -m pytest tests/graded --ex 03.1 --impl exercises

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
