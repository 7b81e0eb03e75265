"""Every notebook runs top to bottom in a fresh kernel, once; every check it makes passes on
the solutions.

    python -m pytest tests/notebooks
    CPCOURSE_NOTEBOOK_MODES=stubs,solutions python -m pytest tests/notebooks   # both executions

Stubs mode (CPCOURSE_IMPL=exercises), what a learner first sees: no cell may raise; exercise
cells fall back to the reference, which is `solutions/` itself (`cpcourse.course.exercise`), so
this one execution also runs every later cell on the reference answers. What a solutions-mode
execution would add is that each `cpcourse.check("ID")` passes: the graded tests of those ids
on the solutions prove that, and `make test` has just run them (their record,
`cpcourse.course.gradecache`, answers here; without it they are graded now). Each notebook is
thus executed once per run (the graded tests are not run a second time through it); with
CPCOURSE_NOTEBOOK_MODES=stubs,solutions both executions run, as before (solutions mode:
CPCOURSE_STRICT_CHECKS=1, a failing check raises). Two notebooks execute at once, one torch
thread each. Executed copies and a JSON summary (seconds, check panels) of each run go to
artifacts/notebooks/.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

from cpcourse.launch.proctree import stop_tree

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
ARTIFACTS = ROOT / "artifacts" / "notebooks"
RUNNER = Path(__file__).with_name("nbrun.py")
ALL_MODES = {"stubs": {"CPCOURSE_IMPL": "exercises"},
             "solutions": {"CPCOURSE_IMPL": "solutions", "CPCOURSE_STRICT_CHECKS": "1"}}
MODES = [m.strip() for m in os.environ.get("CPCOURSE_NOTEBOOK_MODES", "stubs").split(",")
         if m.strip()]
assert MODES and set(MODES) <= set(ALL_MODES), \
    f"CPCOURSE_NOTEBOOK_MODES={MODES}: use stubs, solutions or stubs,solutions"
TIME_LIMIT_S = 300  # per notebook and mode; a notebook should take well under 60 s
CHECK = re.compile(r"""\bcheck\(\s*["'](\d\d[a-z]?\.\d+)["']""")
_pool = ThreadPoolExecutor(max_workers=2)
_runs: dict[tuple[Path, str], Future] = {}


def _execute(nb: Path, mode: str) -> dict:
    env = {**os.environ, **ALL_MODES[mode], "CPCOURSE_ROOT": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHONUNBUFFERED": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    if mode == "stubs":
        env.pop("CPCOURSE_STRICT_CHECKS", None)
    dest = ARTIFACTS / f"{nb.stem}.{mode}.ipynb"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, str(RUNNER), str(nb), str(dest)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIME_LIMIT_S)
    except subprocess.TimeoutExpired:
        stop_tree(proc)  # the kernel and whatever it launched go too
        return {"ok": False, "error": {"cell": None, "ename": "Timeout", "source": "",
                                       "evalue": f"the notebook took over {TIME_LIMIT_S} s",
                                       "traceback": ""}}
    lines = out.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"ok": False, "error": {"cell": None, "ename": "RunnerFailed",
                                       "evalue": err[-3000:], "source": "", "traceback": ""}}
    result = json.loads(lines[-1])
    (ARTIFACTS / f"{nb.stem}.{mode}.json").write_text(json.dumps(result, indent=1))
    return result


EXECUTING = ("test_runs_on_untouched_stubs", "test_every_check_passes_on_solutions")


@pytest.fixture(scope="session")
def queue_notebooks(request):
    """Queue every selected notebook in every mode, in order, on two workers, so that the next
    notebook runs while this one's test waits (only what this session selected: `-k 02_`)."""
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if getattr(item, "originalname", None) in EXECUTING and spec and "nb" in spec.params:
            for m in MODES:
                if (spec.params["nb"], m) not in _runs:
                    _runs[(spec.params["nb"], m)] = _pool.submit(_execute, spec.params["nb"], m)
    yield
    for future in _runs.values():
        future.cancel()  # an interrupted session leaves nothing queued


def _run(nb: Path, mode: str) -> dict:
    """`nb` executed in `mode` (queued by `queue_notebooks`, or now)."""
    if (nb, mode) not in _runs:
        _runs[(nb, mode)] = _pool.submit(_execute, nb, mode)
    return _runs[(nb, mode)].result()


def checks_in(nb: Path) -> list[str]:
    """The exercise ids `nb` grades with `cpcourse.check("ID")`, in order."""
    book = nbformat.read(nb, as_version=4)
    return list(dict.fromkeys(i for c in book.cells if c.cell_type == "code"
                              for i in CHECK.findall(c.source)))


def _explain(nb: Path, mode: str, result: dict) -> str:
    err = result["error"]
    where = f"cell {err['cell']}" if err.get("cell") is not None else "the run"
    return (f"{nb.name} ({mode}): {where} raised {err['ename']}: {err['evalue']}\n"
            f"--- source ---\n{err.get('source', '')}\n--- traceback ---\n"
            f"{err.get('traceback', '')}\n(executed copy: "
            f"{(ARTIFACTS / f'{nb.stem}.{mode}.ipynb').relative_to(ROOT)})")


ids = [p.stem for p in NOTEBOOKS]


@pytest.mark.notebook
@pytest.mark.timeout(600)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=ids)
def test_runs_on_untouched_stubs(nb, queue_notebooks):
    if "stubs" not in MODES:
        pytest.skip("CPCOURSE_NOTEBOOK_MODES leaves out stubs")
    result = _run(nb, "stubs")
    assert result["ok"], _explain(nb, "stubs", result)
    # On stubs a check says "not implemented" ("passed" once a learner solved it); "error",
    # "timed out" or "no tests" would mean the machinery or the exercise is broken.
    odd = [c for c in result["checks"] if c not in ("not implemented", "passed")]
    assert not odd, f"{nb.name}: check() panels {odd} on the untouched stubs"
    assert len(result["checks"]) >= len(checks_in(nb)), \
        f"{nb.name}: {len(checks_in(nb))} check() calls in the source, " \
        f"{len(result['checks'])} panels shown"


@pytest.mark.notebook
@pytest.mark.timeout(600)
@pytest.mark.parametrize("nb", NOTEBOOKS, ids=ids)
def test_every_check_passes_on_solutions(nb, queue_notebooks):
    if "solutions" in MODES:
        result = _run(nb, "solutions")
        assert result["ok"], _explain(nb, "solutions", result)
        bad = [c for c in result["checks"] if c != "passed"]
        assert not bad, f"{nb.name}: check() panels {bad} on the solutions"
        return
    from cpcourse.course.grading import grade

    ids = checks_in(nb)
    if not ids:
        return
    # from the record of this run's graded tests when there is one, else graded now
    results = grade(ids, impl="solutions", root=ROOT, timeout=600)
    bad = {r.exercise.id: (r.status, r.first_failure) for r in results if not r.passed}
    assert not bad, f"{nb.name}: its checks fail on the solutions: {bad}"


def test_the_check_ids_are_read_from_the_source():
    ids = {nb.stem[:2]: checks_in(nb) for nb in NOTEBOOKS}
    assert ids["02"] and all(i.startswith("02.") for i in ids["02"]), ids["02"]
    assert CHECK.findall('cpcourse.check("10a.1")\ncheck( \'04.2\')') == ["10a.1", "04.2"]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=ids)
def test_committed_without_outputs(nb):
    book = nbformat.read(nb, as_version=4)
    dirty = [i for i, c in enumerate(book.cells) if c.cell_type == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, (f"{nb.name}: cells {dirty} have outputs or execution counts; clear them: "
                       f"jupyter nbconvert --clear-output --inplace notebooks/{nb.name}")
    nbformat.validate(book)


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks/NN_topic.ipynb found"


def test_a_kernel_silent_at_startup_gets_one_fresh_start(monkeypatch, tmp_path):
    """Two kernels started at once can race for ports; one stayed silent for the whole startup
    timeout in CI. The runner starts a fresh kernel once when no cell has run, and reports the
    second failure."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nbrun", RUNNER)
    nbrun = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nbrun)
    src = tmp_path / "tiny.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), src)
    starts = []

    class Silent(nbrun.RunnerClient):
        def execute(self, **kwargs):
            starts.append(1)
            if len(starts) <= fail_times:
                raise RuntimeError("Kernel didn't respond in 90 seconds")
            return super().execute(**kwargs)

    monkeypatch.setattr(nbrun, "RunnerClient", Silent)
    fail_times = 1
    result = nbrun.main(str(src), str(tmp_path / "out.ipynb"))
    assert result["ok"] and len(starts) == 2, result
    starts.clear()
    fail_times = 2
    result = nbrun.main(str(src), str(tmp_path / "out.ipynb"))
    assert not result["ok"] and len(starts) == 2
    assert "didn't respond" in result["error"]["evalue"]
