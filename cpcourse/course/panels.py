"""How a grade looks: the pass/fail panel of `check()` (HTML and text) and `cpcourse grade`'s table.

    cpcourse grade --impl solutions

A panel says, in this order: the verdict, what to do next, then the first failing test's own
report (the `assert_close` text: worst element, coordinates, expected vs got, hint).
"""

from __future__ import annotations

import html
import time

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


def render_table(results, seconds: float) -> str:
    """The `cpcourse grade` table: id, title, status, tests passed, hints seen, first failure."""
    rows = [("id", "title", "status", "tests", "hints", "first failure")]
    for r in results:
        ok = sum(t.outcome == "passed" for t in r.tests)
        rows.append((r.exercise.id, _one_line(r.exercise.title, 28), r.status,
                     f"{ok}/{len(r.tests)}", f"{r.hints_used}/{len(r.exercise.hints)}",
                     "" if r.passed else _one_line(r.first_failure, 70)))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True))
             + "  " + row[5] for row in rows]
    lines.insert(1, "-" * min(120, max(len(line) for line in lines)))
    passed = sum(r.passed for r in results)
    impl = results[0].impl if results else "exercises"
    lines.append(f"\n{passed} of {len(results)} exercises pass ({impl}, {seconds:.1f} s)")
    return "\n".join(lines)
