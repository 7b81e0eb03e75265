"""A throwaway course folder (solutions/, exercises/, tests/graded/) for the grading tests.

    python -m pytest tests/unit/test_grading.py tests/unit/test_course.py

It copies the real tests/conftest.py, so the options and the `impl` fixture under test are the
course's own. Exercises: add (99.1), double (99.2), triple (99.3), spin (99.4), unused (99.5),
uses_triple (99.6), Counter.bump (99.7).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REAL_ROOT = Path(__file__).resolve().parents[2]

SOLUTION = '''\
"""A fake exercise file."""


def add(a, b):
    """a + b."""
    # BEGIN SOLUTION 99.1 | notebook 99, "Adding" | hint: use +
    return a + b
    # END SOLUTION


def double(x):
    """2 x, for a tensor x."""
    # BEGIN SOLUTION 99.2 | notebook 99, "Doubling" | hint: multiply by two
    return 2 * x
    # END SOLUTION


def triple(x):
    """3 x."""
    # BEGIN SOLUTION 99.3 | notebook 99, "Tripling" | hint: three times
    return 3 * x
    # END SOLUTION


def spin(x):
    """x, eventually."""
    # BEGIN SOLUTION 99.4 | notebook 99, "Spinning" | hint: return x
    return x
    # END SOLUTION


def unused(x):
    # BEGIN SOLUTION 99.5 | notebook 99 | hint: nothing grades this
    return x
    # END SOLUTION


def uses_triple(x):
    """triple(x) + 1: builds on exercise 99.3."""
    # BEGIN SOLUTION 99.6 | notebook 99, "Building on 99.3" | hint: call triple
    return triple(x) + 1
    # END SOLUTION


class Counter:
    """A counter whose method is an exercise."""

    def bump(self, n):
        # BEGIN SOLUTION 99.7 | notebook 99, "A method" | hint: n + 1
        return n + 1
        # END SOLUTION
'''

GRADED = '''\
import os
import subprocess
from pathlib import Path

import pytest
import torch

from cpcourse.course.testing import assert_close


@pytest.mark.ex("99.1")
def test_add(impl):
    assert impl("ex99_fake").add(2, 3) == 5


@pytest.mark.ex("99.2")
def test_double(impl):
    x = torch.arange(6.0).reshape(2, 3)
    assert_close(impl("ex99_fake").double(x), 2 * x, dims=("B", "L"), name="double(x)",
                 hint="multiply by two")


@pytest.mark.ex("99.3")
def test_triple(impl):
    assert impl("ex99_fake").triple(2) == 6


@pytest.mark.ex("99.4")
def test_spin(impl):
    # A detached grandchild, like a torchrun worker: the grader must stop it too.
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(os.environ["FAKE_PIDS"]).write_text(f"{os.getpid()} {child.pid}")
    assert impl("ex99_fake").spin(1) == 1


@pytest.mark.ex("99.6")
def test_uses_triple(impl):
    assert impl("ex99_fake").uses_triple(1) == 4
'''

# The learner's version: 99.1 right, 99.2 wrong, 99.3 untouched, 99.4 an infinite loop,
# 99.6 right but builds on the unsolved 99.3.
_STUB = 'raise NotImplementedError(\n        "Exercise 99.{}'
LEARNER_EDITS = [(_STUB.format(n), code + "\n    " + _STUB.format(n)) for n, code in [
    (1, "return a + b"),
    (2, "return 2 * x + (x > 3)"),
    (4, "while True:\n        pass"),
    (6, "return triple(x) + 1"),
]]


def make_course(root: Path, graded: dict[str, str] | None = None) -> Path:
    """Write a fake course at `root` and generate its stubs; returns root."""
    (root / "solutions").mkdir(parents=True)
    (root / "solutions" / "__init__.py").write_text("")
    (root / "solutions" / "ex99_fake.py").write_text(SOLUTION)
    (root / "tests" / "graded").mkdir(parents=True)
    shutil.copy(REAL_ROOT / "tests" / "conftest.py", root / "tests" / "conftest.py")
    for name, text in (graded or {"test_ex99_fake.py": GRADED}).items():
        (root / "tests" / "graded" / name).write_text(textwrap.dedent(text))
    (root / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n"
                                     "markers =\n    ex(id): graded exercise\n")
    subprocess.run([sys.executable, str(REAL_ROOT / "tools" / "make_exercises.py"),
                    "--root", str(root)], check=True, capture_output=True)
    return root


def edit_as_learner(root: Path) -> None:
    path = root / "exercises" / "ex99_fake.py"
    text = path.read_text()
    for old, new in LEARNER_EDITS:
        assert old in text, old
        text = text.replace(old, new, 1)
    path.write_text(text)
