"""Progressive hints: `cpcourse.hint("03.1")` shows the next level of an exercise's hints.

    python -c "import cpcourse; cpcourse.hint('00.1')"

Each exercise has its levels in its solution marker (`cpcourse.course.stubs`): first the idea
and where to read (what the stub's own message says), then a worked small case, then the key
line. A call shows the next level you have not seen; `hint(id, level=k)` shows level k again.
The highest level seen is kept in `exercises/.hints_used.json` (your course folder, beside your
code) so that `cpcourse grade` can show how many hints each exercise took.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from cpcourse.course.exercises import show
from cpcourse.course.stubs import course_root, get_exercise
from cpcourse.support.errors import InputError, require

STATE = ".hints_used.json"


def _state_path(root: Path | None) -> Path:
    return (Path(root) if root else course_root()) / "exercises" / STATE


def hints_used(root: Path | None = None) -> dict[str, int]:
    """{exercise id: highest hint level seen}; {} when no hint was asked for (or the file is
    unreadable: hints are a record for the learner, never a reason to fail)."""
    path = _state_path(root)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: int(v) for k, v in data.items() if isinstance(v, int)} \
        if isinstance(data, dict) else {}


def hint_text(exercise_id: str, level: int, root: Path | None = None) -> str:
    """Level `level` (1-based) of an exercise's hints, with its place: "hint 2 of 3: ..."."""
    ex = get_exercise(exercise_id, root)
    require(ex.hints, f"exercise {exercise_id} has no hints")
    require(isinstance(level, int) and 1 <= level <= len(ex.hints),
            f"exercise {exercise_id} has hint levels 1 to {len(ex.hints)}, got {level!r}")
    return f"Exercise {ex.id} ({ex.title}), hint {level} of {len(ex.hints)}: {ex.hints[level - 1]}"


def hint(exercise_id: str, level: int | None = None, root: Path | None = None) -> None:
    """Show the next hint level of `exercise_id` (or `level`) and remember it was seen."""
    ex = get_exercise(exercise_id, root)
    used = hints_used(root)
    seen = used.get(ex.id, 0)
    if level is None:
        level = min(seen + 1, len(ex.hints))
    text = hint_text(ex.id, level, root)
    if level == len(ex.hints) and seen >= level:
        text += " (that is the last hint)"
    used[ex.id] = max(seen, level)
    path = _state_path(root)
    tmp = path.with_name(f"{STATE}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(used, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only checkout: still show the hint
        tmp.unlink(missing_ok=True)
        text += f" (not recorded: {exc.strerror or exc})"
    show(text)


def check_levels(exercise_id: str, root: Path | None = None) -> None:
    """InputError unless the exercise has at least three hint levels."""
    ex = get_exercise(exercise_id, root)
    if len(ex.hints) < 3:
        raise InputError(f"exercise {exercise_id} has {len(ex.hints)} hint level(s): give it "
                         "hint:, hint2: and hint3: in its solution marker")
