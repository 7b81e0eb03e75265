"""Where the text encoder lives while a video is made, and what each choice costs.

    cpcourse plan --model wan2.1-t2v-14b --gpus 8 --text-encoder freed

The text encoder (Wan's umT5-XXL, 5.7 B parameters; HunyuanVideo's LLaVA-LLaMA-3 8B) runs once
per video, before the first denoising step. Where it lives is a choice (`PLACES`), and each
costs something different:

    resident   it stays on every GPU through the denoise and the decode (diffusers' pipelines;
               Wan's and HunyuanVideo's multi-GPU runs): its weights in every phase's peak
    freed      loaded, encodes, freed before the denoise (Wan's --offload_model does this to it):
               only the encode phase holds it, and every video pays a reload of its weights from
               host memory over the GPU's PCIe link
    cpu        it runs on the CPU (Wan's --t5_cpu): no GPU bytes; the encode runs at the host
               CPUs' rate (`CPU_FLOPS`, the weakest number here: no CPU encode was timed)
    own-gpu    one more GPU holds it and encodes: no bytes on the N GPUs, seconds as on a GPU,
               and that GPU is counted in the GPU-seconds a video costs

The bytes themselves are counted phase by phase in `cpcourse.planner.pipeline_memory`; this
module prices the seconds.
"""

from __future__ import annotations

from cpcourse.planner.hardware import get_link
from cpcourse.support.errors import require

PLACES = ("resident", "freed", "cpu", "own-gpu")

# The host CPUs' fp32 peak: a DGX H100's 2 x Intel Xeon Platinum 8480C (NVIDIA DGX H100
# datasheet), 56 cores each at 2.0 GHz base, AVX-512 with two FMA units = 64 fp32 FLOP per
# cycle per core: 112 x 2.0e9 x 64. No encode on a CPU was timed, so the encode is priced at
# this peak: a fast figure (real runs reach a share of it; AMX bf16 would beat it).
CPU_FLOPS = 112 * 2.0e9 * 64
CPU_SOURCE = ("the host CPUs' fp32 AVX-512 peak (2 x Xeon Platinum 8480C, as in a DGX H100: "
              f"{CPU_FLOPS / 1e12:.1f} TFLOP/s); no CPU encode was timed")


def check_place(place: str) -> str:
    """`place` if it is one of PLACES; InputError naming the parameter otherwise."""
    require(place in PLACES, f"text_encoder must be one of {', '.join(PLACES)}, got {place!r}")
    return place


def encode_flops(params: float, text_tokens: int, prompts: int) -> float:
    """2 x parameters FLOPs per token, per prompt (two with a CFG pair)."""
    return 2 * params * text_tokens * prompts


def encode_cost(place: str, flops: float, gpu_rate: float, weights_bytes: float, gpu) -> dict:
    """Seconds once per video for the encoder at `place`: `flops` at the GPU's matmul rate
    (`gpu_rate`) or the CPU's, plus, when freed, the reload of `weights_bytes` (one GPU's share)
    over the GPU's host PCIe link. Keys: place, seconds, encode_seconds, reload_seconds,
    extra_gpus (1 for own-gpu), source."""
    check_place(place)
    on_cpu = place == "cpu"
    encode = flops / (CPU_FLOPS if on_cpu else gpu_rate) if flops else 0.0
    reload = 0.0
    source = CPU_SOURCE if on_cpu else "the GPU's matmul rate"
    if place == "freed" and weights_bytes:
        link = get_link(gpu.pcie)
        reload = weights_bytes / (link.effective_gbps * 1e9)
        source += f"; reload over {link.name} at {link.effective_gbps:.0f} GB/s"
    return {"place": place, "seconds": encode + reload, "encode_seconds": encode,
            "reload_seconds": reload, "extra_gpus": int(place == "own-gpu"), "source": source}
