"""The links between GPUs, with their sources: NVLink by generation, PCIe, InfiniBand.

    cpcourse comm --tokens 432000 --cp 8 --heads 32 --head-dim 128 --link nvlink4 --json

`links()` reads each interconnect of the facts sheet into a frozen `Link`: its line rate one way,
the share of it NCCL-style traffic reaches, and where both were measured. Each GPU's own NVLink
(`nvlink_id`) gets its own entry: H800 and A800 have 8 links, not the H100's 18 or the A100's 12.
`cpcourse.planner.hardware` gives each GPU its links and `link_for` picks the one a group crosses.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from cpcourse.planner.facts import facts
from cpcourse.support.errors import InputError, did_you_mean


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


def nvlink_id(g: dict) -> str | None:
    """Link id of a facts-sheet GPU's NVLink, or None where it has none."""
    if not g.get("nvlink_gen"):
        return None
    return g.get("intra_node_link") or f"nvlink{g['nvlink_gen']}"


@lru_cache(maxsize=1)
def links() -> dict[str, Link]:
    """Interconnects by id: each GPU's NVLink (nvlink3/4/5, and the 8-link nvlink4-h800 and
    nvlink3-a800), PCIe 4/5 x16, InfiniBand NDR/HDR per NIC."""
    f = facts()
    nv_eff = float(f["calculator_defaults"]["nvlink_efficiency"])
    out: dict[str, Link] = {}
    for g in f["hardware"]:
        lid = nvlink_id(g)
        if lid is None:
            continue
        gbps = float(g["nvlink_GBps_per_dir"])
        if lid in out:  # GPUs that share a link id must agree on its bandwidth
            if out[lid].gbps_per_direction != gbps:
                raise ValueError(f"facts sheet: {g['id']} gives {lid} {gbps} GB/s, another GPU "
                                 f"{out[lid].gbps_per_direction}")
            continue
        plain = lid == f"nvlink{g['nvlink_gen']}"
        out[lid] = Link(
            lid, f"NVLink {g['nvlink_gen']} ({g['nvlink_links']} links"
            + (")" if plain else f", {g['name']})"), gbps, nv_eff,
            "line rate: " + g["sources"][0] + "; efficiency: facts calculator_defaults "
            "nvlink_efficiency (H100 NCCL ~370 of 450 GB/s, nccl-tests #212)")
    lk = f["links"]
    ndr_eff = float(f["calculator_defaults"]["ib_ndr_effective_GBps"]) / lk["ib_ndr_400"][
        "GBps_per_dir"]
    pcie_eff = lk["pcie5_x16"]["measured_h2d_GBps"] / lk["pcie5_x16"]["GBps_per_dir"]
    hdr = lk["ib_hdr_200"]
    p2p = lk["pcie4_x16"]["measured_gpu_to_gpu"]
    out["pcie4"] = Link("pcie4", "PCIe Gen4 x16", lk["pcie4_x16"]["GBps_per_dir"],
                        max(p2p["allreduce_busbw_GBps"]) / lk["pcie4_x16"]["GBps_per_dir"],
                        "16 GT/s x16 128b/130b; efficiency measured GPU to GPU: "
                        + p2p["source"] + "; NCCL itself models Gen4 x16 at "
                        f"{p2p['nccl_model_GBps']:g} GB/s (" + p2p["nccl_model_source"] + ")")
    host = lk["pcie4_x16"]["without_p2p"]
    out["pcie4-host"] = Link("pcie4-host", "PCIe Gen4 x16 through host memory (no GPU P2P)",
                             lk["pcie4_x16"]["GBps_per_dir"],
                             host["ring_GBps"] / lk["pcie4_x16"]["GBps_per_dir"],
                             "NCCL's own ring figure for a stock 8x RTX 4090 box: "
                             + host["source"])
    out["pcie5"] = Link("pcie5", "PCIe Gen5 x16", lk["pcie5_x16"]["GBps_per_dir"], pcie_eff,
                        "32 GT/s x16 128b/130b; H200 H2D 55.4 GB/s measured (ml-engineering)")
    out["ib-ndr"] = Link("ib-ndr", "InfiniBand NDR 400 (1 NIC per GPU)",
                         lk["ib_ndr_400"]["GBps_per_dir"], ndr_eff,
                         "400 Gb/s / 8; 46-48 GB/s in nccl-tests #290")
    out["ib-hdr"] = Link("ib-hdr", "InfiniBand HDR 200 (1 NIC per GPU)", hdr["GBps_per_dir"],
                         hdr["achievable_GBps"] / hdr["GBps_per_dir"],
                         "200 Gb/s / 8; ~24 GB/s measured (NVIDIA/nccl #412)")
    return out


def get_link(link_id: str) -> Link:
    table = links()
    if not link_id:
        raise InputError(f"no link given: use one of {', '.join(table)}")
    key = link_id.lower().replace("_", "-")
    key = {"ndr": "ib-ndr", "hdr": "ib-hdr", "infiniband": "ib-ndr", "ib": "ib-ndr",
           "nvlink": "nvlink4"}.get(key, key)
    if key not in table:
        raise InputError(f"unknown link {link_id!r}: {did_you_mean(link_id, table)}use one of "
                         f"{', '.join(table)}, "
                         "or give `bandwidth_gbps`")
    return table[key]
