"""FlashAttention-2's tiles and notebook 01's tiling figure (cpcourse.planner.flash_tiles,
viz.flash).

    python -m pytest tests/unit/test_viz_flash.py -q
"""

from __future__ import annotations

import matplotlib
import pytest

matplotlib.use("Agg")

from matplotlib.colors import same_color  # noqa: E402

from cpcourse.planner.costs import memory  # noqa: E402
from cpcourse.planner.flash_tiles import fa2_tiles, working_set  # noqa: E402
from cpcourse.support.errors import InputError  # noqa: E402
from cpcourse.viz import fmt  # noqa: E402
from cpcourse.viz.flash import PLACE_COLORS, tiling_figure  # noqa: E402


def test_fa2_tiles_follow_its_dispatch():
    assert fa2_tiles(128) == (128, 128, 64) == fa2_tiles(128, "h100")
    assert fa2_tiles(64) == (64, 128, 128)
    assert fa2_tiles(72) == (96, 128, 64)  # rounds up to the next compiled head dim
    assert fa2_tiles(256, "a100") == (256, 128, 64) and fa2_tiles(256, "sm90") == (256, 64, 64)
    with pytest.raises(InputError, match="up to 256"):
        fa2_tiles(257)
    with pytest.raises(InputError, match="unknown arch"):
        fa2_tiles(128, "tpu")


def test_shared_memory_is_fa2s_ksmemsize():
    # kSmemSize = Q tile + K and V tiles, in the input dtype; the code's comments quote some:
    # D = 128, 128 x 32 is "48 KB smem"; D = 256, 128 x 64 is "128KB", 64 x 64 "96KB".
    assert working_set(4096, 128, 128, 32)["shared_memory_bytes"] == 48 * 1024
    assert working_set(4096, 256, 128, 64)["shared_memory_bytes"] == 128 * 1024
    assert working_set(4096, 256, 64, 64)["shared_memory_bytes"] == 96 * 1024


def test_working_set_bytes():
    L, D, br, bc = 1000, 64, 128, 128
    ws = working_set(L, D, br, bc, dtype="fp16")
    by = {r["name"]: r for r in ws["rows"]}
    assert by["Q"]["bytes"] == by["O"]["bytes"] == L * D * 2 and by["lse"]["bytes"] == L * 4
    assert by["S_ij"]["bytes"] == br * bc * 4 and by["O_i (accumulator)"]["bytes"] == br * D * 4
    assert ws["hbm_bytes"] == 4 * L * D * 2 + 4 * L
    assert ws["on_chip_bytes"] == ws["shared_memory_bytes"] + ws["register_bytes"]
    assert ws["register_bytes"] == br * bc * 4 + br * D * 4 + 2 * br * 4
    assert (ws["query_blocks"], ws["key_blocks"], ws["kv_reads"]) == (8, 8, 8)
    assert ws["score_matrix_bytes"] == memory(L, D, 1, dtype="fp16")[
        "attention_matrix_bytes_per_head"] == L * L * 2


def test_figure_draws_the_tiles_and_bytes_it_states():
    L, D = 119_056, 128
    _, br, bc = fa2_tiles(D)
    ws = working_set(L, D, br, bc)
    fig = tiling_figure(ws, query_block=1, key_block=2, window_blocks=8)
    left, right = fig.axes
    patches = {p.get_gid(): p for p in left.patches if p.get_gid()}
    rows = 8 * max(br, bc)
    assert sum(g.startswith("Q:") for g in patches) == rows // br
    assert sum(g.startswith("K:") for g in patches) == rows // bc
    hot = PLACE_COLORS["shared memory"]
    assert [g for g, p in patches.items() if g.startswith(("Q:", "K:", "V:"))
            and same_color(p.get_facecolor(), hot)] == ["Q:1", "K:2", "V:2"]
    assert (patches["Q:1"].get_y(), patches["Q:1"].get_height()) == (br, br)
    assert (patches["K:2"].get_y(), patches["K:2"].get_height()) == (2 * bc, bc)
    assert patches["Q:1"].get_width() == D and patches["S_ij"].get_width() == bc
    assert patches["m_i"].get_y() == patches["O:1"].get_y() == br
    widths = sorted(p.get_width() for p in right.patches)
    assert widths == sorted(r["bytes"] for r in ws["rows"])
    title = fig._suptitle.get_text()
    for key in ("on_chip_bytes", "shared_memory_bytes", "register_bytes", "hbm_bytes"):
        assert fmt.nbytes(ws[key]) in title
    assert fmt.count(ws["kv_reads"]) in title
    texts = " ".join(t.get_text() for t in left.texts)
    assert fmt.count(ws["query_blocks"]) in texts and fmt.count(ws["key_blocks"]) in texts


def test_figure_of_a_short_sequence_draws_all_of_it():
    ws = working_set(300, 64, 128, 128)
    fig = tiling_figure(ws, query_block=5, key_block=5)
    left = fig.axes[0]
    q = [p for p in left.patches if (p.get_gid() or "").startswith("Q:")]
    assert [p.get_height() for p in q] == [128, 128, 44]  # the last block is partial
    assert not any("not drawn" in t.get_text() for t in left.texts)
