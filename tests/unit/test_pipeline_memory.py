"""What a pipeline holds besides the transformer, phase by phase, each term by hand; the decode's
working set as derived from diffusers' VAE; and the published peaks it is held against."""

import statistics
import sys
from pathlib import Path

import pytest

from cpcourse.planner.deployment import block_params
from cpcourse.planner.facts import published_runs
from cpcourse.planner.pipeline_memory import (
    Residency,
    decode_working_bytes,
    phases,
    released_bytes,
    text_encoder_params,
    vae_params,
)
from cpcourse.planner.plan import plan
from cpcourse.planner.tokens import model_tokens
from cpcourse.planner.validation import how_run, validate

TOOLS = Path(__file__).resolve().parents[2] / "tools"
WAN, WAN13, HY = "wan2.1-t2v-14b", "wan2.1-t2v-1.3b", "hunyuanvideo-13b"


def _working(tok, family_coeffs, scale):
    c = family_coeffs
    hw = tok.latent_height * tok.latent_width
    return (c["constant"] + c["per_frame_pixel"] * hw
            + c["per_video_pixel"] * tok.latent_frames * hw) * scale


def test_each_phase_by_hand():
    from cpcourse.planner.facts import vae_memory_table

    tok = model_tokens(WAN, 720, 1280, 81)
    w, loop = 7e9, 1e9  # the transformer's weights on a GPU and the loop's bytes, as given
    te, vae = 5.7e9 * 2 / 8, vae_params(WAN) * 4  # T5 bf16 over 8 FSDP shards; VAE in float32
    work = _working(tok, vae_memory_table()["wan2.1"]["peak_bytes"], 1.0)  # derived in float32
    got = phases(WAN, tok, transformer=w, loop=loop, shards=8, released=True,
                 residency=Residency())
    assert got["phases"] == {"encode": int(w + te + vae), "denoise": int(w + te + vae + loop),
                             "decode": int(w + te + vae + work)}
    assert (got["text_encoder"], got["vae"], got["vae_decode"]) == (int(te), int(vae), int(work))
    # --offload_model: the text encoder only while encoding, the transformer gone by the decode
    off = phases(WAN, tok, transformer=w, loop=loop, shards=8, released=True,
                 residency=Residency(offload=True))["phases"]
    assert off == {"encode": int(w + te + vae), "denoise": int(w + vae + loop),
                   "decode": int(vae + work)}
    # --t5_cpu: no text encoder on the GPU at all
    cpu = phases(WAN, tok, transformer=w, loop=loop, shards=1, released=True,
                 residency=Residency(text_encoder_cpu=True))
    assert cpu["text_encoder"] == 0 and cpu["phases"]["encode"] == int(w + vae)
    # bf16 by default: half the float32 decode, half the float32 VAE weights
    bf = phases(WAN, tok, transformer=w, loop=loop, shards=8, released=False,
                residency=Residency())
    assert bf["vae_decode"] == int(work / 2) and bf["vae"] == int(vae / 2)


def test_released_dtypes_and_what_is_not_known():
    assert released_bytes(WAN)[0] == (4, 2, 4) and "float32" in released_bytes(WAN)[1]
    assert released_bytes(HY)[0] == (2, 2, 2)
    assert released_bytes("cosmos-1.0-diffusion-7b") == ((2, 2, 2), None)
    assert text_encoder_params(WAN) == 5.7e9 and text_encoder_params(HY) == 8.15e9
    assert text_encoder_params("step-video-t2v-30b") == 0.0
    tok = model_tokens("cogvideox-5b")
    assert decode_working_bytes("cogvideox-5b", tok, 2) is None  # not derived: not counted
    p = plan("cogvideox-5b", gpus=2)
    assert p["breakdown"]["memory_bytes"]["vae_decode"] == 0
    assert p["breakdown"]["memory_counted"] == {"text_encoder": True, "vae": False,
                                                "vae_decode": False}


def test_the_plan_takes_the_largest_phase_and_the_released_dtypes():
    p = plan(WAN, 720, 1280, 81, 8, "h800", layout="ulysses=8", fsdp=True, released=True)
    ph, mem = p["breakdown"]["memory_phases"], p["breakdown"]["memory_bytes"]
    assert p["per_gpu_bytes"] == max(ph.values()) == ph["decode"]
    for name, parts in p["breakdown"]["memory_phase_parts"].items():
        assert sum(parts.values()) == pytest.approx(ph[name], abs=4)  # int rounding per part
    # the plan's reasoning names the peak phase and what it holds, offloaded parts left out
    off = plan(WAN13, 480, 832, 81, 1, "rtx4090", released=True, offload=True,
               text_encoder_cpu=True)
    line = next(x for x in off["reasoning"] if x.startswith("Per GPU"))
    assert "the decode phase (vae 0.5, vae decode 8.2)" in line and "weights" not in line
    # float32 weights over 8 GPUs, plus one layer (the blocks' share) gathered in bf16
    layer = block_params(WAN) / 40 * 2  # counted on diffusers' module: 14.05 B
    assert mem["weights"] == int(14e9 * 4 / 8 + layer)
    bf16 = plan(WAN, 720, 1280, 81, 8, "h800", layout="ulysses=8", fsdp=True)
    assert bf16["breakdown"]["memory_bytes"]["weights"] == int(14e9 * 2 / 8 + layer)


def test_decode_memory_file_is_what_diffusers_holds():
    sys.path.insert(0, str(TOOLS))
    try:
        from derive_vae_memory import SHAPES, live_bytes_mode, peak_bytes
    finally:
        sys.path.remove(str(TOOLS))
    import torch

    with live_bytes_mode() as m:  # the tracker itself, by hand
        a = torch.empty(1000, device="meta")  # 4,000 bytes
        b = a + 1  # 8,000 alive
        del a
        c = b * 2  # 8,000 alive (a freed)
        e = b.view(10, 100)  # a view: no new storage
        d = torch.empty(3000, device="meta")  # 4,000 + 4,000 + 12,000
        del b, c, d, e
    assert m.peak == 20_000 and m.now == 0
    from cpcourse.planner.facts import vae_memory_table

    fam = vae_memory_table()["wan2.1"]
    assert peak_bytes(fam["class"], fam["latent_channels"], fam["dtype"], fam["tiling"],
                      SHAPES[0]) == fam["points"][0]["peak_bytes"]
    for pt in fam["points"]:  # the three coefficients pass through every derived point
        t, h, w = pt["latent_thw"]
        c = fam["peak_bytes"]
        assert c["constant"] + c["per_frame_pixel"] * h * w + c["per_video_pixel"] * t * h * w \
            == pytest.approx(pt["peak_bytes"])


def test_hunyuanvideo_is_derived_with_its_own_tiles():
    """The decode memory of HunyuanVideo is derived with the tiles its released code uses, the
    same ones `hunyuan_vae_mask_rows` counts (8x spatial and 4x temporal compression)."""
    sys.path.insert(0, str(TOOLS))
    try:
        from derive_vae_memory import RELEASED, SHAPES
    finally:
        sys.path.remove(str(TOOLS))
    from cpcourse.planner.fixed_costs import HY_TILE, HY_TILE_STRIDE, HY_TILE_T, HY_TILE_T_STRIDE

    tiling = RELEASED["hunyuanvideo"][3]
    assert (tiling["tile_sample_min_height"], tiling["tile_sample_stride_height"]) == (
        8 * HY_TILE, 8 * HY_TILE_STRIDE)
    assert (tiling["tile_sample_min_num_frames"], tiling["tile_sample_stride_num_frames"]) == (
        4 * HY_TILE_T, 4 * HY_TILE_T_STRIDE)
    assert all(t > HY_TILE_T + 1 and h > HY_TILE and w > HY_TILE for t, h, w in SHAPES)


def test_a_table_with_one_gpu_count_has_no_speedup_and_breaks_nothing():
    from cpcourse.planner.validation import predict_runs

    run = dict(published_runs()["runs"][0])
    got = predict_runs([run])
    assert got["speedups"] == {} and len(got["rows"]) == 1


def test_runs_are_predicted_as_they_were_made():
    runs = {(r["model"], r["gpus"]): r for r in published_runs()["runs"]}
    one14, eight14 = how_run(runs[(WAN, 1)]), how_run(runs[(WAN, 8)])
    assert one14["offload"] and not one14["text_encoder_cpu"] and "note" in one14["source"]
    assert eight14["fsdp"] and "--dit_fsdp --t5_fsdp" in eight14["source"]
    assert how_run(runs[(WAN13, 1)])["text_encoder_cpu"]
    assert how_run(runs[(HY, 8)]) == {"released": False, "fsdp": False, "offload": False,
                                      "text_encoder_cpu": False, "source": None}


def test_published_peaks_beside_the_predictions():
    v = validate()
    mem = [r for r in v["rows"] if r["memory_ratio"] is not None]
    peaks = [r for r in published_runs()["runs"] if "peak_GB" in r]
    assert len(mem) == len(peaks) == v["memory"]["runs"] > 0
    for row, run in zip(mem, peaks, strict=True):
        assert row["published_peak_bytes"] == run["peak_GB"] * 1e9
        assert row["memory_ratio"] == pytest.approx(row["predicted_peak_bytes"]
                                                    / row["published_peak_bytes"])
    errors = sorted(abs(r["memory_ratio"] - 1) for r in mem)
    assert v["memory"]["median_abs_rel_error"] == pytest.approx(statistics.median(errors))
    assert v["memory"]["worst_abs_rel_error"] == errors[-1] <= 0.25  # a regression guard
    assert v["holdout"]["memory"]["runs"] == 0  # no held-out run publishes its peak
