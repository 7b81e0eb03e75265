"""Shared by tools/notebooks/build_NN.py: turn a list of cells into a notebook, write or check it.

    python tools/notebooks/build_all.py --check

Each builder authors its notebook as `CELLS = [("md" | "code", text), ...]` so that it stays
reviewable as text, then calls `run(CELLS, OUT, argv)`. Cell ids are stable so rebuilding an
unchanged notebook gives the same bytes; `--check` exits 1 when the committed file differs.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]


def notebook_path(name: str) -> Path:
    return ROOT / "notebooks" / name


def build(cells: list[tuple[str, str]], out: Path) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata.update({
        "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                       "language": "python"},
        "language_info": {"name": "python"},
    })
    for kind, text in cells:
        nb.cells.append(new_markdown_cell(text) if kind == "md" else new_code_cell(text))
    for i, cell in enumerate(nb.cells):  # stable ids keep diffs quiet between rebuilds
        cell["id"] = f"{out.stem[:2]}-{i:02d}"
    return nb


def run(cells: list[tuple[str, str]], out: Path, argv: list[str]) -> int:
    """Write `out` (or with `--check`, say whether it is up to date)."""
    text = nbformat.writes(build(cells, out)) + "\n"
    if "--check" in argv:
        same = out.exists() and out.read_text() == text
        print(f"{out.name}: {'up to date' if same else 'STALE: rebuild it'}")
        return 0 if same else 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0
