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
    lay = d["layout"]
    assert lay["cfg"] * lay["tp"] * lay["ring"] * lay["ulysses"] == 8 and d["reasoning"]
    assert d["track_record"]["runs"] == 0  # nothing published for Cosmos: said, not hidden
    text = run(capsys, "plan", "--model", "cosmos-1.0-diffusion-7b", "--gpus", "8")[1]
    assert "no published run of this model" in text
    text = run(capsys, "plan", "--model", "hunyuanvideo-13b", "--gpus", "8", "--gpu", "h100")[1]
    assert "Track record (this model on this GPU, 8 published runs)" in text
    assert "hunyuanvideo-720p-h100: 1 -> 8 GPUs 5.64x published" in text
    # how the pipeline holds memory reaches the planner from the command line
    d = json.loads(run(capsys, "plan", "--model", "wan2.1-t2v-1.3b", "--gpus", "1", "--gpu",
                       "rtx4090", "--released", "--offload", "--text-encoder-cpu", "--json")[1])
    from cpcourse.planner.plan import plan

    assert d["per_gpu_bytes"] == plan("wan2.1-t2v-1.3b", gpus=1, gpu="rtx4090", released=True,
                                      offload=True, text_encoder_cpu=True)["per_gpu_bytes"]
    assert d["breakdown"]["residency"] == {"offload": True, "text_encoder_cpu": True,
                                          "text_encoder": "cpu"}


@pytest.mark.parametrize("argv, words", [
    (["tokens", "--height", "-720", "--width", "1280", "--frames", "5"], "--height must be > 0"),
    (["tokens", "--height", "720", "--width", "1000", "--frames", "5"], "not divisible"),
    (["tokens", "--model", "wan2.1-t2v-14b", "--frames", "80"], "use 81"),
    (["tokens", "--model", "nope"], "unknown model"),
    (["comm", "--tokens", "4", "--cp", "8", "--heads", "2", "--head-dim", "8",
      "--link", "nvlink4"], "larger than the 4 tokens"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--gpu", "tpu-v5"], "unknown GPU"),
    (["tokens", "--height", "abc"], "invalid int value"),
    # sizes that used to run until killed (an O(n) loop, a list as long as the GPU count)
    (["plan", "--model", "cosmos-1.0-diffusion-7b", "--gpus", "1000000000"], "use 4096 or fewer"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "4097"], "--gpus 4097: the planner lays out"),
    (["memory", "--tokens", "432000", "--hidden", "4096", "--heads", "32", "--cp",
      "1000000000"], "use 1048576 or fewer"),
    (["comm", "--tokens", "432000", "--cp", "1000000000", "--heads", "32", "--head-dim", "128",
      "--link", "nvlink4"], "use 1048576 or fewer"),
    (["bench", "ring", "--nproc", "1000"], "use 64 or fewer"),
    (["bench", "kernel", "--threads", "100000"], "or fewer"),
    # checked before any process starts, instead of a traceback from inside a rank
    (["generate", "--nproc", "3", "--full", "ulysses"], "--nproc 1, 2, 4"),
    # numbers that overflowed, divided to infinity or went through as NaN
    (["tokens", "--height", "720", "--width", "1280", "--fps", "1e308", "--seconds", "1e308"],
     "--fps must be <= 10000"),
    (["memory", "--tokens", "4320", "--hidden", "4096", "--heads", "32", "--params-b", "1e300"],
     "--params-b must be <="),
    (["comm", "--tokens", "4320", "--cp", "8", "--heads", "32", "--head-dim", "128",
      "--bandwidth", "1e-320"], "--bandwidth must be between"),
    (["comm", "--tokens", "4320", "--cp", "8", "--heads", "32", "--head-dim", "128",
      "--bandwidth", "100", "--link-efficiency", "1e-320"], "--link-efficiency must be in"),
    (["comm", "--tokens", "4320", "--cp", "8", "--heads", "32", "--head-dim", "128",
      "--link", "nvlink4", "--layers", "0"], "--layers must be > 0"),
    (["generate", "--cfg", "nan", "--nproc", "1"], "--cfg-scale must be finite"),
    (["generate", "--seed", str(2**64), "--nproc", "1"], "--seed must be a whole number"),
    (["grade", "--timeout", "0"], "--timeout must be a positive"),
    (["grade", "--timeout", "nan"], "--timeout must be a positive"),
    # contradictory options are refused, not resolved silently
    (["tokens", "--height", "720", "--width", "1280", "--frames", "5", "--fps", "24",
      "--seconds", "5"], "not both"),
    (["generate", "--weights", "random", "--attention", "factored", "--full", "ulysses"],
     "needs --attention full"),
    (["generate", "--weights", "random", "--attention", "full", "--temporal", "ring"],
     "needs --attention factored"),
    (["tokens", "--model", "", "--height", "720", "--width", "1280", "--frames", "5"],
     "--model is empty"),
    # the planner
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--layout", "cfg=2,ulysses=2"],
     "needs 4 GPUs, not --gpus 8"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--kernel", "fa9"], "--kernel must be"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--gpu", "a100", "--kernel", "fa3"],
     "no published rate on ampere"),
    (["plan", "--validate", "--model", "wan2.1-t2v-14b"], "--model has no effect here"),
    (["plan", "--gpus", "8"], "plan needs --model"),
    # mesh layouts: checked before any process starts
    (["generate", "--layout", "tp=3"], "layouts of 3 ranks that work: ring3"),
    (["generate", "--layout", "cfg=2", "--nproc", "4"], "pass --nproc 2"),
    (["generate", "--layout", "pp=2"], "NAME one of cfg, ring, ulysses, tp"),
    (["generate", "--layout", "ring=2", "--full", "ulysses"], "--full has no effect here"),
    (["generate", "--layout", "ring=2", "--window", "4"], "--layout has no effect here"),
    (["generate", "--layout", "ring=16"], "is more than the 8 latent frames"),
    (["models", "--arch", "wan", "--layout", "cfg=2,ring=2"], "add --sample-steps"),
    (["models", "--arch", "hunyuanvideo", "--layout", "cfg=2", "--sample-steps", "1"],
     "guidance-distilled"),
    (["models", "--arch", "cogvideox", "--layout", "tp=2"], "built for Wan"),
    (["models", "--arch", "wan", "--layout", "ulysses=8"], "does not divide the 12 heads"),
    (["models", "--arch", "wan", "--layout", "ring=2", "--method", "ulysses"],
     "--method has no effect here"),
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


def test_doctor_is_not_ready_with_a_bad_omp_num_threads(monkeypatch):
    from cpcourse.cli.doctor import diagnose

    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    r = diagnose(run_gloo=False)
    assert not r["ok"] and any("OMP_NUM_THREADS='abc'" in p for p in r["problems"])


def test_doctor_is_not_ready_when_cpcourse_backend_is_nccl_without_gpus(monkeypatch):
    """It said ok, and then every launch failed."""
    import torch

    from cpcourse.cli.doctor import diagnose

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setenv("CPCOURSE_BACKEND", "nccl")
    r = diagnose(run_gloo=False)
    assert not r["ok"] and any("CPCOURSE_BACKEND='nccl' needs a CUDA GPU" in p
                               for p in r["problems"]), r["problems"]
    monkeypatch.setenv("CPCOURSE_RANK_START", "spawn")
    r = diagnose(run_gloo=False)
    assert any("CPCOURSE_RANK_START='spawn' must be" in p for p in r["problems"]), r["problems"]


def test_a_timeout_names_the_flag_that_sets_it(capsys, monkeypatch):
    """The command line said "raise timeout=", launch()'s parameter, not --timeout."""
    from cpcourse import cli
    from cpcourse.launch import LaunchTimeout

    stuck = LaunchTimeout(0.5, {0: "in recv()"}, [])
    monkeypatch.setattr(cli, "run", lambda argv: (_ for _ in ()).throw(stuck))
    for argv in (["models"], ["generate", "--verbose"], ["bench", "models"]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "else raise --timeout)" in err and "timeout=" not in err, err
    code, _, err = run(capsys, "bench", "windows")  # it has no --timeout to name
    assert code == 2 and "--timeout" not in err


def test_a_failing_rank_is_one_line_unless_verbose(capsys, monkeypatch):
    """A rank's exception reaches the command line as one line and exit 2; --verbose adds the
    rank's traceback."""
    from cpcourse import cli
    from cpcourse.launch import LaunchTimeout, RankError

    record = {"rank": 1, "type": "RuntimeError", "message": "boom\nsecond line", "op": None,
              "traceback": 'Traceback (most recent call last):\n  File "x.py", line 3\n',
              "time": 0.0}
    monkeypatch.setattr(cli, "run", lambda argv: (_ for _ in ()).throw(RankError(record, [], [])))
    code, out, err = run(capsys, "demo")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "rank 1 raised RuntimeError: boom" in err and "--verbose" in err
    code, _, err = run(capsys, "demo", "--verbose")
    assert code == 2 and 'File "x.py", line 3' in err
    stuck = LaunchTimeout(5, {0: "recv from rank 1", 1: "all_gather"}, [])
    monkeypatch.setattr(cli, "run", lambda argv: (_ for _ in ()).throw(stuck))
    code, _, err = run(capsys, "demo")
    assert code == 2 and err.count("\n") == 1
    assert "timed out after 5 s" in err and "rank 0: recv from rank 1; rank 1: all_gather" in err


def test_generate_checks_its_files_before_starting(capsys, tmp_path):
    """--save into a missing folder or onto a folder, --compare-to a file that holds no tensor:
    one line, exit 2, before any process starts, and no file left behind."""
    text, js, empty = tmp_path / "a.txt", tmp_path / "a.json", tmp_path / "empty.pt"
    text.write_text("hi")
    js.write_text("{}")
    empty.write_bytes(b"")
    before = sorted(tmp_path.iterdir())
    for argv, words in ((["--save", str(tmp_path / "no" / "x.pt")], "does not exist"),
                        (["--save", str(tmp_path)], "is a directory"),
                        (["--compare-to", str(text)], "not a file saved by"),
                        (["--compare-to", str(js)], "not a file saved by"),
                        (["--compare-to", str(empty)], "not a file saved by"),
                        (["--compare-to", str(tmp_path / "missing.pt")], "not a file saved by")):
        code, out, err = run(capsys, "generate", "--nproc", "1", *argv)
        assert code == 2 and out == "" and words in err and err.count("\n") == 1, (argv, err)
    assert sorted(tmp_path.iterdir()) == before


def _request_flags() -> set[str]:
    import dataclasses
    import importlib
    import pkgutil

    import cpcourse.runs
    from cpcourse.support.request_flags import options

    found: set[str] = set()
    for info in pkgutil.iter_modules(cpcourse.runs.__path__):
        mod = importlib.import_module(f"cpcourse.runs.{info.name}")
        for obj in vars(mod).values():
            if dataclasses.is_dataclass(obj) and obj.__name__.endswith("Request"):
                found |= set(options(obj))
    return found


def test_library_parameters_map_to_real_flags():
    """Library errors name parameters; the CLI turns each into a flag that some command takes."""
    import re
    from pathlib import Path

    import cpcourse
    from cpcourse.cli import PARAM_FLAGS, as_flags

    src = "".join(p.read_text() for p in Path(cpcourse.__file__).parent.rglob("*.py"))
    flags = set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", src))
    flags |= _request_flags()  # the flags built from a Request's fields (support.request_flags)
    assert not set(PARAM_FLAGS.values()) - flags
    assert as_flags("cp 9 is larger than the 4 tokens: use cp=4 or fewer, or `nproc` 2") == \
        "--cp 9 is larger than the 4 tokens: use --cp 4 or fewer, or --nproc 2"
    assert as_flags("temporal_method must be one of x") == "--temporal must be one of x"
    assert as_flags("the tokens per rank: cps=2, `cpx`") == "the tokens per rank: cps=2, `cpx`"


@pytest.mark.parametrize("argv, words", [
    (["train", "--steps", "1", "--eval-seeds", "-1"], "--eval-seeds must be > 0"),
    (["train", "--steps", "1", "--eval-seeds", "100000"], "--eval-seeds 100000: use at most 256"),
    (["train", "--steps", "1", "--seed", "-1"], "--seed must be a whole number"),
    (["generate", "--window", "4", "--frames", "8", "--timeout", "0"], "--timeout must be"),
    (["generate", "--window", "4", "--frames", "8", "--seed", "-1"], "--seed must be"),
    (["generate", "--window", "4", "--frames", "8", "--seed", str(10**20)], "--seed must be"),
    (["generate", "--nproc", "1", "--timeout", "1e9"], "--timeout must be"),
    (["models", "--arch", "wan", "--seed", "-1"], "--seed must be"),
])
def test_every_path_checks_its_flags_before_any_work(capsys, tmp_path, argv, words):
    """Refused before training or launching, and no weights file written."""
    from unittest import mock

    def no_work(*args, **kwargs):
        raise AssertionError(f"{argv}: the work started before the flags were checked")

    out_flag = ["--out", str(tmp_path / "w.safetensors")] if argv[0] == "train" else []
    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", no_work), \
            mock.patch("cpcourse.tinydit.training.train", no_work):
        code, out, err = run(capsys, *argv, *out_flag)
    assert code == 2 and out == "" and words in err and err.count("\n") == 1, (argv, err)
    assert list(tmp_path.iterdir()) == []


def test_train_runs_one_step_however_few_minutes(capsys, tmp_path):
    """--minutes 1e-12 used to train zero steps and divide by zero in the progress bar."""
    out = tmp_path / "w.safetensors"
    code, stdout, _ = run(capsys, "train", "--out", str(out), "--minutes", "1e-12", "--json")
    assert code == 0 and json.loads(stdout)["steps"] == 1 and out.exists()


def test_a_compare_to_of_the_wrong_shape_is_refused_before_the_run(tmp_path, capsys):
    """The run's shape is known up front: no processes start for a comparison that must fail."""
    import torch

    from cpcourse.cli import main

    other = tmp_path / "other.pt"
    torch.save(torch.zeros(1, 4, 8, 16, 16), other)  # random-weight latents
    assert main(["generate", "--nproc", "1", "--compare-to", str(other), "--timeout",
                 "0.001"]) == 2  # a launch would time out instead
    err = capsys.readouterr().err
    assert "this run makes (8, 3, 32, 32)" in err and err.count("\n") == 1, err


def test_a_quoted_source_line_is_not_rewritten_into_flags():
    """Probe #9: a timeout quoting `torch.arange(pairs, dtype=torch.float64)` printed
    `--dtype torch.float64` inside the code; the message around it still names flags."""
    from cpcourse.cli import as_flags

    code = "return base ** (-torch.arange(pairs, dtype=torch.float64) / pairs)"
    msg = (f"timed out after 120 s (a deadlock? else raise `timeout`): rank 0: in recv() called "
           f"at ring.py:9: dist.recv(t, src=1); rank 1: in _freqs() called at rope.py:34: "
           f"{code}; finished: rank 2")
    out = as_flags(msg)
    assert code in out and "dist.recv(t, src=1)" in out and "raise --timeout" in out, out
    assert as_flags("steps 0: use dtype=fp32") == "--steps 0: use --dtype fp32"
