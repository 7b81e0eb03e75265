"""The serial part of a video: the VAE decode at released sizes and the text encoder, timed.

    cpcourse bench gpu --parts vae,encoder --json             # on a CUDA machine, about 140 s
    cpcourse bench gpu --dry-run --parts vae,encoder --json   # CPU, tiny configs

The planner's largest systematic error is the part no number of GPUs shortens (planner audit,
section 5): the decode and the encoder were priced, never timed on this course's GPU.

`vae_part`: diffusers' own VAE classes at their default (released) configs with random bf16
weights, decoding the latents of each preset's default video: Wan2.1 at 720p x 81 frames
(latents 16 x 21 x 90 x 160), HunyuanVideo at 720p x 129 tiled as its pipeline tiles
(`enable_tiling()`'s defaults), CogVideoX at 480 x 720 x 49 (latents 16 x 13 x 60 x 90). Each
is warmed up on two latent frames at the same height and width, then timed once. For the VAEs
the course splits by height (`cpcourse.models.vae.decode`), one rank's share at P = 8 is its
rows decoded alone: the compute a rank does, without the halo exchange (which the planner
prices on the link) and with the mid-block attention over its rows only. Beside each: the
planner's serial decode and its per-rank compute (`cpcourse.planner.fixed_costs`,
`cpcourse.planner.parallel_vae`).

`encoder_part`: an encoder stack of umT5-XXL's sizes (google/umt5-xxl config.json: d_model
4096, 24 layers, 64 heads of 64, gated-GELU FFN of 10,240, vocabulary 256,384; 5.7 B
parameters), random bf16 weights, encoding two prompts (CFG) of 512 tokens; and its load from
pinned host memory, the reload a "freed" encoder pays. transformers is not installed here, so
the stack is torch modules: T5's relative position bias is left out (a few hundred FLOPs per
score, against 128 per head).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cpcourse.planner.tokens import model_tokens
from tools.gpu_check.kernels import median, timed

VAES = (("wan2.1-t2v-14b", "AutoencoderKLWan", False),
        ("hunyuanvideo-13b", "AutoencoderKLHunyuanVideo", True),
        ("cogvideox-5b", "AutoencoderKLCogVideoX", False))  # (preset, class, tiled)
TINY_VAE = {"AutoencoderKLCogVideoX": dict(block_out_channels=(8, 16, 16, 16),
                                           latent_channels=4, layers_per_block=1,
                                           norm_num_groups=4)}
SPLIT_RANKS = 8
UMT5_XXL = {"d_model": 4096, "layers": 24, "heads": 64, "d_kv": 64, "d_ff": 10_240,
            "vocab": 256_384, "tokens": 512, "prompts": 2}
TINY_T5 = {"d_model": 64, "layers": 2, "heads": 4, "d_kv": 16, "d_ff": 96, "vocab": 500,
           "tokens": 16, "prompts": 2}


def _vae(cls: str, device, dry: bool):
    import diffusers

    from cpcourse.models.vae import build_vae

    if dry:
        arch = {"AutoencoderKLWan": "wan", "AutoencoderKLHunyuanVideo": "hunyuanvideo"}.get(cls)
        vae = build_vae(arch) if arch else getattr(diffusers, cls)(**TINY_VAE[cls]).eval()
        return vae.to(device), torch.float32
    with torch.device(device):
        vae = getattr(diffusers, cls)()
    return vae.to(torch.bfloat16).eval(), torch.bfloat16


def _predicted(model_id: str, tok, gpu_id: str) -> dict:
    from cpcourse.planner.facts import facts
    from cpcourse.planner.fixed_costs import fixed_seconds
    from cpcourse.planner.hardware import get_gpu
    from cpcourse.planner.parallel_vae import parallel_decode

    rate = get_gpu(gpu_id).bf16_tflops * 1e12 * float(
        facts()["calculator_defaults"]["matmul_efficiency"])
    fx = fixed_seconds(model_id, tok, gpu_id, rate, prompts=2)
    out = {"serial_seconds": fx["vae_serial_seconds"] if fx["vae_flops"] else None,
           "vae_flops": fx["vae_flops"], "share": fx["vae_share"], "source": fx["vae_source"]}
    try:
        split = parallel_decode(model_id, tok, gpu_id, SPLIT_RANKS, 8,
                                fx["vae_serial_seconds"], 2)
        out["rank_compute_seconds"] = split["compute_seconds"]
    except ValueError as exc:  # InputError: no height split for this VAE
        out["rank_compute_seconds"] = None
        out["split"] = str(exc)
    return out


def _decode_seconds(vae, z, device) -> float:
    with torch.inference_mode():
        vae.decode(z[:, :, :2])  # warm: the same height and width, two latent frames
        return timed(lambda: vae.decode(z), device, warmup=0, repeat=1)[0]


def vae_row(model_id: str, cls: str, tiled: bool, device, dry: bool, gpu_id: str) -> dict:
    tok = model_tokens(model_id)
    vae, dtype = _vae(cls, device, dry)
    f, h, w = ((2, 4, 4) if dry else (tok.latent_frames, tok.latent_height, tok.latent_width))
    c = vae.config.get("z_dim") or vae.config.get("latent_channels")
    z = torch.randn(1, c, f, h, w, device=device, dtype=dtype)
    row = {"model": model_id, "vae": cls, "latents": [1, c, f, h, w], "dtype": str(dtype),
           "tiny": dry, "predicted": _predicted(model_id, tok, gpu_id)}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if tiled:
        vae.enable_tiling(**({"tile_sample_min_height": 24, "tile_sample_min_width": 24,
                              "tile_sample_stride_height": 16, "tile_sample_stride_width": 16}
                             if dry else {}))
        row["tiles"] = {k: getattr(vae, k) for k in ("tile_sample_min_height",
                                                     "tile_sample_min_width",
                                                     "tile_sample_stride_height")}
    row["seconds"] = _decode_seconds(vae, z, device)
    row["peak_bytes"] = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    pred = row["predicted"]["serial_seconds"]
    row["measured_over_predicted"] = row["seconds"] / pred if pred else None
    if row["predicted"].get("rank_compute_seconds") is not None:
        vae.disable_tiling() if tiled else None
        rows = math.ceil(h / SPLIT_RANKS)  # rank 0 holds the most (tensor_split)
        row["rank_share"] = {"ranks": SPLIT_RANKS, "latent_rows": rows,
                             "seconds": _decode_seconds(vae, z[..., :rows, :].contiguous(),
                                                        device)}
        row["rank_share"]["measured_over_predicted"] = (
            row["rank_share"]["seconds"] / row["predicted"]["rank_compute_seconds"])
    return row


def vae_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'vae': each released VAE's decode, and one rank's share of the split decode."""
    import time

    rows = []
    for model_id, cls, tiled in VAES:
        if time.monotonic() > deadline:
            rows.append({"model": model_id, "skipped": "past the --budget"})
            continue
        try:
            rows.append(vae_row(model_id, cls, tiled, device, dry, gpu_id))
        except (RuntimeError, ValueError) as exc:
            rows.append({"model": model_id, "error": f"{type(exc).__name__}: "
                                                     f"{str(exc).splitlines()[0][:200]}"})
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"split_ranks": SPLIT_RANKS, "rows": rows}


class T5Layer(nn.Module):
    """One T5 encoder layer: RMS norm, self-attention (no 1/sqrt(d) scale, as T5), RMS norm,
    gated-GELU FFN; hidden `[B, L, d_model]`."""

    def __init__(self, s: dict):
        super().__init__()
        inner = s["heads"] * s["d_kv"]
        self.heads = s["heads"]
        self.n1, self.n2 = nn.RMSNorm(s["d_model"]), nn.RMSNorm(s["d_model"])
        self.qkv = nn.Linear(s["d_model"], 3 * inner, bias=False)
        self.o = nn.Linear(inner, s["d_model"], bias=False)
        self.wi = nn.Linear(s["d_model"], 2 * s["d_ff"], bias=False)  # gate and up, fused
        self.wo = nn.Linear(s["d_ff"], s["d_model"], bias=False)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.qkv(self.n1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
        x = x + self.o(a.transpose(1, 2).reshape(b, n, -1))
        gate, up = self.wi(self.n2(x)).chunk(2, dim=-1)
        return x + self.wo(nn.functional.gelu(gate, approximate="tanh") * up)


def t5_encoder(s: dict) -> nn.Module:
    return nn.Sequential(nn.Embedding(s["vocab"], s["d_model"]),
                         *(T5Layer(s) for _ in range(s["layers"])), nn.RMSNorm(s["d_model"]))


def encoder_part(device, dry: bool, repeat: int, gpu_id: str, deadline: float) -> dict:
    """Section 'encoder': encode seconds and the load from pinned host memory, beside the
    planner's (`cpcourse.planner.text_encoder`)."""
    from cpcourse.planner.facts import facts
    from cpcourse.planner.hardware import get_gpu
    from cpcourse.planner.text_encoder import encode_cost, encode_flops

    s = TINY_T5 if dry else UMT5_XXL
    with torch.device(device):
        enc = t5_encoder(s).to(torch.bfloat16).eval()
    params = sum(p.numel() for p in enc.parameters())
    ids = torch.randint(0, s["vocab"], (s["prompts"], s["tokens"]), device=device)
    with torch.inference_mode():
        secs = timed(lambda: enc(ids), device, warmup=1, repeat=max(3, repeat))
    host = {k: v.to("cpu") for k, v in enc.state_dict().items()}
    if device.type == "cuda":
        host = {k: v.pin_memory() for k, v in host.items()}
    enc = None
    load = timed(lambda: [v.to(device, non_blocking=True) for v in host.values()], device,
                 warmup=0, repeat=1)[0]
    g = get_gpu(gpu_id)
    rate = g.bf16_tflops * 1e12 * float(facts()["calculator_defaults"]["matmul_efficiency"])
    real = UMT5_XXL
    pred = encode_cost("freed", encode_flops(5.7e9, real["tokens"], real["prompts"]), rate,
                       5.7e9 * 2, g)
    return {"sizes": s, "params": params, "tiny": dry, "encode_seconds": median(secs),
            "encode_seconds_all": secs, "load_seconds": load,
            "load_bytes": sum(v.numel() * v.element_size() for v in host.values()),
            "predicted": {"encode_seconds": pred["encode_seconds"],
                          "reload_seconds": pred["reload_seconds"], "source": pred["source"]},
            "sizes_source": "google/umt5-xxl config.json (d_model, num_layers, num_heads, "
                            "d_kv, d_ff, vocab_size)"}
