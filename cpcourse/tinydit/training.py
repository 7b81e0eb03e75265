"""Training the tiny video DiT on moving shapes, and loading the weights the course ships.

    cpcourse train --out /tmp/shapes.safetensors --minutes 2

Rectified flow: a clean clip x0 (pixels scaled to [-1, 1]) and noise n give
x_t = (1 - t) x0 + t n. Four choices make a model this small, trained this briefly, draw a
shape that moves the right way (the measurements are in notebook 07):
- **predict the clean clip** (`prediction="sample"`), not the velocity n - x0. With 8 x 8
  patches of a 32 x 32 frame, a velocity target is mostly the noise itself: 192 numbers of noise
  per token that the network must reproduce before it can say anything about the shape. The clean
  clip is smooth and low in information, so the same capacity goes into layout and motion;
- **draw t logit-normal** (t = sigmoid(m + s z), m = 0.8, s = 0.8): most steps train at high
  noise, where where-the-shape-is and which-way-it-moves are decided; at low noise the model
  only sharpens edges, which is easy;
- **two labels** (shape and direction, each with its own embedding) rather than one of eight:
  "right" learnt for circles is the same "right" for squares;
- **an absolute frame embedding** beside the rotary positions (`frame_embed`): rotary gives
  attention the distance between frames, a weak signal for which way a shape moves; without it
  a 26-minute model drew the right axis but the wrong sign in 8 of 64 clips.
Labels are dropped together with probability 0.1 (the "no condition" ids), so one network gives
both passes of classifier-free guidance. The weights kept are an exponential moving average of
the trained ones (EMA), which samples more cleanly than the last step's.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass
from importlib import resources

import torch

from cpcourse.support.errors import positive_int, require
from cpcourse.tinydit.model import (
    CPContext,
    DiTConfig,
    TinyVideoDiT,
    build_model,
    load_weights,
    patchify,
    save_weights,
)
from cpcourse.tinydit.moving_shapes import DIRECTIONS, FRAMES, SHAPES, SIZE, random_clips

SHIPPED = "shapes_dit.safetensors"   # in cpcourse/data
# Euler steps when sampling the shapes model: x-prediction makes each step land near the clean
# clip, and 10, 12 or 25 steps track the same (notebook 07); 12 keeps CP demos quick.
SAMPLE_STEPS = 12
# What `cpcourse generate` samples when not told: the trained model's own size, or the random
# DiT of the exactness tests.
TRAINED_DEFAULTS = {"frames": FRAMES, "height": SIZE, "width": SIZE, "steps": SAMPLE_STEPS,
                    "cfg_scale": 4.0}
RANDOM_DEFAULTS = {"frames": 8, "height": 16, "width": 16, "steps": 4, "cfg_scale": 4.0}
# `evaluate` samples all its seeds as one batch: ~100 KB of noise per seed and a forward at
# twice the batch. 256 seeds take minutes on a laptop; 100000 would need tens of GB.
MAX_EVAL_SEEDS = 256


def shapes_config() -> DiTConfig:
    """The shapes model: pixels in (3 channels), 8 x 8 patches, full 3D attention, an absolute
    frame embedding beside the rotary positions."""
    return DiTConfig(in_channels=3, patch=8, hidden=128, heads=4, depth=6, mlp_ratio=4,
                     num_classes=len(SHAPES), num_motions=len(DIRECTIONS), attention="full",
                     prediction="sample", frame_embed=True)


@dataclass(frozen=True)
class TrainConfig:
    batch: int = 32
    lr: float = 1e-3
    warmup: int = 100          # steps of linear warm-up
    weight_decay: float = 0.0
    t_mean: float = 0.8        # logit-normal time: t = sigmoid(t_mean + t_std * z)
    t_std: float = 0.8
    label_drop: float = 0.1
    ema: float = 0.999


def to_model_space(clips: torch.Tensor) -> torch.Tensor:
    """Clips `[B, T, 3, H, W]` in [0, 1] -> the model's latents `[B, 3, T, H, W]` in [-1, 1]."""
    return clips.permute(0, 2, 1, 3, 4) * 2 - 1


def to_clip(latents: torch.Tensor) -> torch.Tensor:
    """A sample `[1, 3, T, H, W]` in model space -> the clip `[T, 3, H, W]` in [0, 1]."""
    return ((latents[0].permute(1, 0, 2, 3) + 1) / 2).clamp(0, 1)


def training_batch(cfg: DiTConfig, clips, shape_ids, direction_ids, gen,
                   tc: TrainConfig = TrainConfig()) -> tuple:
    """One batch's inputs and target, drawn from `gen`: (noisy tokens xt `[B, T, S, 3*p*p]`,
    times t `[B]`, labels y `[B, 2]`, target `[B, T, S, 3*p*p]`, the token grid (h, w))."""
    x0 = patchify(to_model_space(clips), cfg.patch)                # [B, T, S, 3*p*p]
    b = x0.shape[0]
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.sigmoid(tc.t_mean + tc.t_std * torch.randn(b, generator=gen))
    xt = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * noise
    y = torch.stack([shape_ids, direction_ids], dim=1)
    drop = torch.rand(b, generator=gen) < tc.label_drop
    y[drop] = torch.tensor(cfg.null_label)
    target = x0 if cfg.prediction == "sample" else noise - x0
    return xt, t, y, target, (clips.shape[-2] // cfg.patch, clips.shape[-1] // cfg.patch)


def training_loss(model: TinyVideoDiT, clips, shape_ids, direction_ids, gen,
                  tc: TrainConfig = TrainConfig()) -> torch.Tensor:
    """One batch's loss: mean squared error of the prediction (x0 or velocity) on noisy tokens."""
    xt, t, y, target, grid = training_batch(model.cfg, clips, shape_ids, direction_ids, gen, tc)
    return torch.nn.functional.mse_loss(model(xt, t, y, CPContext(grid=grid)), target)


def _lr(step: int, frac: float, tc: TrainConfig) -> float:
    # linear warm-up, then cosine decay over the run's fraction done (steps or minutes)
    return tc.lr * min(1.0, (step + 1) / tc.warmup) * 0.5 * (1 + math.cos(math.pi * min(frac, 1)))


def _bar(step: int, frac: float, loss: float, elapsed: float, width: int = 24) -> str:
    filled = int(width * min(frac, 1.0))
    return (f"\r[{'#' * filled}{'.' * (width - filled)}] {100 * min(frac, 1):5.1f}%  "
            f"step {step}  loss {loss:.4f}  {elapsed:6.0f} s")


def train(out: str | None = None, *, minutes: float | None = None, steps: int | None = None,
          seed: int = 0, cfg: DiTConfig | None = None, tc: TrainConfig = TrainConfig(),
          progress=None, threads: int | None = None, init: TinyVideoDiT | None = None,
          loss_fn=training_loss, meta: dict | None = None) -> dict:
    """Train until `steps` steps or `minutes` minutes (whichever is given; both: the first),
    and at least one step however small `minutes` is; save the EMA weights to `out`
    (safetensors, with the configs, the run and `meta` in its metadata).

    `init`: fine-tune these weights (and their config) instead of the DiT init; `loss_fn`: the
    batch loss, `training_loss`'s signature (`cpcourse.tinydit.causal` passes its own).

    `progress`: a text stream for the progress bar (None: stderr when it is a terminal).
    Returns {"model", "losses" (per step), "steps", "seconds", "path"}.
    """
    require(minutes is not None or steps is not None, "give `minutes` or `steps`")
    require(minutes is None or 0 < minutes <= 24 * 60, "minutes must be in (0, 1440]")
    require(steps is None or steps > 0, "steps must be positive")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = (init.float() if init is not None else _dit_init(cfg or shapes_config(), seed)).train()
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay,
                            betas=(0.9, 0.99))
    stream = progress if progress is not None else (sys.stderr if sys.stderr.isatty() else None)
    losses, start, step, last_print = [], time.perf_counter(), 0, 0.0
    while True:
        elapsed = time.perf_counter() - start
        frac = max(step / steps if steps else 0.0, elapsed / (60 * minutes) if minutes else 0.0)
        if frac >= 1 and step:  # at least one step: the losses and the report need one
            break
        for group in opt.param_groups:
            group["lr"] = _lr(step, frac, tc)
        clips, s_ids, d_ids = random_clips(tc.batch, gen)
        loss = loss_fn(model, clips, s_ids, d_ids, gen, tc)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        decay = min(tc.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for k, v in model.state_dict().items():
                ema[k].lerp_(v, 1 - decay)
        losses.append(loss.item())
        step += 1
        if stream is not None and (elapsed - last_print > 2 or step == 1):
            recent = losses[-50:]
            stream.write(_bar(step, frac, sum(recent) / len(recent), elapsed))
            stream.flush()
            last_print = elapsed
    seconds = time.perf_counter() - start
    if stream is not None:
        stream.write(_bar(step, 1.0, sum(losses[-50:]) / len(losses[-50:]), seconds) + "\n")
    model.load_state_dict(ema)
    model.eval()
    run = {"steps": step, "seconds": round(seconds, 1), "seed": seed, "threads":
           torch.get_num_threads(), "final_loss": sum(losses[-100:]) / len(losses[-100:]),
           "torch": torch.__version__, "frames": FRAMES, "size": SIZE}
    if out:
        save_weights(model, out, {"train": asdict(tc), "run": run, **(meta or {})}, name="out")
    return {"model": model, "losses": losses, "steps": step, "seconds": seconds, "path": out,
            "run": run}


def _dit_init(cfg: DiTConfig, seed: int) -> TinyVideoDiT:
    """The usual DiT init: every block starts as the identity (zero gates), the output at zero."""
    model = build_model(cfg, seed)
    with torch.no_grad():
        for blk in model.blocks:
            blk.ada.weight.zero_()
            blk.ada.bias.zero_()
        for p in (model.final_ada.weight, model.final_ada.bias, model.out.weight, model.out.bias):
            p.zero_()
    return model


def shipped_path() -> str:
    return str(resources.files("cpcourse") / "data" / SHIPPED)


def weights_config(weights: str, causal: bool | None = False) -> tuple[str | None,
                                                                        DiTConfig | None]:
    """(file, its model config) for "shipped" or a file's weights, (None, None) for "random".
    The file is read here, before any launch: a missing or foreign one is one clear error, not
    one per rank, and so is one of the other kind (`causal` False: bidirectional weights
    wanted, True: chunk-causal ones, None: either, as a fine-tune's init)."""
    import os

    from cpcourse.tinydit.model import require_kind

    if weights == "random":
        return None, None
    path = shipped_path() if weights == "shipped" else os.path.abspath(weights)
    model, meta = load_weights(path)
    if causal is not None:
        require_kind(weights, meta, causal)
    return path, model.cfg


def load_shapes_model(path: str | None = None, dtype=torch.float32) -> TinyVideoDiT:
    """The trained shapes model (the shipped weights unless `path` is given), in eval mode."""
    model, _ = load_weights(path or shipped_path(), dtype)
    return model


def generate_clip(model: TinyVideoDiT, prompt: str, seed: int = 0, steps: int = SAMPLE_STEPS,
                  cfg_scale: float = 4.0, frames: int = FRAMES, size: int = SIZE,
                  trajectory: list | None = None) -> torch.Tensor:
    """One clip `[T, 3, H, W]` in [0, 1] in this process (the reference `generate` matches)."""
    from cpcourse.tinydit.moving_shapes import parse_prompt
    from cpcourse.tinydit.sampling import initial_noise, sample

    noise = initial_noise((1, model.cfg.in_channels, frames, size, size), seed)
    out = sample(model, noise.to(next(model.parameters()).dtype), parse_prompt(prompt), steps,
                 cfg_scale, trajectory=trajectory)
    if trajectory is not None:
        trajectory[:] = [to_clip(x) for x in trajectory]
    return to_clip(out)


def evaluate(model: TinyVideoDiT, prompts=None, seeds=range(8), steps: int = SAMPLE_STEPS,
             cfg_scale: float = 4.0, sampler=None, progress=None) -> dict:
    """Generate every prompt at every seed in this process and track each clip. `sampler`:
    `sampling.sample`'s signature (None: it); the causal model passes its streaming sampler.
    `progress`, when given, is called after each prompt as progress(done, total, prompt, its
    rates, seconds so far) (`cpcourse bench shapes` prints a line: a run takes minutes).

    Returns {prompt: {"direction": fraction of clips moving the prompt's way, "shape": fraction
    drawing the prompt's shape, "present": fraction of frames with exactly one object,
    "clips": n}} plus "all" (the same over every clip) and "seconds_per_clip".
    """
    from cpcourse.tinydit.moving_shapes import PROMPTS, matches, parse_prompt, track
    from cpcourse.tinydit.sampling import initial_noise, sample

    prompts, seeds = list(prompts or PROMPTS), list(seeds)
    require(seeds, "evaluate needs at least one seed")
    require(len(seeds) <= MAX_EVAL_SEEDS,
            f"evaluate takes at most {MAX_EVAL_SEEDS} seeds (one batch), got {len(seeds)}")
    shape = (1, model.cfg.in_channels, FRAMES, SIZE, SIZE)
    noise = torch.cat([initial_noise(shape, s) for s in seeds])  # one batch: seeds side by side
    out, rows, start = {}, [], time.perf_counter()
    for prompt in prompts:
        batch = (sampler or sample)(model, noise, parse_prompt(prompt), steps, cfg_scale)
        found = [matches(prompt, track(to_clip(batch[i:i + 1]))) for i in range(len(seeds))]
        rows += found
        out[prompt] = rates(found)
        if progress is not None:
            progress(len(out), len(prompts), prompt, out[prompt], time.perf_counter() - start)
    out["all"] = rates(rows)
    out["seconds_per_clip"] = (time.perf_counter() - start) / len(rows)
    return out


def check_eval_seeds(name: str, value) -> int:
    """How many seeds `evaluate` samples: 1 to MAX_EVAL_SEEDS, else an InputError naming
    `name` (the flag that asked)."""
    seeds = positive_int(name, value)
    require(seeds <= MAX_EVAL_SEEDS, f"{name} {seeds}: use at most {MAX_EVAL_SEEDS}")
    return seeds


def rates(found: list[dict]) -> dict:
    n = len(found)
    return {"direction": sum(f["direction"] for f in found) / n,
            "shape": sum(f["shape"] for f in found) / n,
            "present": sum(f["present_fraction"] for f in found) / n, "clips": n}
