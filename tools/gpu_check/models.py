"""Real-size video transformers with random weights: one forward's seconds and peak memory on one
GPU, beside what the planner predicts for the same forward.

    cpcourse bench gpu --json            # runs this as one part of the GPU check
    cpcourse bench gpu --dry-run --json  # the same code on the CPU with the tiny configs

Each model is diffusers' own class at the released size: diffusers' defaults for the class,
with the sizes the facts sheet gives for the preset (heads, head dim, FFN width, layers, latent
channels), built straight on the GPU (random weights: no download) and cast as
`from_pretrained(torch_dtype=bfloat16)` casts. One forward at the preset's default video size
(Wan2.1 1.3B: 480p x 81 frames, 32,760 tokens; 14B: 720p x 81, 75,600; HunyuanVideo: 720p x
129, 118,800 plus 256 text tokens) is timed with CUDA events after a warm-up at two latent
frames, and the allocator's peak during it is read.

The prediction is `cpcourse.planner.deployment.cost` for the same model, size and one H200: its
per-forward linear, attention and element-wise seconds, and its weights plus activations.
Attention is priced at the planner's share of peak for the kernel (on an H200 this course's own
measurement: "sdpa" is the kernel SDPA picks there, "fa2" FlashAttention-2; "fa3" the papers'
70%); `measured_rates` re-prices the same FLOPs at the rates this run measured.
"""

from __future__ import annotations

import math

import torch

from cpcourse.planner.deployment import cost
from cpcourse.planner.tokens import get_model, model_tokens
from cpcourse.support.layout import Layout
from tools.gpu_check.kernels import median, timed

# (preset id, diffusers arch, the sizes to run at: the preset's default video)
CASES = (("wan2.1-t2v-1.3b", "wan"), ("wan2.1-t2v-14b", "wan"),
         ("hunyuanvideo-13b", "hunyuanvideo"))
TEXT_DIM = 4096  # umT5-XXL (Wan) and LLaVA-Llama-3-8B (HunyuanVideo) width: diffusers' default
POOLED_DIM = 768  # HunyuanVideo's CLIP-L pooled projection: diffusers' default


def real_config(model_id: str, arch: str) -> dict:
    """diffusers' config overrides that give `arch` the preset's released sizes."""
    m = get_model(model_id)
    cfg = {"num_attention_heads": m.heads, "attention_head_dim": m.head_dim,
           "in_channels": m.latent_channels, "out_channels": m.latent_channels}
    if arch in ("wan", "wan2.2"):
        cfg.update(ffn_dim=m.ffn, num_layers=m.layers, text_dim=TEXT_DIM)
    if arch == "cogvideox":
        # the 5B rotates its queries and keys (the 2B adds sin-cos positions); its text is T5's
        cfg.update(num_layers=m.layers, text_embed_dim=TEXT_DIM,
                   use_rotary_positional_embeddings=m.id != "cogvideox-2b")
    return cfg


def build_real(model_id: str, arch: str, device: torch.device, dtype=torch.bfloat16):
    """The released architecture with random weights, made on `device` (no CPU copy)."""
    import diffusers

    from cpcourse.models.build import ARCHS, cast

    cls = getattr(diffusers, ARCHS[arch].cls)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(**real_config(model_id, arch))
    return cast(model, dtype).eval()


def real_inputs(model_id: str, arch: str, frames: int, device, dtype) -> dict:
    """One forward's keyword arguments at the preset's default height and width."""
    from cpcourse.models.build import arch_info

    m, tok, info = get_model(model_id), model_tokens(model_id, frames=frames), arch_info(arch)
    gen = None if torch.device(device).type == "meta" else torch.Generator(device=device)
    gen = gen and gen.manual_seed(0)
    rand = lambda *s: torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
    shape = (1, m.latent_channels, tok.latent_frames, tok.latent_height, tok.latent_width)
    if info.layout == "BFCHW":  # CogVideoX: frames before channels
        shape = (1, tok.latent_frames, m.latent_channels, tok.latent_height, tok.latent_width)
    # Wan 2.2 TI2V conditions every token on its own timestep: the time MLPs run per token
    steps = (1, tok.video_tokens) if info.per_token_timestep else (1,)
    kw = {"hidden_states": rand(*shape),
          "encoder_hidden_states": rand(1, m.text_tokens, TEXT_DIM),
          "timestep": torch.full(steps, 500.0, device=device, dtype=dtype)}
    if info.text_mask:
        kw["encoder_attention_mask"] = torch.ones(1, m.text_tokens, device=device,
                                                  dtype=torch.bool)
        kw["pooled_projections"] = rand(1, POOLED_DIM)
    if info.guidance_distilled:
        kw["guidance"] = torch.full((1,), 6000.0, device=device, dtype=dtype)
    if info.rotary_passed_in and real_config(model_id, arch).get(
            "use_rotary_positional_embeddings", True):
        from cpcourse.models.build import cogvideox_rotary

        grid = (tok.latent_height, tok.latent_width)
        kw["image_rotary_emb"] = tuple(t.to(device) for t in cogvideox_rotary(
            tok.latent_frames, *grid, head_dim=m.head_dim, base=grid, patch=m.patch[1]))
    return kw


def sdpa_backend(model_id: str, arch: str, device) -> str:
    """The `attention_with_lse` backend name of the kernel PyTorch's SDPA picks for this model's
    self-attention: HunyuanVideo passes a text padding mask, which the flash kernel refuses."""
    from torch.nn.attention import SDPBackend

    from cpcourse.models.build import arch_info

    m = get_model(model_id)
    q = torch.zeros(1, m.heads, 128, m.head_dim, device=device, dtype=torch.bfloat16)
    mask = (torch.ones(1, 1, 1, 128, device=device, dtype=torch.bool)
            if arch_info(arch).text_mask else None)
    choice = SDPBackend(torch._fused_sdp_choice(q, q, q, attn_mask=mask))
    cpu = torch.device(device).type == "cpu"
    return {SDPBackend.FLASH_ATTENTION: "cpu-flash" if cpu else "sdpa-flash",
            SDPBackend.EFFICIENT_ATTENTION: "sdpa-efficient",
            SDPBackend.CUDNN_ATTENTION: "sdpa-cudnn"}.get(choice, "torch")


def predict(model_id: str, gpu_id: str, kernels=("sdpa", "fa3")) -> dict:
    """The planner's one-GPU forward: seconds by part for each kernel, weights + activations."""
    tok = model_tokens(model_id)
    out = {"tokens": tok.sequence_length}
    for k in kernels:
        c = cost(model_id, tok, gpu_id, Layout(), 1, kernel=k)
        per = c["breakdown"]["per_forward_seconds"]
        out[k] = {"linear_seconds": per["linear"], "attention_seconds": per["attention"],
                  "elementwise_seconds": per["elementwise"],
                  "forward_seconds": per["linear"] + per["attention"] + per["elementwise"],
                  "kernel_efficiency": c["kernel_efficiency"]}
        mem = c["breakdown"]["memory_bytes"]
        out["weights_bytes"], out["activation_bytes"] = mem["weights"], mem["activations"]
    return out


def measured_rates(pred: dict, attention_share: float | None, matmul_share: float | None,
                   assumed_matmul: float) -> dict | None:
    """The planner's FLOPs at this run's measured shares of peak instead of the papers'."""
    if not attention_share or not matmul_share:
        return None
    base = pred["sdpa"]
    attn = base["attention_seconds"] * base["kernel_efficiency"] / attention_share
    lin = base["linear_seconds"] * assumed_matmul / matmul_share
    elem = base["elementwise_seconds"]
    return {"linear_seconds": lin, "attention_seconds": attn, "elementwise_seconds": elem,
            "forward_seconds": lin + attn + elem,
            "attention_share": attention_share, "matmul_share": matmul_share}


def _peak(device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def measure(model, inputs: dict, warm: dict, device, repeat: int) -> dict:
    """Seconds per forward (median of `repeat`, after one warm-up forward on `warm`) and the
    allocator's peak during the timed forwards, with the weights' bytes for reference."""
    with torch.inference_mode():
        model(**warm, return_dict=False)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        last = {}

        def forward():
            last["out"] = model(**inputs, return_dict=False)[0]

        secs = timed(forward, device, warmup=0, repeat=repeat)
        finite = bool(torch.isfinite(last["out"]).all())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"seconds_per_forward": median(secs), "seconds_all": secs, "peak_bytes": _peak(device),
            "weights_bytes": weights, "params": sum(p.numel() for p in model.parameters()),
            "output_finite": finite}


# Kernel (CUDA) or operator (CPU) names by what they compute, first match wins.
KINDS = (("attention", ("fmha", "flash", "attention", "sdpa", "attn")),
         ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "addmm", "aten::mm", "aten::bmm",
                     "matmul")))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, keys in KINDS if any(key in low for key in keys)), "other")


def profile_forward(model, inputs: dict, device) -> dict:
    """One forward under torch.profiler: device seconds by kind (attention, matmul, other: the
    norms, modulations, rotary and activations the planner does not price), with the largest
    kernels of each kind so a reader can check the sorting."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with torch.inference_mode(), profile(
            activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        model(**inputs, return_dict=False)
        if cuda:
            torch.cuda.synchronize(device)
    seconds, top = {"attention": 0.0, "matmul": 0.0, "other": 0.0}, {}
    for ev in prof.key_averages():
        us = ev.self_device_time_total if cuda else ev.self_cpu_time_total
        if us <= 0 or (not cuda and not ev.key.startswith("aten::")):
            continue
        k = kind_of(ev.key)
        seconds[k] += us / 1e6
        top.setdefault(k, []).append((us / 1e6, ev.key[:80]))
    return {"seconds": seconds,
            "largest": {k: [n for _, n in sorted(v, reverse=True)[:3]] for k, v in top.items()}}


def forced_flash(model, inputs: dict, device, arch: str) -> dict:
    """The same forward with SDPA held to its FlashAttention-2 kernel, the kernel the planner's
    'sdpa' and 'fa2' rates describe; HunyuanVideo's text mask rules that kernel out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cpcourse.models.build import arch_info

    if arch_info(arch).text_mask:
        return {"skipped": "a key-padding mask: the flash kernel takes none"}
    with torch.inference_mode(), sdpa_kernel(SDPBackend.FLASH_ATTENTION
                                             if device.type == "cuda" else SDPBackend.MATH):
        secs = timed(lambda: model(**inputs, return_dict=False), device, warmup=0, repeat=1)
    return {"seconds_per_forward": secs[0]}


def run_model(model_id: str, arch: str, device, dry: bool, repeat: int) -> dict:
    """Build, time and predict one case; the CPU dry run uses the tiny config at a tiny size."""
    from cpcourse.models import build, example_inputs

    m = get_model(model_id)
    row = {"model": model_id, "arch": arch, "height": m.default_height, "width": m.default_width,
           "frames": m.default_frames, "predicted": predict(model_id, "h200-sxm"),
           "sdpa_backend": sdpa_backend(model_id, arch, device)}
    if dry:
        model = build(arch).to(device)
        inputs = example_inputs(arch, frames=5, seed=1)
        warm = example_inputs(arch, frames=1, seed=2)
        row.update(height=8, width=8, frames=5, tiny=True)
    else:
        model = build_real(model_id, arch, device)
        inputs = real_inputs(model_id, arch, m.default_frames, device, torch.bfloat16)
        warm = real_inputs(model_id, arch, 1 + m.vae_temporal, device, torch.bfloat16)
    row.update(measure(model, inputs, warm, device, repeat))
    row["profile"] = profile_forward(model, inputs, device)
    row["flash_attention_2"] = forced_flash(model, inputs, device, arch)
    del model, inputs, warm
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def compare(row: dict, attention_share, matmul_share, assumed_matmul: float) -> dict:
    """Measured over predicted, per kernel assumption, for time and memory."""
    p = row["predicted"]
    out = {k: row["seconds_per_forward"] / p[k]["forward_seconds"] for k in ("sdpa", "fa3")
           if math.isfinite(p[k]["forward_seconds"])}
    fixed = measured_rates(p, attention_share, matmul_share, assumed_matmul)
    if fixed:
        out["measured_rates"] = row["seconds_per_forward"] / fixed["forward_seconds"]
        row["predicted"]["measured_rates"] = fixed
    if row.get("peak_bytes"):
        out["memory"] = row["peak_bytes"] / (p["weights_bytes"] + p["activation_bytes"])
    return out
