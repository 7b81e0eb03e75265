"""One declaration per experiment: a Request's fields are its flags, and it checks itself.

    python -m pytest tests/unit/test_requests.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from cpcourse.cli import main
from cpcourse.runs.vae import VaeRequest, as_request
from cpcourse.support.errors import InputError
from cpcourse.support.request import check_common, flag
from cpcourse.support.request_flags import build_parser, mode_table, request_from_args


@dataclasses.dataclass(frozen=True)
class ToyRequest:
    """A request with a mode: `window` acts only when `frames` is long."""

    frames: int = flag(4, "frames")
    method: str = flag("ring", "how", choices=("ring", "ulysses"))
    window: int = flag(2, "frames a window holds", acts="long")
    quiet: bool = flag(False, "say less")
    secret: int = flag(0, "not on the command line", cli=False)

    def __post_init__(self):
        check_common(self)
        if self.frames < 1:
            raise InputError(f"frames must be > 0, got {self.frames}")

    @staticmethod
    def conditions(values):
        return {"long": (values["frames"] > 8, "more than 8 `frames`")}


def test_the_parser_has_one_flag_per_command_line_field():
    parser = build_parser("toy", ToyRequest, "a toy")
    dests = {a.dest for a in parser._actions if a.option_strings and a.dest != "help"}
    assert dests == {"frames", "method", "window", "quiet", "json"}
    assert mode_table(ToyRequest)["window"] == "long"
    req = request_from_args(parser, ToyRequest, parser.parse_args(["--frames", "9",
                                                                   "--window", "3"]))
    assert req == ToyRequest(frames=9, window=3)


def test_a_flag_outside_its_mode_is_refused_and_bad_values_name_the_field():
    parser = build_parser("toy", ToyRequest, "a toy")
    with pytest.raises(InputError, match="--window has no effect here"):
        request_from_args(parser, ToyRequest, parser.parse_args(["--window", "3"]))
    with pytest.raises(InputError, match="^frames must be > 0"):
        request_from_args(parser, ToyRequest, parser.parse_args(["--frames", "0"]))
    with pytest.raises(InputError, match="did you mean 'ulysses'"):
        ToyRequest(method="ulyses")


def test_the_vae_request_checks_itself_before_any_process_starts():
    assert VaeRequest(arch="wan").latent == (2, 8, 6)
    with pytest.raises(InputError, match="^nproc 9 is more ranks than the 8 latent rows"):
        VaeRequest(arch="wan", nproc=9)
    with pytest.raises(InputError, match="did you mean 'wan'"):
        VaeRequest(arch="wab")
    with pytest.raises(InputError, match="seed"):
        VaeRequest(arch="wan", seed=-1)
    assert as_request({"arch": "wan", "frames": 9}, nproc=3).nproc == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        VaeRequest(arch="wan").nproc = 3


def test_the_command_line_names_the_flag(capsys):
    assert main(["vae", "--arch", "wan", "--nproc", "9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cpcourse: error: --nproc 9 is more ranks")


@dataclasses.dataclass(frozen=True)
class OldFlagRequest:
    """A field whose flag keeps an older spelling, and one derived when made."""

    temporal_method: str = flag("ring", "how", choices=("ring", "all_to_all"),
                                spelled=("--temporal",))
    steps: int | None = flag(None, "steps (default 4)")
    doubled: int = dataclasses.field(default=None, init=False)

    def __post_init__(self):
        check_common(self)
        object.__setattr__(self, "steps", 4 if self.steps is None else self.steps)
        object.__setattr__(self, "doubled", 2 * self.steps)


def test_a_spelled_flag_a_derived_field_and_unset_defaults():
    from cpcourse.support.errors import ArgumentParser
    from cpcourse.support.request_flags import add_request_flags, options, request_values

    assert options(OldFlagRequest) == ["--temporal", "--steps"]  # `doubled` is no flag
    p = ArgumentParser(prog="toy")
    add_request_flags(p, OldFlagRequest, unset=True)
    args = p.parse_args(["--temporal", "all_to_all"])
    assert args.temporal_method == "all_to_all" and args.steps is None
    req = OldFlagRequest(**request_values(OldFlagRequest, args))
    assert (req.temporal_method, req.steps, req.doubled) == ("all_to_all", 4, 8)
    p = ArgumentParser(prog="toy")
    add_request_flags(p, OldFlagRequest, skip=("steps",))
    assert [a.dest for a in p._actions if a.option_strings][1:] == ["temporal_method"]


def test_generate_requests_take_the_weights_defaults_and_refuse_by_name():
    from cpcourse.runs.approx import ApproxRequest
    from cpcourse.runs.generate import GenerateRequest
    from cpcourse.runs.long_video import LongVideoRequest

    req = GenerateRequest(weights="random", layout="cfg=2,ring=2")
    assert (req.nproc, req.shape, req.cond, req.temporal_method) == (
        4, (1, 4, 8, 16, 16), 3, "all_to_all")
    assert dataclasses.replace(req, seed=5).shape == req.shape  # re-checked, same derivation
    assert LongVideoRequest(window=6).frames == 24 and LongVideoRequest(window=6).stride == 3
    assert ApproxRequest(approx="naive").run.steps == GenerateRequest().steps
    with pytest.raises(InputError, match="^layout ring2 needs 2 ranks"):
        GenerateRequest(layout="ring=2", nproc=3)
    with pytest.raises(InputError, match="^give `approx` or `cache`"):
        ApproxRequest()
    with pytest.raises(InputError, match="^`full_method` chooses how full 3D attention"):
        GenerateRequest(weights="random", attention="factored", full_method="ring")
    with pytest.raises(InputError, match="^`temporal_method` chooses how temporal attention"):
        GenerateRequest(weights="random", attention="full", temporal_method="ring")


def test_generate_names_the_flag_of_a_method_for_the_other_attention(capsys):
    assert main(["generate", "--weights", "random", "--attention", "factored",
                 "--full", "ring"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "--full chooses how full 3D attention runs: it needs --attention full" in err, err


@pytest.mark.parametrize("argv, says", [
    (["--approx", "naive", "--frames", "4"], "--frames has no effect with --approx"),
    (["--comm-dtype", "fp8", "--weights", "x.pt"], "--weights has no effect with --comm-dtype"),
    (["--window", "4", "--temporal", "ring"], "--temporal has no effect here"),
    (["--kv-cache", "ulysses"], "--kv-cache has no effect here: it needs --causal"),
])
def test_generate_refuses_a_flag_its_mode_does_not_take(argv, says, capsys):
    assert main(["generate", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err
