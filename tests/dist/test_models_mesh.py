"""diffusers' Wan (and HunyuanVideo, CogVideoX without TP) on a cfg x ring x ulysses x tp mesh:
the same output as one process for every 4-rank layout and a 3-D 8-rank one, with the bytes per
mesh dim equal to `cpcourse.models.costs`. One launch per world size runs every case."""

import pytest

from cpcourse.launch import launch
from cpcourse.models.compare import guidance, reference, tolerance

pytestmark = pytest.mark.dist

BASE = {"frames": 5, "height": 8, "width": 8, "batch": 1, "dtype": "float32", "seed": 2,
        "repeat": 0, "cfg_scale": 5.0}


def _case(arch, layout, **extra):
    from cpcourse.runs.models import ModelsRequest

    full = {"cfg": 1, "ring": 1, "ulysses": 1, "tp": 1, **layout}
    return ModelsRequest(**BASE, arch=arch, layout=full, **extra)  # nproc: the layout's world


CASES = {4: [_case("wan", {"cfg": 2, "ring": 2}, sample_steps=2),
             _case("wan", {"cfg": 2, "ulysses": 2}, sample_steps=2, shard_io=True),
             _case("wan", {"ulysses": 2, "ring": 2}),
             _case("wan", {"tp": 2, "ring": 2}, sample_steps=2),
             _case("wan", {"cfg": 2, "tp": 2}, sample_steps=2),
             _case("wan", {"tp": 4}),
             _case("wan2.2", {"tp": 2, "ulysses": 2}),
             _case("hunyuanvideo", {"ulysses": 2, "ring": 2}),
             _case("cogvideox", {"cfg": 2, "ring": 2}, sample_steps=2)],
         8: [_case("wan", {"cfg": 2, "ulysses": 2, "ring": 2}, sample_steps=2)]}


def every_case(cases):
    from cpcourse.models.compare import rank_forward

    return [rank_forward(req) for req in cases] + [_different_latents()]


def _different_latents():
    """Ranks that pass different whole latents: one clear error on every rank, no hang (the
    ring skips its own agreement, so the forward's split must catch it)."""
    import torch
    import torch.distributed as dist

    from cpcourse.models import build, example_inputs, parallelize
    from cpcourse.support.errors import InputError

    model = parallelize(build("wan", seed=0), method="ring")
    inputs = example_inputs("wan", 4 + dist.get_rank() % 2, 8, 8, seed=1)
    try:
        with torch.inference_mode():
            model(**inputs, return_dict=False)
    except InputError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="module")
def runs():
    return {p: launch(f"{__file__}:every_case", p, timeout=300, args=(CASES[p],), stream=False)
            for p in CASES}


@pytest.mark.parametrize("world", [4, 8])
def test_every_layout_equals_one_process(runs, world):
    for i, req in enumerate(CASES[world]):
        ref, _ = reference(req)
        tol = tolerance("usp", "float32", guidance(req),
                        scale=float(ref.double().abs().max()))
        for r in (res[i] for res in runs[world]):
            err = float((r["out"] - ref).abs().max())
            assert err <= tol, (req.arch, req.layout, err)


def test_ranks_that_pass_different_latents_get_one_clear_error(runs):
    for res in runs[4]:
        assert res[-1] and "latents differs across ranks: rank 0 has [1, 4, 4, 8, 8]" in res[-1]


@pytest.mark.parametrize("world", [4, 8])
def test_bytes_per_dim_equal_the_traffic_model(runs, world):
    for i, req in enumerate(CASES[world]):
        degrees = req.layout.as_dict()
        for r in (res[i] for res in runs[world]):
            if req.arch.startswith("wan"):
                assert r["bytes_by_dim"] == r["predicted_bytes_by_dim"], (req, r["coords"])
            else:  # the traffic model covers Wan; the others are measured only
                assert r["predicted_bytes_by_dim"] is None
            for dim in ("cfg", "ring", "ulysses", "tp"):
                assert (r["bytes_by_dim"][dim] > 0) == (degrees[dim] > 1), (req, dim)
