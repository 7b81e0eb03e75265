"""The planner prices Attention2D: `--layout ...,attn2d=RxC`, the search, the GB200 NVL72 rack.

    python -m pytest tests/unit/test_plan_attn2d.py -q
"""

import pytest

from cpcourse.cli import main
from cpcourse.planner.costs import tiling_bytes_per_rank
from cpcourse.planner.hardware import get_gpu, get_link
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
    assert per["attn2d"] == pytest.approx(m.layers * moved / (get_link("nvlink5").effective_gbps
                                                              * 1e9))
    assert per["ring_exposed"] == 0 and p["links"]["attn2d"] == "nvlink5"
    assert p["layout"]["attn2d"] == "3x3" and any("Attention2D" in r for r in p["reasoning"])


def test_the_rack_plan_is_the_blogs_mesh_shape():
    """72 GB200s, Wan 2.2 A14B (40 heads), CFG 2: 36 GPUs per branch, so Ulysses 8 cannot divide
    them; the planner takes Ulysses 4 x CP 9 (TRT-LLM blog 25's shape), with the 3x3 grid
    costed beside the ring of 9 and the reason for the ring or the grid given."""
    p = plan(WAN, gpus=72, gpu="gb200")
    lay = p.layout
    assert (lay.cfg, lay.ulysses, lay.ring) == (2, 4, 9)
    grids = [c for c in p["alternatives"] if c["layout"].get("attn2d") == "3x3"
             and c["layout"]["ulysses"] == 4 and c["layout"]["cfg"] == 2]
    assert grids and grids[0]["seconds_total"] <= p["seconds_total"] * 1.02
    assert any("Ulysses stops at 4 of 40 heads" in r for r in p["reasoning"])


def test_plan_cli_takes_attn2d(capsys):
    argv = ["plan", "--model", WAN, "--gpus", "72", "--gpu", "gb200", "--layout",
            "cfg=2,ulysses=4,attn2d=3x3", "--json"]
    assert main(argv) == 0
    assert '"attn2d": "3x3"' in capsys.readouterr().out
    assert main(["plan", "--model", WAN, "--gpus", "72", "--gpu", "gb200", "--layout",
                 "cfg=2,ulysses=4,attn2d=2x3", "--json"]) == 2
