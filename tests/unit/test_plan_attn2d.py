"""The planner prices Attention2D: `--layout ...,attn2d=RxC`, the search, the GB200 NVL72 rack.

    python -m pytest tests/unit/test_plan_attn2d.py -q
"""

import pytest

from cpcourse.cli import main
from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.overheads import collective_alpha
from cpcourse.planner.plan import plan
from cpcourse.planner.tokens import get_model, model_tokens
from cpcourse.support.errors import InputError
from cpcourse.support.layout import Layout, with_attn2d

WAN = "wan2.2-t2v-a14b"


def test_layout_parses_attn2d_only_for_the_planner():
    lay = Layout.parse("cfg=2,ulysses=4,attn2d=3x3", attn2d=True)
    assert (lay.cfg, lay.ring, lay.ulysses, lay.grid, lay.world) == (2, 9, 4, (3, 3), 72)
    assert str(lay) == "cfg2 x attn2d 3x3 x ulysses4"
    assert Layout(**lay.as_dict()) == lay
    assert Layout(ring=4).as_dict() == {"cfg": 1, "ring": 4, "ulysses": 1, "tp": 1}
    with pytest.raises(InputError, match="cpcourse plan"):
        Layout.parse("attn2d=2x2")  # generate, models: processes run a ring, never silently
    with pytest.raises(InputError, match="once"):
        Layout.parse("ring=4,attn2d=2x2", attn2d=True)
    with pytest.raises(InputError, match="ring = 4"):
        Layout(ring=3, attn2d="2x2")
    assert [g.attn2d for g in with_attn2d(Layout(ring=8))] == ["2x4", "4x2"]
    assert with_attn2d(Layout(ring=7)) == []


def test_gb200_is_one_nvlink_domain_of_72():
    g = get_gpu("gb200")
    assert g.hbm_gb == 186 and g.bf16_tflops == 2500
    assert g.intra_link == "nvlink5" and get_link("nvlink5").gbps_per_direction == 900


def test_a_given_grid_is_priced_from_the_byte_formula():
    p = plan(WAN, gpus=72, gpu="gb200", layout="cfg=2,ulysses=4,attn2d=3x3")
    m, tok = get_model(WAN), model_tokens(WAN, None, None, None)
    per = p["breakdown"]["per_forward_seconds"]
    moved = tiling_bytes_per_rank("attn2d", tok.sequence_length, m.heads // 4,
                                  m.hidden // m.heads, 9, (3, 3), 2)
    # Q gathered along a row of 3, K and V along a column of 3, the partials home: 4 gathers of
    # 2 messages each, at NCCL's floor per message
    alphas = m.layers * 4 * 2 * collective_alpha()[0]
    assert per["attn2d"] == pytest.approx(m.layers * moved / (get_link("nvlink5").effective_gbps
                                                              * 1e9) + alphas)
    assert per["ring_exposed"] == 0 and p["links"]["attn2d"] == "nvlink5"
    assert p["layout"]["attn2d"] == "3x3" and any("Attention2D" in r for r in p["reasoning"])


def test_the_rack_plan_is_a_grid_once_the_ring_pays_its_split():
    """72 GB200s, Wan 2.2 A14B (40 heads), CFG 2: 36 GPUs per branch, so Ulysses 8 cannot divide
    them. TRT-LLM blog 25's shape is Ulysses 4 x CP 9; once attention cut into P blocks pays
    what the H200 measured (1.25x at 8), a ring of 9 (9 blocks) loses to a grid whose owner
    merges only C partials: the 3x3 grid at Ulysses 4 is within 2% of the best, the ring of 9
    is slower (by 1-10%: its split cost is a share of attention, smaller under FA4, Blackwell's
    default, than under FA2), and the reason names the grid."""
    p = plan(WAN, gpus=72, gpu="gb200")
    lay = p.layout
    assert lay.cfg == 2 and lay.grid is not None
    grid = plan(WAN, gpus=72, gpu="gb200", layout="cfg=2,ulysses=4,attn2d=3x3")
    ring = plan(WAN, gpus=72, gpu="gb200", layout="cfg=2,ulysses=4,ring=9")
    assert grid["seconds_total"] <= p["seconds_total"] * 1.02
    assert ring["seconds_total"] > grid["seconds_total"] * 1.01
    per_r, per_g = (x["breakdown"]["per_forward_seconds"] for x in (ring, grid))
    assert per_r["ring_merge"] > per_g["ring_merge"] + per_g["attn2d"]
    assert any("Attention2D on the CP axis" in r for r in p["reasoning"])


def test_plan_cli_takes_attn2d(capsys):
    argv = ["plan", "--model", WAN, "--gpus", "72", "--gpu", "gb200", "--layout",
            "cfg=2,ulysses=4,attn2d=3x3", "--json"]
    assert main(argv) == 0
    assert '"attn2d": "3x3"' in capsys.readouterr().out
    assert main(["plan", "--model", WAN, "--gpus", "72", "--gpu", "gb200", "--layout",
                 "cfg=2,ulysses=4,attn2d=2x3", "--json"]) == 2
