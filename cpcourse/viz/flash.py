"""FlashAttention's tiling drawn: one head's Q, K, V, O in HBM, and the tiles one block holds.

    python -m cpcourse.viz.flash artifacts    # writes the figure for D = 128, L = 119,056, bf16

Left: Q, K, V and O of one head, rows (tokens) down and columns (head dim) across, both to
scale, cut into FA2's query blocks (Br rows) and key/value blocks (Bc rows). The coloured tiles
are what one thread block holds at one moment: Q_i and O_i (query block i), K_j and V_j (key
block j), the score tile S_ij = Q_i K_j^T and the running max m_i and sum l_i of its rows.
Everything grey stays in HBM. Right: the bytes of every tensor and tile, from
`cpcourse.planner.flash_tiles.working_set`.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from cpcourse.planner.flash_tiles import fa2_tiles, working_set
from cpcourse.viz import fmt

PLACE_COLORS = {"HBM": "0.6", "shared memory": "C1", "registers": "C0"}
_SMEM, _REGS, _IDLE = PLACE_COLORS["shared memory"], PLACE_COLORS["registers"], "0.88"


def _blocks(ax, column: tuple[float, float], size: int, rows: int, length: int, name: str,
            hot: int, look: tuple[str, str]) -> None:
    """Row blocks of `size` from row 0 down to `rows` (the drawn window), in the column
    (x, width); block `hot` coloured and labelled, look = (color, label)."""
    (x, width), (color, label) = column, look
    for i, start in enumerate(range(0, rows, size)):
        n = min(size, length - start, rows - start)
        ax.add_patch(Rectangle((x, start), width, n, facecolor=color if i == hot else _IDLE,
                               edgecolor="white", lw=0.8, gid=f"{name}:{i}"))
        if i == hot:
            ax.text(x + width / 2, start + n / 2, label, ha="center", va="center", fontsize=8,
                    color="white", weight="bold")


def tiling_figure(ws: dict, query_block: int = 1, key_block: int = 2,
                  window_blocks: int = 8) -> Figure:
    """The tiling of `working_set(...)` `ws` and its bytes: the first `window_blocks` blocks of the
    larger tile size are drawn to scale (the rest of L is summarised below them), with query
    block `query_block` and key/value block `key_block` on chip."""
    L, D, br, bc = ws["length"], ws["head_dim"], ws["block_q"], ws["block_k"]
    rows = min(L, window_blocks * max(br, bc))
    i = min(query_block, (rows - 1) // br)
    j = min(key_block, (rows - 1) // bc)
    fig = Figure(figsize=(12, 5.4), layout="constrained")
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    gap = max(D, bc) / 2
    stat_w = max(D / 8, 4)
    by_name = {r["name"]: r for r in ws["rows"]}
    x = 0.0
    spans = {}
    for name, size, hot, label in (("Q", br, i, "Q_i"), ("K", bc, j, "K_j")):
        _blocks(left, (x, D), size, rows, L, name, hot, (_SMEM, label))
        spans[name] = x
        x += D + gap
    # S_ij = Q_i K_j^T: Br rows of block i, Bc columns (one per key of block j), in registers.
    s_rows = min(br, L - i * br)
    left.add_patch(Rectangle((x, i * br), bc, s_rows, facecolor=_REGS, edgecolor="white",
                             gid="S_ij"))
    left.text(x + bc / 2, i * br + s_rows / 2, "S_ij", ha="center", va="center", fontsize=8,
              color="white", weight="bold")
    spans["S"] = x
    x += bc + gap
    for name, size, hot, color, label in (("V", bc, j, _SMEM, "V_j"), ("O", br, i, _REGS, "O_i")):
        _blocks(left, (x, D), size, rows, L, name, hot, (color, label))
        spans[name] = x
        x += D + (gap / 4 if name == "O" else gap)
    for name in ("m", "l"):  # one float per row of block i, drawn wider than one column
        left.add_patch(Rectangle((x, i * br), stat_w, s_rows, facecolor=_REGS,
                                 edgecolor="white", gid=f"{name}_i"))
        left.text(x + stat_w / 2, i * br - rows * 0.012, name, ha="center", va="bottom",
                  fontsize=8)
        x += stat_w + gap / 8
    for name in ("Q", "K", "V", "O"):
        left.text(spans[name] + D / 2, -rows * 0.02,
                  f"{name}\n{fmt.nbytes(by_name[name]['bytes'])}", ha="center", va="bottom",
                  fontsize=8)
    left.text(spans["S"] + bc / 2, i * br - rows * 0.012, "Q_i K_jᵀ", ha="center", va="bottom",
              fontsize=7)
    if rows < L:
        left.text(0, rows + rows * 0.02,
                  f"⋮  rows {fmt.count(rows)} to {fmt.count(L)} not drawn: in all\n"
                  f"{fmt.count(ws['query_blocks'])} query blocks of {br} rows, "
                  f"{fmt.count(ws['key_blocks'])} key blocks of {bc}",
                  ha="left", va="top", fontsize=8)
    left.set_xlim(-gap / 4, x)
    left.set_ylim(rows * 1.13, -rows * 0.09)
    left.set_aspect("equal")
    left.set_xticks([])
    left.set_ylabel("token (row of one head)")
    left.set_title(f"one head, L = {fmt.count(L)}, D = {D}, {ws['dtype']}: blocks of Br = {br} "
                   f"queries, Bc = {bc} keys\ngrey: in HBM only; coloured: on chip now",
                   fontsize=9)
    for spine in ("top", "right", "bottom"):
        left.spines[spine].set_visible(False)

    bars = ws["rows"][::-1]
    right.barh([f"{r['name']} {r['shape']}" for r in bars], [r["bytes"] for r in bars],
               color=[PLACE_COLORS[r["where"]] for r in bars])
    for y, r in enumerate(bars):
        right.text(r["bytes"] * 1.15, y, fmt.nbytes(r["bytes"]), va="center", fontsize=7)
    right.set_xscale("log")
    right.set_xlim(min(r["bytes"] for r in bars) / 2, max(r["bytes"] for r in bars) * 12)
    right.xaxis.set_major_formatter(lambda v, _: fmt.nbytes(v))
    right.tick_params(axis="y", labelsize=8)
    right.legend(handles=[Patch(color=c, label=p) for p, c in PLACE_COLORS.items()],
                 fontsize=8, loc="lower right")
    right.set_title("bytes of each (tiles: the kernel's full Br / Bc buffers)", fontsize=9)
    fig.suptitle(f"On chip at one moment: {fmt.nbytes(ws['on_chip_bytes'])} "
                 f"({fmt.nbytes(ws['shared_memory_bytes'])} shared memory + "
                 f"{fmt.nbytes(ws['register_bytes'])} registers); in HBM: "
                 f"{fmt.nbytes(ws['hbm_bytes'])} for this head. K and V are read "
                 f"{fmt.count(ws['kv_reads'])} times, once per query block.", fontsize=10)
    return fig


if __name__ == "__main__":
    from cpcourse.viz import write_figures

    _, br, bc = fa2_tiles(128)
    write_figures({"flash_tiling": tiling_figure(working_set(119_056, 128, br, bc))})
