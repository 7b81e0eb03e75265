"""The command line: JSON keys fixed by DESIGN.md, exit status 2 with one line on bad input."""

import json
import subprocess
import sys

import pytest

from cpcourse.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tokens_json_keys(capsys):
    code, out, _ = run(capsys, "tokens", "--height", "720", "--width", "1280", "--fps", "24",
                       "--seconds", "5", "--json")
    d = json.loads(out)
    assert code == 0 and d["video_tokens"] == 432_000 and d["frames"] == 120
    for key in ("latent_frames", "latent_height", "latent_width", "tokens_per_frame",
                "video_tokens", "text_tokens", "sequence_length"):
        assert key in d


def test_tokens_model_joint_text(capsys):
    d = json.loads(run(capsys, "tokens", "--model", "hunyuanvideo-13b", "--json")[1])
    assert d["sequence_length"] == d["video_tokens"] + d["text_tokens"] == 119_056


def test_memory_and_comm_json(capsys):
    d = json.loads(run(capsys, "memory", "--tokens", "432000", "--hidden", "4096", "--heads",
                       "32", "--dtype", "fp16", "--cp", "8", "--json")[1])
    assert d["attention_matrix_bytes_per_head"] == 373_248_000_000
    assert d["qkv_bytes_per_rank"] == 3 * 54_000 * 4096 * 2
    d = json.loads(run(capsys, "comm", "--tokens", "432000", "--cp", "8", "--heads", "32",
                       "--head-dim", "128", "--dtype", "fp16", "--bandwidth", "450",
                       "--json")[1])
    for key in ("tokens_per_rank", "ring_hops", "kv_bytes_per_hop_per_head", "kv_bytes_per_hop",
                "kv_bytes_total", "comm_seconds_per_hop", "comm_seconds_total",
                "compute_seconds_per_step", "hidden", "min_tokens_per_rank_to_hide",
                "attention_efficiency", "link_efficiency"):
        assert key in d
    assert isinstance(d["kv_bytes_total"], int) and d["kv_bytes_total"] == 6_193_152_000


def test_model_fills_dimensions(capsys):
    d = json.loads(run(capsys, "comm", "--model", "cosmos-1.0-diffusion-7b", "--cp", "8",
                       "--link", "nvlink4", "--json")[1])
    assert d["tokens_per_rank"] == 7040 and d["heads"] == 32
    d = json.loads(run(capsys, "plan", "--model", "cosmos-1.0-diffusion-7b", "--gpus", "8",
                       "--json")[1])
    assert d["cfg_parallel"] * d["tp"] * d["cp"] == 8 and d["reasoning"]


@pytest.mark.parametrize("argv, words", [
    (["tokens", "--height", "-720", "--width", "1280", "--frames", "5"], "--height must be > 0"),
    (["tokens", "--height", "720", "--width", "1000", "--frames", "5"], "not divisible"),
    (["tokens", "--model", "wan2.1-t2v-14b", "--frames", "80"], "use 81"),
    (["tokens", "--model", "nope"], "unknown model"),
    (["comm", "--tokens", "4", "--cp", "8", "--heads", "2", "--head-dim", "8",
      "--link", "nvlink4"], "larger than the 4 tokens"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--gpu", "tpu-v5"], "unknown GPU"),
    (["tokens", "--height", "abc"], "invalid int value"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert words in err and err.count("\n") == 1 and "Traceback" not in err


def test_console_script_exit_status():
    p = subprocess.run([sys.executable, "-m", "cpcourse.cli", "tokens", "--height", "0",
                        "--width", "16", "--frames", "1"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0


def test_doctor_json():
    from cpcourse.cli.doctor import diagnose

    r = diagnose(run_gloo=True)
    assert r["torch"] and r["gloo_allreduce"]["ok"], r
