"""The tiny video DiT in one process: shapes, patchify, float32 vs float64, the memory ledger."""

import re

import pytest
import torch

from cpcourse.cli import main as cli_main
from cpcourse.support.errors import InputError
from cpcourse.tinydit.costs import peak_phase, phase_elements, predicted_peak_bytes
from cpcourse.tinydit.model import DiTConfig, build_model, patchify, unpatchify
from cpcourse.tinydit.sampling import initial_noise, sample


def test_patchify_round_trip_and_token_order():
    x = torch.randn(2, 3, 4, 6, 10)
    tokens = patchify(x, 2)
    assert tokens.shape == (2, 4, 15, 12)
    assert torch.equal(unpatchify(tokens, 3, 2, (3, 5)), x)
    # token 1 of frame 0 is the patch at row 0, column 1 (row-major (y, x) order)
    assert torch.equal(tokens[0, 0, 1].view(3, 2, 2), x[0, :, 0, 0:2, 2:4])
    with pytest.raises(InputError, match="multiples of the patch"):
        patchify(torch.randn(1, 1, 1, 5, 4), 2)


@pytest.mark.parametrize("attention", ["factored", "full"])
def test_sample_float32_close_to_float64_and_not_trivial(attention):
    cfg = DiTConfig(attention=attention, depth=1)
    noise = initial_noise((1, 4, 3, 8, 8), seed=1)
    out32 = sample(build_model(cfg, 0), noise, 1, steps=2)
    out64 = sample(build_model(cfg, 0, torch.float64), noise.double(), 1, steps=2)
    assert out32.shape == noise.shape
    assert float((out32.double() - out64).abs().max()) < 2e-5
    assert float((out32 - noise).abs().mean()) > 0.05   # the model did something


def test_guidance_and_label_change_the_sample():
    model = build_model(DiTConfig(depth=1), 0)
    noise = initial_noise((1, 4, 2, 4, 4), seed=0)
    base = sample(model, noise, 1, steps=1, cfg_scale=2.0)
    assert not torch.allclose(base, sample(model, noise, 2, steps=1, cfg_scale=2.0))
    assert not torch.allclose(base, sample(model, noise, 1, steps=1, cfg_scale=5.0))


def test_memory_ledger_scales_with_tokens_per_rank():
    cfg = DiTConfig()
    shape = [1, 4, 8, 16, 16]
    peaks = [predicted_peak_bytes(cfg, shape, p, 0) for p in (1, 2, 4, 8)]
    assert peaks == sorted(peaks, reverse=True)
    assert peaks[0] / peaks[3] > 7
    assert peak_phase(cfg, shape, 2, 0) == "temporal"
    assert set(phase_elements(DiTConfig(attention="full"), shape, 2, 0)) == {"mlp", "full"}
    with pytest.raises(InputError, match="rank"):
        predicted_peak_bytes(cfg, shape, 2, 2)


@pytest.mark.parametrize("argv,match", [
    (["--nproc", "9"], "more than the 8 latent frames"),
    (["--height", "7"], "multiple of the patch"),
    (["--label", "10"], "^cpcourse: error: --label has no effect here: it needs --weights "
                        r"random \(the trained model takes --prompt\)"),
    (["--nproc", "0"], "--nproc must be > 0"),
])
def test_generate_bad_input_is_one_clear_error(argv, match, capsys):
    # The library's message names the parameter (nproc); the command line's names the flag.
    assert cli_main(["generate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cpcourse: error: ") and "\n" not in err
    assert re.search(match, err), err


@pytest.mark.parametrize("kwargs,match", [
    ({"nproc": 0}, "^nproc must be > 0"),
    ({"nproc": 2, "full_method": "zigzag"}, "^full_method must be one of"),
    ({"nproc": 2, "weights": "random", "prompt": "circle-left"},
     "^prompt needs trained weights: drop weights=random"),
])
def test_library_errors_name_the_parameter_not_the_flag(kwargs, match):
    from cpcourse.runs.generate import check_request

    with pytest.raises(InputError, match=match) as err:
        check_request(**kwargs)
    assert "--" not in str(err.value)
