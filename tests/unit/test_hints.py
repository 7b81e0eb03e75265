"""Hints come in levels: the idea first, then a worked case, then the key line; grading counts
how many a learner has seen."""

from __future__ import annotations

import json
import re

import pytest

from cpcourse.course.hints import hint, hint_text, hints_used
from cpcourse.course.stubs import course_root, parse_solution, registry
from cpcourse.support.errors import InputError

FAKE = '''\
def area(w, h):
    """w * h."""
    # BEGIN SOLUTION 98.1 | notebook 98, "Areas"
    # | hint: an area is a product
    # | hint2: a 2 x 3 rectangle has
    # | area 6
    # | hint3: return w * h
    return w * h
    # END SOLUTION
'''


@pytest.fixture()
def fake_root(tmp_path):
    (tmp_path / "solutions").mkdir()
    (tmp_path / "exercises").mkdir()
    (tmp_path / "solutions" / "ex98_area.py").write_text(FAKE)
    return tmp_path


def test_levels_are_parsed_in_order_and_glued_across_lines(fake_root):
    ex = registry(fake_root)["98.1"]
    assert ex.hints == ("an area is a product", "a 2 x 3 rectangle has area 6", "return w * h")
    assert ex.hint == ex.hints[0]
    assert ex.stub_message().endswith('Hint: an area is a product (2 more: cpcourse.hint("98.1"))')


def test_each_call_shows_the_next_level_and_remembers_it(fake_root, capsys):
    for level in (1, 2, 3, 3):
        hint("98.1", root=fake_root)
        out = capsys.readouterr().out
        assert f"hint {level} of 3" in out
    assert "last hint" in out
    assert hints_used(fake_root) == {"98.1": 3}
    hint("98.1", level=1, root=fake_root)                 # looking back lowers nothing
    assert "hint 1 of 3" in capsys.readouterr().out and hints_used(fake_root) == {"98.1": 3}
    with pytest.raises(InputError, match="levels 1 to 3"):
        hint_text("98.1", 4, root=fake_root)
    with pytest.raises(InputError):
        hint("00.9", root=fake_root)


def test_a_broken_record_never_stops_a_hint(fake_root, capsys):
    (fake_root / "exercises" / ".hints_used.json").write_text("{not json")
    assert hints_used(fake_root) == {}
    hint("98.1", root=fake_root)
    assert "hint 1 of 3" in capsys.readouterr().out
    assert json.loads((fake_root / "exercises" / ".hints_used.json").read_text()) == {"98.1": 1}


def test_a_gap_in_the_levels_is_refused():
    with pytest.raises(InputError, match="without gaps"):
        parse_solution(FAKE.replace("hint2:", "hint4:"), "ex98_area.py")


def _code_lines(path, ex_id):
    lines = path.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if f"BEGIN SOLUTION {ex_id} " in line)
    end = next(i for i in range(begin, len(lines)) if "END SOLUTION" in lines[i])
    return [line.strip() for line in lines[begin + 1:end]
            if line.strip() and not line.strip().startswith("#")]


def _squash(text):
    return re.sub(r"\s+", "", text)


def test_every_real_exercise_has_three_levels_and_level_one_gives_nothing_away():
    root = course_root()
    table = registry(root)
    assert len(table) >= 18
    for ex in table.values():
        assert len(ex.hints) >= 3, f"{ex.id}: {len(ex.hints)} hint level(s)"
        first = _squash(ex.hints[0])
        for line in _code_lines(root / "solutions" / f"{ex.module}.py", ex.id):
            code = _squash(line)
            if len(code) >= 12:
                assert code not in first, f"{ex.id}: hint 1 contains the code line {line!r}"
        # the stub shows level 1 only (tools/make_exercises.py --check keeps stubs current)
        assert ex.hints[0] in ex.stub_message() and ex.hints[2] not in ex.stub_message()


def test_grade_shows_the_hints_used(fake_root):
    from cpcourse.course.grading import ExerciseResult
    from cpcourse.course.panels import render_table

    res = ExerciseResult(registry(fake_root)["98.1"], "exercises", "failed", hints_used=2)
    assert res.as_dict()["hints_used"] == 2 and res.as_dict()["hint_levels"] == 3
    row = render_table([res], 1.0).splitlines()[2]
    assert row.split()[:5] == ["98.1", "Areas", "failed", "0/0", "2/3"]
