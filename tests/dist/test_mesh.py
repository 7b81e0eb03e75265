"""The tiny DiT on a cfg x ring x ulysses x tp mesh: the same sample as one process for every
layout, bytes per mesh dim equal to the cost model's, groups and refusals.

One launch of 4 ranks runs every 4-rank layout the issue names (for a full-3D and a factored
model, odd frame counts so the shards are uneven), torch's own tensor-parallel layers beside
ours, and the refusals; one launch of 8 ranks runs the 3-D layouts.
"""

from dataclasses import replace

import pytest
import torch

from cpcourse.launch import launch
from cpcourse.support.layout import Layout
from cpcourse.support.tolerance import tolerance
from cpcourse.tinydit.model import DiTConfig
from cpcourse.tinydit.sampling import Sampling, mesh_shards, single_process_sample

pytestmark = pytest.mark.dist

# the six 4-rank layouts (pure ring and pure Ulysses at 4: tests/dist/test_dit_cp.py)
LAYOUTS_4 = ["cfg=2,ring=2", "cfg=2,ulysses=2", "ulysses=2,ring=2", "tp=2,ring=2", "cfg=2,tp=2",
             "tp=4"]
LAYOUTS_8 = ["cfg=2,ulysses=2,ring=2", "tp=2,ulysses=2,ring=2"]
# which model runs which layouts: both models every 4-rank layout; at 8 ranks (slow on 2 cores)
# the full-3D model on both 3-D layouts, the factored one (temporal USP) on one
RUNS = {4: [(m, lay) for m in ("full", "factored") for lay in LAYOUTS_4],
        8: [("full", lay) for lay in LAYOUTS_8] + [("factored", LAYOUTS_8[0])]}


def _spec(attention: str, frames: int, rng=None) -> Sampling:
    """A random DiT's sampling run; `rng` draws its weights, noise and guidance (a new case
    every session, tests/conftest.py's CPCOURSE_TEST_SEED), None the fixed case."""
    cfg = DiTConfig(attention=attention, hidden=32, heads=4, depth=2)
    weight_seed, seed, cfg_scale = ((3, 11, 3.0) if rng is None else
                                    (rng.randrange(2**31), rng.randrange(2**31),
                                     round(rng.uniform(-8.0, 8.0), 2)))
    return Sampling(cfg=cfg, path=None, dtype="fp32", weight_seed=weight_seed, seed=seed,
                    shape=(1, 4, frames, 8, 8), steps=2, cfg_scale=cfg_scale, cond=2)


SPECS = {"full": _spec("full", 5), "factored": _spec("factored", 7)}


def on_mesh(runs: list[tuple[str, str]], specs: dict) -> dict:
    """Every rank: each (model, layout) run (frames, coords, bytes), then the checks that need a
    live group."""
    import torch.distributed as dist

    from cpcourse.mesh import make_mesh
    from cpcourse.support.errors import InputError
    from cpcourse.tinydit.sampling import generate_mesh_rank

    out: dict = {"runs": {}}
    for name, text in runs:
        layout = Layout.parse(text)
        out["runs"][(name, text)] = generate_mesh_rank(replace(specs[name], layout=layout))
    world = dist.get_world_size()
    refusals = []
    for kwargs in ({"ring": world + 1}, {"ulysses": world, "heads": world + 1},
                   {"cfg": 2, "ring": world}):
        try:
            make_mesh(**kwargs)
            refusals.append(None)
        except InputError as exc:
            refusals.append(str(exc))
    out["refusals"] = refusals
    mesh = make_mesh(cfg=2, ulysses=world // 2)
    out["groups"] = {n: dist.get_process_group_ranks(mesh.get_group(n)) for n in ("cfg", "ulysses")}
    opts = mesh.get_group("ulysses")._get_backend(torch.device("cpu")).options
    out["timeout_s"] = opts._timeout.total_seconds()
    if world == 4:
        out["torch_tp"] = _torch_tp_vs_ours()
    return out


def _torch_tp_vs_ours() -> float:
    """Our column/row-parallel MLP against torch's parallelize_module on gloo."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from cpcourse.tensor_parallel import ColumnParallelLinear, RowParallelLinear, span

    gen = torch.Generator().manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    x = torch.randn(3, 5, 8, generator=gen)
    mesh = init_device_mesh("cpu", (4,), mesh_dim_names=("tp",))
    group = mesh.get_group("tp")
    rank = mesh.get_local_rank("tp")
    cols = span(32, rank, 4)
    ours = torch.nn.Sequential(ColumnParallelLinear(mlp[0], cols), torch.nn.GELU(),
                               RowParallelLinear(mlp[2], cols, group))
    with torch.no_grad():
        mine = ours(x)
        parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        theirs = mlp(x)
        theirs = theirs.wait() if hasattr(theirs, "wait") else theirs
    return float((mine - theirs).abs().max())


@pytest.fixture(scope="module")
def runs(cases_rng):
    """Each launch samples new random cases (SPECS' shapes: what the byte counts below use)."""
    specs = {p: {name: _spec(name, s.shape[2], cases_rng) for name, s in SPECS.items()}
             for p in RUNS}
    refs = {p: {name: (single_process_sample(spec), spec) for name, spec in specs[p].items()}
            for p in RUNS}
    return refs, {p: launch(f"{__file__}:on_mesh", p, timeout=240, args=(RUNS[p], specs[p]),
                            stream=False) for p in RUNS}


def _assemble(results, key):
    per_rank = [r["runs"][key] for r in results]
    return torch.cat([r["frames"] for r in mesh_shards(per_rank)], dim=2), per_rank


@pytest.mark.parametrize("world", [4, 8])
@pytest.mark.parametrize("model", ["full", "factored"])
def test_every_layout_samples_what_one_process_samples(runs, world, model):
    refs, results = runs
    for text in (lay for m, lay in RUNS[world] if m == model):
        latents, per_rank = _assemble(results[world], (model, text))
        ref, spec = refs[world][model]
        err = float((latents - ref).abs().max())
        # one limit for every layout: USP's merge, scaled by the outputs and the guidance
        tol = tolerance("usp", "fp32", spec.cfg_scale, float(ref.abs().max()))
        assert err <= tol, f"{model} {text} {spec.seed=} {spec.cfg_scale=}: {err:.3g}"
        # every replica of a shard (the other cfg branch, the other tp ranks) holds the same
        for r in per_rank:
            twin = next(o for o in per_rank if o["cp_rank"] == r["cp_rank"])
            assert torch.equal(r["frames"], twin["frames"]), (model, text, r["coords"])


@pytest.mark.parametrize("world", [4, 8])
def test_bytes_per_dim_equal_the_cost_model(runs, world):
    _, results = runs
    for key in results[world][0]["runs"]:
        for r in (res["runs"][key] for res in results[world]):
            assert r["bytes_per_step"] == r["predicted_bytes_per_step"], (key, r["coords"])
            layout = Layout.parse(key[1])
            # a dim of degree 1 sends nothing; a dim of degree > 1 sends something
            for dim, nbytes in r["bytes_per_step"].items():
                assert (nbytes > 0) == (getattr(layout, dim) > 1), (key, dim)


def test_cfg_parallel_sends_once_per_step_not_per_layer(runs):
    _, results = runs
    r = results[4][0]["runs"][("full", "cfg=2,ring=2")]
    spec = SPECS["full"]
    b, c, t, hl, wl = spec.shape
    tokens = b * 3 * (hl // 2) * (wl // 2)  # rank 0 holds 3 of the 5 frames
    assert r["bytes_per_step"]["cfg"] == tokens * c * 4 * 4  # one prediction, fp32, C*p*p = 16


def test_groups_refusals_and_timeouts(runs):
    _, results = runs
    for world, res in results.items():
        for r in res:
            assert all(m is not None and len(m.splitlines()) == 1 for m in r["refusals"])
            assert "needs" in r["refusals"][0] and "ranks" in r["refusals"][0]
            assert "divide" in r["refusals"][1] and "layouts" in r["refusals"][1]
            assert r["timeout_s"] <= 60  # not c10d's 30-minute default
        # cfg is the outer dim, ulysses inner: neighbouring ranks share a Ulysses group
        assert res[0]["groups"]["ulysses"] == list(range(world // 2))
        assert res[0]["groups"]["cfg"] == [0, world // 2]


def test_our_tensor_parallel_equals_torchs(runs):
    _, results = runs
    assert max(r["torch_tp"] for r in results[4]) < 1e-5
