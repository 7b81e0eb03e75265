"""A few denoising steps of the model's own diffusers scheduler, with CFG, around a CP model.

    python -m cpcourse.cli models --arch wan --nproc 3 --method ring --sample-steps 4 --compare

`sample(model, arch, inputs)` starts from seeded noise of the WHOLE latent shape (every rank
draws the same numbers, so the video cannot depend on P), and at each step runs the transformer
on the conditional and the unconditional text and mixes them, `uncond + s * (cond - uncond)`,
before the scheduler's update. HunyuanVideo is guidance-distilled: the scale is an input
embedding and each step is ONE forward (no CFG pair, so no CFG-parallel either). On a mesh
with cfg = 2 (`parallelize(model, mesh=...)`) each cfg rank runs one branch and
`cpcourse.mesh.cfg_combine` exchanges the predictions once per step.
Schedulers, as each model's pipeline configures them: Wan, UniPC on flow sigmas (shift 3);
HunyuanVideo, flow-matching Euler (shift 7); CogVideoX, its DDIM on v-prediction (CogVideoX is
not a flow model). Every scheduler update is per element, so with a `shard_io` model the loop
runs on this rank's frames and gathers once, at the end.
"""

from __future__ import annotations

import torch

from cpcourse.mesh import cfg_branch, cfg_combine
from cpcourse.models.build import arch_info
from cpcourse.models.parallel import cp_state
from cpcourse.models.shards import gather_latents, shard_latents
from cpcourse.models.split import latent_grid
from cpcourse.support.errors import require

# Sources: wan, diffusers src/diffusers/pipelines/wan/pipeline_wan.py's example (UniPC,
# flow_shift 3.0 for 480P, 5.0 for 720P); hunyuanvideo, Tencent/HunyuanVideo hyvideo/config.py
# (--flow-shift default 7.0); cogvideox, the scheduler diffusers'
# scripts/convert_cogvideox_to_diffusers.py saves (it also sets snr_shift_scale=3.0, left at its
# default here).
SCHEDULERS = {
    "wan": ("UniPCMultistepScheduler", dict(prediction_type="flow_prediction",
                                            use_flow_sigmas=True, flow_shift=3.0)),
    "hunyuanvideo": ("FlowMatchEulerDiscreteScheduler", dict(shift=7.0)),
    "cogvideox": ("CogVideoXDDIMScheduler", dict(prediction_type="v_prediction",
                                                 timestep_spacing="trailing",
                                                 rescale_betas_zero_snr=True, beta_schedule=
                                                 "scaled_linear", beta_start=0.00085,
                                                 beta_end=0.012, clip_sample=False,
                                                 set_alpha_to_one=True)),
}
SCHEDULERS["wan2.2"] = SCHEDULERS["wan"]


def make_scheduler(arch: str):
    import diffusers

    name, kwargs = SCHEDULERS[arch_info(arch).id]
    return getattr(diffusers, name)(**kwargs)


def negative_text(inputs: dict, seed: int) -> torch.Tensor:
    """Stand-in for the negative prompt's text states: seeded, the positive one's shape."""
    pos = inputs["encoder_hidden_states"]
    gen = torch.Generator().manual_seed(seed + 7919)
    return torch.randn(pos.shape, generator=gen, dtype=torch.float64).to(pos.device, pos.dtype)


def sample(model, arch: str, inputs: dict, steps: int = 4, cfg_scale: float = 5.0,
           seed: int = 0) -> torch.Tensor:
    """Latents after `steps` scheduler steps from seeded noise; same shape as inputs' latents.

    `inputs` are the forward's keyword arguments (`example_inputs`): their latents give only
    the shape; their timestep is replaced at every step. Works on a plain model, a parallelized
    one (full latents everywhere), and a `shard_io` one (frames split, gathered at the end).
    """
    info = arch_info(arch)
    require(isinstance(steps, int) and 1 <= steps <= 1000, f"steps must be 1 .. 1000, got {steps}")
    like = inputs["hidden_states"]
    gen = torch.Generator().manual_seed(seed)
    # drawn on the CPU (the same numbers on every device), then moved next to the model
    latents = torch.randn(like.shape, generator=gen, dtype=torch.float64).to(like.device,
                                                                             like.dtype)
    cp = cp_state(model)
    branch = cfg_branch(None if cp is None else cp.mesh)
    require(branch == "both" or not info.guidance_distilled,
            f"{info.id} is guidance-distilled (one forward per step, no CFG pair): a mesh with "
            "cfg=2 has nothing to split, use cfg=1")
    if cp is not None and cp.shard_io:
        latents = shard_latents(model, latents)
    sched = make_scheduler(arch)
    sched.set_timesteps(steps)
    cond = {k: v for k, v in inputs.items() if k not in ("hidden_states", "timestep")}
    uncond = dict(cond, encoder_hidden_states=negative_text(inputs, seed))
    b = like.shape[0]
    with torch.inference_mode():
        for t in sched.timesteps:
            x = sched.scale_model_input(latents, t) if hasattr(sched, "scale_model_input") \
                else latents
            if info.per_token_timestep:  # Wan 2.2: every token carries its own timestep
                frames, pph, ppw = latent_grid(model, x)
                tt = torch.full((b, frames * pph * ppw), float(t), dtype=like.dtype,
                                device=like.device)
            else:
                tt = torch.full((b,), float(t), dtype=like.dtype, device=like.device)

            def run(kw, x=x, tt=tt):
                return model(hidden_states=x, timestep=tt, **kw, return_dict=False)[0]

            if info.guidance_distilled:  # the scale x 1000, as diffusers'
                # pipelines/hunyuan_video/pipeline_hunyuan_video.py embeds it
                pred = run(dict(cond, guidance=torch.full((b,), cfg_scale * 1000.0,
                                                          dtype=like.dtype, device=like.device)))
            elif branch == "both":
                pc, pu = run(cond), run(uncond)
                pred = pu + cfg_scale * (pc - pu)
            else:  # CFG-parallel: this rank's branch; the other is on the other cfg rank
                pred = cfg_combine(run(cond if branch == "cond" else uncond), cp.mesh, cfg_scale)
            latents = sched.step(pred, t, latents, return_dict=False)[0]
    if cp is not None and cp.shard_io:
        latents = gather_latents(model, latents)
    return latents
