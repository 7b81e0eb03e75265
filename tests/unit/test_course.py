"""The notebook's view of an exercise: the learner's code, or the reference with a notice.

    python -m pytest tests/unit/test_course.py
"""

from __future__ import annotations

import os
import sys

import pytest
from fake_course import edit_as_learner, make_course

from cpcourse.course import exercises as course
from cpcourse.support.errors import InputError


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fresh fake course as the only `exercises`/`solutions` this process knows."""
    root = make_course(tmp_path / "c")
    monkeypatch.setenv("CPCOURSE_ROOT", str(root))
    monkeypatch.delenv("CPCOURSE_IMPL", raising=False)
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in course.IMPLS}
    for k in saved:
        del sys.modules[k]
    course._forced.clear()
    yield root
    for k in [k for k in sys.modules if k.split(".")[0] in course.IMPLS]:
        del sys.modules[k]
    sys.modules.update(saved)
    if str(root.resolve()) in sys.path:
        sys.path.remove(str(root.resolve()))
    course._forced.clear()


def test_untouched_stub_falls_back_with_one_notice(fake, capsys):
    triple = course.exercise("99.3")
    assert triple(2) == 6 and triple(5) == 15
    out = capsys.readouterr().out
    assert out.count("Exercise 99.3 (triple): not implemented yet; using the reference") == 1
    assert "3 x." in triple.__doc__  # the spec travels with the wrapper


def test_learners_code_is_used_and_reread_when_saved(fake, capsys):
    edit_as_learner(fake)
    add = course.exercise("99.1")
    assert add(2, 3) == 5
    path = fake / "exercises" / "ex99_fake.py"
    path.write_text(path.read_text().replace("return a + b", "return a - b", 1))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a save, a second later
    assert add(2, 3) == -1
    assert capsys.readouterr().out == ""  # nothing to announce: it is the learner's code


def test_a_stub_it_builds_on_is_named(fake, capsys):
    edit_as_learner(fake)
    assert course.exercise("99.6")(1) == 4  # the learner's 99.6 calls the unsolved 99.3
    assert "it needs exercise 99.3, not implemented yet" in capsys.readouterr().out


def test_other_errors_are_the_learners_to_see(fake):
    edit_as_learner(fake)
    path = fake / "exercises" / "ex99_fake.py"
    path.write_text(path.read_text().replace("return a + b", "raise NotImplementedError('mine')"))
    with pytest.raises(NotImplementedError, match="mine"):
        course.exercise("99.1")(1, 2)


def test_use_reference_switches_explicitly(fake, capsys):
    edit_as_learner(fake)
    double = course.exercise("99.2")
    assert double(5) == 11  # the learner's bug
    course.use_reference("99.2")
    assert double(5) == 10
    assert "exercise 99.2: the reference answer from now on" in capsys.readouterr().out
    course.use_reference("99.2", False)
    assert double(5) == 11
    course.use_reference()
    assert course.exercise("99.1")(1, 1) == 2 and double(5) == 10


def test_impl_solutions_from_the_environment(fake, monkeypatch, capsys):
    monkeypatch.setenv("CPCOURSE_IMPL", "solutions")
    assert course.exercise("99.3")(2) == 6
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("CPCOURSE_IMPL", "mine")
    with pytest.raises(InputError, match="CPCOURSE_IMPL"):
        course.exercise("99.3")(2)


def test_unknown_exercise_lists_the_known_ones(fake):
    with pytest.raises(InputError, match=r"no exercise '99.9': use one of 99.1, 99.2"):
        course.exercise("99.9")


def test_method_exercise_hands_out_a_class(fake, capsys):
    counter = course.exercise("99.7")
    assert counter().bump(1) == 2  # the reference's class, announced
    assert "Exercise 99.7 (Counter.bump): not implemented yet" in capsys.readouterr().out
    path = fake / "exercises" / "ex99_fake.py"
    text = path.read_text()
    start = text.index("        # Exercise 99.7")
    path.write_text(text[:start] + "        return n + 100\n")
    assert course.exercise("99.7")().bump(1) == 101  # the learner's, once the raise is gone


def test_real_course_exercise_runs_on_stubs(capsys, monkeypatch):
    """The notebooks' path: exercise 00.1 on the untouched stub answers from the reference."""
    monkeypatch.delenv("CPCOURSE_ROOT", raising=False)
    monkeypatch.delenv("CPCOURSE_IMPL", raising=False)
    import cpcourse
    from cpcourse.course.stubs import course_root

    stub = (course_root() / "exercises" / "ex00_tokens.py").read_text()
    assert cpcourse.exercise("00.1")(720, 1280, 120) == 432_000
    if '"Exercise 00.1 count_video_tokens' in stub:  # untouched, as committed
        assert "not implemented yet" in capsys.readouterr().out
