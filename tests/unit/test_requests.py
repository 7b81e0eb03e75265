"""One declaration per experiment: a Request's fields are its flags, and it checks itself.

    python -m pytest tests/unit/test_requests.py -q
"""

from __future__ import annotations

import dataclasses

import pytest

from cpcourse.cli import main
from cpcourse.cli.from_request import build_parser, mode_table, request_from_args
from cpcourse.runs.vae import VaeRequest, as_request
from cpcourse.support.errors import InputError
from cpcourse.support.request import check_common, flag


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
