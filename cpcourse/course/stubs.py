"""Solution markers: the one source of every exercise, the stubs derived from it, the registry.

    python tools/make_exercises.py --check

A reference answer lives once in `solutions/exNN_topic.py`. The part a learner writes is wrapped:

    # BEGIN SOLUTION 00.1 | notebook 00, "Counting tokens" | hint: T latent frames, then patches
    ...reference code...
    # END SOLUTION

Fields are separated by `|`: the exercise id, where to read (a quoted part is the exercise's
title), then the hint levels: `hint: ...` (the idea, which the stub's message shows),
`hint2: ...` (a worked small case), `hint3: ...` (the key line); `cpcourse.hint(id)` reveals
them one at a time. A field `optional` marks an exercise a passing grade does not need (one
that needs a GPU or Triton). Comment lines right after BEGIN that start with `# |` continue the
header (for hints longer than a line). `make_stub` replaces each marked region by a
`raise NotImplementedError("Exercise 00.1 <function>: read <where>. Hint: <hint>")` at the same
indentation; everything else (imports, signature, the docstring that is the spec) is shared.
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path

from cpcourse.course.markers import (  # noqa: F401 (re-exported: the course reads them here)
    BEGIN,
    CONTINUE,
    END,
    EXERCISE_ID,
    HINT_FIELD,
    STUB_MESSAGE,
    Exercise,
    function_source,
    make_stub,
    parse_solution,
    sort_key,
)
from cpcourse.support.errors import InputError


def untouched(ex: Exercise, root: Path | None = None) -> bool:
    """True when the learner's function holding exercise `ex` is still exactly the generated stub.

    Such a function raises the stub's NotImplementedError, and CI proves every graded test fails
    with it on the untouched stubs, so grading can answer "not implemented" without running them.
    """
    root = Path(root) if root else course_root()
    solution = root / "solutions" / f"{ex.module}.py"
    try:
        mine = (root / "exercises" / f"{ex.module}.py").read_text()
        stub = make_stub(solution.read_text(), solution)
    except (OSError, UnicodeDecodeError, InputError):
        return False
    got = function_source(mine, ex.function)
    return got is not None and got == function_source(stub, ex.function)


def course_root() -> Path:
    """The course checkout (holding solutions/, exercises/, tests/): $CPCOURSE_ROOT or the repo
    the package was installed from (editable), else the nearest parent of the working directory."""
    env = os.environ.get("CPCOURSE_ROOT")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2])  # cpcourse/course/stubs.py -> repo
    cwd = Path.cwd().resolve()
    candidates += [cwd, *cwd.parents]
    for c in candidates:
        if (c / "solutions").is_dir() and (c / "exercises").is_dir():
            return c
    raise InputError("cannot find the course folder (with solutions/ and exercises/): "
                     "run from inside it or set CPCOURSE_ROOT")


def solution_files(root: Path) -> list[Path]:
    return sorted((root / "solutions").glob("ex[0-9]*.py"))


@cache
def _registry_cached(root: str, stamp: tuple) -> dict[str, Exercise]:
    table = {}
    for path in solution_files(Path(root)):
        for ex in parse_solution(path.read_text(), path)[0]:
            if ex.id in table:
                other = table[ex.id]
                raise InputError(f"exercise {ex.id} is marked in both {other.module}.py and "
                                 f"{ex.module}.py; give one a new id")
            table[ex.id] = ex
    return dict(sorted(table.items(), key=lambda kv: sort_key(kv[0])))


def registry(root: Path | None = None) -> dict[str, Exercise]:
    """Every exercise of the course by id, in course order, parsed from `solutions/*.py`."""
    root = Path(root) if root else course_root()
    stamp = tuple((p.name, p.stat().st_mtime_ns) for p in solution_files(root))
    return _registry_cached(str(root.resolve()), stamp)


def get_exercise(exercise_id: str, root: Path | None = None) -> Exercise:
    table = registry(root)
    if exercise_id not in table:
        raise InputError(f"no exercise {exercise_id!r}: use one of {', '.join(table) or '(none)'}")
    return table[exercise_id]


def stub_error_id(exc: BaseException, root: Path | None = None) -> str | None:
    """The exercise id when `exc` is an untouched stub's NotImplementedError, else None.

    "Untouched" means the message is the generated one and it was raised from a file in
    exercises/ (not a NotImplementedError of the learner's own or of a library).
    """
    if isinstance(exc, NotImplementedError):
        m = STUB_MESSAGE.match(str(exc))
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = tb.tb_frame.f_code.co_filename if tb is not None else ""
    elif getattr(exc, "exc_type", None) == "NotImplementedError":
        # A rank's error re-raised by cpcourse.launch (RankError): the traceback is text.
        m = STUB_MESSAGE.match(str(getattr(exc, "message", "")))
        files = re.findall(r'File "([^"]+)", line \d+', str(getattr(exc, "traceback", "")))
        where = files[-1] if files else ""
    else:
        return None
    if not m or not where:
        return None
    try:
        folder = (Path(root) if root else course_root()).resolve() / "exercises"
    except InputError:
        return None
    return m.group("id") if Path(where).resolve().parent == folder else None
