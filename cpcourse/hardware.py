"""GPUs and links, with their sources: what a ring step can compute and send.

    cpcourse comm --tokens 432000 --cp 8 --heads 32 --head-dim 128 --link nvlink4 --json

Peak figures are the vendors' (as tabulated in the facts sheet); each GPU and link also carries
the fraction of peak that is reached in practice, and where that fraction was measured, so a
reader can see every assumption the calculators make.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cpcourse.support.errors import InputError
from cpcourse.tokens import facts


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    bf16_tflops: float  # dense peak
    hbm_gb: float  # decimal GB
    nvlink: str  # id of its NVLink generation in `links()`
    pcie: str  # id of its host PCIe link in `links()`
    nic: str  # id of the InfiniBand NIC its reference systems pair with each GPU
    attention_efficiency: float  # achievable share of peak for fused attention kernels
    efficiency_source: str
    sources: tuple[str, ...]

    @property
    def hbm_bytes(self) -> int:
        return int(self.hbm_gb * 1e9)

    def attention_flops(self, efficiency: float | None = None) -> float:
        """FLOP/s a fused attention kernel reaches on this GPU."""
        return self.bf16_tflops * 1e12 * (self.attention_efficiency if efficiency is None
                                          else efficiency)


@dataclass(frozen=True)
class Link:
    id: str
    name: str
    gbps_per_direction: float  # GB/s, decimal, line rate one way
    efficiency: float  # share of line rate that NCCL-style traffic reaches
    source: str

    @property
    def effective_gbps(self) -> float:
        return self.gbps_per_direction * self.efficiency


# Which attention-kernel efficiency of the facts sheet's calculator_defaults applies to each GPU.
_EFFICIENCY_KEY = {"a100-80gb-sxm": "a100_fa2", "h100-sxm": "hopper_fa3",
                   "h200-sxm": "hopper_fa3", "b200": "b200"}
_ALIASES = {"a100": "a100-80gb-sxm", "h100": "h100-sxm", "h200": "h200-sxm"}


@lru_cache(maxsize=1)
def gpus() -> dict[str, GPU]:
    """GPUs of the facts sheet by id (aliases a100/h100/h200 also accepted by `get_gpu`)."""
    f = facts()
    eff = f["calculator_defaults"]["attention_efficiency"]
    out = {}
    for g in f["hardware"]:
        key = _EFFICIENCY_KEY[g["id"]]
        out[g["id"]] = GPU(
            id=g["id"], name=g["name"], bf16_tflops=float(g["bf16_dense_tflops"]),
            hbm_gb=float(g["hbm_GB"]), nvlink=f"nvlink{g['nvlink_gen']}",
            pcie="pcie" + g["pcie"].removeprefix("Gen").split()[0],
            nic="ib-hdr" if "HDR" in g["nic"] else "ib-ndr",
            attention_efficiency=float(eff[key]),
            efficiency_source=f"facts sheet calculator_defaults.attention_efficiency.{key}",
            sources=tuple(g["sources"]),
        )
    return out


@lru_cache(maxsize=1)
def links() -> dict[str, Link]:
    """Interconnects by id: NVLink 3/4/5 per GPU, PCIe 4/5 x16, InfiniBand NDR/HDR per NIC."""
    f = facts()
    nv_eff = float(f["calculator_defaults"]["nvlink_efficiency"])
    out: dict[str, Link] = {}
    for g in f["hardware"]:
        lid = f"nvlink{g['nvlink_gen']}"
        out.setdefault(lid, Link(
            lid, f"NVLink {g['nvlink_gen']} ({g['nvlink_links']} links)",
            float(g["nvlink_GBps_per_dir"]), nv_eff,
            "line rate: " + g["sources"][0] + "; efficiency: facts calculator_defaults "
            "nvlink_efficiency (H100 NCCL ~370 of 450 GB/s, nccl-tests #212)"))
    lk = f["links"]
    ndr_eff = float(f["calculator_defaults"]["ib_ndr_effective_GBps"]) / lk["ib_ndr_400"][
        "GBps_per_dir"]
    pcie_eff = lk["pcie5_x16"]["measured_h2d_GBps"] / lk["pcie5_x16"]["GBps_per_dir"]
    hdr = lk["ib_hdr_200"]
    out["pcie4"] = Link("pcie4", "PCIe Gen4 x16", lk["pcie4_x16"]["GBps_per_dir"], pcie_eff,
                        "16 GT/s x16 128b/130b; efficiency as measured on PCIe5 (H200 H2D 55.4/63,"
                        " ml-engineering network/README.md)")
    out["pcie5"] = Link("pcie5", "PCIe Gen5 x16", lk["pcie5_x16"]["GBps_per_dir"], pcie_eff,
                        "32 GT/s x16 128b/130b; H200 H2D 55.4 GB/s measured (ml-engineering)")
    out["ib-ndr"] = Link("ib-ndr", "InfiniBand NDR 400 (1 NIC per GPU)",
                         lk["ib_ndr_400"]["GBps_per_dir"], ndr_eff,
                         "400 Gb/s / 8; 46-48 GB/s in nccl-tests #290")
    out["ib-hdr"] = Link("ib-hdr", "InfiniBand HDR 200 (1 NIC per GPU)", hdr["GBps_per_dir"],
                         hdr["achievable_GBps"] / hdr["GBps_per_dir"],
                         "200 Gb/s / 8; ~24 GB/s measured (NVIDIA/nccl #412)")
    return out


def get_gpu(gpu_id: str) -> GPU:
    table = gpus()
    key = _ALIASES.get(gpu_id.lower(), gpu_id.lower())
    if key not in table:
        raise InputError(f"unknown GPU {gpu_id!r}: use one of {', '.join(table)} "
                         f"(or {', '.join(_ALIASES)})")
    return table[key]


def get_link(link_id: str) -> Link:
    table = links()
    key = link_id.lower().replace("_", "-")
    key = {"ndr": "ib-ndr", "hdr": "ib-hdr", "infiniband": "ib-ndr", "ib": "ib-ndr",
           "nvlink": "nvlink4"}.get(key, key)
    if key not in table:
        raise InputError(f"unknown link {link_id!r}: use one of {', '.join(table)}, "
                         "or give --bandwidth GBps")
    return table[key]
