"""The grader's side inside the pytest subprocess that `check()` and `cpcourse grade` start.

    python -m pytest tests/graded -p cpcourse.course.gradeplugin --ex 02.1   # as grading runs it

Loaded with `-p`, it appends one JSON line per event (collected, start, report) to the file named
by $CPCOURSE_GRADE_LOG, which `cpcourse.course.grading` reads back test by test; a killed run
still leaves the lines written before it died. A report notes whether the test died of an
untouched stub's NotImplementedError (any exercise's), so the caller can say "not implemented".
"""

from __future__ import annotations

import json
import os

from cpcourse.course.stubs import stub_error_id

_STUBS: dict[tuple[str, str], str | None] = {}  # (nodeid, phase) -> stub's exercise id

def _log(event: dict) -> None:
    path = os.environ.get("CPCOURSE_GRADE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(event) + "\n")


def pytest_collection_finish(session):
    for item in session.items:
        mark = item.get_closest_marker("ex")
        if mark and mark.args:
            _log({"event": "collected", "nodeid": item.nodeid, "ex": mark.args[0]})


def pytest_runtest_logstart(nodeid, location):
    _log({"event": "start", "nodeid": nodeid})


def pytest_runtest_makereport(item, call):
    """Note on the report whether the test died of an untouched stub (any exercise's)."""
    if call.excinfo is not None:
        _STUBS[(item.nodeid, call.when)] = stub_error_id(call.excinfo.value)


def pytest_runtest_logreport(report):
    if report.when != "call" and report.outcome == "passed":
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else report.longreprtext
    if report.skipped and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[-1])
    stub = _STUBS.pop((report.nodeid, report.when), None)
    _log({"event": "report", "nodeid": report.nodeid, "when": report.when,
          "outcome": report.outcome, "message": message[:2000], "stub": stub,
          "seconds": report.duration})
