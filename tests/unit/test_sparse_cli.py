"""`cpcourse sparse`: bad input exits 2 with one line before any process starts.

    python -m pytest tests/unit/test_sparse_cli.py -q
"""

from __future__ import annotations

import pytest

from cpcourse.cli import main
from cpcourse.runs.sparse import SparseRequest
from cpcourse.support.errors import InputError


@pytest.mark.parametrize(("argv", "says"), [
    (["--nproc", "0"], "--nproc"),
    (["--nproc", "5"], "--heads 12 do not split over nproc 5"),
    (["--frames", "0"], "--frames"),
    (["--frames", "64", "--height", "64"], "at most 4096"),
    (["--mask", "dense"], "invalid choice"),
    (["--seed", "-1"], "--seed"),
    (["--timeout", "0"], "--timeout"),
])
def test_bad_input_exits_2_in_one_line(argv, says, capsys, monkeypatch):
    def no_launch(*a, **k):
        raise AssertionError("a process started")

    monkeypatch.setattr("cpcourse.runs.sparse.launch", no_launch)
    assert main(["sparse", *argv, "--json"]) == 2
    err = capsys.readouterr()
    assert err.out == "" and says in err.err and err.err.count("\n") == 1


def test_request_checks_itself():
    assert SparseRequest(nproc=3, method="ring", heads=5).heads == 5   # the ring takes any H
    with pytest.raises(InputError, match="balance greedy deals whole tiles"):
        SparseRequest(nproc=4, method="ring", balance="greedy", frames=1, height=4, width=4)
    assert SparseRequest(heads=4, frames=2, height=4, width=4).keep() == [1, 1, 1, 2]
