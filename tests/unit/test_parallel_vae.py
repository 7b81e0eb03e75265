"""The planner's decode split over the GPUs (`--parallel-vae`) and the text encoder's place
(`--text-encoder`): plan's keys, the halo formula, the bytes each place leaves on a GPU, the
seconds each costs, and the refusals."""

import json
import math
import sys
from pathlib import Path

import pytest

from cpcourse.cli import main
from cpcourse.planner.facts import vae_halo_table
from cpcourse.planner.hardware import get_gpu, get_link
from cpcourse.planner.parallel_vae import halo_per_boundary
from cpcourse.planner.pipeline_memory import text_encoder_params
from cpcourse.planner.plan import plan
from cpcourse.planner.text_encoder import CPU_FLOPS
from cpcourse.planner.tokens import model_tokens

TOOLS = Path(__file__).resolve().parents[2] / "tools"
WAN, HY = "wan2.1-t2v-14b", "hunyuanvideo-13b"
PS = (2, 4, 8)


@pytest.fixture(scope="module")
def wan():
    """Wan 14B at its default video on H100s: one GPU, then P GPUs with and without the split."""
    serial = {p: plan(WAN, gpus=p, layout=f"ring={p}") for p in (1, *PS)}
    split = {p: plan(WAN, gpus=p, layout=f"ring={p}", parallel_vae=True) for p in PS}
    return serial, split


def test_parallel_decode_time_falls_with_p(wan):
    serial, split = wan
    whole = serial[1]["vae_decode_seconds"]
    assert all(serial[p]["vae_decode_seconds"] == whole for p in PS)  # no flag: one GPU decodes
    times = [split[p]["vae_decode_seconds"] for p in PS]
    assert times == sorted(times, reverse=True) and times[0] < whole
    for p in PS:
        d = split[p]
        assert d["vae_parallel"] and not serial[p]["vae_parallel"]
        # the busiest rank's rows: tensor_split gives the first ranks one more
        busiest = math.ceil(model_tokens(WAN).latent_height / p)
        assert d["vae_decode"]["compute_seconds"] == pytest.approx(
            whole * busiest / model_tokens(WAN).latent_height)
        # only the link time stays serial; the encoder's milliseconds with it
        assert d["serial_seconds"] < serial[p]["serial_seconds"] / 10


def test_halo_bytes_match_the_halo_formula(wan):
    _, split = wan
    tok = model_tokens(WAN)
    c = vae_halo_table()["wan2.1"]["halo_elements_per_boundary"]
    t, w = tok.latent_frames, tok.latent_width
    boundary = (c["constant"] + c["per_frame"] * t + c["per_column"] * w
                + c["per_frame_column"] * t * w) * 2  # bf16
    for p in PS:
        inner = 2 if p > 2 else 1  # an inner rank sends to both neighbours
        assert split[p]["vae_halo_bytes"] == int(boundary * inner)
        link = get_link(split[p]["vae_decode"]["link"])
        moved = split[p]["vae_decode"]["link_seconds"] * link.effective_gbps * 1e9
        assert moved >= split[p]["vae_halo_bytes"]


def test_halo_line_matches_the_library_split_recorded_again():
    """The table's line at a point it was not fitted on, against the library's own split run
    afresh on the meta device (tools/derive_vae_halo.py)."""
    sys.path.insert(0, str(TOOLS))
    from derive_vae_halo import meta_record

    got = meta_record("AutoencoderKLWan", 16, 3, 10)
    tok = type("Tok", (), {"latent_frames": 3, "latent_width": 10})
    assert halo_per_boundary(WAN, tok) == got["halo"]


def test_working_set_per_gpu_is_a_share_plus_halo_rows(wan):
    serial, split = wan
    h = model_tokens(WAN).latent_height
    for p in PS:
        n_max = math.ceil(h / p)
        want = serial[p]["vae_decode_working_bytes"] * (8 * n_max + 2) / (8 * h)
        assert split[p]["vae_decode_working_bytes"] == pytest.approx(want, rel=1e-6, abs=1)
    # HunyuanVideo's released decode is tiled: the tile, not the rows, bounds each rank's set
    assert (plan(HY, gpus=8, parallel_vae=True)["vae_decode_working_bytes"]
            == plan(HY, gpus=8)["vae_decode_working_bytes"])


@pytest.fixture(scope="module")
def places():
    return {place: plan(WAN, gpus=8, layout="cfg=2,ulysses=4", text_encoder=place)
            for place in ("resident", "freed", "cpu", "own-gpu")}


def test_text_encoder_place_changes_bytes_per_gpu(places):
    weights = text_encoder_params(WAN) * 2  # bf16, not sharded
    enc = {k: v["text_encoder"] for k, v in places.items()}
    assert enc["resident"]["bytes_per_gpu"] == enc["resident"]["bytes_through_denoise"] == int(
        weights)
    assert enc["freed"]["bytes_per_gpu"] == int(weights)
    assert enc["freed"]["bytes_through_denoise"] == 0
    for place in ("cpu", "own-gpu"):
        assert enc[place]["bytes_per_gpu"] == enc[place]["bytes_through_denoise"] == 0
    phases = {k: v["breakdown"]["memory_phases"] for k, v in places.items()}
    assert phases["resident"]["denoise"] - phases["freed"]["denoise"] == int(weights)


def test_text_encoder_place_changes_seconds(places):
    enc = {k: v["text_encoder"] for k, v in places.items()}
    pcie = get_link(get_gpu("h100").pcie)
    assert enc["freed"]["seconds"] - enc["resident"]["seconds"] == pytest.approx(
        text_encoder_params(WAN) * 2 / (pcie.effective_gbps * 1e9))
    tok = model_tokens(WAN)
    assert enc["cpu"]["seconds"] == pytest.approx(
        2 * text_encoder_params(WAN) * tok.text_tokens * 2 / CPU_FLOPS)  # a CFG pair of prompts
    assert enc["own-gpu"]["seconds"] == enc["resident"]["seconds"]
    assert places["own-gpu"]["gpu_seconds"] == pytest.approx(9 * places["own-gpu"]["seconds_total"])
    assert places["resident"]["gpu_seconds"] == pytest.approx(
        8 * places["resident"]["seconds_total"])


def test_old_flags_name_the_same_places():
    old = plan(WAN, gpus=8, text_encoder_cpu=True)
    assert old["text_encoder"]["place"] == "cpu"
    assert old["per_gpu_bytes"] == plan(WAN, gpus=8, text_encoder="cpu")["per_gpu_bytes"]
    assert plan(WAN, gpus=8, offload=True)["text_encoder"]["place"] == "freed"


def test_cli_prints_the_choice_and_its_json_keys(capsys):
    assert main(["plan", "--model", WAN, "--gpus", "8", "--parallel-vae", "--text-encoder",
                 "freed", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["vae_parallel"] and d["vae_halo_bytes"] > 0 and d["text_encoder"]["place"] == "freed"
    for key in ("vae_decode_seconds", "vae_decode_working_bytes", "serial_seconds", "gpu_seconds"):
        assert key in d
    assert main(["plan", "--model", WAN, "--gpus", "8", "--text-encoder", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Text encoder on the CPU" in out and "VAE decode whole on one GPU" in out


@pytest.mark.parametrize("argv", [
    ["--gpus", "1", "--parallel-vae"],
    ["--gpus", "8", "--text-encoder", "resident", "--offload"],
    ["--gpus", "8", "--text-encoder", "freed", "--text-encoder-cpu"],
    ["--gpus", "8", "--text-encoder", "gpu"],
    ["--validate", "--parallel-vae"],
    ["--gpus", "8", "--objective", "throughput", "--text-encoder", "own-gpu"],
])
def test_refusals_exit_2_with_one_line(capsys, argv):
    code = main(["plan", "--model", WAN, *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, err


def test_a_vae_the_course_cannot_split_is_refused(capsys):
    assert main(["plan", "--model", "cogvideox-5b", "--gpus", "8", "--parallel-vae"]) == 2
    assert "no height split" in capsys.readouterr().err
