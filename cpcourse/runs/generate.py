"""A clip from the tiny video model, sampled on P ranks under CP: the runner of `cpcourse generate`.

    cpcourse generate --prompt circle-right --seed 0 --nproc 2 --compare --json

`run(GenerateRequest(nproc=2, prompt="circle-right"))`: the Request is the run's parameters,
declared once (they are the command's flags) and checked when it is made, before a process
starts; `rank(req)` runs on every rank (`cpcourse.tinydit.sampling.generate_rank`, or
`generate_mesh_rank` under a layout) reading the Request's fields; `build_report` gathers the
frames `[B, C, T, Hl, Wl]` and what each rank measured, and `compare_with_one_process` samples
the same clip here and gives the largest difference. `run_generate(nproc, **fields)` is the
same in one call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cpcourse.support.errors import guidance_scale, positive_float, positive_int, require
from cpcourse.support.layout import Layout
from cpcourse.support.request import check_common, flag, set_derived
from cpcourse.tinydit.model import ATTENTIONS, DiTConfig
from cpcourse.tinydit.sampling import DTYPES, generate_mesh_rank, generate_rank
from cpcourse.tinydit.training import RANDOM_DEFAULTS, TRAINED_DEFAULTS, weights_config
from cpcourse.video import FULL_METHODS, TEMPORAL_METHODS


def _derived():
    return field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class GenerateRequest:
    """One sampling run, checked: the fields are `cpcourse generate`'s flags (one declaration;
    `acts` names the mode in which each acts, `cpcourse.cli.generate.mode_conditions`). A field
    left None takes the weights' default when the Request is made (`frames` 8 for trained
    weights, 8 x 16 x 16 and 4 steps for random ones; `nproc` 2 or the layout's world).

    Derived when made: `path` the weights file (None: the seeded random DiT), `cfg` its
    DiTConfig, `shape` the latents' [B, C, T, Hl, Wl], `cond` what the model is conditioned on
    (the prompt's (shape, direction) ids, or the random model's label); `layout` becomes a
    `cpcourse.support.layout.Layout` of `nproc` ranks. The sampling ranks
    (`cpcourse.tinydit.sampling.generate_rank`) read these attributes: no dict between."""

    prompt: str | None = flag(None, "what the trained model draws, e.g. circle-right "
                              "(--list-prompts)", acts="trained")
    weights: str = flag("shipped", "shipped (default), a file from `cpcourse train`, or random",
                        acts="clips")
    nproc: int | None = flag(None, "processes (CP degree), default 2 (with --layout: its world "
                             "size)", acts="clips")
    layout: str | None = flag(None, "a mesh, e.g. cfg=2,ulysses=2,ring=1,tp=1 (degrees multiply "
                              "to --nproc)", acts="one_clip")
    seed: int = flag(0, "noise seed", acts="clips")
    frames: int | None = flag(None, "frames T (default 8)", acts="plain")
    height: int | None = flag(None, "height (default 32; random: 16)", acts="plain")
    width: int | None = flag(None, "width (default 32; random: 16)", acts="plain")
    steps: int | None = flag(None, "Euler steps (default: the weights'; random: 4)", acts="clips")
    cfg_scale: float | None = flag(None, "guidance scale (default 4)",
                                   spelled=("--cfg-scale", "--cfg"), acts="clips")
    label: int | None = flag(None, "class id for --weights random (default 3)", acts="random")
    attention: str | None = flag(None, "random weights only: factored (default) or full",
                                 choices=ATTENTIONS, acts="random_clip")
    temporal_method: str | None = flag(None, "temporal attention under CP, with --attention "
                                       "factored (all_to_all)", choices=TEMPORAL_METHODS,
                                       spelled=("--temporal",), acts="plain_cp")
    full_method: str | None = flag(None, "3D attention under CP, for full attention (ring)",
                                   choices=FULL_METHODS, spelled=("--full",), acts="plain_cp")
    dtype: str = flag("fp32", "what sampling runs in", choices=sorted(DTYPES), acts="clips")
    compare: bool = flag(False, "also sample in this process and report the largest "
                         "difference", acts="clips")
    timeout: float | None = flag(None, "seconds the ranks may run (120; windows: 300)",
                                 acts="clips")
    batch: int = flag(1, "clips sampled together (the random model)", cli=False)
    weight_seed: int = flag(0, "the random DiT's weights", cli=False)
    model: dict | None = flag(None, "the random DiT's DiTConfig fields", cli=False)
    measure_memory: bool = flag(True, "track each rank's peak (it slows every op)", cli=False)
    path: str | None = _derived()
    cfg: DiTConfig = _derived()
    shape: tuple = _derived()
    cond: object = _derived()

    def __post_init__(self):
        # each method flag belongs to one kind of attention: the other's is a silent no-op
        require(not (self.attention == "factored" and self.full_method is not None),
                "`full_method` chooses how full 3D attention runs: it needs `attention` full "
                "(factored attention takes `temporal_method`)")
        require(not (self.attention == "full" and self.temporal_method is not None),
                "`temporal_method` chooses how temporal attention runs: it needs `attention` "
                "factored (full attention takes `full_method`)")
        path, trained_cfg = weights_config(self.weights)
        defaults = TRAINED_DEFAULTS if path is not None else RANDOM_DEFAULTS
        unset = {"temporal_method": "all_to_all", "full_method": "ring", "timeout": 120.0,
                 **{k: defaults[k] for k in ("frames", "height", "width", "steps", "cfg_scale")}}
        set_derived(self, path=path, **{k: v for k, v in unset.items() if getattr(self, k) is None})
        if self.layout is not None:
            set_derived(self, layout=Layout.for_ranks(self.layout, self.nproc))
        if self.nproc is None:
            set_derived(self, nproc=2 if self.layout is None else self.layout.world)
        check_common(self)
        positive_int("frames", self.frames)
        set_derived(self, cfg_scale=guidance_scale("cfg_scale", self.cfg_scale))
        positive_float("timeout", self.timeout, high=3600)
        cp = self.nproc if self.layout is None else self.layout.cp
        require(cp <= self.frames, f"{'`nproc`' if self.layout is None else 'ring x ulysses'} "
                f"{cp} is more than the {self.frames} latent frames to split: use "
                f"{self.frames} or fewer, or more `frames`")
        if path is not None:
            self._trained(trained_cfg, defaults)
        else:
            self._random()
        _check_split(self.cfg, self.nproc, self.layout, self.full_method)
        check_frame_size(self.cfg, self.height, self.width)
        set_derived(self, shape=(positive_int("batch", self.batch), self.cfg.in_channels,
                                 self.frames, self.height, self.width))
        require(positive_int("steps", self.steps) <= 1000, f"steps {self.steps}: use at most "
                "1000")

    def _trained(self, cfg: DiTConfig, defaults: dict) -> None:
        """The trained weights' config, prompt and condition: their size is fixed, --prompt
        picks what they draw."""
        from cpcourse.tinydit.moving_shapes import PROMPTS, parse_prompt

        require(self.label is None, "label conditions the random model: the trained model "
                f"takes `prompt` ({', '.join(PROMPTS)})")
        require(self.model is None and self.batch == 1, "the trained model's size is fixed by "
                "its weights and it draws one clip per run")
        require(self.attention in (None, cfg.attention), f"these weights were trained with "
                f"attention={cfg.attention}: leave `attention` out (or use weights=random)")
        prompt = self.prompt or PROMPTS[1]
        require(self.frames <= 4 * defaults["frames"], f"frames {self.frames}: the model was "
                f"trained on {defaults['frames']} frames; use at most {4 * defaults['frames']}")
        set_derived(self, cfg=cfg, prompt=prompt, cond=parse_prompt(prompt))

    def _random(self) -> None:
        """The seeded random DiT's config and label: `model` and `attention` choose its size."""
        require(self.prompt is None, "prompt needs trained weights: drop weights=random, or "
                "condition the random model with `label`")
        cfg = DiTConfig(**{**(self.model or {}), "attention": self.attention or "factored"})
        label = 3 if self.label is None else self.label
        require(0 <= label < cfg.num_classes, f"label must be in [0, {cfg.num_classes})")
        set_derived(self, cfg=cfg, label=label, cond=label)

    @property
    def trained(self) -> bool:
        return self.path is not None

    @property
    def output_shape(self) -> tuple[int, ...]:
        """What the run returns: the clip [T, 3, H, W] (trained weights), else the latents."""
        b, c, t, h, w = self.shape
        return (t, c, h, w) if self.trained else self.shape


def rank(req: GenerateRequest) -> dict:
    """On each rank: its frames of the sample `[B, C, T/P, Hl, Wl]`, its peak memory, its time
    per step (`generate_rank`; under a layout `generate_mesh_rank`, with bytes per mesh dim)."""
    return generate_rank(req) if req.layout is None else generate_mesh_rank(req)


def run(req: GenerateRequest, stream=False) -> dict:
    """Sample `req` on `req.nproc` ranks. Returns {"latents": [B, C, T, Hl, Wl], "clip":
    [T, 3, H, W] in [0, 1] (trained weights only, else None), "report": {...}}; with
    `req.compare` the report holds the largest difference from one process's sample."""
    from cpcourse.launch import launch

    results = launch(rank, req.nproc, timeout=req.timeout, args=(req,), stream=stream)
    latents, clip, report = build_report(req, results)
    if req.compare:
        report.update(compare_with_one_process(req, latents, clip))
    return {"latents": latents, "clip": clip, "report": report}


def run_generate(nproc: int | None = None, seed: int = 0, *, stream=False, **fields) -> dict:
    """`run(GenerateRequest(nproc=nproc, seed=seed, **fields))`: the notebooks' one line.

    `layout`: None (every rank a CP rank, `temporal_method` / `full_method`), or a
    `cpcourse.support.layout.Layout` (or its text, "cfg=2,ulysses=2") of nproc ranks: cfg x ring x
    ulysses x tp, the frames split over ring x ulysses, attention by USP. `weights`: "shipped",
    a file from `cpcourse train`, or "random" (then `label`, `attention`, `model` and
    `weight_seed` choose the random DiT)."""
    return run(GenerateRequest(nproc=nproc, seed=seed, **fields), stream=stream)


def check_request(nproc: int | None = None, seed: int = 0, **fields) -> GenerateRequest:
    """`GenerateRequest(nproc=nproc, seed=seed, **fields)`: checked, or an InputError naming
    the parameter."""
    return GenerateRequest(nproc=nproc, seed=seed, **fields)


def check_frame_size(cfg: DiTConfig, height, width) -> None:
    """A frame size the tiny DiT takes: whole patches, at most 64 patches a side."""
    for name, val in (("height", height), ("width", width)):
        require(positive_int(name, val) % cfg.patch == 0,
                f"{name} {val} must be a multiple of the patch size {cfg.patch}")
        require(val <= 64 * cfg.patch, f"{name} {val} is too large for this tiny model: "
                f"use at most {64 * cfg.patch}")


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

    single = single_process_sample(request)
    mine = latents if not request.trained else clip
    other = single if not request.trained else to_clip(single)
    used = request.full_method if request.cfg.attention == "full" else request.temporal_method
    method = "usp" if request.layout is not None else used
    return verdict(float((mine - other).abs().max()), float(other.abs().max()), method,
                   request.dtype, request.cfg_scale)
