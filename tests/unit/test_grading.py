"""check() and `cpcourse grade` on a throwaway course: every status, the time limit, no orphans.

    python -m pytest tests/unit/test_grading.py

Each pytest subprocess costs about 2 s, so the cases are batched into few runs.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fake_course import edit_as_learner, make_course

from cpcourse.course import grading
from cpcourse.course.panels import render_html, render_table, render_text
from cpcourse.support.errors import InputError

LEARNED = ["99.1", "99.2", "99.3", "99.5", "99.6"]  # everything but the infinite loop


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    root = make_course(tmp_path_factory.mktemp("course") / "c")
    edit_as_learner(root)
    return root


@pytest.fixture(scope="module")
def learner_grade(course):
    """One `cpcourse grade --json` run over the learner's exercises (but 99.4's loop)."""
    env = {**os.environ, "CPCOURSE_ROOT": str(course)}
    cmd = [sys.executable, "-m", "cpcourse.cli", "grade", "--json", "--timeout", "120"]
    for ex_id in LEARNED:
        cmd += ["--ex", ex_id]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    return proc


def _by_id(proc):
    data = json.loads(proc.stdout)  # exactly one JSON object on stdout
    return data, {e["id"]: e for e in data["exercises"]}


def test_grade_json_reports_each_status(learner_grade):
    data, rows = _by_id(learner_grade)
    assert learner_grade.returncode == 1 and data["passed"] is False
    assert data["impl"] == "exercises" and data["exercises_total"] == len(LEARNED)
    assert {k: v["status"] for k, v in rows.items()} == {
        "99.1": "passed", "99.2": "failed", "99.3": "not implemented", "99.5": "no tests",
        "99.6": "not implemented"}
    assert rows["99.1"]["title"] == "Adding" and rows["99.1"]["function"] == "add"
    assert rows["99.5"]["title"] == "unused"  # no quoted title: the function's name
    failure = rows["99.2"]["first_failure"]
    assert "test_double" in failure and "worst at index [1, 1]" in failure
    assert "expected 8, got 9" in failure and "hint: multiply by two" in failure
    # 99.3 is the untouched stub: answered without running its tests
    assert "untouched" in rows["99.3"]["first_failure"] and rows["99.3"]["tests"] == 0
    assert "builds on exercise 99.3" in rows["99.6"]["first_failure"]


def test_an_untouched_stub_is_not_implemented_without_starting_pytest(course, monkeypatch):
    def no_pytest(*args, **kwargs):
        raise AssertionError("pytest was started for an untouched stub")

    monkeypatch.setattr(grading.subprocess, "Popen", no_pytest)
    result = grading.grade(["99.3"], impl="exercises", root=course)[0]
    assert result.status == "not implemented" and result.untouched and result.tests == []
    assert "not implemented yet: write triple" in render_text(result)
    with pytest.raises(AssertionError, match="pytest was started"):  # the edited 99.1 runs
        grading.grade(["99.1"], impl="exercises", root=course, rerun=True)


def _no_pytest(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("pytest was started")

    monkeypatch.setattr(grading.subprocess, "Popen", refuse)


def test_a_pass_is_answered_from_the_record_until_the_code_changes(tmp_path, monkeypatch):
    root = make_course(tmp_path / "c")
    first = grading.grade(["99.1", "99.2"], impl="solutions", root=root)
    assert [r.status for r in first] == ["passed", "passed"]
    assert all(r.recorded_at is None for r in first)
    with monkeypatch.context() as m:
        _no_pytest(m)
        again = grading.grade(["99.1", "99.2"], impl="solutions", root=root)
        assert [r.status for r in again] == ["passed", "passed"]
        assert all(r.recorded_at is not None for r in again)
        assert [len(r.tests) for r in again] == [len(r.tests) for r in first]
        assert "not run again" in render_text(again[0])
        with pytest.raises(AssertionError, match="pytest was started"):
            grading.grade(["99.1"], impl="solutions", root=root, rerun=True)
        # the solutions' record says nothing of exercises/ (here an untouched stub)
        assert grading.grade(["99.1"], impl="exercises", root=root)[0].status == \
            "not implemented"
        source = root / "solutions" / "ex99_fake.py"
        source.write_text(source.read_text() + "\n# an edit anywhere in the code under test\n")
        with pytest.raises(AssertionError, match="pytest was started"):
            grading.grade(["99.1"], impl="solutions", root=root)


def test_failures_and_partial_sessions_are_not_recorded(tmp_path, monkeypatch):
    root = make_course(tmp_path / "c")
    edit_as_learner(root)
    assert grading.grade(["99.2"], impl="exercises", root=root)[0].status == "failed"
    # a session that left one of 99.2's tests out proves nothing about 99.2
    subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/graded", "--impl", "solutions",
                    "-k", "not test_double"], cwd=root, capture_output=True, timeout=120,
                   env={**os.environ, "CPCOURSE_ROOT": str(root)})
    _no_pytest(monkeypatch)
    assert grading.grade(["99.1"], impl="solutions", root=root)[0].recorded_at is not None
    for impl in ("exercises", "solutions"):
        with pytest.raises(AssertionError, match="pytest was started"):
            grading.grade(["99.2"], impl=impl, root=root)


def test_a_stub_with_any_edit_is_graded_by_its_tests(tmp_path):
    root = make_course(tmp_path / "c")
    path = root / "exercises" / "ex99_fake.py"
    marker = "    # Exercise 99.3: write"
    assert marker in path.read_text()
    path.write_text(path.read_text().replace(marker, "    # thinking...\n" + marker))
    result = grading.grade(["99.3"], impl="exercises", root=root)[0]
    assert result.status == "not implemented" and not result.untouched
    assert [t.outcome for t in result.tests] == ["failed"]
    assert "Exercise 99.3 triple" in result.first_failure


def test_grade_solutions_pass(course, capsys, monkeypatch):
    monkeypatch.setenv("CPCOURSE_ROOT", str(course))
    code = grading.main(["--impl", "solutions", "--ex", "99.1", "--ex", "99.2", "--ex", "99.6"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "3 of 3 exercises pass (solutions" in out
    assert out.splitlines()[0].split() == ["id", "title", "status", "tests", "hints", "first",
                                         "failure"]


def test_check_times_out_and_leaves_no_process(course, tmp_path, monkeypatch, capsys):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    start = time.monotonic()
    result = grading.check("99.4", timeout=8, root=course)
    elapsed = time.monotonic() - start
    assert result.status == "timed out" and not result.passed
    assert "timed out after 8 s in test_spin" in result.first_failure
    assert "an infinite loop or a deadlock" in result.first_failure
    assert elapsed < 60  # bounded by the limit plus the grace periods, not by the loop
    shown = capsys.readouterr().out
    assert "TIMED OUT" in shown and "timed out after 8 s" in shown
    if pids.exists():  # the test had started: its process and its detached child are gone
        for pid in map(int, pids.read_text().split()):
            for _ in range(50):
                if not _running(pid):
                    break
                time.sleep(0.1)
            assert not _running(pid), f"process {pid} survived the timeout"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def test_check_strict_mode_raises(course, monkeypatch, capsys):
    monkeypatch.setenv("CPCOURSE_STRICT_CHECKS", "1")
    with pytest.raises(grading.CheckFailed, match="99.3.*not implemented"):
        grading.check("99.3", root=course)
    assert "NOT IMPLEMENTED" in capsys.readouterr().out


def test_bad_input_is_an_input_error(course, monkeypatch):
    monkeypatch.setenv("CPCOURSE_ROOT", str(course))
    with pytest.raises(InputError, match="no exercise '42.1'"):
        grading.check("42.1")
    with pytest.raises(InputError, match="--impl"):
        grading.main(["--impl", "mine"])
    with pytest.raises(InputError, match="exercises or solutions"):
        grading.check("99.1", impl="nope")


def test_panels_say_what_to_do(learner_grade, course, monkeypatch):
    monkeypatch.setenv("CPCOURSE_ROOT", str(course))
    from cpcourse.course.stubs import get_exercise

    failed = grading.ExerciseResult(
        get_exercise("99.2"), "exercises", "failed",
        [grading.TestOutcome("t.py::test_double", "99.2", "failed", "AssertionError: <boom>"),
         grading.TestOutcome("t.py::test_other", "99.2", "passed")])
    text, html = render_text(failed), render_html(failed)
    assert "FAILED" in text and "1 of 2 graded tests pass" in text and "<boom>" in text
    assert "data-cpcourse-check='failed'" in html and "&lt;boom&gt;" in html
    todo = grading.ExerciseResult(get_exercise("99.3"), "exercises", "not implemented")
    assert "write triple in exercises/ex99_fake.py" in render_text(todo)
    table = render_table([failed, todo], 1.0)
    assert "0 of 2 exercises pass" in table and "test_double: AssertionError" in table


EXPECT_STUBS = '''\
import pytest


@pytest.mark.ex("99.1")
def test_calls_the_stub(impl):
    impl("ex99_fake").add(1, 2)


@pytest.mark.ex("99.1")
def test_never_calls_the_exercise(impl):
    assert 1 + 1 == 2


@pytest.mark.ex("99.3")
def test_breaks_before_the_stub(impl):
    raise ValueError("a bug in the test")


@pytest.mark.ex("99.3")
def test_own_not_implemented(impl):
    raise NotImplementedError("Exercise 99.3 triple: but raised by the test itself")
'''


def test_expect_stubs_accepts_only_the_stubs_own_error(tmp_path):
    root = make_course(tmp_path / "c", {"test_ex99_expect.py": EXPECT_STUBS})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "tests/graded",
                           "--impl", "exercises", "--expect-stubs"], cwd=root,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CPCOURSE_ROOT": str(root)})
    status = {line.split()[1].split("::")[-1]: line.split()[0]
              for line in proc.stdout.splitlines() if line.startswith(("PASSED", "FAILED"))}
    assert status == {"test_calls_the_stub": "PASSED",
                      "test_never_calls_the_exercise": "FAILED",
                      "test_breaks_before_the_stub": "FAILED",
                      "test_own_not_implemented": "FAILED"}, proc.stdout
    assert "passed on the untouched stubs" in proc.stdout
    assert "got ValueError: a bug in the test" in proc.stdout


def test_graded_test_without_marker_is_refused(tmp_path):
    text = "def test_unmarked(impl):\n    impl('ex99_fake').add(1, 2)\n"
    root = make_course(tmp_path / "c", {"test_ex99_bad.py": text})
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/graded"], cwd=root,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CPCOURSE_ROOT": str(root)})
    assert proc.returncode == 4  # a usage error, not a silently ungraded test
    assert "needs @pytest.mark.ex" in proc.stdout + proc.stderr


def test_a_ranks_stub_error_counts_as_the_stub(course):
    """cpcourse.launch re-raises a rank's error as RankError, its traceback as text."""
    from cpcourse.course.stubs import stub_error_id

    class RankError(Exception):
        exc_type, message = "NotImplementedError", "Exercise 99.3 triple: read notebook 99."
        traceback = ('Traceback (most recent call last):\n'
                     '  File "/x/launch/entry.py", line 9, in run\n'
                     f'  File "{course}/exercises/ex99_fake.py", line 30, in triple\n')

    assert stub_error_id(RankError(), course) == "99.3"
    RankError.traceback = RankError.traceback.replace("exercises/", "solutions/")
    assert stub_error_id(RankError(), course) is None  # raised elsewhere: not the stub's
    RankError.exc_type = "ValueError"
    assert stub_error_id(RankError(), course) is None


def test_expect_stubs_needs_exercises(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/graded",
                           "--impl", "solutions", "--expect-stubs", "--co"],
                          cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and "use it with --impl exercises" in proc.stderr


def test_a_timeout_before_the_tests_started_is_timed_out(course):
    """Stopped while pytest was still importing: it said "error ... KeyboardInterrupt" (our own
    SIGINT), not "timed out"."""
    from cpcourse.course.stubs import get_exercise

    run = grading._Run({}, None, True, 2, "  import torch\nKeyboardInterrupt\n", 0.5)
    res = grading._grade(get_exercise("99.1", course), "solutions", run, 0.5)
    assert res.status == "timed out", res.detail
    assert "timed out after 0.5 s before the tests started" in res.detail


def test_sigterm_stops_pytest_and_removes_the_log(course, tmp_path, monkeypatch):
    """`cpcourse grade` killed by SIGTERM left its cpcourse-grade-*.jsonl in the temp dir."""
    import signal

    from cpcourse.launch.proctree import Terminated

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("this process already handles SIGTERM")
    monkeypatch.setattr(grading.tempfile, "tempdir", str(tmp_path))

    class Pytest:  # the pytest subprocess, while SIGTERM arrives
        pid, returncode, stdout = 0, None, iter(())

        def __init__(self, cmd, **kwargs):
            self.waits = 0

        def poll(self):
            return 0

        def wait(self, timeout=None):
            self.waits += 1
            if self.waits > 1:  # stop_tree's wait, after the signal
                return 0
            handler = signal.getsignal(signal.SIGTERM)
            assert callable(handler), "no SIGTERM handler while pytest runs"
            handler(signal.SIGTERM, None)  # what the signal would do, without sending it

    monkeypatch.setattr(grading.subprocess, "Popen", Pytest)
    with pytest.raises(Terminated) as caught:
        grading.grade(["99.1"], impl="solutions", root=course, rerun=True)
    assert caught.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_the_grade_table_names_each_exercise_once_and_what_to_do_next():
    from cpcourse.course.panels import distinct_titles, next_line
    from cpcourse.course.stubs import registry

    exercises = list(registry().values())
    titles = distinct_titles(exercises)
    assert len(set(titles.values())) == len(exercises), "two exercises share a title"
    assert not any(t.lower().startswith("exercise") for t in titles.values())
    todo = [grading.ExerciseResult(ex, "exercises", "not implemented", untouched=True)
            for ex in exercises]
    table = render_table(todo, 1.0)
    first = exercises[0]
    assert table.splitlines()[-1] == next_line(todo)
    assert f"next: {first.id}" in table and f"exercises/{first.module}.py" in table
    assert re.search(rf"notebook {first.id[:2]} §\d+", table), table.splitlines()[-1]
    assert "not started" in table and "untouched" not in table  # no 46 identical sentences
    assert max(len(t) for t in titles.values()) > 28  # titles are not cut
    done = [grading.ExerciseResult(ex, "solutions", "passed") for ex in exercises[:2]]
    assert next_line(done).startswith("every exercise passes")


def test_an_optional_exercise_does_not_fail_the_grade(monkeypatch, capsys):
    from cpcourse.course.grading import ExerciseResult
    from cpcourse.course.stubs import Exercise

    def ex(i, optional):
        return Exercise(i, "ex98_fake", "f", "notebook 98", "", 1, (), optional)

    def fake(status):
        return lambda *a, **k: [ExerciseResult(ex("98.1", False), "solutions", "passed"),
                                ExerciseResult(ex("98.2", True), "solutions", status)]

    for status, code in (("skipped", 0), ("not implemented", 0)):
        monkeypatch.setattr(grading, "grade", fake(status))
        assert grading.main(["--impl", "solutions", "--json"]) == code, status
        capsys.readouterr()
    monkeypatch.setattr(grading, "grade", lambda *a, **k: [
        ExerciseResult(ex("98.1", False), "solutions", "failed")])
    assert grading.main(["--impl", "solutions", "--json"]) == 1
