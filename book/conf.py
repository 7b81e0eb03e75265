"""The course as a website: every notebook executed (as a newcomer sees it), its figures, tables
and clips embedded, a table of contents in course order, search. Built by Sphinx with myst-nb.

    make book          # _build/html/index.html (opens from the file system)

Why Sphinx and myst-nb rather than Jupyter Book 2: the notebooks are already MyST markdown
(jupytext's `md:myst`), which myst-nb reads as notebooks; it executes them through jupyter-cache,
so a rebuild after a prose edit re-runs only the notebooks whose code changed; it is pure Python,
installed from the same pins as the course and runnable offline, and its output is static HTML
that works from `file://` (the search index is a script, not a fetched file). Jupyter Book 2 runs
on the mystmd Node engine, which the course's CPU-only, offline CI cannot install.

Everything is read from the repository root (`sphinx-build -c book . _build/html`): the landing
page is `book/index.md` (the README's introduction and the course map), then `notebooks/*.md`
in course order, the reference pages (`book/*.md`: course map, commands, GPUs, troubleshooting,
layout; the README links to them), then `AUTHORING.md`. `BOOK_NOTEBOOKS` (a comma list of
notebook stems) builds a subset, as the browser test does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBSET = [s.strip() for s in os.environ.get("BOOK_NOTEBOOKS", "").split(",") if s.strip()]
ALL_NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.md"))
# a typo would build a book with no notebooks and exit 0: refuse it, naming the stems
_UNKNOWN = [s for s in SUBSET if s not in ALL_NOTEBOOKS]
if _UNKNOWN:  # printed first: sphinx replaces a conf.py exit's own message with its own
    print(f"BOOK_NOTEBOOKS: no notebook is named {', '.join(_UNKNOWN)}; the stems are "
          f"{', '.join(ALL_NOTEBOOKS)}", file=sys.stderr)
    raise SystemExit(2)
NOTEBOOKS = [n for n in ALL_NOTEBOOKS if not SUBSET or n in SUBSET]

project = "cpcourse: context parallelism for video diffusion transformers"
author = "the cpcourse authors"
root_doc = "book/index"
sys.path.insert(0, str(Path(__file__).resolve().parent))  # cpcourse_site.py, beside this file
extensions = ["myst_nb", "cpcourse_site"]
PAGES = ["course_map", "commands", "multi_gpu", "troubleshooting", "layout"]  # book/*.md
include_patterns = ["book/index.md", *[f"book/{p}.md" for p in PAGES], "AUTHORING.md",
                    *[f"notebooks/{n}.md" for n in NOTEBOOKS]]
exclude_patterns = ["_build", ".venv", "artifacts", "book/root"]
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
# myst.xref_missing: a subset build (BOOK_NOTEBOOKS) leaves the course map's other links dangling
suppress_warnings = ["myst.header", "misc.highlighting_failure"]
if SUBSET:
    suppress_warnings.append("myst.xref_missing")

# Executed as a newcomer sees them: untouched stubs, the reference answering for each one.
nb_execution_mode = "cache"
nb_execution_cache_path = str(ROOT / "_build" / ".jupyter_cache")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_merge_streams = True
nb_output_stderr = "remove"

html_theme = "sphinx_book_theme"
html_title = "cpcourse"
html_theme_options = {"show_toc_level": 2, "use_download_button": False}
html_static_path = ["static"]  # relative to book/: cpcourse.css, copybutton.js
# _build/html/index.html: the site opens from the file system at its top folder
html_extra_path = ["root"]  # relative to book/, where this file is
