"""Warm forwards, one whole sampler step, and FP8 linears: the parts of a step the planner prices
per forward, timed as a deployment runs them.

    cpcourse bench gpu --parts warm,step,fp8 --json             # on a CUDA machine
    cpcourse bench gpu --dry-run --parts warm,step,fp8 --json   # CPU, tiny configs

`warm_part`: Wan2.1 1.3B, 14B and HunyuanVideo at their default sizes (`tools/gpu_check/models.py`
builds them: diffusers' classes, released sizes, random bf16 weights), one warm-up forward at
the SAME shape (the first run warmed up at two latent frames: new cuDNN plans and allocations
fell into its one timed sample), then three timed: median, min and max, beside the planner.
`step_part`: one sampler step of Wan2.1 14B at 720p x 81 as its pipeline runs it: the
conditional and unconditional forwards (CFG), the guidance mix and diffusers' UniPC flow step
(shift 5, 50 steps: the released 720p setting), with bf16 weights, then with the released
fp32 weights under bf16 autocast.
`fp8_part`: Wan2.1 14B's linears (75,600 tokens x 5120 -> 5120, -> 13,824, 13,824 -> 5120) as
bf16 matmuls and as `torch._scaled_mm` in float8 e4m3 with per-tensor scales (Ada and Hopper).
"""

from __future__ import annotations

import time

import torch

from cpcourse.planner.hardware import get_gpu
from cpcourse.planner.tokens import get_model
from tools.gpu_check import models as gpu_models
from tools.gpu_check.kernels import median, timed

STEP_MODEL = "wan2.1-t2v-14b"
FLOW_SHIFT, STEPS, GUIDANCE = 5.0, 50, 5.0  # Wan2.1 T2V 720p's released sampler settings
FP8_SHAPES = ((75_600, 5120, 5120), (75_600, 5120, 13_824), (75_600, 13_824, 5120))


def _model(model_id, arch, device, dry, dtype=torch.bfloat16):
    """(model, inputs): the released size on a GPU, the tiny config on the CPU."""
    from cpcourse.models import build, example_inputs

    if dry:
        return build(arch).to(device), example_inputs(arch, frames=5, seed=1)
    m = get_model(model_id)
    return (gpu_models.build_real(model_id, arch, device, dtype),
            gpu_models.real_inputs(model_id, arch, m.default_frames, device, torch.bfloat16))


def _free(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _predicted_forward(model_id: str, gpu_id: str) -> dict:
    p = gpu_models.predict(model_id, gpu_id)
    return {k: p[k]["forward_seconds"] for k in ("sdpa", "fa3")}


def warm_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'warm': per model, three forwards after a warm-up at the same shape."""
    rows = []
    for model_id, arch in gpu_models.CASES:
        if time.monotonic() > deadline:
            rows.append({"model": model_id, "skipped": "past the --budget"})
            continue
        row = {"model": model_id, "tiny": dry}
        try:
            model, inputs = _model(model_id, arch, device, dry)
            got = gpu_models.measure(model, inputs, inputs, device, repeat=3)
            secs = got.pop("seconds_all")
            row.update(got, seconds_min=min(secs), seconds_max=max(secs), seconds_all=secs,
                       sdpa_backend=gpu_models.sdpa_backend(model_id, arch, device),
                       predicted_seconds=_predicted_forward(model_id, gpu_id))
            row["measured_over_predicted"] = {k: row["seconds_per_forward"] / v for k, v in
                                              row["predicted_seconds"].items() if v}
        except (RuntimeError, ValueError) as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        model = inputs = None
        _free(device)
        rows.append(row)
    return {"warmup": "one forward at the same shape", "timed_forwards": 3, "rows": rows}


def _scheduler(latents):
    from diffusers import UniPCMultistepScheduler

    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                    flow_shift=FLOW_SHIFT, num_train_timesteps=1000)
    sched.set_timesteps(STEPS, device=latents.device)
    return sched


def sampler_step(model, inputs: dict, uncond, sched, latents):
    """One CFG step: both forwards, the guidance mix in fp32, the scheduler's update."""
    t = sched.timesteps[0]
    kw = dict(inputs, hidden_states=latents.to(inputs["hidden_states"].dtype),
              timestep=t.expand(1).to(latents.device))
    cond = model(**kw, return_dict=False)[0].float()
    kw["encoder_hidden_states"] = uncond
    free = model(**kw, return_dict=False)[0].float()
    pred = free + GUIDANCE * (cond - free)
    return sched.step(pred, t, latents).prev_sample


def _time_step(model, inputs, device, autocast: bool) -> dict:
    latents = inputs["hidden_states"].float()
    uncond = torch.zeros_like(inputs["encoder_hidden_states"])
    ctx = (torch.autocast(device.type, dtype=torch.bfloat16) if autocast
           else torch.autocast(device.type, enabled=False))
    with torch.inference_mode(), ctx:
        # no warm-up: the warm part ran these shapes in this process just before (cuDNN plans
        # and cuBLAS heuristics are cached per shape); a fresh scheduler each call: one step
        secs = timed(lambda: sampler_step(model, inputs, uncond, _scheduler(latents), latents),
                     device, warmup=0, repeat=1)
    return {"seconds_per_step": median(secs), "seconds_all": secs}


def step_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'step': one sampler step, bf16 weights, then fp32 weights under autocast."""
    from cpcourse.models.build import cast

    model, inputs = _model(STEP_MODEL, "wan", device, dry)
    out = {"model": STEP_MODEL, "tiny": dry, "guidance": GUIDANCE, "flow_shift": FLOW_SHIFT,
           "warmup": "none: the warm part's forwards at the same shape, in this process",
           "predicted_seconds": {k: 2 * v for k, v in
                                 _predicted_forward(STEP_MODEL, gpu_id).items()},
           "predicted_note": "the planner's two forwards; it prices no scheduler or casts"}
    out["bf16_weights"] = _time_step(model, inputs, device, autocast=False)
    if time.monotonic() > deadline:
        out["fp32_autocast"] = {"skipped": "past the --budget"}
        return out
    try:
        # Weights that require grad are cached by autocast in bf16 for the whole region: 28.6
        # GB more beside 57 GB of fp32 weights, past an H100's 80. Without grad each linear
        # casts its weight when called, which is the cast traffic this path is timed for.
        model = cast(model, torch.float32).requires_grad_(False)
        _free(device)
        out["fp32_autocast"] = _time_step(model, inputs, device, autocast=True)
    except (RuntimeError, ValueError) as exc:
        out["fp32_autocast"] = {"error": f"{type(exc).__name__}: "
                                         f"{str(exc).splitlines()[0][:200]}"}
    model = inputs = None
    _free(device)
    return out


def fp8_supported(device) -> str | None:
    """None when `torch._scaled_mm` runs in float8 here, else why not."""
    if device.type != "cuda":
        return "unsupported on CPU (torch._scaled_mm's float8 path is CUDA, Ada or Hopper on)"
    if torch.cuda.get_device_capability(device) < (8, 9):
        return "unsupported before Ada/Hopper (compute capability 8.9)"
    return None


def fp8_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'fp8': bf16 matmul against float8 `_scaled_mm` at Wan 14B's linear shapes."""
    why = fp8_supported(device)
    if why:
        return {"unsupported": why}
    peak = get_gpu(gpu_id).bf16_tflops
    rows = []
    for m, k, n in FP8_SHAPES:
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        flops = 2 * m * k * n
        bf16 = median(timed(lambda a=a, w=w: a @ w.t(), device, warmup=2, repeat=5))
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        fp8 = median(timed(lambda a8=a8, w8=w8, one=one: torch._scaled_mm(
            a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), device, warmup=2,
            repeat=5))
        rows.append({"m": m, "k": k, "n": n, "bf16_seconds": bf16, "fp8_seconds": fp8,
                     "bf16_share_of_peak": flops / bf16 / 1e12 / peak,
                     "fp8_tflops": flops / fp8 / 1e12, "speedup": bf16 / fp8})
        a = w = a8 = w8 = None
    return {"model": STEP_MODEL, "bf16_peak_tflops": peak, "rows": rows,
            "note": "no planner prediction: the planner prices bf16 linears only"}
