"""What `cpcourse models` runs: one forward (or a short sample) of a tiny real model, on a rank.

    python -m cpcourse.cli models --arch cogvideox --nproc 3 --method ring --compare --json

`reference(req)` is the unparallelised model in this process; `rank_forward(req)` builds the
same model from the same seed on each rank, parallelizes it and runs the same inputs. `req` is
a `cpcourse.runs.models.ModelsRequest` (checked when made, by `check_request`): its arch,
method or layout, frames, height, width, batch, seed, dtype, ulysses, ring_mode, split,
shard_io, repeat (timed forwards after one warm-up), config (tiny-config overrides),
sample_steps (run the sampler instead of one forward) and cfg_scale.
"""

from __future__ import annotations

import statistics
import time

import torch

from cpcourse.models.build import build, example_inputs
from cpcourse.models.parallel import parallelize
from cpcourse.models.shards import gather_latents, shard_latents
from cpcourse.support.dtypes import torch_dtype
from cpcourse.support.errors import require
from cpcourse.support.tolerance import tolerance  # noqa: F401  (graders import it from here)

DTYPES = ("float32", "float64", "bfloat16", "float16")  # torch's spellings, as `--dtype` takes them


def model_and_inputs(req):
    """The seeded tiny model of `req.arch` and its example inputs, in `req.dtype`."""
    dtype = torch_dtype(req.dtype)
    model = build(req.arch, seed=req.seed, dtype=dtype, **(req.config or {}))
    inputs = example_inputs(req.arch, req.frames, req.height, req.width, batch=req.batch,
                            seed=req.seed + 1, dtype=dtype)
    return model, inputs


def _timed(fn, repeat: int):
    with torch.inference_mode():
        out = fn()  # warm-up (and the result)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return out, (statistics.median(times) if times else None)


def _run(model, inputs, req, cp: bool):
    if req.sample_steps:
        from cpcourse.models.sampler import sample

        return lambda: sample(model, req.arch, inputs, steps=req.sample_steps,
                              cfg_scale=req.cfg_scale, seed=req.seed)
    if cp and req.shard_io:
        # this rank's latent frames in ([B, C, F_r, H, W]; CogVideoX [B, F_r, C, H, W]), every
        # rank's frames gathered out (the whole latents' shape)
        mine = dict(inputs, hidden_states=shard_latents(model, inputs["hidden_states"]))
        return lambda: gather_latents(model, model(**mine, return_dict=False)[0])
    return lambda: model(**inputs, return_dict=False)[0]


def reference(req) -> tuple[torch.Tensor, float | None]:
    """(output, median seconds) of the unparallelised model in this process."""
    model, inputs = model_and_inputs(req)
    return _timed(_run(model, inputs, req, cp=False), req.repeat)


def rank_forward(req) -> dict:
    """On every rank: the parallelized model's full output and its median forward time.

    With `req.layout` (a `cpcourse.support.layout.Layout`) the model runs on that mesh, and the
    bytes this rank sent per mesh dim in one untimed run are measured beside
    `cpcourse.models.costs.predicted_bytes`. The checks that need the ranks (do they all run
    the same method, model and latents?) are parallelize's and the forward's.
    """
    model, inputs = model_and_inputs(req)
    mesh = None
    if req.layout is not None:
        from cpcourse.mesh import make_mesh

        mesh = make_mesh(**req.layout.as_dict())
        parallelize(model, mesh=mesh, ring_mode=req.ring_mode, shard_io=req.shard_io)
    else:
        parallelize(model, method=req.method, ulysses=req.ulysses, ring_mode=req.ring_mode,
                    shard_io=req.shard_io, split=req.split)
    fn = _run(model, inputs, req, cp=True)
    extra = {}
    if mesh is not None:
        import torch.distributed as dist

        from cpcourse.mesh import bytes_by_dim
        from cpcourse.models.costs import predicted_bytes
        from cpcourse.support.bytecount import count_bytes

        with torch.inference_mode(), count_bytes() as sent:
            fn()
        rank = dist.get_rank()
        extra = {"bytes_by_dim": bytes_by_dim(sent, mesh), "coords": req.layout.coords(rank),
                 "predicted_bytes_by_dim": predicted_bytes(model, inputs, req, rank)}
    out, seconds = _timed(fn, req.repeat)
    cp = model._cpcourse
    return {"out": out, "seconds": seconds, "frame_sizes": cp.frame_sizes or None,
            "tokens_per_rank": list(cp.lens), "tokens": sum(cp.lens), "ulysses": cp.ulysses,
            "ring": cp.ring, **extra}


def guidance(req) -> float | None:
    """The guidance scale that multiplies a run's error (`tolerance`'s `guidance`): the CFG
    scale of a sample, None for one forward or a guidance-distilled model (one branch a step)."""
    from cpcourse.models.build import arch_info

    if not req.sample_steps or arch_info(req.arch).guidance_distilled:
        return None
    return req.cfg_scale


def check_request(req) -> int:
    """Everything a launch would only find out inside the ranks, checked here, in one clear
    line: the sizes, the layout or the split over `req.nproc` ranks, the Ulysses degree.
    Returns the video tokens of one sample."""
    from cpcourse.models.build import arch_info, check_size, tokens

    info = arch_info(req.arch)
    check_size(info.id, req.frames, req.height, req.width)
    n_tok, _ = tokens(info.id, req.frames, req.height, req.width)
    require(n_tok * req.batch <= 65536, f"{n_tok} tokens is more than this CPU demo "
            "runs (65,536 at most): use fewer frames or a smaller height / width")
    tiny = {**info.tiny, **(req.config or {})}
    if req.layout is not None:
        _check_layout(req, info, tiny)
    else:
        _check_split(req, info, tiny["num_attention_heads"], n_tok)
    return n_tok


def _check_layout(req, info, tiny: dict) -> None:
    from cpcourse.support.layout import check_layout, divisors

    heads = tiny["num_attention_heads"]
    require(req.split == "frames", "a layout splits whole latent frames "
            "(its byte prediction counts them): use split='frames' with a layout")
    lay = check_layout(req.layout, req.nproc, heads)
    require(lay.tp == 1 or info.cp.tp, f"tensor parallel in "
            f"cpcourse.models is built for Wan: the tiny {info.id} takes layouts with tp=1")
    ffn = tiny.get("ffn_dim", 0)
    require(ffn % lay.tp == 0, f"tp={lay.tp} splits the tiny {info.id}'s {ffn} MLP columns:"
            f" use tp in {', '.join(str(d) for d in divisors(ffn) if heads % d == 0)}")
    if lay.cfg == 2:
        require(not info.guidance_distilled, f"{info.id} is guidance-distilled (one forward "
                "per step, no CFG pair): use cfg=1")
        require(req.sample_steps, "cfg=2 splits the CFG pair of a denoising step "
                "over two ranks: add sample_steps=N")
    require(req.frames >= lay.cp, f"ring x ulysses = {lay.cp} ranks split the {req.frames} "
            f"latent frames: give frames={lay.cp} or more")


def _check_split(req, info, heads: int, n_tok: int) -> None:
    from cpcourse.models.parallel import check_ulysses
    from cpcourse.support.layout import divisors

    nproc, frames = req.nproc, req.frames
    require(req.split == "frames" or not req.shard_io, "shard_io hands each rank whole "
            "latent frames: use split='frames' with it")
    require(frames >= nproc or req.split == "tokens", f"CP splits the {frames} latent frames "
            f"over {nproc} ranks: give frames={nproc} or more, use fewer ranks, or "
            "split='tokens'")
    require(n_tok >= nproc, f"{n_tok} video tokens cannot be split over {nproc} ranks")
    u = {"ulysses": nproc, "usp": req.ulysses}.get(req.method)
    if req.method == "usp" and u is not None:
        require(nproc % u == 0, f"ulysses {u} must divide nproc={nproc}: choose one of "
                f"{', '.join(map(str, divisors(nproc)))}")
    if u is not None:
        check_ulysses(heads, u, nproc, what=f"the tiny {info.id}'s")
