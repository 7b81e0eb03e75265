"""The benchmarks check their whole plan before measuring, and leave nothing behind.

    python -m pytest tests/unit/test_bench_checks.py -q

No rank starts here: the launches are replaced by fakes.
"""

import io
import os
import signal

import pytest

from cpcourse.bench import launch as bench_launch
from cpcourse.bench import models as bench_models
from cpcourse.bench import windows as bench_windows
from cpcourse.support.errors import InputError


def test_bench_launch_removes_the_folder_of_the_caller_it_killed(tmp_path, monkeypatch):
    """Its SIGKILL case orphaned a cpcourse-launch-* folder in the temp dir on every run."""
    made = []

    class Caller:  # the killed caller: it made its run folder in the temp dir it was given
        def __init__(self, cmd, env=None, **kwargs):
            env = env or os.environ
            folder = os.path.join(env["TMPDIR"], "cpcourse-launch-x")
            os.makedirs(os.path.join(folder, "tmp"))
            made.append(folder)
            self.stdout = io.StringIO("started\n" * 2)

        def send_signal(self, sig):
            pass

        def wait(self, timeout=None):
            return -signal.SIGKILL

    monkeypatch.setattr(bench_launch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the caller's default
    monkeypatch.setattr(bench_launch.subprocess, "Popen", Caller)
    monkeypatch.setattr(bench_launch.time, "sleep", lambda s: None)
    monkeypatch.setattr("cpcourse.launch.proctree.marked", lambda mark: set())
    assert bench_launch._left_after_kill(2, signal.SIGKILL) == 0
    assert made and made[0].startswith(str(tmp_path)) and list(tmp_path.iterdir()) == []


def test_bench_windows_fits_its_rank_counts_to_the_windows():
    """--window 2 --stride 1 measured for 10 s, then failed naming --parallel and --nproc,
    flags bench windows does not have: 4 ranks for 3 windows."""
    cases = bench_windows._exactness_cases("circle-right", 2, 1, 1)
    assert cases == [("windows", 1), ("windows", 2), ("cp", 1), ("cp", 2)]
    assert len(bench_windows._exactness_cases("circle-right", 8, 4, 1)) == 6


def test_bench_models_checks_every_method_before_the_first_runs(monkeypatch):
    def no_launch(*args, **kwargs):
        raise AssertionError("a method ran before all were checked")

    monkeypatch.setattr(bench_models, "run_models", no_launch)
    for argv, words in ((["--methods", "ring,bogus"], "--methods 'bogus': method must be"),
                        (["--methods", "allgather,ulysses", "--nproc", "3"],
                         "--methods 'ulysses': Ulysses splits"),
                        (["--nproc", "99"], "--nproc 99")):
        with pytest.raises(InputError, match=words):
            bench_models.main(argv)
