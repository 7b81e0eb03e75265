"""Derive what one forward of a real video DiT computes and moves, from diffusers' own classes.

    .venv/bin/python tools/derive_dit_costs.py --write  # rewrites the data file (else compares)

Each preset's transformer is built at its released size on the meta device (no memory, no
arithmetic) and run at two frame counts under two counters: torch's FlopCounterMode for the
matmuls (attention excluded: the planner prices it by its own formula), and a dispatch mode
that adds up the bytes every other non-view op reads and writes (norms, modulations, rotary,
activations, residual adds: the memory-bound work). Both grow linearly with the tokens, so two
sizes solve exactly for

    matmul FLOPs = a N + a0        element-wise bytes = e N + e0       (N: sequence tokens)

a per token, a0 what does not grow with the video (the text side of cross-attention, the
timestep and modulation linears). Presets whose class is not one of cpcourse.models' archs
(Mochi, LTX-Video, Cosmos, and Open-Sora 2.0 through Flux's class, whose block structure its
MMDiT shares) are built here from the facts sheet's sizes (`OTHER`). An H200 run
(cpcourse/data/gpu_measured_h200.json) showed why both are needed: HunyuanVideo's matmuls took
2.11 s of a 720p forward where counting every block parameter predicted 3.85 (modulation
linears act on the timestep, text weights never meet a video token), and the element-wise work
took 13-24% of a forward that the planner had not priced. cpcourse.planner reads this file;
tests/unit/test_dit_costs.py re-derives one point.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "cpcourse" / "data" / "dit_derived_costs.json"
# preset -> the cpcourse.models arch whose diffusers class it is
PRESETS = {"wan2.1-t2v-1.3b": "wan", "wan2.1-t2v-14b": "wan", "wan2.2-t2v-a14b": "wan",
           "wan2.2-ti2v-5b": "wan2.2", "hunyuanvideo-13b": "hunyuanvideo",
           "cogvideox-2b": "cogvideox", "cogvideox-5b": "cogvideox"}
# presets whose diffusers class is not one of cpcourse.models' archs: built here (`_other`)
OTHER = {"mochi-1": "MochiTransformer3DModel", "ltx-video-2b": "LTXVideoTransformer3DModel",
         "ltx-video-13b": "LTXVideoTransformer3DModel",
         "cosmos-1.0-diffusion-7b": "CosmosTransformer3DModel",
         "cosmos-1.0-diffusion-14b": "CosmosTransformer3DModel",
         "cosmos-predict2-2b": "CosmosTransformer3DModel",
         "cosmos-predict2-14b": "CosmosTransformer3DModel",
         # Open-Sora 2.0's MMDiT (opensora/models/mmdit/model.py) is Flux's block structure:
         # 19 double- and 38 single-stream blocks of 3072, T5 512 tokens joined, CLIP-L pooled
         "open-sora-2.0-768px": "FluxTransformer2DModel",
         "open-sora-2.0-256px": "FluxTransformer2DModel"}
T5_DIM = 4096  # T5-XXL's width (Mochi, LTX-Video, Open-Sora 2.0)
COSMOS_TEXT_DIM = 1024  # diffusers' default text_embed_dim for Cosmos (cross-attention only)
aten = torch.ops.aten
ATTENTION = {aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_cudnn_attention.default,
             aten._scaled_dot_product_flash_attention_for_cpu.default}
# Linear layers reach these; on the meta device SDPA runs its math path, whose batched matmuls
# (bmm) are the attention the planner prices separately.
MATMUL = {aten.mm.default, aten.addmm.default}
ATTENTION_MATH = {aten.bmm.default, aten.baddbmm.default, aten._softmax.default}


def _nbytes(tree) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(tree)[0]
               if isinstance(t, torch.Tensor))


class ElementwiseBytes(TorchDispatchMode):
    """Bytes read and written by ops that run a kernel and are neither matmul nor attention.
    A view, or an op that hands back one of its inputs (a cast to the same dtype, dropout in
    eval), launches no kernel and counts nothing."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = tree_flatten((args, kwargs))[0]
        if (func in ATTENTION or func in MATMUL or func in ATTENTION_MATH or func.is_view
                or func in (aten.empty_like.default, aten.empty.memory_format)
                or any(o is i for o in tree_flatten(out)[0] for i in inputs)):
            return out
        self.total += _nbytes((args, kwargs)) + _nbytes(out)
        return out


def _other(model_id: str, frames: int):
    """(model, forward kwargs) of a preset in OTHER: diffusers' class at the preset's released
    sizes (the facts sheet's heads, head dim, layers, FFN width, latent channels) on the meta
    device, with one forward's inputs at `frames` and the default height and width."""
    import diffusers

    from cpcourse.planner.tokens import get_model, model_tokens

    m, tok = get_model(model_id), model_tokens(model_id, frames=frames)
    t, h, w = tok.latent_frames, tok.latent_height, tok.latent_width
    meta = torch.device("meta")
    rand = lambda *s: torch.empty(*s, device=meta, dtype=torch.bfloat16)  # noqa: E731
    cls, text = OTHER[model_id], rand(1, max(m.text_tokens, 1), T5_DIM)
    step = torch.full((1,), 500.0, device=meta)
    if cls == "MochiTransformer3DModel":
        cfg = dict(num_attention_heads=m.heads, attention_head_dim=m.head_dim,
                   num_layers=m.layers, in_channels=m.latent_channels)
        kw = dict(hidden_states=rand(1, m.latent_channels, t, h, w), encoder_hidden_states=text,
                  timestep=step, encoder_attention_mask=torch.ones(
                      1, m.text_tokens, dtype=torch.bool, device=meta))
    elif cls == "LTXVideoTransformer3DModel":
        cfg = dict(num_attention_heads=m.heads, attention_head_dim=m.head_dim,
                   num_layers=m.layers, cross_attention_dim=m.hidden,
                   in_channels=m.latent_channels, out_channels=m.latent_channels)
        kw = dict(hidden_states=rand(1, t * h * w, m.latent_channels), encoder_hidden_states=text,
                  timestep=step, encoder_attention_mask=torch.ones(1, m.text_tokens, device=meta),
                  num_frames=t, height=h, width=w, rope_interpolation_scale=(
                      m.vae_temporal / 30, m.vae_spatial, m.vae_spatial))
    elif cls == "CosmosTransformer3DModel":
        predict2 = "predict2" in model_id  # no learnable position embedding (Predict2 config)
        cfg = dict(num_attention_heads=m.heads, attention_head_dim=m.head_dim,
                   num_layers=m.layers, mlp_ratio=m.ffn / m.hidden,
                   in_channels=m.latent_channels + 2, out_channels=m.latent_channels,
                   text_embed_dim=COSMOS_TEXT_DIM, max_size=(128, 240, 240),
                   extra_pos_embed_type=None if predict2 else "learnable",
                   concat_padding_mask=False)
        # the padding-mask channel (resized by torchvision, not installed) comes in with the
        # latent: one more input channel to the patch embedding, as the released model has
        kw = dict(hidden_states=rand(1, m.latent_channels + 1, t, h, w), timestep=step,
                  encoder_hidden_states=rand(1, m.text_tokens, COSMOS_TEXT_DIM), fps=24,
                  condition_mask=rand(1, 1, t, h, w))
    else:  # Flux's class at Open-Sora 2.0's MMDiT sizes: 2x2 patches packed into channels
        double = 19  # facts sheet: "19 double-stream + 38 single-stream"
        cfg = dict(num_layers=double, num_single_layers=m.layers - double,
                   num_attention_heads=m.heads, attention_head_dim=m.head_dim,
                   in_channels=m.latent_channels * 4, joint_attention_dim=T5_DIM,
                   pooled_projection_dim=768, guidance_embeds=False)
        n = tok.video_tokens
        kw = dict(hidden_states=rand(1, n, m.latent_channels * 4), encoder_hidden_states=text,
                  pooled_projections=rand(1, 768), timestep=step,
                  img_ids=torch.zeros(n, 3, device=meta),
                  txt_ids=torch.zeros(m.text_tokens, 3, device=meta))
    with meta:
        model = getattr(diffusers, cls)(**cfg)
    if cls == "MochiTransformer3DModel":  # its rotary math asks for autocast on the tensors'
        model.rope._create_rope = _mochi_rope  # device, which meta refuses: same math, in fp32
    return model.to(torch.bfloat16).eval().requires_grad_(False), kw


def _mochi_rope(freqs: torch.Tensor, pos: torch.Tensor):
    freqs = torch.einsum("nd,dhf->nhf", pos.float(), freqs.float())
    return torch.cos(freqs), torch.sin(freqs)


def count(model_id: str, arch: str, frames: int) -> dict:
    """Matmul FLOPs and element-wise bytes of one bf16 forward at `frames` (default size)."""
    import sys

    if str(ROOT) not in sys.path:  # run as a script: the checkout holds tools/gpu_check
        sys.path.insert(0, str(ROOT))
    from cpcourse.planner.tokens import model_tokens
    from tools.gpu_check.models import build_real, real_inputs

    if arch == "other":
        model, inputs = _other(model_id, frames)
    else:
        model = build_real(model_id, arch, torch.device("meta"))
        inputs = real_inputs(model_id, arch, frames, "meta", torch.bfloat16)
    flops, moved = FlopCounterMode(display=False), ElementwiseBytes()
    from torch.fx.experimental import _config as fx_config

    # Mochi picks the prompt's unmasked tokens with nonzero(); every token here is unmasked
    with torch.inference_mode(), flops, moved, fx_config.patch(
            meta_nonzero_assume_all_nonzero=True):
        model(**inputs, return_dict=False)
    by_op = flops.get_flop_counts()["Global"]
    matmul = sum(v for op, v in by_op.items() if op in {m.overloadpacket for m in MATMUL})
    return {"tokens": model_tokens(model_id, frames=frames).sequence_length,
            "matmul_flops": int(matmul), "elementwise_bytes": int(moved.total)}


def _quarter_frames(model_id: str) -> int:
    """The first frame count at or above a quarter of the default's latent frames that the
    preset's frame rule accepts (CogVideoX: 8n + 1, Wan: 4n + 1)."""
    from cpcourse.planner.tokens import get_model, model_tokens
    from cpcourse.support.errors import InputError

    m = get_model(model_id)
    frames = (model_tokens(model_id).latent_frames - 1) // 4 * m.vae_temporal + 1
    while True:
        try:
            model_tokens(model_id, frames=frames)
            return frames
        except InputError:
            frames += 1


def derive(model_id: str, arch: str) -> dict:
    """Solve the two lines through the counts at the default length and about a quarter of it."""
    from cpcourse.planner.tokens import get_model

    long = count(model_id, arch, get_model(model_id).default_frames)
    short = count(model_id, arch, _quarter_frames(model_id))
    dn = long["tokens"] - short["tokens"]
    out = {"arch": arch, "points": [short, long]}
    for key, name in (("matmul_flops", "matmul_flops"), ("elementwise_bytes", "elementwise_bytes")):
        per = (long[key] - short[key]) / dn
        out[f"{name}_per_token"] = per
        out[f"{name}_fixed"] = long[key] - per * long["tokens"]
    return out


def main(argv: list[str] | None = None) -> int:
    from cpcourse.support.out_files import data_file_main

    return data_file_main(argv, "tools/derive_dit_costs.py", str(OUT), _text)


def _text() -> str:
    import diffusers

    data = {"about": __doc__.split("\n\n")[1].strip().replace("\n", " ") + " Sequence tokens N "
            "are video plus joined text (HunyuanVideo, CogVideoX); Wan's text enters by "
            "cross-attention and is in the fixed part.", "diffusers": diffusers.__version__,
            "models": {mid: derive(mid, arch) for mid, arch in PRESETS.items()}}
    for mid, cls in OTHER.items():
        data["models"][mid] = {**derive(mid, "other"), "class": cls}
    for mid, d in data["models"].items():
        print(f"{mid:18s} {d['matmul_flops_per_token'] / 2e9:6.2f} B params a token meets, "
              f"{d['elementwise_bytes_per_token'] / 1e3:7.1f} kB element-wise per token")
    return json.dumps(data, indent=1) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
