"""The stub generator: markers, staleness, and a learner's work never being lost.

    python -m pytest tests/unit/test_make_exercises.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cpcourse.course.stubs import make_stub, parse_solution, registry
from cpcourse.support.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import make_exercises  # noqa: E402

SOLUTION = '''\
"""Fake."""

import math


def area(r):
    """pi r^2."""
    # BEGIN SOLUTION 98.1 | notebook 98, "Circles" | hint: math.pi * r ** 2,
    # | squared, not doubled
    return math.pi * r ** 2
    # END SOLUTION


class Ring:
    def step(self, x):
        if x:
            # BEGIN SOLUTION 98.2 | notebook 98, section 3 | hint: add one
            y = x + 1
            return y
            # END SOLUTION
        return 0
'''


@pytest.fixture
def course(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    (tmp_path / "solutions" / "ex98_fake.py").write_text(SOLUTION)
    return tmp_path


def run(course, *args) -> int:
    return make_exercises.main(["--root", str(course), *args])


def test_committed_stubs_are_current():
    """Fails when someone changed solutions/ and forgot `python tools/make_exercises.py`."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "make_exercises.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_committed_stubs_are_lint_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "exercises"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_markers_parse_into_exercises():
    exercises, _ = parse_solution(SOLUTION, "solutions/ex98_fake.py")
    one, two = exercises
    assert (one.id, one.module, one.function, one.title) == ("98.1", "ex98_fake", "area", "Circles")
    assert one.hint == "math.pi * r ** 2, squared, not doubled"  # the `# |` line continues it
    assert (two.id, two.function, two.title, two.where) == ("98.2", "Ring.step", "Ring.step",
                                                             "notebook 98, section 3")


def test_stub_replaces_only_the_marked_region():
    stub = make_stub(SOLUTION, "solutions/ex98_fake.py")
    assert "math.pi * r ** 2\n" not in stub and "y = x + 1" not in stub
    assert '"""pi r^2."""' in stub and "        return 0" in stub  # shared parts stay
    assert "            raise NotImplementedError(\n" in stub  # the region's own indentation
    namespace: dict = {}
    exec(compile(stub, "ex98_fake.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"^Exercise 98.1 area: read notebook 98, "
                       r"\"Circles\". Hint: math.pi"):
        namespace["area"](1.0)
    with pytest.raises(NotImplementedError, match=r"^Exercise 98.2 Ring.step: read notebook 98"):
        namespace["Ring"]().step(1)
    assert namespace["Ring"]().step(0) == 0


@pytest.mark.parametrize("text, message", [
    ("def f():\n    # BEGIN SOLUTION 1.1 | nb\n    pass\n    # END SOLUTION\n", "look like 01.2"),
    ("def f():\n    # BEGIN SOLUTION 01.1 | nb\n    pass\n", "no END SOLUTION"),
    ("def f():\n    pass\n    # END SOLUTION\n", "without a BEGIN"),
    ("# BEGIN SOLUTION 01.1 | nb\nx = 1\n# END SOLUTION\n", "inside a function body"),
    ("def f():\n    # BEGIN SOLUTION 01.1 | hint: h\n    pass\n    # END SOLUTION\n",
     "say where to read"),
    ("def f():\n    # BEGIN SOLUTION 01.1 | a\n    pass\n    # END SOLUTION\n"
     "def g():\n    # BEGIN SOLUTION 01.1 | a\n    pass\n    # END SOLUTION\n", "marked twice"),
    ("def f():\n    if x:\n        # BEGIN SOLUTION 01.1 | a\n        y = 1\n    else:\n"
     "        # END SOLUTION\n        y = 2\n", "must not cut across a block"),
])
def test_bad_markers_say_file_and_line(text, message):
    with pytest.raises(InputError, match=message):
        make_stub(text, "solutions/ex01_bad.py")


def test_generate_then_check(course, capsys):
    assert run(course, "--check") == 1  # nothing generated yet
    assert "missing" in capsys.readouterr().out
    assert run(course) == 0
    assert run(course, "--check") == 0
    assert (course / "exercises" / "__init__.py").exists()
    assert set(registry(course)) == {"98.1", "98.2"}


def test_check_fails_when_a_solution_changes(course, capsys):
    run(course)
    src = course / "solutions" / "ex98_fake.py"
    src.write_text(src.read_text().replace("hint: add one", "hint: add 1"))
    assert run(course, "--check") == 1
    assert "ex98_fake.py: out of date" in capsys.readouterr().out
    assert run(course) == 0  # an untouched stub is simply regenerated
    assert "hint: add 1" not in (course / "exercises" / "ex98_fake.py").read_text()
    assert "Hint: add 1" in (course / "exercises" / "ex98_fake.py").read_text()
    assert run(course, "--check") == 0


def test_a_learners_work_is_never_lost(course, capsys):
    run(course)
    stub = course / "exercises" / "ex98_fake.py"
    mine = stub.read_text().replace("raise NotImplementedError(", "return 3.14159 * r * r\n"
                                    "    raise NotImplementedError(", 1)
    stub.write_text(mine)
    # Edited, solution unchanged: regenerating keeps it, and --check is fine with it.
    assert run(course) == 0 and stub.read_text() == mine
    assert run(course, "--check") == 0
    assert "edited by you" in capsys.readouterr().out
    # The solution changes: regenerating refuses to touch the learner's file.
    src = course / "solutions" / "ex98_fake.py"
    src.write_text(src.read_text().replace("hint: add one", "hint: add 1"))
    assert run(course) == 1 and stub.read_text() == mine
    assert "has your edits" in capsys.readouterr().out
    assert run(course, "--check") == 1
    # --force regenerates only after a timestamped backup holding exactly the learner's file.
    capsys.readouterr()
    assert run(course, "--force") == 0
    out = capsys.readouterr().out
    backups = sorted((course / "exercises").glob("ex98_fake.py.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == mine
    assert backups[0].name in out and "your version is saved as" in out
    assert "Hint: add 1" in stub.read_text() and "3.14159" not in stub.read_text()


def test_force_by_name_resets_one_edited_file(course, capsys):
    run(course)
    stub = course / "exercises" / "ex98_fake.py"
    stub.write_text(stub.read_text() + "\n# my notes\n")
    assert run(course, "--force") == 0 and "# my notes" in stub.read_text()  # not named: kept
    assert run(course, "--force", "ex98_fake") == 0
    assert "# my notes" not in stub.read_text()
    backups = list((course / "exercises").glob("ex98_fake.py.bak-*"))
    assert len(backups) == 1 and "# my notes" in backups[0].read_text()
    stub.write_text(stub.read_text() + "\n# more notes\n")
    assert run(course, "--force", "ex98_fake") == 0  # a second reset keeps a second backup
    assert len(list((course / "exercises").glob("ex98_fake.py.bak-*"))) == 2


def test_a_file_without_header_counts_as_edited(course, capsys):
    (course / "exercises" / "ex98_fake.py").write_text("def area(r):\n    return 1\n")
    assert run(course) == 1
    assert (course / "exercises" / "ex98_fake.py").read_text().endswith("return 1\n")


def test_unknown_name_is_refused(course, capsys):
    assert run(course, "ex77_nothing") == 2
    assert "no solutions/ex77_nothing.py" in capsys.readouterr().err


def test_orphan_exercise_is_kept(course, capsys):
    run(course)
    orphan = course / "exercises" / "ex97_old.py"
    orphan.write_text("x = 1\n")
    assert run(course) == 0 and orphan.exists()
    assert "no solutions/ex97_old.py any more" in capsys.readouterr().out


def test_an_optional_field_marks_an_exercise_a_pass_does_not_need():
    src = ('def f():\n    # BEGIN SOLUTION 98.7 | notebook 98, "GPU track" | optional | hint: go\n'
           '    return 1\n    # END SOLUTION\n')
    (ex,), _ = parse_solution(src, "solutions/ex98_fake.py")
    assert ex.optional and ex.where == 'notebook 98, "GPU track"' and ex.hint == "go"
    (plain,), _ = parse_solution(src.replace(" | optional", ""), "solutions/ex98_fake.py")
    assert not plain.optional
    assert [e.id for e in registry().values() if e.optional] == ["02.5"]  # the Triton kernel
