"""Graded tests of notebook 03: the ring schedule against the simulator's own trace (03.1), and
the predicted time of a layer's ring against the simulated timeline (03.2).

    python -m pytest tests/graded --ex 03.1 --impl solutions
"""

import math

import pytest
import torch

from cpcourse.sim import simulate_ring, timeline
from cpcourse.viz.ring import at_scale


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


# --- 03.2 predicting the ring's time --------------------------------------------------------------

def _simulated_seconds(world, tokens_per_rank, heads, head_dim, elem, flops, bw, latency, overlap):
    x = torch.zeros(1, 1, world, 2)
    events = at_scale(simulate_ring(x, x, x, world).events, tokens_per_rank * world, heads,
                      head_dim, elem)
    return max(r["end"] for r in timeline(events, world, flops, bw, overlap=overlap,
                                          latency_s=latency))


# (world, tokens per rank, heads, head_dim, bytes, FLOP/s, B/s, latency): hidden and not
TIMING = [(1, 5000, 8, 64, 2, 1e12, 1e9, 0.0), (2, 3000, 4, 128, 2, 4e14, 4e11, 0.0),
          (5, 9450, 40, 128, 2, 5.9e14, 3.6e11, 0.0), (8, 9450, 40, 128, 2, 5.9e14, 4.7e10, 0.0),
          (3, 1000, 1, 64, 2, 1e11, 1e8, 1e-3), (7, 333, 12, 64, 4, 2e13, 2.2e10, 2e-5),
          (16, 2048, 24, 128, 2, 5.9e14, 4.7e10, 1.5e-5)]


@pytest.mark.ex("03.2")
def test_predicted_time_matches_the_simulated_timeline(impl):
    mod = impl("ex03_ring_schedule")
    for world, lq, heads, head_dim, elem, flops, bw, latency in TIMING:
        got = mod.ring_layer_seconds(world, lq, heads, head_dim, elem, flops, bw,
                                     latency_s=latency)
        assert isinstance(got, dict) and {"overlap", "blocking"} <= set(got), \
            f"ring_layer_seconds returned {got!r}: want a dict with 'overlap' and 'blocking'"
        case = (f"P={world}, {lq} tokens per rank, {heads} heads of {head_dim}, {elem} B, "
                f"F={flops:.3g} FLOP/s, B={bw:.3g} B/s, latency {latency:g} s")
        for mode in ("overlap", "blocking"):
            want = _simulated_seconds(world, lq, heads, head_dim, elem, flops, bw, latency,
                                      mode == "overlap")
            assert math.isclose(got[mode], want, rel_tol=1e-9), (
                f"{case}: {mode} = {got[mode]!r} s, the simulated timeline ends at {want!r} s. "
                "Count the steps and the hops (the last step sends nothing), and what one step "
                f"costs when the hop {'runs beside' if mode == 'overlap' else 'waits for'} "
                "the compute.")
