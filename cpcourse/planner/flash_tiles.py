"""FlashAttention's tiling: what one thread block holds on chip, and what stays in HBM.

    python -m cpcourse.planner.flash_tiles        # FA2's tile sizes per head dim, one head's bytes

FlashAttention-2's forward kernel gives each thread block one block of `Br` query rows (the
code's kBlockM) and streams K and V through it in blocks of `Bc` rows (kBlockN), the loop of
`cpcourse.online_softmax.attention_v4_blockwise`. At any moment one thread block holds on chip:
    shared memory, input dtype:  Q_i [Br, D], K_j [Bc, D], V_j [Bc, D]   (FA2's kSmemSize)
    registers, float32:          S_ij = Q_i K_j^T [Br, Bc], the output accumulator O_i [Br, D],
                                 the running max m_i [Br] and running sum l_i [Br]
while one head's Q, K, V, O `[L, D]` (input dtype) and its lse `[L]` (float32) stay in HBM.
K and V are read from HBM once per query block; the `L x L` scores never leave the chip.
"""

from __future__ import annotations

import math

from cpcourse.planner.costs import memory
from cpcourse.support.dtypes import nbytes
from cpcourse.support.errors import InputError, positive_int

# Read from FlashAttention-2's own dispatch, csrc/flash_attn/src/flash_fwd_launch_template.h of
# Dao-AILab/flash-attention (commit 01afd16d248c4c7d0f9aed1914084f16c490eaed): run_mha_fwd_hdimD
# launches Flash_fwd_kernel_traits<D, kBlockM, kBlockN, warps>. These are the forward kernel's
# tiles without dropout and not causal. sm80 (A100) and sm90 (H100/H200) share them except at
# D = 256, where the code picks 64 x 64 when an SM's shared memory fits two such thread blocks
# (H100) and 128 x 64 otherwise (A100). (sm86/sm89 cards use 128 x 32 at D = 128; not listed.)
FA2_SOURCE = ("Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h "
              "(commit 01afd16), run_mha_fwd_hdim*: Flash_fwd_kernel_traits<D, kBlockM, kBlockN>,"
              " forward, no dropout, not causal")
_SM80 = {32: (128, 128), 64: (128, 128), 96: (128, 64), 128: (128, 64), 192: (128, 64),
         256: (128, 64)}
FA2_FORWARD_TILES = {"sm80": _SM80, "sm90": {**_SM80, 256: (64, 64)}}
ARCHS = {"a100": "sm80", "sm80": "sm80", "h100": "sm90", "h200": "sm90", "sm90": "sm90"}
ACC_BYTES = 4  # S, O, m and l are float32 in registers whatever the input dtype


def fa2_tiles(head_dim: int, arch: str = "sm80") -> tuple[int, int, int]:
    """(kernel head dim, Br, Bc) of FA2's forward kernel for `head_dim` on `arch` (sm80 = A100,
    sm90 = H100/H200). A head dim between two compiled ones runs the next larger kernel (its
    HEADDIM_SWITCH): 72 runs the 96 kernel."""
    head_dim = positive_int("head_dim", head_dim)
    if arch.lower() not in ARCHS:
        raise InputError(f"unknown arch {arch!r}: use one of {', '.join(ARCHS)}")
    table = FA2_FORWARD_TILES[ARCHS[arch.lower()]]
    kernel = next((d for d in sorted(table) if d >= head_dim), None)
    if kernel is None:
        raise InputError(f"FlashAttention-2 takes head dims up to {max(table)}, got {head_dim}")
    return (kernel, *table[kernel])


def working_set(length: int, head_dim: int, block_q: int, block_k: int, *,
                dtype: str = "bf16") -> dict:
    """Bytes of one head's tensors in HBM and of one thread block's tiles on chip.

    `rows`: one dict per tensor (`name`, `shape`, `where`: "HBM", "shared memory" or
    "registers", `bytes`), HBM first. Tiles are the kernel's full Br/Bc sizes (its buffers are
    allocated whole, even for a last, partial block). Totals: `hbm_bytes`, `shared_memory_bytes`
    (equal to FA2's kSmemSize), `register_bytes`, `on_chip_bytes`; `query_blocks` and
    `key_blocks` count the tiles along L; `kv_reads` is how many times K and V are read from HBM
    (once per query block); `score_matrix_bytes` is what naive attention would hold for this
    head (`costs.memory`).
    """
    length, head_dim = positive_int("length", length), positive_int("head_dim", head_dim)
    br, bc = positive_int("block_q", block_q), positive_int("block_k", block_k)
    b = nbytes(dtype)
    rows = [
        ("Q", f"[{length}, {head_dim}]", "HBM", length * head_dim * b),
        ("K", f"[{length}, {head_dim}]", "HBM", length * head_dim * b),
        ("V", f"[{length}, {head_dim}]", "HBM", length * head_dim * b),
        ("O", f"[{length}, {head_dim}]", "HBM", length * head_dim * b),
        ("lse", f"[{length}]", "HBM", length * ACC_BYTES),
        ("Q_i", f"[{br}, {head_dim}]", "shared memory", br * head_dim * b),
        ("K_j", f"[{bc}, {head_dim}]", "shared memory", bc * head_dim * b),
        ("V_j", f"[{bc}, {head_dim}]", "shared memory", bc * head_dim * b),
        ("S_ij", f"[{br}, {bc}]", "registers", br * bc * ACC_BYTES),
        ("O_i (accumulator)", f"[{br}, {head_dim}]", "registers", br * head_dim * ACC_BYTES),
        ("m_i", f"[{br}]", "registers", br * ACC_BYTES),
        ("l_i", f"[{br}]", "registers", br * ACC_BYTES),
    ]
    rows = [{"name": n, "shape": s, "where": w, "bytes": v} for n, s, w, v in rows]

    def total(*where: str) -> int:
        return sum(r["bytes"] for r in rows if r["where"] in where)

    query_blocks = math.ceil(length / br)
    return {
        "length": length, "head_dim": head_dim, "block_q": br, "block_k": bc, "dtype": dtype,
        "bytes_per_element": b, "rows": rows,
        "hbm_bytes": total("HBM"), "shared_memory_bytes": total("shared memory"),
        "register_bytes": total("registers"), "on_chip_bytes": total("shared memory", "registers"),
        "query_blocks": query_blocks, "key_blocks": math.ceil(length / bc),
        "kv_reads": query_blocks,
        "score_matrix_bytes": memory(length, head_dim, 1, dtype=dtype)[
            "attention_matrix_bytes_per_head"],
    }


if __name__ == "__main__":
    print(f"FlashAttention-2 forward tiles ({FA2_SOURCE}):")
    for arch, table in FA2_FORWARD_TILES.items():
        print(f"  {arch}: " + ", ".join(f"D={d}: {br} x {bc}" for d, (br, bc) in table.items()))
    kernel, br, bc = fa2_tiles(128)
    ws = working_set(119_056, 128, br, bc)
    for r in ws["rows"]:
        print(f"  {r['name']:18s} {r['shape']:>14s} {r['where']:14s} {r['bytes']:>14,} B")
    print(f"  on chip {ws['on_chip_bytes']:,} B, HBM {ws['hbm_bytes']:,} B")
