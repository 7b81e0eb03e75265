"""The website's own touches (book/cpcourse_site.py) on a two-page site built here in seconds,
without executing anything: answers folded, the stylesheet and copy button linked, the course
map marked. The browser test checks how they look; this checks them where Chromium is missing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

CONF = f'''
import sys
sys.path.insert(0, {str(ROOT / "book")!r})
extensions = ["myst_nb", "cpcourse_site"]
html_static_path = [{str(ROOT / "book" / "static")!r}]
nb_execution_mode = "off"
root_doc = "index"
'''

MAP = """# Map

| notebook | what you learn |
|---|---|
| [one](nb.ipynb) | a lesson |
"""


def _reveal(text: str) -> list:
    """What `cpcourse.viz.fmt.reveal` displays: a closed fold of Markdown."""
    md = f'<details class="cpc-reveal"><summary>Show</summary>\n\n{text}\n\n</details>'
    return [nbformat.v4.new_output("display_data", data={"text/markdown": md})]


def _notebook() -> nbformat.NotebookNode:
    out = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    cells = [nbformat.v4.new_markdown_cell("# A notebook\n\n**Predict first.** How many?"),
             nbformat.v4.new_code_cell("guess = None"),  # no output: not the result
             nbformat.v4.new_code_cell("print(42)", outputs=out),
             nbformat.v4.new_code_cell("print(42)", outputs=out),  # shown: one fold per prediction
             nbformat.v4.new_markdown_cell("## Worked questions\n\n**Q1.** Why?"),
             nbformat.v4.new_code_cell("print('A1. Because.')", outputs=out),
             nbformat.v4.new_code_cell("reveal('A2.')", outputs=_reveal("**A2.** Since.")),
             nbformat.v4.new_markdown_cell("## After"),
             nbformat.v4.new_code_cell("print(1)", outputs=out),
             nbformat.v4.new_code_cell("reveal('A3.')", outputs=_reveal("**A3.** Still."))]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


def test_answers_fold_and_the_site_has_its_touches(tmp_path):
    pytest.importorskip("myst_nb", reason="myst-nb is not installed: pip install -e '.[dev]'")
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF)
    (src / "index.md").write_text(MAP + "\n```{toctree}\nnb\n```\n")
    nbformat.write(_notebook(), src / "nb.ipynb")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src),
                           str(tmp_path / "html")], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    page = (tmp_path / "html" / "nb.html").read_text()
    folds = re.findall(r'<details class="admonition hide ([^"]*)">\s*<summary[^>]*>\s*'
                       r'<p class="collapsed admonition-title">([^<]*)</p>', page)
    answers = ("above-input", "Show the answers")
    assert folds == [("below-input", "Show the result (predict first)"), answers, answers], folds
    # the notebook's own fold opens inside the page's fold (one click), and stays closed outside
    assert page.count('<details class="cpc-reveal" open>') == 1, page
    assert page.count('<details class="cpc-reveal">') == 1
    assert "cpcourse.css" in page and "copybutton.js" in page
    index = (tmp_path / "html" / "index.html").read_text()
    assert re.search(r'<table class="[^"]*cpc-map', index)
