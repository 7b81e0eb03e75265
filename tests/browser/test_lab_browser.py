"""Every notebook with a widget, in a real JupyterLab driven by headless Chromium.

    bash tools/install_browser.sh && python -m pytest tests/browser -m browser -q

For each notebook whose code makes a dashboard (`widgets.interact(...)`, `token_dashboard(...)`),
except the two whose Run All starts processes (`HEAVY`, below):
open it, Run All, require that every cell ran and none shows an error, then move one control of
each dashboard as a learner would (drag a slider's handle, pick another dropdown entry) and
require that what it shows (the figure, the number, the table) changes. Each dashboard's output
is saved as a screenshot under artifacts/browser/. A last test saves a notebook through the
server, as JupyterLab's save does, and checks that jupytext wrote the change into its text form.

Skipped (with the reason) when /usr/bin/chromium or playwright is missing. Playwright drives the
system Chromium through `executable_path`; it never downloads a browser.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import jupytext
import nbformat
import pytest

from cpcourse.planner.tokens import model_tokens

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = Path("/usr/bin/chromium")  # the conftest's `lab` fixture skips when it is missing

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
DASHBOARD_CALL = re.compile(r"\b(?:widgets\.interact|token_dashboard)\(")
DASHBOARD_MODEL = "wan2.1-t2v-14b"  # what notebook 00's dashboard starts with
# JupyterLab may restore other notebooks in hidden tabs: look only at the one in front.
CURRENT = ".jp-NotebookPanel:not(.lm-mod-hidden)"
STDERR = CURRENT + ' .jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# A dashboard in the page: an interact() box, or one of cpcourse's own (notebook 00's).
DASHBOARDS = f"{CURRENT} .widget-interact, {CURRENT} .cpc-dashboard"

PROMPTS = f"document.querySelectorAll('{CURRENT} .jp-CodeCell .jp-InputArea-prompt')"
# Run All is done when every code cell shows an execution count, or as soon as an error shows.
PROGRESS_JS = """() => {
  if (document.querySelector('STDERR')) return 'error';
  const prompts = [...PROMPTS];
  if (!prompts.length) return false;
  return prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim())) ? 'done' : false;
}""".replace("STDERR", STDERR.replace("'", "\\'")).replace("PROMPTS", PROMPTS)
STARTED_JS = """() => [...PROMPTS].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))""".replace(
    "PROMPTS", PROMPTS)
PENDING_JS = """() => [...document.querySelectorAll('CURRENT .jp-CodeCell')]
  .filter(c => !/^\\[\\d+\\]:$/.test(c.querySelector('.jp-InputArea-prompt').textContent.trim()))
  .map(c => c.querySelector('.jp-InputArea-prompt').textContent.trim() + ' '
            + (c.querySelector('.jp-InputArea-editor')?.innerText || '').split('\\n')[0])"""\
    .replace("CURRENT", CURRENT)
IDLE_JS = """() => /\\| Idle/.test(document.getElementById('jp-main-statusbar')?.innerText || '')"""


def _dashboards_in_source(path: Path) -> int:
    cells = json.loads(path.read_text())["cells"]
    return sum(len(DASHBOARD_CALL.findall("".join(c["source"])))
               for c in cells if c["cell_type"] == "code")


# Their Run All starts processes (a minute each in the browser, on 2 cores): the notebook tests
# run them twice already, calling each dashboard's function once, and their dashboards are the
# interact() machinery the others drive here. Keeps the suite inside its time budget.
HEAVY = {"06_video_temporal_cp.ipynb", "07_tiny_dit_under_cp.ipynb"}
WIDGET_NOTEBOOKS = {p.name: n for p in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
                    if p.name not in HEAVY and (n := _dashboards_in_source(p))}


def _run_all(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _shown(dashboard) -> str:
    """What a dashboard shows: its outputs' HTML, figures (as data URLs) included."""
    return dashboard.evaluate("""d => {
      const outs = d.querySelectorAll('.widget-output, .widget-html, .widget-image, img');
      return [...outs].map(o => o.outerHTML).join('\\n') + d.innerText;
    }""")


def _drag(page, handle, dx: float = 20) -> None:
    """Drag a slider's handle to the right with the mouse, as a learner does."""
    handle.scroll_into_view_if_needed()
    box = handle.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x + dx, y, steps=4)
    page.mouse.up()


def _move_one_control(page, dashboard) -> str:
    """Move the dashboard's first slider (else pick another entry of its first dropdown)."""
    if _is_token_dashboard(dashboard):
        _drag(page, dashboard.locator(".cpc-seconds .noUi-handle").first)
        return "the clip-length slider"
    sliders = dashboard.locator(".widget-slider .noUi-handle")
    if sliders.count():
        label = dashboard.locator(".widget-slider .widget-label").first.inner_text()
        _drag(page, sliders.first)
        return f"slider {label!r}"
    select = dashboard.locator(".widget-dropdown select").first
    current = select.input_value()
    options = select.evaluate("s => [...s.options].map(o => o.value)")
    other = next(o for o in options if o != current)
    select.select_option(other)
    return f"dropdown -> {other!r}"


def _wait_changed(page, dashboard, before: str, figures: int, timeout_s: float = 45) -> str:
    """What the dashboard shows once it differs from `before`, has all its `figures` again and
    has settled (an interact output is cleared, then refilled figure by figure: the half-drawn
    states in between do not count)."""
    deadline = time.monotonic() + timeout_s
    last = before
    while time.monotonic() < deadline:
        page.wait_for_timeout(400)
        now = _shown(dashboard)
        if (now != before and now == last and _figures(dashboard) >= figures
                and page.evaluate(IDLE_JS)):
            return now
        last = now
    return before


def _figures(dashboard) -> int:
    return dashboard.locator("img").count()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                      headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def test_the_widget_notebooks_are_found():
    """Discovery is not vacuous: notebook 00's dashboard and the interact()s are seen."""
    assert WIDGET_NOTEBOOKS.get("00_token_explosion.ipynb", 0) >= 1
    assert len(WIDGET_NOTEBOOKS) >= 2, WIDGET_NOTEBOOKS


@pytest.mark.parametrize("notebook", sorted(WIDGET_NOTEBOOKS))
def test_notebook_runs_and_its_dashboards_respond(lab, browser, notebook):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1150})
    page.set_default_timeout(60_000)
    try:
        # ?reset: a fresh workspace, so no notebook from an earlier test is restored beside it
        page.goto(f"{lab.url}/lab/tree/{notebook}?reset&token={lab.token}")
        # The status bar's kernel indicator is reliable; the toolbar's is racy on first load.
        page.wait_for_function(IDLE_JS)
        _run_all(page)
        try:
            page.wait_for_function(STARTED_JS, timeout=10_000)
        except Exception:  # a Run All sent before the kernel settled can be dropped: resend
            _run_all(page)
        try:
            state = page.wait_for_function(PROGRESS_JS, timeout=200_000).json_value()
        except Exception:
            page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}-stalled.png"))
            pytest.fail(f"{notebook}: Run All did not finish; cells not run:\n"
                        + "\n".join(page.evaluate(PENDING_JS)) + "\n" + lab.log_tail())
        page.wait_for_function(IDLE_JS)

        errors = page.locator(STDERR)
        text = page.locator(CURRENT).inner_text()
        assert state == "done" and errors.count() == 0, (
            f"{notebook}: a cell wrote to stderr or failed:\n"
            + "\n---\n".join(errors.nth(i).inner_text()[:1500] for i in range(errors.count()))
            + "\n" + lab.log_tail())
        assert "Traceback" not in text
        assert "Error displaying widget" not in text and "Failed to load model" not in text
        widths = page.eval_on_selector_all(f"{CURRENT} .jp-OutputArea-output img",
                                           "imgs => imgs.map(i => i.naturalWidth)")
        assert all(w > 0 for w in widths), f"{notebook}: a figure did not render: {widths}"

        dashboards = page.locator(DASHBOARDS)
        want = WIDGET_NOTEBOOKS[notebook]
        assert dashboards.count() == want, (
            f"{notebook}: {want} dashboards in the code, {dashboards.count()} shown")
        page.keyboard.press("Control+b")  # fold the file browser away for the screenshots
        for i in range(want):
            dash = dashboards.nth(i)
            dash.scroll_into_view_if_needed()
            assert dash.is_visible()
            start_tokens = _token_count(page) if _is_token_dashboard(dash) else None
            before, figures = _shown(dash), _figures(dash)
            moved = _move_one_control(page, dash)
            after = _wait_changed(page, dash, before, figures)
            assert after != before, f"{notebook} dashboard {i}: moving {moved} changed nothing"
            assert _figures(dash) == figures, (
                f"{notebook} dashboard {i}: {figures} figures before moving {moved}, "
                f"{_figures(dash)} after")
            assert page.locator(STDERR).count() == 0, page.locator(STDERR).first.inner_text()
            if start_tokens is not None:  # notebook 00: the headline is cpcourse's number
                assert start_tokens == model_tokens(DASHBOARD_MODEL).sequence_length
                assert _token_count(page) > start_tokens
            dash.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}-dashboard{i}.png"))
    finally:
        page.close()
        _shut_kernels(lab)  # one kernel at a time: the next notebook gets both cores


def _shut_kernels(lab) -> None:
    for session in lab.request("/api/sessions")[1] or []:
        lab.request(f"/api/sessions/{session['id']}", "DELETE")


def _is_token_dashboard(dash) -> bool:
    return dash.evaluate("d => d.classList.contains('cpc-dashboard')")


def _token_count(page) -> int:
    count = page.locator(".cpc-token-count").first
    tokens = int(count.get_attribute("data-tokens"))
    assert count.inner_text().replace(",", "") == str(tokens)  # what is shown is the number
    return tokens


def test_saving_in_jupyterlab_writes_the_text_form(lab):
    """JupyterLab's save (the contents API) updates the paired .md; the .md opens as a notebook."""
    src = sorted(WIDGET_NOTEBOOKS)[0]
    stem = "zz_saved_copy"
    for ext in (".ipynb", ".md"):
        shutil.copy(lab.notebooks / (Path(src).stem + ext), lab.notebooks / (stem + ext))
    status, model = lab.request(f"/api/contents/{stem}.ipynb?content=1")
    assert status == 200
    nb = model["content"]
    cell = next(c for c in nb["cells"] if c["cell_type"] == "markdown")
    cell["source"] = "".join(cell["source"]) + "\n\nA sentence an instructor added in JupyterLab."
    status, _ = lab.request(f"/api/contents/{stem}.ipynb", "PUT",
                            {"type": "notebook", "format": "json", "content": nb})
    assert status == 200
    text = (lab.notebooks / f"{stem}.md").read_text()
    assert "A sentence an instructor added in JupyterLab." in text, (
        "saving the .ipynb did not update its .md: is jupytext's server extension enabled?\n"
        + lab.log_tail())
    # ... and the pair is in sync by the same rule `make test` applies to the course's notebooks
    pair = [[(c.cell_type, c.source.strip()) for c in nb.cells]
            for nb in (jupytext.read(lab.notebooks / f"{stem}.md"),
                       nbformat.read(lab.notebooks / f"{stem}.ipynb", as_version=4))]
    assert pair[0] == pair[1]
    status, model = lab.request(f"/api/contents/{stem}.md?type=notebook&content=1")
    assert status == 200 and model["type"] == "notebook"
    sources = ["".join(c["source"]) for c in model["content"]["cells"]]
    assert any("A sentence an instructor added in JupyterLab." in s for s in sources)
