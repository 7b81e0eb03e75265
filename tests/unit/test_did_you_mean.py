"""A mistyped name gets "did you mean ...?" before the list of valid ones (difflib), on the
command line (exit 2, one line) and from Python alike; `cpcourse --help` names every benchmark."""

from __future__ import annotations

import pytest

from cpcourse.bench import BENCHMARKS
from cpcourse.cli import build_parser, main
from cpcourse.support.errors import InputError, did_you_mean


@pytest.mark.parametrize("argv,guess", [
    (["generat"], "'generate'"),
    (["tokens", "--model", "hunyanvideo-13b"], "'hunyuanvideo-13b'"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--gpu", "h10"], "'h100'"),
    (["comm", "--tokens", "100", "--cp", "2", "--heads", "2", "--head-dim", "8",
      "--link", "nvlnk4"], "'nvlink4'"),
    (["generate", "--prompt", "circle-rigth"], "'circle-right'"),
    (["bench", "shape"], "'shapes'"),
    (["plan", "--modle", "wan2.1-t2v-14b"], "'--model'"),
    (["generate", "--temporl", "ring"], "'--temporal'"),
    (["plan", "--model", "wan2.1-t2v-14b", "--gpus", "8", "--objective", "thruput"],
     "'throughput'"),
])
def test_a_typo_gets_a_guess(capsys, argv, guess):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"did you mean {guess}?" in err, err


def test_no_guess_for_nonsense(capsys):
    assert main(["tokens", "--model", "zzzz"]) == 2
    err = capsys.readouterr().err
    assert "did you mean" not in err and "use one of" in err


def test_the_helper():
    assert did_you_mean("Circle-Rigth", ["circle-right", "square-up"]) == \
        "did you mean 'circle-right'? "
    assert did_you_mean("", ["a"]) == "" and did_you_mean(None, ["a"]) == ""
    from cpcourse.planner.tokens import get_model
    with pytest.raises(InputError, match="did you mean 'wan2.1-t2v-14b'"):
        get_model("wan2.1-t2v-14")


def test_help_lists_every_benchmark():
    text = build_parser().format_help()
    assert all(name in text for name in BENCHMARKS), text
