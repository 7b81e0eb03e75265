"""Every model preset says how its weights were obtained (derived on diffusers' own class on the
meta device, or estimated and why), how many forwards a sampling step runs (read from each
pipeline's sampler), and which text encoder and VAE it prices; every published table says where
it comes from, what its time includes and which kernel it ran."""

from __future__ import annotations

import pytest

from cpcourse.planner import hardware
from cpcourse.planner.facts import (
    dit_derived_costs,
    facts,
    holdout_runs,
    published_runs,
    run_provenance,
    vae_flops_table,
)
from cpcourse.planner.tokens import get_model, presets


def _entry(model_id: str) -> dict:
    return next(m for m in facts()["models"] if m["id"] == model_id)


def test_each_preset_is_derived_or_says_why_not():
    derived = dit_derived_costs()
    for m in presets().values():
        kind, _, how = m.derivation.partition(": ")
        assert kind in ("derived", "estimated") and how, m.id
        assert (kind == "derived") == (m.id in derived), m.id
        if kind == "estimated":  # the reason names why no class could be counted
            assert "diffusers" in how, m.id


def test_cross_attention_presets_meet_every_block_weight():
    """Where text enters by cross-attention (Wan, LTX-Video, Cosmos), a video token meets every
    block weight but the cross-attention's K/V, which `_block_params` adds back: the derived count
    lands within 2% of the facts sheet's count of every block parameter."""
    for mid in ("wan2.1-t2v-14b", "ltx-video-2b", "ltx-video-13b", "cosmos-1.0-diffusion-7b",
                "cosmos-predict2-2b"):
        if mid not in dit_derived_costs():
            pytest.skip(f"{mid} not derived yet")
        listed = _entry(mid)["est_block_params_B"] * 1e9
        assert get_model(mid).block_params == pytest.approx(listed, rel=0.02), mid


def test_joint_two_stream_presets_meet_about_half_their_weights():
    """HunyuanVideo, Mochi and Open-Sora 2.0 hold a text stream (and modulation linears) that a
    video token never meets: Open-Sora 2.0's 57 blocks of 3072 hand a token 12 h^2 each (the image
    half of a double block: QKV 3, out 1, MLP 8; a single block: 7 in, 5 out), 6.45 B of 11.83."""
    h = 3072
    want = 57 * 12 * h ** 2
    for mid in ("open-sora-2.0-768px", "open-sora-2.0-256px"):
        if mid not in dit_derived_costs():
            pytest.skip(f"{mid} not derived yet")
        assert get_model(mid).block_params == pytest.approx(want, rel=0.01)
    for mid in ("hunyuanvideo-13b", "mochi-1", "open-sora-2.0-768px"):
        share = get_model(mid).block_params / (_entry(mid)["est_block_params_B"] * 1e9)
        assert 0.45 < share < 0.6, (mid, share)


def test_forwards_per_step_come_from_the_samplers():
    assert get_model("open-sora-2.0-768px").cfg_forwards == 3  # cond, uncond, uncond_2
    assert get_model("hunyuanvideo-13b").cfg_forwards == 1  # guidance-distilled
    assert get_model("wan2.1-t2v-14b").cfg_forwards == 2
    for m in presets().values():
        assert m.cfg_forwards in (1, 2, 3) and m.cfg_forwards_src, m.id
        assert _entry(m.id)["forwards_per_step"]["src"], m.id


def test_wan22_a14b_has_two_experts_switching_at_the_boundary():
    moe = _entry("wan2.2-t2v-a14b")["experts"]
    assert moe["count"] == 2 and moe["names"] == ["high_noise", "low_noise"]
    assert moe["boundary_ratio"] == 0.875 and "boundary_ratio" in moe["src"]
    # 27 B in all (README), 14 B a step
    assert moe["count"] * moe["params_each"] == pytest.approx(27e9, rel=0.05)


def test_t5_xxl_encoder_count():
    """google/t5-v1_1-xxl's encoder: 24 layers of attention (4 d^2, 64 heads of 64 = d) and a gated
    MLP (3 d F), plus the embedding: the 4.76e9 the presets price."""
    d, f, layers, vocab = 4096, 10240, 24, 32128
    count = layers * (4 * d * d + 3 * d * f) + vocab * d
    assert get_model("mochi-1").text_encoder[0] == pytest.approx(count, rel=0.01)


def test_every_priced_vae_and_text_encoder_is_known():
    families = vae_flops_table()
    for m in presets().values():
        assert m.vae_family is None or m.vae_family in families, m.id
        if m.text_encoder is not None:
            params, src = m.text_encoder
            assert params > 1e8 and src, m.id
    for mid in ("open-sora-2.0-768px", "mochi-1", "ltx-video-2b"):  # were priced at 0 s
        assert get_model(mid).text_encoder is not None and get_model(mid).vae_family, mid


def test_kernels_by_generation():
    for g in hardware.gpus().values():
        kernel, source = hardware.generation_kernel(g.id)
        assert kernel in hardware.KERNELS and source
        assert hardware.kernel_efficiency(g.id, kernel)[0], g.id
    assert hardware.generation_kernel("b200")[0] == "fa4"
    assert hardware.generation_kernel("h100")[0] == "fa3"
    assert hardware.kernel_efficiency("b200", "fa3")[0] is None
    assert hardware.kernel_efficiency("gb200", "cudnn")[0] > 0.5
    for row in hardware.sdpa_by_torch():
        assert row["torch"] and row["backend"] and row["source"]


def test_blackwell_gpus_with_their_nvlink_domains():
    table = hardware.gpus()
    raw = {g["id"]: g for g in facts()["hardware"]}
    assert raw["gb200"]["nvlink_domain_gpus"] == 72 and raw["b200"]["nvlink_domain_gpus"] == 8
    for gid in ("b200", "gb200"):
        assert table[gid].arch == "blackwell" and table[gid].bf16_tflops >= 2250
        assert any("nvidia" in s.lower() or "B200" in s for s in table[gid].sources)


def test_every_published_table_has_its_provenance():
    prov = run_provenance()
    held = {r["table"] for r in holdout_runs()["runs"]}
    for r in published_runs()["runs"] + holdout_runs()["runs"]:
        row = prov["tables"][r["table"]]
        assert row["source_id"] in prov["sources"], r["table"]
        assert row["kernel"] in (*hardware.KERNELS, "unknown") and row["kernel_source"]
        assert set(row["includes"]) == {"text_encode", "denoise", "vae_decode",
                                        "first_call_warmup", "model_load"}
        assert row["includes"]["denoise"] is True
        assert isinstance(row["held_out"], bool)
        if r["table"] in held:  # the audit: same page and tokens, read before the last change
            assert row["held_out"] is False and row["held_out_why_not"]
        if r.get("kernel"):  # what the planner is told agrees with what the source says
            assert r["kernel"] == row["kernel"]


def test_added_runs_name_their_source_kernel_and_parts():
    from cpcourse.planner.facts import added_runs
    from cpcourse.planner.tokens import model_tokens

    data = added_runs()
    assert data["runs"]
    for r in data["runs"]:
        assert r["source_id"] in data["sources"] and r["source"]
        assert r["kernel"] in (*hardware.KERNELS, "unknown") and r["kernel_source"]
        assert r["includes"]["denoise"] is True and isinstance(r["held_out"], bool)
        assert hardware.get_gpu(r["gpu"]) and get_model(r["model"])
        assert r.get("seconds_denoise", 0) <= r["seconds_total"]
        # the size the planner is given has the tokens the source ran (72,000 for 80 frames,
        # 75,600 for Wan's 81)
        tok = model_tokens(r["model"], r["height"], r["width"], r["frames"])
        assert tok.video_tokens == (72_000 if r.get("frames_published") == 80 else 75_600)
