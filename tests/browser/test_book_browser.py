"""The course's website, opened from the file system in headless Chromium.

    python -m pytest tests/browser/test_book_browser.py -m browser -q

Builds a subset of the book (`book/conf.py`, BOOK_NOTEBOOKS: notebook 00, with its dashboard,
and 07, with its clips) into a temporary folder, executed as `make book` executes it, and checks
what a reader sees: the landing page lists the notebooks in course order; each notebook page
shows a figure or a table and no error; 07's clips are animated images; the dashboard shows its
first state, not a placeholder; search finds "ring attention". Screenshots go to
artifacts/browser/book-*.png. Skipped when Chromium or playwright is missing.
"""

from __future__ import annotations

import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")
SUBSET = ["00_token_explosion", "07_tiny_dit_under_cp"]
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
        "--no-first-run", "--allow-file-access-from-files"]

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip(f"no {CHROMIUM}: run `bash tools/install_browser.sh` (Debian's chromium)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    pytest.importorskip("myst_nb", reason="myst-nb is not installed: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("book")
    env = {**os.environ, "BOOK_NOTEBOOKS": ",".join(SUBSET), "CPCOURSE_IMPL": "exercises",
           "CPCOURSE_ROOT": str(ROOT), "IPYTHONDIR": str(ROOT / "book" / "ipython"),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-q", "-c", "book", ".",
                           str(out / "html"), "-d", str(out / "doctrees"),
                           "-D", f"nb_execution_cache_path={out / 'cache'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "html"


@pytest.fixture(scope="module")
def page(site):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            yield browser.new_page(viewport={"width": 1280, "height": 900})
        finally:
            browser.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"book-{name}.png"), full_page=False)


def test_the_landing_page_lists_the_notebooks_in_order(site, page):
    page.goto((site / "index.html").as_uri())         # the top folder's page, as opened by hand
    page.wait_for_url("**/book/index.html", timeout=30_000)
    _shot(page, "index")
    links = page.eval_on_selector_all(
        "article a.reference.internal", "els => els.map(e => e.getAttribute('href'))")
    found = [s for href in links for s in SUBSET if href.endswith(f"notebooks/{s}.html")]
    assert sorted(set(found), key=found.index) == SUBSET, links
    assert "Course map" in page.inner_text("article")


@pytest.mark.parametrize("nb", SUBSET)
def test_each_notebook_page_shows_outputs_and_no_error(site, page, nb):
    page.goto((site / "notebooks" / f"{nb}.html").as_uri())
    _shot(page, nb)
    outputs = " ".join(page.eval_on_selector_all(".cell_output",
                                                  "els => els.map(e => e.innerText)"))
    assert "Traceback" not in outputs and "Error:" not in outputs, f"{nb}: an error output"
    assert not page.query_selector(".cell_output .traceback, .cell_output .error"), nb
    shown = page.eval_on_selector_all(".cell_output img, .cell_output table", "els => els.length")
    assert shown >= 1, f"{nb}: no figure or table in any output"


def test_the_clips_are_animated(site, page):
    from PIL import Image

    page.goto((site / "notebooks" / "07_tiny_dit_under_cp.html").as_uri())
    srcs = page.eval_on_selector_all("img[src^='data:image/gif']", "els => els.map(e => e.src)")
    assert srcs, "notebook 07 shows no GIF clip"
    frames = Image.open(io.BytesIO(base64.b64decode(srcs[0].split(",", 1)[1]))).n_frames
    assert frames > 1, f"the first clip has {frames} frame"


def test_the_dashboard_shows_its_first_state(site, page):
    page.goto((site / "notebooks" / "00_token_explosion.html").as_uri())
    dash = page.query_selector(".cpc-static-widget")
    assert dash is not None, "notebook 00's dashboard left no static view"
    dash.scroll_into_view_if_needed()
    _shot(page, "dashboard")
    assert dash.query_selector("img") is not None and "make lab" in dash.inner_text()
    assert "application/vnd.jupyter.widget-view+json" not in page.content()


def test_search_finds_ring_attention(site, page):
    page.goto((site / "search.html").as_uri() + "?q=ring+attention")
    page.wait_for_selector("#search-results li", timeout=30_000)
    _shot(page, "search")
    hits = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
    assert any("07_tiny_dit_under_cp" in h for h in hits), hits
