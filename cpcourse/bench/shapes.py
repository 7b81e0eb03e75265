"""`cpcourse bench shapes`: does the trained tiny model draw what each prompt asks for?

    cpcourse bench shapes --seeds 8 --json
    cpcourse bench shapes --causal --json     # the chunk-causal model, streamed

Every prompt is generated at seeds 0 .. N-1 in one process (CP gives the same clips: `cpcourse
generate --compare` shows it) and each clip goes through `cpcourse.tinydit.moving_shapes.track`.
Per prompt: the fraction of clips whose motion has the prompt's direction, the fraction drawing its
shape, and the fraction of frames with exactly one object; then the same over every clip, and the
seconds per clip. The training data itself is tracked too, as the ceiling a model can reach.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from cpcourse.support.errors import (
    ArgumentParser,
    guidance_scale,
    positive_int,
    require,
)
from cpcourse.tinydit.training import SAMPLE_STEPS


def data_rates(n: int = 256, seed: int = 0) -> dict:
    """The tracker on `n` training clips: how often it reads the true label off real data."""
    from cpcourse.tinydit.moving_shapes import matches, prompt_name, random_clips, track
    from cpcourse.tinydit.training import rates

    clips, s, d = random_clips(n, torch.Generator().manual_seed(seed))
    return rates([matches(prompt_name(int(a), int(b)), track(c))
                   for c, a, b in zip(clips, s, d, strict=True)])


def _progress_line(done: int, total: int, prompt: str, rates: dict, seconds: float) -> None:
    """One line on stderr per prompt (stdout stays the report, one JSON object with --json)."""
    print(f"  [{done}/{total}] {prompt:13s} direction {100 * rates['direction']:5.1f}%  shape "
          f"{100 * rates['shape']:5.1f}%  ({seconds:.0f} s)", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    from cpcourse.tinydit.causal import shipped_causal_path
    from cpcourse.tinydit.model import require_kind
    from cpcourse.tinydit.streaming import causal_chunk, evaluate_causal
    from cpcourse.tinydit.training import check_eval_seeds, evaluate, load_weights, shipped_path

    p = ArgumentParser(prog="cpcourse bench shapes", description=__doc__.split("\n")[0])
    p.add_argument("--weights", default=None,
                   help="a file from `cpcourse train` (default: the shipped weights)")
    p.add_argument("--seeds", type=int, default=8, help="seeds per prompt (default 8)")
    p.add_argument("--steps", type=int, default=SAMPLE_STEPS)
    p.add_argument("--cfg-scale", type=float, default=4.0)
    p.add_argument("--causal", action="store_true",
                   help="the chunk-causal model, streamed chunk by chunk with a KV cache "
                        "(default weights: the shipped causal ones)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    seeds = check_eval_seeds("--seeds", args.seeds)
    steps = positive_int("--steps", args.steps)
    require(steps <= 1000, f"--steps {steps}: use at most 1000")
    cfg_scale = guidance_scale("--cfg-scale", args.cfg_scale)
    path = args.weights or (shipped_causal_path() if args.causal else shipped_path())
    name = os.path.basename(path) if args.weights is None else path
    from cpcourse.tinydit.moving_shapes import PROMPTS

    chunk = causal_chunk(path) if args.causal else None
    model, meta = load_weights(path)  # a missing or foreign file is refused here, before a line
    if not args.causal:
        require_kind(path, meta, causal=False)  # a causal file sampled whole would mislead
    runs = f"{seeds} seed{'s' * (seeds != 1)}, {steps} step{'s' * (steps != 1)}"
    print(f"bench shapes: {len(PROMPTS)} prompts x {runs}, {name} (a line per prompt; minutes "
          "on a laptop)", file=sys.stderr, flush=True)
    if args.causal:
        res = evaluate_causal(model, seeds=range(seeds), steps=steps, cfg_scale=cfg_scale,
                              chunk=chunk, progress=_progress_line)
    else:
        res = evaluate(model, seeds=range(seeds), steps=steps, cfg_scale=cfg_scale,
                       progress=_progress_line)
    report = {"weights": path, "causal": args.causal, "seeds": seeds, "steps": steps,
              "cfg_scale": cfg_scale,
              "trained": meta.get("run", {}), "per_prompt": {k: v for k, v in res.items()
                                                            if isinstance(v, dict) and k != "all"},
              "all": res["all"], "seconds_per_clip": res["seconds_per_clip"],
              "training_data": data_rates()}
    if args.json:
        print(json.dumps(report, allow_nan=False))
        return 0
    print(f"{name}: {seeds} seed{'s' * (seeds != 1)} per prompt, {steps} "
          f"step{'s' * (steps != 1)}, guidance {cfg_scale:g}")
    for prompt, r in [*report["per_prompt"].items(), ("all", report["all"]),
                      ("training data", report["training_data"])]:
        print(f"  {prompt:13s} direction {100 * r['direction']:5.1f}%  shape "
              f"{100 * r['shape']:5.1f}%  one object in {100 * r['present']:5.1f}% of frames")
    print(f"  {report['seconds_per_clip']:.3f} s per clip")
    return 0
