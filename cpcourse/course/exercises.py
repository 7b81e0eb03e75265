"""The course's exercises as a notebook sees them: your code, or the reference with a notice.

    python -c "from cpcourse.course import exercise; print(exercise('00.1')(720, 1280, 120))"

In a notebook:

    from cpcourse.course import exercise, use_reference
    count_video_tokens = exercise("00.1")       # your function from exercises/ex00_tokens.py
    count_video_tokens(720, 1280, 120)

While your function still raises its stub's NotImplementedError, the call shows "not implemented
yet" and returns the reference answer from solutions/ instead, so every notebook runs top to
bottom before you solve anything. `use_reference("00.1")` switches to the reference on purpose
(with a notice); `use_reference("00.1", False)` switches back. With the environment variable
CPCOURSE_IMPL=solutions every exercise uses the reference (how the tests run the notebooks).
Your file is re-read when it changes, so edit, save, and run the cell again.
"""

from __future__ import annotations

import functools
import html
import importlib
import os
import sys
from pathlib import Path

from cpcourse.course.stubs import course_root, get_exercise, stub_error_id
from cpcourse.support.errors import InputError

IMPLS = ("exercises", "solutions")
_forced: set[str] = set()      # exercise ids switched to the reference by use_reference()
_ALL = "*"


def impl_from_env(impl: str | None = None) -> str:
    """`impl`, else $CPCOURSE_IMPL, else "exercises"; an InputError on anything else."""
    impl = impl or os.environ.get("CPCOURSE_IMPL") or "exercises"
    if impl not in IMPLS:
        raise InputError(f"impl must be exercises or solutions, got {impl!r} "
                         "(check the CPCOURSE_IMPL environment variable)")
    return impl


def load(impl: str, module: str, root: Path | None = None):
    """The module `exercises.<module>` or `solutions.<module>`, re-read when its file changed."""
    impl = impl_from_env(impl)
    root = (Path(root) if root else course_root()).resolve()
    path = root / impl / f"{module}.py"
    if not path.exists():
        raise InputError(f"there is no {impl}/{module}.py in {root}; "
                         f"run `python tools/make_exercises.py` to create the exercises")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = f"{impl}.{module}"
    pkg = sys.modules.get(impl) or importlib.import_module(impl)
    if Path(pkg.__file__).resolve().parent != root / impl:
        raise InputError(f"another package called {impl!r} shadows the course's "
                         f"({pkg.__file__}); rename it or set CPCOURSE_ROOT")
    mod = sys.modules.get(name)
    mtime = path.stat().st_mtime_ns
    if mod is None:
        mod = importlib.import_module(name)
    elif getattr(mod, "__cpcourse_mtime__", None) != mtime:
        mod = importlib.reload(mod)
    mod.__cpcourse_mtime__ = mtime
    return mod


def _resolve(mod, qualname: str):
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def show(text: str, html_text: str | None = None) -> None:
    """Show a notice in the notebook cell (HTML) or, outside IPython, on stdout."""
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None and html_text is not None:
            # Both forms: HTML in JupyterLab, the text in a terminal or a text export.
            display({"text/html": html_text, "text/plain": text}, raw=True)
            return
    except ImportError:
        pass
    print(text, flush=True)


def _notice(ex_id: str, function: str, why: str) -> None:
    text = f"[cpcourse] Exercise {ex_id} ({function}): {why}; using the reference answer."
    box = ("<div style='border-left:4px solid #d9a400;background:#fff8e1;padding:4px 10px;"
           "margin:2px 0;font-family:sans-serif;font-size:90%'>"
           f"<b>Exercise {html.escape(ex_id)}</b> (<code>{html.escape(function)}</code>): "
           f"{html.escape(why)}; using the reference answer.</div>")
    show(text, box)


def use_reference(exercise_id: str | None = None, on: bool = True) -> None:
    """Use the reference for `exercise_id` (every exercise when None); `on=False` undoes it."""
    key = _ALL if exercise_id is None else get_exercise(exercise_id).id
    (_forced.add if on else _forced.discard)(key)
    what = "every exercise" if key == _ALL else f"exercise {key}"
    show(f"[cpcourse] {what}: {'the reference answer' if on else 'your code'} from now on.",
         f"<div style='font-family:sans-serif;font-size:90%'>[cpcourse] {html.escape(what)}: "
         f"<b>{'the reference answer' if on else 'your code'}</b> from now on.</div>")


def using_reference(exercise_id: str) -> bool:
    return exercise_id in _forced or _ALL in _forced or impl_from_env() == "solutions"


def exercise(exercise_id: str, *, root: Path | None = None):
    """The callable of exercise `exercise_id` as the notebook should use it.

    Functions come back wrapped: each call runs your code from exercises/ (re-read if you saved
    it), and falls back to the reference, with a visible notice, when it raises a stub's
    NotImplementedError (yours or that of an exercise it builds on). For an exercise inside a
    class method the class itself comes back: yours once no stub remains in its file, else the
    reference's. The wrapper's `__doc__` is the exercise's spec.
    """
    ex = get_exercise(exercise_id, root)
    reference = _resolve(load("solutions", ex.module, root), ex.function)
    if "." in ex.function:  # a method: hand out a whole class
        cls_name = ex.function.split(".")[0]
        if using_reference(ex.id):
            return _resolve(load("solutions", ex.module, root), cls_name)
        mod = load("exercises", ex.module, root)
        if f'"Exercise {ex.id} ' in Path(mod.__file__).read_text():
            _notice(ex.id, ex.function, "not implemented yet")
            return _resolve(load("solutions", ex.module, root), cls_name)
        return _resolve(mod, cls_name)

    @functools.wraps(reference)
    def call(*args, **kwargs):
        if using_reference(ex.id):
            return _resolve(load("solutions", ex.module, root), ex.function)(*args, **kwargs)
        mine = _resolve(load("exercises", ex.module, root), ex.function)
        try:
            return mine(*args, **kwargs)
        except NotImplementedError as exc:
            missing = stub_error_id(exc, root)
            if missing is None:
                raise
            if missing not in call.notified:  # say it once per wrapper, not at every call
                why = ("not implemented yet" if missing == ex.id
                       else f"it needs exercise {missing}, not implemented yet")
                _notice(ex.id, ex.function, why)
                call.notified.add(missing)
        return _resolve(load("solutions", ex.module, root), ex.function)(*args, **kwargs)

    call.notified = set()
    call.exercise = ex
    return call
