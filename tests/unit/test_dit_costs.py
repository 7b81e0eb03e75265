"""The derived DiT costs (cpcourse/data/dit_derived_costs.json) are what diffusers' classes do:
one point re-derived on the meta device lands on the file's lines exactly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("derive_dit_costs",
                                                  ROOT / "tools" / "derive_dit_costs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_new_length_lands_on_the_derived_lines():
    tool = _tool()
    data = json.loads((ROOT / "cpcourse" / "data" / "dit_derived_costs.json").read_text())
    d = data["models"]["wan2.1-t2v-1.3b"]
    got = tool.count("wan2.1-t2v-1.3b", "wan", 9)  # 3 latent frames: neither derived point
    n = got["tokens"]
    assert n not in {p["tokens"] for p in d["points"]}
    for key in ("matmul_flops", "elementwise_bytes"):
        want = d[f"{key}_per_token"] * n + d[f"{key}_fixed"]
        assert abs(got[key] - want) <= 1e-9 * want, key


def test_a_token_meets_the_blocks_it_passes_through():
    """HunyuanVideo: about 6.8 B of its 12.8 B parameters act on each token (the modulation
    linears act on the timestep, the text stream's weights on text only); Wan 14B: its 14.05 B
    block parameters less the cross-attention K/V weights that meet the text (2 x 5120^2 x 40)."""
    d = json.loads((ROOT / "cpcourse" / "data" / "dit_derived_costs.json").read_text())["models"]
    per_token = {k: v["matmul_flops_per_token"] / 2e9 for k, v in d.items()}
    assert 6.7 < per_token["hunyuanvideo-13b"] < 6.9
    assert abs(per_token["wan2.1-t2v-14b"] - (14.05 - 2 * 5120 ** 2 * 40 / 1e9)) < 0.05


def test_cogvideox_tokens_meet_every_block_weight():
    """CogVideoX joins text and video in one sequence with one set of block weights (its expert
    AdaLN only modulates), so a token meets all of them: 4 h^2 for attention and 2 h F for the
    MLP per layer, the sizes from the facts sheet."""
    from cpcourse.planner.tokens import get_model

    d = json.loads((ROOT / "cpcourse" / "data" / "dit_derived_costs.json").read_text())["models"]
    for mid in ("cogvideox-2b", "cogvideox-5b"):
        m = get_model(mid)
        want = m.layers * (4 * m.hidden ** 2 + 2 * m.hidden * m.ffn)
        assert abs(d[mid]["matmul_flops_per_token"] / 2 - want) < 0.01 * want, mid


def test_a_class_built_by_the_tool_lands_on_its_derived_lines():
    """LTX-Video 2B (built by the tool itself, not by cpcourse.models) at 9 frames, a length
    neither derived point used."""
    data = json.loads((ROOT / "cpcourse" / "data" / "dit_derived_costs.json").read_text())
    d = data["models"]["ltx-video-2b"]
    got = _tool().count("ltx-video-2b", "other", 9)
    assert got["tokens"] not in {p["tokens"] for p in d["points"]}
    for key in ("matmul_flops", "elementwise_bytes"):
        want = d[f"{key}_per_token"] * got["tokens"] + d[f"{key}_fixed"]
        assert abs(got[key] - want) <= 1e-6 * want, key
