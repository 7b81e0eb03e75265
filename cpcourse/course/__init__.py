"""The course's machinery: exercises, grading, stubs, panels, assert_close reports, lab settings.

    python -c "from cpcourse.course import exercise; print(exercise('00.1')(720, 1280, 120))"

Not a lesson: what turns `solutions/` into stubs (`stubs`), hands a notebook your function or the
reference (`exercises`), grades it (`grading`, shown by `panels`), compares tensors with a report
that says where they differ (`testing.assert_close`), runs notebook 06's measurements on each rank
(`video_lab`) and quiets JupyterLab's pop-ups (`labsettings`). Import order, lowest first:
stubs -> exercises -> panels, testing -> grading, video_lab.
"""

from __future__ import annotations

from cpcourse.course.exercises import (
    IMPLS,
    exercise,
    impl_from_env,
    load,
    show,
    use_reference,
    using_reference,
)
from cpcourse.course.grading import CheckFailed, check, grade

__all__ = ["IMPLS", "CheckFailed", "check", "exercise", "grade", "impl_from_env", "load", "show",
           "use_reference", "using_reference"]
