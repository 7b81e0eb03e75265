"""The record of exercises that passed, keyed by everything their grade depends on.

    python -c "import cpcourse; cpcourse.check('02.1'); cpcourse.check('02.1')"  # 2nd: recorded

An exercise's graded tests read the code under test (`solutions/` or `exercises/`), the graded
test files and their conftest, and the `cpcourse` package with its data. When none of these has
changed since the exercise passed, under the same Python, torch, diffusers, hypothesis and pytest,
the tests would pass again: `check()` and `grade()` answer from this record instead of starting
pytest (and, for the multi-process exercises, ranks). An edit to any of those files changes the
fingerprint and the record no longer applies. Only passes are kept: a failure is always run again,
since the learner is about to change something. `check(id, rerun=True)` ignores the record.

Every pytest session over tests/graded writes it (tests/conftest.py makes a `SessionRecorder`): a
`check()`, and `make test`, whose notebooks then find their solutions' checks already graded.
An exercise is recorded only when every file that marks it was collected, none of its tests was
deselected, all of them passed, and nothing was edited while they ran. The record lives in
`.cpcourse-cache/` at the course root (git-ignored; delete it at will).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

DIRNAME = ".cpcourse-cache"
_VERSIONS = ("torch", "diffusers", "hypothesis", "pytest")


def graded_files(ids: list[str], root: Path) -> list[Path]:
    """The files of tests/graded that mark a test `ex("ID")` for one of `ids` (a text scan).

    Collecting only these keeps a check from importing every graded module (notebook 08's
    imports diffusers, seconds on a laptop); pytest's `--ex` still selects the tests.
    """
    marks = [m for i in ids for m in (f'ex("{i}")', f"ex('{i}')")]
    return [path for path in sorted((root / "tests" / "graded").glob("test_*.py"))
            if any(m in path.read_text(errors="replace") for m in marks)]


def _files(impl: str, root: Path) -> list[Path]:
    package = Path(__file__).resolve().parents[1]
    ours = [p for p in package.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    graded = (root / "tests" / "graded").glob("*.py")
    return sorted(ours) + sorted((root / impl).glob("*.py")) + sorted(graded) + [
        root / "tests" / "conftest.py"]


def fingerprint(impl: str, root: Path) -> str:
    """A digest of every file and version a graded result depends on (about 20 ms)."""
    h = hashlib.sha256(f"{impl}\0{sys.version}\0".encode())
    for dist in _VERSIONS:
        try:
            h.update(f"{dist}={metadata.version(dist)}\0".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=none\0".encode())
    for path in _files(impl, root):
        h.update(path.name.encode() + b"\0")
        try:
            h.update(path.read_bytes())
        except OSError:
            h.update(b"(missing)")
    return h.hexdigest()


def _path(impl: str, root: Path) -> Path:
    return root / DIRNAME / f"passed-{impl}.json"


def _read(impl: str, root: Path) -> dict:
    try:
        data = json.loads(_path(impl, root).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # no record, or a broken one: grading runs the tests, as without a record


def lookup(exercise_id: str, impl: str, root: Path, fp: str) -> dict | None:
    """{"time", "tests", "seconds"} when `exercise_id` passed with fingerprint `fp`, else None."""
    entry = _read(impl, root).get(exercise_id)
    if isinstance(entry, dict) and entry.get("fingerprint") == fp and entry.get("tests"):
        return entry
    return None


def record(passed: dict[str, dict], impl: str, root: Path, fp: str) -> None:
    """Add {exercise id: {"tests": [node ids], "seconds": s}} as passed under `fp`."""
    if not passed:
        return
    data = _read(impl, root)
    now = time.time()
    for ex_id, info in passed.items():
        data[ex_id] = {"fingerprint": fp, "time": now, **info}
    target = _path(impl, root)
    try:
        target.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".passed-")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, target)  # readers see the old record or the new one, never half
    except OSError:
        pass  # a read-only checkout: grading still works, it just runs the tests every time


class SessionRecorder:
    """What one pytest session over graded tests proves, recorded exercise by exercise as the
    last test of each ends, so that later tests of the same session (the notebooks, in `make
    test`) already find it. Made by tests/conftest.py once collection is final."""

    def __init__(self, items: list, deselected: set[str], impl: str, root: Path, exercise_of):
        self.impl, self.root = impl, root
        self.fp = fingerprint(impl, root)
        by_ex: dict[str, list] = {}
        self.exercise_by_node: dict[str, str] = {}
        for item in items:
            if (ex_id := exercise_of(item)) is not None:
                by_ex.setdefault(ex_id, []).append(item)
                self.exercise_by_node[item.nodeid] = ex_id
        self.pending: dict[str, set[str]] = {}
        for ex_id, mine in by_ex.items():
            needed = set(graded_files([ex_id], root))
            if ex_id not in deselected and needed and needed <= {Path(i.path) for i in mine}:
                self.pending[ex_id] = {i.nodeid for i in mine}
        self.state: dict[str, dict[str, list]] = {ex_id: {} for ex_id in self.pending}

    def report(self, report) -> None:
        """One phase's report of a test (pytest_runtest_logreport)."""
        ex_id = self.exercise_by_node.get(report.nodeid)
        if ex_id not in self.pending:
            return
        state = self.state[ex_id].setdefault(report.nodeid, ["passed", 0.0])
        if report.outcome != "passed":
            state[0] = report.outcome  # a failed setup, a skip, a failed call or teardown
        state[1] += report.duration
        if report.when != "teardown":
            return
        self.pending[ex_id].discard(report.nodeid)
        if self.pending[ex_id]:
            return
        del self.pending[ex_id]
        tests = self.state.pop(ex_id)
        if all(outcome == "passed" for outcome, _ in tests.values()) \
                and fingerprint(self.impl, self.root) == self.fp:  # nothing edited meanwhile
            record({ex_id: {"tests": sorted(tests),
                            "seconds": round(sum(sec for _, sec in tests.values()), 3)}},
                   self.impl, self.root, self.fp)
