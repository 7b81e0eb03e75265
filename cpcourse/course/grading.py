"""Grading: `check("00.1")` in a notebook cell, `cpcourse grade` in a shell.

    cpcourse grade --impl solutions --json

Both run the graded tests (tests/graded, selected by exercise id) in a pytest subprocess with a
time limit, so a learner's infinite loop or deadlock ends in "timed out after N s" and the whole
process tree is stopped. Outcomes come back test by test through `cpcourse.course.gradeplugin`,
loaded into that pytest as a plugin, which appends one JSON line per event to the file named by
$CPCOURSE_GRADE_LOG; a killed run still leaves the lines written before it died.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cpcourse.course import gradecache
from cpcourse.course.exercises import impl_from_env
from cpcourse.course.exercises import show as show_notice
from cpcourse.course.hints import hints_used
from cpcourse.course.results import ExerciseResult, TestOutcome
from cpcourse.course.stubs import (
    Exercise,
    course_root,
    get_exercise,
    registry,
    untouched,
)
from cpcourse.launch.proctree import raise_on_sigterm, stop_tree
from cpcourse.support.errors import ArgumentParser, positive_float

DEFAULT_CHECK_TIMEOUT = 120.0
DEFAULT_GRADE_TIMEOUT = 600.0


# ---- the caller side ---------------------------------------------------------------------

@dataclass
class _Run:
    outcomes: dict[str, TestOutcome]
    running: str | None
    timed_out: bool
    returncode: int | None
    output: str
    seconds: float


def _run_pytest(ids: list[str] | None, impl: str, timeout: float, root: Path) -> _Run:
    # SIGTERM as an exception, so that the `finally` blocks stop pytest and remove the log
    restore = raise_on_sigterm()
    fd, log = tempfile.mkstemp(prefix="cpcourse-grade-", suffix=".jsonl")
    os.close(fd)
    try:
        return _run_pytest_logged(ids, impl, timeout, root, log)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(log)
        restore()


def _run_pytest_logged(ids: list[str] | None, impl: str, timeout: float, root: Path,
                       log: str) -> _Run:
    # An exercise whose marker no file shows still runs over all of tests/graded ("no tests").
    files = gradecache.graded_files(ids, root) if ids else []
    where = [str(f.relative_to(root)) for f in files] or ["tests/graded"]
    cmd = [sys.executable, "-m", "pytest", *where, "-p", "cpcourse.course.gradeplugin",
           "-p", "no:cacheprovider", "-q", "--no-header", "-rN", "--impl", impl]
    for ex_id in ids or []:
        cmd += ["--ex", ex_id]
    env = {**os.environ, "CPCOURSE_GRADE_LOG": log, "CPCOURSE_ROOT": str(root),
           "PYTHONUNBUFFERED": "1"}
    env.pop("CPCOURSE_STRICT_CHECKS", None)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True, errors="replace")
    chunks: list[str] = []
    # A reader thread: an orphaned grandchild may hold the pipe open after pytest is gone.
    reader = threading.Thread(target=lambda: chunks.extend(proc.stdout), daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # also on Ctrl-C (the learner pressed stop) and SIGTERM: no orphans, no litter
        stop_tree(proc, interrupt_first=True)
        reader.join(timeout=2)
    seconds = time.monotonic() - start
    outcomes, running = _outcomes(Path(log).read_text())
    return _Run(outcomes, running, timed_out, proc.returncode, "".join(chunks), seconds)


def _outcomes(text: str) -> tuple[dict[str, TestOutcome], str | None]:
    """Each test's outcome from the plugin's log, and the test still running when it ended."""
    outcomes, running = {}, None
    events = [json.loads(line) for line in text.splitlines() if line.strip()]
    for ev in events:
        node = ev["nodeid"]
        if ev["event"] == "collected":
            outcomes[node] = TestOutcome(node, ev["ex"])
        elif ev["event"] == "start":
            running = node
        elif node in outcomes:
            t = outcomes[node]
            t.seconds += ev["seconds"]
            if ev["outcome"] == "failed":
                if t.outcome != "failed":
                    t.message, t.not_implemented = ev["message"], ev["stub"]
                t.outcome = "failed" if ev["when"] == "call" else "error"
            elif t.outcome == "not run":
                t.outcome = ev["outcome"]
            if running == node and ev["when"] in ("call", "teardown"):
                running = None
    return outcomes, running


def _where_interrupted(output: str) -> str:
    """The learner's line pytest was in when interrupted ('exercises/ex01_attention.py:42')."""
    hits = re.findall(r"((?:\S*/)?exercises/ex\w+\.py):(\d+)", output)
    return f"{Path(hits[-1][0]).name}:{hits[-1][1]}" if hits else ""


def _grade(ex: Exercise, impl: str, run: _Run, timeout: float) -> ExerciseResult:
    tests = [t for t in run.outcomes.values() if t.exercise == ex.id]
    res = ExerciseResult(ex, impl, "passed", tests, seconds=sum(t.seconds for t in tests))
    unfinished = [t for t in tests if t.outcome == "not run"]
    if run.timed_out and unfinished:
        res.status = "timed out"
        stuck = run.running if run.running in {t.nodeid for t in tests} else unfinished[0].nodeid
        at = _where_interrupted(run.output)
        res.detail = (f"timed out after {timeout:g} s in {stuck.split('::')[-1]}"
                      + (f" (last seen at exercises/{at})" if at else "")
                      + ": an infinite loop or a deadlock? The test processes were stopped.")
    elif run.timed_out and not tests:  # stopped while pytest started: its KeyboardInterrupt
        res.status = "timed out"     # is our own SIGINT, not an error in the tests
        res.detail = (f"timed out after {timeout:g} s before the tests started (starting pytest "
                      "and importing torch take a few seconds): give it a longer timeout")
    elif not tests:
        if run.returncode not in (0, 1, 5):
            res.status = "error"
            tail = [ln for ln in run.output.strip().splitlines() if ln.strip()][-3:]
            res.detail = "the graded tests did not run: " + " | ".join(tail)
        else:
            res.status = "no tests"
            res.detail = "no graded test is marked for this exercise yet"
    elif res.failures:
        stubs = {t.not_implemented for t in res.failures}
        if None in stubs:
            res.status = "failed"
        else:
            res.status = "not implemented"
            if ex.id not in stubs:
                res.detail = (f"it builds on exercise {', '.join(sorted(stubs))}, not "
                              "implemented yet")
    elif unfinished or all(t.outcome == "skipped" for t in tests):
        res.status = "error" if unfinished else "skipped"
        res.detail = "pytest stopped before these tests ran" if unfinished else ""
    return res


def grade(ids: list[str] | None = None, *, impl: str | None = None, timeout: float | None = None,
          root: Path | None = None, rerun: bool = False) -> list[ExerciseResult]:
    """Grade the exercises `ids` (all when None) in one pytest subprocess.

    Untouched stubs are "not implemented" at once; an exercise that passed with this very code
    (`cpcourse.course.gradecache`) is "passed" from the record unless `rerun`.
    """
    impl = impl_from_env(impl)
    root = (Path(root) if root else course_root()).resolve()
    table = registry(root)
    exercises = [get_exercise(i, root) for i in ids] if ids else list(table.values())
    timeout = positive_float("--timeout", DEFAULT_GRADE_TIMEOUT if timeout is None else timeout,
                             high=86_400)
    # An untouched stub can only end "not implemented": say so at once instead of starting
    # pytest (and, for the multi-process exercises, ranks) to watch it raise.
    quick = {e.id for e in exercises if impl == "exercises"
             and gradecache.graded_files([e.id], root) and untouched(e, root)}
    # the digest reads the package (~20 ms): only when some exercise could be in the record
    fp = None if rerun or all(e.id in quick for e in exercises) else \
        gradecache.fingerprint(impl, root)
    kept = {e.id: rec for e in exercises if fp and e.id not in quick
            and (rec := gradecache.lookup(e.id, impl, root, fp))}
    todo = [e.id for e in exercises if e.id not in quick and e.id not in kept]
    run = (_run_pytest(todo if ids or quick or kept else None, impl, timeout, root) if todo
           else _Run({}, None, False, 0, "", 0.0))
    results = []
    for ex in exercises:
        if ex.id in quick:
            results.append(ExerciseResult(ex, impl, "not implemented", untouched=True))
        elif ex.id in kept:
            rec = kept[ex.id]
            tests = [TestOutcome(node, ex.id, "passed") for node in rec["tests"]]
            results.append(ExerciseResult(ex, impl, "passed", tests, seconds=rec["seconds"],
                                          recorded_at=rec["time"]))
        else:
            results.append(_grade(ex, impl, run, timeout))
    used = hints_used(root)
    for r in results:
        r.hints_used = used.get(r.exercise.id, 0)
    return results


class CheckFailed(AssertionError):
    """Raised by check() when $CPCOURSE_STRICT_CHECKS is set (how the notebook tests run)."""


def check(exercise_id: str, *, impl: str | None = None, timeout: float | None = None,
          root: Path | None = None, show: bool = True, rerun: bool = False) -> ExerciseResult:
    """Run exercise `exercise_id`'s graded tests in a subprocess, show a pass/fail panel.

    impl: "exercises" (yours, the default) or "solutions"; $CPCOURSE_IMPL when not given.
    timeout: seconds before the tests are stopped (default 120, or $CPCOURSE_CHECK_TIMEOUT).
    rerun: run the tests even when they passed with this same code before (see the record,
    `cpcourse.course.gradecache`). Returns the result: `.passed`, `.status`, `.failures`,
    `.first_failure`.
    """
    from cpcourse.course.panels import render_html, render_text

    if timeout is None:
        timeout = os.environ.get("CPCOURSE_CHECK_TIMEOUT", DEFAULT_CHECK_TIMEOUT)
    timeout = positive_float("timeout", timeout, high=86_400)
    result = grade([exercise_id], impl=impl, timeout=timeout, root=root, rerun=rerun)[0]
    if show:
        show_notice(render_text(result), render_html(result))
    if not result.passed and os.environ.get("CPCOURSE_STRICT_CHECKS"):
        raise CheckFailed(f"check({exercise_id!r}) {result.status}: {result.first_failure}")
    return result


def main(argv: list[str]) -> int:
    """`cpcourse grade [--impl exercises|solutions] [--json] [--timeout S] [--ex ID ...]`."""
    from cpcourse.course.panels import render_table

    parser = ArgumentParser(prog="cpcourse grade", description="grade every exercise")
    parser.add_argument("--impl", choices=("exercises", "solutions"), default=None,
                        help="whose code to grade (default: $CPCOURSE_IMPL or exercises)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--timeout", type=float, default=DEFAULT_GRADE_TIMEOUT,
                        help=f"seconds for the whole run (default {DEFAULT_GRADE_TIMEOUT:g})")
    parser.add_argument("--rerun", action="store_true",
                        help="run every test, even of exercises that passed with this same code")
    parser.add_argument("--ex", action="append", default=None, metavar="ID",
                        help="only these exercises (repeatable)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results = grade(args.ex, impl=args.impl, timeout=args.timeout, rerun=args.rerun)
    seconds = time.monotonic() - start
    # an optional exercise (a GPU or Triton track) never fails the grade
    all_passed = bool(results) and all(r.passed or r.exercise.optional for r in results)
    if args.json:
        print(json.dumps({"impl": impl_from_env(args.impl), "passed": all_passed,
                          "exercises_passed": sum(r.passed for r in results),
                          "exercises_total": len(results), "seconds": round(seconds, 2),
                          "exercises": [r.as_dict() for r in results]}, indent=1,
                         allow_nan=False))
    else:
        print(render_table(results, seconds))
    return 0 if all_passed else 1
