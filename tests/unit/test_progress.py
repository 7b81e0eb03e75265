"""Progress of commands that take more than a few seconds, on stderr (`cpcourse.cli.progress`)."""

from __future__ import annotations

import os
import time

import pytest

from cpcourse.cli import progress


def test_running_says_start_heartbeat_and_end(capsys, monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    with progress.running(3, "a test", every_s=0.05):
        assert os.environ[progress.ENV] == "1"  # asks the ranks to count their steps
        time.sleep(0.18)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[0] == "starting 3 ranks: a test"
    assert any(line.strip().startswith("...") for line in lines[1:-1])
    assert lines[-1].startswith("3 ranks done in ")
    assert progress.ENV not in os.environ


def test_a_failed_run_says_no_done_line(capsys):
    with pytest.raises(RuntimeError), progress.running(1, "one rank"):
        raise RuntimeError("boom")
    err = capsys.readouterr().err
    assert err.startswith("starting 1 rank: one rank") and "done" not in err


def test_rank_lines_go_to_stderr(capsys):
    progress.rank_lines("[rank 0] step 1/2\n")
    out, err = capsys.readouterr()
    assert out == "" and err == "[rank 0] step 1/2\n"


def test_the_step_list_counts_only_when_asked(capsys, monkeypatch):
    from cpcourse.tinydit.sampling import _step_times

    monkeypatch.setenv(progress.ENV, "1")
    said = _step_times(0, 2)
    said.append(0.5)
    assert capsys.readouterr().err == "step 1/2 (0.50 s)\n" and said == [0.5]
    assert type(_step_times(1, 2)) is list  # other ranks: silent
    monkeypatch.delenv(progress.ENV)
    assert type(_step_times(0, 2)) is list


def test_counts_read_as_words():
    from cpcourse.cli.demo import _table
    from cpcourse.viz.fmt import plural

    assert plural(1, "node") == "1 node" and plural(2, "node") == "2 nodes"
    assert plural(3, "process", "processes") == "3 processes"
    step = {"step": 0, "rank": 0, "kv_block": 0, "compute_s": 1e-3, "comm_s": 2e-3,
            "bytes_sent": 65_536}
    header, row = _table([step], 1)
    assert "comm ms  sent kB/rank" in header and row.endswith("65.5")  # SI kB, as fmt.nbytes
