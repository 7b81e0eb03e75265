"""GPUs and links, with their sources: what a ring step can compute and send.

    cpcourse comm --tokens 432000 --cp 8 --heads 32 --head-dim 128 --link nvlink4 --json

Peak figures are the vendors' (as tabulated in the facts sheet); each GPU and link also carries
the fraction of peak that is reached in practice, and where that fraction was measured, so a
reader can see every assumption the calculators make.

Each GPU names its own GPU-to-GPU link inside a node (`GPU.intra_link`): its NVLink, with that
GPU's own link count and bandwidth (H800 and A800 have 8 links, 400 GB/s both ways, not the
H100's 18 or the A100's 12), or PCIe Gen4 for the PCIe-only GPUs (L40S, L20, RTX 4090), whose
`GPU.nvlink` is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cpcourse.planner.facts import facts, gpu_measured
from cpcourse.planner.links import Link, get_link, links, nvlink_id  # noqa: F401 (re-exported)
from cpcourse.support.errors import InputError, did_you_mean, require


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    bf16_tflops: float  # dense peak
    hbm_gb: float  # decimal GB
    nvlink: str | None  # id of its NVLink in `links()`; None where the GPU has no NVLink
    pcie: str  # id of its host PCIe link in `links()`
    nic: str  # id of the InfiniBand NIC its systems pair with each GPU (NDR where none is named)
    sources: tuple[str, ...]
    arch: str  # ampere, hopper, ada or blackwell: the row of the attention-kernel table
    hbm_tbps: float  # memory bandwidth, TB/s (decimal)
    intra_link: str  # id in `links()` of its GPU-to-GPU link inside a node: NVLink, else PCIe

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gb * 1e9)

    @property
    def kernel(self) -> str:
        """The attention kernel every cpcourse time on this GPU assumes (`default_kernel`)."""
        return default_kernel(self.id)

    @property
    def attention_efficiency(self) -> float:
        """Share of peak that `kernel` reaches here (`kernel_efficiency`)."""
        return kernel_efficiency(self.id, self.kernel)[0]

    @property
    def efficiency_source(self) -> str:
        return kernel_efficiency(self.id, self.kernel)[1]

    def attention_flops(self, efficiency: float | None = None) -> float:
        """FLOP/s the default kernel (or one at `efficiency` of peak) reaches on this GPU."""
        return self.bf16_tflops * 1e12 * (self.attention_efficiency if efficiency is None
                                          else efficiency)

    def assumes(self) -> str:
        """The kernel and rate behind every time on this GPU, for a sentence:
        'FA2 at 35% of the H100's 989 TFLOP/s'."""
        return (f"{self.kernel.upper()} at {self.attention_efficiency:.0%} of the "
                f"{self.name}'s {self.bf16_tflops:g} TFLOP/s")


_ALIASES = {"a100": "a100-80gb-sxm", "h100": "h100-sxm", "h200": "h200-sxm",
            "a800": "a800-80gb-sxm", "4090": "rtx4090"}
KERNELS = ("fa2", "fa3", "sdpa", "fa4", "cudnn")
# the model whose sequence `cpcourse bench gpu` times the kernels at (Wan 14B, 720p)
RATE_MODEL_ARCH = "wan"


def _pcie_id(g: dict) -> str:
    return "pcie" + g["pcie"].removeprefix("Gen").split()[0]


@lru_cache(maxsize=1)
def gpus() -> dict[str, GPU]:
    """GPUs of the facts sheet by id (`get_gpu` also takes a100/h100/h200/a800/4090)."""
    f = facts()
    out = {}
    for g in f["hardware"]:
        nvlink = nvlink_id(g)
        out[g["id"]] = GPU(
            id=g["id"], name=g["name"], bf16_tflops=float(g["bf16_dense_tflops"]),
            hbm_gb=float(g["hbm_GB"]), nvlink=nvlink, pcie=_pcie_id(g),
            nic="ib-hdr" if "HDR" in g["nic"] else "ib-ndr",
            sources=tuple(g["sources"]), arch=g["arch"], hbm_tbps=float(g["hbm_TBps"]),
            intra_link=nvlink or g.get("intra_node_link") or _pcie_id(g),
        )
    return out


def same_die_run(gpu_id: str) -> dict | None:
    """The `cpcourse bench gpu` run that stands for this GPU: one on it, else one on a GPU of
    the same architecture and the same bf16 peak (the same die at the same clocks: the H100
    SXM, H800 and H200 are one GH100 at 989 TFLOP/s; the H20's die is cut to 148 and is not
    one of them), or None. A share of peak is the die's and the software's, not the memory's."""
    g, runs = get_gpu(gpu_id), gpu_measured()
    if g.id in runs:
        return runs[g.id]
    return next((run for gid, run in runs.items() if get_gpu(gid).arch == g.arch
                 and get_gpu(gid).bf16_tflops == g.bf16_tflops), None)


def measured_kernel_share(gpu_id: str, kernel: str) -> tuple[float, str] | None:
    """(share of bf16 peak, source) of `kernel` as `cpcourse bench gpu` measured it on this GPU
    or one of the same die (`same_die_run`) at Wan 14B's 720p sequence (40 heads of 128,
    75,600 tokens), or None. "fa2" is SDPA's flash kernel (FlashAttention-2); "sdpa" is
    whichever kernel SDPA chose there for an unmasked attention (cuDNN's on an H200 with torch
    2.11: so SDPA on an H100 with the same torch is cuDNN's rate too, one rate per die and
    software); "cudnn" is SDPA's cuDNN backend. FA3 and FA4 were not installed: not
    measured."""
    run = same_die_run(gpu_id)
    if run is None or kernel not in ("fa2", "sdpa", "cudnn"):
        return None
    backend = {"fa2": "sdpa-flash", "cudnn": "sdpa-cudnn"}.get(kernel) or next(
        (m["sdpa_backend"] for m in run.get("models", []) if m.get("arch") == RATE_MODEL_ARCH),
        None)
    row = next((r for r in run.get("kernels", {}).get("rates", [])
                if r["backend"] == backend and r["shape"] == "full" and "share_of_peak" in r),
               None)
    if row is None:
        return None
    p = run["provenance"]
    on = "" if p.get("gpu_id") == get_gpu(gpu_id).id else (
        f" on the same die as the {get_gpu(gpu_id).name}")
    return row["share_of_peak"], (f"measured{on}: {backend} at {row['tokens']:,} tokens, "
                                  f"{row['heads']} heads of {row['head_dim']}, on one {p['gpu']} "
                                  f"(torch {p['torch']}, {p['date'][:10]}; "
                                  "cpcourse/data/gpu_measured_h200.json)")


def kernel_efficiency(gpu_id: str, kernel: str) -> tuple[float | None, str]:
    """(share of bf16 peak, source) that attention kernel `kernel` reaches on the GPU.

    This course's own measurement on that GPU or its die if there is one
    (`measured_kernel_share`), else a
    published one on that GPU (the facts sheet's calculator_defaults.attention_kernels.by_gpu),
    else its architecture's value; None where the kernel does not run there (FA3 outside
    Hopper), with the reason as the source.
    """
    g = get_gpu(gpu_id)
    k = kernel.lower()
    if k not in KERNELS:
        raise InputError(f"unknown attention kernel {kernel!r}: use one of {', '.join(KERNELS)}")
    mine = measured_kernel_share(g.id, k)
    if mine is not None:
        return mine
    table = facts()["calculator_defaults"]["attention_kernels"]
    hit = table["by_gpu"].get(g.id, {}).get(k) or table["efficiency"][k][g.arch]
    if hit is None:
        return None, table["null_reasons"][k][g.arch]
    return float(hit["value"]), hit["source"]


# Dao-AILab/flash-attention README, "Installation and features": "FlashAttention-2 with CUDA
# currently supports: Ampere, Ada, or Hopper GPUs". On Blackwell it falls back to its Ampere
# code at 17% of peak (flash-attention issue #1589), which no engine ships.
FA2_ARCHS = ("ampere", "ada", "hopper")


def default_kernel(gpu_id: str) -> str:
    """The attention kernel that every time cpcourse computes for this GPU assumes (notebooks,
    `cpcourse comm`, `cpcourse plan --kernel auto`): FlashAttention-2, the kernel the models'
    released code installs (flash-attn 2 in Wan's and HunyuanVideo's requirements), on the
    generations flash-attn 2 supports (`FA2_ARCHS`: Ampere, Ada, Hopper); on a newer one, the
    generation's kernel (`generation_kernel`: FA4 on Blackwell); PyTorch's SDPA where neither
    has a rate.

    Why not FA3 on Hopper, the fastest kernel there (70% of an H100's peak against FA2's 35%)?
    The released code of the published runs requires flash-attn 2 (Wan's and HunyuanVideo's
    requirements; xDiT's L20 runs name flash-attn 2.7.2). Said plainly: the choice was kept
    while the validation errors were visible (with FA3 every Hopper run comes out 1.3-2.3x too
    fast), so it is not independent of them; `cpcourse plan --validate` says so. Blackwell's
    default moved from FA2 to FA4 after TensorRT-LLM blog 28's B200 run (kernel unnamed) came
    out 2.7x too slow under FA2, on the grounds above (flash-attn 2 does not support the
    generation), so that run no longer counts as held out. FA3 stays one `kernel=` away, and
    notebook 05 shows what it changes: twice the rate needs twice the tokens per GPU to hide a
    ring hop.
    """
    if get_gpu(gpu_id).arch in FA2_ARCHS and kernel_efficiency(gpu_id, "fa2")[0]:
        return "fa2"
    kernel, _ = generation_kernel(gpu_id)
    return kernel if kernel_efficiency(gpu_id, kernel)[0] else "sdpa"


def generation_kernel(gpu_id: str) -> tuple[str, str]:
    """(kernel, source): the attention kernel a current deployment on this GPU's generation
    uses when a run does not name one (facts sheet attention_kernels.by_generation): FA2 on
    Ampere and Ada, FA3 on Hopper, FA4 on Blackwell. `default_kernel` stays FA2 wherever FA2
    runs; this is the other assumption, for runs made with today's engines."""
    row = facts()["calculator_defaults"]["attention_kernels"]["by_generation"][get_gpu(gpu_id).arch]
    return row["kernel"], row["source"]


def sdpa_by_torch() -> list[dict]:
    """Which kernel PyTorch's SDPA runs, by torch version and GPU generation, each row sourced
    (facts sheet attention_kernels.sdpa_by_torch)."""
    return facts()["calculator_defaults"]["attention_kernels"]["sdpa_by_torch"]["rows"]


def get_gpu(gpu_id: str) -> GPU:
    table = gpus()
    require(isinstance(gpu_id, str), f"gpu must be an id (a string) such as 'h100', got "
            f"{gpu_id!r}")
    key = _ALIASES.get(gpu_id.lower(), gpu_id.lower())
    if key not in table:
        guess = did_you_mean(gpu_id, [*table, *_ALIASES])
        raise InputError(f"unknown GPU {gpu_id!r}: {guess}use one of {', '.join(table)} "
                         f"(or {', '.join(_ALIASES)})")
    return table[key]


def link_for(span: int, gpus_per_node: int, gpu: GPU) -> Link:
    """The link a group of `span` consecutive ranks crosses: the GPU's own inside a node, its
    InfiniBand NIC across nodes."""
    return get_link(gpu.intra_link if span <= gpus_per_node else gpu.nic)


def copy_efficiency() -> tuple[float, str]:
    """(share of HBM bandwidth, source) that memory-bound work reaches: a device-to-device copy
    as `cpcourse bench gpu` measured it (read plus write bytes over the datasheet's bandwidth).
    One H200's figure stands for every GPU: no other was measured."""
    gid, run = next(iter(gpu_measured().items()))
    copy = run["kernels"]["copy"]
    share = copy["tbps"] / get_gpu(gid).hbm_tbps
    return share, (f"measured: a {copy['bytes'] / 1e9:.1f} GB device-to-device copy at "
                   f"{copy['tbps']:.2f} TB/s on one {run['provenance']['gpu']} "
                   "(cpcourse/data/gpu_measured_h200.json)")
