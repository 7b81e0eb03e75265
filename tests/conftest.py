"""Test options shared by the whole suite: which implementation graded tests run.

    python -m pytest tests/graded --impl solutions            # the reference passes
    python -m pytest tests/graded --impl exercises --expect-stubs   # every stub fails, properly
    python -m pytest tests/graded --ex 00.1                   # one exercise (what check() runs)

Graded tests are marked `@pytest.mark.ex("00.1")` and get the code under test from the `impl`
fixture: `impl("ex00_tokens")` is `exercises.ex00_tokens` or `solutions.ex00_tokens`. Other tests
(unit, dist, notebooks) ignore `--impl`. With `--expect-stubs` a graded test passes only when it
raised an untouched stub's own NotImplementedError, and fails when it passed or raised anything
else: that is how CI proves no graded test can pass on the stubs, or fail for another reason.
"""

from __future__ import annotations

import os
import random

import pytest

from cpcourse.course import IMPLS, load
from cpcourse.course.gradecache import SessionRecorder
from cpcourse.course.stubs import course_root, registry, stub_error_id


def pytest_addoption(parser):
    group = parser.getgroup("cpcourse", "cpcourse graded exercises")
    group.addoption("--impl", choices=IMPLS, default="exercises",
                    help="graded tests run exercises/ (yours, default) or solutions/")
    group.addoption("--expect-stubs", action="store_true",
                    help="graded tests must fail with the untouched stubs' NotImplementedError")
    group.addoption("--ex", action="append", default=[], metavar="ID",
                    help="only the graded tests of exercise ID (e.g. 00.1); repeat or use commas")


# Distributed tests cannot use hypothesis inside a launch (every rank must see the same cases), so
# they draw their cases from this seed, new each session; the header prints it to reproduce a run.
TEST_SEED = int(os.environ.get("CPCOURSE_TEST_SEED") or random.SystemRandom().randrange(2**31))


def pytest_report_header(config):
    return f"random cases: CPCOURSE_TEST_SEED={TEST_SEED}"


@pytest.fixture(scope="session")
def cases_rng() -> random.Random:
    """Random cases for tests that launch ranks (pass the drawn values to the ranks)."""
    return random.Random(TEST_SEED)


def pytest_configure(config):
    if config.getoption("--expect-stubs") and config.getoption("--impl") != "exercises":
        raise pytest.UsageError("--expect-stubs checks the stubs: use it with --impl exercises")


def exercise_of(item) -> str | None:
    marks = list(item.iter_markers("ex"))
    return marks[0].args[0] if marks and marks[0].args else None


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--ex") and not any(
            exercise_of(i) or "graded" in i.path.parts for i in items):
        return  # no graded test here: unit and dist runs never parse solutions/
    known = registry()
    wanted = {i.strip() for opt in config.getoption("--ex") for i in opt.split(",") if i.strip()}
    for ex_id in sorted(wanted - set(known)):
        raise pytest.UsageError(f"--ex {ex_id}: no such exercise; known: {', '.join(known)}")
    keep, drop = [], []
    for item in items:
        ex_id = exercise_of(item)
        graded = "graded" in item.path.parts
        if graded and ex_id is None:
            raise pytest.UsageError(f"{item.nodeid}: every graded test needs "
                                    "@pytest.mark.ex(\"NN.M\") with its exercise id")
        if ex_id is not None and ex_id not in known:
            raise pytest.UsageError(f"{item.nodeid}: marked ex({ex_id!r}) but no solution marks "
                                    f"that exercise; known: {', '.join(known)}")
        (keep if not wanted or ex_id in wanted else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


_deselected: set[str] = set()  # exercises with a test left out by -k, -m or --ex
_recorder: list = []           # this session's SessionRecorder, once collection is final


def pytest_deselected(items):
    _deselected.update(e for i in items if (e := exercise_of(i)) is not None)


def pytest_collection_finish(session):
    """Record what this session's graded tests prove (`cpcourse.course.gradecache`)."""
    config = session.config
    if config.getoption("--expect-stubs") or not any(exercise_of(i) for i in session.items):
        return
    _recorder.append(SessionRecorder(session.items, _deselected, config.getoption("--impl"),
                                     course_root(), exercise_of))


def pytest_runtest_logreport(report):
    for recorder in _recorder:
        recorder.report(report)


@pytest.fixture
def impl_name(request) -> str:
    """"exercises" or "solutions": for code that loads the module itself (a launch()ed rank
    calls `cpcourse.course.load(impl_name, "ex04_ring")`)."""
    return request.config.getoption("--impl")


@pytest.fixture
def impl(request):
    """`impl("ex00_tokens")` -> the module under test, from exercises/ or solutions/."""
    which = request.config.getoption("--impl")
    return lambda module: load(which, module)


def _stub_ids(exc: BaseException) -> list[str | None]:
    """Exercise ids of the stub errors in `exc` (an ExceptionGroup may hold several)."""
    if isinstance(getattr(exc, "exceptions", None), tuple):  # an ExceptionGroup (hypothesis)
        return [i for e in exc.exceptions for i in _stub_ids(e)]
    return [stub_error_id(exc, course_root())]


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    ex_id = exercise_of(pyfuncitem)
    if ex_id is None or not pyfuncitem.config.getoption("--expect-stubs"):
        return (yield)
    try:
        result = yield
    except Exception as exc:
        ids = _stub_ids(exc)
        if ids and all(ids):
            return True  # the stub's own NotImplementedError: exactly what an untouched stub does
        pytest.fail(f"exercise {ex_id}: expected the untouched stub's NotImplementedError, got "
                    f"{type(exc).__name__}: {str(exc)[:300]}", pytrace=False)
    pytest.fail(f"exercise {ex_id}: this graded test passed on the untouched stubs, so it cannot "
                "tell a solved exercise from an unsolved one; make it call the exercise",
                pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """On a graded failure, end the report with where to read and the exercise's hint."""
    report = yield
    ex_id = exercise_of(item)
    stub = call.excinfo is not None and stub_error_id(call.excinfo.value, course_root())
    if ex_id and report.failed and call.when == "call" and not stub \
            and not item.config.getoption("--expect-stubs"):
        ex = registry().get(ex_id)
        if ex is not None:
            report.sections.append((f"exercise {ex.id}",
                                    f"{ex.function}: read {ex.where}. Hint: {ex.hint}"))
    return report
