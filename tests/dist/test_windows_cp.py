"""Long videos on P ranks equal one process: windows across ranks and CP inside each window.

    python -m pytest tests/dist/test_windows_cp.py -q

A small random DiT with full 3D attention and a frame embedding (the trained model's kind);
lengths the stride does not divide, windows that do not split evenly over the ranks, both
blends. One launch per world size runs every case.
"""

from __future__ import annotations

import pytest

from cpcourse.launch import launch
from cpcourse.tinydit.model import DiTConfig, build_model
from cpcourse.tinydit.sampling import initial_noise
from cpcourse.tinydit.windows import sample_windows

pytestmark = pytest.mark.dist
CFG = dict(in_channels=3, patch=4, hidden=32, heads=2, depth=2, attention="full",
           num_motions=4, prediction="sample", frame_embed=True)
CASES = [  # frames, window, stride, blend
    (19, 6, 4, "pyramid"),  # starts 0, 4, 8, 12, 13
    (13, 5, 3, "flat"),     # starts 0, 3, 6, 8
]


def run_cases(parallels: list[str]) -> list:
    import torch.distributed as dist

    model = build_model(DiTConfig(**CFG), 0)
    out = []
    for parallel in parallels:
        for i, (frames, window, stride, blend) in enumerate(CASES):
            noise = initial_noise((1, 3, frames, 8, 8), i)
            stats: dict = {}
            x = sample_windows(model, noise, (1, 2), 3, 4.0, window, stride, blend,
                               group=dist.group.WORLD, parallel=parallel, stats=stats)
            out.append({"x": x, "bytes": stats["bytes_per_step"], "mine": stats["my_windows"]})
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_both_parallel_modes_equal_one_process(world):
    parallels = ["windows", "cp"]
    per_rank = launch("tests/dist/test_windows_cp.py:run_cases", world, args=(parallels,),
                      timeout=240, stream=False)
    model = build_model(DiTConfig(**CFG), 0)
    i = 0
    for parallel in parallels:
        for c, (frames, window, stride, blend) in enumerate(CASES):
            want = sample_windows(model, initial_noise((1, 3, frames, 8, 8), c), (1, 2), 3,
                                  4.0, window, stride, blend)
            for rank, res in enumerate(per_rank):
                err = float((res[i]["x"] - want).abs().max())
                assert err <= 1e-5, f"{parallel}, case {c}, rank {rank}/{world}: {err:.2e}"
            owned = sorted(k for res in per_rank for k in res[i]["mine"])
            if parallel == "windows":  # every window on exactly one rank
                assert owned == list(range(len(owned))) and len(set(owned)) == len(owned)
            sent = per_rank[0][i]["bytes"]
            assert (sent == 0) == (world == 1), f"{parallel} on {world} ranks sent {sent} bytes"
            i += 1
