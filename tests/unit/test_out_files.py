"""Output files: an unwritable destination is one line and exit 2 before any work, and a write
that fails after the work is one InputError line, never a traceback or a half-written file."""

import os
import sys
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
    from cpcourse.cli.clip_files import save
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
