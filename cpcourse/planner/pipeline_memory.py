"""What a video pipeline holds on one GPU besides the transformer: the text encoder, the VAE and
the VAE decode's working set, phase by phase.

    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --gpu h800 --layout ulysses=8 --fsdp --released

A pipeline runs in three phases and a GPU's peak is the largest of them:
    encode    the text encoder runs
    denoise   the transformer's steps: its weights, activations and buffers
    (cpcourse.planner.deployment) decode    the VAE turns latents into frames: its weights and its
    working set, on the GPUs
              that decode (Wan: rank 0 only; HunyuanVideo: every rank), so on the busiest GPU
What stays on the GPU through the phases is how the pipeline is run (`Residency`):
    resident          everything stays (diffusers' pipelines; Wan's and HunyuanVideo's
                      multi-GPU runs)
    offload           the text encoder comes to the GPU only to encode and the transformer leaves
                      before the decode (Wan's --offload_model True, its default on one GPU)
    text_encoder      where the text encoder lives, one of `cpcourse.planner.text_encoder.PLACES`:
                      resident, freed (encodes, then leaves), cpu (Wan's --t5_cpu; the older
                      `text_encoder_cpu=True` says the same), own-gpu (a GPU of its own)
With `vae_ranks` > 1 the decode is split over that many GPUs (`cpcourse.planner.parallel_vae`)
and each holds its share of the working set.
Under FSDP the text encoder's weights are sharded over the GPUs as the transformer's are (Wan's
README runs --dit_fsdp with --t5_fsdp).
Bytes per parameter: bf16 everywhere by default; `released=True` takes the released code's own
(the facts sheet's `released_bytes_per_param`, with its source: Wan keeps its transformer in
float32 and autocasts to bf16, and decodes in float32).
The decode's working set is derived from diffusers' VAE classes in the dtype and tiling each
released code decodes with (tools/derive_vae_memory.py -> data/vae_memory_table.json) and
scaled to the dtype asked for. A model whose text encoder or VAE the course has no size for
counts nothing for it (`counted` says which parts were). Never counted: the CUDA context,
NCCL's buffers, the allocator's cache and fragmentation, which a measured peak includes.
"""

from __future__ import annotations

from dataclasses import dataclass

from cpcourse.planner.facts import vae_memory_table
from cpcourse.planner.fixed_costs import vae_family
from cpcourse.planner.parallel_vae import working_share
from cpcourse.planner.text_encoder import check_place
from cpcourse.planner.tokens import ModelPreset, as_preset
from cpcourse.support.dtypes import nbytes
from cpcourse.support.errors import require

BF16 = nbytes("bf16")


@dataclass(frozen=True)
class Residency:
    """How the pipeline is run (see the module docstring). `text_encoder` None takes the place
    the other two fields imply: cpu with `text_encoder_cpu`, freed with `offload`, else
    resident."""
    offload: bool = False
    text_encoder_cpu: bool = False
    text_encoder: str | None = None

    def __post_init__(self):
        if self.text_encoder is None:
            return
        place = check_place(self.text_encoder)
        require(not self.text_encoder_cpu or place == "cpu", f"text_encoder {place} and "
                "text_encoder_cpu disagree: give one of them")
        require(not self.offload or place != "resident", "text_encoder resident and offload "
                "disagree: offloading frees the text encoder after it encodes")

    @property
    def place(self) -> str:
        """Where the text encoder lives: one of `cpcourse.planner.text_encoder.PLACES`."""
        if self.text_encoder is not None:
            return self.text_encoder
        return "cpu" if self.text_encoder_cpu else "freed" if self.offload else "resident"


RESIDENT = Residency()  # everything stays on the GPU


def released_bytes(model: ModelPreset | str) -> tuple[tuple[int, int, int], str | None]:
    """((transformer, text encoder, VAE) bytes per parameter, source) of the released code;
    bf16 with no source for a model whose code the course has not read."""
    return as_preset(model).released_dtypes or ((BF16, BF16, BF16), None)


def text_encoder_params(model: ModelPreset | str) -> float:
    """The text encoder's parameters (the facts sheet's `text_encoder_params`), 0 if unknown."""
    enc = as_preset(model).text_encoder
    return enc[0] if enc else 0.0


def vae_params(model: ModelPreset | str) -> int:
    fam = vae_family(model)
    return vae_memory_table()[fam]["params"] if fam in vae_memory_table() else 0


def decode_working_bytes(model: ModelPreset | str, tok, elem_bytes: int) -> float | None:
    """Peak bytes a decode of `tok`'s latent video holds beyond the VAE's weights, in
    `elem_bytes`-byte elements; None when the model's VAE was not derived."""
    fam = vae_family(model)
    if fam not in vae_memory_table():
        return None
    v = vae_memory_table()[fam]
    c = v["peak_bytes"]
    t, hw = tok.latent_frames, tok.latent_height * tok.latent_width
    derived = c["constant"] + c["per_frame_pixel"] * hw + c["per_video_pixel"] * t * hw
    return derived * elem_bytes / nbytes(v["dtype"])


def phases(model: ModelPreset | str, tok, *, transformer: float, loop: float, shards: int,
           released: bool, residency: Residency, vae_ranks: int = 1) -> dict:
    """Bytes on the busiest GPU per phase, and the parts: `transformer` is its weights on one
    GPU (already at the dtype and sharding asked for), `loop` the denoising loop's
    activations and buffers, `shards` how many GPUs share the text encoder (FSDP) or 1,
    `vae_ranks` how many GPUs share the decode (1: it runs whole on one)."""
    model = as_preset(model)
    (_, te_b, vae_b), _ = released_bytes(model) if released else ((BF16,) * 3, None)
    weights = text_encoder_params(model) * te_b / shards
    te = weights if residency.place in ("resident", "freed") else 0.0
    vae = vae_params(model) * vae_b
    derived = decode_working_bytes(model, tok, vae_b)
    share = working_share(model, tok, vae_ranks) if vae_ranks > 1 else 1.0
    work = (derived or 0.0) * share
    stays = te if residency.place == "resident" else 0.0  # through the later phases
    parts = {"encode": {"weights": transformer, "text_encoder": te, "vae": vae},
             "denoise": {"weights": transformer, "text_encoder": stays, "vae": vae,
                         "loop": loop},
             "decode": {"weights": 0.0 if residency.offload else transformer,
                        "text_encoder": stays, "vae": vae, "vae_decode": work}}
    return {"phases": {k: int(sum(v.values())) for k, v in parts.items()},
            "parts": {k: {n: int(b) for n, b in v.items() if b} for k, v in parts.items()},
            "text_encoder": int(te), "text_encoder_weights": int(weights),
            "text_encoder_place": residency.place, "vae_elem_bytes": vae_b, "vae": int(vae),
            "vae_decode": int(work),
            "counted": {"text_encoder": text_encoder_params(model) > 0,
                        "vae": vae_params(model) > 0,
                        "vae_decode": derived is not None}}
