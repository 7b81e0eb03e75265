"""`cpcourse bench mesh`: CFG-parallel against CFG in one process, and each 2-rank mesh dim.

    cpcourse bench mesh --json

One process with 2 threads samples the random full-3D DiT with classifier-free guidance as the
sampler runs it (the conditional and unconditional passes as one batch of 2B). Then, in one
launch of 2 ranks with 1 thread each (the same 2 cores), every 2-rank layout samples the same
model for the same steps: cfg2 (each rank one branch, one all-gather per step), ring2, ulysses2
and tp2. Times are the sampling loop only (start-up excluded), the best of `--repeats`, and every
ratio comes from this one run. Each layout's sample is checked against the one-process sample,
and its bytes per mesh dim per step are reported beside the cost model's.
"""

from __future__ import annotations

import json
import time

import torch

from cpcourse.support.errors import ArgumentParser, positive_int, require

LAYOUTS = ("cfg=2", "ring=2", "ulysses=2", "tp=2")


def _sampling(frames: int, size: int, hidden: int, depth: int, steps: int):
    """The run every layout and the one process sample: the random full-3D DiT, fp32."""
    from cpcourse.tinydit.model import DiTConfig
    from cpcourse.tinydit.sampling import Sampling

    cfg = DiTConfig(attention="full", hidden=hidden, heads=4, depth=depth)
    return Sampling(cfg=cfg, path=None, dtype="fp32", weight_seed=0, seed=0,
                    shape=(1, 4, frames, size, size), steps=steps, cfg_scale=4.0, cond=3,
                    measure_memory=False)


def bench_rank(run, layouts: list[str], repeats: int) -> list[dict]:
    """Every rank: each layout `repeats` times on the `Sampling` `run`; its frames, best
    sampling time and bytes."""
    from dataclasses import replace

    from cpcourse.support.layout import Layout
    from cpcourse.tinydit.sampling import generate_mesh_rank

    out = []
    for text in layouts:
        best, last = None, None
        for _ in range(repeats):
            last = generate_mesh_rank(replace(run, layout=Layout.parse(text)))
            seconds = sum(last["step_seconds"])
            best = seconds if best is None else min(best, seconds)
        out.append({"layout": text, "seconds": best, "frames": last["frames"],
                    "coords": last["coords"], "cp_rank": last["cp_rank"],
                    "bytes_per_step": last["bytes_per_step"],
                    "predicted_bytes_per_step": last["predicted_bytes_per_step"]})
    return out


def _single(run, repeats: int, threads: int) -> tuple[float, torch.Tensor]:
    """The `Sampling` `run` in this process with `threads` threads: best time, the latents."""
    from cpcourse.support.dtypes import torch_dtype
    from cpcourse.tinydit.sampling import initial_noise, sample, spec_model

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = spec_model(run)
        noise = initial_noise(run.shape, run.seed, torch_dtype(run.dtype))
        best, out = None, None
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = sample(model, noise, run.cond, run.steps, run.cfg_scale)
            best = min(best or 1e9, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return best, out


def run_mesh(frames: int = 8, size: int = 16, hidden: int = 64, depth: int = 2, steps: int = 4,
             repeats: int = 3, timeout: float = 300.0) -> dict:
    from cpcourse.launch import launch
    from cpcourse.tinydit.sampling import mesh_shards

    run = _sampling(frames, size, hidden, depth, steps)
    single_s, ref = _single(run, repeats, threads=2)
    results = launch("cpcourse.bench.mesh:bench_rank", 2, timeout=timeout, threads=1,
                     args=(run, list(LAYOUTS), repeats), stream=False)
    rows = []
    for i, text in enumerate(LAYOUTS):
        per_rank = [r[i] for r in results]
        latents = torch.cat([r["frames"] for r in mesh_shards(per_rank)], dim=2)
        seconds = max(r["seconds"] for r in per_rank)
        rows.append({"layout": text, "seconds": round(seconds, 4),
                     "ratio_to_single": round(seconds / single_s, 3),
                     "max_abs_err": float((latents - ref).abs().max()),
                     "bytes_per_step_by_dim": per_rank[0]["bytes_per_step"],
                     "bytes_match_prediction": all(
                         r["bytes_per_step"] == r["predicted_bytes_per_step"] for r in per_rank)})
    return {"model": run.cfg.as_dict(), "shape": list(run.shape), "steps": steps,
            "repeats": repeats, "threads_single": 2, "threads_per_rank": 1,
            "seconds_single": round(single_s, 4), "layouts": rows,
            "cfg_parallel_ratio": rows[0]["ratio_to_single"],
            "cfg_parallel_within_1_05": rows[0]["ratio_to_single"] <= 1.05}


def main(argv: list[str]) -> int:
    p = ArgumentParser(prog="cpcourse bench mesh", description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", type=int, default=16, help="latent height and width")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    frames = positive_int("--frames", args.frames)
    require(2 <= frames <= 64, f"--frames must be from 2 to 64, got {frames}")
    size = positive_int("--size", args.size)
    require(size % 2 == 0 and size <= 64, f"--size must be even and at most 64, got {size}")
    hidden = positive_int("--hidden", args.hidden)
    require(hidden % 24 == 0 or hidden % 32 == 0, "--hidden must be a multiple of 24 or 32 "
            "(4 heads, each an even head dim of at least 6)")
    require(hidden <= 1024, f"--hidden must be at most 1024, got {hidden}")
    depth = positive_int("--depth", args.depth)
    require(depth <= 16, f"--depth must be at most 16, got {depth}")
    steps = positive_int("--steps", args.steps)
    require(steps <= 100, f"--steps must be at most 100, got {steps}")
    repeats = positive_int("--repeats", args.repeats)
    require(repeats <= 20, f"--repeats must be at most 20, got {repeats}")
    report = run_mesh(frames, size, hidden, depth, steps, repeats)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print(f"one process, 2 threads, CFG batched: {report['seconds_single']:.3f} s "
          f"({steps} steps of {report['shape']})")
    for row in report["layouts"]:
        dims = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in row["bytes_per_step_by_dim"].items()
                         if v)
        print(f"  {row['layout']:10s} 2 ranks x 1 thread: {row['seconds']:.3f} s "
              f"({row['ratio_to_single']:.2f}x), max |err| {row['max_abs_err']:.2g}, "
              f"sent per step: {dims}")
    return 0
