"""What a video costs outside the denoising loop: the VAE decode and the text encoder.

Both run once per video, and neither is divided by the GPUs that share the denoising loop in the
code that made the published runs, so they are the serial part of Amdahl's law:
  - Wan2.1 decodes on rank 0 only (wan/text2video.py: `if self.rank == 0: videos =
    self.vae.decode(x0)`), the others wait;
  - HunyuanVideo decodes the whole video on every rank (hyvideo/diffusion/pipelines/
    pipeline_hunyuan_video.py calls `self.vae.decode` with no rank test; xDiT's diffusers script
    asserts 'parallel VAE not implemented for HunyuanVideo').

VAE decode: a roofline (`decode_roofline`), the longer of FLOPs over peak x a convolution's
share and bytes over HBM bandwidth, both rates read from timed decodes (below). `vae_share`, the
older rule (FLOPs / (peak x share), a share carried between GPUs), stays for comparison: it
carries the H20's compute-bound 16% to an H100 whose decode is memory-bound (too fast).
The FLOPs are counted from diffusers' own VAE class on the meta device
(tools/derive_vae_flops.py -> data/vae_decode_flops.json). The share is not the matmul rate:
a decode is 3D convolutions, group norms, pads and upsampling on huge activations, and published
decode times show it reaching 10-16% of the bf16 peak. data/vae_decode_measured.json
holds those times (each a whole decode on one GPU, timed by its source); the share of each is
    share = FLOPs(model, frames, height, width) / (seconds x bf16 peak of that GPU)
and a GPU takes, in order: the share measured for that VAE family on that GPU, else on its
architecture, else any family's on that GPU, else on its architecture, else the median of all
(no decode on Ampere or Ada GPUs was found timed: they take the median). A measurement on the H20
stands for the H20 alone: its bf16 peak is cut to 148 of a Hopper's 989 TFLOP/s, so a share of
its peak is not a Hopper's, nor a Hopper's share the H20's (as the attention kernels' by_gpu
entries; data file: stands_for).
The median of a handful of decodes on other software (sglang) is the weakest number in the
planner; the source is returned with it.

Text encoder: 2 x parameters FLOPs per token, per prompt (two prompts with a CFG pair), at the
matmul rate (milliseconds), or as its place prices it (`cpcourse.planner.text_encoder`: a
reload when freed, the CPU's rate on the CPU). With `vae_ranks` > 1 the decode is split
(`cpcourse.planner.parallel_vae`) and only its link time stays serial.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from cpcourse.planner import uncertainty
from cpcourse.planner.facts import vae_flops_table, vae_measurements
from cpcourse.planner.hardware import copy_efficiency, get_gpu
from cpcourse.planner.parallel_vae import parallel_decode
from cpcourse.planner.text_encoder import encode_cost, encode_flops
from cpcourse.planner.tokens import ModelPreset, as_preset, model_tokens


def vae_family(model: ModelPreset | str) -> str | None:
    """The VAE the decode tables know `model`'s by (the facts sheet's `vae_family`)."""
    return as_preset(model).vae_family


def vae_decode_flops(model: ModelPreset | str, latent_frames: int,
                     latent_pixels: int) -> float | None:
    """FLOPs of decoding the whole latent video, None when the model's VAE is not counted."""
    family = vae_family(model)
    if family is None:
        return None
    per = vae_flops_table()[family]["flops_per_latent_pixel"]
    f9, f17 = per["9"], per["17"]
    per_pixel = f9 * latent_frames / 9 if latent_frames < 9 else f9 + (f17 - f9) / 8 * (
        latent_frames - 9)
    return per_pixel * latent_pixels


def measured_share(m: dict) -> float:
    """The share of its GPU's bf16 peak that one measured decode reached."""
    tok = model_tokens(m["model"], m["height"], m["width"], m["frames"])
    flops = vae_decode_flops(m["model"], tok.latent_frames, tok.latent_height * tok.latent_width)
    return flops / (m["seconds"] * get_gpu(m["gpu"]).bf16_tflops * 1e12)


def vae_share(model: ModelPreset | str, gpu_id: str) -> tuple[float, str]:
    """(share of bf16 peak, where it comes from) for this model's VAE decode on this GPU."""
    g, fam = get_gpu(gpu_id), vae_family(model)
    rows = [(m, get_gpu(m["gpu"]), measured_share(m)) for m in vae_measurements()]
    rows_arch = [r for r in rows if r[0]["stands_for"] == "arch"]
    # a GPU with a measurement of its own that stands for it alone takes no architecture's share
    alone = any(m["stands_for"] == "gpu" and mg.id == g.id for m, mg, _ in rows)

    def arch(m, mg):
        return not alone and m["stands_for"] == "arch" and mg.arch == g.arch

    tests = [("this VAE on this GPU", lambda m, mg: m["family"] == fam and mg.id == g.id),
             (f"this VAE on {g.arch}", lambda m, mg: m["family"] == fam and arch(m, mg)),
             ("another VAE on this GPU", lambda m, mg: mg.id == g.id),
             (f"another VAE on {g.arch}", arch)]
    for what, test in tests:
        hits = [(m, s) for m, mg, s in rows if test(m, mg)]
        if hits:
            share = statistics.median(s for _, s in hits)
            return share, f"{what}: " + "; ".join(m["source"].split(" ")[0] for m, _ in hits)
    share = statistics.median(s for _, _, s in rows_arch)
    return share, (f"no decode timed on {g.arch}: the median of the {len(rows_arch)} in "
                   "data/vae_decode_measured.json that stand for their architecture")


def _bytes_per_flop(m: dict) -> float:
    """Bytes per FLOP that a decode would move if its measured time were all memory traffic at
    a copy's share of its GPU's bandwidth: an upper bound on the decode's bytes per FLOP (a
    decode that was compute-bound moved fewer)."""
    tok = model_tokens(m["model"], m["height"], m["width"], m["frames"])
    flops = vae_decode_flops(m["model"], tok.latent_frames, tok.latent_height * tok.latent_width)
    return m["seconds"] * get_gpu(m["gpu"]).hbm_tbps * 1e12 * copy_efficiency()[0] / flops


def decode_roofline(model: ModelPreset | str, gpu_id: str, flops: float) -> dict:
    """The VAE decode's seconds on this GPU by a roofline: the longer of its FLOPs over peak x
    the share a decode reaches when compute-bound, and its bytes (FLOPs x bytes per FLOP) over
    HBM bandwidth x a copy's share. Both rates come from the timed decodes
    (data/vae_decode_measured.json), none a validation run:
      share          the largest share of peak a timed decode reached (the H20's 16%: its peak
                     is cut to 148 TFLOP/s while its 4 TB/s is kept, so its decode is
                     compute-bound, and that share is a convolution's, not a memory's)
      bytes per FLOP this VAE family's smallest `_bytes_per_flop` (the H200's: 4.8 TB/s under
                     989 TFLOP/s, where the decode is memory-bound), else the smallest of all
    The three timed decodes come back exactly (the H20 compute-bound, the two H200s
    memory-bound), and a share measured on one GPU is not carried to another whose FLOP:byte
    ratio differs. Edges (`cpcourse.planner.uncertainty`): fast, the largest share and the
    smallest bytes per FLOP of any family; slow, the smallest share and the largest family's.
    Keys: seconds, bound ("compute" or "memory"), share, bytes_per_flop, share_of_peak (the
    share of bf16 peak the decode runs at here), source."""
    g, fam = get_gpu(gpu_id), vae_family(model)
    ms = vae_measurements()
    shares = [measured_share(m) for m in ms]
    per_family: dict[str, float] = {}
    for m in ms:
        per_family[m["family"]] = min(per_family.get(m["family"], 1e9), _bytes_per_flop(m))
    beta_mid = per_family.get(fam, min(per_family.values()))
    share = uncertainty.pick(max(shares), max(shares), min(shares))
    beta = uncertainty.pick(beta_mid, min(per_family.values()), max(per_family.values()))
    compute_s = flops / (g.bf16_tflops * 1e12 * share)
    memory_s = flops * beta / (g.hbm_tbps * 1e12 * copy_efficiency()[0])
    secs = max(compute_s, memory_s)
    whose = "this VAE's" if fam in per_family else "no decode of this VAE timed: the smallest"
    return {"seconds": secs, "bound": "compute" if compute_s >= memory_s else "memory",
            "share": share, "bytes_per_flop": beta,
            "share_of_peak": flops / (secs * g.bf16_tflops * 1e12),
            "source": (f"roofline from {len(ms)} timed decodes (data/vae_decode_measured.json): "
                       f"{share:.0%} of peak when compute-bound, {beta:.3f} bytes per FLOP "
                       f"({whose}); here {'compute' if compute_s >= memory_s else 'memory'}-bound")}


@dataclass(frozen=True)
class OncePerVideo:
    """How the work done once per video runs: the text encoder's place
    (`cpcourse.planner.text_encoder`) and its weights on one GPU (what a freed encoder reloads),
    the GPUs the decode is split over (`cpcourse.planner.parallel_vae`), GPUs per node, and the
    decode's bytes per element."""

    text_encoder: str = "resident"
    text_encoder_bytes: float = 0.0
    vae_ranks: int = 1
    gpus_per_node: int = 8
    vae_elem_bytes: int = 2


def fixed_seconds(model: ModelPreset | str, tok, gpu_id: str, matmul_rate: float,
                  prompts: int, how: OncePerVideo = OncePerVideo()) -> dict:
    """Seconds once per video ({'vae_decode', 'text_encoder'}), where the VAE rate is from, and
    `serial_seconds`, the part that no number of GPUs shortens (Amdahl's s): the encoder, and the
    decode whole or, split over `how.vae_ranks` GPUs (`cpcourse.planner.parallel_vae`), its link
    time."""
    text_encoder, text_encoder_bytes, vae_ranks = (how.text_encoder, how.text_encoder_bytes,
                                                   how.vae_ranks)
    gpus_per_node, vae_elem_bytes = how.gpus_per_node, how.vae_elem_bytes
    g = get_gpu(gpu_id)
    model = as_preset(model)
    vae = vae_decode_flops(model, tok.latent_frames, tok.latent_height * tok.latent_width)
    roof = decode_roofline(model, g.id, vae) if vae else None
    share, source = (roof["share_of_peak"], roof["source"]) if roof else (None, None)
    serial_vae = roof["seconds"] if roof else 0.0
    split = (parallel_decode(model, tok, g.id, vae_ranks, gpus_per_node, serial_vae,
                             vae_elem_bytes) if vae_ranks > 1 else None)
    enc = model.text_encoder
    flops = encode_flops(enc[0], tok.text_tokens, prompts) if enc else 0.0
    te = encode_cost(text_encoder, flops, matmul_rate, text_encoder_bytes, g)
    seconds = {"vae_decode": split["seconds"] if split else serial_vae,
               "text_encoder": te["seconds"]}
    return {"seconds": seconds, "vae_flops": vae, "vae_share": share, "vae_source": source,
            "text_encoder": enc[1] if enc else None, "text_encoder_cost": te,
            "vae_serial_seconds": serial_vae, "parallel_vae": split,
            "serial_seconds": te["seconds"] + (split["link_seconds"] if split else serial_vae)}


def once_keys(once: dict, phase_parts: dict, pipeline: dict, gpus: int, total: float) -> dict:
    """A plan's keys for the decode and the text encoder, from `fixed_seconds`' answer `once`
    and `cpcourse.planner.pipeline_memory.phases`' (`pipeline`, its `phase_parts`): where each
    ran, seconds and bytes per GPU, the serial seconds (Amdahl's s) and the GPU-seconds a video
    of `total` seconds costs on `gpus` GPUs (an own-GPU encoder's included). A part with no
    size recorded (`pipeline["counted"]`) has null bytes and seconds: not counted."""
    split, te = once["parallel_vae"], once["text_encoder_cost"]
    enc = {**te, "bytes_per_gpu": phase_parts["encode"].get("text_encoder", 0),
           "bytes_through_denoise": phase_parts["denoise"].get("text_encoder", 0),
           "weights_bytes": pipeline["text_encoder_weights"]}
    counted = pipeline["counted"]
    if not counted["text_encoder"]:  # no size recorded: null, never a 0 that reads as a fact
        enc.update({k: None for k in ("bytes_per_gpu", "bytes_through_denoise", "weights_bytes",
                                      "seconds", "encode_seconds", "reload_seconds")})
    return {"vae_decode_seconds": once["seconds"]["vae_decode"] if once["vae_flops"] is not None
            else None, "vae_parallel": bool(split),
            "vae_halo_bytes": split["halo_bytes"] if split else 0,
            "vae_decode_working_bytes": pipeline["vae_decode"] if counted["vae_decode"] else None,
            "vae_decode": split,
            "text_encoder": enc, "serial_seconds": once["serial_seconds"],
            "gpu_seconds": (gpus + te["extra_gpus"]) * total}


# HunyuanVideo's own VAE (hyvideo/vae/autoencoder_kl_causal_3d.py) decodes in tiles: 32 latent
# pixels square (sample_size 256 over its 8x spatial compression) every 24 (overlap 0.25), and
# 16 + 1 latent frames (sample_tsize 64 over 4x) every 12.
HY_TILE, HY_TILE_STRIDE, HY_TILE_T, HY_TILE_T_STRIDE = 32, 24, 16, 12


def hunyuan_vae_mask_rows(latent_frames: int, latent_height: int, latent_width: int) -> int:
    """Rows that HunyuanVideo's own tiled decode fills one by one in a Python loop: its
    decoder's mid-block attention builds a causal mask per tile with `for i in range(seq_len):
    mask[i, :(i // n_hw + 1) * n_hw] = 0` (prepare_causal_attention_mask in
    hyvideo/vae/unet_causal_3d_blocks.py), seq_len = the tile's frames x height x width in
    latent pixels. Each row is a host-side indexing call and, on a GPU, a kernel launch: host
    time that no GPU shortens. Counted from the tiling above; diffusers' port builds the same
    mask without a loop."""
    def spans(n, tile, stride):
        return [min(tile, n - i) for i in range(0, n, stride)]

    frames = [min(HY_TILE_T + 1, latent_frames - i)
              for i in range(0, latent_frames, HY_TILE_T_STRIDE)]
    if latent_frames <= HY_TILE_T:  # no temporal tiling below one tile
        frames = [latent_frames]
    tiled = latent_height > HY_TILE or latent_width > HY_TILE
    hw = (sum(spans(latent_height, HY_TILE, HY_TILE_STRIDE))
          * sum(spans(latent_width, HY_TILE, HY_TILE_STRIDE))) if tiled else (
        latent_height * latent_width)
    return sum(frames) * hw
