"""`cpcourse generate`: a clip from the trained tiny video model, on P processes under CP.

    cpcourse generate --prompt circle-right --seed 0 --nproc 2 --gif /tmp/circle.gif --compare

The sampler is Euler steps of a rectified flow (x_1 = noise, x_0 = sample) with classifier-free
guidance, the conditional and unconditional passes as one batch of 2B (`cpcourse.tinydit.sampling`).
Noise is drawn for the whole video from the seed on every rank and each rank keeps its frames, so
the clip does not depend on P; `--compare` also samples in this process and reports the largest
difference. Every rank measures its peak tensor memory and its time per step.

Weights: `--weights shipped` (the default) is the model `cpcourse train` trained on moving
shapes (`cpcourse.tinydit.moving_shapes`): `--prompt` picks what it draws (`--list-prompts`),
`--save` writes the clip `[T, 3, H, W]` in [0, 1] and `--gif` an animated GIF; the report says what
the tracker sees in the clip. `--weights FILE` takes a file `cpcourse train` wrote. `--weights
random` is the seeded random DiT of the exactness tests: `--label` conditions it, and `--save`
writes its latents `[B, C, T, Hl, Wl]`. A `.json` report is written beside every saved file.
"""

from __future__ import annotations

import argparse
import json

import torch

from cpcourse.support.errors import (
    InputError,
    finite_float,
    positive_float,
    positive_int,
    require,
)
from cpcourse.tinydit.model import ATTENTIONS, DiTConfig
from cpcourse.tinydit.sampling import DTYPES
from cpcourse.tinydit.training import (
    RANDOM_DEFAULTS,
    SAMPLE_STEPS,
    TRAINED_DEFAULTS,
    weights_config,
)
from cpcourse.video import FULL_METHODS, TEMPORAL_METHODS


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
    from cpcourse.launch import launch
    from cpcourse.tinydit.moving_shapes import PROMPTS, matches, parse_prompt, track
    from cpcourse.tinydit.training import to_clip

    path, trained_cfg = weights_config(weights)
    trained = path is not None
    defaults = TRAINED_DEFAULTS if trained else RANDOM_DEFAULTS
    frames = defaults["frames"] if frames is None else frames
    height = defaults["height"] if height is None else height
    width = defaults["width"] if width is None else width
    steps = defaults["steps"] if steps is None else steps
    cfg_scale = defaults["cfg_scale"] if cfg_scale is None else cfg_scale
    nproc, frames = positive_int("--nproc", nproc), positive_int("--frames", frames)
    # Guidance past +-100 only blows the sample up (real models use 1 to 15).
    cfg_scale = finite_float("--cfg-scale", cfg_scale)
    require(abs(cfg_scale) <= 100, f"--cfg-scale must be between -100 and 100, got {cfg_scale:g}")
    require(isinstance(seed, int) and 0 <= seed < 2**63,
            f"--seed must be a whole number in [0, 2**63), got {seed!r}")
    require(temporal_method in TEMPORAL_METHODS, f"--temporal must be one of {TEMPORAL_METHODS}")
    require(full_method in FULL_METHODS, f"--full must be one of {FULL_METHODS}")
    require(dtype in DTYPES, f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if layout is not None:
        layout = _layout(layout, nproc)
    cp = nproc if layout is None else layout.cp
    require(cp <= frames, f"{'--nproc' if layout is None else 'ring x ulysses'} {cp} is more "
            f"than the {frames} latent frames to split: use {frames} or fewer, or more --frames")
    if trained:
        cfg = trained_cfg
        require(label is None, "--label conditions the random model: the trained model takes "
                f"--prompt ({', '.join(PROMPTS)})")
        require(model is None and batch == 1, "the trained model's size is fixed by its weights "
                "and it draws one clip per run")
        require(attention in (None, cfg.attention), f"these weights were trained with "
                f"--attention {cfg.attention}: leave --attention out (or use --weights random)")
        prompt = prompt or PROMPTS[1]
        cond = parse_prompt(prompt)
        require(frames <= 4 * defaults["frames"], f"--frames {frames}: the model was trained on "
                f"{defaults['frames']} frames; use at most {4 * defaults['frames']}")
    else:
        require(prompt is None, "--prompt needs trained weights: drop --weights random, or "
                "condition the random model with --label")
        cfg = DiTConfig(**{**(model or {}), "attention": attention or "factored"})
        label = 3 if label is None else label
        require(0 <= label < cfg.num_classes, f"--label must be in [0, {cfg.num_classes})")
        cond = label
    if layout is not None:
        from cpcourse.support.layout import check_layout

        check_layout(layout, nproc, cfg.heads)
    elif cfg.attention == "full" and full_method == "ulysses":  # found before start-up
        works = [p for p in range(1, cfg.heads + 1) if cfg.heads % p == 0]
        require(cfg.heads % nproc == 0,
                f"--full ulysses splits the model's {cfg.heads} heads over the {nproc} ranks: use "
                f"--nproc {', '.join(map(str, works))}, or --full ring (no such limit)")
    for name, val in (("--height", height), ("--width", width)):
        require(positive_int(name, val) % cfg.patch == 0,
                f"{name} {val} must be a multiple of the patch size {cfg.patch}")
        require(val <= 64 * cfg.patch, f"{name} {val} is too large for this tiny model: "
                f"use at most {64 * cfg.patch}")
    spec = {"model": cfg.as_dict(), "weights": path, "dtype": dtype, "weight_seed": weight_seed,
            "seed": seed,
            "shape": [positive_int("--batch", batch), cfg.in_channels, frames, height, width],
            "steps": positive_int("--steps", steps), "cfg_scale": cfg_scale,
            "label": cond, "temporal_method": temporal_method, "full_method": full_method}
    require(steps <= 1000, f"--steps {steps}: use at most 1000")
    if layout is not None:
        spec["layout"] = layout.as_dict()
    target = "generate_rank" if layout is None else "generate_mesh_rank"
    results = launch(f"cpcourse.tinydit.sampling:{target}", nproc, timeout=timeout, args=(spec,),
                     stream=stream)
    from cpcourse.tinydit.sampling import mesh_report

    by_mesh = {} if layout is None else mesh_report(results, layout)
    shards = results if layout is None else by_mesh.pop("shards")
    latents = torch.cat([r["frames"] for r in shards], dim=2)
    steps_s = [max(r["step_seconds"][i] for r in results) for i in range(steps)]
    report = {"nproc": nproc, "seed": seed, "weights": weights if not trained else path,
              "shape": spec["shape"], "dtype": dtype, "attention": cfg.attention,
              "temporal_method": temporal_method, "full_method": full_method, "steps": steps,
              "cfg_scale": float(cfg_scale),
              "frames_per_rank": [r["frames"].shape[2] for r in results],
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "seconds": round(max(sum(r["step_seconds"]) for r in results), 4),
              "seconds_per_step": sorted(steps_s)[len(steps_s) // 2],
              "launch_seconds": round(results.seconds, 3),
              "latent_abs_mean": float(latents.abs().mean()), "model": cfg.as_dict()}
    if layout is None:
        report["predicted_peak_bytes_per_rank"] = [int(r["predicted_peak_bytes"])
                                                   for r in results]
        report["peak_vs_predicted_worst_rel_err"] = max(
            abs(m / p - 1) for m, p in zip(report["peak_bytes_per_rank"],
                                           report["predicted_peak_bytes_per_rank"], strict=True))
    report.update(by_mesh)
    clip = to_clip(latents) if trained else None
    if trained:
        seen = track(clip)
        ok = matches(prompt, seen)
        report.update(prompt=prompt, clip_shape=list(clip.shape), track={
            "direction": seen["direction"], "shape": seen["shape"],
            "velocity_px_per_frame": [round(v, 3) for v in seen["velocity"]],
            "present_fraction": ok["present_fraction"]},
            matches_prompt=bool(ok["direction"] and ok["shape"]))
    if compare:
        from cpcourse.tinydit.sampling import single_process_sample

        single = single_process_sample(spec)
        mine = latents if not trained else clip
        other = single if not trained else to_clip(single)
        report["max_abs_diff_vs_single_process"] = float((mine - other).abs().max())
    return {"latents": latents, "clip": clip, "report": report}


def _layout(layout, nproc: int):
    from cpcourse.support.layout import Layout

    layout = Layout.parse(layout) if isinstance(layout, str) else layout
    require(layout.world == nproc, f"--layout {layout} needs {layout.world} ranks: pass --nproc "
            f"{layout.world} (or leave --nproc out)")
    return layout


def build_parser() -> argparse.ArgumentParser:
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="cpcourse generate", description=__doc__.split("\n")[0])
    p.add_argument("--prompt", default=None,
                   help="what the trained model draws, e.g. circle-right (--list-prompts)")
    p.add_argument("--list-prompts", action="store_true", help="print the prompt ids and stop")
    p.add_argument("--weights", default="shipped",
                   help="shipped (default), a file from `cpcourse train`, or random")
    p.add_argument("--nproc", type=int, default=None,
                   help="processes (CP degree), default 2 (with --layout: its world size)")
    p.add_argument("--layout", default=None,
                   help="a mesh, e.g. cfg=2,ulysses=2,ring=1,tp=1 (degrees multiply to --nproc)")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--save", default=None,
                   help="write the clip [T, 3, H, W] (random weights: the latents) here")
    p.add_argument("--gif", default=None, help="write the clip as an animated GIF here")
    p.add_argument("--frames", type=int, default=None, help="frames T (default 8)")
    p.add_argument("--height", type=int, default=None, help="height (default 32; random: 16)")
    p.add_argument("--width", type=int, default=None, help="width (default 32; random: 16)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"Euler steps (default {SAMPLE_STEPS}; random: 4)")
    p.add_argument("--cfg-scale", "--cfg", dest="cfg", type=float, default=None,
                   help="guidance scale (default 4)")
    p.add_argument("--label", type=int, default=None,
                   help="class id for --weights random (default 3)")
    p.add_argument("--attention", choices=ATTENTIONS, default=None,
                   help="random weights only: factored (default) or full")
    p.add_argument("--temporal", choices=TEMPORAL_METHODS, default=None,
                   help="temporal attention under CP, with --attention factored (all_to_all)")
    p.add_argument("--full", choices=FULL_METHODS, default=None,
                   help="3D attention under CP, for full attention (ring)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--compare", action="store_true",
                   help="also sample in this process and report the largest difference")
    p.add_argument("--compare-to", default=None,
                   help="a file an earlier --save wrote: report the largest difference")
    p.add_argument("--window", type=int, default=None,
                   help="long video: denoise overlapping windows of W frames and blend them")
    p.add_argument("--stride", type=int, default=None,
                   help="frames between window starts (default W / 2)")
    p.add_argument("--blend", choices=("pyramid", "flat"), default="pyramid")
    p.add_argument("--noise", choices=("independent", "freenoise"), default="independent")
    p.add_argument("--parallel", choices=("windows", "cp"), default="windows",
                   help="whole windows per rank (windows), or each window under CP (cp)")
    p.add_argument("--timeout", type=float, default=None, help="seconds (120; windows: 300)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def main(argv: list[str]) -> int:
    from cpcourse.cli.clip_files import check_out, load_compare, write_outputs
    from cpcourse.cli.generate_long import main_long
    from cpcourse.tinydit.moving_shapes import PROMPTS

    args = build_parser().parse_args(argv)
    if args.list_prompts:
        print(json.dumps({"prompts": list(PROMPTS)}) if args.json else "\n".join(PROMPTS))
        return 0
    if args.window is not None or args.stride is not None:
        require(args.layout is None, "--layout is for one clip: windows take --parallel "
                "windows|cp over --nproc ranks")
        args.nproc = 2 if args.nproc is None else args.nproc
        return main_long(args)
    for flag, val, default in (("--blend", args.blend, "pyramid"),
                               ("--noise", args.noise, "independent"),
                               ("--parallel", args.parallel, "windows")):
        require(val == default, f"{flag} chooses how windows are made: it needs --window")
    args.timeout = positive_float("--timeout", 120.0 if args.timeout is None else args.timeout)
    if args.attention == "factored" and args.full is not None:
        raise InputError("--full chooses how full 3D attention runs: it needs --attention full "
                         "(factored attention takes --temporal)")
    if args.attention == "full" and args.temporal is not None:
        raise InputError("--temporal chooses how temporal attention runs: it needs --attention "
                         "factored (full attention takes --full)")
    if args.gif:
        require(args.weights != "random", "--gif draws a clip of the trained model: the random "
                "model's latents are not pixels (drop --weights random)")
        check_out("--gif", args.gif)
    other = load_compare(args.compare_to) if args.compare_to else None
    if args.save:
        check_out("--save", args.save)
    layout = None
    if args.layout is not None:
        from cpcourse.support.layout import Layout

        for flag, val in (("--temporal", args.temporal), ("--full", args.full)):
            require(val is None, f"{flag} is for plain CP: under --layout attention runs USP "
                    "over the ring and ulysses dims")
        layout = Layout.parse(args.layout)
        args.nproc = layout.world if args.nproc is None else args.nproc
    args.nproc = 2 if args.nproc is None else args.nproc
    res = run_generate(args.nproc, args.seed, prompt=args.prompt, weights=args.weights,
                       frames=args.frames, height=args.height, width=args.width,
                       steps=args.steps, cfg_scale=args.cfg, label=args.label,
                       attention=args.attention, temporal_method=args.temporal or "all_to_all",
                       full_method=args.full or "ring", dtype=args.dtype, compare=args.compare,
                       timeout=args.timeout, stream=False if args.json else True,
                       layout=layout)
    report = res["report"]
    out = res["clip"] if res["clip"] is not None else res["latents"]
    if other is not None:
        require(other.shape == out.shape, f"--compare-to {args.compare_to} holds a tensor of "
                f"shape {tuple(other.shape)}, this run made {tuple(out.shape)}")
        report["max_abs_diff_vs_compare"] = float((other - out).abs().max())
    write_outputs(args, res, out)
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    mb = lambda x: f"{x / 2**20:.2f} MiB"  # noqa: E731
    what = f"'{report['prompt']}'" if "prompt" in report else f"random-weight {report['shape']}"
    print(f"sampled {what} on {args.nproc} process(es), frames per rank "
          f"{report['frames_per_rank']}, {report['seconds']:.2f} s sampling "
          f"({report['seconds_per_step'] * 1e3:.1f} ms per step)")
    if "track" in report:
        tr = report["track"]
        print(f"  the tracker sees: a {tr['shape']} moving {tr['direction']}, one object in "
              f"{100 * tr['present_fraction']:.0f}% of frames "
              f"({'matches' if report['matches_prompt'] else 'does NOT match'} the prompt)")
    if "layout" in report:
        print(f"  layout {layout}: replicas identical {report['replicas_identical']}, bytes per "
              f"step as predicted {report['bytes_match_prediction']}")
        for r, (m, sent) in enumerate(zip(report["peak_bytes_per_rank"],
                                          report["bytes_per_step_by_dim"], strict=True)):
            dims = ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sent.items() if v)
            print(f"  rank {r}: peak tensor memory {mb(m)}; sent per step: {dims or 'nothing'}")
    else:
        for r, (m, p) in enumerate(zip(report["peak_bytes_per_rank"],
                                       report["predicted_peak_bytes_per_rank"], strict=True)):
            print(f"  rank {r}: peak tensor memory {mb(m)} measured, {mb(p)} predicted")
    if "max_abs_diff_vs_single_process" in report:
        print(f"  max |difference| vs one process: {report['max_abs_diff_vs_single_process']:.3g}")
    if "max_abs_diff_vs_compare" in report:
        print(f"  max |difference| vs {args.compare_to}: {report['max_abs_diff_vs_compare']:.3g}")
    for key in ("saved", "gif"):
        if key in report:
            print(f"  wrote {report[key]}" + (" (and its .json)" if key == "saved" else ""))
    return 0
