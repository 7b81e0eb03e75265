"""Numbers for people: bytes, seconds and counts as a notebook prints them, and small HTML tables.

    python -c "from cpcourse.viz.fmt import gb; print(gb(373_248_000_000))"

Every figure a notebook states is computed by `cpcourse` and passed through these helpers, so
prose never carries a typed number. Units are decimal (1 GB = 1e9 B), like the calculators.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

# A cell that reads as a quantity ("6.19 GB", "54,000", "35x", "yes") is right-aligned so digits
# line up; anything else reads as text and is left-aligned (notebook CSS right-aligns all cells).
_QUANTITY = re.compile(r"^(more than )?[~+-]?[\d.,]+\s*(%|x|[kMGT]?B|ms|s|min|h|billion|million"
                       r"|trillion)?$|^(yes|no|NO)$")


def _scaled(value: float, units: Sequence[tuple[float, str]]) -> str:
    for scale, unit in units:
        if abs(value) >= scale:
            v = value / scale
            # Three significant figures, never fewer than one decimal: 6.19 GB, 27.6 MB, 373.2 GB.
            return f"{v:,.2f} {unit}" if abs(v) < 10 else f"{v:,.1f} {unit}"
    return f"{value:,.0f} {units[-1][1]}"


def nbytes(n: float) -> str:
    """Bytes in decimal units: 884736000 -> '884.7 MB'."""
    return _scaled(n, ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "B")))


def gb(n: float) -> str:
    """Bytes as GB whatever the size: 10616832000 -> '10.6 GB' (tables compare in one unit)."""
    v = n / 1e9
    return f"{v:,.2f} GB" if abs(v) < 10 else f"{v:,.1f} GB"


def seconds(s: float) -> str:
    """A duration in the unit a reader thinks in: 0.00196608 -> '1.97 ms', 3887 -> '1.08 h'.

    Below a second everything is in ms (0.32 ms, not 320 us), so a table compares at a glance.
    """
    for scale, unit in ((3600, "h"), (60, "min"), (1, "s")):
        if abs(s) >= scale:
            v = s / scale
            return f"{v:.2f} {unit}" if abs(v) < 10 else f"{v:.1f} {unit}"
    v = s * 1e3
    return f"{v:.2f} ms" if abs(v) < 10 else f"{v:.1f} ms"


def plural(n: int, word: str, many: str | None = None) -> str:
    """A count and its noun, singular or plural: (1, 'node') -> '1 node', (3, 'process',
    'processes') -> '3 processes' (not '3 process(es)')."""
    return f"{count(n)} {word if n == 1 else (many or word + 's')}"


def count(n: float) -> str:
    """An integer with thousands separators: 432000 -> '432,000'."""
    return f"{int(round(n)):,}"


def sci(n: float) -> str:
    """A large count in words a reader can say: 1866240000 -> '1.87 billion'."""
    for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {word}"
    return count(n)


def ratio(x: float) -> str:
    """A multiplier: 35.1 -> '35x', 3.01 -> '3.0x'."""
    return f"{x:.1f}x" if abs(x) < 10 else f"{x:.0f}x"


def html_table(rows: Iterable[dict], columns: Sequence[str] | None = None, *,
               css_class: str = "cpc-table", titles: dict[str, str] | None = None) -> str:
    """An HTML table of `rows` (dicts), columns in order; cell text is escaped.

    `titles` maps a column to the key of a row field shown as a hover tooltip on that cell.
    """
    rows = list(rows)
    columns = list(columns or (rows[0].keys() if rows else []))
    titles = titles or {}
    numeric = {c: bool(rows) and all(_QUANTITY.match(str(r.get(c, "")).strip()) for r in rows)
               for c in columns}
    align = {c: "right" if numeric[c] else "left" for c in columns}
    head = "".join(f'<th style="text-align:{align[c]}">{html.escape(str(c))}</th>'
                   for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            tip = r.get(titles[c], "") if c in titles else ""
            attr = f' title="{html.escape(str(tip))}"' if tip else ""
            cells.append(f'<td style="text-align:{align[c]}"{attr}>'
                         f"{html.escape(str(r.get(c, '')))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="{css_class}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def say(markdown: str) -> None:
    """Show computed prose: Markdown in a notebook, plain text elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - IPython ships with the course
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(Markdown(markdown))
    else:
        print(markdown)


def show_table(rows: Iterable[dict], columns: Sequence[str] | None = None, **kw) -> None:
    """Display `html_table(rows, columns)` in a notebook (plain rows elsewhere)."""
    rows = list(rows)
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:  # pragma: no cover
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(HTML(html_table(rows, columns, **kw)))
    else:
        for r in rows:
            print(" | ".join(str(r.get(c, "")) for c in (columns or r.keys())))


def verdict(guess, actual: float, what: str, show=str) -> str:
    """Markdown that sets a learner's prediction beside the computed value: how far off, as a
    ratio (the right measure for quantities that span orders of magnitude). `guess` None (the
    cell left as it was) says so instead of judging; `show` formats both numbers."""
    if guess is None:
        return (f"You left the guess empty: {what} is **{show(actual)}**. Guessing first is the "
                f"point: fill in the variable and run both cells again.")
    guess = float(guess)
    if guess <= 0 or actual <= 0:
        close = guess == actual
        return f"You guessed {show(guess)}; {what} is **{show(actual)}**" + (
            " (right)." if close else ".")
    off = max(guess / actual, actual / guess)
    how = ("spot on" if off < 1.1 else "close" if off < 1.5 else
           f"off by {ratio(off)}, too {'high' if guess > actual else 'low'}")
    return f"You guessed {show(guess)}; {what} is **{show(actual)}**: {how}."


# The class of a fold `reveal` writes; the website opens it where the page already folds the
# whole cell (book/cpcourse_site.py), so a reader clicks once.
REVEAL_CLASS = "cpc-reveal"


def _figure_html(fig) -> str:
    import base64
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return (f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}" '
            'style="max-width:100%">')


def reveal(*parts, summary: str = "Show the answers") -> None:
    """Answers a learner should think about first, folded until asked: in a notebook, one
    closed `<details>` fold whose summary is `summary`; elsewhere plain text under a line.

    Each part is Markdown (a str), a table (a list of row dicts, or `(rows, columns)`, as
    `show_table`) or a matplotlib Figure. Use it for worked answers ("Show the answers") and
    for what a "**Predict first.**" prompt asks about ("Show the result").
    """
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - IPython ships with the course
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(f"--- {summary} (folded in a notebook) ---")
        for part in parts:
            if isinstance(part, str):
                print(part)
            elif isinstance(part, list):
                for r in part:
                    print(" | ".join(str(v) for k, v in r.items() if not k.startswith("_")))
            elif isinstance(part, tuple):
                for r in part[0]:
                    print(" | ".join(str(r.get(c, "")) for c in part[1]))
        return
    body = []
    for part in parts:
        if isinstance(part, str):
            body.append(part)
        elif isinstance(part, list):
            cols = [c for c in (part[0] if part else {}) if not c.startswith("_")]
            body.append(html_table(part, cols))
        elif isinstance(part, tuple):  # (rows, columns)
            body.append(html_table(*part))
        else:
            body.append(_figure_html(part))
    # blank lines around each part: Markdown inside an HTML block is read as Markdown
    display(Markdown(f'<details class="{REVEAL_CLASS}"><summary><b>{html.escape(summary)}</b>'
                     "</summary>\n\n" + "\n\n".join(body) + "\n\n</details>"))
