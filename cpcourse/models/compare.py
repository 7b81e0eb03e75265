"""What `cpcourse models` runs: one forward (or a short sample) of a tiny real model, on a rank.

    python -m cpcourse.cli models --arch cogvideox --nproc 3 --method ring --compare --json

`reference(spec)` is the unparallelised model in this process; `rank_forward(spec)` builds the
same model from the same seed on each rank, parallelizes it and runs the same inputs. A spec is
a dict: arch, method, frames, height, width, seed, dtype ("float32" | "bfloat16" | ...), and
optionally ulysses, ring_mode, shard_io, repeat (timed forwards after one warm-up), config
(tiny-config overrides), sample_steps (run the sampler instead of one forward).
"""

from __future__ import annotations

import statistics
import time

import torch

from cpcourse.models.build import build, example_inputs
from cpcourse.models.parallel import parallelize
from cpcourse.models.shards import gather_latents, shard_latents
from cpcourse.support.dtypes import torch_dtype
from cpcourse.support.tolerance import tolerance  # noqa: F401  (graders import it from here)

DTYPES = ("float32", "float64", "bfloat16", "float16")  # torch's spellings, as `--dtype` takes them


def model_and_inputs(spec: dict):
    dtype = torch_dtype(spec.get("dtype", "float32"))
    model = build(spec["arch"], seed=spec.get("seed", 0), dtype=dtype, **spec.get("config", {}))
    inputs = example_inputs(spec["arch"], spec.get("frames", 5), spec.get("height", 8),
                            spec.get("width", 8), batch=spec.get("batch", 1),
                            seed=spec.get("seed", 0) + 1, dtype=dtype)
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


def _run(model, inputs, spec, cp: bool):
    if spec.get("sample_steps"):
        from cpcourse.models.sampler import sample

        return lambda: sample(model, spec["arch"], inputs, steps=spec["sample_steps"],
                              cfg_scale=spec.get("cfg_scale", 5.0), seed=spec.get("seed", 0))
    if cp and spec.get("shard_io"):
        mine = dict(inputs, hidden_states=shard_latents(model, inputs["hidden_states"]))
        return lambda: gather_latents(model, model(**mine, return_dict=False)[0])
    return lambda: model(**inputs, return_dict=False)[0]


def reference(spec: dict) -> tuple[torch.Tensor, float | None]:
    """(output, median seconds) of the unparallelised model in this process."""
    model, inputs = model_and_inputs(spec)
    return _timed(_run(model, inputs, spec, cp=False), spec.get("repeat", 0))


def rank_forward(spec: dict) -> dict:
    """On every rank: the parallelized model's full output and its median forward time.

    With `spec["layout"]` (a `cpcourse.support.layout.Layout` as a dict) the model runs on that
    mesh, and the bytes this rank sent per mesh dim in one untimed run are measured beside
    `cpcourse.models.costs.predicted_bytes`.
    """
    model, inputs = model_and_inputs(spec)
    mesh = None
    if spec.get("layout"):
        from cpcourse.mesh import make_mesh

        mesh = make_mesh(**spec["layout"])
        parallelize(model, mesh=mesh, ring_mode=spec.get("ring_mode", "overlap"),
                    shard_io=spec.get("shard_io", False))
    else:
        parallelize(model, method=spec["method"], ulysses=spec.get("ulysses"),
                    ring_mode=spec.get("ring_mode", "overlap"),
                    shard_io=spec.get("shard_io", False), split=spec.get("split", "frames"))
    fn = _run(model, inputs, spec, cp=True)
    extra = {}
    if mesh is not None:
        import torch.distributed as dist

        from cpcourse.mesh import bytes_by_dim
        from cpcourse.models.costs import predicted_bytes
        from cpcourse.support.bytecount import count_bytes
        from cpcourse.support.layout import Layout

        with torch.inference_mode(), count_bytes() as sent:
            fn()
        extra = {"bytes_by_dim": bytes_by_dim(sent, mesh), "coords": Layout(
            **spec["layout"]).coords(dist.get_rank()),
            "predicted_bytes_by_dim": predicted_bytes(model, inputs, spec, dist.get_rank())}
    out, seconds = _timed(fn, spec.get("repeat", 0))
    cp = model._cpcourse
    return {"out": out, "seconds": seconds, "frame_sizes": cp.frame_sizes or None,
            "tokens_per_rank": list(cp.lens), "tokens": sum(cp.lens), "ulysses": cp.ulysses,
            "ring": cp.ring, **extra}


def guidance(spec: dict) -> float | None:
    """The guidance scale that multiplies a spec's error (`tolerance`'s `guidance`): the CFG
    scale of a sample, None for one forward or a guidance-distilled model (one branch a step)."""
    from cpcourse.models.build import arch_info

    if not spec.get("sample_steps") or arch_info(spec["arch"]).guidance_distilled:
        return None
    return spec.get("cfg_scale", 5.0)


def check_spec(spec: dict, nproc: int) -> dict:
    """Everything a launch would only find out inside the ranks, checked here: one clear line."""
    from cpcourse.models.build import arch_info, check_size, tokens
    from cpcourse.models.parallel import METHODS, check_ulysses
    from cpcourse.models.split import SPLITS
    from cpcourse.support.errors import guidance_scale, positive_int, require, seed_int
    from cpcourse.support.layout import divisors

    info = arch_info(spec["arch"])
    seed_int("seed", spec.get("seed", 0))
    guidance_scale("cfg_scale", spec.get("cfg_scale", 5.0))
    if spec.get("ulysses") is not None:
        positive_int("ulysses", spec["ulysses"])
    require(spec["method"] in METHODS, f"method must be one of {', '.join(METHODS)}, got "
            f"{spec['method']!r}")
    require(spec.get("dtype", "float32") in DTYPES, f"dtype must be one of {', '.join(DTYPES)}")
    frames, height, width = spec.get("frames", 5), spec.get("height", 8), spec.get("width", 8)
    check_size(info.id, frames, height, width)
    n_tok, _ = tokens(info.id, frames, height, width)
    require(n_tok * spec.get("batch", 1) <= 65536, f"{n_tok} tokens is more than this CPU demo "
            "runs (65,536 at most): use fewer frames or a smaller height / width")
    heads = {**info.tiny, **spec.get("config", {})}["num_attention_heads"]
    if spec.get("layout"):
        from cpcourse.support.layout import Layout, check_layout

        require(spec.get("split", "frames") == "frames", "a layout splits whole latent frames "
                "(its byte prediction counts them): use split='frames' with a layout")
        lay = check_layout(Layout(**spec["layout"]), nproc, heads)
        require(lay.tp == 1 or info.cp.tp, f"tensor parallel in "
                f"cpcourse.models is built for Wan: the tiny {info.id} takes layouts with tp=1")
        ffn = {**info.tiny, **spec.get("config", {})}.get("ffn_dim", 0)
        require(ffn % lay.tp == 0, f"tp={lay.tp} splits the tiny {info.id}'s {ffn} MLP columns:"
                f" use tp in {', '.join(str(d) for d in divisors(ffn) if heads % d == 0)}")
        if lay.cfg == 2:
            require(not info.guidance_distilled, f"{info.id} is guidance-distilled (one forward "
                    "per step, no CFG pair): use cfg=1")
            require(spec.get("sample_steps"), "cfg=2 splits the CFG pair of a denoising step "
                    "over two ranks: add sample_steps=N")
        require(frames >= lay.cp, f"ring x ulysses = {lay.cp} ranks split the {frames} latent "
                f"frames: give frames={lay.cp} or more")
        return {"tokens": n_tok}
    split = spec.get("split", "frames")
    require(split in SPLITS, f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    require(split == "frames" or not spec.get("shard_io"), "shard_io hands each rank whole "
            "latent frames: use split='frames' with it")
    require(frames >= nproc or split == "tokens", f"CP splits the {frames} latent frames over "
            f"{nproc} ranks: give frames={nproc} or more, use fewer ranks, or split='tokens'")
    require(n_tok >= nproc, f"{n_tok} video tokens cannot be split over {nproc} ranks")
    u = {"ulysses": nproc, "usp": spec.get("ulysses")}.get(spec["method"])
    if spec["method"] == "usp" and u is not None:
        require(nproc % u == 0, f"ulysses {u} must divide nproc={nproc}: choose one of "
                f"{', '.join(map(str, divisors(nproc)))}")
    if u is not None:
        check_ulysses(heads, u, nproc, what=f"the tiny {info.id}'s")
    return {"tokens": n_tok}
