"""A clip from the tiny video model, sampled on P ranks under CP: the runner of `cpcourse generate`.

    cpcourse generate --prompt circle-right --seed 0 --nproc 2 --compare --json

`run_generate(nproc, ...)` runs four named steps: `check_request` turns the arguments into a
`GenerateRequest` (every input checked before a process starts), `launch_ranks` runs
`cpcourse.tinydit.sampling.generate_rank` (or `generate_mesh_rank` under a layout) on the ranks,
`build_report` gathers the frames `[B, C, T, Hl, Wl]` and what each rank measured, and
`compare_with_one_process` samples the same clip here and gives the largest difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cpcourse.support.errors import guidance_scale, positive_int, require, seed_int
from cpcourse.tinydit.model import DiTConfig
from cpcourse.tinydit.sampling import DTYPES
from cpcourse.tinydit.training import RANDOM_DEFAULTS, TRAINED_DEFAULTS, weights_config
from cpcourse.video import FULL_METHODS, TEMPORAL_METHODS


@dataclass(frozen=True)
class GenerateRequest:
    """One sampling run, checked. `shape` is the latents' [B, C, T, Hl, Wl]; `cond` what the
    model is conditioned on (the prompt's (shape, direction) ids, or the random model's label);
    `path` the weights file (None: the seeded random DiT); `layout` None (every rank a CP rank)
    or a `cpcourse.support.layout.Layout` of `nproc` ranks."""

    nproc: int
    seed: int
    weights: str
    path: str | None
    cfg: DiTConfig
    shape: tuple[int, int, int, int, int]
    steps: int
    cfg_scale: float
    cond: object
    prompt: str | None
    dtype: str
    weight_seed: int
    temporal_method: str
    full_method: str
    layout: object = None

    @property
    def trained(self) -> bool:
        return self.path is not None

    @property
    def output_shape(self) -> tuple[int, ...]:
        """What the run returns: the clip [T, 3, H, W] (trained weights), else the latents."""
        b, c, t, h, w = self.shape
        return (t, c, h, w) if self.trained else self.shape

    def rank_spec(self) -> dict:
        """What every rank (and the one-process reference) is handed."""
        spec = {"model": self.cfg.as_dict(), "weights": self.path, "dtype": self.dtype,
                "weight_seed": self.weight_seed, "seed": self.seed, "shape": list(self.shape),
                "steps": self.steps, "cfg_scale": self.cfg_scale, "label": self.cond,
                "temporal_method": self.temporal_method, "full_method": self.full_method}
        if self.layout is not None:
            spec["layout"] = self.layout.as_dict()
        return spec


def run_generate(nproc: int, seed: int = 0, *, prompt: str | None = None,
                 weights: str = "shipped", frames: int | None = None, height: int | None = None,
                 width: int | None = None, batch: int = 1, steps: int | None = None,
                 cfg_scale: float | None = None, label: int | None = None,
                 attention: str | None = None, temporal_method: str = "all_to_all",
                 full_method: str = "ring", dtype: str = "fp32", weight_seed: int = 0,
                 model: dict | None = None, compare: bool = False, timeout: float = 120.0,
                 stream=False, layout=None) -> dict:
    """Sample on `nproc` processes.

    `layout`: None (every rank a CP rank, `temporal_method` / `full_method`), or a
    `cpcourse.support.layout.Layout` (or its text, "cfg=2,ulysses=2") of nproc ranks: cfg x ring x
    ulysses x tp, the frames split over ring x ulysses, attention by USP.

    Returns {"latents": [B, C, T, Hl, Wl], "clip": [T, 3, H, W] in [0, 1] (trained weights
    only, else None), "report": {...}}. `weights`: "shipped", a file from `cpcourse train`, or
    "random" (then `label`, `attention`, `model` and `weight_seed` choose the random DiT).
    """
    request = check_request(
        nproc, seed, prompt=prompt, weights=weights, frames=frames, height=height, width=width,
        batch=batch, steps=steps, cfg_scale=cfg_scale, label=label, attention=attention,
        temporal_method=temporal_method, full_method=full_method, dtype=dtype,
        weight_seed=weight_seed, model=model, layout=layout)
    results = launch_ranks(request, timeout=timeout, stream=stream)
    latents, clip, report = build_report(request, results)
    if compare:
        report.update(compare_with_one_process(request, latents, clip))
    return {"latents": latents, "clip": clip, "report": report}


def check_request(nproc: int, seed: int = 0, *, prompt=None, weights="shipped", frames=None,
                  height=None, width=None, batch=1, steps=None, cfg_scale=None, label=None,
                  attention=None, temporal_method="all_to_all", full_method="ring",
                  dtype="fp32", weight_seed=0, model=None, layout=None) -> GenerateRequest:
    """`run_generate`'s arguments as a `GenerateRequest`, or an InputError naming the parameter.
    Unset sizes, steps and guidance take the weights' defaults; the weights file is read here."""
    path, trained_cfg = weights_config(weights)
    defaults = TRAINED_DEFAULTS if path is not None else RANDOM_DEFAULTS
    frames, height, width, steps, cfg_scale = (
        defaults[k] if v is None else v for k, v in (
            ("frames", frames), ("height", height), ("width", width), ("steps", steps),
            ("cfg_scale", cfg_scale)))
    nproc, frames = positive_int("nproc", nproc), positive_int("frames", frames)
    cfg_scale = guidance_scale("cfg_scale", cfg_scale)
    seed = seed_int("seed", seed)
    require(temporal_method in TEMPORAL_METHODS,
            f"temporal_method must be one of {TEMPORAL_METHODS}")
    require(full_method in FULL_METHODS, f"full_method must be one of {FULL_METHODS}")
    require(dtype in DTYPES, f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if layout is not None:
        layout = _layout(layout, nproc)
    cp = nproc if layout is None else layout.cp
    require(cp <= frames, f"{'`nproc`' if layout is None else 'ring x ulysses'} {cp} is more "
            f"than the {frames} latent frames to split: use {frames} or fewer, or more `frames`")
    if path is not None:
        cfg, prompt, cond = _trained_model(trained_cfg, defaults, frames, prompt=prompt,
                                           label=label, model=model, batch=batch,
                                           attention=attention)
    else:
        cfg, cond = _random_model(prompt=prompt, label=label, model=model, attention=attention)
    _check_split(cfg, nproc, layout, full_method)
    check_frame_size(cfg, height, width)
    shape = (positive_int("batch", batch), cfg.in_channels, frames, height, width)
    steps = positive_int("steps", steps)
    require(steps <= 1000, f"steps {steps}: use at most 1000")
    return GenerateRequest(nproc=nproc, seed=seed, weights=weights, path=path, cfg=cfg,
                           shape=shape, steps=steps, cfg_scale=cfg_scale, cond=cond,
                           prompt=prompt, dtype=dtype, weight_seed=weight_seed,
                           temporal_method=temporal_method, full_method=full_method,
                           layout=layout)


def check_frame_size(cfg: DiTConfig, height, width) -> None:
    """A frame size the tiny DiT takes: whole patches, at most 64 patches a side."""
    for name, val in (("height", height), ("width", width)):
        require(positive_int(name, val) % cfg.patch == 0,
                f"{name} {val} must be a multiple of the patch size {cfg.patch}")
        require(val <= 64 * cfg.patch, f"{name} {val} is too large for this tiny model: "
                f"use at most {64 * cfg.patch}")


def _trained_model(cfg: DiTConfig, defaults: dict, frames: int, *, prompt, label, model, batch,
                   attention) -> tuple[DiTConfig, str, tuple[int, int]]:
    """The trained weights' (config, prompt, condition): their size is fixed, --prompt picks."""
    from cpcourse.tinydit.moving_shapes import PROMPTS, parse_prompt

    require(label is None, "label conditions the random model: the trained model takes "
            f"`prompt` ({', '.join(PROMPTS)})")
    require(model is None and batch == 1, "the trained model's size is fixed by its weights "
            "and it draws one clip per run")
    require(attention in (None, cfg.attention), f"these weights were trained with "
            f"attention={cfg.attention}: leave `attention` out (or use weights=random)")
    prompt = prompt or PROMPTS[1]
    cond = parse_prompt(prompt)
    require(frames <= 4 * defaults["frames"], f"frames {frames}: the model was trained on "
            f"{defaults['frames']} frames; use at most {4 * defaults['frames']}")
    return cfg, prompt, cond


def _random_model(*, prompt, label, model, attention) -> tuple[DiTConfig, int]:
    """The seeded random DiT's (config, label): `model` and `attention` choose its size."""
    require(prompt is None, "prompt needs trained weights: drop weights=random, or "
            "condition the random model with `label`")
    cfg = DiTConfig(**{**(model or {}), "attention": attention or "factored"})
    label = 3 if label is None else label
    require(0 <= label < cfg.num_classes, f"label must be in [0, {cfg.num_classes})")
    return cfg, label


def _check_split(cfg: DiTConfig, nproc: int, layout, full_method: str) -> None:
    """The heads split over the ranks, found before start-up rather than on every rank."""
    if layout is not None:
        from cpcourse.support.layout import check_layout

        check_layout(layout, nproc, cfg.heads)
    elif cfg.attention == "full" and full_method == "ulysses":
        works = [p for p in range(1, cfg.heads + 1) if cfg.heads % p == 0]
        require(cfg.heads % nproc == 0,
                f"full_method=ulysses splits the model's {cfg.heads} heads over the {nproc} "
                "ranks: use "
                f"`nproc` {', '.join(map(str, works))}, or full_method=ring (no such limit)")


def _layout(layout, nproc: int):
    from cpcourse.support.layout import Layout

    layout = Layout.parse(layout) if isinstance(layout, str) else layout
    require(layout.world == nproc, f"layout {layout} needs {layout.world} ranks: pass nproc="
            f"{layout.world} (or leave `nproc` out)")
    return layout


def launch_ranks(request: GenerateRequest, timeout: float = 120.0, stream=False):
    """Sample on `request.nproc` ranks; returns their `RankResults` (one dict per rank)."""
    from cpcourse.launch import launch

    target = "generate_rank" if request.layout is None else "generate_mesh_rank"
    return launch(f"cpcourse.tinydit.sampling:{target}", request.nproc, timeout=timeout,
                  args=(request.rank_spec(),), stream=stream)


def build_report(request: GenerateRequest, results) -> tuple[torch.Tensor, object, dict]:
    """(latents [B, C, T, Hl, Wl], clip [T, 3, H, W] or None, report) from the ranks' results:
    times, peak memory measured (and predicted, for plain CP), and what the tracker sees."""
    from cpcourse.tinydit.sampling import mesh_report
    from cpcourse.tinydit.training import to_clip

    layout = request.layout
    by_mesh = {} if layout is None else mesh_report(results, layout)
    shards = results if layout is None else by_mesh.pop("shards")
    latents = torch.cat([r["frames"] for r in shards], dim=2)
    steps_s = [max(r["step_seconds"][i] for r in results) for i in range(request.steps)]
    report = {"nproc": request.nproc, "seed": request.seed,
              "weights": request.path if request.trained else request.weights,
              "shape": list(request.shape), "dtype": request.dtype,
              "attention": request.cfg.attention, "temporal_method": request.temporal_method,
              "full_method": request.full_method, "steps": request.steps,
              "cfg_scale": float(request.cfg_scale),
              "frames_per_rank": [r["frames"].shape[2] for r in results],
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "seconds": round(max(sum(r["step_seconds"]) for r in results), 4),
              "seconds_per_step": sorted(steps_s)[len(steps_s) // 2],
              "launch_seconds": round(results.seconds, 3),
              "latent_abs_mean": float(latents.abs().mean()), "model": request.cfg.as_dict()}
    if layout is None:
        report["predicted_peak_bytes_per_rank"] = [int(r["predicted_peak_bytes"])
                                                   for r in results]
        report["peak_vs_predicted_worst_rel_err"] = max(
            abs(m / p - 1) for m, p in zip(report["peak_bytes_per_rank"],
                                           report["predicted_peak_bytes_per_rank"], strict=True))
    report.update(by_mesh)
    clip = to_clip(latents) if request.trained else None
    if request.trained:
        report.update(tracked_report(request.prompt, clip))
    return latents, clip, report


def tracked_report(prompt: str, clip: torch.Tensor) -> dict:
    """What the tracker sees in `clip` [T, 3, H, W], and whether it is what `prompt` asked."""
    from cpcourse.tinydit.moving_shapes import matches, track

    seen = track(clip)
    ok = matches(prompt, seen)
    return {"prompt": prompt, "clip_shape": list(clip.shape), "track": {
        "direction": seen["direction"], "shape": seen["shape"],
        "velocity_px_per_frame": [round(v, 3) for v in seen["velocity"]],
        "present_fraction": ok["present_fraction"]},
        "matches_prompt": bool(ok["direction"] and ok["shape"])}


def compare_with_one_process(request: GenerateRequest, latents: torch.Tensor, clip) -> dict:
    """The ranks' sample against this process's (clips for trained weights, latents for random
    ones): the largest difference, the tolerance for this run's attention, dtype and guidance
    (`cpcourse.support.tolerance`), and whether it holds."""
    from cpcourse.support.tolerance import verdict
    from cpcourse.tinydit.sampling import single_process_sample
    from cpcourse.tinydit.training import to_clip

    single = single_process_sample(request.rank_spec())
    mine = latents if not request.trained else clip
    other = single if not request.trained else to_clip(single)
    used = request.full_method if request.cfg.attention == "full" else request.temporal_method
    method = "usp" if request.layout is not None else used
    return verdict(float((mine - other).abs().max()), float(other.abs().max()), method,
                   request.dtype, request.cfg_scale)
