"""How a grade looks: the pass/fail panel of `check()` (HTML and text) and `cpcourse grade`'s table.

    cpcourse grade --impl solutions

A panel says, in this order: the verdict, what to do next, then the first failing test's own
report (the `assert_close` text: worst element, coordinates, expected vs got, hint).
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter

from cpcourse.course.stubs import course_root
from cpcourse.support.errors import InputError

COLORS = {"passed": ("#1e7b34", "#e9f6ec"), "failed": ("#b3261e", "#fdecea"),
          "not implemented": ("#9a6700", "#fff8e1"), "timed out": ("#b3261e", "#fdecea"),
          "no tests": ("#555", "#f2f2f2"), "skipped": ("#555", "#f2f2f2"),
          "error": ("#b3261e", "#fdecea")}
MAX_REPORT_LINES = 30


def _next_step(result) -> str:
    ex = result.exercise
    n, ok = len(result.tests), sum(t.outcome == "passed" for t in result.tests)
    if result.status == "passed" and result.recorded_at is not None:
        when = time.strftime("%H:%M", time.localtime(result.recorded_at))
        return (f"all {n} graded tests passed ({result.impl}) at {when} with this same code; "
                f"not run again (cpcourse.check(\"{ex.id}\", rerun=True) runs them).")
    if result.status == "passed":
        return f"all {n} graded tests pass ({result.impl})."
    if result.status == "not implemented" and result.detail:
        return f"not ready: {result.detail}. Solve that one first (see cpcourse grade)."
    if result.status == "not implemented":
        return (f"not implemented yet: write {ex.function} in exercises/{ex.module}.py "
                f"(replace its `raise NotImplementedError`). Read {ex.where}. Hint: {ex.hint}")
    if result.status == "failed":
        return f"{ok} of {n} graded tests pass; the first failure is below."
    return result.detail


def _report(result) -> tuple[str, str]:
    """(test name, the first failure's report, trimmed) or ("", "")."""
    if result.status != "failed" or not result.failures:
        return "", ""
    first = result.failures[0]
    lines = first.message.splitlines()
    if len(lines) > MAX_REPORT_LINES:
        lines = lines[:MAX_REPORT_LINES] + [f"... ({len(lines) - MAX_REPORT_LINES} more lines)"]
    return first.name, "\n".join(lines)


def render_text(result) -> str:
    ex = result.exercise
    head = f"Exercise {ex.id} \"{ex.title}\" ({ex.function}): {result.status.upper()}"
    out = [head, "  " + _next_step(result)]
    name, report = _report(result)
    if name:
        out.append(f"  {name}:")
        out += ["    " + line for line in report.splitlines()]
        out.append(f"  Read {ex.where}. Hint: {ex.hint}")
    return "\n".join(out)


def render_html(result) -> str:
    ex = result.exercise
    fg, bg = COLORS.get(result.status, COLORS["error"])
    esc = html.escape
    name, report = _report(result)
    body = ""
    if name:
        body = (f"<div style='margin-top:6px'><code>{esc(name)}</code></div>"
                f"<pre style='white-space:pre-wrap;margin:4px 0;padding:6px;background:#fff;"
                f"border:1px solid #ddd;font-size:85%'>{esc(report)}</pre>"
                f"<div>Read {esc(ex.where)}. <b>Hint:</b> {esc(ex.hint)}</div>")
    return (f"<div data-cpcourse-check='{esc(result.status)}' style='border-left:6px solid {fg};"
            f"background:{bg};padding:8px 12px;margin:4px 0;font-family:sans-serif'>"
            f"<div style='font-size:110%'><b style='color:{fg}'>{esc(result.status.upper())}"
            f"</b> &nbsp;Exercise {esc(ex.id)} <i>{esc(ex.title)}</i> "
            f"(<code>{esc(ex.function)}</code>)</div>"
            f"<div style='margin-top:4px'>{esc(_next_step(result))}</div>{body}</div>")


def _one_line(text: str, width: int) -> str:
    line = " ".join(text.split())
    return line if len(line) <= width else line[:width - 3] + "..."


def _notebook_headings(notebook: str) -> list[str]:
    """The headings of notebook NN's text form (notebooks/NN_*.md), or [] when it is absent."""
    try:
        root = course_root()
    except InputError:
        return []
    found = sorted((root / "notebooks").glob(f"{notebook}_*.md"))
    if not found:
        return []
    return [line for line in found[0].read_text().splitlines() if line.startswith("#")]


def _place(ex) -> tuple[str, str]:
    """(the section number holding the exercise, e.g. "3", or ""; the exercise's own heading's
    title after "Exercise NN.N:", or "")."""
    number, own = "", ""
    for line in _notebook_headings(ex.id[:2]):
        top = re.match(r"## (\d+)\.", line)
        number = top.group(1) if top else number
        if ex.title.lower() in line.lower():
            own = line.split(":", 1)[1].strip() if ":" in line else ""
            return number, own
    return "", ""


def distinct_titles(exercises) -> dict[str, str]:
    """Each exercise's title for a table: its section's title, or its own heading's when the
    section is a list ("Exercises 06.2 and 06.3"), with the function named when two share it."""
    base = {}
    for ex in exercises:
        title = ex.title
        if title.lower().startswith("exercise"):
            title = _place(ex)[1] or ex.function
        base[ex.id] = title
    shared = Counter(base.values())
    return {i: f"{t} ({ex.function})" if shared[t] > 1 else t
            for (i, t), ex in zip(base.items(), exercises, strict=True)}


def next_line(results) -> str:
    """The table's last line: the first exercise (course order) not passing, where to write it
    and where to read."""
    todo = next((r for r in results if not r.passed), None)
    if todo is None:
        return "every exercise passes: well done"
    ex = todo.exercise
    number = _place(ex)[0]
    section = f" §{number}" if number else ""
    return (f"next: {ex.id} {distinct_titles([ex])[ex.id]}: write {ex.function} in "
            f"exercises/{ex.module}.py (read notebook {ex.id[:2]}{section}, \"{ex.title}\")")


def render_table(results, seconds: float) -> str:
    """The `cpcourse grade` table: id, title, status, tests passed, hints seen, first failure;
    then how many pass and the next exercise to do."""
    titles = distinct_titles([r.exercise for r in results])
    rows = [("id", "title", "status", "tests", "hints", "first failure")]
    for r in results:
        ok = sum(t.outcome == "passed" for t in r.tests)
        status = "not started" if r.untouched else r.status
        failure = "" if r.passed or r.untouched else _one_line(r.first_failure, 70)
        rows.append((r.exercise.id, titles[r.exercise.id], status,
                     f"{ok}/{len(r.tests)}", f"{r.hints_used}/{len(r.exercise.hints)}", failure))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
             + "  " + row[5] for row in rows]
    lines = [line.rstrip() for line in lines]
    lines.insert(1, "-" * min(120, max(len(line) for line in lines)))
    passed = sum(r.passed for r in results)
    impl = results[0].impl if results else "exercises"
    exercises = f"{len(results)} exercise{'s' * (len(results) != 1)}"
    lines.append(f"\n{passed} of {exercises} pass ({impl}, {seconds:.1f} s)")
    if results:
        lines.append(next_line(results))
    return "\n".join(lines)
