"""Notebook 15's figures: the tiles drawn are the library's, the bytes are the formula's.

    python -m pytest tests/unit/test_viz_tiling.py -q
"""

import matplotlib
import numpy as np

matplotlib.use("Agg")

from cpcourse.viz import tiling as vt  # noqa: E402


def test_owners_are_the_tilings():
    assert (vt.owners("ring", 3) == np.array([[0, 0, 0], [1, 1, 1], [2, 2, 2]])).all()
    assert (vt.owners("grid", 4, (1, 4)) == np.tile(np.arange(4), (4, 1))).all()
    two = vt.owners("grid", 4, (2, 2))
    assert two.tolist() == [[0, 1, 0, 1], [0, 1, 0, 1], [2, 3, 2, 3], [2, 3, 2, 3]]
    assert (vt.owners("grid", 4, (4, 1)) == vt.owners("ring", 4)).all()  # all-gather K/V


def test_figures_draw():
    assert len(vt.tilings_figure(4).axes) == len(vt.PANELS)
    fig = vt.bytes_figure(tokens=1000, heads=8, head_dim=16, worlds=(2, 4, 8))
    assert len(fig.axes[0].lines) == 4
