"""Long videos on P ranks equal one process: windows across ranks and CP inside each window.

    python -m pytest tests/dist/test_windows_cp.py -q

A small random DiT with full 3D attention and a frame embedding (the trained model's kind);
lengths the stride does not divide, windows that do not split evenly over the ranks, both
blends, new noise and guidance every session (tests/conftest.py's CPCOURSE_TEST_SEED); at two
ranks also the shipped trained model on random seeds. One launch per world size runs every case.
The limit is `cpcourse.support.tolerance`'s: CP inside a window merges the ring's partial
softmaxes in another order (1e-5 relative), guidance multiplies that by 1 + 2|g|, and the
sampler does not compound it (the last step returns its prediction).
"""

from __future__ import annotations

import pytest

from cpcourse.launch import launch
from cpcourse.runs.long_video import check_request
from cpcourse.support.tolerance import tolerance
from cpcourse.tinydit.model import DiTConfig, build_model
from cpcourse.tinydit.sampling import initial_noise
from cpcourse.tinydit.windows import WindowSampling, sample_windows

pytestmark = pytest.mark.dist
CFG = dict(in_channels=3, patch=4, hidden=32, heads=2, depth=2, attention="full",
           num_motions=4, prediction="sample", frame_embed=True)
CASES = [  # frames, window, stride, blend
    (19, 6, 4, "pyramid"),  # starts 0, 4, 8, 12, 13
    (13, 5, 3, "flat"),     # starts 0, 3, 6, 8
]


def run_cases(parallels: list[str], draws: list[tuple[int, float]], trained: list[dict]) -> list:
    import torch.distributed as dist

    from cpcourse.tinydit.windows import windows_rank

    model = build_model(DiTConfig(**CFG), 0)
    out = []
    for parallel in parallels:
        for (frames, window, stride, blend), (seed, g) in zip(CASES, draws, strict=True):
            noise = initial_noise((1, 3, frames, 8, 8), seed)
            stats: dict = {}
            how = WindowSampling(3, g, window, stride, blend, parallel)
            x = sample_windows(model, noise, (1, 2), how, group=dist.group.WORLD, stats=stats)
            out.append({"x": x, "bytes": stats["bytes_per_step"], "mine": stats["my_windows"]})
    return out, [windows_rank(spec)["latents"] for spec in trained]


def _trained_specs(rng, world: int) -> list:
    """The shipped model, CP inside each window, on two random seeds (two ranks only: slow)."""
    if world != 2:
        return []
    return [check_request(2, rng.randrange(2**31), prompt="circle-right", frames=12, window=8,
                          stride=4, parallel="cp", steps=4) for _ in range(2)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_both_parallel_modes_equal_one_process(world, cases_rng):
    from cpcourse.tinydit.windows import windows_rank

    parallels = ["windows", "cp"]
    draws = [(cases_rng.randrange(2**31), round(cases_rng.uniform(-8, 8), 2)) for _ in CASES]
    trained = _trained_specs(cases_rng, world)
    per_rank = launch("tests/dist/test_windows_cp.py:run_cases", world,
                      args=(parallels, draws, trained), timeout=240, stream=False)
    for spec, got in zip(trained, per_rank[0][1], strict=True):
        want = windows_rank(spec)["latents"]
        err, tol = float((got - want).abs().max()), tolerance("ring", "fp32", spec.cfg_scale,
                                                              float(want.abs().max()))
        assert err <= tol, f"shipped model, seed {spec.seed}: {err:.2e} > {tol:.2e}"
    per_rank = [res[0] for res in per_rank]
    model = build_model(DiTConfig(**CFG), 0)
    i = 0
    for parallel in parallels:
        for c, (frames, window, stride, blend) in enumerate(CASES):
            seed, g = draws[c]
            want = sample_windows(model, initial_noise((1, 3, frames, 8, 8), seed), (1, 2),
                                  WindowSampling(3, g, window, stride, blend))
            tol = tolerance("ring" if parallel == "cp" else "windows", "fp32", g,
                            float(want.abs().max()))
            for rank, res in enumerate(per_rank):
                err = float((res[i]["x"] - want).abs().max())
                assert err <= tol, (f"{parallel}, case {c} (noise seed {seed}, guidance {g}), "
                                    f"rank {rank}/{world}: {err:.2e} > {tol:.2e}")
            owned = sorted(k for res in per_rank for k in res[i]["mine"])
            if parallel == "windows":  # every window on exactly one rank
                assert owned == list(range(len(owned))) and len(set(owned)) == len(owned)
            sent = per_rank[0][i]["bytes"]
            assert (sent == 0) == (world == 1), f"{parallel} on {world} ranks sent {sent} bytes"
            i += 1
