"""The course's website, opened from the file system in headless Chromium.

    python -m pytest tests/browser/test_book_browser.py -m browser -q

Builds a subset of the book (`book/conf.py`, BOOK_NOTEBOOKS: notebook 00, with its dashboard,
and 07, with its clips) into a temporary folder, executed as `make book` executes it, and checks
what a reader sees: the landing page lists the notebooks in course order; each notebook page
shows a figure or a table and no error; 07's clips are animated images; the dashboard shows its
first state, not a placeholder; search finds "ring attention"; `cpc-table` cells are padded,
worked answers and "predict first" results are folded, code blocks have a copy button, and
the course map reads at phone width (420 px). Screenshots go to
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
    assert "(0, 0)" not in dash.inner_text(), "a dropdown shows its value, not its label"
    assert "application/vnd.jupyter.widget-view+json" not in page.content()


def test_search_finds_ring_attention(site, page):
    page.goto((site / "search.html").as_uri() + "?q=ring+attention")
    page.wait_for_selector("#search-results li", timeout=30_000)
    _shot(page, "search")
    hits = page.eval_on_selector_all("#search-results li a", "els => els.map(e => e.href)")
    assert any("07_tiny_dit_under_cp" in h for h in hits), hits


@pytest.mark.parametrize("nb", SUBSET)
def test_tables_are_padded_answers_folded_code_copyable(site, page, nb):
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto((site / "notebooks" / f"{nb}.html").as_uri())
    pad = page.eval_on_selector("table.cpc-table td", """td => {
      const s = getComputedStyle(td);
      return [parseFloat(s.paddingLeft), parseFloat(s.paddingRight)];
    }""")
    assert min(pad) >= 4, f"{nb}: cpc-table cells padded {pad} px: numbers run together"
    folds = page.eval_on_selector_all(
        "details.hide", "els => els.map(e => [e.open, e.querySelector('summary').innerText])")
    assert folds and not any(is_open for is_open, _ in folds), f"{nb}: {folds}"
    said = " ".join(text for _, text in folds)
    assert "Show the result" in said, f"{nb}: no predict-first result folded: {said}"
    if nb == "07_tiny_dit_under_cp":  # 00 has no worked questions
        assert "Show the answers" in said, f"{nb}: {said}"
        worked = next(d for d in page.query_selector_all("details.hide")
                      if "Show the answers" in d.query_selector("summary").inner_text())
        assert not worked.query_selector(".cell_output").is_visible()  # folded until asked
        worked.query_selector("summary").click()
        assert worked.query_selector(".cell_output").is_visible()
    cells = page.eval_on_selector_all(".cell_input div.highlight", "els => els.length")
    buttons = page.eval_on_selector_all(".cell_input div.highlight button.cpc-copy",
                                        "els => els.length")
    assert cells and buttons == cells, f"{nb}: {buttons} copy buttons for {cells} code cells"
    button = page.query_selector(".cell_input div.highlight button.cpc-copy")
    button.scroll_into_view_if_needed()
    button.click()  # "copied", or where the browser refuses both ways, what to do instead
    page.wait_for_function("b => b.textContent !== 'copy'", arg=button, timeout=5_000)


def test_the_course_map_links_and_reads_at_phone_width(site, page):
    page.set_viewport_size({"width": 420, "height": 900})
    try:
        page.goto((site / "book" / "index.html").as_uri())
        table = page.query_selector("table.cpc-map")
        assert table is not None, "the course map has no cpc-map class"
        links = table.eval_on_selector_all("a", "els => els.map(e => e.getAttribute('href'))")
        assert any(h.endswith("notebooks/00_token_explosion.html") for h in links), links
        table.scroll_into_view_if_needed()
        _shot(page, "index-420px")
        cell = table.query_selector("td:nth-child(2)").bounding_box()
        assert cell["width"] > 300, f"a course-map cell is {cell['width']} px wide at 420 px"
    finally:
        page.set_viewport_size({"width": 1280, "height": 900})
