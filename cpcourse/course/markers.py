"""The solution markers parsed, and the stub each marked region becomes.

    python tools/make_exercises.py --check

`parse_solution` reads the `# BEGIN SOLUTION id | where | hint: ...` ... `# END SOLUTION`
regions of one `solutions/exNN_topic.py` (the format: `cpcourse.course.stubs`' docstring) into
frozen `Exercise`s; `make_stub` replaces each region by the stub's `raise NotImplementedError`
with the same indentation; `function_source` cuts one function out of a file, so a learner's
function can be compared with its stub.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from cpcourse.support.errors import InputError

BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION\s+(?P<header>.*?)\s*$")
CONTINUE = re.compile(r"^[ \t]*#\s*\|(?P<more>.*?)\s*$")
END = re.compile(r"^[ \t]*# END SOLUTION\s*$")
EXERCISE_ID = re.compile(r"^\d{2}\.\d+$")
# The first words of every stub's message; `is_stub_error` and the fallback key on them.
HINT_FIELD = re.compile(r"^hint([2-9])?:", re.IGNORECASE)  # hint: (level 1), hint2:, hint3:
STUB_MESSAGE = re.compile(r"^Exercise (?P<id>\d{2}\.\d+) (?P<function>[\w.]+): ")


@dataclass(frozen=True)
class Exercise:
    """One marked region of a solution file."""

    id: str          # "00.1": notebook number, then the exercise's number in it
    module: str      # "ex00_tokens": the file stem in solutions/ and exercises/
    function: str    # qualified name of the function holding the region ("Ring.step")
    where: str       # where to read, e.g. 'notebook 00, "Counting tokens"'
    hint: str        # level 1: the idea (what the stub's message says)
    line: int        # the BEGIN line in the solution file (1-based)
    hints: tuple[str, ...] = ()  # every level: idea, a worked small case, the key line
    optional: bool = False       # an `| optional` field: not needed for a passing grade

    @property
    def title(self) -> str:
        quoted = re.search(r'"([^"]+)"', self.where)
        return quoted.group(1) if quoted else self.function

    def stub_message(self) -> str:
        text = f"Exercise {self.id} {self.function}: read {self.where}."
        text += f" Hint: {self.hint}" if self.hint else ""
        more = len(self.hints) - 1
        return text + (f" ({more} more: cpcourse.hint(\"{self.id}\"))" if more > 0 else "")


def sort_key(exercise_id: str) -> tuple[int, ...]:
    return tuple(int(p) for p in exercise_id.split("."))


def _parse_header(header: str, where_am_i: str) -> tuple[str, str, tuple[str, ...], bool]:
    fields = [f.strip() for f in header.split("|")]
    optional = any(f.lower() == "optional" for f in fields[1:])
    ex_id, rest = fields[0], [f for f in fields[1:] if f.lower() != "optional"]
    if not EXERCISE_ID.match(ex_id):
        raise InputError(f"{where_am_i}: exercise id must look like 01.2, got {ex_id!r}")
    where, parts = "", []
    for field in rest:
        level = HINT_FIELD.match(field)
        if level:
            parts.append([int(level.group(1) or 1), field[level.end():].strip()])
        elif not parts:
            parts.append([0, field])
        else:  # a continuation line: glue it to the field before
            parts[-1][1] = f"{parts[-1][1]} {field}".strip()
    hints = {}
    for key, value in parts:
        if key == 0:
            where = value
        else:
            hints[key] = value
    if not where:
        example = f"# BEGIN SOLUTION {ex_id} | notebook {ex_id[:2]}, \"Title\" | hint: ..."
        raise InputError(f"{where_am_i}: say where to read, e.g. '{example}'")
    if sorted(hints) != list(range(1, len(hints) + 1)):
        raise InputError(f"{where_am_i}: hint levels must run hint:, hint2:, hint3: ... without "
                         f"gaps, got levels {sorted(hints)}")
    return ex_id, where, tuple(hints[k] for k in sorted(hints)), optional


def _enclosing_functions(tree: ast.AST) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function, outermost first."""
    out = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    out.append((child.lineno, child.end_lineno, name))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def parse_solution(source: str, path: str | Path) -> tuple[list[Exercise], list[tuple]]:
    """Exercises in `source` and their regions `(exercise, begin_index, end_index, indent)`.

    Indices are 0-based line numbers of the BEGIN and END lines. Raises InputError on an
    unbalanced or misplaced marker, naming the file and line.
    """
    path = Path(path)
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    functions = _enclosing_functions(tree)
    regions, i = [], 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if END.match(lines[i]):
            raise InputError(f"{path}:{i + 1}: END SOLUTION without a BEGIN SOLUTION above it")
        if not m:
            i += 1
            continue
        header, j = m.group("header"), i + 1
        while j < len(lines) and CONTINUE.match(lines[j]):
            header += " |" + CONTINUE.match(lines[j]).group("more")
            j += 1
        ex_id, where, hints, optional = _parse_header(header, f"{path}:{i + 1}")
        end = next((k for k in range(j, len(lines))
                    if END.match(lines[k]) or BEGIN.match(lines[k])), None)
        if end is None or BEGIN.match(lines[end]):
            raise InputError(f"{path}:{i + 1}: BEGIN SOLUTION {ex_id} has no END SOLUTION")
        indent = m.group("indent")
        for k in range(j, end):
            text = lines[k]
            if text.strip() and len(text) - len(text.lstrip()) < len(indent):
                raise InputError(f"{path}:{k + 1}: line {k + 1} is less indented than BEGIN "
                                 f"SOLUTION {ex_id}: the markers must not cut across a block")
        inside = [name for first, last, name in functions if first < i + 1 <= last]
        if not inside:
            raise InputError(f"{path}:{i + 1}: put the markers of {ex_id} inside a function body")
        ex = Exercise(ex_id, path.stem, inside[-1], where, hints[0] if hints else "", i + 1,
                      hints, optional)
        regions.append((ex, i, end, m.group("indent")))
        i = end + 1
    exercises = [r[0] for r in regions]
    seen = set()
    for ex in exercises:
        if ex.id in seen:
            raise InputError(f"{path}:{ex.line}: exercise {ex.id} is marked twice; "
                             "give it a new id")
        seen.add(ex.id)
    return exercises, regions


def _string_lines(text: str, indent: str, width: int = 88) -> list[str]:
    """`text` as implicitly concatenated string literals that fit the line length."""
    words, chunks, cur = text.split(" "), [], ""
    for w in words:
        if cur and len(cur) + len(w) + 1 > width - len(indent) - 8:
            chunks.append(cur + " ")
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    chunks.append(cur)
    quote = lambda s: '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return [f"{indent}    {quote(c)}" for c in chunks]


def make_stub(source: str, path: str | Path) -> str:
    """The learner's version of a solution file: every marked region becomes a raise."""
    lines = source.splitlines()
    _, regions = parse_solution(source, path)
    out, pos = [], 0
    for ex, begin, end, indent in regions:
        out += lines[pos:begin]
        out.append(f"{indent}# Exercise {ex.id}: write your code here, then delete the raise.")
        out.append(f"{indent}raise NotImplementedError(")
        out += _string_lines(ex.stub_message(), indent)
        out.append(f"{indent})")
        pos = end + 1
    out += lines[pos:]
    stub = "\n".join(out) + "\n"
    try:
        ast.parse(stub)
    except SyntaxError as exc:  # e.g. markers that cut a statement in half
        raise InputError(f"{path}: the stub is not valid Python ({exc.msg}, line {exc.lineno}); "
                         "wrap whole statements in the markers") from None
    return stub


def function_source(source: str, qualname: str) -> str | None:
    """The lines of function `qualname` in `source` (None when absent or not valid Python)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    lines = source.splitlines()
    spans = [(first, last) for first, last, name in _enclosing_functions(tree) if name == qualname]
    return "\n".join(lines[spans[0][0] - 1:spans[0][1]]) if spans else None
