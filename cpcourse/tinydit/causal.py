"""The chunk-causal shapes model: each chunk of frames denoised with the earlier chunks as context.

    cpcourse train --causal --init shipped --minutes 20 --threads 1 --out /tmp/causal.safetensors

A streaming video model (CausVid, Self-Forcing, MAGI-1) makes a clip chunk after chunk: chunk k
(here 2 frames, 32 tokens) is denoised from noise while attending to the clean, finished chunks
before it, whose keys and values sit in a KV cache (`cpcourse.tinydit.streaming` runs that).
Training has to show the network exactly that situation. The recipe here is **teacher forcing**:

- each step runs the clean clip x0 `[B, T, S, C*p*p]` at t = 0 under the block-causal mask
  (chunk i sees chunks <= i) and keeps every layer's keys and values: the cache a stream would
  hold after each chunk, computed the way the stream computes it (at t = 0, after the fact);
- then the noisy clip x_t at the sample's t, where noisy chunk k attends to the CLEAN keys and
  values of chunks < k and to its own noisy tokens, nothing else; the loss is on every noisy chunk
  (x-prediction, as for the bidirectional model), so one clip trains all its chunks at once.
  Gradients run through the clean pass too: the context is trained to be useful to later chunks.

Per-chunk noise levels (diffusion forcing) were the alternative; teacher forcing matches the
streaming sampler exactly (clean context, one noise level in flight) with one t per sample.

**Fine-tuned from the shipped bidirectional weights** (`--init shipped`), not trained from
scratch: what a shape looks like and how it moves is the same knowledge under either mask; only
the mask and the clean context are new, which a few hundred steps teach, while from scratch the
bidirectional model needed 26 minutes on two cores. A smaller learning rate than from scratch
keeps what was learnt; the EMA is shorter because the run is. The shipped weights
(`cpcourse/data/shapes_causal_dit.safetensors`, their metadata holds the run) come from
`cpcourse train --causal --init shipped --minutes 24 --threads 1`: 512 steps on one thread of
a shared 2-core CPU, loss 0.041 -> 0.011. Streamed, the shipped bidirectional weights as they
were found the prompt's direction in 83% of clips (8 seeds per prompt); fine-tuned, in all of
them (`cpcourse bench shapes --causal`).
"""

from __future__ import annotations

import torch

from cpcourse.causal import chunk_of_frames
from cpcourse.support.errors import require
from cpcourse.tinydit.model import CPContext, TinyVideoDiT, patchify
from cpcourse.tinydit.training import TrainConfig, to_model_space

CHUNK = 2                                     # frames per chunk of the shipped causal model
SHIPPED_CAUSAL = "shapes_causal_dit.safetensors"   # in cpcourse/data
FINE_TUNE = TrainConfig(lr=3e-4, warmup=50, ema=0.995)


def shipped_causal_path() -> str:
    from importlib import resources

    return str(resources.files("cpcourse") / "data" / SHIPPED_CAUSAL)


def _masked_attention(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """q `[B, H, T, S, D]` over k, v `[B, H, T', S, D]` where bool `mask [T*S, T'*S]` allows."""
    b, h, t, s, d = q.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        q.reshape(b, h, t * s, d), k.flatten(2, 3), v.flatten(2, 3), attn_mask=mask)
    return out.view(b, h, t, s, d)


class TeacherForcing:
    """The attention hook (`CPContext.attend`) of both training passes: `clean()` records each
    layer's k, v under the block-causal mask; `noisy()` then attends to them as the cache."""

    def __init__(self, frames: int, chunk: int, tokens_per_frame: int):
        c = chunk_of_frames(frames, chunk, tokens_per_frame)
        self.causal = c[None, :] <= c[:, None]                          # [L, L]
        # noisy queries over [clean keys | noisy keys]: earlier clean chunks, then itself
        self.forced = torch.cat([c[None, :] < c[:, None], c[None, :] == c[:, None]], dim=1)
        self.kv: dict[int, tuple] = {}
        self.recording = True

    def __call__(self, layer, q, k, v):
        if self.recording:
            self.kv[id(layer)] = (k, v)
            return _masked_attention(q, k, v, self.causal)
        ck, cv = self.kv[id(layer)]
        return _masked_attention(q, torch.cat([ck, k], dim=2), torch.cat([cv, v], dim=2),
                                 self.forced)


def teacher_forcing_loss(model: TinyVideoDiT, clips, shape_ids, direction_ids, gen,
                         tc: TrainConfig = FINE_TUNE, chunk: int = CHUNK) -> torch.Tensor:
    """One batch's loss (clips `[B, T, 3, H, W]`): mean squared error of the x0 prediction of
    every noisy chunk, each given the clean chunks before it."""
    cfg = model.cfg
    require(cfg.prediction == "sample", "the causal recipe trains an x-prediction model")
    x0 = patchify(to_model_space(clips), cfg.patch)                # [B, T, S, 3*p*p]
    b, frames, s, _ = x0.shape
    noise = torch.randn(x0.shape, generator=gen)
    t = torch.sigmoid(tc.t_mean + tc.t_std * torch.randn(b, generator=gen))
    xt = (1 - t)[:, None, None, None] * x0 + t[:, None, None, None] * noise
    y = torch.stack([shape_ids, direction_ids], dim=1)
    y[torch.rand(b, generator=gen) < tc.label_drop] = torch.tensor(cfg.null_label)
    hook = TeacherForcing(frames, chunk, s)
    grid = (clips.shape[-2] // cfg.patch, clips.shape[-1] // cfg.patch)
    ctx = CPContext(grid=grid, attend=hook)
    model(x0, torch.zeros(b), y, ctx)              # the clean pass: only its k, v are used
    hook.recording = False
    return torch.nn.functional.mse_loss(model(xt, t, y, ctx), x0)


def train_causal(out: str | None, *, init: str = "shipped", minutes: float | None = None,
                 steps: int | None = None, seed: int = 0, threads: int | None = None,
                 progress=None) -> dict:
    """`training.train` with the teacher-forcing loss, fine-tuning `init` ("shipped", "scratch"
    or a weights file); the file's metadata says it is causal and with which chunk."""
    from cpcourse.tinydit.model import load_weights
    from cpcourse.tinydit.training import shipped_path, train

    model = None if init == "scratch" else load_weights(
        shipped_path() if init == "shipped" else init)[0]
    meta = {"causal": {"chunk": CHUNK, "recipe": "teacher forcing", "init": init}}
    return train(out, minutes=minutes, steps=steps, seed=seed, tc=FINE_TUNE, progress=progress,
                 threads=threads, init=model, loss_fn=teacher_forcing_loss, meta=meta)
