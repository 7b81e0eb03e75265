"""Notebook 00 in a real JupyterLab, driven by headless Chromium: run all, dashboard, slider.

    bash tools/install_browser.sh && python -m pytest tests/browser -m browser -q

Skipped (with the reason) when /usr/bin/chromium or playwright is missing. Playwright drives the
system Chromium through `executable_path`; it never downloads a browser. A screenshot of the
dashboard is saved as artifacts/lab-notebook00.png.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cpcourse.tokens import model_tokens

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")  # the conftest's `lab` fixture skips when it is missing

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-quic"]
NOTEBOOK = "00_token_explosion.ipynb"
DASHBOARD_MODEL = "wan2.1-t2v-14b"  # what the notebook's dashboard cell starts with
STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'

PROMPTS = "document.querySelectorAll('.jp-Notebook .jp-CodeCell .jp-InputArea-prompt')"
# Run All is done when every code cell shows an execution count, or as soon as an error shows.
PROGRESS_JS = """() => {
  if (document.querySelector('STDERR')) return 'error';
  const prompts = [...PROMPTS];
  if (!prompts.length) return false;
  return prompts.every(p => /^\\[\\d+\\]:$/.test(p.textContent.trim())) ? 'done' : false;
}""".replace("STDERR", STDERR.replace("'", "\\'")).replace("PROMPTS", PROMPTS)
STARTED_JS = """() => [...PROMPTS].some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))""".replace(
    "PROMPTS", PROMPTS)
IDLE_JS = """() => /\\| Idle/.test(document.getElementById('jp-main-statusbar')?.innerText || '')"""


def _run_all(page) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def _token_count(page) -> int:
    return int(page.locator(".cpc-token-count").first.get_attribute("data-tokens"))


def test_notebook_00_runs_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    artifacts = ROOT / "artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                     headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1150})
            page.set_default_timeout(60_000)
            page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
            # The status bar's kernel indicator is reliable; the toolbar's is racy on first load.
            page.wait_for_function(IDLE_JS)
            _run_all(page)
            try:
                page.wait_for_function(STARTED_JS, timeout=10_000)
            except Exception:  # a Run All sent before the kernel settled can be dropped: resend
                _run_all(page)
            state = page.wait_for_function(PROGRESS_JS, timeout=180_000).json_value()
            page.wait_for_function(IDLE_JS)

            errors = page.locator(STDERR)
            text = page.locator(".jp-Notebook").inner_text()
            assert state == "done" and errors.count() == 0, (
                "a cell wrote to stderr or failed:\n"
                + "\n---\n".join(errors.nth(i).inner_text()[:1500]
                                 for i in range(errors.count())) + "\n" + lab.log_tail())
            assert "Traceback" not in text
            assert "Error displaying widget" not in text and "Failed to load model" not in text

            figures = page.locator(".jp-OutputArea-output img")
            assert figures.count() >= 3  # two notebook figures and the dashboard's plot
            widths = page.eval_on_selector_all(".jp-OutputArea-output img",
                                               "imgs => imgs.map(i => i.naturalWidth)")
            assert all(w > 0 for w in widths), widths

            dashboard = page.locator(".cpc-dashboard")
            dashboard.scroll_into_view_if_needed()
            assert dashboard.is_visible()
            count = page.locator(".cpc-token-count").first
            assert count.is_visible()
            before = _token_count(page)
            assert before == model_tokens(DASHBOARD_MODEL).sequence_length
            assert count.inner_text().replace(",", "") == str(before)

            # Move the clip-length slider to the right, as a learner would with the mouse.
            handle = page.locator(".cpc-seconds .noUi-handle").first
            handle.scroll_into_view_if_needed()
            box = handle.bounding_box()
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(x + 20, y, steps=4)
            page.mouse.up()
            page.wait_for_function(
                "n => Number(document.querySelector('.cpc-token-count')?.dataset.tokens) !== n",
                arg=before, timeout=30_000)
            after = _token_count(page)
            assert after > before, (before, after)
            assert count.inner_text().replace(",", "") == str(after)

            page.wait_for_function(IDLE_JS)  # the plot is redrawn after the headline
            page.keyboard.press("Control+b")  # fold the file browser away for the screenshot
            page.locator(".cpc-dashboard").evaluate("e => e.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)  # let the new plot image paint
            page.screenshot(path=str(artifacts / "lab-notebook00.png"))
        finally:
            browser.close()
