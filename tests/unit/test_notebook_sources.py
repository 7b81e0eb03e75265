"""Each notebook's text form (jupytext MyST markdown) and its .ipynb hold the same cells.

    python -m pytest tests/unit/test_notebook_sources.py -q

`notebooks/NN_topic.md` is where a notebook's prose and code are edited (in any editor, or in
JupyterLab, whose jupytext extension saves both files of a pair); `notebooks/NN_topic.ipynb` is
what a learner opens, committed without outputs. `make notebooks` syncs the pairs and clears
outputs; these tests fail, saying so, when that was not run.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
FORMATS = "ipynb,md:myst"
PAIRS = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.ipynb"))
FIX = "run `make notebooks` (syncs every .md with its .ipynb and clears outputs)"


def _cells(nb) -> list[tuple[str, str, dict]]:
    # Cell ids and execution records are per-file bookkeeping, not content.
    skip = {"id", "execution", "ExecuteTime"}
    return [(c.cell_type, c.source.strip(), {k: v for k, v in c.metadata.items() if k not in skip})
            for c in nb.cells]


def test_every_notebook_has_its_text_form_and_no_strays():
    texts = sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.md"))
    assert PAIRS, "no notebooks found"
    assert texts == PAIRS, (f"notebooks without a .md: {sorted(set(PAIRS) - set(texts))}, "
                            f".md without a notebook: {sorted(set(texts) - set(PAIRS))}; {FIX}")


@pytest.mark.parametrize("stem", PAIRS)
def test_pair_is_in_sync_and_committed_clean(stem):
    ipynb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    text = jupytext.read(NOTEBOOKS / f"{stem}.md")
    for name, nb in (("ipynb", ipynb), ("md", text)):
        assert nb.metadata.get("jupytext", {}).get("formats") == FORMATS, (
            f"{stem}.{name} is not paired as {FORMATS!r}: "
            f"`jupytext --set-formats {FORMATS} notebooks/{stem}.ipynb`")
    dirty = [i for i, c in enumerate(ipynb.cells)
             if c.cell_type == "code" and (c.outputs or c.execution_count is not None)]
    assert not dirty, f"{stem}.ipynb carries outputs or execution counts in cells {dirty}; {FIX}"
    a, b = _cells(text), _cells(ipynb)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        assert x == y, (f"{stem}: cell {i} differs between the .md and the .ipynb "
                        f"(.md starts {x[1][:60]!r}, .ipynb starts {y[1][:60]!r}); {FIX}")
    assert len(a) == len(b), f"{stem}: {len(a)} cells in the .md, {len(b)} in the .ipynb; {FIX}"


def test_the_check_sees_an_edit(tmp_path):
    """The sync check is not vacuous: a changed markdown cell in the text form is caught."""
    stem = PAIRS[0]
    nb = jupytext.read(NOTEBOOKS / f"{stem}.md")
    md = next(c for c in nb.cells if c.cell_type == "markdown")
    md.source += "\n\nAn instructor's new sentence."
    ipynb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    assert _cells(nb) != _cells(ipynb)
    jupytext.write(nb, tmp_path / f"{stem}.md", fmt="md:myst")
    assert "An instructor's new sentence." in (tmp_path / f"{stem}.md").read_text()
    assert _cells(jupytext.read(tmp_path / f"{stem}.md")) == _cells(nb)
