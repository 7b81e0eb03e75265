"""`cpcourse generate`: sample the tiny video DiT on P processes and save the latents.

    cpcourse generate --nproc 2 --seed 0 --save /tmp/sample.pt --json

The sampler is a few Euler steps of a rectified flow (x_1 = noise, x_0 = sample,
x <- x + (t_next - t) * v) with classifier-free guidance: the conditional and unconditional
passes run as one batch of 2B, v = v_uncond + cfg * (v_cond - v_uncond). Noise is drawn for the
whole video from the seed on every rank and each rank keeps its frames, so the sample does not
depend on P. Every rank measures its peak tensor memory (`cpcourse.memory`) and its time per
step; the report sets the peak beside `cpcourse.dit_costs.predicted_peak_bytes`.
The saved file is the latent tensor `[B, C, T, Hl, Wl]` (`torch.load(path)`); a `.json` report
is written beside it.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from cpcourse.dit import ATTENTIONS, DiTConfig
from cpcourse.sampling import DTYPES
from cpcourse.support.errors import (
    InputError,
    finite_float,
    positive_float,
    positive_int,
    require,
)
from cpcourse.video import FULL_METHODS, TEMPORAL_METHODS


def run_generate(nproc: int, seed: int = 0, *, frames: int = 8, height: int = 16,
                 width: int = 16, batch: int = 1, steps: int = 4, cfg_scale: float = 4.0,
                 label: int = 3, attention: str = "factored", temporal_method: str = "all_to_all",
                 full_method: str = "ring", dtype: str = "fp32", weight_seed: int = 0,
                 model: dict | None = None, timeout: float = 120.0, stream=False) -> dict:
    """Sample on `nproc` processes; returns {"latents": [B, C, T, Hl, Wl], "report": {...}}."""
    from cpcourse.launch import launch

    nproc, frames = positive_int("--nproc", nproc), positive_int("--frames", frames)
    # Guidance past +-100 only blows the latents up (real models use 1 to 15).
    cfg_scale = finite_float("--cfg", cfg_scale)
    require(abs(cfg_scale) <= 100, f"--cfg must be between -100 and 100, got {cfg_scale:g}")
    require(isinstance(seed, int) and 0 <= seed < 2**63,
            f"--seed must be a whole number in [0, 2**63), got {seed!r}")
    require(attention in ATTENTIONS, f"--attention must be one of {ATTENTIONS}")
    require(temporal_method in TEMPORAL_METHODS, f"--temporal must be one of {TEMPORAL_METHODS}")
    require(full_method in FULL_METHODS, f"--full must be one of {FULL_METHODS}")
    require(dtype in DTYPES, f"--dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    require(nproc <= frames, f"--nproc {nproc} is more than the {frames} latent frames to split: "
            f"use --nproc {frames} or fewer, or more --frames")
    cfg = DiTConfig(**{**(model or {}), "attention": attention})
    if attention == "full" and full_method == "ulysses":  # found before start-up, not in a rank
        works = [p for p in range(1, cfg.heads + 1) if cfg.heads % p == 0]
        require(cfg.heads % nproc == 0,
                f"--full ulysses splits the model's {cfg.heads} heads over the {nproc} ranks: use "
                f"--nproc {', '.join(map(str, works))}, or --full ring (no such limit)")
    require(0 <= label < cfg.num_classes, f"--label must be in [0, {cfg.num_classes})")
    for name, val in (("--height", height), ("--width", width)):
        require(positive_int(name, val) % cfg.patch == 0,
                f"{name} {val} must be a multiple of the patch size {cfg.patch}")
    spec = {"model": cfg.as_dict(), "dtype": dtype, "weight_seed": weight_seed, "seed": seed,
            "shape": [positive_int("--batch", batch), cfg.in_channels, frames, height, width],
            "steps": positive_int("--steps", steps), "cfg_scale": cfg_scale,
            "label": label, "temporal_method": temporal_method, "full_method": full_method}
    results = launch("cpcourse.sampling:generate_rank", nproc, timeout=timeout, args=(spec,),
                     stream=stream)
    latents = torch.cat([r["frames"] for r in results], dim=2)
    steps_s = [max(r["step_seconds"][i] for r in results) for i in range(steps)]
    report = {"nproc": nproc, "seed": seed, "shape": spec["shape"], "dtype": dtype,
              "attention": attention, "temporal_method": temporal_method,
              "full_method": full_method, "steps": steps, "cfg_scale": float(cfg_scale),
              "frames_per_rank": [r["frames"].shape[2] for r in results],
              "peak_bytes_per_rank": [int(r["peak_bytes"]) for r in results],
              "predicted_peak_bytes_per_rank": [int(r["predicted_peak_bytes"]) for r in results],
              "seconds_per_step": sorted(steps_s)[len(steps_s) // 2],
              "launch_seconds": round(results.seconds, 3),
              "latent_abs_mean": float(latents.abs().mean()), "model": cfg.as_dict()}
    worst = max(abs(m / p - 1) for m, p in zip(report["peak_bytes_per_rank"],
                                               report["predicted_peak_bytes_per_rank"],
                                               strict=True))
    report["peak_vs_predicted_worst_rel_err"] = worst
    return {"latents": latents, "report": report}


def build_parser() -> argparse.ArgumentParser:
    from cpcourse.support.errors import ArgumentParser

    p = ArgumentParser(prog="cpcourse generate", description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="processes (CP degree), default 2")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--save", default=None, help="write the latents here (torch.load reads it)")
    p.add_argument("--frames", type=int, default=8, help="latent frames T")
    p.add_argument("--height", type=int, default=16, help="latent height")
    p.add_argument("--width", type=int, default=16, help="latent width")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--cfg", type=float, default=4.0, help="guidance scale")
    p.add_argument("--label", type=int, default=3, help="class id to condition on")
    p.add_argument("--attention", choices=ATTENTIONS, default="factored")
    p.add_argument("--temporal", choices=TEMPORAL_METHODS, default=None,
                   help="temporal attention under CP, with --attention factored (all_to_all)")
    p.add_argument("--full", choices=FULL_METHODS, default=None,
                   help="3D attention under CP, with --attention full (ring)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--compare", default=None, help="a saved sample: report the max difference")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _load_compare(path: str) -> torch.Tensor:
    """The latents saved by an earlier `generate --save`, read before any process starts."""
    try:
        other = torch.load(path, weights_only=True)
    except Exception as exc:  # a text, empty, JSON or foreign pickle file: all say the same
        raise InputError(f"--compare {path}: not a file saved by `cpcourse generate --save` "
                         f"({type(exc).__name__})") from None
    require(isinstance(other, torch.Tensor), f"--compare {path} holds no latents tensor")
    return other


def _check_save(path: str) -> None:
    target = os.path.abspath(path)
    folder = os.path.dirname(target)
    require(not os.path.isdir(target), f"--save {path} is a directory: give a file name in it")
    require(os.path.isdir(folder), f"--save {path}: the folder {folder} does not exist")
    require(os.access(folder, os.W_OK), f"--save {path}: the folder {folder} is not writable")


def _save(latents: torch.Tensor, report: dict, path: str) -> None:
    """Write the latents and their .json report, each to a temporary file renamed into place, so
    a failure leaves neither a half-written file nor a .pt without its report."""
    tmp_pt, tmp_json = f"{path}.tmp-{os.getpid()}", f"{path}.json.tmp-{os.getpid()}"
    try:
        torch.save(latents, tmp_pt)
        with open(tmp_json, "w") as fh:
            json.dump(report, fh, indent=1, allow_nan=False)
        os.replace(tmp_json, path + ".json")
        os.replace(tmp_pt, path)
    except OSError as exc:
        raise InputError(f"--save {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        for tmp in (tmp_pt, tmp_json):
            if os.path.exists(tmp):
                os.remove(tmp)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    positive_float("--timeout", args.timeout)
    if args.attention == "factored" and args.full is not None:
        raise InputError("--full chooses how full 3D attention runs: it needs --attention full "
                         "(factored attention takes --temporal)")
    if args.attention == "full" and args.temporal is not None:
        raise InputError("--temporal chooses how temporal attention runs: it needs --attention "
                         "factored (full attention takes --full)")
    other = _load_compare(args.compare) if args.compare else None
    if args.save:
        _check_save(args.save)
    res = run_generate(args.nproc, args.seed, frames=args.frames, height=args.height,
                       width=args.width, steps=args.steps, cfg_scale=args.cfg, label=args.label,
                       attention=args.attention,
                       temporal_method=args.temporal or "all_to_all",
                       full_method=args.full or "ring", dtype=args.dtype, timeout=args.timeout,
                       stream=False if args.json else True)
    report, latents = res["report"], res["latents"]
    if other is not None:
        require(other.shape == latents.shape, f"--compare {args.compare} holds latents of shape "
                f"{tuple(other.shape)}, this run made {tuple(latents.shape)}")
        report["max_abs_diff_vs_compare"] = float((other - latents).abs().max())
    if args.save:
        _save(latents, report, args.save)
        report["saved"] = args.save
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    mb = lambda x: f"{x / 2**20:.2f} MiB"  # noqa: E731
    print(f"sampled {report['shape']} on {args.nproc} process(es), frames per rank "
          f"{report['frames_per_rank']}, {report['seconds_per_step'] * 1e3:.1f} ms per step")
    for r, (m, p) in enumerate(zip(report["peak_bytes_per_rank"],
                                   report["predicted_peak_bytes_per_rank"], strict=True)):
        print(f"  rank {r}: peak tensor memory {mb(m)} measured, {mb(p)} predicted")
    if "max_abs_diff_vs_compare" in report:
        print(f"  max |difference| vs {args.compare}: {report['max_abs_diff_vs_compare']:.3g}")
    if args.save:
        print(f"  saved {args.save} (and {args.save}.json)")
    return 0
