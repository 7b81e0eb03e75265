"""Graded test of notebook 03: the ring schedule against the simulator's own trace.

    python -m pytest tests/graded --ex 03.1 --impl solutions
"""

import pytest
import torch

from cpcourse.sim import simulate_ring


def _trace(world: int) -> dict:
    """(step, rank) -> what the simulator saw that rank do: the block it computed on, its
    send's destination and its receive's source and block (None where nothing moved)."""
    q = torch.zeros(1, 1, world, 2)  # one token per rank is enough to run the schedule
    seen = {}
    for e in simulate_ring(q, q, q, world).events:
        row = seen.setdefault((e.step, e.rank), {"rank": e.rank, "holds": None, "send_to": None,
                                                 "recv_from": None, "receives": None})
        if e.kind == "compute":
            row["holds"] = e.kv_block
        elif e.kind == "send":
            row["send_to"] = e.peer
        else:
            row["recv_from"], row["receives"] = e.peer, e.kv_block
    return seen


@pytest.mark.ex("03.1")
def test_schedule_matches_the_simulated_ring(impl):
    mod = impl("ex03_ring_schedule")
    for world in range(1, 8):
        want = _trace(world)
        for step in range(world):
            got = mod.ring_step(step, world)
            assert isinstance(got, list) and len(got) == world, \
                f"P={world}, step {step}: want a list of {world} dicts (one per rank), got {got!r}"
            for r, row in enumerate(got):
                for key, value in want[step, r].items():
                    assert row.get(key) == value, (
                        f"P={world}, ring step {step}, rank {r}: {key} = {row.get(key)!r}, the "
                        f"simulated ring has {value!r} (full row: {want[step, r]})")
