"""Output files: an unwritable destination is one line and exit 2 before any work, and a write
that fails after the work is one InputError line, never a traceback or a half-written file."""

import os
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from cpcourse.cli import main
from cpcourse.support.errors import InputError
from cpcourse.support.out_files import check_writable, replacing

# As root, os.access says /proc is writable, yet nothing can be created there: the case that
# only a real create catches.
needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux") or
                                not os.path.isdir("/proc/self"), reason="needs Linux /proc")


def no_work(*args, **kwargs):
    raise AssertionError("the work started before the output was checked")


def refuse(capsys, argv, words):
    """`cpcourse argv` exits 2 with one line holding `words`, without training or launching."""
    with mock.patch("cpcourse.launch.launcher.subprocess.Popen", no_work), \
            mock.patch("cpcourse.tinydit.training.train", no_work):
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1, (argv, err)
    assert words in err and "Traceback" not in err, (argv, err)


def test_check_writable_creates_a_file_and_leaves_none(tmp_path):
    assert check_writable("--out", str(tmp_path / "w.bin")) == str(tmp_path / "w.bin")
    assert list(tmp_path.iterdir()) == []


def test_replacing_keeps_the_old_file_when_the_write_fails(tmp_path):
    path = tmp_path / "w.bin"
    path.write_text("old")
    with pytest.raises(InputError, match=r"^--out .*w.bin: cannot write it \(RuntimeError: "
                       r"disk full\)$"), replacing(str(path), "--out") as tmp:
        open(tmp, "w").write("half")
        raise RuntimeError("disk full\nsecond line")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["w.bin"]


@needs_proc
def test_writers_turn_every_failure_into_one_line():
    """safetensors, torch.save and a plain open each fail in their own way in /proc."""
    from cpcourse.support.out_files import save
    from cpcourse.tinydit.model import DiTConfig, build_model, save_weights
    from cpcourse.viz.clips import save_gif

    model = build_model(DiTConfig(hidden=16, heads=2, depth=1), 0)
    for write, words in ((lambda: save_weights(model, "/proc/w.safetensors", {}, name="out"),
                          "out /proc/w.safetensors: cannot write it"),
                         (lambda: save_gif(torch.zeros(2, 3, 4, 4), "/proc/c.gif", name="--gif"),
                          "--gif /proc/c.gif: cannot write it"),
                         (lambda: save(torch.zeros(2), {}, "/proc/c.pt"),
                          "--save /proc/c.pt: cannot write it")):
        with pytest.raises(InputError) as info:
            write()
        assert str(info.value).startswith(words) and "\n" not in str(info.value)


@needs_proc
@pytest.mark.parametrize("argv, words", [
    (["train", "--out", "/proc/w.safetensors", "--steps", "1"], "--out /proc/w.safetensors"),
    (["generate", "--nproc", "1", "--gif", "/proc/c.gif"], "--gif /proc/c.gif"),
    (["generate", "--nproc", "1", "--save", "/proc/c.pt"], "--save /proc/c.pt"),
    (["generate", "--window", "4", "--frames", "8", "--save", "/proc/c.pt"], "--save /proc/c.pt"),
])
def test_an_unwritable_output_is_refused_before_the_work(capsys, argv, words):
    refuse(capsys, argv, words + ": cannot create a file in /proc")


@pytest.mark.parametrize("gif, save", [("c.gif", "c.gif"), ("c.pt.json", "c.pt")])
@pytest.mark.parametrize("window", [[], ["--window", "4", "--frames", "8"]])
def test_gif_and_save_may_not_name_the_same_file(capsys, tmp_path, gif, save, window):
    refuse(capsys, ["generate", "--nproc", "1", *window, "--gif", str(tmp_path / gif),
                    "--save", str(tmp_path / save)], "one would overwrite the other")
    assert list(tmp_path.iterdir()) == []


def test_save_whose_report_is_a_directory_is_refused(capsys, tmp_path):
    (tmp_path / "c.pt.json").mkdir()
    refuse(capsys, ["generate", "--nproc", "1", "--save", str(tmp_path / "c.pt")],
           "its report")


# ---- one writer (issue 51): checked before the work, never through a link or a device ----

from cpcourse.support.out_files import check_output, write_output  # noqa: E402


def test_check_output_refuses_what_a_rename_would_break(tmp_path):
    """A trailing slash, a link, a folder, a device, a pipe, an existing file without force:
    each one line naming the flag, and nothing created."""
    (tmp_path / "t.pt").write_text("keep")
    os.symlink(tmp_path / "t.pt", tmp_path / "l.pt")
    os.mkfifo(tmp_path / "fifo")
    cases = [(str(tmp_path / "newdir") + "/", "is a directory name"),
             (str(tmp_path / "l.pt"), "is a symbolic link"),
             (str(tmp_path), "is a directory"),
             ("/dev/null", "is a device or other special file"),
             (str(tmp_path / "fifo"), "is a device or other special file"),
             (str(tmp_path / "t.pt"), "already exists: add --force"),
             (str(tmp_path / "no" / "x.pt"), "does not exist"),
             ("", "--out needs a file name")]
    before = sorted(tmp_path.iterdir())
    for path, words in cases:
        with pytest.raises(InputError) as info:
            check_output(path, False, "--out")
        assert words in str(info.value) and "\n" not in str(info.value), (path, info.value)
    assert sorted(tmp_path.iterdir()) == before and (tmp_path / "t.pt").read_text() == "keep"
    assert not os.path.exists("/dev/null/x") and os.path.exists("/dev/null")
    assert check_output(str(tmp_path / "t.pt"), True, "--out") == str(tmp_path / "t.pt")
    with pytest.raises(InputError, match="symbolic link"):  # --force never replaces a link
        check_output(str(tmp_path / "l.pt"), True, "--out")


def test_write_output_renames_only_onto_a_regular_file(tmp_path):
    """At write time too: a link that appeared since the check is refused, not replaced; a
    regular file keeps its permission bits; no temporary file is left either way."""
    target, link = tmp_path / "t.json", tmp_path / "l.json"
    target.write_text("keep")
    os.chmod(target, 0o640)
    os.symlink(target, link)
    with pytest.raises(InputError, match="--out .*l.json is a symbolic link"):
        write_output(str(link), lambda tmp: open(tmp, "w").write("new"), "--out")
    assert link.is_symlink() and target.read_text() == "keep"
    write_output(str(target), lambda tmp: open(tmp, "w").write("new"), "--out")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.json", "t.json"]


def test_generate_refuses_bad_outputs_before_sampling(capsys, tmp_path):
    """Probe C1, C2, #4: a folder name, a link, an existing file; --force replaces only a file."""
    (tmp_path / "t.pt").write_text("keep")
    os.symlink(tmp_path / "t.pt", tmp_path / "l.gif")
    gen = ["generate", "--prompt", "circle-right", "--nproc", "1", "--steps", "1"]
    for argv, words in (([*gen, "--save", str(tmp_path / "newdir") + "/"], "directory name"),
                        ([*gen, "--gif", str(tmp_path / "newdir2") + "/"], "directory name"),
                        ([*gen, "--approx", "naive", "--nproc", "2", "--save",
                          str(tmp_path / "n3") + "/"], "directory name"),
                        ([*gen, "--gif", str(tmp_path / "l.gif")], "symbolic link"),
                        ([*gen, "--gif", "/dev/stdout"], "symbolic link"),
                        ([*gen, "--save", str(tmp_path / "t.pt")], "add --force"),
                        ([*gen, "--save", str(tmp_path / "l.gif"), "--force"], "symbolic link"),
                        ([*gen, "--force"], "--force has no effect here: it needs --save")):
        refuse(capsys, argv, words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.gif", "t.pt"]


def test_vae_checks_save_before_the_decode(capsys, tmp_path):
    """Probe #1, #4, #12: `vae --save` into a missing folder, onto '.', onto an existing file."""
    (tmp_path / "keep.pt").write_text("precious")
    vae = ["vae", "--arch", "wan", "--nproc", "1", "--frames", "1", "--height", "16",
           "--width", "8"]
    for save, words in ((str(tmp_path / "nodir" / "x.pt"), "does not exist"),
                        (".", "is a directory"),
                        (str(tmp_path / "keep.pt"), "already exists: add --force")):
        refuse(capsys, [*vae, "--save", save], words)
    refuse(capsys, [*vae, "--force"], "--force has no effect here: it needs --save")
    assert (tmp_path / "keep.pt").read_text() == "precious"


def test_bench_gpu_out_refused_before_work_and_leaves_no_folder(tmp_path, monkeypatch):
    """Probe C1, C2, #4: `bench gpu --out a/b/`, a link, an existing file: nothing made."""
    root = str(Path(__file__).resolve().parents[2])  # tools/ is the checkout's
    monkeypatch.syspath_prepend(root)
    from tools.gpu_check import check as gpu

    monkeypatch.chdir(tmp_path)
    (tmp_path / "g.json").write_text("precious")
    os.symlink("g.json", "l.json")
    for out, words in (("n5_g/sub/", "directory name"), ("l.json", "symbolic link"),
                       ("g.json", "add --force"), ("artifacts/sub/", "directory name")):
        with pytest.raises(InputError, match=words):
            gpu._args(["--dry-run", "--out", out])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json", "l.json"]
    assert gpu._args(["--dry-run", "--out", "g.json", "--force"]).out == "g.json"
    assert gpu._args(["--dry-run"]).out == "artifacts/gpu.json"  # its own folder, made once
    assert (tmp_path / "artifacts").is_dir()


def test_train_refuses_an_existing_out_without_force(capsys, tmp_path):
    (tmp_path / "w.safetensors").write_text("precious")
    refuse(capsys, ["train", "--out", str(tmp_path / "w.safetensors"), "--steps", "1"],
           "add --force")


@pytest.mark.parametrize("tool", ["derive_vae_halo", "derive_vae_flops", "derive_vae_memory",
                                  "derive_dit_costs"])
def test_derive_tools_refuse_unknown_arguments_and_write_nothing(tool):
    """Probe C12: `tools/derive_*.py --bogus` exits 2 in one line; the data file is untouched."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    data = sorted((root / "cpcourse" / "data").glob("*.json"))
    before = {p: p.stat().st_mtime_ns for p in data}
    res = subprocess.run([sys.executable, f"tools/{tool}.py", "--bogus"], cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and res.stdout == "", res
    assert res.stderr.count("\n") == 1 and "unrecognized arguments: --bogus" in res.stderr
    assert {p: p.stat().st_mtime_ns for p in data} == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_compare_to_a_non_finite_tensor_is_refused_up_front(capsys, tmp_path, bad):
    """Probe C4: a reference holding NaN or inf: one line, exit 2, before any rank."""
    ref = torch.zeros(8, 3, 32, 32)
    ref[0, 0, 0, 0] = bad
    torch.save(ref, tmp_path / "nan.pt")
    refuse(capsys, ["generate", "--prompt", "circle-right", "--nproc", "1", "--steps", "1",
                    "--compare-to", str(tmp_path / "nan.pt"), "--json"], "not finite")


def test_verdict_refuses_scales_and_dtypes_it_cannot_judge():
    """Probe C7: an inf scale would pass any error, a NaN one was dropped, float8 a KeyError."""
    from cpcourse.support.tolerance import tolerance, verdict

    for call, words in ((lambda: verdict(1e30, float("inf"), "ring"), "scale must be a finite"),
                        (lambda: tolerance("ring", "float32", scale=float("nan")), "scale"),
                        (lambda: tolerance("ring", "float32", scale=-1.0), "scale"),
                        (lambda: tolerance("ring", "float8"), "dtype 'float8' has no tolerance")):
        with pytest.raises(ValueError, match=words):
            call()
    assert verdict(1e-6, 1.0, "ring")["within_tolerance"]
    assert not verdict(float("nan"), 1.0, "ring")["within_tolerance"]


def test_weights_say_what_they_are_and_commands_refuse_the_other_kind(capsys, tmp_path):
    """Probe #2: the chunk-causal weights sampled as a bidirectional model (generate, bench
    shapes) are refused before any work; a file `save_weights` writes records its kind."""
    from cpcourse.tinydit.causal import shipped_causal_path
    from cpcourse.tinydit.model import (
        DiTConfig,
        build_model,
        load_weights,
        save_weights,
        weights_kind,
    )
    from cpcourse.tinydit.training import shipped_path

    causal = shipped_causal_path()
    assert weights_kind(load_weights(causal)[1]) == {"model": "chunk-causal", "chunk": 2}
    assert weights_kind(load_weights(shipped_path())[1]) == {"model": "bidirectional"}
    for argv in (["generate", "--weights", causal, "--prompt", "circle-right", "--nproc", "1",
                  "--steps", "1", "--json"],
                 ["generate", "--weights", causal, "--window", "4", "--frames", "8"],
                 ["bench", "shapes", "--weights", causal, "--seeds", "1", "--steps", "1"]):
        with mock.patch("cpcourse.tinydit.training.evaluate", no_work):
            refuse(capsys, argv, "chunk-causal (trained with chunk 2): add --causal")
    refuse(capsys, ["generate", "--causal", "--weights", shipped_path(), "--nproc", "1"],
           "not a chunk-causal model")
    model = build_model(DiTConfig(hidden=16, heads=2, depth=1), 0)
    for extra, kind in (({}, {"model": "bidirectional"}),
                        ({"causal": {"chunk": 4}}, {"model": "chunk-causal", "chunk": 4})):
        save_weights(model, str(tmp_path / "w.safetensors"), extra)
        assert load_weights(str(tmp_path / "w.safetensors"))[1]["kind"] == kind


def test_no_inductor_cache_is_left_in_tmpdir(tmp_path):
    """Probe #5: importing diffusers (every `models`, `vae` and `bench gpu` run) made
    $TMPDIR/torchinductor_<user>; the cache now lives in the user's cache directory."""
    import subprocess

    tmp, cache = tmp_path / "tmp", tmp_path / "cache"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "XDG_CACHE_HOME": str(cache)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    res = subprocess.run([sys.executable, "-c", "import cpcourse, os, diffusers; "
                          "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == str(cache / "cpcourse" / "torchinductor")
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("argv, words", [
    (["tools/make_exercises.py", "--check", "--root", "nodir"], "no solutions/ folder"),
    (["tools/nbstall.py", "nosuch.ipynb", "--runs", "1"], "no such notebook: nosuch.ipynb"),
])
def test_dev_tools_refuse_a_missing_path_in_one_line(argv, words, tmp_path):
    """Probe C11: a FileNotFoundError traceback before; now argparse's usage and one error."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, str(root / argv[0]), *argv[1:]], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_clip_files_check_when_made_and_write_after(tmp_path):
    """`ClipFiles` (generate's --save/--gif/--force/--compare-to) checks when made, from Python
    as from the command line, and writes with the GIF writer it is given."""
    from cpcourse.support.out_files import ClipFiles

    with pytest.raises(InputError, match="one would overwrite the other"):
        ClipFiles(save=str(tmp_path / "c.pt"), gif=str(tmp_path / "c.pt"))
    assert ClipFiles().load_compare() is None and list(tmp_path.iterdir()) == []
    files = ClipFiles(save=str(tmp_path / "c.pt"), gif=str(tmp_path / "c.gif"))
    drawn = []
    res = {"clip": torch.zeros(2, 3, 4, 4), "report": {"seed": 0}}
    files.write(res, torch.ones(2), gif_writer=lambda clip, path, name: drawn.append(path))
    assert drawn == [files.gif] and res["report"] == {"seed": 0, "gif": files.gif,
                                                      "saved": files.save}
    again = ClipFiles(save=files.save, force=True, compare_to=files.save)
    assert torch.equal(again.load_compare(), torch.ones(2))
    with pytest.raises(InputError, match=r"holds a tensor of shape \(2,\), this run makes"):
        again.check_compare(again.load_compare(), (3,))
