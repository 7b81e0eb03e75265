"""The website's own touches (a Sphinx extension loaded by book/conf.py).

- Answers folded: a notebook's worked answers (the code cells under a "Worked questions" heading:
  their source prints the answers too) and the first output after a "**Predict first.**"
  paragraph render inside a `<details>` fold ("Show the answers", "Show the result"), the way
  myst-nb folds a cell tagged `hide-output`. A cell tagged `show-output` is never folded. A fold
  the notebook writes itself (`cpcourse.viz.fmt.reveal`) opens inside a folded cell.
- Progress on stderr: one line per notebook as it is read (executed, or taken from the cache),
  with its time, so a 10-minute `make book` says where it is.
- `static/cpcourse.css` (table padding, a wider text column, wide tables and code scrolling
  inside their box, the course map at phone width) and `static/copybutton.js` (a copy button on
  every code block), written for this site: no extra dependency.
"""

from __future__ import annotations

import sys
import time

from docutils import nodes
from sphinx.transforms.post_transforms import SphinxPostTransform

ANSWERS = ("Show the answers", "Hide the answers")
RESULT = ("Show the result (predict first)", "Hide the result")


def _is_code_cell(node) -> bool:
    return isinstance(node, nodes.container) and node.get("nb_element") == "cell_code"


def _has_output(cell) -> bool:
    return bool(cell.children) and cell.children[-1].get("nb_element") == "cell_code_output"


def _fold(cell, mode: str, prompts: tuple[str, str]) -> None:
    tags = cell.get("cell_metadata", {}).get("tags", [])
    if cell.get("hide_mode") or "show-output" in tags:
        return
    cell["hide_mode"] = mode
    cell["prompt_show"], cell["prompt_hide"] = prompts
    # a fold the notebook made itself (`cpcourse.viz.fmt.reveal`) opens inside this one: one click
    for raw in cell.findall(nodes.raw):
        text = raw.astext()
        if 'class="cpc-reveal"' in text:
            raw.children = [nodes.Text(text.replace('class="cpc-reveal"',
                                                    'class="cpc-reveal" open'))]


def _in_worked_questions(cell) -> bool:
    section = cell.parent
    while section is not None and not isinstance(section, nodes.section):
        section = section.parent
    if section is None or not isinstance(section[0], nodes.title):
        return False
    return "worked questions" in section[0].astext().lower()


class FoldAnswers(SphinxPostTransform):
    """Marks the answer cells before myst-nb's HideInputCells (priority 199) wraps them."""

    default_priority = 190
    formats = ("html",)

    def run(self, **kwargs) -> None:
        waiting = False  # a "Predict first." paragraph whose result has not been shown yet
        for node in self.document.findall(lambda n: isinstance(n, (nodes.paragraph,
                                                                    nodes.container))):
            if isinstance(node, nodes.paragraph):
                if node.astext().startswith("Predict first."):
                    waiting = True
                continue
            if not _is_code_cell(node):
                continue
            if _in_worked_questions(node):
                _fold(node, "all", ANSWERS)
            elif waiting and _has_output(node):
                _fold(node, "output", RESULT)
                waiting = False


class MarkCourseMap(SphinxPostTransform):
    """The course map's table (its first column is "notebook") gets the class `cpc-map`, which
    the stylesheet turns into one block per notebook at phone width."""

    default_priority = 190
    formats = ("html",)

    def run(self, **kwargs) -> None:
        for table in self.document.findall(nodes.table):
            heads = [e.astext().strip() for e in table.findall(nodes.entry)][:1]
            if heads == ["notebook"]:
                table["classes"].append("cpc-map")


class Progress:
    """`[3/16] notebooks/02_online_softmax ... 41.2 s` on stderr for each notebook read."""

    def __init__(self) -> None:
        self.todo: list[str] = []
        self.started: dict[str, float] = {}

    def before_read(self, app, env, docnames) -> None:
        self.todo = sorted(d for d in docnames if d.startswith("notebooks/"))
        if self.todo:
            print(f"book: {len(self.todo)} notebook{'s' * (len(self.todo) != 1)} to read "
                  "(executed unless cached)", file=sys.stderr, flush=True)

    def source_read(self, app, docname, source) -> None:
        if docname in self.todo:
            self.started[docname] = time.monotonic()
            n = self.todo.index(docname) + 1
            print(f"book: [{n}/{len(self.todo)}] {docname} ...", file=sys.stderr, flush=True)

    def doctree_read(self, app, doctree) -> None:
        docname = app.env.docname
        if docname in self.started:
            took = time.monotonic() - self.started.pop(docname)
            print(f"book:        {docname} done in {took:.1f} s", file=sys.stderr, flush=True)


def setup(app):
    progress = Progress()
    app.connect("env-before-read-docs", progress.before_read)
    app.connect("source-read", progress.source_read)
    app.connect("doctree-read", progress.doctree_read)
    app.add_post_transform(FoldAnswers)
    app.add_post_transform(MarkCourseMap)
    app.add_css_file("cpcourse.css")
    app.add_js_file("copybutton.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
