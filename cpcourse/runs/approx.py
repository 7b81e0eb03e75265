"""A clip sampled on P ranks by an approximate method, against the exact clip: the runner of
`cpcourse generate --approx` and `--cache`.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --compare --json

`check_approx` checks everything before a process starts, `launch_approx` runs
`cpcourse.approx.rank:approx_rank` on the ranks, `approx_report` builds the clip `[T, 3, H, W]`
and the report (what the tracker sees, bytes per step, seconds waiting on communication, steps
skipped), and `--compare` samples the exact clip here (one process) and gives PSNR and the
largest difference against it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.approx import CACHES, METHODS
from cpcourse.approx.fbcache import DECISIONS
from cpcourse.approx.rank import WHOLE_VIDEO
from cpcourse.runs.generate import GenerateRequest, check_request
from cpcourse.support.errors import finite_float, positive_int, require

SPLITS = ("time", "space")


@dataclass(frozen=True)
class ApproxRequest:
    """A checked `cpcourse generate --approx` run: the plain request and the method's knobs."""

    run: GenerateRequest
    approx: str          # "exact" (all-gather CP: the reference row) or one of METHODS
    warmup: int
    patches: int
    cache: str | None
    cache_threshold: float
    cache_decide: str
    split: str = "time"

    def rank_spec(self, cases=None) -> dict:
        return {**self.run.rank_spec(), "approx": self.approx, "warmup": self.warmup,
                "patches": self.patches, "cache": self.cache,
                "cache_threshold": self.cache_threshold, "cache_decide": self.cache_decide,
                "split": self.split, "cases": cases}


def check_approx(nproc: int, seed: int = 0, *, prompt=None, approx=None, warmup=0, patches=None,
                 split="time", cache=None, cache_threshold=None, cache_decide="global",
                 steps=None, cfg_scale=None) -> ApproxRequest:
    """The arguments as an ApproxRequest, or an InputError naming the parameter."""
    require(approx is not None or cache is not None, "give `approx` or `cache`")
    require(approx is None or approx in ("exact", *METHODS),  # exact: all-gather CP
            f"approx must be one of {', '.join(METHODS)}, got {approx!r}")
    require(split in SPLITS, f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    require(split == "time" or approx not in WHOLE_VIDEO, f"split space: {approx} splits "
            "the model, not the video (pipefusion's patches are whole frames, asyncdiff holds "
            "the whole latent): use split=time")
    run = check_request(nproc, seed, prompt=prompt, steps=steps, cfg_scale=cfg_scale)
    require(run.cfg.attention == "full", "the approximate methods replace full 3D attention: "
            "these weights use factored attention")
    frames, rows = run.shape[2], run.shape[3] // run.cfg.patch
    parts = (frames, "latent frames") if split == "time" else (rows, "rows of tokens")
    require(parts[0] % run.nproc == 0 or approx in WHOLE_VIDEO, f"nproc {run.nproc} does not "
            f"divide the {parts[0]} {parts[1]}: the patch methods all-gather equal shards")
    warmup = positive_int("warmup", warmup, allow_zero=True)
    require(warmup <= run.steps, f"warmup {warmup} is past the run's {run.steps} steps: at "
            f"warmup {run.steps} every step is already synchronous (exact); use at most "
            f"{run.steps}")
    if approx in WHOLE_VIDEO:
        require(run.nproc <= run.cfg.depth, f"nproc {run.nproc}: {approx} gives each rank at "
                f"least one of the model's {run.cfg.depth} blocks; use at most {run.cfg.depth}")
    patches = 2 if patches is None else positive_int("patches", patches)
    require(approx == "pipefusion" or patches == 2 or patches is None,
            "patches is for approx=pipefusion")
    require(patches <= frames, f"patches {patches}: pipefusion's patches are whole frames and "
            f"the clip has {frames} latent frames; use at most {frames}")
    require(cache is None or cache in CACHES, f"cache must be one of {CACHES}, got {cache!r}")
    require(cache is None or approx not in WHOLE_VIDEO, f"cache fbcache skips steps of the patch "
            f"methods (exact CP, naive, displaced), not of {approx}")
    require(cache_decide in DECISIONS, f"cache_decide must be one of {DECISIONS}")
    threshold = 0.0 if cache_threshold is None else finite_float("cache_threshold",
                                                                 cache_threshold)
    require(threshold >= 0, f"cache_threshold {threshold}: a relative change, at least 0")
    return ApproxRequest(run=run, approx=approx or "exact", warmup=warmup, patches=patches,
                         cache=cache, cache_threshold=threshold, cache_decide=cache_decide,
                         split=split)


def launch_approx(request: ApproxRequest, cases=None, timeout: float = 120.0, stream=False):
    """The ranks' results (one dict per rank) of `approx_rank`."""
    from cpcourse.launch import launch

    return launch("cpcourse.approx.rank:approx_rank", request.run.nproc, timeout=timeout,
                  args=(request.rank_spec(cases),), stream=stream)


def clip_latents(request: ApproxRequest, results, i: int = 0) -> torch.Tensor:
    """Clip i's latents `[B, C, T, Hl, Wl]`: rank 0's whole video, or every rank's frames (or
    rows)."""
    if request.approx in WHOLE_VIDEO:
        return results[0]["clips"][i]["frames"]
    return torch.cat([r["clips"][i]["frames"] for r in results],
                     dim=2 if request.split == "time" else 3)


def approx_report(request: ApproxRequest, results, compare: bool = False) -> tuple:
    """(clip [T, 3, H, W], report) of a one-clip run; `compare` adds the exact clip's PSNR."""
    from cpcourse.approx.quality import compare as against
    from cpcourse.runs.generate import tracked_report
    from cpcourse.tinydit.sampling import single_process_sample
    from cpcourse.tinydit.training import to_clip

    run = request.run
    clip = to_clip(clip_latents(request, results))
    per = [r["clips"][0] for r in results]
    report = {"approx": request.approx, "warmup": request.warmup, "steps": run.steps,
              "nproc": run.nproc, "seed": run.seed, "split": request.split,
              "patches": request.patches if request.approx == "pipefusion" else None,
              "cache": request.cache,
              "cache_threshold": request.cache_threshold if request.cache else None,
              "bytes_per_step": max(p["bytes"] for p in per) / run.steps,
              "bytes_per_step_per_rank": [p["bytes"] / run.steps for p in per],
              "exposed_comm_seconds": max(p["exposed_seconds"] for p in per),
              "seconds": round(max(sum(p["step_seconds"]) for p in per), 4),
              "steps_skipped": per[0]["steps_skipped"],
              "first_block_change": per[0]["changes"] if request.cache else None}
    report.update(tracked_report(run.prompt, clip))
    if compare:
        exact_clip = to_clip(single_process_sample(run.rank_spec()))
        report.update(against(clip, exact_clip))
        report.update(exactness(request, report, exact_clip))
    return clip, report


def exactness(request: ApproxRequest, report: dict, exact_clip) -> dict:
    """`exact`, `tolerance`, `within_tolerance` and `no_tolerance_because`. A run that took
    every step synchronously (warm-up covering the run, or exact CP) and skipped none is exact
    CP: the one tolerance rule applies to it. Any other run is approximate by design: its
    measures are psnr_vs_exact and max_abs_diff_vs_exact, and no tolerance applies."""
    from cpcourse.support.tolerance import verdict

    synchronous = request.approx == "exact" or request.warmup >= request.run.steps
    if synchronous and report["steps_skipped"] == 0:
        v = verdict(report["max_abs_diff_vs_exact"], float(exact_clip.abs().max()), "exact_cp",
                    "float32", request.run.cfg_scale)
        return {"exact": True, "tolerance": v["tolerance"],
                "within_tolerance": v["within_tolerance"], "no_tolerance_because": None}
    why = (f"{report['steps_skipped']} steps skipped by the cache" if report["steps_skipped"]
           else f"{request.approx} uses stale or missing remote activations after warm-up "
           f"{request.warmup} of {request.run.steps} steps")
    return {"exact": False, "tolerance": None, "within_tolerance": None,
            "no_tolerance_because": f"approximate by design ({why}): judge it by psnr_vs_exact"}


def run_approx(nproc: int, seed: int = 0, *, compare: bool = False, timeout: float = 120.0,
               stream=False, **knobs) -> dict:
    """Sample one clip; `knobs` are `check_approx`'s. Returns {"clip", "latents", "report"}."""
    request = check_approx(nproc, seed, **knobs)
    results = launch_approx(request, timeout=timeout, stream=stream)
    clip, report = approx_report(request, results, compare)
    return {"clip": clip, "latents": clip_latents(request, results), "report": report}


def approx_clips(request: ApproxRequest, cases, timeout: float = 600.0) -> list[dict]:
    """Several clips in one launch: `cases` [[label, seed], ...] -> per clip {"clip" [T, 3, H, W],
    "bytes_per_step" (the busiest rank), "exposed_comm_seconds", "steps_skipped", and the
    cache's "changes" (all-reduced, rank 0's list) and "local_changes" (one list per rank)}."""
    return _clips(request, launch_approx(request, cases=cases, timeout=timeout), len(cases))


def approx_sweep(requests: list[ApproxRequest], cases, timeout: float = 600.0) -> list[list]:
    """`approx_clips` of every request, all in ONE launch (they must share nproc): process
    start-up, not sampling, is most of a small launch's time."""
    from cpcourse.launch import launch

    nproc = requests[0].run.nproc
    require(all(r.run.nproc == nproc for r in requests), "every request must use the same nproc")
    out = launch("cpcourse.approx.rank:approx_ranks", nproc, timeout=timeout,
                 args=([r.rank_spec(cases) for r in requests],), stream=False)
    return [_clips(req, [ranks[i] for ranks in out], len(cases))
            for i, req in enumerate(requests)]


def _clips(request: ApproxRequest, results, n: int) -> list[dict]:
    from cpcourse.tinydit.training import to_clip

    steps = request.run.steps
    out = []
    for i in range(n):
        per = [r["clips"][i] for r in results]
        out.append({"clip": to_clip(clip_latents(request, results, i)),
                    "bytes_per_step": max(p["bytes"] for p in per) / steps,
                    "exposed_comm_seconds": max(p["exposed_seconds"] for p in per),
                    "steps_skipped": per[0]["steps_skipped"],
                    "changes": per[0]["changes"],
                    "local_changes": [p["local_changes"] for p in per]})
    return out
