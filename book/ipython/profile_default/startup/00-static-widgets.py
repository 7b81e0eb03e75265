"""A book build's kernels show each dashboard's first state, not a widget placeholder.

A static page has no kernel, so an ipywidgets view would render as nothing. `make book` points
IPYTHONDIR here; this displays a widget as HTML instead: its images, text and controls' values
as they are when the cell ran, and a line pointing to the notebook where it is interactive.
"""

import base64
import html

import ipywidgets as widgets


def _output(o: dict) -> str:
    """One captured output of an Output widget (interact's plots), as HTML."""
    data = o.get("data", {})
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"]}" style="max-width:100%">'
    if "text/html" in data:
        return data["text/html"]
    text = o.get("text") or data.get("text/plain") or ""
    return f"<pre>{html.escape(text)}</pre>" if text else ""


def _static(w) -> str:
    if isinstance(w, widgets.Output):
        return "".join(_output(o) for o in w.outputs)
    if isinstance(w, widgets.Image):
        data = base64.b64encode(bytes(w.value)).decode()
        return f'<img src="data:image/{w.format};base64,{data}" style="max-width:100%">'
    if isinstance(w, (widgets.HTML, widgets.HTMLMath)):
        return w.value
    if isinstance(w, widgets.Label):
        return f"<p>{html.escape(str(w.value))}</p>"
    if isinstance(w, widgets.Box):
        inner = "".join(_static(c) for c in w.children)
        direction = "row" if isinstance(w, widgets.HBox) else "column"
        return f'<div style="display:flex;flex-direction:{direction};gap:8px">{inner}</div>'
    if isinstance(w, widgets.ValueWidget) and getattr(w, "description", None) is not None:
        # a dropdown's value may be a code ((0, 0) for "model default"): show what it reads
        # (a selection widget has options and a `label`, the text a learner sees)
        shown = w.label if hasattr(w, "options") and hasattr(w, "label") else w.value
        return (f'<p class="cpc-static-control"><b>{html.escape(w.description or "")}</b> '
                f"{html.escape(str(shown))}</p>")
    return ""


def _as_html(w, **kwargs):
    note = ('<p class="cpc-static-note"><em>Interactive in the notebook: this is the dashboard as '
            "it first appears; open the notebook in JupyterLab (<code>make lab</code>) to move "
            "its controls.</em></p>")
    return {"text/html": f'<div class="cpc-static-widget">{_static(w)}{note}</div>'}


# every widget, and every object that hands on a widget's bundle (cpcourse's dashboards)
widgets.Widget._repr_mimebundle_ = _as_html
# What a callback prints into an Output widget (interact's plots) reaches the page only through
# a frontend: let it go to the cell's own outputs instead, where the page shows it.
widgets.Output.__enter__ = lambda self: self
widgets.Output.__exit__ = lambda self, *exc: None
widgets.Output.clear_output = lambda self, *args, **kwargs: None
