"""`cpcourse vae` on one process: its refusals, the sizes the VAEs take, the tiled decode's seams.

    python -m pytest tests/unit/test_vae.py -q

Refusals exit 2 with one line on stderr, naming the flag, before any process starts (the
launcher is replaced by one that fails the test if reached). The tiled decode is measured
against the exact one: its error is largest where tiles are blended.
"""

import pytest
import torch

from cpcourse.cli import main
from cpcourse.models.vae import build_vae, check_video_size, example_latents
from cpcourse.runs import vae as runs_vae
from cpcourse.support.errors import InputError


@pytest.fixture
def no_launch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started for a refused command")
    monkeypatch.setattr(runs_vae, "launch", refuse)


@pytest.mark.parametrize("argv, flag", [
    (["--arch", "wan", "--frames", "4"], "--frames"),
    (["--arch", "wan", "--height", "60"], "--height"),
    (["--arch", "hunyuanvideo", "--width", "0"], "--width"),
    (["--arch", "wan", "--height", "16", "--nproc", "3"], "--nproc"),
    (["--arch", "wan", "--nproc", "0"], "--nproc"),
    (["--arch", "cogvideox"], "--arch"),
    (["--arch", "wan", "--dtype", "int8"], "--dtype"),
])
def test_refusals_are_one_line_before_any_process(argv, flag, capsys, no_launch):
    assert main(["vae", *argv, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and flag in err, err


def test_the_latent_sizes_follow_the_compression():
    assert check_video_size("wan", 9, 64, 48) == (3, 8, 6)
    assert check_video_size("hunyuanvideo", 1, 8, 8) == (1, 1, 1)
    with pytest.raises(InputError, match="--frames"):
        check_video_size("wan", 6, 64, 48)


@pytest.mark.parametrize("arch", ["wan", "hunyuanvideo"])
def test_same_seed_same_weights_and_latents(arch):
    a, b = build_vae(arch, seed=3), build_vae(arch, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert torch.equal(example_latents(arch, 5, 16, 16, seed=3),
                       example_latents(arch, 5, 16, 16, seed=3))


def test_tiled_decode_errs_most_at_its_seams():
    spec = {"arch": "wan", "frames": 1, "height": 64, "width": 64, "seed": 0}
    exact, _, _ = runs_vae.single_decode(spec)
    tiled = runs_vae.seam_errors(spec, exact)
    size, stride = runs_vae.TILE
    assert tiled["seam_pixels"] == 64 * 64 - (64 - 2 * (size - stride)) ** 2
    assert tiled["max_abs_err_seams"] > 1e-2  # tiles see zeros where their neighbours' rows are
    assert tiled["max_abs_err_seams"] >= tiled["max_abs_err_interior"]
