"""A clip sampled on P ranks by an approximate method, against the exact clip: the runner of
`cpcourse generate --approx` and `--cache`.

    cpcourse generate --prompt circle-right --nproc 2 --approx displaced --warmup 1 --compare --json

`ApproxRequest` is the run's parameters, declared once (the approximate flags of `cpcourse
generate` are its fields) and checked when made, before a process starts; `launch_approx` runs
`cpcourse.approx.rank.approx_rank(req)` on the ranks, `approx_report` builds the clip
`[T, 3, H, W]` and the report (what the tracker sees, bytes per step, seconds waiting on
communication, steps skipped), and `compare` samples the exact clip here (one process) and
gives PSNR and the largest difference against it. `run(req)` is the three in a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpcourse.approx import CACHES, METHODS
from cpcourse.approx.fbcache import DECISIONS, RULES
from cpcourse.approx.rank import WHOLE_VIDEO, approx_rank, approx_ranks
from cpcourse.runs.generate import GenerateRequest
from cpcourse.support.errors import finite_float, positive_float, positive_int, require
from cpcourse.support.request import check_common, flag, set_derived

SPLITS = ("time", "space")


@dataclass(frozen=True)
class ApproxRequest:
    """A checked `cpcourse generate --approx` (or `--cache`) run of the shipped model: the
    fields are its flags (those it shares with one clip, `prompt` to `timeout`, are spelled
    by GenerateRequest); `run` is the plain GenerateRequest it approximates."""

    prompt: str | None = flag(None, "what the trained model draws")
    nproc: int = flag(2, "ranks")
    seed: int = flag(0, "noise seed")
    approx: str | None = flag(None, "approximate CP: stale or missing remote activations "
                              "(--compare: vs exact); exact: all-gather CP, the reference row",
                              choices=("exact", *METHODS), acts="trained")
    warmup: int = flag(0, "--approx: synchronous (exact) steps first", acts="approx")
    patches: int | None = flag(None, "--approx pipefusion: frame patches through the stages "
                               "(default 2)", acts="pipefusion")
    split: str = flag("time", "--approx: what a rank holds, frames (time) or rows (space)",
                      choices=SPLITS, acts="approximate")
    cache: str | None = flag(None, "skip steps whose first block barely changed (exact CP, "
                             "naive, displaced)", choices=CACHES, acts="trained")
    cache_threshold: float | None = flag(None, "--cache: relative L1 change of the first block "
                                         "below which a step is skipped (default 0: never)",
                                         acts="cache")
    cache_rule: str = flag("output", "--cache: output compares the first block's output with "
                           "the previous step's (the course's); residual compares its residual "
                           "with the last step that ran the model (ParaAttention's)",
                           choices=RULES, acts="cache")
    cache_decide: str = flag("global", "global: the ranks agree on a skip; local: each alone "
                             "(a deadlock, on purpose)", choices=DECISIONS, cli=False)
    steps: int | None = flag(None, "Euler steps (the weights')")
    cfg_scale: float | None = flag(None, "guidance scale (4)")
    compare: bool = flag(False, "also sample the exact clip here: PSNR and largest difference")
    timeout: float = flag(120.0, "seconds the ranks may run")
    run: GenerateRequest = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        check_common(self)
        approx, split, cache = self.approx, self.split, self.cache
        require(approx is not None or cache is not None, "give `approx` or `cache`")
        require(split == "time" or approx not in WHOLE_VIDEO, f"split space: {approx} splits "
                "the model, not the video (pipefusion's patches are whole frames, asyncdiff "
                "holds the whole latent): use split=time")
        run = GenerateRequest(nproc=self.nproc, seed=self.seed, prompt=self.prompt,
                              steps=self.steps, cfg_scale=self.cfg_scale)
        require(run.cfg.attention == "full", "the approximate methods replace full 3D "
                "attention: these weights use factored attention")
        frames, rows = run.shape[2], run.shape[3] // run.cfg.patch
        parts = (frames, "latent frames") if split == "time" else (rows, "rows of tokens")
        require(parts[0] % run.nproc == 0 or approx in WHOLE_VIDEO, f"nproc {run.nproc} does "
                f"not divide the {parts[0]} {parts[1]}: the patch methods all-gather equal "
                "shards")
        warmup = positive_int("warmup", self.warmup, allow_zero=True)
        require(warmup <= run.steps, f"warmup {warmup} is past the run's {run.steps} steps: at "
                f"warmup {run.steps} every step is already synchronous (exact); use at most "
                f"{run.steps}")
        if approx in WHOLE_VIDEO:
            require(run.nproc <= run.cfg.depth, f"nproc {run.nproc}: {approx} gives each rank "
                    f"at least one of the model's {run.cfg.depth} blocks; use at most "
                    f"{run.cfg.depth}")
        patches = 2 if self.patches is None else positive_int("patches", self.patches)
        require(approx == "pipefusion" or patches == 2, "patches is for approx=pipefusion")
        require(patches <= frames, f"patches {patches}: pipefusion's patches are whole frames "
                f"and the clip has {frames} latent frames; use at most {frames}")
        require(cache is None or approx not in WHOLE_VIDEO, f"cache fbcache skips steps of the "
                f"patch methods (exact CP, naive, displaced), not of {approx}")
        require(cache is not None or self.cache_rule == "output",
                f"cache_rule {self.cache_rule}: it is the rule of cache=fbcache; give cache too")
        threshold = (0.0 if self.cache_threshold is None
                     else finite_float("cache_threshold", self.cache_threshold))
        require(threshold >= 0, f"cache_threshold {threshold}: a relative change, at least 0")
        positive_float("timeout", self.timeout, high=3600)
        set_derived(self, run=run, approx=approx or "exact", patches=patches,
                    cache_threshold=threshold)


def check_approx(nproc: int = 2, seed: int = 0, **fields) -> ApproxRequest:
    """`ApproxRequest(nproc=nproc, seed=seed, **fields)`, or an InputError naming the
    parameter."""
    return ApproxRequest(nproc=nproc, seed=seed, **fields)


def launch_approx(request: ApproxRequest, cases=None, timeout: float | None = None,
                  stream=False):
    """The ranks' results (one dict per rank) of `approx_rank(request, cases)`."""
    from cpcourse.launch import launch

    return launch(approx_rank, request.nproc, args=(request, cases), stream=stream,
                  timeout=request.timeout if timeout is None else timeout)


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
              "cache_rule": request.cache_rule if request.cache else None,
              "bytes_per_step": max(p["bytes"] for p in per) / run.steps,
              "bytes_per_step_per_rank": [p["bytes"] / run.steps for p in per],
              "exposed_comm_seconds": max(p["exposed_seconds"] for p in per),
              "seconds": round(max(sum(p["step_seconds"]) for p in per), 4),
              "steps_skipped": per[0]["steps_skipped"],
              "first_block_change": per[0]["changes"] if request.cache else None}
    report.update(tracked_report(run.prompt, clip))
    if compare:
        exact_clip = to_clip(single_process_sample(run))
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


def run(req: ApproxRequest, stream=False) -> dict:
    """Sample one clip. Returns {"clip" [T, 3, H, W], "latents", "report"}."""
    results = launch_approx(req, stream=stream)
    clip, report = approx_report(req, results, req.compare)
    return {"clip": clip, "latents": clip_latents(req, results), "report": report}


def run_approx(nproc: int = 2, seed: int = 0, *, stream=False, **fields) -> dict:
    """`run(ApproxRequest(nproc=nproc, seed=seed, **fields))`: one call."""
    return run(ApproxRequest(nproc=nproc, seed=seed, **fields), stream=stream)


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
    out = launch(approx_ranks, nproc, timeout=timeout, args=(requests, cases), stream=False)
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


def print_report(report: dict) -> None:
    """`run`'s report, a few lines for a terminal."""
    tr = report["track"]
    print(f"sampled '{report['prompt']}' with {report['approx']} (warm-up {report['warmup']} of "
          f"{report['steps']} steps) on {report['nproc']} processes: a {tr['shape']} moving "
          f"{tr['direction']} ({'matches' if report['matches_prompt'] else 'does NOT match'} "
          f"the prompt)")
    print(f"  sent {report['bytes_per_step'] / 1e3:.1f} kB per step (the busiest rank), waited "
          f"{report['exposed_comm_seconds']:.3f} s on communication, skipped "
          f"{report['steps_skipped']} steps")
    if "psnr_vs_exact" in report:
        psnr = report["psnr_vs_exact"]
        print(f"  vs the exact clip: PSNR {'inf' if psnr is None else f'{psnr:.1f}'} dB, max "
              f"|difference| {report['max_abs_diff_vs_exact']:.3g}")
        if report["exact"]:
            ok = "within" if report["within_tolerance"] else "OUTSIDE"
            print(f"  exact CP: {ok} the tolerance {report['tolerance']:.2g}")
        else:
            print(f"  no tolerance: {report['no_tolerance_because']}")
