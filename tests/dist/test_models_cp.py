"""Real diffusers video transformers under CP equal one process: every arch x method, P = 1 .. 4.

    python -m pytest tests/dist/test_models_cp.py -q

One launch per world size runs every case on the ranks (`run_cases`); the references are the
unparallelised models, built from the same seeds in this process. Latent frames are 5 (and 6),
so P = 2, 3, 4 split them unevenly. The tiny models have 12 heads: Ulysses runs on 1 .. 4.
Each case is a `ModelsRequest`, checked before the launch: what a Request refuses is tested in
tests/unit/test_models.py; here only what the ranks alone can find (ranks that disagree).
"""

from __future__ import annotations

import pytest
import torch

from cpcourse.launch import launch
from cpcourse.models.compare import guidance, reference, tolerance
from cpcourse.runs.models import ModelsRequest

pytest.importorskip("diffusers")
pytestmark = pytest.mark.dist

ARCHS = ("wan", "wan2.2", "hunyuanvideo", "cogvideox")
METHODS = ("ring", "ulysses", "usp", "allgather")


def cases(world: int) -> list[dict]:
    out = [{"arch": a, "method": m, "frames": 5 if a != "hunyuanvideo" else 6}
           for a in ARCHS for m in METHODS]
    if world == 4:  # usp as 2 x 2, the ring on the Ulysses groups
        out += [{"arch": a, "method": "usp", "ulysses": 2, "frames": 5} for a in ARCHS]
    if world in (2, 3):
        out += [{"arch": "wan", "method": "ring", "ring_mode": "blocking"},
                {"arch": "wan", "method": "ring", "shard_io": True},
                {"arch": "hunyuanvideo", "method": "ulysses" if world == 2 else "ring",
                 "shard_io": True, "batch": 3},  # padding lengths differ per sample
                {"arch": "wan", "method": "ring", "dtype": "bfloat16"},
                {"arch": "cogvideox", "method": "ulysses", "dtype": "bfloat16"}]
    # the sampler: the model's own scheduler with CFG, a few steps, same latents at every P
    out += [{"arch": "wan", "method": "ring", "sample_steps": 3},
            {"arch": "wan2.2", "method": "ulysses", "sample_steps": 3, "shard_io": True},
            {"arch": "hunyuanvideo", "method": "usp", "sample_steps": 3},
            {"arch": "cogvideox", "method": "ring", "sample_steps": 3}]
    # token-level splits: 2 or 6 latent frames of 16 tokens, so most shards start mid-frame
    # (and at P = 3, 4 there are more ranks than Wan's 2 frames)
    out += [{"arch": a, "method": m, "frames": 6 if a == "hunyuanvideo" else 2,
             "split": "tokens"} for a in ARCHS for m in ("ring", "ulysses")]
    out += [{"arch": "wan", "method": "ring", "sample_steps": 2, "split": "tokens"}]
    return out


def requests(world: int, specs: list[dict]) -> list[ModelsRequest]:
    """Each case as the Request of a run on `world` ranks, with no timed repeats."""
    return [ModelsRequest(**{"repeat": 0, **spec}, nproc=world) for spec in specs]


def run_cases(cases: list) -> list:
    """On every rank: each case's output, or the InputError's message for a refusal. A case is
    a ModelsRequest, a list of one per rank (ranks that disagree), or ("rope_offset", request):
    every rank numbers its frames from 0."""
    import torch.distributed as dist

    from cpcourse.models import parallel
    from cpcourse.models.compare import rank_forward
    from cpcourse.support.errors import InputError

    results = []
    for case in cases:
        bug = isinstance(case, tuple)
        req = case[1] if bug else case[dist.get_rank()] if isinstance(case, list) else case
        if bug:
            real = parallel.wan_rope_shard
            parallel.wan_rope_shard = lambda rope, f0, nf, h, w, real=real: real(rope, 0, nf, h, w)
        try:
            results.append(rank_forward(req)["out"])
        except InputError as exc:
            results.append(str(exc))
        finally:
            if bug:
                parallel.wan_rope_shard = real
    return results


def _check(world: int, specs: list[dict]) -> None:
    reqs = requests(world, specs)
    per_rank = launch("tests/dist/test_models_cp.py:run_cases", world, args=(reqs,),
                      timeout=240, stream=False)
    for i, req in enumerate(reqs):
        want, _ = reference(req)
        tol = tolerance(req.method, req.dtype, guidance(req),
                        scale=float(want.double().abs().max()))
        for rank, outs in enumerate(per_rank):
            got = outs[i]
            assert isinstance(got, torch.Tensor), f"{req} on rank {rank} refused: {got}"
            err = float((got.double() - want.double()).abs().max())
            assert err <= tol, f"{req}, rank {rank} of {world}: max |CP - one process| = " \
                               f"{err:.2e} > {tol:.0e}"
        assert all(torch.equal(per_rank[0][i], r[i]) for r in per_rank), \
            f"{req}: the ranks' outputs differ"


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_arch_and_method_equals_one_process(world):
    _check(world, cases(world))


def test_ranks_that_disagree_are_refused_and_the_rope_offset_bug():
    """Each rank's Request is valid alone: only the ranks together can refuse these."""
    ring, = requests(3, [{"arch": "wan", "method": "ring"}])
    cases = [("rope_offset", ring),
             # ranks that disagree: a send timed out after 30 s, a rank aborted (SIGABRT)
             requests(3, [{"arch": "wan", "method": m} for m in ("ring", "ulysses", "ring")]),
             requests(3, [{"arch": "wan", "method": "ring", "config": c}
                          for c in ({}, {"num_attention_heads": 6}, {})])]
    per_rank = launch("tests/dist/test_models_cp.py:run_cases", 3, args=(cases,), timeout=240,
                      stream=False)
    for outs in per_rank:
        assert "method (rank 0 has 'ring', rank 1 has 'ulysses')" in outs[1], outs[1]
        assert "heads (rank 0 has 12, rank 1 has 6)" in outs[2], outs[2]
    want, _ = reference(ring)
    err = float((per_rank[0][0] - want).abs().max())
    # no error is raised: the video is just wrong, by far more than any rounding
    assert err > 1e3 * tolerance("ring"), f"forgetting the rotary offset moved the output by {err}"


def run_cuda(specs: list[dict]) -> list:
    """On every rank (NCCL, one GPU each): the parallelized model on CUDA, output back on CPU."""
    from cpcourse.models import build, example_inputs, parallelize

    outs = []
    for spec in specs:
        model = build(spec["arch"], dtype=torch.bfloat16 if spec.get("dtype") == "bfloat16"
                      else torch.float32).cuda()
        inputs = {k: (v.cuda() if isinstance(v, torch.Tensor) else tuple(t.cuda() for t in v)
                      if isinstance(v, tuple) else v)
                  for k, v in example_inputs(spec["arch"], frames=6, seed=1,
                                             dtype=next(model.parameters()).dtype).items()}
        parallelize(model, method=spec["method"])
        with torch.inference_mode():
            outs.append(model(**inputs, return_dict=False)[0].float().cpu())
    return outs


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_models_under_nccl_equal_one_process():
    """On up to 2 GPUs (a 1-GPU box still runs every hook and buffer on CUDA under NCCL)."""
    from cpcourse.models import build, example_inputs

    specs = [{"arch": a, "method": m} for a in ("wan", "hunyuanvideo", "cogvideox")
             for m in ("ring", "ulysses")]
    per_rank = launch("tests/dist/test_models_cp.py:run_cuda", min(2, torch.cuda.device_count()),
                      args=(specs,), timeout=240,
                      backend="nccl", stream=False)
    for i, spec in enumerate(specs):
        model = build(spec["arch"]).cuda()
        inputs = {k: (v.cuda() if isinstance(v, torch.Tensor) else tuple(t.cuda() for t in v)
                      if isinstance(v, tuple) else v)
                  for k, v in example_inputs(spec["arch"], frames=6, seed=1).items()}
        with torch.inference_mode():
            want = model(**inputs, return_dict=False)[0].float().cpu()
        for outs in per_rank:  # TF32 and kernel choice differ from the CPU: 1e-3
            assert float((outs[i] - want).abs().max()) <= 1e-3, spec
