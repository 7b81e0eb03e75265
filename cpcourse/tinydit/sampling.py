"""Sampling the tiny video DiT: a few rectified-flow Euler steps with classifier-free guidance.

    cpcourse generate --nproc 2 --seed 0 --save /tmp/sample.pt --json

The sampler steps x_1 = noise towards x_0 = sample, x <- x + (t_next - t) * v, with guidance: the
conditional and unconditional passes run as one batch of 2B, v = v_uncond + cfg * (v_cond -
v_uncond). Noise is drawn for the whole video from the seed on every rank and each rank keeps its
frames, so the sample does not depend on P. `generate_rank` is what each rank of `cpcourse
generate` runs (see `cpcourse.runs.generate`): its frames of the sample, its peak tensor memory
(`cpcourse.support.peak_memory`) beside `cpcourse.tinydit.costs.predicted_peak_bytes`, and its time
per step.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, fields

import torch

from cpcourse.mesh import cfg_branch, cfg_combine
from cpcourse.support.dtypes import torch_dtype
from cpcourse.tinydit.model import (
    CPContext,
    DiTConfig,
    build_model,
    load_weights,
    patchify,
    unpatchify,
)
from cpcourse.video import frame_offset

DTYPES = ("fp32", "fp64")  # what sampling runs in (`cpcourse.support.dtypes` spellings)


def initial_noise(shape: tuple, seed: int, dtype=torch.float32) -> torch.Tensor:
    """The whole video's starting noise `[B, C, T, Hl, Wl]`, the same for any P."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def class_labels(cfg, label, b: int, branch: str = "both") -> torch.Tensor:
    """Conditional then unconditional labels for a batch of 2B: `[2B]`, or `[2B, 2]` when the
    model has a second (motion) label and `label` is a (shape, motion) pair. Under CFG-parallel
    (`branch` "cond" or "uncond") only that half: `[B]`."""
    label = tuple(label) if isinstance(label, (tuple, list)) else (label,)
    null = cfg.null_label
    if len(label) != len(null):
        raise ValueError(f"this model takes {len(null)} label(s), got {label}")
    rows = {"both": [label] * b + [null] * b, "cond": [label] * b, "uncond": [null] * b}[branch]
    y = torch.tensor(rows)
    return y if cfg.num_motions else y[:, 0]


@torch.no_grad()
def sample(model, noise_frames: torch.Tensor, label, steps: int = 4, cfg_scale: float = 4.0,
           ctx: CPContext | None = None, step_times: list | None = None,
           trajectory: list | None = None) -> torch.Tensor:
    """Denoise this rank's frames `[B, C, T_r, Hl, Wl]` -> the sample's frames, same shape.

    `label`: a class id, or a (shape, motion) pair for a model with `num_motions`. `ctx` None:
    one process, whole video. `step_times`, when given, receives seconds per step;
    `trajectory` the frames after each step (the clip emerging from the noise).
    A model that predicts the clean sample x0 (`prediction="sample"`) is turned into a velocity
    by v = (x_t - x0) / t, exact for the straight path x_t = (1 - t) x0 + t noise; guidance is
    linear, so guiding x0 or v is the same thing.
    """
    cfg = model.cfg
    b, c, _, hl, wl = noise_frames.shape
    grid = (hl // cfg.patch, wl // cfg.patch)
    ctx = ctx or CPContext(grid=grid)
    branch = cfg_branch(ctx.mesh)
    device = next(model.parameters()).device  # the noise is drawn on the CPU, the same anywhere
    x = patchify(noise_frames.to(device), cfg.patch)
    y = class_labels(cfg, label, b, branch).to(device)
    times = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    for i in range(steps):
        start = time.perf_counter()
        t = torch.full((y.shape[0],), float(times[i]), dtype=x.dtype, device=device)
        out = model(torch.cat([x, x]) if branch == "both" else x, t, y, ctx)
        if branch == "both":
            cond, uncond = out.chunk(2)
            guided = uncond + cfg_scale * (cond - uncond)
        else:  # CFG-parallel: the other half of the pair is on the other cfg rank
            guided = cfg_combine(out, ctx.mesh, cfg_scale)
        v = (x - guided) / float(times[i]) if cfg.prediction == "sample" else guided
        x = x + float(times[i + 1] - times[i]) * v
        del v, out, guided
        if step_times is not None:
            step_times.append(time.perf_counter() - start)
        if trajectory is not None:
            trajectory.append(unpatchify(x, c, cfg.patch, grid))
    return unpatchify(x, c, cfg.patch, grid)


@dataclass(frozen=True)
class Sampling:
    """What a sampling rank reads: `cfg` the DiT's config, `path` its weights file (None: the
    seeded random DiT from `weight_seed`), `shape` the latents' [B, C, T, Hl, Wl], `cond` the
    label (a class id, or a (shape, motion) pair). `cpcourse.runs.generate.GenerateRequest`
    has these same attributes, so a rank takes the Request itself; `Sampling.of(req, seed=1)`
    is the same run with some inputs changed (a benchmark's or a test's own cases)."""

    cfg: DiTConfig
    path: str | None
    dtype: str
    weight_seed: int
    seed: int
    shape: tuple
    steps: int
    cfg_scale: float
    cond: object
    temporal_method: str = "all_to_all"
    full_method: str = "ring"
    layout: object = None  # a `cpcourse.support.layout.Layout` for `generate_mesh_rank`
    measure_memory: bool = True  # False: no peak tracking (it slows every op; a benchmark)

    @classmethod
    def of(cls, run, **changes) -> Sampling:
        """The Sampling of `run` (anything with these attributes: a GenerateRequest, another
        Sampling), each input read by name, with `changes` in place of some (`seed=3`)."""
        return cls(**{f.name: getattr(run, f.name) for f in fields(cls)} | changes)


def spec_model(s):
    """The model a sampling run `s` names (a `Sampling` or a Request): trained weights from a
    file, else the seeded random DiT (the same on every rank, no broadcast needed)."""
    dtype = torch_dtype(s.dtype)
    if s.path:
        return load_weights(s.path, dtype)[0]
    return build_model(s.cfg, s.weight_seed, dtype)


def single_process_sample(s) -> torch.Tensor:
    """The reference: the run `s` (a `Sampling` or a Request) sampled in this process, whole
    video [B, C, T, Hl, Wl], no process group."""
    model = spec_model(s)
    noise = initial_noise(tuple(s.shape), s.seed, torch_dtype(s.dtype))
    return sample(model, noise, s.cond, s.steps, s.cfg_scale)


class _StepsSaid(list):
    """`sample`'s step_times list that also says "step k/n" on stderr as each step ends: rank
    0's, when the command line asks ($CPCOURSE_PROGRESS=1, `cpcourse.cli.progress`)."""

    def __init__(self, total: int):
        super().__init__()
        self.total = total

    def append(self, seconds: float) -> None:
        super().append(seconds)
        print(f"step {len(self)}/{self.total} ({seconds:.2f} s)", file=sys.stderr, flush=True)


def _step_times(rank: int, total: int) -> list:
    return _StepsSaid(total) if rank == 0 and os.environ.get("CPCOURSE_PROGRESS") == "1" else []


def generate_rank(s) -> dict:
    """What each rank runs under `cpcourse.launch` for the run `s` (a `Sampling` or a
    GenerateRequest, read by field): its frames of the sample, peak memory, times."""
    import torch.distributed as dist

    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.costs import predicted_peak_bytes

    rank, world = dist.get_rank(), dist.get_world_size()
    model = spec_model(s)
    cfg = model.cfg
    b, c, t, hl, wl = s.shape
    noise = torch.tensor_split(initial_noise(tuple(s.shape), s.seed, torch_dtype(s.dtype)),
                               world, dim=2)[rank].contiguous()  # [B, C, T/P, Hl, Wl]
    ctx = CPContext(group=dist.group.WORLD, frame_offset=frame_offset(t, rank, world),
                    grid=(hl // cfg.patch, wl // cfg.patch),
                    temporal_method=s.temporal_method, full_method=s.full_method)
    times = _step_times(rank, s.steps)
    out, peak = peak_memory(sample, model, noise, s.cond, s.steps, s.cfg_scale, ctx, times)
    predicted = predicted_peak_bytes(cfg, list(s.shape), world, rank, ctx.temporal_method,
                                     ctx.full_method, elem_bytes=noise.element_size())
    return {"rank": rank, "frames": out, "peak_bytes": peak, "predicted_peak_bytes": predicted,
            "step_seconds": list(times)}


def generate_mesh_rank(s) -> dict:
    """`generate_rank` on a `cpcourse.mesh` layout (`s.layout`): cfg x ring x ulysses x tp.

    Each rank samples the frames of its cp rank (ring x ulysses) for its cfg branch with its
    tp share of the heads; it returns them with its mesh coordinates and the bytes it sent per
    mesh dim during sampling, measured, beside `tinydit.costs.predicted_bytes_per_step`.
    `measure_memory` False skips the peak-memory tracking (it slows every op).
    """
    import torch.distributed as dist

    from cpcourse.mesh import bytes_by_dim, cp_coords, make_mesh
    from cpcourse.support.bytecount import count_bytes
    from cpcourse.support.peak_memory import peak_memory
    from cpcourse.tinydit.costs import predicted_bytes_per_step
    from cpcourse.tinydit.tp import tensor_parallel

    layout, rank = s.layout, dist.get_rank()
    model = spec_model(s)
    cfg = model.cfg
    mesh = make_mesh(**layout.as_dict(), heads=cfg.heads)
    if layout.tp > 1:
        tensor_parallel(model, mesh.get_group("tp"))
    b, c, t, hl, wl = s.shape
    cp_rank, cp_world = cp_coords(mesh)
    noise = torch.tensor_split(initial_noise(tuple(s.shape), s.seed, torch_dtype(s.dtype)),
                               cp_world, dim=2)[cp_rank].contiguous()  # [B, C, T/cp, Hl, Wl]
    ctx = CPContext(mesh=mesh, frame_offset=frame_offset(t, cp_rank, cp_world),
                    grid=(hl // cfg.patch, wl // cfg.patch))
    times = _step_times(rank, s.steps)
    args = (model, noise, s.cond, s.steps, s.cfg_scale, ctx, times)
    with count_bytes() as sent:  # memory tracking costs time: a benchmark turns it off
        out, peak = (peak_memory(sample, *args) if s.measure_memory else (sample(*args), None))
    measured = {k: v // s.steps for k, v in bytes_by_dim(sent, mesh).items()}
    return {"rank": rank, "coords": layout.coords(rank), "cp_rank": cp_rank, "frames": out,
            "peak_bytes": peak, "step_seconds": list(times), "bytes_per_step": measured,
            "bytes_total": sent.total,
            "predicted_bytes_per_step": predicted_bytes_per_step(
                cfg, list(s.shape), layout, rank, noise.element_size(), steps=s.steps)}


def mesh_shards(results: list[dict]) -> list[dict]:
    """Of `generate_mesh_rank`'s per-rank results, one per frame shard (the rank at cfg 0, tp 0
    of each cp rank), in cp order: concatenated along frames, they are the whole sample."""
    return sorted((r for r in results if r["coords"]["cfg"] == 0 and r["coords"]["tp"] == 0),
                  key=lambda r: r["cp_rank"])


def mesh_report(results: list[dict], layout) -> dict:
    """The frame shards (`mesh_shards`), whether the replicas on the other cfg and tp ranks hold
    the same frames, and the bytes per mesh dim per step, measured and predicted, per rank."""
    shards = mesh_shards(results)
    same = all(torch.equal(r["frames"], shards[r["cp_rank"]]["frames"]) for r in results)
    measured = [r["bytes_per_step"] for r in results]
    predicted = [r["predicted_bytes_per_step"] for r in results]
    return {"shards": shards, "layout": layout.as_dict(), "replicas_identical": bool(same),
            "bytes_per_step_by_dim": measured, "predicted_bytes_per_step_by_dim": predicted,
            "bytes_match_prediction": measured == predicted}
