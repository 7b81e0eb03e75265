"""Figures and ipywidgets dashboards for the notebooks; every number drawn comes from cpcourse.

    python -m cpcourse.viz.tokens artifacts

`fmt` turns bytes, seconds and counts into text; `tokens` draws token growth and memory per GPU;
`dashboard` is notebook 00's interactive calculator; `seed` audits the article the course grew
from. Submodules import matplotlib and ipywidgets only when used.
"""
